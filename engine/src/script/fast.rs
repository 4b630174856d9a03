//! A native fast path for simple script functions.
//!
//! Most per-record scripts are one expression over the record: pick fields, do integer
//! arithmetic, build a string, compare, build a new record. For a function whose body is
//! exactly that — literals, its parameters, property reads, `+ - * / %` on integers, `+` on
//! strings, comparisons, `!`, `&&`, `||` and map literals — [`FastExpr::compile`] turns the body
//! into a small tree evaluated natively, with no interpreter set-up per call.
//!
//! A body may also start with assignments to its parameters' properties (`acc.sum += r.amount;
//! acc.n = if "n" in acc { acc.n + 1 } else { 1 };`) and end with such an expression or the
//! parameter itself (`acc`), as reduce scripts do; there, if-expressions and `"field" in map`
//! are native too. One pass over each assigned parameter's entries finds the properties assigned
//! (their values and places) and counts what the size limits count, so neither the reads nor the
//! final writes look a property up by name. The assignments are collected aside, one slot per
//! property assigned, and only show in the result: the arguments are never changed before the whole
//! body has been evaluated (callers read them only after an error, and the native path never
//! produces one). A body that returns the parameter it assigned to (`...; acc`) builds its result
//! from a copy ([`FastExpr::eval`]) or, for a caller done with the arguments, by writing the slots
//! into that argument itself and handing it over ([`FastExpr::eval_owned`]).
//!
//! The fast path only ever *reads* its arguments, and it gives up on a record (returns `None`)
//! whenever Rhai might do anything other than the obvious: a type it does not cover, a missing
//! property, an overflow, a division by zero, a size limit within reach. The caller then runs
//! the record through Rhai, so every error, every coercion and every sandbox breach is Rhai's
//! own; the fast path is exact by construction on the records it accepts. The operation budget
//! is respected by refusing the fast path for a script whose worst case could reach it.

use std::cmp::Ordering;

use rhai::{AST, Dynamic, DynamicReadLock, Engine, Expr, ImmutableString, Map, Stmt};
use smallvec::{SmallVec, smallvec};

use crate::script::runtime::{DataSizes, add, entry_sizes};

/// A compiled body; see the module docs.
#[derive(Debug)]
pub struct FastExpr {
    /// Property assignments before the final expression, in order.
    sets: Vec<Set>,
    /// The properties the assignments write, `(param, prop)`, each once: a [`Set`] and a
    /// [`Node::Prop`] name theirs by its index here, a *slot*. While a body is evaluated, a
    /// slot holds the value last written to its property.
    slots: Vec<(usize, Box<str>)>,
    /// The parameters assigned to, each once (those the slots name).
    targets: Vec<usize>,
    root: Node,
    limits: Limits,
}

/// `param.prop = value` or `param.prop op= value`, `(param, prop)` being `slot`.
#[derive(Debug)]
struct Set {
    slot: usize,
    op: Option<Op>,
    value: Node,
}

/// The values of the slots (see [`FastExpr::slots`]); `None`: not written yet.
type Values = [Option<Dynamic>];

/// Per-slot scratch kept on the stack; a body with more assigned properties allocates.
const INLINE_SLOTS: usize = 8;

/// Per-slot scratch of one evaluation.
type PerSlot<T> = SmallVec<[T; INLINE_SLOTS]>;

/// The maps of the assigned parameters, in [`FastExpr::targets`]' order.
type Targets<'a> = SmallVec<[DynamicReadLock<'a, Map>; 2]>;

/// Where a slot's property is among its map's entries (their order), or [`ABSENT`].
type At = [u32];

/// The map has no entry for the slot's property.
const ABSENT: u32 = u32::MAX;

/// What an expression is evaluated against.
struct Cx<'a> {
    args: &'a [Dynamic],
    slots: &'a [(usize, Box<str>)],
    values: &'a Values,
    /// Each slot's property as its argument holds it (before the body), if it does.
    found: &'a [Option<&'a Dynamic>],
    limits: Limits,
}

impl Cx<'_> {
    /// The value last written to `param.prop`, if any.
    fn written(&self, param: usize, prop: &str) -> Option<&Dynamic> {
        let slot = self
            .slots
            .iter()
            .position(|(p, k)| *p == param && **k == *prop)?;
        self.values[slot].as_ref()
    }

    /// The value of `param.prop` when `prop` is the property of `slot`: the one last written,
    /// else the argument's own.
    fn current(&self, slot: usize) -> Option<&Dynamic> {
        self.values[slot].as_ref().or(self.found[slot])
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Longest string allowed, 0 for no limit (Rhai's convention).
    pub string: usize,
    /// Most map entries allowed, 0 for no limit.
    pub map: usize,
    /// Most array items allowed, 0 for no limit.
    pub array: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug)]
enum Node {
    Const(Dynamic),
    Param(usize),
    /// A property chain on a parameter, `r.a.b`, and the slot its first property is
    /// assigned through, if any (see [`FastExpr::slots`]).
    Prop(usize, Vec<ImmutableString>, Option<usize>),
    Map(Vec<(rhai::Identifier, Node)>),
    Binary(Op, Box<Node>, Box<Node>),
    Not(Box<Node>),
    Neg(Box<Node>),
    And(Vec<Node>),
    Or(Vec<Node>),
    /// `if c { a } else { b }` (statement bodies only).
    If(Box<Node>, Box<Node>, Box<Node>),
    /// `"field" in param.path` on a map (statement bodies only): Rhai parses it as
    /// `contains(param.path, "field")`, so a script that defines its own `contains` is never
    /// compiled natively (see `script::runtime`). The slot is the one that says whether what
    /// is looked into was assigned: `param.path[0]`'s, or for no path `param.field`'s when the
    /// field is a constant (a computed field is looked up by name).
    Has(usize, Vec<ImmutableString>, Box<Node>, Option<usize>),
}

/// Rhai counts at least one operation per node it evaluates, plus a few per call; the fast path
/// is only used when this many per node (and this many besides) stay under the budget.
const OPS_PER_NODE: u64 = 4;
const OPS_BESIDES: u64 = 16;

impl FastExpr {
    /// Compiles `program` (a function body cut out as a top-level program, see
    /// `script::runtime`) whose free variables are `params`. `None` when the body is not a
    /// single expression of the supported kinds, or could reach the operation budget.
    pub fn compile(engine: &Engine, program: &AST, params: &[String]) -> Option<Self> {
        let mut nodes = 0;
        let mut slots = Vec::new();
        let statements = body_statements(program.statements());
        let (mut sets, mut root) = match statements {
            [_] => {
                let expr = single_expression(statements)?;
                (Vec::new(), compile_expr(&expr, params, &mut nodes, false)?)
            }
            [init @ .., last] => {
                let sets = init
                    .iter()
                    .map(|s| compile_set(s, params, &mut slots, &mut nodes))
                    .collect::<Option<Vec<_>>>()?;
                let expr = single_expression(std::slice::from_ref(last))?;
                (sets, compile_expr(&expr, params, &mut nodes, true)?)
            }
            [] => return None,
        };
        let max_ops = engine.max_operations();
        if max_ops != 0 && OPS_PER_NODE * nodes + OPS_BESIDES >= max_ops {
            return None;
        }
        for node in sets.iter_mut().map(|s| &mut s.value).chain([&mut root]) {
            resolve_slots(node, &slots);
        }
        let mut targets: Vec<usize> = Vec::new();
        for (param, _) in &slots {
            if !targets.contains(param) {
                targets.push(*param);
            }
        }
        Some(Self {
            sets,
            slots,
            targets,
            root,
            limits: Limits {
                string: engine.max_string_size(),
                map: engine.max_map_size(),
                array: engine.max_array_size(),
            },
        })
    }

    /// Evaluates the body on `args`; `None` hands the record to Rhai.
    pub fn eval(&self, args: &[Dynamic]) -> Option<Dynamic> {
        let mut values = self.per_slot(None);
        let mut at = self.per_slot(ABSENT);
        let maps = self.target_maps(args)?;
        match self.run(args, &maps, &mut values, &mut at)? {
            Some(value) => Some(value),
            // The parameter as the assignments left it.
            None => {
                let param = self.returned()?;
                let mut map = (*maps[self.target_index(param)?]).clone();
                self.write_into(param, &mut values, &at, &mut map);
                Some(Dynamic::from_map(map))
            }
        }
    }

    /// [`eval`](Self::eval) for a caller that no longer needs `args` after a success: a body
    /// that returns a parameter it assigned to (`acc.n += 1; acc`) writes into that argument
    /// and returns it, instead of a changed copy (the argument is left `()`). `None` hands
    /// the record to Rhai with `args` untouched.
    pub fn eval_owned(&self, args: &mut [Dynamic]) -> Option<Dynamic> {
        let mut values = self.per_slot(None);
        let mut at = self.per_slot(ABSENT);
        {
            let args: &[Dynamic] = args;
            let maps = self.target_maps(args)?;
            if let Some(value) = self.run(args, &maps, &mut values, &mut at)? {
                return Some(value);
            }
        }
        let param = self.returned()?;
        let arg = args.get_mut(param)?;
        // A map: `target_maps` read it.
        let mut map = arg.as_map_mut().ok()?;
        self.write_into(param, &mut values, &at, &mut map);
        drop(map);
        Some(std::mem::take(arg))
    }

    fn per_slot<T: Clone>(&self, init: T) -> PerSlot<T> {
        smallvec![init; self.slots.len()]
    }

    /// The maps of the parameters assigned to; `None` when one is not a map (Rhai decides).
    fn target_maps<'a>(&self, args: &'a [Dynamic]) -> Option<Targets<'a>> {
        self.targets
            .iter()
            .map(|p| args.get(*p)?.read_lock::<Map>())
            .collect()
    }

    fn target_index(&self, param: usize) -> Option<usize> {
        self.targets.iter().position(|p| *p == param)
    }

    /// The parameter the body returns when it is one it assigned to.
    fn returned(&self) -> Option<usize> {
        match self.root {
            Node::Param(i) if self.targets.contains(&i) => Some(i),
            _ => None,
        }
    }

    /// Runs the assignments, then the final expression: `Some(None)` when that is a
    /// parameter assigned to, which the caller builds from `values` and `at`; `None` when
    /// Rhai must run the body.
    fn run<'m>(
        &self,
        args: &[Dynamic],
        maps: &'m Targets<'_>,
        values: &mut Values,
        at: &mut At,
    ) -> Option<Option<Dynamic>> {
        let mut found: PerSlot<Option<&'m Dynamic>> = self.per_slot(None);
        self.find(maps, &mut found, at)?;
        self.assign(args, values, &found)?;
        if self.returned().is_some() {
            return Some(None);
        }
        eval(&self.root, &self.cx(args, values, &found)).map(Some)
    }

    fn cx<'a>(&'a self, args: &'a [Dynamic], values: &'a Values, found: &'a [Option<&'a Dynamic>]) -> Cx<'a> {
        Cx {
            args,
            slots: &self.slots,
            values,
            found,
            limits: self.limits,
        }
    }

    /// One pass over each assigned parameter's entries: where each slot's property is and
    /// what it holds, and whether the properties added keep the map under the size limits;
    /// `None` when they might not (Rhai decides).
    ///
    /// Rhai checks the whole target after each property assignment. The values written are
    /// scalars, so what the target holds only grows with the properties added to it, and the
    /// check after its last assignment (every property added) decides all of them.
    fn find<'m>(&self, maps: &'m Targets<'_>, found: &mut [Option<&'m Dynamic>], at: &mut At) -> Option<()> {
        for (param, map) in self.targets.iter().zip(maps) {
            let map: &'m Map = map;
            let mut missing = self.slots.iter().filter(|(p, _)| p == param).count();
            let mut sizes = (0, 0, 0);
            for (pos, (key, value)) in map.iter().enumerate() {
                sizes = add(sizes, entry_sizes(value));
                if missing == 0 {
                    continue;
                }
                let key = key.as_str();
                let slot = self
                    .slots
                    .iter()
                    .position(|(p, k)| p == param && **k == *key);
                if let Some(slot) = slot {
                    found[slot] = Some(value);
                    at[slot] = u32::try_from(pos).ok()?;
                    missing -= 1;
                }
            }
            if !fits(sizes, missing, self.limits) {
                return None;
            }
        }
        Some(())
    }

    /// Runs the assignments into `values` (every slot is written when it returns `Some`);
    /// `None` when Rhai must run the body.
    fn assign(&self, args: &[Dynamic], values: &mut Values, found: &[Option<&Dynamic>]) -> Option<()> {
        for set in &self.sets {
            let cx = self.cx(args, values, found);
            let value = eval(&set.value, &cx)?;
            let new = match set.op {
                None => value,
                Some(op) => {
                    // A property missing before its first assignment: Rhai's business.
                    let current = cx.current(set.slot)?;
                    if !is_scalar(current) {
                        return None;
                    }
                    binary(op, current, &value, self.limits)?
                }
            };
            // Strings count towards the size limits: Rhai's business.
            if !(new.is_int() || new.is_bool() || new.is_unit()) {
                return None;
            }
            values[set.slot] = Some(new);
        }
        Some(())
    }

    /// Writes the slots of parameter `param` into `map`, its value, whose entries `at`
    /// places: the properties it has in one walk over them, then the new ones. The result
    /// passes the size limits: it holds what [`find`](Self::find) counted, or less (a scalar
    /// written over a string, array or map).
    fn write_into(&self, param: usize, values: &mut Values, at: &At, map: &mut Map) {
        let mine = |slot: &usize| self.slots[*slot].0 == param;
        let mut left = (0..self.slots.len()).filter(|s| mine(s) && at[*s] != ABSENT).count();
        for (pos, old) in map.values_mut().enumerate() {
            if left == 0 {
                break;
            }
            let slot = (0..self.slots.len()).find(|s| at[*s] == pos as u32 && mine(s));
            if let Some(v) = slot.and_then(|s| values[s].take()) {
                *old = v;
                left -= 1;
            }
        }
        for slot in (0..self.slots.len()).filter(|s| mine(s) && at[*s] == ABSENT) {
            if let Some(v) = values[slot].take() {
                map.insert(self.slots[slot].1.as_ref().into(), v);
            }
        }
    }
}

/// Fills in the slot of every property read of `node` (see [`FastExpr::slots`]).
fn resolve_slots(node: &mut Node, slots: &[(usize, Box<str>)]) {
    match node {
        Node::Const(_) | Node::Param(_) => {}
        Node::Prop(param, path, slot) => {
            *slot = slots
                .iter()
                .position(|(p, k)| p == param && path.first().map(|f| f.as_str()) == Some(&**k));
        }
        Node::Map(fields) => fields.iter_mut().for_each(|(_, n)| resolve_slots(n, slots)),
        Node::Binary(_, a, b) => {
            resolve_slots(a, slots);
            resolve_slots(b, slots);
        }
        Node::Not(a) | Node::Neg(a) => resolve_slots(a, slots),
        Node::And(items) | Node::Or(items) => items.iter_mut().for_each(|n| resolve_slots(n, slots)),
        Node::If(c, a, b) => {
            resolve_slots(c, slots);
            resolve_slots(a, slots);
            resolve_slots(b, slots);
        }
        Node::Has(param, path, item, slot) => {
            let found = |name: &str| slots.iter().position(|(p, k)| p == param && **k == *name);
            *slot = match (path.first(), &**item) {
                (Some(first), _) => found(first),
                (None, Node::Const(c)) => c
                    .as_immutable_string_ref()
                    .ok()
                    .and_then(|field| found(field.as_str())),
                (None, _) => None,
            };
            resolve_slots(item, slots);
        }
    }
}

/// Whether a map of `sizes` with `added` more scalar entries stays below every size limit
/// (Rhai checks the whole target after a property assignment; at the limit, Rhai decides).
fn fits(sizes: DataSizes, added: usize, limits: Limits) -> bool {
    let (arrays, maps, strings) = sizes;
    let under = |n: usize, max: usize| max == 0 || n < max;
    under(arrays, limits.array) && under(maps + added, limits.map) && under(strings, limits.string)
}

/// The statements of a body: `{ ... }` unwrapped.
fn body_statements(statements: &[Stmt]) -> &[Stmt] {
    match statements {
        [Stmt::Block(block)] => body_statements(block.statements()),
        _ => statements,
    }
}

/// `param.prop = value;` or `param.prop op= value;`, its target's slot found in (or added to)
/// `slots`.
fn compile_set(
    stmt: &Stmt,
    params: &[String],
    slots: &mut Vec<(usize, Box<str>)>,
    nodes: &mut u64,
) -> Option<Set> {
    let Stmt::Assignment(assignment) = stmt else {
        return None;
    };
    let (info, rhai::BinaryExpr { lhs, rhs }) = &**assignment;
    let Expr::Dot(chain, flags, _) = lhs else {
        return None;
    };
    if !flags.is_empty() {
        return None;
    }
    let param = param_index(&chain.lhs, params)?;
    let Expr::Property(p, _) = &chain.rhs else {
        return None;
    };
    let op = match info.get_op_assignment_info() {
        None => None,
        Some((.., op_syntax)) => Some(binary_op(op_syntax)?),
    };
    *nodes += 3;
    let value = compile_expr(rhs, params, nodes, true)?;
    let target = (param, Box::<str>::from(p.2.as_str()));
    let slot = match slots.iter().position(|s| *s == target) {
        Some(slot) => slot,
        None => {
            slots.push(target);
            slots.len() - 1
        }
    };
    Some(Set { slot, op, value })
}

/// The one expression a body consists of: `{ expr }`, possibly nested blocks.
fn single_expression(statements: &[Stmt]) -> Option<Expr> {
    match statements {
        [Stmt::Block(block)] => single_expression(block.statements()),
        [Stmt::Expr(e)] => Some((**e).clone()),
        [Stmt::FnCall(call, pos)] => Some(Expr::FnCall(call.clone(), *pos)),
        _ => None,
    }
}

/// `branches`: if-expressions and `in` are allowed (statement bodies).
fn compile_expr(expr: &Expr, params: &[String], nodes: &mut u64, branches: bool) -> Option<Node> {
    *nodes += 1;
    let node = match expr {
        Expr::IntegerConstant(i, _) => Node::Const(Dynamic::from_int(*i)),
        Expr::StringConstant(s, _) => Node::Const(Dynamic::from(s.clone())),
        Expr::BoolConstant(b, _) => Node::Const(Dynamic::from_bool(*b)),
        Expr::Unit(_) => Node::Const(Dynamic::UNIT),
        Expr::DynamicConstant(d, _) if is_scalar(d) => Node::Const((**d).clone()),
        Expr::Variable(..) => Node::Param(param_index(expr, params)?),
        Expr::Dot(chain, flags, _) if flags.is_empty() => {
            let param = param_index(&chain.lhs, params)?;
            let mut path = Vec::new();
            property_path(&chain.rhs, &mut path)?;
            *nodes += path.len() as u64;
            Node::Prop(param, path, None)
        }
        Expr::Map(map, _) => {
            let mut fields = Vec::with_capacity(map.0.len());
            for (name, value) in &map.0 {
                fields.push((
                    name.name.as_str().into(),
                    compile_expr(value, params, nodes, branches)?,
                ));
            }
            Node::Map(fields)
        }
        Expr::And(items, _) => Node::And(compile_all(items, params, nodes, branches)?),
        Expr::Or(items, _) => Node::Or(compile_all(items, params, nodes, branches)?),
        Expr::Stmt(block) if branches => {
            let [Stmt::If(flow, _)] = block.statements() else {
                return None;
            };
            let arm = |b: &rhai::StmtBlock, nodes: &mut u64| -> Option<Node> {
                if b.statements().is_empty() {
                    return Some(Node::Const(Dynamic::UNIT));
                }
                compile_expr(&single_expression(b.statements())?, params, nodes, true)
            };
            Node::If(
                Box::new(compile_expr(&flow.expr, params, nodes, true)?),
                Box::new(arm(&flow.body, nodes)?),
                Box::new(arm(&flow.branch, nodes)?),
            )
        }
        Expr::FnCall(call, _)
            if branches
                && call.namespace.is_empty()
                && call.name.as_str() == rhai::OP_CONTAINS =>
        {
            let [container, item] = call.args.as_slice() else {
                return None;
            };
            let (param, path) = match container {
                Expr::Variable(..) => (param_index(container, params)?, Vec::new()),
                Expr::Dot(chain, flags, _) if flags.is_empty() => {
                    let mut path = Vec::new();
                    property_path(&chain.rhs, &mut path)?;
                    (param_index(&chain.lhs, params)?, path)
                }
                _ => return None,
            };
            *nodes += path.len() as u64;
            Node::Has(
                param,
                path,
                Box::new(compile_expr(item, params, nodes, true)?),
                None,
            )
        }
        Expr::FnCall(call, _) if call.op_token.is_some() && call.namespace.is_empty() => {
            match (call.name.as_str(), call.args.as_slice()) {
                ("!", [a]) => Node::Not(Box::new(compile_expr(a, params, nodes, branches)?)),
                ("-", [a]) => Node::Neg(Box::new(compile_expr(a, params, nodes, branches)?)),
                (name, [a, b]) => Node::Binary(
                    binary_op(name)?,
                    Box::new(compile_expr(a, params, nodes, branches)?),
                    Box::new(compile_expr(b, params, nodes, branches)?),
                ),
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(node)
}

fn compile_all(
    items: &[Expr],
    params: &[String],
    nodes: &mut u64,
    branches: bool,
) -> Option<Vec<Node>> {
    items
        .iter()
        .map(|e| compile_expr(e, params, nodes, branches))
        .collect()
}

fn is_scalar(d: &Dynamic) -> bool {
    d.is_int() || d.is_string() || d.is_bool() || d.is_unit()
}

fn param_index(expr: &Expr, params: &[String]) -> Option<usize> {
    let Expr::Variable(var, ..) = expr else {
        return None;
    };
    if !var.2.is_empty() {
        return None;
    }
    params.iter().position(|p| p.as_str() == var.1.as_str())
}

/// `a` or `a.b.c` on the right of a `.`.
fn property_path(expr: &Expr, path: &mut Vec<ImmutableString>) -> Option<()> {
    match expr {
        Expr::Property(p, _) => {
            path.push(p.2.clone());
            Some(())
        }
        Expr::Dot(chain, flags, _) if flags.is_empty() => {
            let Expr::Property(p, _) = &chain.lhs else {
                return None;
            };
            path.push(p.2.clone());
            property_path(&chain.rhs, path)
        }
        _ => None,
    }
}

pub(crate) fn binary_op(name: &str) -> Option<Op> {
    Some(match name {
        "+" => Op::Add,
        "-" => Op::Sub,
        "*" => Op::Mul,
        "/" => Op::Div,
        "%" => Op::Rem,
        "==" => Op::Eq,
        "!=" => Op::Ne,
        "<" => Op::Lt,
        "<=" => Op::Le,
        ">" => Op::Gt,
        ">=" => Op::Ge,
        _ => return None,
    })
}

fn eval(node: &Node, cx: &Cx<'_>) -> Option<Dynamic> {
    let limits = cx.limits;
    match node {
        Node::Const(c) => Some(c.clone()),
        Node::Param(i) => scalar(cx.args.get(*i)?.clone()),
        Node::Prop(i, path, slot) => {
            let (first, rest) = path.split_first()?;
            let mut value = match slot {
                // A property missing before its first assignment: Rhai's business.
                Some(s) => cx.current(*s)?.clone(),
                None => property(cx.args.get(*i)?, first)?,
            };
            for key in rest {
                value = property(&value, key)?;
            }
            scalar(value)
        }
        Node::Map(fields) => {
            if limits.map != 0 && fields.len() >= limits.map {
                return None;
            }
            let mut out = Map::new();
            let mut strings = 0;
            for (name, value) in fields {
                let v = eval(value, cx)?;
                if let Ok(s) = v.as_immutable_string_ref() {
                    strings += s.len();
                }
                out.insert(name.clone(), v);
            }
            if limits.string != 0 && strings >= limits.string {
                return None;
            }
            Some(Dynamic::from_map(out))
        }
        Node::Binary(op, a, b) => binary(*op, &eval(a, cx)?, &eval(b, cx)?, limits),
        Node::Not(a) => Some(Dynamic::from_bool(!eval(a, cx)?.as_bool().ok()?)),
        Node::Neg(a) => Some(Dynamic::from_int(
            eval(a, cx)?.as_int().ok()?.checked_neg()?,
        )),
        Node::And(items) => {
            for item in items {
                if !eval(item, cx)?.as_bool().ok()? {
                    return Some(Dynamic::FALSE);
                }
            }
            Some(Dynamic::TRUE)
        }
        Node::Or(items) => {
            for item in items {
                if eval(item, cx)?.as_bool().ok()? {
                    return Some(Dynamic::TRUE);
                }
            }
            Some(Dynamic::FALSE)
        }
        Node::If(c, a, b) => {
            if eval(c, cx)?.as_bool().ok()? {
                eval(a, cx)
            } else {
                eval(b, cx)
            }
        }
        Node::Has(i, path, item, slot) => {
            let computed;
            let (field, constant) = match &**item {
                Node::Const(c) => (c, true),
                item => {
                    computed = eval(item, cx)?;
                    (&computed, false)
                }
            };
            let field = field.as_immutable_string_ref().ok()?;
            if path.is_empty() {
                let has = match slot {
                    Some(s) if constant => cx.current(*s).is_some(),
                    _ if cx.written(*i, &field).is_some() => true,
                    _ => {
                        let map = cx.args.get(*i)?.as_map_ref().ok()?;
                        map.contains_key(field.as_str())
                    }
                };
                return Some(Dynamic::from_bool(has));
            }
            let (first, rest) = path.split_first()?;
            let mut value = match slot {
                // A written value is a scalar, never a map.
                Some(s) if cx.values[*s].is_some() => return None,
                Some(s) => cx.found[*s]?.clone(),
                None => property(cx.args.get(*i)?, first)?,
            };
            for key in rest {
                value = property(&value, key)?;
            }
            let map = value.as_map_ref().ok()?;
            Some(Dynamic::from_bool(map.contains_key(field.as_str())))
        }
    }
}

/// Only values whose every operation here matches Rhai's built-ins pass; anything else
/// (floats, arrays, maps, timestamps, custom types) goes to Rhai.
fn scalar(value: Dynamic) -> Option<Dynamic> {
    is_scalar(&value).then_some(value)
}

/// `map.key` on a map that has the key (a missing key is Rhai's business: `()` or an error).
fn property(target: &Dynamic, key: &str) -> Option<Dynamic> {
    let map = target.as_map_ref().ok()?;
    map.get(key).cloned()
}

pub(crate) fn binary(op: Op, a: &Dynamic, b: &Dynamic, limits: Limits) -> Option<Dynamic> {
    if let (Ok(x), Ok(y)) = (a.as_int(), b.as_int()) {
        return Some(match op {
            Op::Add => Dynamic::from_int(x.checked_add(y)?),
            Op::Sub => Dynamic::from_int(x.checked_sub(y)?),
            Op::Mul => Dynamic::from_int(x.checked_mul(y)?),
            Op::Div if y != 0 => Dynamic::from_int(x.checked_div(y)?),
            Op::Rem if y != 0 => Dynamic::from_int(x.checked_rem(y)?),
            Op::Div | Op::Rem => return None,
            cmp => Dynamic::from_bool(compare(cmp, x.cmp(&y))?),
        });
    }
    if let (Ok(x), Ok(y)) = (a.as_immutable_string_ref(), b.as_immutable_string_ref()) {
        return Some(match op {
            Op::Add => {
                let len = x.len() + y.len();
                if limits.string != 0 && len >= limits.string {
                    return None;
                }
                let mut s = String::with_capacity(len);
                s.push_str(&x);
                s.push_str(&y);
                Dynamic::from(s)
            }
            Op::Sub | Op::Mul | Op::Div | Op::Rem => return None,
            cmp => Dynamic::from_bool(compare(cmp, x.as_str().cmp(y.as_str()))?),
        });
    }
    if let (Ok(x), Ok(y)) = (a.as_bool(), b.as_bool()) {
        return match op {
            Op::Eq => Some(Dynamic::from_bool(x == y)),
            Op::Ne => Some(Dynamic::from_bool(x != y)),
            _ => None,
        };
    }
    None
}

fn compare(op: Op, ordering: Ordering) -> Option<bool> {
    Some(match op {
        Op::Eq => ordering == Ordering::Equal,
        Op::Ne => ordering != Ordering::Equal,
        Op::Lt => ordering == Ordering::Less,
        Op::Le => ordering != Ordering::Greater,
        Op::Gt => ordering == Ordering::Greater,
        Op::Ge => ordering != Ordering::Less,
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Rem => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use weir_schema::ScriptLimitsSpec;

    use super::*;
    use crate::script::runtime::{CompiledScript, ScriptFn, runtime_engine};

    /// `None` when Rhai does not parse `text`.
    fn try_script(
        limits: &ScriptLimitsSpec,
        text: &str,
    ) -> Option<(ScriptFn, Arc<CompiledScript>)> {
        let engine = Arc::new(runtime_engine(limits));
        let compiled = Arc::new(CompiledScript::compile(&engine, text).ok()?);
        Some((ScriptFn::new(engine, Arc::clone(&compiled)), compiled))
    }

    fn script(limits: &ScriptLimitsSpec, text: &str) -> (ScriptFn, Arc<CompiledScript>) {
        try_script(limits, text).expect("compiles")
    }

    /// Asserts that `f` gives the same value or error through `invoke` as through a plain Rhai
    /// call on every record; returns how many of the results the native path computed.
    fn agrees_with_rhai(s: &mut ScriptFn, compiled: &CompiledScript, text: &str) -> usize {
        let mut natively = 0;
        for r in records() {
            let rhai = s.call("f", (r.clone(),));
            let mut args = [r.clone()];
            let ours = s.invoke("f", &mut args);
            assert_eq!(shown(ours), shown(rhai), "{text} on {r:?}");
            natively += usize::from(compiled.native_eval("f", &args).is_some());
        }
        natively
    }

    fn records() -> Vec<Dynamic> {
        let json = [
            r#"{"user":"u1","amount":5,"ts":1700000000000,"name":"ünï","big":9223372036854775807,"neg":-3,"zero":0,"f":1.5,"flag":true,"nested":{"a":{"b":7}},"arr":[1,2],"none":null,"long":"abcdefghij","len":3}"#,
            r#"{"user":"u0","amount":50,"ts":1,"name":"zed","big":-9223372036854775808,"neg":4,"zero":0,"f":-0.5,"flag":false,"nested":{"a":{"b":"x"}},"arr":[],"none":null,"long":""}"#,
            r#"{"user":5,"amount":"5","nested":{"a":3},"flag":1}"#,
            r#"{}"#,
            r#"[1,2,3]"#,
            r#""just a string""#,
        ];
        json.iter()
            .map(|j| serde_json::from_str::<Dynamic>(j).expect("json"))
            .collect()
    }

    const SCRIPTS: &[(&str, bool)] = &[
        (
            "fn f(r) { #{key: \"user:\" + r.user, v: r.amount * 2 + 1} }",
            true,
        ),
        ("fn f(r) { r.amount > 10 && r.user != \"u0\" }", true),
        ("fn f(r) { r.big + 1 }", true),
        ("fn f(r) { r.big - 1 }", true),
        ("fn f(r) { r.big * r.neg }", true),
        ("fn f(r) { -r.big }", true),
        ("fn f(r) { r.amount / r.zero }", true),
        ("fn f(r) { r.amount % r.zero }", true),
        ("fn f(r) { r.amount % 3 - -r.neg }", true),
        ("fn f(r) { r.nested.a.b * 2 }", true),
        ("fn f(r) { r.missing }", true),
        ("fn f(r) { r.none }", true),
        ("fn f(r) { r.f + 1 }", true),
        ("fn f(r) { r.user + r.amount }", true),
        ("fn f(r) { !r.flag || r.amount == 5 }", true),
        ("fn f(r) { r.name < \"z\" && r.name >= \"a\" }", true),
        ("fn f(r) { r.name <= r.user || r.name > r.user }", true),
        ("fn f(r) { #{a: r.arr, b: r.nested} }", true),
        ("fn f(r) { r.user - \"u\" }", true),
        ("fn f(r) { r }", true),
        ("fn f(r) { r.user == 5 }", true),
        ("fn f(r) { true == r.flag }", true),
        ("fn f(r) { r.flag != false }", true),
        ("fn f(r) { #{} }", false),
        ("fn f(r) { r.long + r.long + r.long }", true),
        ("fn f(r) { r.ts }", true),
        ("fn f(r) { r.len + 1 }", true),
        ("fn f(r) { if r.amount > 1 { 1 } else { 2 } }", false),
        ("fn f(r) { let x = r.amount; x }", false),
        ("fn f(r) { r.user.len() }", false),
        ("fn f(r) { `${r.user}!` }", false),
        ("fn f(r) { r[\"user\"] }", false),
        ("fn f(r) { r?.user }", false),
        ("fn g(x) { x } fn f(r) { g(r.amount) }", false),
        // Host functions with effects or a clock are never evaluated natively.
        ("fn f(r) { now() }", false),
        ("fn f(r) { register_event_timer(r.ts) }", false),
        ("fn f(r) { r.ts < watermark() }", false),
    ];

    /// A result as text, without the script position: a plain call reports no position for
    /// a size limit broken by the returned value, the body run by `invoke` does.
    fn shown(result: Result<Dynamic, String>) -> Result<String, String> {
        result.map(|v| format!("{v:?}")).map_err(|e| {
            // The position line of a run-time error (`at script line 1, column 27 [code]`).
            if let (Some(at), Some(code)) = (e.find("\n  at "), e.find(" [weir::")) {
                return format!("{}{}", &e[..at], &e[code..]);
            }
            match (e.find(" (line "), e.find("position ")) {
                (Some(start), Some(p)) => {
                    let end = p + e[p..].find(')').map_or(0, |i| i + 1);
                    format!("{}{}", &e[..start], &e[end..])
                }
                _ => e,
            }
        })
    }

    /// Every script gives the same value or the same error through `invoke` (native first)
    /// as through a plain Rhai call, on every record, including the ones the native path
    /// hands back to Rhai.
    #[test]
    fn native_evaluation_is_indistinguishable_from_rhai() {
        let tight = ScriptLimitsSpec {
            max_string_size: weir_schema::units::SizeSpec(25),
            max_map_size: 2,
            ..ScriptLimitsSpec::default()
        };
        let mut natively = 0;
        for limits in [ScriptLimitsSpec::default(), tight] {
            for (text, native) in SCRIPTS {
                let (mut s, compiled) = script(&limits, text);
                assert_eq!(compiled.native("f"), *native, "{text}");
                natively += agrees_with_rhai(&mut s, &compiled, text);
            }
        }
        // The comparison covers the native path itself, not only its fallbacks.
        assert!(natively >= 30, "{natively} results were computed natively");
    }

    /// Random expressions of the native subset (and a little beyond it), rendered fully
    /// parenthesised.
    struct ExprGen(u64);

    impl ExprGen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }

        fn expr(&mut self, depth: u32) -> String {
            let leaf = depth == 0 || self.next().is_multiple_of(3);
            if leaf {
                return match self.next() % 4 {
                    0 => self
                        .pick(&[
                            "0",
                            "1",
                            "2",
                            "-3",
                            "100",
                            "9223372036854775807",
                            "-9223372036854775807",
                        ])
                        .to_owned(),
                    1 => self
                        .pick(&["\"\"", "\"a\"", "\"ü\"", "\"user:\"", "true", "false", "()"])
                        .to_owned(),
                    _ => format!(
                        "r.{}",
                        self.pick(&[
                            "user",
                            "amount",
                            "ts",
                            "name",
                            "big",
                            "neg",
                            "zero",
                            "f",
                            "flag",
                            "nested.a.b",
                            "nested.a",
                            "arr",
                            "none",
                            "long",
                            "missing",
                            "len",
                        ])
                    ),
                };
            }
            match self.next() % 6 {
                0 => format!("(!{})", self.expr(depth - 1)),
                1 => format!("(- {})", self.expr(depth - 1)),
                2 => format!(
                    "#{{k: {}, v: {}}}",
                    self.expr(depth - 1),
                    self.expr(depth - 1)
                ),
                _ => {
                    let op = self.pick(&[
                        "+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||",
                    ]);
                    format!("({} {op} {})", self.expr(depth - 1), self.expr(depth - 1))
                }
            }
        }
    }

    #[test]
    fn random_expressions_agree_with_rhai() {
        let mut generator = ExprGen(0x9E37_79B9_7F4A_7C15);
        let mut natively = 0;
        let mut compiled_natively = 0;
        for _ in 0..1500 {
            let text = format!("fn f(r) {{ {} }}", generator.expr(4));
            // Rhai rejects some literal combinations at parse time (`"a" && true`).
            let Some((mut s, compiled)) = try_script(&ScriptLimitsSpec::default(), &text) else {
                continue;
            };
            compiled_natively += usize::from(compiled.native("f"));
            natively += agrees_with_rhai(&mut s, &compiled, &text);
        }
        assert!(
            compiled_natively >= 1000,
            "{compiled_natively} of 1500 compiled natively"
        );
        assert!(natively >= 1000, "{natively} results computed natively");
    }

    #[test]
    fn two_parameters() {
        let (mut s, compiled) = script(
            &ScriptLimitsSpec::default(),
            "fn f(acc, r) { #{sum: acc.sum + r.amount, n: acc.n + 1} }",
        );
        assert!(compiled.native("f"));
        let acc: Dynamic = serde_json::from_str(r#"{"sum":10,"n":1}"#).expect("json");
        for r in records() {
            let rhai = s.call("f", (acc.clone(), r.clone()));
            let ours = s.invoke("f", &mut [acc.clone(), r]);
            assert_eq!(shown(ours), shown(rhai));
        }
    }

    /// Whether the native path answered for `args`; when it did, it answered as a plain Rhai
    /// call does. (Where it hands over, the body runs in Rhai; an error report of a body that
    /// changed its arguments before failing names what it left, a plain call the originals.)
    ///
    /// The evaluation for a caller done with its arguments (`eval_owned`) answers exactly when
    /// `eval` does, with the same value, and leaves the arguments untouched when it does not;
    /// `invoke_owned` answers as `invoke` does.
    fn native_agrees(s: &mut ScriptFn, compiled: &CompiledScript, text: &str, args: &[Dynamic]) -> usize {
        let mut owned = args.to_vec();
        let native_owned = compiled.native_eval_owned("f", &mut owned);
        assert_eq!(
            s.invoke_owned("f", &mut args.to_vec()).map(|v| format!("{v:?}")),
            s.invoke("f", &mut args.to_vec()).map(|v| format!("{v:?}")),
            "{text} on {args:?}"
        );
        let Some(native) = compiled.native_eval("f", args) else {
            assert!(native_owned.is_none(), "{text} on {args:?}");
            assert_eq!(format!("{owned:?}"), format!("{args:?}"), "{text}: arguments kept");
            return 0;
        };
        assert_eq!(
            native_owned.map(|v| format!("{v:?}")),
            Some(format!("{native:?}")),
            "{text} on {args:?}"
        );
        let rhai = match args {
            [a] => s.call("f", (a.clone(),)),
            [a, b] => s.call("f", (a.clone(), b.clone())),
            _ => unreachable!("one or two parameters"),
        };
        assert_eq!(Ok(format!("{native:?}")), shown(rhai), "{text} on {args:?}");
        let ours = s.invoke("f", &mut args.to_vec());
        assert_eq!(ours.map(|v| format!("{v:?}")), Ok(format!("{native:?}")), "{text}");
        1
    }

    /// Reduce-style bodies: assignments to parameters' properties, then an expression or the
    /// parameter; every result and error as Rhai's, for accumulators and records of every kind.
    #[test]
    fn statement_bodies_agree_with_rhai() {
        let cases: &[(&str, bool)] = &[
            // W1 with a Rhai reduce (bench/weir/w1_reduce.yaml).
            (
                "fn f(acc, r) { acc.amount += r.amount; acc.ts = if \"n\" in acc { acc.n + 1 } else { 2 }; acc.n = acc.ts; acc }",
                true,
            ),
            ("fn f(acc, r) { acc.amount += r.amount; acc }", true),
            ("fn f(acc, r) { acc.n += 1; acc.sum += r.amount; #{n: acc.n, s: acc.sum} }", true),
            ("fn f(acc, r) { acc.x = r.user; acc }", true),
            ("fn f(acc, r) { acc.missing += 1; acc }", true),
            ("fn f(acc, r) { acc.big += 1; acc.big }", true),
            ("fn f(acc, r) { r.amount = 5; r.amount * 2 }", true),
            ("fn f(acc, r) { acc.n = if \"n\" in acc { acc.n + 1 } else { 1 }; acc.n }", true),
            ("fn f(acc, r) { acc.n = if r.flag { 1 }; acc }", true),
            ("fn f(acc, r) { acc.f += 1; acc }", true),
            ("fn f(acc, r) { acc.amount -= r.amount; acc.amount *= 2; acc.amount /= r.zero; acc }", true),
            ("fn f(acc, r) { acc.k = \"a\" in r.nested; acc.h = \"b\" in r.nested.a; acc }", true),
            ("fn f(acc, r) { acc.new1 = 1; acc.new2 = 2; acc.new3 = 3; acc }", true),
            ("fn f(acc, r) { let t = acc.n; acc.n = t; acc }", false),
            ("fn f(acc, r) { acc.nested.a = 1; acc }", false),
            // Rhai's optimiser makes a final `return x;` the expression `x`.
            ("fn f(acc, r) { acc.n += 1; return acc; }", true),
            ("fn f(acc, r) { if r.flag { return 1; } acc.n += 1; acc }", false),
            // `in` on a property assigned before, by a constant and by a computed name.
            ("fn f(acc, r) { acc.x = 1; acc.y = \"x\" in acc; acc.z = \"n\" in acc; acc }", true),
            ("fn f(acc, r) { acc.u1 = 1; acc.y = r.user in acc; acc }", true),
            ("fn f(acc, r) { acc.nested = 1; acc.k = \"a\" in acc.nested; acc }", true),
            // A property read before a later assignment to it; the record returned; both
            // parameters assigned.
            ("fn f(acc, r) { acc.t = acc.n; acc.n = 5; acc.n += acc.t; acc }", true),
            ("fn f(acc, r) { r.amount = acc.amount; r.seen = true; r }", true),
            ("fn f(acc, r) { acc.n = 1; r.n = 2; acc.m = r.n; acc }", true),
            // Three properties assigned, one new: under `max_map_size: 4` only the exact count
            // of added properties fits.
            ("fn f(acc, r) { acc.amount += 1; acc.ts = 1; acc.n = 1; acc }", true),
        ];
        let accs: Vec<Dynamic> = [
            r#"{"user":"u1","amount":5,"ts":1,"n":3,"big":9223372036854775807,"f":0.5}"#,
            r#"{"user":"u2","amount":7,"ts":2}"#,
            r#"{"amount":"7","n":true}"#,
            r#"{"arr":[1],"amount":1}"#,
            r#"{"amount":1,"ts":0}"#,
            r#"{}"#,
            r#"7"#,
        ]
        .iter()
        .map(|j| serde_json::from_str(j).expect("json"))
        .collect();
        let tight = ScriptLimitsSpec {
            max_string_size: weir_schema::units::SizeSpec(8),
            max_map_size: 4,
            ..ScriptLimitsSpec::default()
        };
        let mut natively = 0;
        for limits in [ScriptLimitsSpec::default(), tight] {
            for (text, native) in cases {
                let (mut s, compiled) = script(&limits, text);
                assert_eq!(compiled.native("f"), *native, "{text}");
                for acc in &accs {
                    for r in records() {
                        let args = [acc.clone(), r.clone()];
                        natively += native_agrees(&mut s, &compiled, text, &args);
                    }
                }
            }
        }
        assert!(natively >= 60, "{natively} results computed natively");
    }

    /// Random assignment sequences over the native subset, then the record or an expression.
    #[test]
    fn random_statement_bodies_agree_with_rhai() {
        let mut generator = ExprGen(0x2545_F491_4F6C_DD1D);
        let mut natively = 0;
        for _ in 0..400 {
            let mut body = String::new();
            for _ in 0..=generator.next() % 3 {
                let prop = generator.pick(&["amount", "ts", "neg", "zero", "new", "flag", "user", "big"]);
                let op = generator.pick(&["=", "+=", "-=", "*=", "/=", "%="]);
                let ints = ["r.amount", "r.ts", "r.neg", "r.len", "r.new", "1", "-3", "100", "r.zero"];
                let value = match generator.next() % 4 {
                    0 => generator.expr(2),
                    1 => format!(
                        "if \"{}\" in r {{ {} }} else {{ {} }}",
                        generator.pick(&["amount", "new", "missing"]),
                        generator.pick(&ints),
                        generator.pick(&ints)
                    ),
                    _ => format!(
                        "{} {} {}",
                        generator.pick(&ints),
                        generator.pick(&["+", "-", "*", "/", "%"]),
                        generator.pick(&ints)
                    ),
                };
                body.push_str(&format!("r.{prop} {op} {value}; "));
            }
            if generator.next().is_multiple_of(2) {
                body.push('r');
            } else {
                body.push_str(&generator.expr(2));
            }
            let text = format!("fn f(r) {{ {body} }}");
            let Some((mut s, compiled)) = try_script(&ScriptLimitsSpec::default(), &text) else {
                continue;
            };
            for r in records() {
                natively += native_agrees(&mut s, &compiled, &text, &[r]);
            }
        }
        assert!(natively >= 60, "{natively} results computed natively");
    }

    #[test]
    fn the_benchmark_map_is_evaluated_natively() {
        let engine = runtime_engine(&ScriptLimitsSpec::default());
        let program = engine
            .compile("{ #{key: \"user:\" + r.user, v: r.amount * 2 + 1} }")
            .expect("compiles");
        let fast = FastExpr::compile(&engine, &program, &["r".to_owned()]).expect("native");
        let r: Dynamic = serde_json::from_str(r#"{"user":"u7","amount":3,"ts":1}"#).expect("json");
        let out = fast.eval(std::slice::from_ref(&r)).expect("no fallback");
        let out = out.as_map_ref().expect("map");
        assert_eq!(out["key"].to_string(), "user:u7");
        assert_eq!(out["v"].as_int(), Ok(7));
    }

    #[test]
    fn a_tiny_operation_budget_disables_the_native_path() {
        let limits = ScriptLimitsSpec {
            max_operations: 10,
            ..ScriptLimitsSpec::default()
        };
        let (_, compiled) = script(
            &limits,
            "fn f(r) { #{key: \"user:\" + r.user, v: r.amount * 2 + 1} }",
        );
        assert!(!compiled.native("f"));
    }
}
