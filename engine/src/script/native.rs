//! Native execution of whole `process` (and `on_end`) bodies: statements, locals, arrays,
//! maps and the keyed state functions, without Rhai's evaluator.
//!
//! [`NativeProgram::compile`] turns a function body (Rhai's AST, through the `internals`
//! feature) into a small tree once per operator: `let` locals and parameters resolved to
//! slots, assignment (`x = v`, `x op= v`, `a[i] = v`, `m[k] = v`, `m.k = v` on locals), `if`/
//! `else` (statement and expression), `for x in array`, `for i in a..b` and `a..=b`, `while`,
//! `break`, `continue`, `return`; array literals and `push`, `pop`, `len`, `sort()` and
//! `sort(|a, b| expr)` on locals; map literals, property and index reads; string
//! interpolation of ints and strings; integer arithmetic and comparisons, string `+` and
//! comparisons, `!`, `&&`, `||`, `==`/`!=` against `()`; and the keyed state functions
//! (`state_get`, `state_set`, `state_clear`, `state_add`, `list_get`, `list_push`, `list_len`,
//! `list_set`, `list_top`, `map_get`, `map_put`, `map_add`, `map_remove`, `map_len`), `emit`
//! and `key()`, as direct calls on the state named by a string literal. A body with anything
//! else, or whose script defines a function of the same name as one of those it calls, is
//! not compiled: Rhai runs it as before.
//!
//! Exactness is the rule, as in [`super::fast`]: a native run either does exactly what Rhai
//! would, or gives up on the record *before any visible effect*, and the caller runs the
//! record through Rhai, so every error, coercion and sandbox breach stays Rhai's own. The
//! effects of a run (state writes, emitted records) are buffered in [`Scratch`] and applied
//! only when the body completed natively (map entries set and list items pushed are applied
//! to the stored map or list in place, not to a copy of it); reads see the record's own buffered writes, and
//! each state's stored value is read once per record ([`StateBackend::lend`]). Should the
//! backend fail while the writes are applied, those applied are undone and the record fails
//! with no effect. A run
//! gives up on: a value of a type it does not cover (floats, chars, timestamps, ...), a
//! missing property or index, an integer overflow or division by zero, a type mix, any size
//! (`limits.max_string_size`, `max_array_size`, `max_map_size`) reached, a state write the
//! state functions would refuse, an `emit` over `limits.max_outputs_per_record`, a
//! comparator that does not answer with an int or a bool, an operation count that could
//! reach `limits.max_operations` (counted as [`OPS_PER_NODE`] per node and [`OPS_PER_CALL`]
//! per call, more than Rhai counts, each block's all at once as the run enters it), an undeclared state, a state with a
//! time-to-live, or a state backend error. Buffers are kept from record to record, so a run
//! allocates only for the values it makes.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;

use rhai::{AST, Array, Dynamic, Engine, Expr, FnPtr, ImmutableString, Map, Stmt, StmtBlock};

use super::fast::{Limits, Op, binary, binary_op};
use super::runtime::{
    DataSizes, SizeLimits, StateAccess, add, add_in_place, add_into, add_to, array_sizes,
    data_sizes, element_sizes, entry_sizes, insert_top, map_sizes, put_into, sub,
    with_state_access,
};
use crate::record::{Key, KeyBuildHasher};
use crate::state::{StateBackend, StateId};

/// Operations a native run charges per node (of each block it enters, see `Block`): Rhai
/// counts at most this many per node it evaluates.
pub const OPS_PER_NODE: u64 = 4;
/// Operations a native run charges per function call (host functions, methods, comparators).
pub const OPS_PER_CALL: u64 = 16;
/// The room a list made by `list_push` onto an absent state starts with: a list rebuilt item
/// by item (cleared, then pushed) does not reallocate for its first items.
const FRESH_LIST_ROOM: usize = 8;

/// A compiled `process` body; see the module docs.
#[derive(Debug)]
pub struct NativeProgram {
    body: Block,
    /// Local slots, the parameters first.
    slots: usize,
    params: usize,
    /// Whether the body writes to a parameter (then it runs on copies of the arguments).
    writes_params: bool,
    /// The state names the body uses, by index.
    states: Vec<ImmutableString>,
    comparators: Vec<Comparator>,
    limits: Limits,
    sizes: SizeLimits,
    max_ops: u64,
}

/// `|a, b| expr` given to `sort`: its own slots, `a` and `b` first.
#[derive(Debug)]
struct Comparator {
    body: Ex,
    /// The operations of one call: [`OPS_PER_CALL`] and its body's.
    ops: u64,
    slots: usize,
    /// `a op b` (`false`) or `b op a` (`true`) with a binary operator: evaluated on the two
    /// items directly, without the tree walk and its copies (the same answers and operation
    /// count).
    direct: Option<(Op, bool)>,
}

/// A statement block and the operations a run charges on entering it: [`OPS_PER_NODE`] for
/// each statement and expression node of its own (each call [`OPS_PER_CALL`] more), all of
/// them whichever branch or short cut a run takes; the blocks nested in it charge when they
/// run, a loop's per turn.
#[derive(Debug, Default)]
struct Block {
    stmts: Vec<St>,
    ops: u64,
}

impl Block {
    fn new(stmts: Vec<St>) -> Self {
        let ops = stmts.iter().map(st_ops).sum();
        Self { stmts, ops }
    }
}

/// A statement's own operations (see [`Block`]).
fn st_ops(st: &St) -> u64 {
    OPS_PER_NODE
        + match st {
            St::Let(_, e)
            | St::Assign(_, _, e)
            | St::SetProp(_, _, e)
            | St::If(e, ..)
            | St::ForIn(_, e, _)
            | St::Extend(_, e, _)
            | St::Expr(e)
            | St::Return(Some(e)) => ex_ops(e),
            St::SetIndex(_, i, e) | St::ForRange(_, i, e, ..) => ex_ops(i) + ex_ops(e),
            // And the `if` it stands for, its branch's operations included.
            St::LetOr(_, e, _, ops) => ex_ops(e) + ops,
            St::While(..) | St::Break | St::Continue | St::Return(None) => 0,
        }
}

/// An expression's operations (see [`Block`]).
fn ex_ops(e: &Ex) -> u64 {
    let all = |items: &[Ex]| items.iter().map(ex_ops).sum::<u64>();
    OPS_PER_NODE
        + match e {
            Ex::Const(_) | Ex::Local(_) | Ex::Take(_) | Ex::Path(..) | Ex::Block(_) => 0,
            Ex::PropOf(a, _) | Ex::Not(a) | Ex::Neg(a) | Ex::Len(a) => ex_ops(a),
            Ex::Index(a, b) | Ex::Binary(_, a, b) => ex_ops(a) + ex_ops(b),
            Ex::And(items) | Ex::Or(items) | Ex::Interp(items) | Ex::Array(items) => all(items),
            Ex::Map(_, items) => items.iter().map(|(_, e)| ex_ops(e)).sum(),
            Ex::Host(_, args) => OPS_PER_CALL + all(args),
            Ex::Push(_, item) => OPS_PER_CALL + ex_ops(item),
            Ex::Pop(_) | Ex::Sort(..) => OPS_PER_CALL,
        }
}

#[derive(Debug)]
enum St {
    Let(usize, Ex),
    /// `let x = e; if x == () { x = c; }` (see [`defaults`]): `e`'s value, or the constant
    /// when it is `()`; the `u64` is the operations of the `if` and its branch.
    LetOr(usize, Ex, Dynamic, u64),
    Assign(usize, Option<Op>, Ex),
    SetIndex(usize, Ex, Ex),
    SetProp(usize, ImmutableString, Ex),
    If(Ex, Block, Block),
    ForIn(usize, Ex, Block),
    /// `for x in items { list_push("s", x); }` (see [`fuse`]): state `s` extended by the
    /// items at once, charging a turn's operations (the `u64`) per item as the loop would.
    Extend(usize, Ex, u64),
    ForRange(usize, Ex, Ex, bool, Block),
    /// The condition, the body and the operations of one turn's condition.
    While(Ex, Block, u64),
    Expr(Ex),
    Break,
    Continue,
    Return(Option<Ex>),
}

#[derive(Debug)]
enum Ex {
    Const(Dynamic),
    Local(usize),
    /// The last read of a local (not a parameter) that is not read again before its next
    /// assignment: its value is moved out instead of copied (see [`moves`]).
    Take(usize),
    /// `local.a.b`.
    Path(usize, Vec<ImmutableString>),
    /// `(expr).a.b`.
    PropOf(Box<Ex>, Vec<ImmutableString>),
    Index(Box<Ex>, Box<Ex>),
    Binary(Op, Box<Ex>, Box<Ex>),
    Not(Box<Ex>),
    Neg(Box<Ex>),
    And(Vec<Ex>),
    Or(Vec<Ex>),
    /// A statement block's value (an `if` expression is one).
    Block(Block),
    Interp(Vec<Ex>),
    Array(Vec<Ex>),
    Map(Box<Map>, Vec<(rhai::Identifier, Ex)>),
    Host(Host, Vec<Ex>),
    Push(usize, Box<Ex>),
    Pop(usize),
    /// `local.sort()` or, with a comparator index, `local.sort(|a, b| ...)`.
    Sort(usize, Option<usize>),
    Len(Box<Ex>),
}

/// A host function; the `usize` is the index of the state name in [`NativeProgram::states`].
#[derive(Debug, Clone, Copy)]
enum Host {
    StateGet(usize),
    StateSet(usize),
    StateClear(usize),
    StateAdd(usize),
    ListGet(usize),
    ListPush(usize),
    ListLen(usize),
    ListSet(usize),
    ListTop(usize),
    MapGet(usize),
    MapPut(usize),
    MapAdd(usize),
    MapRemove(usize),
    MapLen(usize),
    Emit,
    Key,
}

/// Names of the functions and methods a native body may call: a script that defines a
/// function of one of these names is not compiled (its own would be called).
const CALLED: &[&str] = &[
    "state_get",
    "state_set",
    "state_clear",
    "state_add",
    "list_get",
    "list_push",
    "list_len",
    "list_set",
    "list_top",
    "map_get",
    "map_put",
    "map_add",
    "map_remove",
    "map_len",
    "emit",
    "key",
    "push",
    "pop",
    "len",
    "sort",
    "to_string",
];

struct Compiler<'a> {
    /// Visible locals, innermost last.
    scope: Vec<(ImmutableString, usize)>,
    slots: usize,
    params: usize,
    writes_params: bool,
    states: Vec<ImmutableString>,
    comparators: Vec<Comparator>,
    program: &'a AST,
}

impl NativeProgram {
    /// Compiles `program` (a function body cut out as a top-level program, see
    /// `script::runtime`) whose free variables are `params`; `functions` are the names of the
    /// script's own functions. `None` when the body uses anything not covered.
    pub fn compile(
        engine: &Engine,
        program: &AST,
        params: &[String],
        functions: &[String],
    ) -> Option<Self> {
        if functions.iter().any(|f| CALLED.contains(&f.as_str())) {
            return None;
        }
        // A comparator is a call one level down; leave tight call limits to Rhai.
        if engine.max_call_levels() < 4 {
            return None;
        }
        let mut c = Compiler {
            scope: params
                .iter()
                .enumerate()
                .map(|(i, p)| (ImmutableString::from(p.as_str()), i))
                .collect(),
            slots: params.len(),
            params: params.len(),
            writes_params: false,
            states: Vec::new(),
            comparators: Vec::new(),
            program,
        };
        let mut body = c.block(program.statements())?;
        moves(&mut body.stmts, &[]);
        fuse(&mut body.stmts);
        Some(Self {
            body,
            slots: c.slots,
            params: params.len(),
            writes_params: c.writes_params,
            states: c.states,
            comparators: c.comparators,
            limits: Limits {
                string: engine.max_string_size(),
                map: engine.max_map_size(),
                array: engine.max_array_size(),
            },
            sizes: SizeLimits::of(engine),
            max_ops: engine.max_operations(),
        })
    }

    /// Runs the body on `args` against the current frame's state (see
    /// [`with_state_access`]) and applies its effects; `None`: it gave up before any effect
    /// (the arguments are as they were), and the record is Rhai's.
    ///
    /// # Errors
    /// `Some(Err)` only when the state backend fails while the completed run's writes are
    /// applied.
    pub fn run(&self, args: &mut [Dynamic], scratch: &mut Scratch) -> Option<Result<(), String>> {
        if args.len() != self.params {
            return None;
        }
        with_state_access(|access| self.run_on(args, scratch, access))
    }

    fn run_on(
        &self,
        args: &mut [Dynamic],
        scratch: &mut Scratch,
        access: StateAccess<'_>,
    ) -> Option<Result<(), String>> {
        scratch.reset(self, access.frame);
        scratch.known_sizes.check(&*access.state, self.states.len());
        let Scratch {
            locals,
            bufs,
            ids,
            emits,
            cmp_locals,
            text,
            known_sizes,
            ..
        } = scratch;
        for (slot, arg) in locals.iter_mut().zip(args.iter_mut()) {
            *slot = if self.writes_params {
                arg.clone()
            } else {
                std::mem::take(arg)
            };
        }
        let mut run = Run {
            program: self,
            state: &*access.state,
            key: access.key,
            names: access.names,
            ids,
            bufs,
            stored: Stored::new(self.states.len()),
            known_sizes,
            emits,
            emitted_before: access.emitted.len(),
            max_outputs: access.max_outputs,
            cmp_locals,
            text,
            entry_read: None,
            ops: 0,
            budget: if self.max_ops == 0 {
                u64::MAX
            } else {
                self.max_ops
            },
        };
        let outcome = run.block(&self.body, locals);
        let ops = run.ops;
        drop(run);
        if !self.writes_params {
            for (slot, arg) in locals.iter_mut().zip(args.iter_mut()) {
                *arg = std::mem::take(slot);
            }
        }
        outcome?;
        if self.max_ops != 0 && ops >= self.max_ops {
            return None;
        }
        Some(scratch.commit(access))
    }
}

/// What a run keeps from record to record: locals, the buffered effects and the resolved
/// state handles.
#[derive(Default)]
pub struct Scratch {
    /// Runs that completed natively (for tests).
    pub completed: u64,
    locals: Vec<Dynamic>,
    cmp_locals: Vec<Dynamic>,
    bufs: Vec<StateBuf>,
    /// The handle of each state of the program, once resolved in frame `frame`.
    ids: Vec<Option<StateId>>,
    frame: u64,
    emits: Vec<Dynamic>,
    /// Room for string interpolation.
    text: String,
    /// What a commit changed, to undo it when the backend fails part way.
    undo: Vec<Undo>,
    /// The sizes of stored maps and lists, so that a record writing one does not measure it
    /// whole.
    known_sizes: SizesMemo,
}

/// The [`DataSizes`] of map and list states' stored values as the last native commits left
/// them, by state index and key, so that `map_put`, `map_add` and `list_push` on a large map
/// or list cost what they change, not a walk over every entry or item. Valid only while
/// nothing else has written the backend since (see [`SizesMemo::check`]).
#[derive(Default)]
struct SizesMemo {
    /// The sizes and the number of entries (or items) of each map (or list).
    by_state: Vec<HashMap<Key, (DataSizes, usize), KeyBuildHasher>>,
    /// The backend (its address) and its [`StateBackend::generation`] after the last commit
    /// that left the memo valid; `None`: nothing known.
    stamp: Option<(usize, u64)>,
}

/// Most keys the memo holds per state; beyond, it starts over.
const SIZES_MEMO_KEYS: usize = 1 << 16;
/// Maps and lists of fewer entries are measured whole (cheaper than remembering their sizes).
const SIZES_MEMO_FROM: usize = 32;

impl SizesMemo {
    /// The stamp of `state` now; `None` when it does not track its generation.
    fn stamp_of(state: &dyn StateBackend) -> Option<(usize, u64)> {
        let address = std::ptr::from_ref(state).cast::<()>() as usize;
        state.generation().map(|g| (address, g))
    }

    /// Forgets everything unless `state` is the backend, unwritten, the memo was stamped with.
    fn check(&mut self, state: &dyn StateBackend, states: usize) {
        if self.stamp.is_none() || self.stamp != Self::stamp_of(state) {
            self.clear();
        }
        if self.by_state.len() != states {
            self.by_state.clear();
            self.by_state.resize_with(states, HashMap::default);
        }
    }

    fn clear(&mut self) {
        self.stamp = None;
        for m in &mut self.by_state {
            m.clear();
        }
    }

    fn get(&self, index: usize, key: &Key) -> Option<(DataSizes, usize)> {
        let m = self.by_state.get(index)?;
        if m.is_empty() {
            return None;
        }
        m.get(key).copied()
    }

    /// Records what a commit left in state `index` for `key`: a map's sizes and entry count,
    /// or nothing known (`None`).
    fn set(&mut self, index: usize, key: &Key, known: Option<(DataSizes, usize)>) {
        let Some(m) = self.by_state.get_mut(index) else {
            return;
        };
        match known {
            Some(v) if v.1 >= SIZES_MEMO_FROM => {
                if m.len() >= SIZES_MEMO_KEYS {
                    m.clear();
                }
                m.insert(key.clone(), v);
            }
            _ => {
                if !m.is_empty() {
                    m.remove(key);
                }
            }
        }
    }
}

/// One write of a commit, as undoing it needs it.
enum Undo {
    /// A state's whole value was replaced: the value before.
    Whole(StateId, Option<Dynamic>),
    /// A map entry was set: the entry before.
    Entry(StateId, ImmutableString, Option<Dynamic>),
    /// Items were appended to a list of this length.
    Appended(StateId, usize),
}

/// One state's buffered writes of the current record.
#[derive(Default)]
struct StateBuf {
    mode: Mode,
    /// The value as the record's writes left it ([`Mode::Whole`]).
    whole: Option<Dynamic>,
    /// [`array_sizes`] of `whole` when it is a list, `(0, 0, 0)` when absent; `None` when
    /// not known (kept by `list_push`, so that a list rebuilt item by item is not measured
    /// again at each item). In [`Mode::Append`], of the stored list with `appended`.
    list_sizes: Option<DataSizes>,
    /// Items pushed onto a list held by the backend ([`Mode::Append`]).
    appended: Vec<Dynamic>,
    /// Entries set in a map held by the backend ([`Mode::Fields`]), and the map's sizes after
    /// them.
    fields: Vec<(ImmutableString, Dynamic)>,
    sizes: DataSizes,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Not written: reads go to the backend.
    #[default]
    Base,
    Whole,
    Fields,
    /// Items pushed onto the stored list: appended at commit, without copying the list.
    Append,
}

impl Scratch {
    fn reset(&mut self, program: &NativeProgram, frame: u64) {
        // A local is always assigned before it is read (its `let`, its loop or the
        // arguments), so the last record's values may stay until then.
        if self.locals.len() != program.slots {
            self.locals.clear();
            self.locals.resize(program.slots, Dynamic::UNIT);
        }
        self.bufs.resize_with(program.states.len(), StateBuf::default);
        for buf in &mut self.bufs {
            buf.mode = Mode::Base;
            buf.whole = None;
            buf.list_sizes = None;
            buf.fields.clear();
            buf.appended.clear();
        }
        // The frame's declared states are the same from record to record.
        if self.frame != frame || self.ids.len() != program.states.len() {
            self.ids.clear();
            self.ids.resize(program.states.len(), None);
            self.frame = frame;
        }
        self.emits.clear();
    }

    /// Applies the buffered writes and emitted records of a completed run. When the backend
    /// fails on a write, the writes already applied are undone, so that the failed record
    /// leaves no effect (unless the backend fails on the undoing too).
    fn commit(&mut self, access: StateAccess<'_>) -> Result<(), String> {
        let StateAccess {
            state, key, emitted, ..
        } = access;
        let undo = &mut self.undo;
        undo.clear();
        let mut failed = None;
        for (index, (buf, id)) in self.bufs.iter_mut().zip(&self.ids).enumerate() {
            let Some(id) = *id else { continue };
            let result = match buf.mode {
                Mode::Base => continue,
                Mode::Whole => {
                    let mut whole = buf.whole.take();
                    self.known_sizes.set(index, key, None);
                    state.update(id, key, &mut |slot| {
                        let old = std::mem::replace(slot, whole.take());
                        undo.push(Undo::Whole(id, old));
                    })
                }
                Mode::Fields => {
                    let fields = &mut buf.fields;
                    let mut len = None;
                    let result = state.update(id, key, &mut |slot| {
                        if let Some(mut map) = slot.as_mut().and_then(|d| d.as_map_mut().ok()) {
                            for (k, v) in fields.drain(..) {
                                let old = put_entry(&mut map, &k, v);
                                undo.push(Undo::Entry(id, k, old));
                            }
                            len = Some(map.len());
                        }
                    });
                    self.known_sizes.set(index, key, len.map(|len| (buf.sizes, len)));
                    result
                }
                Mode::Append => {
                    let appended = &mut buf.appended;
                    let mut len = None;
                    let result = state.update(id, key, &mut |slot| {
                        if let Some(mut list) = slot.as_mut().and_then(|d| d.as_array_mut().ok()) {
                            undo.push(Undo::Appended(id, list.len()));
                            list.extend(appended.drain(..));
                            len = Some(list.len());
                        }
                    });
                    // The list was read in this record, and nothing else writes the backend
                    // before the commit: it is still a list.
                    let known = buf.list_sizes.zip(len);
                    self.known_sizes.set(index, key, known);
                    match (result, len) {
                        (Ok(()), None) => Err(crate::base::error::RunError::State(
                            "a list state changed while a record was applied to it".into(),
                        )),
                        (result, _) => result,
                    }
                }
            };
            if let Err(e) = result {
                failed = Some(e.to_string());
                break;
            }
        }
        let Some(e) = failed else {
            undo.clear();
            emitted.append(&mut self.emits);
            self.completed += 1;
            // Every write since the stamp was this commit's, and the memo follows them.
            self.known_sizes.stamp = SizesMemo::stamp_of(&*state);
            return Ok(());
        };
        self.known_sizes.clear();
        while let Some(step) = undo.pop() {
            let id = match &step {
                Undo::Whole(id, _) | Undo::Entry(id, ..) | Undo::Appended(id, _) => *id,
            };
            let mut step = Some(step);
            let undone = state.update(id, key, &mut |slot| match step.take() {
                Some(Undo::Whole(_, old)) => *slot = old,
                Some(Undo::Entry(_, field, old)) => {
                    if let Some(mut map) = slot.as_mut().and_then(|d| d.as_map_mut().ok()) {
                        match old {
                            Some(v) => put_entry(&mut map, &field, v),
                            None => map.remove(field.as_str()),
                        };
                    }
                }
                Some(Undo::Appended(_, len)) => {
                    if let Some(mut list) = slot.as_mut().and_then(|d| d.as_array_mut().ok()) {
                        list.truncate(len);
                    }
                }
                None => {}
            });
            if let Err(again) = undone {
                return Err(format!("{e}; undoing the record's earlier state writes failed too: {again}"));
            }
        }
        Err(e)
    }
}

/// What a run knows of a state's stored value (as it was before the record).
enum Base<'a> {
    /// Not asked yet.
    Unread,
    /// Lent by the backend (see [`StateBackend::lend`]), or taken into [`StateBuf::whole`].
    Lent(Option<Cow<'a, Dynamic>>),
    /// The backend does not lend: each read asks it.
    Ask,
}

/// The [`Base`] of each state of a run: eight in place (no allocation per record for most
/// programs), the others in a vector.
struct Stored<'a> {
    near: [Base<'a>; 8],
    far: Vec<Base<'a>>,
}

impl<'a> Stored<'a> {
    fn new(states: usize) -> Self {
        let mut far = Vec::new();
        far.resize_with(states.saturating_sub(8), || Base::Unread);
        Self {
            near: std::array::from_fn(|_| Base::Unread),
            far,
        }
    }

    fn get(&mut self, index: usize) -> &mut Base<'a> {
        match index.checked_sub(8) {
            None => &mut self.near[index],
            Some(i) => &mut self.far[i],
        }
    }
}

/// One native run over one record.
struct Run<'a> {
    program: &'a NativeProgram,
    state: &'a dyn StateBackend,
    key: &'a crate::record::Key,
    names: &'a [(String, StateId)],
    ids: &'a mut Vec<Option<StateId>>,
    bufs: &'a mut Vec<StateBuf>,
    stored: Stored<'a>,
    known_sizes: &'a SizesMemo,
    emits: &'a mut Vec<Dynamic>,
    emitted_before: usize,
    max_outputs: usize,
    cmp_locals: &'a mut Vec<Dynamic>,
    text: &'a mut String,
    /// The last entry read from a stored map (state index, field, value): a map entry read,
    /// then written, is looked up once (stored values do not change during a run).
    entry_read: Option<(usize, ImmutableString, Option<Dynamic>)>,
    ops: u64,
    /// `limits.max_operations`, `u64::MAX` for none.
    budget: u64,
}

/// The value of a missing argument.
static UNIT: Dynamic = Dynamic::UNIT;

/// An argument of a host function: read in place, or evaluated.
enum Arg<'v> {
    Ref(&'v Dynamic),
    Own(Dynamic),
}

impl<'v> Arg<'v> {
    /// The argument `e`: `owned` when it was evaluated, else read in place (a constant or a
    /// local); unit when there is none.
    fn of(owned: Option<Dynamic>, e: Option<&'v Ex>, locals: &'v [Dynamic]) -> Self {
        match (owned, e) {
            (Some(v), _) => Self::Own(v),
            (None, Some(Ex::Const(c))) => Self::Ref(c),
            (None, Some(Ex::Local(slot))) => Self::Ref(&locals[*slot]),
            _ => Self::Ref(&UNIT),
        }
    }

    fn into_owned(self) -> Dynamic {
        match self {
            Self::Ref(v) => v.clone(),
            Self::Own(v) => v,
        }
    }

    fn into_string(self) -> Option<ImmutableString> {
        match self {
            Self::Ref(v) => v.as_immutable_string_ref().ok().map(|s| s.clone()),
            Self::Own(v) => v.into_immutable_string().ok(),
        }
    }
}

impl std::ops::Deref for Arg<'_> {
    type Target = Dynamic;

    fn deref(&self) -> &Dynamic {
        match self {
            Self::Ref(v) => v,
            Self::Own(v) => v,
        }
    }
}

/// How a statement ended.
enum Flow {
    Next,
    Break,
    Continue,
    Return,
}

impl Run<'_> {
    /// Charges `n` operations; `None` once the budget could be reached.
    fn charge(&mut self, n: u64) -> Option<()> {
        self.ops += n;
        (self.ops < self.budget).then_some(())
    }

    /// Whether a value stays strictly under every size limit (at a limit, Rhai decides).
    fn fits(&self, v: &Dynamic) -> bool {
        if v.is_int() || v.is_bool() || v.is_unit() {
            return true;
        }
        let (arrays, maps, strings) = data_sizes(v);
        let l = self.program.limits;
        let under = |n: usize, max: usize| max == 0 || n < max;
        under(arrays, l.array) && under(maps, l.map) && under(strings, l.string)
    }

    /// `Some` when `v` [`fits`](Self::fits). It takes the value by reference, for callers to
    /// go on with their own: a `Dynamic` passed through an `Option` and taken out again is
    /// copied as its tag byte and fifteen more (two overlapping words), and reading such a
    /// copy soon after waits for the stores to drain.
    fn checked(&self, v: &Dynamic) -> Option<()> {
        self.fits(v).then_some(())
    }

    /// The value of condition `e`, which must be a bool.
    fn truth(&mut self, e: &Ex, locals: &mut [Dynamic]) -> Option<bool> {
        let v = self.ex(e, locals)?;
        let truth = v.as_bool().ok();
        release(v);
        truth
    }

    fn block(&mut self, block: &Block, locals: &mut [Dynamic]) -> Option<Flow> {
        self.charge(block.ops)?;
        for st in &block.stmts {
            match self.stmt(st, locals)? {
                Flow::Next => {}
                flow => return Some(flow),
            }
        }
        Some(Flow::Next)
    }

    /// A block's value: its last statement's (an expression's value, `()` otherwise).
    fn block_value(&mut self, block: &Block, locals: &mut [Dynamic]) -> Option<Dynamic> {
        self.charge(block.ops)?;
        let Some((last, init)) = block.stmts.split_last() else {
            return Some(Dynamic::UNIT);
        };
        for st in init {
            match self.stmt(st, locals)? {
                Flow::Next => {}
                // Control flow out of an expression: Rhai's.
                _ => return None,
            }
        }
        match last {
            St::Expr(e) => self.ex(e, locals),
            St::If(c, a, b) => {
                if self.truth(c, locals)? {
                    self.block_value(a, locals)
                } else {
                    self.block_value(b, locals)
                }
            }
            st => match self.stmt(st, locals)? {
                Flow::Next => Some(Dynamic::UNIT),
                _ => None,
            },
        }
    }

    fn stmt(&mut self, st: &St, locals: &mut [Dynamic]) -> Option<Flow> {
        match st {
            St::Let(slot, e) | St::Assign(slot, None, e) => {
                let v = self.ex(e, locals)?;
                set(&mut locals[*slot], v);
                Some(Flow::Next)
            }
            St::Expr(e) => {
                release(self.ex(e, locals)?);
                Some(Flow::Next)
            }
            St::If(c, a, b) => {
                let branch = if self.truth(c, locals)? { a } else { b };
                self.block(branch, locals)
            }
            St::LetOr(slot, e, default, _) => {
                let v = self.ex(e, locals)?;
                let v = if v.is_unit() { default.clone() } else { v };
                set(&mut locals[*slot], v);
                Some(Flow::Next)
            }
            st => self.stmt_other(st, locals),
        }
    }

    /// [`stmt`](Self::stmt) of the other statements, apart so that the frequent ones above
    /// stay short.
    #[inline(never)]
    fn stmt_other(&mut self, st: &St, locals: &mut [Dynamic]) -> Option<Flow> {
        match st {
            St::Let(slot, e) | St::Assign(slot, None, e) => {
                let v = self.ex(e, locals)?;
                set(&mut locals[*slot], v);
            }
            St::LetOr(slot, e, default, _) => {
                let v = self.ex(e, locals)?;
                let v = if v.is_unit() { default.clone() } else { v };
                set(&mut locals[*slot], v);
            }
            St::Assign(slot, Some(op), e) => {
                let v = self.ex(e, locals)?;
                let old = &locals[*slot];
                let new = match (old.as_int(), v.as_int()) {
                    (Ok(x), Ok(y)) => int_binary(*op, x, y),
                    _ => binary(*op, old, &v, self.program.limits),
                };
                release(v);
                set(&mut locals[*slot], new?);
            }
            St::SetIndex(slot, index, e) => {
                let index = self.ex(index, locals)?;
                let v = self.ex(e, locals)?;
                let target = &mut locals[*slot];
                if let Ok(i) = index.as_int() {
                    let mut array = target.as_array_mut().ok()?;
                    let i = usize::try_from(i).ok().filter(|i| *i < array.len())?;
                    array[i] = v;
                } else {
                    let key = index.as_immutable_string_ref().ok()?;
                    let mut map = target.as_map_mut().ok()?;
                    map.insert(key.as_str().into(), v);
                }
                if !self.fits(&locals[*slot]) {
                    return None;
                }
            }
            St::SetProp(slot, prop, e) => {
                let v = self.ex(e, locals)?;
                locals[*slot]
                    .as_map_mut()
                    .ok()?
                    .insert(prop.as_str().into(), v);
                if !self.fits(&locals[*slot]) {
                    return None;
                }
            }
            St::If(c, a, b) => {
                let branch = if self.truth(c, locals)? {
                    a
                } else {
                    b
                };
                return self.block(branch, locals);
            }
            St::ForIn(var, e, body) => {
                let items = self.ex(e, locals)?.into_array().ok()?;
                for item in items {
                    self.charge(OPS_PER_NODE)?;
                    set(&mut locals[*var], item);
                    match self.block(body, locals)? {
                        Flow::Next | Flow::Continue => {}
                        Flow::Break => break,
                        Flow::Return => return Some(Flow::Return),
                    }
                }
            }
            St::Extend(s, e, turn) => {
                let items = self.ex(e, locals)?;
                self.extend(*s, items, *turn)?;
            }
            St::ForRange(var, from, to, inclusive, body) => {
                let from = self.ex(from, locals)?.as_int().ok()?;
                let to = self.ex(to, locals)?.as_int().ok()?;
                let end = if *inclusive { to.checked_add(1)? } else { to };
                for i in from..end {
                    self.charge(OPS_PER_NODE)?;
                    set(&mut locals[*var], Dynamic::from_int(i));
                    match self.block(body, locals)? {
                        Flow::Next | Flow::Continue => {}
                        Flow::Break => break,
                        Flow::Return => return Some(Flow::Return),
                    }
                }
            }
            St::While(c, body, turn) => loop {
                self.charge(*turn)?;
                if !self.truth(c, locals)? {
                    break;
                }
                match self.block(body, locals)? {
                    Flow::Next | Flow::Continue => {}
                    Flow::Break => break,
                    Flow::Return => return Some(Flow::Return),
                }
            },
            St::Expr(e) => release(self.ex(e, locals)?),
            St::Break => return Some(Flow::Break),
            St::Continue => return Some(Flow::Continue),
            St::Return(e) => {
                if let Some(e) = e {
                    release(self.ex(e, locals)?);
                }
                return Some(Flow::Return);
            }
        }
        Some(Flow::Next)
    }

    fn ex(&mut self, e: &Ex, locals: &mut [Dynamic]) -> Option<Dynamic> {
        match e {
            Ex::Const(c) => Some(dup(c)),
            Ex::Local(slot) => Some(dup(&locals[*slot])),
            Ex::Take(slot) => Some(std::mem::take(&mut locals[*slot])),
            Ex::Binary(op, a, b) => self.binary(*op, a, b, locals),
            Ex::Host(host, args) => self.host(*host, args, locals),
            e => self.ex_other(e, locals),
        }
    }

    /// [`ex`](Self::ex) of the other nodes, apart so that the frequent ones above stay short
    /// (already charged).
    #[inline(never)]
    fn ex_other(&mut self, e: &Ex, locals: &mut [Dynamic]) -> Option<Dynamic> {
        Some(match e {
            Ex::Const(c) => c.clone(),
            Ex::Local(slot) => locals[*slot].clone(),
            Ex::Take(slot) => std::mem::take(&mut locals[*slot]),
            Ex::Binary(op, a, b) => self.binary(*op, a, b, locals)?,
            Ex::Host(host, args) => self.host(*host, args, locals)?,
            Ex::Path(slot, path) => with_path(&locals[*slot], path, |v| Some(dup(v)))?,
            Ex::PropOf(target, path) => {
                let target = self.ex(target, locals)?;
                with_path(&target, path, |v| Some(v.clone()))?
            }
            Ex::Index(target, index) => {
                let index = self.ex(index, locals)?;
                match &**target {
                    Ex::Local(slot) => read_index(&locals[*slot], &index)?,
                    target => read_index(&self.ex(target, locals)?, &index)?,
                }
            }
            Ex::Not(a) => Dynamic::from_bool(!self.truth(a, locals)?),
            Ex::Neg(a) => Dynamic::from_int(self.ex(a, locals)?.as_int().ok()?.checked_neg()?),
            Ex::And(items) => {
                for item in items {
                    if !self.truth(item, locals)? {
                        return Some(Dynamic::FALSE);
                    }
                }
                Dynamic::TRUE
            }
            Ex::Or(items) => {
                for item in items {
                    if self.truth(item, locals)? {
                        return Some(Dynamic::TRUE);
                    }
                }
                Dynamic::FALSE
            }
            Ex::Block(stmts) => self.block_value(stmts, locals)?,
            Ex::Interp(parts) => {
                let limits = self.program.limits;
                let mut text = std::mem::take(self.text);
                text.clear();
                let mut whole = Some(());
                for part in parts {
                    let pushed = if is_place(part) {
                        with_place(part, locals, |v| push_text(&mut text, v))
                    } else {
                        self.ex(part, locals).and_then(|v| {
                            let pushed = push_text(&mut text, &v);
                            release(v);
                            pushed
                        })
                    };
                    if pushed.is_none() {
                        whole = None;
                        break;
                    }
                    if limits.string != 0 && text.len() >= limits.string {
                        whole = None;
                        break;
                    }
                }
                let value = whole.map(|()| Dynamic::from(ImmutableString::from(text.as_str())));
                *self.text = text;
                value?
            }
            Ex::Array(items) => {
                let mut array = Array::with_capacity(items.len());
                for item in items {
                    array.push(self.ex(item, locals)?);
                }
                let array = Dynamic::from_array(array);
                self.checked(&array)?;
                array
            }
            Ex::Map(template, items) => {
                let mut map = (**template).clone();
                for (name, item) in items {
                    let v = self.ex(item, locals)?;
                    map.insert(name.clone(), v);
                }
                let map = Dynamic::from_map(map);
                self.checked(&map)?;
                map
            }
            Ex::Push(slot, item) => {
                let item = self.ex(item, locals)?;
                locals[*slot].as_array_mut().ok()?.push(item);
                if !self.fits(&locals[*slot]) {
                    return None;
                }
                Dynamic::UNIT
            }
            Ex::Pop(slot) => {
                let popped = locals[*slot].as_array_mut().ok()?.pop();
                popped.unwrap_or(Dynamic::UNIT)
            }
            Ex::Sort(slot, comparator) => {
                let mut array = std::mem::take(&mut locals[*slot]).into_array().ok();
                let sorted = match (&mut array, comparator) {
                    (Some(array), None) => sort_plain(array),
                    (Some(array), Some(c)) => {
                        let program = self.program;
                        self.sort_by(array, &program.comparators[*c])
                    }
                    (None, _) => None,
                };
                // Put the value back even when giving up (the slot may be a parameter).
                locals[*slot] = array.map_or(Dynamic::UNIT, Dynamic::from_array);
                sorted?;
                Dynamic::UNIT
            }
            Ex::Len(target) => {
                let len = match &**target {
                    Ex::Local(slot) => length(&locals[*slot])?,
                    target => length(&self.ex(target, locals)?)?,
                };
                Dynamic::from_int(i64::try_from(len).ok()?)
            }
        })
    }

    /// `a op b`, its operands read in place when they are places ([`is_place`]): the
    /// operator only reads them, so Rhai's copies of them are not observable.
    fn binary(&mut self, op: Op, a: &Ex, b: &Ex, locals: &mut [Dynamic]) -> Option<Dynamic> {
        let limits = self.program.limits;
        if !is_place(b) {
            let x = self.ex(a, locals)?;
            let y = self.ex(b, locals)?;
            let v = operate(op, &x, &y, limits);
            release(x);
            release(y);
            return v;
        }
        if is_place(a) {
            return with_place(a, locals, |x| with_place(b, locals, |y| operate(op, x, y, limits)));
        }
        // `a` first: it may change a local `b` reads.
        let x = self.ex(a, locals)?;
        let v = with_place(b, locals, |y| operate(op, &x, y, limits));
        release(x);
        v
    }

    /// `array.sort(|a, b| ...)` as Rhai's `sort`: the same `slice::sort_by` with the same
    /// answers, an int's sign or a bool (`true`: less); any other answer gives up.
    fn sort_by(&mut self, array: &mut Array, comparator: &Comparator) -> Option<()> {
        if array.len() <= 1 {
            return Some(());
        }
        let mut locals = std::mem::take(self.cmp_locals);
        if comparator.direct.is_none() {
            locals.clear();
            locals.resize(comparator.slots, Dynamic::UNIT);
        }
        let mut failed = false;
        let limits = self.program.limits;
        let sorted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            array.sort_by(|x, y| {
                if failed {
                    return Ordering::Equal;
                }
                let answer = if let Some((op, swap)) = comparator.direct {
                    self.charge(comparator.ops).and_then(|()| {
                        let (a, b) = if swap { (y, x) } else { (x, y) };
                        match (a.as_int(), b.as_int()) {
                            (Ok(a), Ok(b)) => int_answer(op, a, b),
                            _ => answer(operate(op, a, b, limits)?),
                        }
                    })
                } else {
                    set(&mut locals[0], dup(x));
                    set(&mut locals[1], dup(y));
                    self.charge(comparator.ops)
                        .and_then(|()| self.ex(&comparator.body, &mut locals))
                        .and_then(answer)
                };
                match answer {
                    Some(v) => v.cmp(&0),
                    None => {
                        failed = true;
                        Ordering::Equal
                    }
                }
            });
        }));
        *self.cmp_locals = locals;
        (sorted.is_ok() && !failed).then_some(())
    }

    /// The handle of state `index`; `None`: not declared.
    #[inline]
    fn id(&mut self, index: usize) -> Option<StateId> {
        match self.ids[index] {
            Some(id) => Some(id),
            None => self.resolve(index),
        }
    }

    /// [`id`](Self::id) the first time in a frame.
    #[inline(never)]
    fn resolve(&mut self, index: usize) -> Option<StateId> {
        let name = &self.program.states[index];
        let (_, id) = self.names.iter().find(|(n, _)| n.as_str() == name.as_str())?;
        self.ids[index] = Some(*id);
        Some(*id)
    }

    /// Lets `f` read the stored value of state `index` (as it was before the record), asking
    /// the backend once per record when it lends values.
    fn with_stored<T>(&mut self, index: usize, f: impl FnOnce(Option<&Dynamic>) -> T) -> Option<T> {
        let id = self.id(index)?;
        let state = self.state;
        let key = self.key;
        let base = self.stored.get(index);
        if let Base::Unread = base {
            *base = match state.lend(id, key) {
                // Rebuilt from the reference (a move of the whole value splits it; see
                // `checked`).
                Some(Ok(Some(Cow::Borrowed(v)))) => Base::Lent(Some(Cow::Borrowed(v))),
                Some(Ok(v)) => Base::Lent(v),
                Some(Err(_)) => return None,
                None => Base::Ask,
            };
        }
        match base {
            Base::Lent(v) => Some(f(v.as_deref())),
            _ => {
                let mut f = Some(f);
                let mut out = None;
                state
                    .read(id, key, &mut |v| out = f.take().map(|f| f(v)))
                    .ok()?;
                out
            }
        }
    }

    /// Buffer `index` in [`Mode::Whole`]: its value as the record's writes left it.
    fn whole_mut(&mut self, index: usize) -> Option<&mut StateBuf> {
        if self.bufs[index].mode != Mode::Whole {
            let id = self.id(index)?;
            let mut whole = match std::mem::replace(self.stored.get(index), Base::Ask) {
                Base::Lent(v) => v.map(Cow::into_owned),
                _ => self.state.get(id, self.key).ok()?,
            };
            let buf = &mut self.bufs[index];
            if buf.mode == Mode::Fields
                && let Some(mut map) = whole.as_mut().and_then(|d| d.as_map_mut().ok())
            {
                for (k, v) in buf.fields.drain(..) {
                    put_entry(&mut map, &k, v);
                }
            }
            // A list's sizes with its appended items stay known.
            let mut list_sizes = None;
            if buf.mode == Mode::Append {
                let mut list = whole.as_mut()?.as_array_mut().ok()?;
                list.extend(buf.appended.drain(..));
                list_sizes = buf.list_sizes;
            }
            buf.fields.clear();
            buf.appended.clear();
            buf.whole = whole;
            buf.list_sizes = list_sizes;
            buf.mode = Mode::Whole;
        }
        Some(&mut self.bufs[index])
    }

    /// The whole value of state `index` as the record's writes left it, to write it.
    fn whole(&mut self, index: usize) -> Option<&mut Option<Dynamic>> {
        let buf = self.whole_mut(index)?;
        buf.list_sizes = None;
        Some(&mut buf.whole)
    }

    /// Buffer `index`, to replace its value whole (its [`StateBuf::whole`]).
    fn overwrite(&mut self, index: usize) -> Option<&mut StateBuf> {
        self.id(index)?;
        let buf = &mut self.bufs[index];
        buf.fields.clear();
        buf.appended.clear();
        buf.list_sizes = None;
        buf.mode = Mode::Whole;
        Some(buf)
    }

    /// Reads state `index` as the record's writes left it.
    fn read<T>(&mut self, index: usize, f: impl FnOnce(Option<&Dynamic>) -> T) -> Option<T> {
        match self.bufs[index].mode {
            Mode::Base => self.with_stored(index, f),
            Mode::Whole => Some(f(self.bufs[index].whole.as_ref())),
            Mode::Fields | Mode::Append => Some(f(self.whole_mut(index)?.whole.as_ref())),
        }
    }

    /// The entry `field` of map state `index` (`None` inside: absent), as the record's
    /// writes left it.
    fn map_entry(&mut self, index: usize, field: &ImmutableString) -> Option<Option<Dynamic>> {
        let buf = &self.bufs[index];
        match buf.mode {
            Mode::Whole => {
                return Some(
                    buf.whole
                        .as_ref()
                        .and_then(|d| d.as_map_ref().ok()?.get(field.as_str()).cloned()),
                );
            }
            Mode::Fields => {
                if let Some((_, v)) = buf.fields.iter().find(|(k, _)| k == field) {
                    return Some(Some(v.clone()));
                }
            }
            // A list, with items appended: no entry, as Rhai reads it.
            Mode::Append => return Some(None),
            Mode::Base => {}
        }
        if let Some((i, k, v)) = &self.entry_read
            && *i == index
            && (k.ptr_eq(field) || k == field)
        {
            return Some(v.clone());
        }
        let v = self.with_stored(index, |v| {
            v.and_then(|d| d.as_map_ref().ok().and_then(|m| m.get(field.as_str()).map(dup)))
        })?;
        self.entry_read = Some((index, field.clone(), v.clone()));
        Some(v)
    }

    /// Puts buffer `index` in [`Mode::Fields`] when the backend holds a map for it (its
    /// sizes computed once); `Some(false)` when it does not.
    fn fields(&mut self, index: usize) -> Option<bool> {
        match self.bufs[index].mode {
            Mode::Fields => Some(true),
            Mode::Whole | Mode::Append => Some(false),
            Mode::Base => {
                // Known from the memo when its entry count still matches the stored map's.
                let known = self.known_sizes.get(index, self.key);
                let sizes = self.with_stored(index, |v| {
                    let m = v?.as_map_ref().ok()?;
                    Some(match known {
                        Some((sizes, len)) if len == m.len() => sizes,
                        _ => map_sizes(&m),
                    })
                })?;
                let Some(sizes) = sizes else {
                    return Some(false);
                };
                let buf = &mut self.bufs[index];
                buf.sizes = sizes;
                buf.mode = Mode::Fields;
                Some(true)
            }
        }
    }

    /// Puts buffer `index` in [`Mode::Append`] when it is not written yet and the backend
    /// holds a list for it (its sizes known from the memo or measured once); whether it is
    /// in that mode.
    fn appending(&mut self, index: usize) -> Option<bool> {
        match self.bufs[index].mode {
            Mode::Append => Some(true),
            Mode::Whole | Mode::Fields => Some(false),
            Mode::Base => {
                let known = self.known_sizes.get(index, self.key);
                let sizes = self.with_stored(index, |v| {
                    let a = v?.as_array_ref().ok()?;
                    Some(match known {
                        Some((sizes, len)) if len == a.len() => sizes,
                        _ => array_sizes(&a),
                    })
                })?;
                let Some(sizes) = sizes else {
                    return Some(false);
                };
                let buf = &mut self.bufs[index];
                buf.list_sizes = Some(sizes);
                buf.appended.clear();
                buf.mode = Mode::Append;
                Some(true)
            }
        }
    }

    /// [`St::Extend`]: what its loop of `list_push` does, item by item, at once. A list's
    /// sizes only grow with each push, so the items fit exactly when every push would.
    ///
    /// `items` is the loop's array: onto an absent state it becomes the new list as it is
    /// (no copy), unless it carries a tag or is read-only (the pushes would make a plain list).
    fn extend(&mut self, s: usize, items: Dynamic, turn: u64) -> Option<()> {
        let (len, items_sizes) = {
            let a = items.as_array_ref().ok()?;
            (a.len(), array_sizes(&a))
        };
        self.charge(turn.saturating_mul(u64::try_from(len).ok()?))?;
        if len == 0 {
            return Some(());
        }
        let sizes = self.program.sizes;
        if self.appending(s)? {
            let buf = &mut self.bufs[s];
            let grown = add(items_sizes, buf.list_sizes?);
            if sizes.over(grown) {
                return None;
            }
            buf.appended.extend(items.into_array().ok()?);
            buf.list_sizes = Some(grown);
            return Some(());
        }
        let buf = self.whole_mut(s)?;
        let list = match &buf.whole {
            Some(d) if d.is_array() => Some(match buf.list_sizes {
                Some(known) => known,
                None => array_sizes(&d.as_array_ref().ok()?),
            }),
            // Absent or not a list: the first push makes a new list of its item.
            _ => None,
        };
        let grown = add(items_sizes, list.unwrap_or((0, 0, 0)));
        if sizes.over(grown) {
            return None;
        }
        match list {
            Some(_) => buf
                .whole
                .as_mut()?
                .as_array_mut()
                .ok()?
                .extend(items.into_array().ok()?),
            None if items.tag() == 0 && !items.is_read_only() => buf.whole = Some(items),
            None => buf.whole = Some(Dynamic::from_array(items.into_array().ok()?)),
        }
        buf.list_sizes = Some(grown);
        Some(())
    }

    fn host(&mut self, host: Host, args: &[Ex], locals: &mut [Dynamic]) -> Option<Dynamic> {
        // A constant or local argument is read in place, unless an argument after it is
        // evaluated (which could change the local); the others are evaluated in order.
        let in_place = |e: &Ex| matches!(e, Ex::Const(_) | Ex::Local(_));
        let (a, b) = (args.first(), args.get(1));
        let a_own = match a {
            Some(e) if !(in_place(e) && b.is_none_or(in_place)) => Some(self.ex(e, locals)?),
            _ => None,
        };
        let b_own = match b {
            Some(e) if !in_place(e) => Some(self.ex(e, locals)?),
            _ => None,
        };
        let locals: &[Dynamic] = locals;
        let a = Arg::of(a_own, a, locals);
        let b = Arg::of(b_own, b, locals);
        let sizes = self.program.sizes;
        Some(match host {
            Host::StateGet(s) => {
                let mut v = Dynamic::UNIT;
                self.read(s, |stored| {
                    if let Some(stored) = stored {
                        v = dup(stored);
                    }
                })?;
                self.checked(&v)?;
                v
            }
            Host::ListGet(s) => {
                // A copy with room for one more item: a list read is often pushed onto.
                let v = self.read(s, |v| {
                    v.and_then(|d| {
                        let a = d.as_array_ref().ok()?;
                        let mut copy = Array::with_capacity(a.len() + 1);
                        copy.extend(a.iter().map(dup));
                        Some(copy)
                    })
                    .unwrap_or_default()
                })?;
                let v = Dynamic::from_array(v);
                self.checked(&v)?;
                v
            }
            Host::ListLen(s) => {
                let len = self.read(s, |v| {
                    v.and_then(|d| d.as_array_ref().ok().map(|a| a.len()))
                        .unwrap_or(0)
                })?;
                Dynamic::from_int(i64::try_from(len).ok()?)
            }
            Host::MapLen(s) => {
                let len = self.read(s, |v| {
                    v.and_then(|d| d.as_map_ref().ok().map(|m| m.len()))
                        .unwrap_or(0)
                })?;
                Dynamic::from_int(i64::try_from(len).ok()?)
            }
            Host::MapGet(s) => {
                let field = a.as_immutable_string_ref().ok()?;
                let v = self.map_entry(s, &field)?.unwrap_or(Dynamic::UNIT);
                drop(field);
                self.checked(&v)?;
                v
            }
            Host::StateSet(s) => {
                if sizes.over(data_sizes(&a)) {
                    return None;
                }
                self.overwrite(s)?.whole = Some(a.into_owned());
                Dynamic::UNIT
            }
            Host::StateClear(s) => {
                let buf = self.overwrite(s)?;
                buf.whole = None;
                buf.list_sizes = Some((0, 0, 0));
                Dynamic::UNIT
            }
            Host::StateAdd(s) => {
                let sum = add_in_place(self.whole(s)?, &a).ok()?;
                self.checked(&sum)?;
                sum
            }
            Host::ListPush(s) => {
                // `push_onto`, with the list's sizes kept from push to push.
                let a = a.into_owned();
                if self.appending(s)? {
                    let buf = &mut self.bufs[s];
                    let grown = add(element_sizes(&a), buf.list_sizes?);
                    if sizes.over(grown) {
                        return None;
                    }
                    buf.appended.push(a);
                    buf.list_sizes = Some(grown);
                    return Some(Dynamic::UNIT);
                }
                let buf = self.whole_mut(s)?;
                let list = match &buf.whole {
                    Some(d) if d.is_array() => Some(match buf.list_sizes {
                        Some(known) => known,
                        None => array_sizes(&d.as_array_ref().ok()?),
                    }),
                    // Absent or not a list: a new list of the item.
                    _ => None,
                };
                let grown = add(element_sizes(&a), list.unwrap_or((0, 0, 0)));
                if sizes.over(grown) {
                    return None;
                }
                match list {
                    Some(_) => buf.whole.as_mut()?.as_array_mut().ok()?.push(a),
                    None => {
                        let mut items = Array::with_capacity(FRESH_LIST_ROOM);
                        items.push(a);
                        buf.whole = Some(Dynamic::from_array(items));
                    }
                }
                buf.list_sizes = Some(grown);
                Dynamic::UNIT
            }
            Host::ListSet(s) => {
                let items = a.into_owned().into_array().ok()?;
                let known = array_sizes(&items);
                if sizes.over(known) {
                    return None;
                }
                let buf = self.overwrite(s)?;
                buf.whole = (!items.is_empty()).then(|| Dynamic::from_array(items));
                buf.list_sizes = Some(known);
                Dynamic::UNIT
            }
            Host::ListTop(s) => {
                let keep = usize::try_from(b.as_int().ok()?).ok()?;
                Dynamic::from_bool(insert_top(self.whole(s)?, a.into_owned(), keep, sizes).ok()?)
            }
            Host::MapPut(s) => {
                let field = a.into_string()?;
                if self.fields(s)? {
                    let old = self.map_entry(s, &field)?;
                    let buf = &mut self.bufs[s];
                    let mut grown = add(entry_sizes(&b), buf.sizes);
                    if let Some(old) = &old {
                        grown = sub(grown, entry_sizes(old));
                    }
                    if sizes.over(grown) {
                        return None;
                    }
                    buf.sizes = grown;
                    set_field(&mut buf.fields, field, b.into_owned());
                } else if put_into(self.whole(s)?, &field, b.into_owned(), sizes).is_some() {
                    return None;
                }
                Dynamic::UNIT
            }
            Host::MapAdd(s) => {
                let field = a.into_string()?;
                let sum = if self.fields(s)? {
                    let old = self.map_entry(s, &field)?;
                    let sum = add_to(old.as_ref(), &b).ok()?;
                    let buf = &mut self.bufs[s];
                    match &old {
                        None => {
                            let grown = add(entry_sizes(&sum), buf.sizes);
                            if sizes.over(grown) {
                                return None;
                            }
                            buf.sizes = grown;
                        }
                        Some(old) => {
                            buf.sizes = add(sub(buf.sizes, entry_sizes(old)), entry_sizes(&sum));
                        }
                    }
                    set_field(&mut buf.fields, field, sum.clone());
                    sum
                } else {
                    add_into(self.whole(s)?, &field, &b, sizes).ok()?
                };
                self.checked(&sum)?;
                sum
            }
            Host::MapRemove(s) => {
                let field = a.as_immutable_string_ref().ok()?;
                let slot = self.whole(s)?;
                let mut empty = false;
                if let Some(mut map) = slot.as_mut().and_then(|d| d.as_map_mut().ok()) {
                    map.remove(field.as_str());
                    empty = map.is_empty();
                }
                if empty {
                    *slot = None;
                }
                Dynamic::UNIT
            }
            Host::Emit => {
                if self.max_outputs == 0
                    || self.emitted_before + self.emits.len() >= self.max_outputs
                {
                    return None;
                }
                self.emits.push(a.into_owned());
                Dynamic::UNIT
            }
            Host::Key => self.key.to_dynamic(),
        })
    }
}

/// Appends `i` in decimal, as `${i}` writes it.
fn push_int(text: &mut String, i: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = i.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if i < 0 {
        text.push('-');
    }
    for &d in &digits[at..] {
        text.push(char::from(d));
    }
}

/// A comparator's answer as `sort` takes it: an int, or a bool (`true`: less).
fn answer(v: Dynamic) -> Option<i64> {
    let answer = v
        .as_int()
        .ok()
        .or_else(|| v.as_bool().ok().map(|b| if b { -1 } else { 1 }));
    release(v);
    answer
}

/// `x op y` on two ints, as [`binary`] computes it.
#[inline]
fn int_binary(op: Op, x: i64, y: i64) -> Option<Dynamic> {
    Some(match op {
        Op::Add => Dynamic::from_int(x.checked_add(y)?),
        Op::Sub => Dynamic::from_int(x.checked_sub(y)?),
        Op::Mul => Dynamic::from_int(x.checked_mul(y)?),
        Op::Div | Op::Rem if y == 0 => return None,
        Op::Div => Dynamic::from_int(x.checked_div(y)?),
        Op::Rem => Dynamic::from_int(x.checked_rem(y)?),
        Op::Eq => Dynamic::from_bool(x == y),
        Op::Ne => Dynamic::from_bool(x != y),
        Op::Lt => Dynamic::from_bool(x < y),
        Op::Le => Dynamic::from_bool(x <= y),
        Op::Gt => Dynamic::from_bool(x > y),
        Op::Ge => Dynamic::from_bool(x >= y),
    })
}

/// [`answer`] of `x op y` on two ints, as [`binary`] computes it.
fn int_answer(op: Op, x: i64, y: i64) -> Option<i64> {
    let truth = |b: bool| if b { -1 } else { 1 };
    match op {
        Op::Add => x.checked_add(y),
        Op::Sub => x.checked_sub(y),
        Op::Mul => x.checked_mul(y),
        Op::Div | Op::Rem if y == 0 => None,
        Op::Div => x.checked_div(y),
        Op::Rem => x.checked_rem(y),
        Op::Eq => Some(truth(x == y)),
        Op::Ne => Some(truth(x != y)),
        Op::Lt => Some(truth(x < y)),
        Op::Le => Some(truth(x <= y)),
        Op::Gt => Some(truth(x > y)),
        Op::Ge => Some(truth(x >= y)),
    }
}

/// `a op b` as [`Ex::Binary`] evaluates it: `==` and `!=` against `()` compare units, every
/// other case is [`binary`]'s (two ints without a call).
#[inline]
fn operate(op: Op, a: &Dynamic, b: &Dynamic, limits: Limits) -> Option<Dynamic> {
    if let (Ok(x), Ok(y)) = (a.as_int(), b.as_int()) {
        return int_binary(op, x, y);
    }
    match op {
        Op::Eq | Op::Ne if a.is_unit() || b.is_unit() => {
            let same = a.is_unit() && b.is_unit();
            Some(Dynamic::from_bool(if op == Op::Eq { same } else { !same }))
        }
        op => binary(op, a, b, limits),
    }
}

/// Sets `map[field]` and returns the value it replaced; an entry already there keeps its key
/// (no new key string).
fn put_entry(map: &mut Map, field: &str, v: Dynamic) -> Option<Dynamic> {
    match map.get_mut(field) {
        Some(entry) => Some(std::mem::replace(entry, v)),
        None => map.insert(field.into(), v),
    }
}

fn set_field(fields: &mut Vec<(ImmutableString, Dynamic)>, field: ImmutableString, v: Dynamic) {
    match fields.iter_mut().find(|(k, _)| *k == field) {
        Some(entry) => entry.1 = v,
        None => fields.push((field, v)),
    }
}

/// A copy of `v`, as [`Dynamic::clone`] makes it; an untagged int without a call to it.
#[inline(always)]
fn dup(v: &Dynamic) -> Dynamic {
    if v.is_int()
        && v.tag() == 0
        && let Ok(i) = v.as_int()
    {
        return Dynamic::from_int(i);
    }
    v.clone()
}

/// Drops `v`; an int, a bool or unit (no heap data) without a call to its drop glue.
#[inline(always)]
fn release(v: Dynamic) {
    if v.is_int() || v.is_bool() || v.is_unit() {
        std::mem::forget(v);
    }
}

/// Assigns `v` to a local.
#[inline(always)]
fn set(slot: &mut Dynamic, v: Dynamic) {
    release(std::mem::replace(slot, v));
}

/// Whether [`with_place`] reads `e` in place: a constant, a local or a property path of a
/// local.
#[inline(always)]
fn is_place(e: &Ex) -> bool {
    matches!(e, Ex::Const(_) | Ex::Local(_) | Ex::Path(..))
}

/// Calls `f` on the value of `e`, a place ([`is_place`]), without copying it; `None` when a
/// property is missing (or `e` is not a place).
#[inline(always)]
fn with_place<R>(e: &Ex, locals: &[Dynamic], f: impl FnOnce(&Dynamic) -> Option<R>) -> Option<R> {
    match e {
        Ex::Const(c) => f(c),
        Ex::Local(slot) => f(&locals[*slot]),
        Ex::Path(slot, path) => with_path(&locals[*slot], path, f),
        _ => None,
    }
}

/// Calls `f` on `value.a.b` when the maps have those properties.
fn with_path<R>(
    value: &Dynamic,
    path: &[ImmutableString],
    f: impl FnOnce(&Dynamic) -> Option<R>,
) -> Option<R> {
    let (first, rest) = path.split_first()?;
    let map = value.as_map_ref().ok()?;
    let next = map.get(first.as_str())?;
    if rest.is_empty() {
        f(next)
    } else {
        with_path(next, rest, f)
    }
}

/// Appends an int or a string as `${v}` writes it; `None` for any other value.
fn push_text(text: &mut String, v: &Dynamic) -> Option<()> {
    if let Ok(i) = v.as_int() {
        push_int(text, i);
    } else {
        text.push_str(v.as_immutable_string_ref().ok()?.as_str());
    }
    Some(())
}

/// `value[index]`: an array item at `0..len` or a map entry that exists.
fn read_index(value: &Dynamic, index: &Dynamic) -> Option<Dynamic> {
    if let Ok(array) = value.as_array_ref() {
        let i = usize::try_from(index.as_int().ok()?).ok()?;
        return array.get(i).cloned();
    }
    let map = value.as_map_ref().ok()?;
    let key = index.as_immutable_string_ref().ok()?;
    map.get(key.as_str()).cloned()
}

/// `len()` of an array, a map or a string (in characters, as Rhai counts).
fn length(value: &Dynamic) -> Option<usize> {
    if let Ok(array) = value.as_array_ref() {
        return Some(array.len());
    }
    if let Ok(map) = value.as_map_ref() {
        return Some(map.len());
    }
    let s = value.as_immutable_string_ref().ok()?;
    Some(s.chars().count())
}

/// Rhai's `sort()` for arrays of ints, strings or bools (all of one type); anything else
/// gives up.
fn sort_plain(array: &mut Array) -> Option<()> {
    if array.len() <= 1 {
        return Some(());
    }
    if array.iter().all(Dynamic::is_int) {
        array.sort_by_key(|v| v.as_int().unwrap_or_default());
    } else if array.iter().all(Dynamic::is_bool) {
        array.sort_by_key(|v| v.as_bool().unwrap_or_default());
    } else if array.iter().all(Dynamic::is_string) {
        array.sort_by(|a, b| match (a.as_immutable_string_ref(), b.as_immutable_string_ref()) {
            (Ok(a), Ok(b)) => a.as_str().cmp(b.as_str()),
            _ => Ordering::Equal,
        });
    } else {
        return None;
    }
    Some(())
}

impl Compiler<'_> {
    fn lookup(&self, name: &str) -> Option<usize> {
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, slot)| *slot)
    }

    fn new_slot(&mut self) -> usize {
        self.slots += 1;
        self.slots - 1
    }

    /// A statement block in a scope of its own.
    fn block(&mut self, stmts: &[Stmt]) -> Option<Block> {
        let depth = self.scope.len();
        let out = stmts.iter().map(|s| self.stmt(s)).collect::<Option<Vec<_>>>();
        self.scope.truncate(depth);
        out.map(|stmts| Block::new(defaults(stmts)))
    }

    fn stmt_block(&mut self, block: &StmtBlock) -> Option<Block> {
        self.block(block.statements())
    }

    /// The slot of an assigned local; writing a parameter makes runs work on copies.
    fn target(&mut self, expr: &Expr) -> Option<usize> {
        let slot = self.variable(expr)?;
        if slot < self.params {
            self.writes_params = true;
        }
        Some(slot)
    }

    fn variable(&self, expr: &Expr) -> Option<usize> {
        let Expr::Variable(var, ..) = expr else {
            return None;
        };
        if !var.2.is_empty() {
            return None;
        }
        self.lookup(var.1.as_str())
    }

    fn stmt(&mut self, stmt: &Stmt) -> Option<St> {
        Some(match stmt {
            Stmt::Noop(_) => St::Expr(Ex::Const(Dynamic::UNIT)),
            Stmt::Var(def, flags, _) if flags.is_empty() => {
                let (ident, value, _) = &**def;
                let value = self.expr(value)?;
                let slot = self.new_slot();
                self.scope.push((ident.name.clone(), slot));
                St::Let(slot, value)
            }
            Stmt::Assignment(assignment) => {
                let (info, rhai::BinaryExpr { lhs, rhs }) = &**assignment;
                let op = match info.get_op_assignment_info() {
                    None => None,
                    Some((.., op_syntax)) => Some(binary_op(op_syntax)?),
                };
                let value = self.expr(rhs)?;
                match lhs {
                    Expr::Variable(..) => St::Assign(self.target(lhs)?, op, value),
                    Expr::Index(chain, flags, _) if op.is_none() && plain(*flags) => {
                        if matches!(chain.rhs, Expr::Dot(..) | Expr::Index(..)) {
                            return None;
                        }
                        let slot = self.target(&chain.lhs)?;
                        St::SetIndex(slot, self.expr(&chain.rhs)?, value)
                    }
                    Expr::Dot(chain, flags, _) if op.is_none() && plain(*flags) => {
                        let Expr::Property(p, _) = &chain.rhs else {
                            return None;
                        };
                        St::SetProp(self.target(&chain.lhs)?, p.2.clone(), value)
                    }
                    _ => return None,
                }
            }
            Stmt::If(flow, _) => St::If(
                self.expr(&flow.expr)?,
                self.stmt_block(&flow.body)?,
                self.stmt_block(&flow.branch)?,
            ),
            Stmt::While(flow, _) => {
                if matches!(flow.expr, Expr::Unit(_)) {
                    return None;
                }
                let c = self.expr(&flow.expr)?;
                let turn = OPS_PER_NODE + ex_ops(&c);
                St::While(c, self.stmt_block(&flow.body)?, turn)
            }
            Stmt::For(def, _) => {
                let (var, counter, flow) = &**def;
                if counter.is_some() {
                    return None;
                }
                let range = self.range(&flow.expr);
                let iterable = match range {
                    Some(_) => None,
                    None => Some(self.expr(&flow.expr)?),
                };
                let depth = self.scope.len();
                let slot = self.new_slot();
                self.scope.push((var.name.clone(), slot));
                let body = self.stmt_block(&flow.body);
                self.scope.truncate(depth);
                let body = body?;
                match (range, iterable) {
                    (Some((from, to, inclusive)), _) => St::ForRange(slot, from, to, inclusive, body),
                    (None, Some(items)) => St::ForIn(slot, items, body),
                    (None, None) => return None,
                }
            }
            Stmt::Block(block) => St::If(
                Ex::Const(Dynamic::TRUE),
                self.block(block.statements())?,
                Block::default(),
            ),
            Stmt::Expr(e) => St::Expr(self.expr(e)?),
            Stmt::FnCall(call, pos) => St::Expr(self.expr(&Expr::FnCall(call.clone(), *pos))?),
            Stmt::BreakLoop(None, flags, _) => {
                if flags.contains(rhai::ASTFlags::BREAK) {
                    St::Break
                } else {
                    St::Continue
                }
            }
            Stmt::Return(value, flags, _) if flags.is_empty() => {
                St::Return(match value {
                    Some(v) => Some(self.expr(v)?),
                    None => None,
                })
            }
            _ => return None,
        })
    }

    /// `a..b` or `a..=b` (or such a range folded into a constant).
    fn range(&mut self, expr: &Expr) -> Option<(Ex, Ex, bool)> {
        match expr {
            Expr::FnCall(call, _) if call.op_token.is_some() && call.namespace.is_empty() => {
                let inclusive = match call.name.as_str() {
                    ".." => false,
                    "..=" => true,
                    _ => return None,
                };
                let [a, b] = call.args.as_slice() else {
                    return None;
                };
                Some((self.expr(a)?, self.expr(b)?, inclusive))
            }
            Expr::DynamicConstant(d, _) => {
                if let Some(r) = d.read_lock::<std::ops::Range<i64>>() {
                    let (a, b) = (r.start, r.end);
                    return Some((
                        Ex::Const(Dynamic::from_int(a)),
                        Ex::Const(Dynamic::from_int(b)),
                        false,
                    ));
                }
                let r = d.read_lock::<std::ops::RangeInclusive<i64>>()?;
                let (a, b) = (*r.start(), *r.end());
                Some((
                    Ex::Const(Dynamic::from_int(a)),
                    Ex::Const(Dynamic::from_int(b)),
                    true,
                ))
            }
            _ => None,
        }
    }

    fn exprs(&mut self, items: &[Expr]) -> Option<Vec<Ex>> {
        items.iter().map(|e| self.expr(e)).collect()
    }

    fn expr(&mut self, expr: &Expr) -> Option<Ex> {
        Some(match expr {
            Expr::IntegerConstant(i, _) => Ex::Const(Dynamic::from_int(*i)),
            Expr::StringConstant(s, _) => Ex::Const(Dynamic::from(s.clone())),
            Expr::BoolConstant(b, _) => Ex::Const(Dynamic::from_bool(*b)),
            Expr::Unit(_) => Ex::Const(Dynamic::UNIT),
            Expr::DynamicConstant(d, _)
                if d.is_int() || d.is_string() || d.is_bool() || d.is_unit() =>
            {
                Ex::Const((**d).clone())
            }
            Expr::DynamicConstant(d, _) if d.is_array() || d.is_map() => {
                // A constant array or map (the optimiser folds literals): scalar items only;
                // cloned on every evaluation, as Rhai does.
                let scalars = match (d.as_array_ref(), d.as_map_ref()) {
                    (Ok(a), _) => a.iter().all(scalar),
                    (_, Ok(m)) => m.values().all(scalar),
                    _ => false,
                };
                if !scalars {
                    return None;
                }
                Ex::Const((**d).clone())
            }
            Expr::Variable(..) => Ex::Local(self.variable(expr)?),
            Expr::InterpolatedString(parts, _) => Ex::Interp(self.exprs(parts)?),
            Expr::Array(items, _) => Ex::Array(self.exprs(items)?),
            Expr::Map(map, _) => {
                let (items, template) = &**map;
                let mut fields = Vec::with_capacity(items.len());
                for (name, value) in items {
                    fields.push((name.name.as_str().into(), self.expr(value)?));
                }
                Ex::Map(Box::new(template.clone()), fields)
            }
            Expr::Dot(chain, flags, _) if plain(*flags) => match &chain.rhs {
                Expr::MethodCall(call, _) => self.method(&chain.lhs, call)?,
                rhs => {
                    let mut path = Vec::new();
                    property_path(rhs, &mut path)?;
                    match self.variable(&chain.lhs) {
                        Some(slot) => Ex::Path(slot, path),
                        None => Ex::PropOf(Box::new(self.expr(&chain.lhs)?), path),
                    }
                }
            },
            Expr::Index(chain, flags, _) if plain(*flags) => {
                if matches!(chain.rhs, Expr::Dot(..) | Expr::Index(..)) {
                    return None;
                }
                Ex::Index(
                    Box::new(self.expr(&chain.lhs)?),
                    Box::new(self.expr(&chain.rhs)?),
                )
            }
            Expr::And(items, _) => Ex::And(self.exprs(items)?),
            Expr::Or(items, _) => Ex::Or(self.exprs(items)?),
            Expr::Stmt(block) => Ex::Block(self.block(block.statements())?),
            Expr::FnCall(call, _) if call.namespace.is_empty() && !call.capture_parent_scope => {
                let args = call.args.as_slice();
                if call.op_token.is_some() {
                    return Some(match (call.name.as_str(), args) {
                        ("!", [a]) => Ex::Not(Box::new(self.expr(a)?)),
                        ("-", [a]) => Ex::Neg(Box::new(self.expr(a)?)),
                        (name, [a, b]) => Ex::Binary(
                            binary_op(name)?,
                            Box::new(self.expr(a)?),
                            Box::new(self.expr(b)?),
                        ),
                        _ => return None,
                    });
                }
                self.call(call.name.as_str(), args)?
            }
            _ => return None,
        })
    }

    /// A host function call: the state name must be a string literal.
    fn call(&mut self, name: &str, args: &[Expr]) -> Option<Ex> {
        match (name, args) {
            ("emit", [v]) => return Some(Ex::Host(Host::Emit, vec![self.expr(v)?])),
            ("key", []) => return Some(Ex::Host(Host::Key, Vec::new())),
            _ => {}
        }
        let (state, rest) = args.split_first()?;
        let Expr::StringConstant(state, _) = state else {
            return None;
        };
        let s = match self.states.iter().position(|n| n == state) {
            Some(i) => i,
            None => {
                self.states.push(state.clone());
                self.states.len() - 1
            }
        };
        let host = match (name, rest.len()) {
            ("state_get", 0) => Host::StateGet(s),
            ("state_set", 1) => Host::StateSet(s),
            ("state_clear", 0) => Host::StateClear(s),
            ("state_add", 1) => Host::StateAdd(s),
            ("list_get", 0) => Host::ListGet(s),
            ("list_push", 1) => Host::ListPush(s),
            ("list_len", 0) => Host::ListLen(s),
            ("list_set", 1) => Host::ListSet(s),
            ("list_top", 2) => Host::ListTop(s),
            ("map_get", 1) => Host::MapGet(s),
            ("map_put", 2) => Host::MapPut(s),
            ("map_add", 2) => Host::MapAdd(s),
            ("map_remove", 1) => Host::MapRemove(s),
            ("map_len", 0) => Host::MapLen(s),
            _ => return None,
        };
        Some(Ex::Host(host, self.exprs(rest)?))
    }

    /// `target.method(args)`: `len` on anything, `push`, `pop` and `sort` on a local.
    fn method(&mut self, target: &Expr, call: &rhai::FnCallExpr) -> Option<Ex> {
        if !call.namespace.is_empty() || call.capture_parent_scope {
            return None;
        }
        let args = call.args.as_slice();
        Some(match (call.name.as_str(), args) {
            ("len", []) => Ex::Len(Box::new(self.expr(target)?)),
            ("push", [item]) => {
                let item = self.expr(item)?;
                Ex::Push(self.target(target)?, Box::new(item))
            }
            ("pop", []) => Ex::Pop(self.target(target)?),
            ("sort", []) => Ex::Sort(self.target(target)?, None),
            ("sort", [Expr::DynamicConstant(f, _)]) => {
                let slot = self.target(target)?;
                let name = f.read_lock::<FnPtr>()?.fn_name().to_owned();
                let c = self.comparator(&name)?;
                Ex::Sort(slot, Some(c))
            }
            _ => return None,
        })
    }

    /// The anonymous function `name` of two parameters whose body is one expression.
    fn comparator(&mut self, name: &str) -> Option<usize> {
        let def = self
            .program
            .iter_fn_def()
            .find(|f| f.name.as_str() == name && f.params.len() == 2)?;
        // Its body's statements: Rhai's walk over a program holding only this function (the
        // body's own type is not public).
        let only = self
            .program
            .clone_functions_only_filtered(|_, _, _, n, arity| n == name && arity == 2);
        let mut statements = Vec::new();
        only.walk(&mut |path: &[rhai::ASTNode]| {
            if let [rhai::ASTNode::Stmt(s)] = path {
                statements.push((*s).clone());
            }
            true
        });
        let expr = single_expression(&statements)?;
        let scope = std::mem::replace(
            &mut self.scope,
            def.params
                .iter()
                .enumerate()
                .map(|(i, p)| (p.clone(), i))
                .collect(),
        );
        let (slots, params, writes) = (self.slots, self.params, self.writes_params);
        self.slots = 2;
        self.params = 2;
        let body = self.expr(&expr);
        let cmp_slots = self.slots;
        self.scope = scope;
        self.slots = slots;
        self.params = params;
        self.writes_params = writes;
        let body = body?;
        let direct = match &body {
            Ex::Binary(op, a, b) => match (&**a, &**b) {
                (Ex::Local(0), Ex::Local(1)) => Some((*op, false)),
                (Ex::Local(1), Ex::Local(0)) => Some((*op, true)),
                _ => None,
            },
            _ => None,
        };
        self.comparators.push(Comparator {
            ops: OPS_PER_CALL + ex_ops(&body),
            body,
            slots: cmp_slots,
            direct,
        });
        Some(self.comparators.len() - 1)
    }
}

/// Turns the last read of each local of `block` into a move ([`Ex::Take`]) where no later
/// read can see the difference. `defined` are the locals assigned before each run of
/// `block` (a loop's variable); the others considered are those its own `let`s define, so
/// never a parameter. A local's read is moved when it is the only mention of the local
/// (reads and writes) in the last statement of `block` that mentions it, and sits where
/// that statement evaluates it exactly once: the whole value of a `let`, an assignment, an
/// expression statement or a `return`, an argument of a host function there, or the array
/// of a `for`. After `block` the local is out of scope, and a run of `block` that reads it
/// again (a loop's next turn) assigns it first.
fn moves(block: &mut [St], defined: &[usize]) {
    for st in block.iter_mut() {
        match st {
            St::If(_, a, b) => {
                moves(&mut a.stmts, &[]);
                moves(&mut b.stmts, &[]);
            }
            St::ForIn(var, _, body) | St::ForRange(var, _, _, _, body) => {
                moves(&mut body.stmts, &[*var]);
            }
            St::While(_, body, _) => moves(&mut body.stmts, &[]),
            _ => {}
        }
    }
    let lets = block.iter().filter_map(|st| match st {
        St::Let(slot, _) | St::LetOr(slot, ..) => Some(*slot),
        _ => None,
    });
    let slots: Vec<usize> = defined.iter().copied().chain(lets).collect();
    for slot in slots {
        let Some(last) = block.iter().rposition(|st| st_mentions(st, slot) > 0) else {
            continue;
        };
        if st_mentions(&block[last], slot) != 1 {
            continue;
        }
        let e = match &mut block[last] {
            St::Let(_, e)
            | St::LetOr(_, e, ..)
            | St::Assign(_, _, e)
            | St::Expr(e)
            | St::Return(Some(e))
            | St::ForIn(_, e, _) => e,
            _ => continue,
        };
        let read = |e: &Ex| matches!(e, Ex::Local(s) if *s == slot);
        match e {
            e if read(e) => *e = Ex::Take(slot),
            Ex::Host(_, args) => {
                if let Some(arg) = args.iter_mut().find(|arg| read(arg)) {
                    *arg = Ex::Take(slot);
                }
            }
            _ => {}
        }
    }
}

/// Turns each `for x in items { list_push("s", x); }` of `block` (nested blocks included)
/// into [`St::Extend`]: the loop's one statement pushes its variable, so the loop pushes the
/// items in order and nothing else; its variable goes out of scope with it. Runs after
/// [`moves`], so that `items` may be moved out of its local.
fn fuse(block: &mut [St]) {
    for st in block.iter_mut() {
        match st {
            St::If(_, a, b) => {
                fuse(&mut a.stmts);
                fuse(&mut b.stmts);
            }
            St::ForRange(.., body) | St::While(_, body, _) => fuse(&mut body.stmts),
            St::ForIn(var, items, body) => {
                let var = *var;
                let pushed = match body.stmts.as_slice() {
                    [St::Expr(Ex::Host(Host::ListPush(s), args))] => match args.as_slice() {
                        [Ex::Local(v) | Ex::Take(v)] if *v == var => Some(*s),
                        _ => None,
                    },
                    _ => None,
                };
                match pushed {
                    Some(s) => {
                        let turn = OPS_PER_NODE.saturating_add(body.ops);
                        let items = std::mem::replace(items, Ex::Const(Dynamic::UNIT));
                        *st = St::Extend(s, items, turn);
                    }
                    None => fuse(&mut body.stmts),
                }
            }
            _ => {}
        }
    }
}

/// Turns each `let x = e; if x == () { x = c; }` of `stmts` (`() == x` too, `c` a constant)
/// into [`St::LetOr`]: the same value in `x` without evaluating the comparison and entering
/// the branch. It charges what the `let` and the `if` with its branch charge together, which
/// is at least what either way through them charges.
fn defaults(stmts: Vec<St>) -> Vec<St> {
    let mut out: Vec<St> = Vec::with_capacity(stmts.len());
    for st in stmts {
        if let Some(St::Let(slot, _)) = out.last()
            && let Some((default, ops)) = default_of(&st, *slot)
            && let Some(St::Let(slot, e)) = out.pop()
        {
            out.push(St::LetOr(slot, e, default, ops));
            continue;
        }
        out.push(st);
    }
    out
}

/// The constant `c` and the operations of `st` (its branch's included) when `st` is
/// `if x == () { x = c; }` with no `else`, `x` being local `slot`.
fn default_of(st: &St, slot: usize) -> Option<(Dynamic, u64)> {
    let St::If(Ex::Binary(Op::Eq, a, b), then, otherwise) = st else {
        return None;
    };
    let is_x = |e: &Ex| matches!(e, Ex::Local(s) if *s == slot);
    let is_unit = |e: &Ex| matches!(e, Ex::Const(c) if c.is_unit());
    if !(is_x(a) && is_unit(b) || is_unit(a) && is_x(b)) || !otherwise.stmts.is_empty() {
        return None;
    }
    match then.stmts.as_slice() {
        [St::Assign(s, None, Ex::Const(c))] if *s == slot => {
            Some((c.clone(), st_ops(st) + then.ops + otherwise.ops))
        }
        _ => None,
    }
}

/// How often `st` mentions local `slot` (reads and writes).
fn st_mentions(st: &St, slot: usize) -> usize {
    let is = |s: &usize| usize::from(*s == slot);
    let all = |block: &Block| block.stmts.iter().map(|st| st_mentions(st, slot)).sum::<usize>();
    match st {
        St::Let(s, e) | St::LetOr(s, e, ..) | St::Assign(s, _, e) | St::SetProp(s, _, e) => {
            is(s) + ex_mentions(e, slot)
        }
        St::SetIndex(s, i, e) => is(s) + ex_mentions(i, slot) + ex_mentions(e, slot),
        St::If(c, a, b) => ex_mentions(c, slot) + all(a) + all(b),
        St::ForIn(v, e, body) => is(v) + ex_mentions(e, slot) + all(body),
        St::Extend(_, e, _) => ex_mentions(e, slot),
        St::ForRange(v, from, to, _, body) => {
            is(v) + ex_mentions(from, slot) + ex_mentions(to, slot) + all(body)
        }
        St::While(c, body, _) => ex_mentions(c, slot) + all(body),
        St::Expr(e) | St::Return(Some(e)) => ex_mentions(e, slot),
        St::Break | St::Continue | St::Return(None) => 0,
    }
}

/// How often `e` mentions local `slot` (reads and writes).
fn ex_mentions(e: &Ex, slot: usize) -> usize {
    let is = |s: &usize| usize::from(*s == slot);
    let all = |items: &[Ex]| items.iter().map(|e| ex_mentions(e, slot)).sum::<usize>();
    match e {
        Ex::Const(_) => 0,
        Ex::Local(s) | Ex::Take(s) | Ex::Path(s, _) | Ex::Pop(s) | Ex::Sort(s, _) => is(s),
        Ex::PropOf(a, _) | Ex::Not(a) | Ex::Neg(a) | Ex::Len(a) => ex_mentions(a, slot),
        Ex::Index(a, b) | Ex::Binary(_, a, b) => ex_mentions(a, slot) + ex_mentions(b, slot),
        Ex::And(items) | Ex::Or(items) | Ex::Interp(items) | Ex::Array(items) | Ex::Host(_, items) => {
            all(items)
        }
        Ex::Block(block) => block.stmts.iter().map(|st| st_mentions(st, slot)).sum(),
        Ex::Map(_, items) => items.iter().map(|(_, e)| ex_mentions(e, slot)).sum(),
        Ex::Push(s, item) => is(s) + ex_mentions(item, slot),
    }
}

fn scalar(d: &Dynamic) -> bool {
    d.is_int() || d.is_string() || d.is_bool() || d.is_unit()
}

/// A chain without `?.`/`?[`.
fn plain(flags: rhai::ASTFlags) -> bool {
    !flags.contains(rhai::ASTFlags::NEGATED)
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

/// `a` or `a.b.c` on the right of a `.`.
fn property_path(expr: &Expr, path: &mut Vec<ImmutableString>) -> Option<()> {
    match expr {
        Expr::Property(p, _) => {
            path.push(p.2.clone());
            Some(())
        }
        Expr::Dot(chain, flags, _) if plain(*flags) => {
            let Expr::Property(p, _) = &chain.lhs else {
                return None;
            };
            path.push(p.2.clone());
            property_path(&chain.rhs, path)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rhai::Dynamic;
    use weir_schema::{ScriptLimitsSpec, StateKind};

    use crate::record::{Key, KeyGroupRange};
    use crate::script::runtime::{
        CompiledScript, ProcessContext, ScriptFn, discard_emitted, runtime_engine,
        set_key, set_process_context, take_emitted, with_frame,
    };
    use crate::state::{MemoryBackend, RocksdbBackend, StateBackend, StateId};

    const MAX: u32 = 8;

    /// W4 as written (`shared/bench/w4/w4.yaml.in`).
    const W4: &str = r#"
        fn process(r) {
            let s = state_get("sum");
            if s == () { s = 0; }
            let c = state_get("count");
            if c == () { c = 0; }
            state_set("sum", s + r.amount);
            state_set("count", c + 1);
            let top = list_get("top");
            top.push(r.amount);
            top.sort(|a, b| b - a);
            if top.len() > 5 { top.pop(); }
            state_clear("top");
            for a in top { list_push("top", a); }
            let d = `${(r.amount - 1) / 10}`;
            let n = map_get("deciles", d);
            if n == () { n = 0; }
            map_put("deciles", d, n + 1);
        }
        fn on_end(k) {
            let dec = #{};
            for i in 0..10 {
                let n = map_get("deciles", `${i}`);
                if n != () { dec[`${i}`] = n; }
            }
            emit(#{key: k, sum: state_get("sum"), count: state_get("count"), top: list_get("top"), deciles: dec});
        }
    "#;

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn pick<T: Clone>(&mut self, items: &[T]) -> T {
            items[self.below(items.len() as u64) as usize].clone()
        }

        /// A value of any kind a state or record may hold, mostly small ints.
        fn value(&mut self) -> Dynamic {
            match self.below(12) {
                0 => Dynamic::UNIT,
                1 => Dynamic::from(i64::MAX - self.below(3) as i64),
                2 => Dynamic::from(i64::MIN + self.below(3) as i64),
                3 => Dynamic::from("7".to_owned()),
                4 => Dynamic::from(1.5_f64),
                5 => Dynamic::from(-(self.below(20) as i64)),
                6 => Dynamic::from(true),
                _ => Dynamic::from(self.below(120) as i64),
            }
        }

        fn ints(&mut self, n: u64) -> Dynamic {
            let items: rhai::Array = (0..n).map(|_| Dynamic::from(self.below(100) as i64)).collect();
            Dynamic::from_array(items)
        }
    }

    fn key(i: u64) -> Key {
        Key::from_dynamic(&Dynamic::from(format!("u{i}")))
    }

    type Factory = Box<dyn Fn() -> Box<dyn StateBackend>>;

    /// A memory and a rocksdb backend factory (each call: a fresh, empty backend).
    fn backends(dir: &std::path::Path) -> Vec<(&'static str, Factory)> {
        let all = KeyGroupRange::all(MAX);
        let dir = dir.to_path_buf();
        let n = std::cell::Cell::new(0);
        vec![
            ("memory", Box::new(move || Box::new(MemoryBackend::new(MAX, all)) as Box<dyn StateBackend>)),
            (
                "rocksdb",
                Box::new(move || {
                    n.set(n.get() + 1);
                    let spec = weir_schema::RocksdbSpec {
                        block_cache_size: weir_schema::units::SizeSpec::mib(8),
                        write_buffer_size: weir_schema::units::SizeSpec::mib(4),
                        ..Default::default()
                    };
                    Box::new(
                        RocksdbBackend::open(&dir.join(n.get().to_string()), MAX, all, &spec)
                            .expect("rocksdb"),
                    ) as Box<dyn StateBackend>
                }),
            ),
        ]
    }

    fn script(limits: &ScriptLimitsSpec, text: &str) -> ScriptFn {
        let engine = Arc::new(runtime_engine(limits));
        let compiled = CompiledScript::compile(&engine, text).expect("compiles");
        ScriptFn::new(engine, Arc::new(compiled))
    }

    /// One side of a comparison: a script (native runs on or off) and its backend.
    struct Side {
        script: ScriptFn,
        state: Option<Box<dyn StateBackend>>,
        names: Vec<(String, StateId)>,
    }

    impl Side {
        fn new(text: &str, limits: &ScriptLimitsSpec, native: bool, backend: Box<dyn StateBackend>, states: &[(&str, StateKind)]) -> Self {
            let mut script = script(limits, text);
            script.set_native(native);
            let mut backend = backend;
            let names = states
                .iter()
                .map(|(n, k)| ((*n).to_owned(), backend.register(n, *k).expect("registers")))
                .collect();
            Self { script, state: Some(backend), names }
        }

        /// Runs `process` on each record; each record's outcome (emitted records or the error).
        fn run(&mut self, records: &[(Key, Dynamic)], max_outputs: usize) -> Vec<Result<Vec<String>, String>> {
            let script = &mut self.script;
            with_frame(&mut self.state, &self.names, max_outputs, || {
                set_process_context(ProcessContext::default());
                records
                    .iter()
                    .map(|(k, r)| {
                        set_key(Some(k.clone()));
                        let mut out = Vec::new();
                        match script.run_process("process", &mut [r.clone()]) {
                            Ok(()) => take_emitted(&mut out).map(|()| out.iter().map(|v| format!("{v:?}")).collect()),
                            Err(e) => {
                                discard_emitted();
                                Err(e)
                            }
                        }
                    })
                    .collect()
            })
        }

        /// Every state value of `keys`, as text.
        fn dump(&self, keys: &[Key]) -> Vec<String> {
            let state = self.state.as_deref().expect("state");
            let mut out = Vec::new();
            for (name, id) in &self.names {
                for k in keys {
                    out.push(format!("{name} {k:?} {:?}", state.get(*id, k).expect("reads")));
                }
            }
            out
        }

        fn put(&mut self, name: &str, k: &Key, v: Dynamic) {
            let id = self.names.iter().find(|(n, _)| n == name).expect("declared").1;
            self.state.as_deref_mut().expect("state").put(id, k, v).expect("writes");
        }
    }

    /// Runs `records` through `text` natively and through Rhai alone, from the same initial
    /// state, on both backends; asserts equal outcomes and equal state afterwards. Returns
    /// how many records completed natively.
    fn differential(
        text: &str,
        limits: &ScriptLimitsSpec,
        states: &[(&str, StateKind)],
        init: &[(String, Key, Dynamic)],
        records: &[(Key, Dynamic)],
        max_outputs: usize,
    ) -> u64 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut keys: Vec<Key> = records.iter().map(|(k, _)| k.clone()).collect();
        keys.extend(init.iter().map(|(_, k, _)| k.clone()));
        keys.dedup();
        let mut completed = 0;
        let mut dumps = Vec::new();
        for (backend, factory) in backends(dir.path()) {
            let mut native = Side::new(text, limits, true, factory(), states);
            let mut rhai = Side::new(text, limits, false, factory(), states);
            for (name, k, v) in init {
                native.put(name, k, v.clone());
                rhai.put(name, k, v.clone());
            }
            // In batches, as a task hands them over.
            for chunk in records.chunks(7) {
                let a = native.run(chunk, max_outputs);
                let b = rhai.run(chunk, max_outputs);
                assert_eq!(a, b, "{backend}: {text}\non {chunk:?}");
            }
            let dump = native.dump(&keys);
            assert_eq!(dump, rhai.dump(&keys), "{backend}: {text}");
            dumps.push(dump);
            completed += native.script.native_runs();
        }
        assert_eq!(dumps[0], dumps[1], "the same state on every backend: {text}");
        completed
    }

    /// Runs `text` natively and through Rhai alone, on every backend, in 60 batches of 30
    /// records (`record` makes each, on key 0 or 1) with one state; after each batch
    /// `replace` may write a new value of that state for a key from outside (given the
    /// round and the value stored now). Asserts equal outcomes and equal state; returns how
    /// many records completed natively.
    fn with_outside_writes(
        text: &str,
        limits: &ScriptLimitsSpec,
        state: (&str, StateKind),
        seed: u64,
        mut record: impl FnMut(&mut Rng) -> Dynamic,
        mut replace: impl FnMut(&mut Rng, usize, Option<Dynamic>) -> Option<Dynamic>,
    ) -> u64 {
        let states = [state];
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rng = Rng(seed);
        let mut completed = 0;
        for (backend, factory) in backends(dir.path()) {
            let mut native = Side::new(text, limits, true, factory(), &states);
            let mut rhai = Side::new(text, limits, false, factory(), &states);
            for round in 0..60 {
                let records: Vec<(Key, Dynamic)> = (0..30)
                    .map(|_| {
                        let r = record(&mut rng);
                        (key(rng.below(2)), r)
                    })
                    .collect();
                let a = native.run(&records, 10);
                let b = rhai.run(&records, 10);
                assert_eq!(a, b, "{backend} round {round}");
                let k = key(rng.below(2));
                let id = native.names[0].1;
                let stored = native.state.as_deref().expect("state").get(id, &k).expect("reads");
                if let Some(v) = replace(&mut rng, round, stored) {
                    native.put(state.0, &k, v.clone());
                    rhai.put(state.0, &k, v);
                }
            }
            assert_eq!(native.dump(&[key(0), key(1)]), rhai.dump(&[key(0), key(1)]), "{backend}");
            completed += native.script.native_runs();
        }
        completed
    }

    /// Map writes measure a map from the sizes its last native commit left (see
    /// `SizesMemo`): those must follow every write, native or not, so that a limit refuses
    /// exactly what Rhai refuses. Between batches the map is replaced from outside (smaller,
    /// at the limit, over it), and Rhai runs some records (a float gives up the native run).
    #[test]
    fn map_sizes_known_from_commits_follow_writes_from_outside() {
        let text = "fn process(r) { map_put(\"m\", r.f, r.v); if r.v == 3 { emit(map_add(\"m\", r.f, 1)); } emit(map_get(\"m\", \"f1\")); }";
        let limits = ScriptLimitsSpec {
            max_map_size: 40,
            max_string_size: weir_schema::units::SizeSpec(64),
            ..ScriptLimitsSpec::default()
        };
        let record = |rng: &mut Rng| {
            let mut m = rhai::Map::new();
            m.insert("f".into(), Dynamic::from(format!("f{}", rng.below(48))));
            let v = match rng.below(6) {
                0 => Dynamic::from_float(0.5),
                1 => Dynamic::from(vec![Dynamic::from(1_i64)]),
                _ => Dynamic::from(rng.below(9) as i64),
            };
            m.insert("v".into(), v);
            Dynamic::from_map(m)
        };
        let replace = |rng: &mut Rng, round: usize, stored: Option<Dynamic>| match round % 3 {
            0 => {
                let mut m = rhai::Map::new();
                for i in 0..rng.below(48) {
                    m.insert(format!("f{i}").into(), Dynamic::from(i as i64));
                }
                Some(Dynamic::from_map(m))
            }
            // The same entries, now strings: only the sizes change.
            1 => stored.and_then(|d| d.try_cast::<rhai::Map>()).map(|m| {
                Dynamic::from_map(m.into_keys().map(|f| (f, Dynamic::from("abc"))).collect())
            }),
            _ => None,
        };
        let completed = with_outside_writes(text, &limits, ("m", StateKind::Map), 0x5851_F42D_4C95_7F2D, record, replace);
        assert!(completed > 600, "{completed} records completed natively");
    }

    /// Items pushed onto a stored list are appended at commit (and its sizes remembered once
    /// it is long): a long list pushed onto, read, trimmed, replaced from outside between
    /// batches (longer, shorter, strings instead of ints), agrees with Rhai.
    #[test]
    fn lists_pushed_onto_agree_with_rhai_when_written_from_outside() {
        let text = "fn process(r) { list_push(\"l\", r.v); if r.v == 3 { for x in [r.v, r.v] { list_push(\"l\", x); } } if r.v == 4 { emit(list_len(\"l\")); } if r.v == 5 { let a = list_get(\"l\"); a.pop(); list_set(\"l\", a); } if r.v == 6 { state_clear(\"l\"); } }";
        let limits = ScriptLimitsSpec {
            max_array_size: 60,
            max_string_size: weir_schema::units::SizeSpec(64),
            ..ScriptLimitsSpec::default()
        };
        let record = |rng: &mut Rng| {
            let mut m = rhai::Map::new();
            let v = match rng.below(12) {
                0 => Dynamic::from_float(0.5),
                1 => Dynamic::from("ab"),
                2 => Dynamic::from(vec![Dynamic::from(1_i64)]),
                _ => Dynamic::from(rng.below(40) as i64),
            };
            m.insert("v".into(), v);
            Dynamic::from_map(m)
        };
        let replace = |rng: &mut Rng, round: usize, stored: Option<Dynamic>| {
            let len = stored.and_then(|d| d.try_cast::<rhai::Array>()).map_or(0, |a| a.len());
            let list: rhai::Array = match round % 3 {
                0 => (0..rng.below(64)).map(|i| Dynamic::from(i as i64)).collect(),
                // As long as it was, strings instead of ints: only the sizes change.
                1 => (0..len).map(|_| Dynamic::from("abc")).collect(),
                _ => return None,
            };
            Some(Dynamic::from_array(list))
        };
        let completed = with_outside_writes(text, &limits, ("l", StateKind::List), 0x6C07_8965_0F13_1A2B, record, replace);
        assert!(completed > 600, "{completed} records completed natively");
    }

    /// A map of many fields written a field at a time agrees with Rhai.
    #[test]
    fn a_map_of_many_fields_agrees_with_rhai() {
        let text = "fn process(r) { let n = map_get(\"m\", r.f); if n == () { n = 0; } map_put(\"m\", r.f, n + r.v); if r.v == 0 { map_remove(\"m\", r.f); } emit(map_get(\"m\", \"field7\")); }";
        let mut rng = Rng(0x2127_599B_F432_5C37);
        let records: Vec<(Key, Dynamic)> = (0..600)
            .map(|_| {
                let mut m = rhai::Map::new();
                m.insert("f".into(), Dynamic::from(format!("field{}", rng.below(300))));
                m.insert("v".into(), Dynamic::from(rng.below(20) as i64));
                (key(rng.below(3)), Dynamic::from_map(m))
            })
            .collect();
        let states = [("m", StateKind::Map)];
        let tight = ScriptLimitsSpec {
            max_map_size: 120,
            max_string_size: weir_schema::units::SizeSpec(64),
            ..ScriptLimitsSpec::default()
        };
        let mut completed = 0;
        for limits in [ScriptLimitsSpec::default(), tight] {
            completed += differential(text, &limits, &states, &[], &records, 10);
        }
        assert!(completed > 2000, "{completed} records completed natively");
    }

    fn w4_states() -> Vec<(&'static str, StateKind)> {
        vec![
            ("sum", StateKind::Value),
            ("count", StateKind::Value),
            ("top", StateKind::List),
            ("deciles", StateKind::Map),
        ]
    }

    /// A record `{user, amount}`: mostly a plain amount, sometimes one that overflows, of
    /// another type, missing, or no map at all.
    fn record(rng: &mut Rng, keys: u64) -> (Key, Dynamic) {
        let k = rng.below(keys);
        let mut m = rhai::Map::new();
        m.insert("user".into(), Dynamic::from(format!("u{k}")));
        let r = match rng.below(20) {
            0 => Dynamic::from(5_i64),
            1 => Dynamic::from_map(m),
            _ => {
                let amount = if rng.below(4) == 0 { rng.value() } else { Dynamic::from(1 + rng.below(100) as i64) };
                m.insert("amount".into(), amount);
                Dynamic::from_map(m)
            }
        };
        (key(k), r)
    }

    /// How many reads of locals `process` in `text` moves instead of copying.
    /// How many `node`s (a variant name with its parenthesis) `text`'s native `process` body
    /// compiles to.
    fn compiled_nodes(text: &str, node: &str) -> usize {
        let engine = runtime_engine(&ScriptLimitsSpec::default());
        let compiled = CompiledScript::compile(&engine, text).expect("compiles");
        let program = compiled.native_program("process").expect("runs natively");
        format!("{:?}", program.body).matches(node).count()
    }

    fn moved(text: &str) -> usize {
        compiled_nodes(text, "Take(")
    }

    /// W4 moves its list into the pushes that rebuild the state (its loop, fused) and the
    /// decile's name into `map_put`; a parameter, a local read again later, and a local
    /// read in a loop it was defined outside of are copied.
    #[test]
    fn last_reads_are_moved() {
        assert_eq!(moved(W4), 2);
        assert_eq!(moved("fn process(r) { emit(r); }"), 0);
        assert_eq!(moved("fn process(r) { let a = [1]; for i in 0..2 { emit(a); } }"), 0);
        assert_eq!(moved("fn process(r) { let a = [1]; emit(a); emit(a); }"), 1);
        assert_eq!(moved("fn process(r) { let a = [1]; emit(a + a); }"), 0);
        assert_eq!(moved("fn process(r) { let a = [1]; for x in a { emit(a); } }"), 0);
    }

    fn fused(text: &str) -> usize {
        compiled_nodes(text, "Extend(")
    }

    /// A loop whose one statement pushes its item onto a list state becomes one extend, at
    /// any depth; a loop that does anything else stays a loop.
    #[test]
    fn loops_of_list_pushes_are_fused() {
        assert_eq!(fused(W4), 1);
        assert_eq!(fused("fn process(r) { if r.a > 1 { for x in r.l { list_push(\"l\", x); } } }"), 1);
        assert_eq!(fused("fn process(r) { for i in 0..2 { for x in r.l { list_push(\"l\", x); } } }"), 1);
        assert_eq!(fused("fn process(r) { for x in r.l { list_push(\"l\", x); emit(x); } }"), 0);
        assert_eq!(fused("fn process(r) { let y = 1; for x in r.l { list_push(\"l\", y); } }"), 0);
        assert_eq!(fused("fn process(r) { for x in r.l { list_push(\"l\", x + 1); } }"), 0);
        assert_eq!(fused("fn process(r) { for x in 0..3 { list_push(\"l\", x); } }"), 0);
    }

    fn defaulted(text: &str) -> usize {
        compiled_nodes(text, "LetOr(")
    }

    /// `let x = e; if x == () { x = c; }` becomes one statement, at any depth; with an
    /// `else`, a non-constant default, another local or more in the branch it stays as it is.
    #[test]
    fn defaults_for_unit_are_fused() {
        assert_eq!(defaulted(W4), 3);
        assert_eq!(defaulted("fn process(r) { let x = r.a; if () == x { x = \"d\"; } emit(x); }"), 1);
        assert_eq!(defaulted("fn process(r) { for i in r.l { let x = i; if x == () { x = 0; } emit(x); } }"), 1);
        assert_eq!(defaulted("fn process(r) { let x = r.a; if x == () { x = 0; } else { x = 1; } emit(x); }"), 0);
        assert_eq!(defaulted("fn process(r) { let x = r.a; if x == () { x = r.b; } emit(x); }"), 0);
        assert_eq!(defaulted("fn process(r) { let y = 1; let x = r.a; if y == () { x = 0; } emit(x); }"), 0);
        assert_eq!(defaulted("fn process(r) { let x = r.a; if x == () { x = 0; emit(1); } emit(x); }"), 0);
        assert_eq!(defaulted("fn process(r) { let x = r.a; if x != () { x = 0; } emit(x); }"), 0);
    }

    #[test]
    fn w4_as_written_compiles_natively() {
        let s = script(&ScriptLimitsSpec::default(), W4);
        assert!(s.runs_natively("process"));
    }

    #[test]
    fn w4_agrees_with_rhai_on_random_records_and_state() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut completed = 0;
        for round in 0..6 {
            let keys = 1 + rng.below(6);
            let mut init = Vec::new();
            for k in 0..keys {
                if round % 2 == 1 {
                    continue;
                }
                let k = key(k);
                for name in ["sum", "count"] {
                    if rng.below(3) > 0 {
                        init.push((name.to_owned(), k.clone(), rng.value()));
                    }
                }
                match rng.below(5) {
                    0 => {}
                    1 => init.push(("top".to_owned(), k.clone(), rng.value())),
                    2 => {
                        let mut items = vec![Dynamic::from(3_i64), rng.value()];
                        items.push(Dynamic::from(9_i64));
                        init.push(("top".to_owned(), k.clone(), Dynamic::from_array(items)));
                    }
                    _ => {
                        let n = rng.below(7);
                        init.push(("top".to_owned(), k.clone(), rng.ints(n)));
                    }
                }
                match rng.below(4) {
                    0 => {}
                    1 => init.push(("deciles".to_owned(), k.clone(), rng.value())),
                    _ => {
                        let mut m = rhai::Map::new();
                        for d in 0..rng.below(10) {
                            let v = if rng.below(6) == 0 { rng.value() } else { Dynamic::from(rng.below(50) as i64) };
                            m.insert(d.to_string().into(), v);
                        }
                        init.push(("deciles".to_owned(), k.clone(), Dynamic::from_map(m)));
                    }
                }
            }
            let records: Vec<_> = (0..300).map(|_| record(&mut rng, keys)).collect();
            completed += differential(W4, &ScriptLimitsSpec::default(), &w4_states(), &init, &records, 10);
        }
        assert!(completed >= 800, "{completed} records completed natively");
        // Plain records on a fresh state all complete natively.
        let records: Vec<_> = (0..200)
            .map(|i| {
                let mut m = rhai::Map::new();
                m.insert("amount".into(), Dynamic::from(1 + rng.below(100) as i64));
                (key(i % 5), Dynamic::from_map(m))
            })
            .collect();
        let completed = differential(W4, &ScriptLimitsSpec::default(), &w4_states(), &[], &records, 10);
        assert_eq!(completed, 400, "every record, on each backend");
    }

    /// A memory backend whose writes of state `fail` fail.
    struct Failing {
        inner: MemoryBackend,
        fail: StateId,
    }

    impl StateBackend for Failing {
        fn key_groups(&self) -> KeyGroupRange {
            self.inner.key_groups()
        }
        fn register(&mut self, name: &str, kind: StateKind) -> crate::base::error::Result<StateId> {
            self.inner.register(name, kind)
        }
        fn get(&self, state: StateId, key: &Key) -> crate::base::error::Result<Option<Dynamic>> {
            self.inner.get(state, key)
        }
        fn update(
            &mut self,
            state: StateId,
            key: &Key,
            f: &mut dyn FnMut(&mut Option<Dynamic>),
        ) -> crate::base::error::Result<()> {
            if state == self.fail {
                return Err(crate::base::error::RunError::State("disk on fire".into()));
            }
            self.inner.update(state, key, f)
        }
        fn keys_in(&self, state: StateId, range: KeyGroupRange) -> crate::base::error::Result<Vec<Key>> {
            self.inner.keys_in(state, range)
        }
        fn snapshot(&self, range: KeyGroupRange) -> crate::base::error::Result<Vec<u8>> {
            self.inner.snapshot(range)
        }
        fn restore(&mut self, snapshots: &[&[u8]]) -> crate::base::error::Result<()> {
            self.inner.restore(snapshots)
        }
    }

    /// A backend failing on the last of a completed run's writes: the record fails and the
    /// writes applied before are undone, whole values and map entries alike.
    #[test]
    fn a_failed_commit_leaves_no_write_behind() {
        let text = "fn process(r) { state_set(\"v\", r.a); map_put(\"m\", \"x\", r.a); map_put(\"m\", \"new\", 1); list_push(\"l\", r.a); emit(r.a); }";
        let mut inner = MemoryBackend::new(MAX, KeyGroupRange::all(MAX));
        let states = [("v", StateKind::Value), ("m", StateKind::Map), ("l", StateKind::List)];
        let ids: Vec<StateId> = states.iter().map(|(n, k)| inner.register(n, *k).expect("registers")).collect();
        let backend = Box::new(Failing { inner, fail: ids[2] });
        let mut side = Side::new(text, &ScriptLimitsSpec::default(), true, backend, &states);
        let k = key(1);
        side.put("v", &k, Dynamic::from(5_i64));
        side.put("m", &k, Dynamic::from_map(rhai::Map::from_iter([("x".into(), Dynamic::from(1_i64))])));
        let before = side.dump(std::slice::from_ref(&k));
        let mut m = rhai::Map::new();
        m.insert("a".into(), Dynamic::from(9_i64));
        let outcome = side.run(&[(k.clone(), Dynamic::from_map(m))], 10);
        assert!(matches!(&outcome[..], [Err(e)] if e.contains("disk on fire")), "{outcome:?}");
        assert_eq!(side.script.native_runs(), 0);
        assert_eq!(side.dump(std::slice::from_ref(&k)), before);
    }

    /// Items appended to a stored list are taken off again when a later write fails.
    #[test]
    fn a_failed_commit_takes_appended_items_off() {
        let text = "fn process(r) { list_push(\"l\", r.a); for x in [1, 2] { list_push(\"l\", x); } state_set(\"v\", r.a); }";
        let mut inner = MemoryBackend::new(MAX, KeyGroupRange::all(MAX));
        let states = [("l", StateKind::List), ("v", StateKind::Value)];
        let ids: Vec<StateId> = states.iter().map(|(n, k)| inner.register(n, *k).expect("registers")).collect();
        let backend = Box::new(Failing { inner, fail: ids[1] });
        let mut side = Side::new(text, &ScriptLimitsSpec::default(), true, backend, &states);
        let k = key(1);
        side.put("l", &k, Dynamic::from_array((0..40).map(Dynamic::from_int).collect()));
        let before = side.dump(std::slice::from_ref(&k));
        let mut m = rhai::Map::new();
        m.insert("a".into(), Dynamic::from(9_i64));
        let outcome = side.run(&[(k.clone(), Dynamic::from_map(m))], 10);
        assert!(matches!(&outcome[..], [Err(e)] if e.contains("disk on fire")), "{outcome:?}");
        assert_eq!(side.dump(std::slice::from_ref(&k)), before);
    }

    /// W4's `on_end` (which runs natively too), run as a `process` body on each key: its
    /// emitted records agree with Rhai's on random prior state.
    #[test]
    fn w4_on_end_agrees_with_rhai() {
        let on_end = W4.split("fn on_end(k)").nth(1).expect("on_end");
        let text = format!("fn process(k) {on_end}");
        assert!(script(&ScriptLimitsSpec::default(), W4).runs_natively("on_end"));
        let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
        let mut init = Vec::new();
        for k in 0..40 {
            let k = key(k);
            if rng.below(4) > 0 {
                init.push(("sum".to_owned(), k.clone(), rng.value()));
            }
            let n = rng.below(6);
            init.push(("top".to_owned(), k.clone(), rng.ints(n)));
            let mut m = rhai::Map::new();
            for d in 0..rng.below(12) {
                let v = if rng.below(8) == 0 { rng.value() } else { Dynamic::from(rng.below(50) as i64) };
                m.insert(d.to_string().into(), v);
            }
            init.push(("deciles".to_owned(), k, Dynamic::from_map(m)));
        }
        let records: Vec<_> = (0..40).map(|i| (key(i), key(i).to_dynamic())).collect();
        let completed = differential(&text, &ScriptLimitsSpec::default(), &w4_states(), &init, &records, 10);
        assert!(completed >= 40, "{completed} keys completed natively");
    }

    /// Tight limits: lists, maps and strings reach their sizes, so runs give up and Rhai
    /// refuses the writes.
    #[test]
    fn w4_agrees_with_rhai_at_the_size_limits() {
        let limits = ScriptLimitsSpec {
            max_array_size: 4,
            max_map_size: 6,
            max_string_size: weir_schema::units::SizeSpec(8),
            ..ScriptLimitsSpec::default()
        };
        let mut rng = Rng(7);
        let records: Vec<_> = (0..400).map(|_| record(&mut rng, 4)).collect();
        let completed = differential(W4, &limits, &w4_states(), &[], &records, 10);
        assert!(completed > 0, "some records stay under the limits");
    }

    /// Statement bodies covering each construct and each give-up path, on records of every
    /// kind: results, emitted records and state afterwards as Rhai's.
    #[test]
    fn statement_bodies_agree_with_rhai() {
        let states = [("v", StateKind::Value), ("l", StateKind::List), ("m", StateKind::Map)];
        let bodies: &[(&str, bool)] = &[
            ("let x = r.a; x += 1; state_set(\"v\", x); emit(x);", true),
            ("let x = r.a * r.b; let y = x / r.b; let z = x % 7; emit([x, y, z, -x]);", true),
            ("if r.a > r.b { emit(\"gt\"); } else if r.a == r.b { emit(\"eq\"); } else { emit(\"lt\"); }", true),
            ("let t = if r.a > 3 { \"big\" } else { \"small\" }; emit(t + \"!\");", true),
            ("let s = 0; for i in 0..r.a { s += i; } emit(s);", true),
            ("let s = 0; for i in 1..=5 { if i == 3 { continue; } if i == 5 { break; } s += i; } emit(s);", true),
            ("let a = [r.a, r.b, 3]; a.sort(); emit(a); a.sort(|x, y| y - x); emit(a); emit(a.len()); emit(a.pop()); emit(a);", true),
            ("let a = []; a.push(r.a); a.push(r.s); a.sort(); emit(a);", true),
            ("let a = [r.a, r.b]; a.sort(|x, y| x < y); emit(a);", true),
            ("let a = [r.a, r.b, 1]; a.sort(|x, y| \"no\"); emit(a);", true),
            // Comparators evaluated directly: every operator, either order, any item types.
            ("let a = [r.a, r.b, r.s, 2]; a.sort(|x, y| x - y); emit(a);", true),
            ("let a = [r.a, r.b, 2]; a.sort(|x, y| y >= x); emit(a);", true),
            ("let a = [r.b, r.a, 7, -3]; a.sort(|x, y| x * y); emit(a);", true),
            ("let a = [r.b, r.a, 7, -3]; a.sort(|x, y| y % x); emit(a);", true),
            ("let a = [r.s, \"b\", r.s]; a.sort(|x, y| y + x); emit(a);", true),
            ("let a = [r.s, (), r.a]; a.sort(|x, y| x != y); emit(a);", true),
            // Lists rebuilt item by item after a clear, a `list_set` or over another value.
            ("list_set(\"l\", [r.a, r.s]); list_push(\"l\", r.b); list_push(\"l\", r.s); emit(list_get(\"l\"));", true),
            ("state_set(\"l\", r.a); list_push(\"l\", r.b); list_push(\"l\", [r.s, r.b]); emit(list_get(\"l\"));", true),
            ("list_push(\"l\", r.s); state_clear(\"l\"); for x in [r.a, r.b, r.s, r.a] { list_push(\"l\", x); } emit(list_len(\"l\"));", true),
            // Loops of pushes, fused: onto a list, onto another value, nothing, not a list,
            // a state not declared; the items read again after.
            ("for x in r.list { list_push(\"l\", x); } emit(list_get(\"l\"));", true),
            ("state_set(\"l\", r.a); for x in [r.b, r.s] { list_push(\"l\", x); } emit(state_get(\"l\"));", true),
            ("let a = [r.a, r.s]; for x in a { list_push(\"l\", x); } emit(a); emit(list_len(\"l\"));", true),
            ("for x in [] { list_push(\"nope\", x); } emit(state_get(\"l\"));", true),
            ("for x in r.list { list_push(\"nope\", x); } emit(1);", true),
            ("let a = []; for i in 0..r.a { a.push([i]); } for x in a { list_push(\"l\", x); } emit(list_len(\"l\"));", true),
            ("let a = [r.s, r.s]; for i in 0..r.b { a.push(r.s); } for x in a { list_push(\"l\", x); } emit(state_get(\"l\"));", true),
            ("emit(`${r.a}/${-r.b}/${r.s}`); emit(`${r.b * 1000000000}`);", true),
            ("let m = #{x: r.a}; m.y = r.b; m[\"z\"] = r.s; emit(m); emit(m.x + m[\"y\"]);", true),
            ("let a = [1, 2, 3]; a[1] = r.a; emit(a[1] + a[2]); let i = r.b; emit(a[i]);", true),
            ("let a = [1, 2, 3]; emit(a[r.b]);", false),
            ("let k = `k${r.a}-${r.s}`; map_put(\"m\", k, r.b); emit(map_get(\"m\", k)); emit(map_len(\"m\"));", true),
            ("emit(map_add(\"m\", r.s, r.a)); emit(map_get(\"m\", r.s)); map_remove(\"m\", \"x\"); emit(map_len(\"m\"));", true),
            ("emit(state_add(\"v\", r.a)); emit(state_get(\"v\"));", true),
            ("list_push(\"l\", r.a); list_push(\"l\", r.b); emit(list_len(\"l\")); emit(list_get(\"l\"));", true),
            ("emit(list_top(\"l\", r.a, 3)); emit(list_get(\"l\")); list_set(\"l\", [r.b]); emit(list_get(\"l\"));", true),
            ("state_clear(\"l\"); emit(list_get(\"l\")); state_set(\"l\", r.a); list_push(\"l\", 1); emit(state_get(\"l\"));", true),
            ("map_put(\"m\", \"a\", 1); state_clear(\"m\"); emit(map_get(\"m\", \"a\")); map_put(\"m\", \"b\", r.a); emit(state_get(\"m\"));", true),
            ("let n = map_get(\"m\", r.s); if n == () { n = 0; } map_put(\"m\", r.s, n + 1); emit(n != ());", true),
            // Defaults for `()`, fused: either order, any constant, over any value; not
            // fused: an `else`, another local, another statement in the branch.
            ("let v = state_get(\"v\"); if v == () { v = 0; } state_set(\"v\", v + r.a); emit(v);", true),
            ("let x = r.missing; if () == x { x = \"none\"; } emit(x); let y = r.s; if y == () { y = [1]; } emit(y);", true),
            ("let x = map_get(\"m\", r.s); if x == () { x = #{a: 1}; } emit(x); map_put(\"m\", r.s, 2);", true),
            ("let x = r.list; if x == () { x = (); } emit(x); let z = r.nested; if z == () { z = 3; } emit(z);", true),
            ("let x = r.missing; if x == () { x = 1; } else { x = 2; } emit(x);", true),
            ("let x = r.a; let y = r.missing; if y == () { x = 5; } emit([x, y]);", true),
            ("let x = r.missing; if x == () { x = 1; emit(0); } emit(x);", true),
            ("let i = 0; while i < r.a { i += 2; } emit(i);", true),
            ("if r.flag && !r.other || r.a < 0 { return; } emit(1);", true),
            ("emit(key()); emit(r.missing);", true),
            ("let x = r.a; x -= r.b; x *= 3; emit(x); emit(r.s < \"m\"); emit(r.s == ());", true),
            ("emit(r.a); emit(r.a); emit(r.a);", true),
            ("state_set(\"v\", [r.a, r.s]); emit(state_get(\"v\"));", true),
            ("state_set(\"nope\", 1);", true),
            ("let s = \"\"; for x in [r.s, r.s, r.s] { s += x; } emit(s);", true),
            ("let n = 0; for x in r.list { n += x; } emit(n); let l = r.list; emit(l.len()); emit(r.nested.inner.x);", true),
            ("emit(r.list.len());", false),
            // Last reads moved (or not: read again later, in a loop, a parameter).
            ("let a = [r.a, r.b]; for x in a { if x == 1 { continue; } if x == 2 { break; } emit(x); } emit(a);", true),
            ("let a = [r.a, r.b]; let n = 0; for x in a { n += x; } list_set(\"l\", a); emit(n);", true),
            ("for i in 0..3 { let a = [i, r.a]; let b = a; for x in b { emit(x); } if i == r.b { return; } }", true),
            ("let s = `${r.s}!`; let t = s; emit(t); state_set(\"v\", s); emit(state_get(\"v\"));", true),
            ("for x in r.list { let y = x; emit(y); } let l = r.list; for x in l { emit(x + 1); }", true),
            ("let x = r.a; while x < 5 { let y = [x]; x += 1; emit(y); }", true),
            ("let v = r.a; emit(v); v = [v, v]; emit(v); let w = v; map_put(\"m\", \"w\", w); emit(state_get(\"m\"));", true),
            ("let q = r; for k in [1, 2] { emit(q); }", true),
            // A map entry read, then written.
            ("let n = map_get(\"m\", r.s); map_put(\"m\", r.s, [n, r.a]); emit(map_get(\"m\", r.s)); emit(map_add(\"m\", \"a\", 1));", true),
            ("let n = map_get(\"m\", \"a\"); map_add(\"m\", \"a\", r.a); emit(n); emit(map_get(\"m\", \"a\")); map_remove(\"m\", \"a\"); emit(map_get(\"m\", \"a\"));", true),
            // Entries read from the stored map, then written, read again, removed.
            ("let a = map_get(\"m\", r.s); map_put(\"m\", r.s, r.a); let b = map_get(\"m\", \"x\"); emit([a, b, map_get(\"m\", r.s)]); map_remove(\"m\", r.s); emit(map_get(\"m\", r.s)); emit(map_add(\"m\", \"x\", 1));", true),
            ("let k = `${r.a}`; let a = map_get(\"m\", k); emit(map_add(\"m\", k, 2)); emit(map_get(\"m\", `${r.a}`)); emit(a);", true),
            // Operation counts reached in loops.
            ("let s = 0; for i in 0..r.a * 20 { s += i; } emit(s);", true),
            ("let i = 0; while i < r.a * 30 { i += 1; } emit(i);", true),
            // Not compiled natively.
            ("let x = r.a; print(x);", false),
            ("register_event_timer(r.a);", false),
            ("let x = 1.5; emit(x);", false),
            ("try { emit(r.a); } catch { }", false),
            ("const X = 1; emit(X);", false),
            ("let a = [1]; for (x, i) in a { emit(x); }", false),
        ];
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let mut records = Vec::new();
        for _ in 0..60 {
            let k = key(rng.below(3));
            let r = match rng.below(10) {
                0 => Dynamic::from(3_i64),
                1 => Dynamic::from_map(rhai::Map::new()),
                _ => {
                    let mut m = rhai::Map::new();
                    m.insert("a".into(), if rng.below(5) == 0 { rng.value() } else { Dynamic::from(rng.below(8) as i64) });
                    m.insert("b".into(), if rng.below(5) == 0 { rng.value() } else { Dynamic::from(rng.below(4) as i64) });
                    m.insert("s".into(), if rng.below(6) == 0 { rng.value() } else { Dynamic::from(rng.pick(&["a", "zz", "ü", ""]).to_owned()) });
                    m.insert("flag".into(), Dynamic::from(rng.below(2) == 0));
                    m.insert("other".into(), if rng.below(4) == 0 { rng.value() } else { Dynamic::from(rng.below(2) == 0) });
                    let n = rng.below(4);
                    let list = if rng.below(4) == 0 { rng.value() } else { rng.ints(n) };
                    m.insert("list".into(), list);
                    let mut inner = rhai::Map::new();
                    inner.insert("x".into(), rng.value());
                    let mut nested = rhai::Map::new();
                    nested.insert("inner".into(), Dynamic::from_map(inner));
                    m.insert("nested".into(), Dynamic::from_map(nested));
                    Dynamic::from_map(m)
                }
            };
            records.push((k, r));
        }
        let init = vec![
            ("v".to_owned(), key(0), Dynamic::from(5_i64)),
            ("l".to_owned(), key(1), rng.ints(3)),
            ("m".to_owned(), key(2), {
                let mut m = rhai::Map::new();
                m.insert("a".into(), Dynamic::from(1_i64));
                Dynamic::from_map(m)
            }),
        ];
        let tight = ScriptLimitsSpec {
            max_array_size: 5,
            max_map_size: 3,
            max_string_size: weir_schema::units::SizeSpec(6),
            max_operations: 400,
            ..ScriptLimitsSpec::default()
        };
        let mut completed = 0;
        for (body, native) in bodies {
            let text = format!("fn process(r) {{ {body} }}");
            assert_eq!(script(&ScriptLimitsSpec::default(), &text).runs_natively("process"), *native, "{text}");
            for limits in [ScriptLimitsSpec::default(), tight.clone()] {
                for max_outputs in [2, 10] {
                    completed += differential(&text, &limits, &states, &init, &records, max_outputs);
                }
            }
        }
        assert!(completed >= 3000, "{completed} records completed natively");
    }
}
