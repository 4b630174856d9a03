//! Running compiled scripts: [`ScriptFn`] (one operator subtask's compiled AST, engine and
//! reused scope) and the runtime functions scripts call: `emit(r)`, `key()`, keyed state
//! access `state_get`/`state_set`/`state_clear`, `list_push`/`list_get`,
//! `map_put`/`map_get`/`map_remove`, and in `process` the timer functions
//! (`register_event_timer`, ...), `now()` and `watermark()`.
//!
//! Those functions reach the current operator through a thread-local frame that
//! [`with_frame`] installs around a synchronous batch of calls (so no lock is taken per call
//! and nothing crosses an `.await`). Outside a frame they fail with a script error. A
//! `process` operator adds its [`ProcessContext`] to the frame: the processing time and
//! watermark scripts see, its states' time-to-live (applied on every state access) and
//! whether timers may be set; the timers a call sets or deletes wait in the frame as
//! [`TimerOp`]s until the operator applies them ([`take_timer_ops`]).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rhai::{
    AST, Array, Caches, CallFnOptions, Dynamic, Engine, EvalAltResult, FuncArgs, ImmutableString, Map,
    ParseError, Position, Scope,
};
use weir_schema::ScriptLimitsSpec;
use weir_schema::span::offset_of;

use super::errors::{self, ScriptOrigin};
use super::fast::FastExpr;
use super::native::{NativeProgram, Scratch};
use crate::record::Key;
use crate::state::timers::TimeDomain;
use crate::state::ttl::{Access, Ttl};
use crate::state::{StateBackend, StateId};

/// A script compiled for the runtime: the whole AST, plus the body of each of its functions
/// compiled on its own as a top-level program (see [`ScriptFn::invoke`]). Built once per
/// operator at plan time and shared by its subtasks.
pub struct CompiledScript {
    ast: AST,
    bodies: Vec<FnBody>,
    /// The script's text, to name what a failing expression read (see [`missing_field`]).
    text: String,
    /// Where the script sits in its file, for error positions (`None`: script positions).
    origin: Option<Arc<ScriptOrigin>>,
}

/// One script function's body as a program whose free variables are the parameters.
///
/// Its text is the script's own with everything before the body blanked out (newlines kept),
/// so the positions in its errors are the script's positions.
struct FnBody {
    name: String,
    params: Vec<String>,
    program: AST,
    /// The native evaluation of a simple body, tried first.
    fast: Option<FastExpr>,
    /// The native run of a statement body, tried first by [`ScriptFn::run_process`].
    native: Option<NativeProgram>,
}

impl CompiledScript {
    /// Compiles `text` with the pipeline's runtime engine.
    ///
    /// # Errors
    /// Rhai's parse error, with its position in the script.
    pub fn compile(engine: &Engine, text: &str) -> Result<Self, Box<ParseError>> {
        super::on_script_stack(|| Self::compile_here(engine, text)).unwrap_or_else(|e| {
            Err(Box::new(ParseError(
                Box::new(rhai::ParseErrorType::BadInput(rhai::LexError::Runtime(
                    format!("cannot start a thread to compile the script: {e}"),
                ))),
                Position::NONE,
            )))
        })
    }

    fn compile_here(engine: &Engine, text: &str) -> Result<Self, Box<ParseError>> {
        let ast = super::compile(engine, text)?;
        let functions = ast.clone_functions_only();
        let bodies = ast
            .iter_fn_def()
            .filter_map(|def| FnBody::compile(engine, text, &functions, def))
            .collect();
        Ok(Self {
            ast,
            bodies,
            text: text.to_owned(),
            origin: None,
        })
    }

    /// The script as found at `origin` in its file: run-time errors name that file's line
    /// and column.
    #[must_use]
    pub fn at(mut self, origin: Option<Arc<ScriptOrigin>>) -> Self {
        self.origin = origin;
        self
    }

    fn body(&self, name: &str, arity: usize) -> Option<(usize, &FnBody)> {
        self.bodies
            .iter()
            .enumerate()
            .find(|(_, b)| b.name == name && b.params.len() == arity)
    }

    /// How many functions run through [`ScriptFn::invoke`]'s fast path (for tests).
    #[cfg(test)]
    fn inlined(&self) -> usize {
        self.bodies.len()
    }

    /// Function `name`'s native evaluation alone (for tests).
    #[cfg(test)]
    pub(crate) fn native_eval(&self, name: &str, args: &[Dynamic]) -> Option<Dynamic> {
        self.body(name, args.len())?.1.native(args)
    }

    /// Function `name`'s native evaluation for a caller done with `args` (for tests).
    #[cfg(test)]
    pub(crate) fn native_eval_owned(&self, name: &str, args: &mut [Dynamic]) -> Option<Dynamic> {
        self.body(name, args.len())?.1.native_owned(args)
    }

    /// Whether function `name`'s statement body runs natively when its records allow (for
    /// tests).
    #[cfg(any(test, feature = "testkit"))]
    pub fn runs_natively(&self, name: &str) -> bool {
        self.bodies
            .iter()
            .any(|b| b.name == name && b.native.is_some())
    }

    /// Function `name`'s native statement body (for tests).
    #[cfg(test)]
    pub(crate) fn native_program(&self, name: &str) -> Option<&NativeProgram> {
        self.bodies.iter().find(|b| b.name == name)?.native.as_ref()
    }

    /// Whether function `name` is evaluated natively when its records allow (for tests).
    #[cfg(test)]
    pub(crate) fn native(&self, name: &str) -> bool {
        self.bodies
            .iter()
            .any(|b| b.name == name && b.fast.is_some())
    }
}

impl FnBody {
    /// The native evaluation, when the body has one and it can answer for `args`.
    fn native(&self, args: &[Dynamic]) -> Option<Dynamic> {
        self.fast.as_ref()?.eval(args)
    }

    /// [`native`](Self::native) for a caller done with `args` after a success (see
    /// [`FastExpr::eval_owned`]).
    fn native_owned(&self, args: &mut [Dynamic]) -> Option<Dynamic> {
        self.fast.as_ref()?.eval_owned(args)
    }

    /// `None` when the body cannot be cut out exactly (the function is then called as usual).
    fn compile(
        engine: &Engine,
        text: &str,
        functions: &AST,
        def: &rhai::ScriptFuncDef,
    ) -> Option<Self> {
        let body = body_program(engine, text, def)?;
        let params: Vec<String> = def.params.iter().map(ToString::to_string).collect();
        // `"f" in m` calls `contains`, which the native path takes to be Rhai's own.
        let own_contains = functions.iter_fn_def().any(|f| f.name == rhai::OP_CONTAINS);
        let fast = (!own_contains)
            .then(|| FastExpr::compile(engine, &body, &params))
            .flatten();
        let own: Vec<String> = functions.iter_fn_def().map(|f| f.name.to_string()).collect();
        let native = fast
            .is_none()
            .then(|| NativeProgram::compile(engine, &body, &params, &own))
            .flatten();
        Some(Self {
            name: def.name.to_string(),
            params,
            program: body.merge(functions),
            fast,
            native,
        })
    }
}

/// The body of function `def` of the script `text` as a program of its own: the script's text
/// with everything before the body blanked out (newlines kept, so positions stay the
/// script's); `None` when the body cannot be cut out exactly.
fn body_program(engine: &Engine, text: &str, def: &rhai::ScriptFuncDef) -> Option<AST> {
    // Clamped offsets: a position off the text fails the brace checks below.
    let offset = |pos: Position| Some(offset_of(text, pos.line()?, pos.position()?));
    let start = offset(def.body.start_position())?;
    let close = offset(def.body.end_position())?;
    if !text[start..].starts_with('{') || !text[close..].starts_with('}') || close < start {
        return None;
    }
    let mut program: String = text[..start]
        .chars()
        .map(|c| if c.is_whitespace() { c } else { ' ' })
        .collect();
    program.push_str(&text[start..=close]);
    engine.compile(&program).ok()
}

/// How [`ScriptFn::invoke_as`] calls a body.
#[derive(Clone, Copy, Default)]
struct Call {
    /// The caller drops the arguments after a success ([`ScriptFn::invoke_owned`]).
    owned: bool,
    /// An error hands the arguments back as they were ([`ScriptFn::invoke_keeping`]).
    keep: bool,
}

/// Runs `body` with `args` moved into `scope` as its parameters, and moves them back.
///
/// `caches` are Rhai's function-resolution caches for this body, kept from call to call: a
/// fresh cache per call (as `eval_ast_with_scope` makes) resolves every function call of the
/// body by name and argument types on every record, which dominated short state-heavy bodies.
/// The body's program, and so every function it can reach, is the same on every call, so a
/// resolution stays valid; the operation budget is still counted per call (a new
/// [`rhai::GlobalRuntimeState`] each time).
fn run_body(
    engine: &Engine,
    scope: &mut Scope<'static>,
    caches: &mut Caches,
    body: &FnBody,
    args: &mut [Dynamic],
) -> Result<Dynamic, Box<EvalAltResult>> {
    let base = scope.len();
    for (param, arg) in body.params.iter().zip(args.iter_mut()) {
        scope.push(param.as_str(), std::mem::take(arg));
    }
    let mut global = engine.new_global_runtime_state();
    global.lib.push(body.program.shared_lib().clone());
    let depth = caches.fn_resolution_caches_len();
    #[allow(deprecated)] // The one public way to evaluate statements with caches of our own.
    let result = engine.eval_statements_raw(&mut global, caches, scope, body.program.statements());
    caches.rewind_fn_resolution_caches(depth);
    scope.rewind(base + args.len());
    for (param, arg) in body.params.iter().zip(args.iter_mut()).rev() {
        *arg = scope.remove::<Dynamic>(param).unwrap_or_default();
    }
    scope.rewind(base);
    result
}

/// One compiled script, ready to call per record.
pub struct ScriptFn {
    engine: Arc<Engine>,
    script: Arc<CompiledScript>,
    scope: Scope<'static>,
    /// Rhai's function-resolution caches, one per body of [`CompiledScript`] (see
    /// [`run_body`]).
    caches: Vec<Caches>,
    /// The buffers of native runs ([`NativeProgram`]), kept from record to record.
    scratch: Scratch,
    /// Whether native runs are tried (tests turn them off to compare with Rhai).
    natively: bool,
}

impl ScriptFn {
    /// Wraps a compiled script; each subtask gets its own (the script and engine are shared).
    pub fn new(engine: Arc<Engine>, script: Arc<CompiledScript>) -> Self {
        let caches = script.bodies.iter().map(|_| Caches::new()).collect();
        Self {
            engine,
            script,
            scope: Scope::new(),
            caches,
            scratch: Scratch::default(),
            natively: true,
        }
    }

    /// Whether function `name`'s statement body runs natively when its records allow.
    #[cfg(any(test, feature = "testkit"))]
    pub fn runs_natively(&self, name: &str) -> bool {
        self.script.runs_natively(name)
    }

    /// How many calls completed natively through [`run_process`](Self::run_process) (for
    /// tests).
    #[cfg(any(test, feature = "testkit"))]
    pub fn native_runs(&self) -> u64 {
        self.scratch.completed
    }

    /// Turns native runs of statement bodies off or on (for differential tests).
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_native(&mut self, on: bool) {
        self.natively = on;
    }

    /// Calls `name` for its effects (state writes, `emit`), as a `process` operator does: a
    /// statement body runs natively first ([`NativeProgram`]: its effects are applied only
    /// when it completes; when it gives up, the record runs through Rhai as by
    /// [`invoke`](Self::invoke)). The function's value is not returned.
    ///
    /// # Errors
    /// The script's error as text (with its script position), or a state backend error
    /// while a native run's writes are applied.
    pub fn run_process(&mut self, name: &str, args: &mut [Dynamic]) -> Result<(), String> {
        if self.natively
            && let Some((_, body)) = self.script.body(name, args.len())
            && let Some(native) = &body.native
            && let Some(done) = native.run(args, &mut self.scratch)
        {
            return done;
        }
        self.invoke(name, args).map(|_| ())
    }

    /// Calls `name` with `args`; a script error, thrown value or sandbox breach becomes the
    /// message (with its script position).
    ///
    /// # Errors
    /// The script's error as text.
    pub fn call(&mut self, name: &str, args: impl FuncArgs) -> Result<Dynamic, String> {
        let mut values = Vec::new();
        args.parse(&mut values);
        self.call_on_copy(name, &values)
    }

    /// [`call`](Self::call) on copies of `args`, which stay for the error's explanation.
    fn call_on_copy(&mut self, name: &str, args: &[Dynamic]) -> Result<Dynamic, String> {
        let options = CallFnOptions::new().eval_ast(false).rewind_scope(true);
        self.engine
            .call_fn_with_options::<Dynamic>(
                options,
                &mut self.scope,
                &self.script.ast,
                name,
                args.to_vec(),
            )
            .map_err(|e| {
                let params: Vec<String> = self
                    .script
                    .ast
                    .iter_fn_def()
                    .find(|f| f.name == name && f.params.len() == args.len())
                    .map(|f| f.params.iter().map(ToString::to_string).collect())
                    .unwrap_or_default();
                explain(&e, &self.script, &params, args)
            })
    }

    /// Calls `name` on the hot path and hands the arguments back in `args`, as the script left
    /// them when it fails (after a success their contents are unspecified: the native path of
    /// a body that assigns to its parameters' properties leaves them unchanged).
    ///
    /// Two things make it cheaper than [`call`](Self::call):
    /// - a simple body is first evaluated natively ([`FastExpr`]), which only reads `args`;
    /// - otherwise the function's body runs with the arguments placed in the scope by value,
    ///   which skips Rhai's per-call function set-up, and the arguments come back afterwards.
    ///   A script function consumes its arguments, so keeping a record for an error report
    ///   used to take a deep clone per call.
    ///
    /// Either way the script sees exactly what the function would: its parameters, the
    /// script's other functions and no other variables. A function whose body could not be cut
    /// out is called as usual, on clones.
    ///
    /// # Errors
    /// The script's error as text (with its script position).
    pub fn invoke(&mut self, name: &str, args: &mut [Dynamic]) -> Result<Dynamic, String> {
        self.invoke_as(name, args, Call::default())
    }

    /// [`invoke`](Self::invoke) for a caller that drops `args` after a success: the native
    /// path may then take the argument it returns instead of copying it
    /// ([`FastExpr::eval_owned`]), as a reduce does with its accumulator.
    ///
    /// # Errors
    /// As [`invoke`](Self::invoke).
    pub fn invoke_owned(&mut self, name: &str, args: &mut [Dynamic]) -> Result<Dynamic, String> {
        let call = Call {
            owned: true,
            ..Call::default()
        };
        self.invoke_as(name, args, call)
    }

    /// [`invoke`](Self::invoke) for a caller that goes on with its arguments when the call
    /// fails, as an operator that reports a failed record as it came (`on_error:
    /// dead_letter`): after an error, `args` hold their values from before the call. The
    /// copies that takes are made only when Rhai runs the body: the native path leaves `args`
    /// untouched when it cannot answer, and a body called as usual runs on copies.
    ///
    /// # Errors
    /// As [`invoke`](Self::invoke).
    pub fn invoke_keeping(&mut self, name: &str, args: &mut [Dynamic]) -> Result<Dynamic, String> {
        let call = Call {
            keep: true,
            ..Call::default()
        };
        self.invoke_as(name, args, call)
    }

    /// [`invoke_owned`](Self::invoke_owned) that keeps the arguments as
    /// [`invoke_keeping`](Self::invoke_keeping) does, as a reduce keeps a failed record's
    /// accumulator.
    ///
    /// # Errors
    /// As [`invoke`](Self::invoke).
    pub fn invoke_owned_keeping(
        &mut self,
        name: &str,
        args: &mut [Dynamic],
    ) -> Result<Dynamic, String> {
        let call = Call {
            owned: true,
            keep: true,
        };
        self.invoke_as(name, args, call)
    }

    fn invoke_as(&mut self, name: &str, args: &mut [Dynamic], call: Call) -> Result<Dynamic, String> {
        let Some((i, body)) = self.script.body(name, args.len()) else {
            return self.call_on_copy(name, args);
        };
        let native = if call.owned {
            body.native_owned(args)
        } else {
            body.native(args)
        };
        if let Some(value) = native {
            return Ok(value);
        }
        let kept = call.keep.then(|| args.to_vec());
        run_body(&self.engine, &mut self.scope, &mut self.caches[i], body, args).map_err(|e| {
            let message = explain(&e, &self.script, &body.params, args);
            for (arg, before) in args.iter_mut().zip(kept.into_iter().flatten()) {
                *arg = before;
            }
            message
        })
    }

    /// [`invoke`](Self::invoke) for an operator that passes its records on unchanged: the
    /// script gets copies, made only when the native path cannot answer.
    ///
    /// # Errors
    /// The script's error as text (with its script position).
    pub fn invoke_on_copy(&mut self, name: &str, args: &[Dynamic]) -> Result<Dynamic, String> {
        match self.script.body(name, args.len()) {
            Some((i, body)) => match body.native(args) {
                Some(value) => Ok(value),
                None => {
                    let mut copies = args.to_vec();
                    let caches = &mut self.caches[i];
                    run_body(&self.engine, &mut self.scope, caches, body, &mut copies)
                        .map_err(|e| explain(&e, &self.script, &body.params, &copies))
                }
            },
            None => self.call_on_copy(name, args),
        }
    }

    /// Whether the script defines `name` with `arity` parameters.
    pub fn defines(&self, name: &str, arity: usize) -> bool {
        super::defines(&self.script.ast, name, arity)
    }
}

/// The message of a script error (see [`errors`]): what went wrong ([`describe`]; for a
/// missing field its name and the fields the record, or map, it was read from has, when the
/// expression is a property chain on one of the function's parameters, `r.a.b`: `args` are the
/// parameters' values as the script left them), the file position, a code and a help line.
fn explain(
    e: &EvalAltResult,
    script: &CompiledScript,
    params: &[String],
    args: &[Dynamic],
) -> String {
    let e = errors::innermost(e);
    let pos = e.position();
    let explained = match e {
        EvalAltResult::ErrorPropertyNotFound(name, pos) => {
            let has = match missing_field(&script.text, *pos, params, args) {
                Some(fields) if fields.is_empty() => "; the record has no fields".to_owned(),
                Some(fields) => format!("; the record has: {}", fields.join(", ")),
                None => String::new(),
            };
            errors::missing_field(format!("{MISSING_FIELD}`{name}`{has}"), name)
        }
        _ => {
            let text = describe(e);
            match text.find(super::strict::MISMATCH) {
                Some(at) => errors::mismatch(text[at..].to_owned()),
                None => errors::other(e, text),
            }
        }
    };
    errors::render(&explained, pos, script.origin.as_deref())
}

/// The start of the message of a missing field error.
pub const MISSING_FIELD: &str = "missing field ";

/// The fields of the map a property chain on a parameter (`r.a.missing`) read `missing` from,
/// found from the script text before the property at `pos`; `None` when the expression is not
/// such a chain.
fn missing_field(
    text: &str,
    pos: Position,
    params: &[String],
    args: &[Dynamic],
) -> Option<Vec<String>> {
    let offset = offset_of(text, pos.line()?, pos.position()?);
    let mut before = text.get(..offset)?.trim_end();
    let mut chain = Vec::new();
    loop {
        before = before.strip_suffix('.')?.trim_end();
        let start = before
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_alphanumeric() || *c == '_')
            .last()
            .map(|(i, _)| i)?;
        chain.push(&before[start..]);
        before = before[..start].trim_end();
        if !before.ends_with('.') {
            break;
        }
    }
    let (root, path) = chain.split_last()?;
    let index = params.iter().position(|p| p == root)?;
    let mut value = args.get(index)?.clone();
    for field in path.iter().rev() {
        let next = value.as_map_ref().ok()?.get(*field)?.clone();
        value = next;
    }
    let map = value.as_map_ref().ok()?;
    Some(map.keys().map(ToString::to_string).collect())
}

fn describe(e: &EvalAltResult) -> String {
    let text = errors::bare_text(e);
    match e {
        EvalAltResult::ErrorTooManyOperations(_) => {
            format!(
                "{text} (the script exceeded `limits.max_operations` for one record: an endless loop?)"
            )
        }
        EvalAltResult::ErrorDataTooLarge(..) => {
            format!("{text} (the script exceeded a size limit in `limits:`)")
        }
        EvalAltResult::ErrorStackOverflow(_) => {
            format!("{text} (the script exceeded `limits.max_call_levels`)")
        }
        _ => text,
    }
}

/// The sandboxed engine of a pipeline with the runtime functions registered.
pub fn runtime_engine(limits: &ScriptLimitsSpec) -> Engine {
    let mut engine = super::build_engine(limits);
    register(&mut engine);
    engine
}

thread_local! {
    /// The pipeline and operator whose script this thread runs (see [`running`]).
    static RUNNING: RefCell<Option<(Arc<str>, Arc<str>)>> = const { RefCell::new(None) };
}

/// Tells the script layer that the scripts this thread runs from now on belong to
/// `operator` of `pipeline`, for the log lines of `print` and `debug`. The task calls it
/// before each call into an operator; it costs nothing when the operator is the same.
pub fn running(pipeline: &Arc<str>, operator: &Arc<str>) {
    RUNNING.with(|r| {
        let mut r = r.borrow_mut();
        if r.as_ref()
            .is_some_and(|(p, o)| Arc::ptr_eq(p, pipeline) && Arc::ptr_eq(o, operator))
        {
            return;
        }
        *r = Some((Arc::clone(pipeline), Arc::clone(operator)));
    });
}

fn with_running(f: impl FnOnce(&str, &str)) {
    RUNNING.with(|r| match &*r.borrow() {
        Some((p, o)) => f(p, o),
        None => f("?", "?"),
    });
}

/// Rhai's `print(text)`: an INFO log line (target `weir::script`), never stdout.
pub(crate) fn log_print(text: &str) {
    with_running(|pipeline, operator| {
        tracing::info!(target: "weir::script", %pipeline, %operator, "{text}");
    });
}

/// Rhai's `debug(value)`: a DEBUG log line (target `weir::script`) with the script position,
/// never stdout.
pub(crate) fn log_debug(text: &str, _source: Option<&str>, pos: Position) {
    with_running(|pipeline, operator| {
        tracing::debug!(target: "weir::script", %pipeline, %operator, position = %pos, "{text}");
    });
}

#[derive(Default)]
struct Frame {
    active: bool,
    /// Which [`with_frame`] call this is, unique in the process (see [`StateAccess::frame`]).
    serial: u64,
    key: Option<Key>,
    emitted: Vec<Dynamic>,
    /// Most records one call may `emit`; `0`: `emit` is not available.
    max_outputs: usize,
    /// A call tried to emit more than `max_outputs` records.
    over_budget: bool,
    state: Option<Box<dyn StateBackend>>,
    names: Vec<(String, StateId)>,
    /// Set by a `process` operator ([`set_process_context`]).
    process: Option<ProcessContext>,
    /// Timers set or deleted since the operator last took them.
    timer_ops: Vec<TimerOp>,
}

/// What a `process` operator adds to the frame of its calls.
#[derive(Clone, Debug, Default)]
pub struct ProcessContext {
    /// Processing time (epoch milliseconds) for `now()` and state time-to-live.
    pub now: i64,
    /// The operator's current watermark, for `watermark()`.
    pub watermark: i64,
    /// The time-to-live of its states, applied on every state access.
    pub ttl: Option<Arc<Ttl>>,
    /// Whether the script defines `fn on_timer(ts, kind)`, so that timers may be set.
    pub timers: bool,
}

/// A timer a script set or deleted, for the current key at the time of the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimerOp {
    /// `true`: set; `false`: delete.
    pub set: bool,
    /// Event or processing time.
    pub domain: TimeDomain,
    /// The key the call ran for.
    pub key: Key,
    /// When the timer fires (epoch milliseconds).
    pub time: i64,
}

thread_local! {
    static FRAME: RefCell<Frame> = RefCell::new(Frame::default());
}

/// The serial of the next [`with_frame`] call, over every thread.
static NEXT_FRAME: AtomicU64 = AtomicU64::new(1);

/// Runs `f` with a frame holding the operator's state and declared state names; returns `f`'s
/// result. The state is moved into the frame and back, so it is never shared. `max_outputs`
/// is how many records one call may `emit` (`limits.max_outputs_per_record`); `0` makes `emit`
/// unavailable (operators other than `process`).
pub fn with_frame<R>(
    state: &mut Option<Box<dyn StateBackend>>,
    names: &[(String, StateId)],
    max_outputs: usize,
    f: impl FnOnce() -> R,
) -> R {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        fr.active = true;
        fr.serial = NEXT_FRAME.fetch_add(1, Ordering::Relaxed);
        fr.state = state.take();
        fr.names.clear();
        fr.names.extend(names.iter().cloned());
        fr.max_outputs = max_outputs;
        fr.emitted.clear();
        fr.over_budget = false;
    });
    let out = f();
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        *state = fr.state.take();
        fr.active = false;
        fr.key = None;
        fr.max_outputs = 0;
        fr.emitted = Vec::new();
        fr.process = None;
        fr.timer_ops = Vec::new();
    });
    out
}

/// Gives the calls of the current frame (inside [`with_frame`]) a `process` operator's
/// context; [`with_frame`] drops it at its end.
pub fn set_process_context(cx: ProcessContext) {
    FRAME.with(|fr| fr.borrow_mut().process = Some(cx));
}

/// Takes the timers the calls since the last take set or deleted, in call order.
pub fn take_timer_ops() -> Vec<TimerOp> {
    FRAME.with(|fr| std::mem::take(&mut fr.borrow_mut().timer_ops))
}

/// Runs `f` on the frame's state backend (inside [`with_frame`]); `None` when the frame holds
/// none.
pub fn with_frame_state<R>(f: impl FnOnce(&mut dyn StateBackend) -> R) -> Option<R> {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        let state: &mut dyn StateBackend = fr.state.as_deref_mut()?;
        Some(f(state))
    })
}

/// Sets the key the next calls see (inside [`with_frame`]).
pub fn set_key(key: Option<Key>) {
    FRAME.with(|fr| fr.borrow_mut().key = key);
}

/// Takes the records the call that just succeeded emitted with `emit`.
///
/// # Errors
/// When the call tried to emit more than `limits.max_outputs_per_record` records (even if the
/// script caught the error `emit` raised): nothing is taken and the record has failed.
pub fn take_emitted(out: &mut Vec<Dynamic>) -> Result<(), String> {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        if fr.over_budget {
            let max = fr.max_outputs;
            fr.emitted.clear();
            fr.over_budget = false;
            return Err(over_budget(max));
        }
        out.append(&mut fr.emitted);
        Ok(())
    })
}

/// Discards emitted records (after a failed call).
pub fn discard_emitted() {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        fr.emitted.clear();
        fr.over_budget = false;
    });
}

fn over_budget(max: usize) -> String {
    format!(
        "`emit` was called for more than {max} records for one input record \
         (`limits.max_outputs_per_record`)"
    )
}

type Res<T> = Result<T, Box<EvalAltResult>>;

fn err<T>(msg: String) -> Res<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(msg),
        Position::NONE,
    )))
}

/// Runs `f` on the frame's state backend, the current key and the handle of state `name`;
/// `access` says how `f` uses the value, for the state's time-to-live (an expired value is
/// removed before `f` sees it).
fn with_state<T>(
    name: &str,
    access: Access,
    f: impl FnOnce(&mut dyn StateBackend, &Key, StateId) -> crate::base::error::Result<T>,
) -> Res<T> {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        let fr = &mut *fr;
        if !fr.active {
            return err(
                "state functions are only available inside a keyed `process` operator".to_owned(),
            );
        }
        let Some(id) = fr.names.iter().find(|(n, _)| n == name).map(|(_, id)| *id) else {
            let declared: Vec<&str> = fr.names.iter().map(|(n, _)| n.as_str()).collect();
            return err(format!(
                "state `{name}` is not declared in the operator's `state:` (declared: {})",
                declared.join(", ")
            ));
        };
        let (Some(state), Some(key)) = (fr.state.as_deref_mut(), fr.key.as_ref()) else {
            return err("state is only available while processing a keyed record".to_owned());
        };
        let ttl = fr
            .process
            .as_ref()
            .and_then(|p| Some((p.ttl.as_deref()?, p.now)));
        if let Some((ttl, now)) = ttl {
            ttl.expire_if_due(state, id, key, now)
                .or_else(|e| err(e.to_string()))?;
        }
        let out = f(state, key, id).or_else(|e| err(e.to_string()))?;
        if let Some((ttl, now)) = ttl {
            ttl.touched(state, id, key, now, access)
                .or_else(|e| err(e.to_string()))?;
        }
        Ok(out)
    })
}

/// What a native `process` run ([`super::native`]) reads and, once it completed, writes: the
/// frame's state backend, the current key, the declared states and the records emitted so far.
pub(crate) struct StateAccess<'a> {
    pub state: &'a mut dyn StateBackend,
    pub key: &'a Key,
    pub names: &'a [(String, StateId)],
    /// The frame's serial: `names` stays the same while it does, so handles resolved from
    /// them may be kept from record to record.
    pub frame: u64,
    pub emitted: &'a mut Vec<Dynamic>,
    /// Most records one call may `emit` (`0`: `emit` is not available).
    pub max_outputs: usize,
}

/// Runs `f` on the current frame's [`StateAccess`]; `None` (and `f` is not run) whenever a
/// state function could do anything but read or write the backend: outside a frame, without a
/// key or a backend, with a state time-to-live (every access renews or expires values), or
/// after an `emit` over the budget.
pub(crate) fn with_state_access<R>(f: impl FnOnce(StateAccess<'_>) -> Option<R>) -> Option<R> {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        let fr = &mut *fr;
        if !fr.active || fr.over_budget || fr.process.as_ref().is_some_and(|p| p.ttl.is_some()) {
            return None;
        }
        let (Some(state), Some(key)) = (fr.state.as_deref_mut(), fr.key.as_ref()) else {
            return None;
        };
        f(StateAccess {
            state,
            key,
            names: &fr.names,
            frame: fr.serial,
            emitted: &mut fr.emitted,
            max_outputs: fr.max_outputs,
        })
    })
}

/// Queues a timer set or delete for the current key (see [`TimerOp`]).
fn timer_op(function: &str, domain: TimeDomain, set: bool, time: i64) -> Res<()> {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        let Some(process) = fr.process.as_ref().filter(|_| fr.active) else {
            return err(format!(
                "`{function}` is only available in a keyed `process` operator"
            ));
        };
        if !process.timers {
            return err(format!(
                "`{function}`: the script defines no `fn on_timer(ts, kind)` to run when the \
                 timer fires; define it"
            ));
        }
        let Some(key) = fr.key.clone() else {
            return err(format!(
                "`{function}` is only available while processing a keyed record or timer"
            ));
        };
        fr.timer_ops.push(TimerOp {
            set,
            domain,
            key,
            time,
        });
        Ok(())
    })
}

/// A value of the current `process` context.
fn process_value(function: &str, f: impl FnOnce(&ProcessContext) -> i64) -> Res<i64> {
    FRAME.with(|fr| {
        let fr = fr.borrow();
        match fr.process.as_ref().filter(|_| fr.active) {
            Some(p) => Ok(f(p)),
            None => err(format!("`{function}()` is only available in a `process` operator")),
        }
    })
}

fn register(engine: &mut Engine) {
    let sizes = SizeLimits::of(engine);
    engine.register_fn("emit", |r: Dynamic| -> Res<()> {
        FRAME.with(|fr| {
            let mut fr = fr.borrow_mut();
            if !fr.active || fr.max_outputs == 0 {
                return err("`emit` is only available in a `process` operator".to_owned());
            }
            if fr.emitted.len() >= fr.max_outputs {
                fr.over_budget = true;
                return err(over_budget(fr.max_outputs));
            }
            fr.emitted.push(r);
            Ok(())
        })
    });
    engine.register_fn("key", || -> Dynamic {
        FRAME.with(|fr| {
            fr.borrow()
                .key
                .as_ref()
                .map_or(Dynamic::UNIT, Key::to_dynamic)
        })
    });
    engine.register_fn("state_get", |name: ImmutableString| -> Res<Dynamic> {
        with_state(&name, Access::Read, |s, k, id| Ok(s.get(id, k)?.unwrap_or(Dynamic::UNIT)))
    });
    engine.register_fn(
        "state_set",
        move |name: ImmutableString, v: Dynamic| -> Res<()> {
            if let Some(e) = sizes.exceeded(data_sizes(&v)) {
                return err(format!("state_set(\"{name}\"): {e}"));
            }
            with_state(&name, Access::Write, |s, k, id| s.put(id, k, v))
        },
    );
    engine.register_fn("state_clear", |name: ImmutableString| -> Res<()> {
        with_state(&name, Access::Clear, |s, k, id| s.clear(id, k))
    });
    engine.register_fn(
        "list_push",
        move |name: ImmutableString, v: Dynamic| -> Res<()> {
            let mut item = Some(v);
            let mut refused = None;
            with_state(&name, Access::Write, |s, k, id| {
                s.update(id, k, &mut |slot| {
                    if let Some(v) = item.take() {
                        refused = push_onto(slot, v, sizes);
                    }
                })
            })?;
            match refused {
                Some(e) => err(format!(
                    "list_push(\"{name}\"): {e}; keep the list bounded with `list_trim` or `list_pop`"
                )),
                None => Ok(()),
            }
        },
    );
    engine.register_fn(
        "list_set",
        move |name: ImmutableString, items: Array| -> Res<()> {
            if let Some(e) = sizes.exceeded(array_sizes(&items)) {
                return err(format!("list_set(\"{name}\"): {e}"));
            }
            let mut items = Some(items);
            with_state(&name, Access::Write, |s, k, id| {
                s.update(id, k, &mut |slot| {
                    let Some(items) = items.take() else { return };
                    *slot = (!items.is_empty()).then(|| Dynamic::from_array(items));
                })
            })
        },
    );
    engine.register_fn(
        "list_top",
        move |name: ImmutableString, v: Dynamic, keep: i64| -> Res<bool> {
            let Ok(keep) = usize::try_from(keep) else {
                return err(format!(
                    "list_top(\"{name}\", _, {keep}): the number of items to keep cannot be negative"
                ));
            };
            let mut item = Some(v);
            let mut outcome = Ok(false);
            with_state(&name, Access::Write, |s, k, id| {
                s.update(id, k, &mut |slot| {
                    let Some(v) = item.take() else { return };
                    outcome = insert_top(slot, v, keep, sizes);
                })
            })?;
            outcome.or_else(|e| err(format!("list_top(\"{name}\"): {e}")))
        },
    );
    engine.register_fn("list_get", |name: ImmutableString| -> Res<Array> {
        with_state(&name, Access::Read, |s, k, id| {
            Ok(s.get(id, k)?
                .and_then(|d| d.into_array().ok())
                .unwrap_or_default())
        })
    });
    engine.register_fn("list_len", |name: ImmutableString| -> Res<i64> {
        with_state(&name, Access::Read, |s, k, id| Ok(count(s.list_len(id, k)?)))
    });
    engine.register_fn("list_pop", |name: ImmutableString| -> Res<Dynamic> {
        with_state(&name, Access::Write, |s, k, id| {
            Ok(s.list_pop(id, k)?.unwrap_or(Dynamic::UNIT))
        })
    });
    engine.register_fn(
        "list_trim",
        |name: ImmutableString, keep: i64| -> Res<i64> {
            let Ok(keep) = usize::try_from(keep) else {
                return err(format!(
                    "list_trim(\"{name}\", {keep}): the number of items to keep cannot be negative"
                ));
            };
            with_state(&name, Access::Write, |s, k, id| Ok(count(s.list_trim(id, k, keep)?)))
        },
    );
    engine.register_fn(
        "map_put",
        move |name: ImmutableString, field: ImmutableString, v: Dynamic| -> Res<()> {
            let mut entry = Some(v);
            let mut refused = None;
            with_state(&name, Access::Write, |s, k, id| {
                s.update(id, k, &mut |slot| {
                    if let Some(v) = entry.take() {
                        refused = put_into(slot, &field, v, sizes);
                    }
                })
            })?;
            match refused {
                Some(e) => err(format!(
                    "map_put(\"{name}\", \"{field}\"): {e}; keep the map bounded with `map_remove`"
                )),
                None => Ok(()),
            }
        },
    );
    engine.register_fn(
        "state_add",
        |name: ImmutableString, delta: Dynamic| -> Res<Dynamic> {
            let mut outcome = Ok(Dynamic::UNIT);
            with_state(&name, Access::Write, |s, k, id| {
                s.update(id, k, &mut |slot| outcome = add_in_place(slot, &delta))
            })?;
            outcome.or_else(|e| err(format!("state_add(\"{name}\"): {e}")))
        },
    );
    engine.register_fn(
        "map_add",
        move |name: ImmutableString, field: ImmutableString, delta: Dynamic| -> Res<Dynamic> {
            let mut outcome = Ok(Dynamic::UNIT);
            with_state(&name, Access::Write, |s, k, id| {
                s.update(id, k, &mut |slot| outcome = add_into(slot, &field, &delta, sizes))
            })?;
            outcome.or_else(|e| err(format!("map_add(\"{name}\", \"{field}\"): {e}")))
        },
    );
    engine.register_fn(
        "map_get",
        |name: ImmutableString, field: ImmutableString| -> Res<Dynamic> {
            with_state(&name, Access::Read, |s, k, id| {
                Ok(s.map_get(id, k, &field)?.unwrap_or(Dynamic::UNIT))
            })
        },
    );
    engine.register_fn(
        "map_remove",
        |name: ImmutableString, field: ImmutableString| -> Res<()> {
            with_state(&name, Access::Write, |s, k, id| s.map_remove(id, k, &field))
        },
    );
    engine.register_fn("map_len", |name: ImmutableString| -> Res<i64> {
        with_state(&name, Access::Read, |s, k, id| Ok(count(s.map_len(id, k)?)))
    });
    engine.register_fn("map_keys", |name: ImmutableString| -> Res<Array> {
        with_state(&name, Access::Read, |s, k, id| {
            Ok(s.map_keys(id, k)?.into_iter().map(Dynamic::from).collect())
        })
    });
    for (function, domain, set) in [
        ("register_event_timer", TimeDomain::Event, true),
        ("register_processing_timer", TimeDomain::Processing, true),
        ("delete_event_timer", TimeDomain::Event, false),
        ("delete_processing_timer", TimeDomain::Processing, false),
    ] {
        engine.register_fn(function, move |time: i64| -> Res<()> {
            timer_op(function, domain, set, time)
        });
    }
    engine.register_fn("now", || -> Res<i64> { process_value("now", |p| p.now) });
    engine.register_fn("watermark", || -> Res<i64> {
        process_value("watermark", |p| p.watermark)
    });
}

/// `old + delta` for `state_add` and `map_add`: integers (checked) or floats, an absent or
/// `()` value counting as zero.
pub(crate) fn add_to(old: Option<&Dynamic>, delta: &Dynamic) -> Result<Dynamic, String> {
    let old = old.filter(|v| !v.is_unit());
    if let Ok(d) = delta.as_int() {
        return match old.map(Dynamic::as_int) {
            None => Ok(Dynamic::from_int(d)),
            Some(Ok(o)) => o
                .checked_add(d)
                .map(Dynamic::from_int)
                .ok_or_else(|| format!("{o} + {d} overflows an integer")),
            Some(Err(t)) => Err(format!("cannot add an int to the stored {t}")),
        };
    }
    if let Ok(d) = delta.as_float() {
        return match old.map(Dynamic::as_float) {
            None => Ok(Dynamic::from_float(d)),
            Some(Ok(o)) => Ok(Dynamic::from_float(o + d)),
            Some(Err(t)) => Err(format!("cannot add a float to the stored {t}")),
        };
    }
    Err(format!(
        "the amount to add must be an int or a float, not {}",
        delta.type_name()
    ))
}

/// `state_add` on a state's value in place; the sum.
pub(crate) fn add_in_place(slot: &mut Option<Dynamic>, delta: &Dynamic) -> Result<Dynamic, String> {
    let sum = add_to(slot.as_ref(), delta)?;
    *slot = Some(sum.clone());
    Ok(sum)
}

/// `list_push` on a state's value in place; the refusal, if a size limit refuses the item.
pub(crate) fn push_onto(slot: &mut Option<Dynamic>, v: Dynamic, sizes: SizeLimits) -> Option<String> {
    let item = element_sizes(&v);
    if let Some(mut list) = slot.as_mut().and_then(|d| d.as_array_mut().ok()) {
        let refused = sizes.exceeded(add(item, array_sizes(&list)));
        if refused.is_none() {
            list.push(v);
        }
        return refused;
    }
    let refused = sizes.exceeded(item);
    if refused.is_none() {
        *slot = Some(Dynamic::from_array(vec![v]));
    }
    refused
}

/// `map_put` on a state's value in place; the refusal, if a size limit refuses the entry.
pub(crate) fn put_into(
    slot: &mut Option<Dynamic>,
    field: &str,
    v: Dynamic,
    sizes: SizeLimits,
) -> Option<String> {
    let entry = entry_sizes(&v);
    if let Some(mut map) = slot.as_mut().and_then(|d| d.as_map_mut().ok()) {
        let mut grown = add(entry, map_sizes(&map));
        if let Some(old) = map.get(field) {
            grown = sub(grown, entry_sizes(old));
        }
        let refused = sizes.exceeded(grown);
        if refused.is_none() {
            map.insert(field.into(), v);
        }
        return refused;
    }
    let refused = sizes.exceeded(entry);
    if refused.is_none() {
        let mut map = Map::new();
        map.insert(field.into(), v);
        *slot = Some(Dynamic::from_map(map));
    }
    refused
}

/// `map_add` on a state's value in place; the sum.
pub(crate) fn add_into(
    slot: &mut Option<Dynamic>,
    field: &str,
    delta: &Dynamic,
    sizes: SizeLimits,
) -> Result<Dynamic, String> {
    if let Some(mut map) = slot.as_mut().and_then(|d| d.as_map_mut().ok()) {
        if let Some(old) = map.get_mut(field) {
            // A number replaces a number: the map does not grow.
            let sum = add_to(Some(&*old), delta)?;
            *old = sum.clone();
            return Ok(sum);
        }
        let sum = add_to(None, delta)?;
        if let Some(e) = sizes.exceeded(add(entry_sizes(&sum), map_sizes(&map))) {
            return Err(format!("{e}; keep the map bounded with `map_remove`"));
        }
        map.insert(field.into(), sum.clone());
        return Ok(sum);
    }
    let sum = add_to(None, delta)?;
    if let Some(e) = sizes.exceeded(entry_sizes(&sum)) {
        return Err(e);
    }
    let mut map = Map::new();
    map.insert(field.into(), sum.clone());
    *slot = Some(Dynamic::from_map(map));
    Ok(sum)
}

/// How `list_top` orders two items: ints with ints, floats with floats, strings with strings.
fn rank(a: &Dynamic, b: &Dynamic) -> Result<std::cmp::Ordering, String> {
    if let (Ok(x), Ok(y)) = (a.as_int(), b.as_int()) {
        return Ok(x.cmp(&y));
    }
    if let (Ok(x), Ok(y)) = (a.as_float(), b.as_float()) {
        return x
            .partial_cmp(&y)
            .ok_or_else(|| "cannot rank NaN".to_owned());
    }
    if let (Ok(x), Ok(y)) = (a.as_immutable_string_ref(), b.as_immutable_string_ref()) {
        return Ok(x.as_str().cmp(y.as_str()));
    }
    Err(format!(
        "cannot rank {} against {} (ints, floats and strings rank among their own kind)",
        b.type_name(),
        a.type_name()
    ))
}

/// Inserts `v` into the list in `slot`, kept largest first, after the items equal to it, and
/// keeps the first `keep`; whether `v` stayed. A list left empty is removed.
pub(crate) fn insert_top(
    slot: &mut Option<Dynamic>,
    v: Dynamic,
    keep: usize,
    sizes: SizeLimits,
) -> Result<bool, String> {
    if let Some(d) = slot.as_ref().filter(|d| !d.is_array()) {
        return Err(format!("the stored value is a {}, not a list", d.type_name()));
    }
    let mut list = slot
        .take()
        .and_then(|d| d.into_array().ok())
        .unwrap_or_default();
    let mut at = list.len();
    let mut failed = None;
    for (i, item) in list.iter().enumerate() {
        match rank(item, &v) {
            Ok(std::cmp::Ordering::Less) => {
                at = i;
                break;
            }
            Ok(_) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let outcome = match failed {
        Some(e) => Err(e),
        None if at >= keep => Ok(false),
        None => {
            let grows = list.len() < keep;
            let scalar = element_sizes(&v) == (1, 0, 0);
            let refused = if grows || !scalar {
                let mut after = array_sizes(&list[..list.len().min(keep - 1)]);
                after = add(after, element_sizes(&v));
                sizes.exceeded(after)
            } else {
                None
            };
            match refused {
                Some(e) => Err(e),
                None => {
                    list.insert(at, v);
                    Ok(true)
                }
            }
        }
    };
    list.truncate(keep);
    *slot = (!list.is_empty()).then(|| Dynamic::from_array(list));
    outcome
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// What Rhai's size limits count in a value, nested values included: `(array items, map
/// entries, string bytes)`, exactly as Rhai does when it checks a value a script holds (a
/// string inside an array counts as one item and its bytes; map keys are not counted). A
/// state write is refused when the stored value would exceed a limit, because reading it
/// back would then fail.
pub type DataSizes = (usize, usize, usize);

/// [`DataSizes`] of a value on its own.
#[inline]
pub fn data_sizes(v: &Dynamic) -> DataSizes {
    // The common kinds first, without a call.
    if v.is_int() || v.is_float() || v.is_bool() || v.is_unit() {
        (0, 0, 0)
    } else {
        held_sizes(v)
    }
}

/// [`data_sizes`] of a value that is not a scalar.
fn held_sizes(v: &Dynamic) -> DataSizes {
    // Asked by kind first: a failed cast looks up a type name.
    if v.is_string() {
        v.as_immutable_string_ref().map_or((0, 0, 0), |s| (0, 0, s.len()))
    } else if v.is_array() {
        v.as_array_ref().map_or((0, 0, 0), |a| array_sizes(&a))
    } else if v.is_map() {
        v.as_map_ref().map_or((0, 0, 0), |m| map_sizes(&m))
    } else if v.is_blob() {
        v.as_blob_ref().map_or((0, 0, 0), |b| (b.len(), 0, 0))
    } else {
        (0, 0, 0)
    }
}

/// [`DataSizes`] of `v` inside an array or a map, not counting `v` itself (a blob counts
/// one more there).
#[inline]
fn nested_sizes(v: &Dynamic) -> DataSizes {
    if v.is_int() || v.is_bool() || v.is_unit() {
        (0, 0, 0)
    } else if v.is_blob() {
        v.as_blob_ref().map_or((0, 0, 0), |b| (b.len() + 1, 0, 0))
    } else {
        data_sizes(v)
    }
}

/// [`DataSizes`] of `v` as an item of an array (a blob inside an array counts one more).
#[inline]
pub(crate) fn element_sizes(v: &Dynamic) -> DataSizes {
    add((1, 0, 0), nested_sizes(v))
}

/// [`DataSizes`] of `v` as the value of a map entry.
#[inline]
pub(crate) fn entry_sizes(v: &Dynamic) -> DataSizes {
    add((0, 1, 0), nested_sizes(v))
}

pub(crate) fn array_sizes(a: &[Dynamic]) -> DataSizes {
    a.iter()
        .fold((0, 0, 0), |acc, v| add(acc, element_sizes(v)))
}

/// [`DataSizes`] of a map's entries.
pub(crate) fn map_sizes(m: &Map) -> DataSizes {
    m.values()
        .fold((0, 0, 0), |acc, v| add(acc, entry_sizes(v)))
}

pub(crate) fn add(a: DataSizes, b: DataSizes) -> DataSizes {
    (
        a.0.saturating_add(b.0),
        a.1.saturating_add(b.1),
        a.2.saturating_add(b.2),
    )
}

pub(crate) fn sub(a: DataSizes, b: DataSizes) -> DataSizes {
    (
        a.0.saturating_sub(b.0),
        a.1.saturating_sub(b.1),
        a.2.saturating_sub(b.2),
    )
}

/// The size limits of a pipeline's scripts (`0`: none).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SizeLimits {
    array: usize,
    map: usize,
    string: usize,
}

impl SizeLimits {
    pub(crate) fn of(engine: &Engine) -> Self {
        Self {
            array: engine.max_array_size(),
            map: engine.max_map_size(),
            string: engine.max_string_size(),
        }
    }

    /// Whether `sizes` exceeds a limit (see [`exceeded`](Self::exceeded)).
    #[inline]
    pub(crate) fn over(self, (array, map, string): DataSizes) -> bool {
        let over = |n: usize, max: usize| max > 0 && n > max;
        over(array, self.array) || over(map, self.map) || over(string, self.string)
    }

    /// Which limit `sizes` exceeds, as a sentence.
    pub(crate) fn exceeded(self, (array, map, string): DataSizes) -> Option<String> {
        let over = |n: usize, max: usize| max > 0 && n > max;
        if over(array, self.array) {
            Some(format!(
                "the state would hold {array} array items, more than `limits.max_array_size` ({})",
                self.array
            ))
        } else if over(map, self.map) {
            Some(format!(
                "the state would hold {map} map entries, more than `limits.max_map_size` ({})",
                self.map
            ))
        } else if over(string, self.string) {
            Some(format!(
                "the state would hold {string} bytes of strings, more than `limits.max_string_size` ({} bytes)",
                self.string
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script_with(limits: &ScriptLimitsSpec, text: &str) -> ScriptFn {
        let engine = Arc::new(runtime_engine(limits));
        let compiled = CompiledScript::compile(&engine, text).expect("compiles");
        ScriptFn::new(engine, Arc::new(compiled))
    }

    fn script(text: &str) -> ScriptFn {
        script_with(&ScriptLimitsSpec::default(), text)
    }

    fn record(n: i64) -> Dynamic {
        let mut m = Map::new();
        m.insert("n".into(), Dynamic::from(n));
        m.insert("user".into(), Dynamic::from("ü1"));
        Dynamic::from_map(m)
    }

    fn field(d: &Dynamic, name: &str) -> String {
        d.read_lock::<Map>().expect("a map")[name].to_string()
    }

    #[test]
    fn invoke_runs_the_body_and_hands_the_arguments_back_as_left() {
        let mut s = script(
            "fn helper(x) { x * 10 }\n\n/* a comment, ünïcödé */ fn map(r) {\n    r.n += 1;\n    #{n: helper(r.n), user: r.user}\n}\n",
        );
        assert_eq!(s.script.inlined(), 2, "both bodies are cut out");
        let mut args = [record(1)];
        let out = s.invoke("map", &mut args).expect("runs");
        assert_eq!(field(&out, "n"), "20");
        assert_eq!(field(&out, "user"), "ü1");
        assert_eq!(
            field(&args[0], "n"),
            "2",
            "the argument as the script left it"
        );
        assert_eq!(s.scope.len(), 0, "nothing stays in the scope");
    }

    #[test]
    fn invoke_matches_a_plain_call_on_results_and_errors() {
        let cases = [
            "fn f(r) { if r.n > 1 { return \"big\"; } let t = r.n; t }",
            "fn f(r) {\n  let x = 1;\n  x + r.missing.deeper\n}",
            "fn f(r) { throw \"no \" + r.n }",
            "let outer = 5;\nfn f(r) { outer + r.n }",
            "fn f(r) { r.n / (r.n - 2) }",
            "fn f(r) {}",
            "fn f(r) { this }",
            "fn f(r) { let r = 7; r }",
        ];
        for text in cases {
            let mut s = script(text);
            // `this` does not parse outside a function: that one is called as usual.
            let inlined = usize::from(!text.contains("this"));
            assert_eq!(s.script.inlined(), inlined, "{text}");
            for n in [1, 2, 3] {
                let via_call = s.call("f", (record(n),)).map(|v| format!("{v:?}"));
                let via_invoke = s.invoke("f", &mut [record(n)]).map(|v| format!("{v:?}"));
                assert_eq!(via_invoke, via_call, "{text} with n = {n}");
            }
        }
    }

    #[test]
    fn invoke_errors_point_at_the_script_line() {
        let mut s = script("// line 1\nfn f(r) {\n  let x = 1;\n  x + r.missing.deeper\n}");
        let e = s.invoke("f", &mut [record(1)]).expect_err("fails");
        assert!(e.contains("line 4"), "{e}");
    }

    #[test]
    fn the_operation_budget_is_per_invocation() {
        let limits = ScriptLimitsSpec {
            max_operations: 5_000,
            ..ScriptLimitsSpec::default()
        };
        let mut s = script_with(&limits, "fn f(r) { let i = 0; while i < r { i += 1; } i }");
        for _ in 0..10 {
            let n = s.invoke("f", &mut [Dynamic::from(300_i64)]);
            assert_eq!(n.map(|v| v.as_int().ok()), Ok(Some(300)));
        }
        let e = s
            .invoke("f", &mut [Dynamic::from(1_000_000_i64)])
            .expect_err("over budget");
        assert!(e.contains("Too many operations"), "{e}");
        assert_eq!(s.scope.len(), 0);
    }

    #[test]
    fn a_missing_field_names_the_fields_the_record_has() {
        let mut s = script("fn f(r) {\n  r.n + r.amount\n}");
        let e = s.invoke("f", &mut [record(1)]).expect_err("no amount");
        assert!(e.starts_with("missing field `amount`"), "{e}");
        assert!(e.contains("the record has: n, user") || e.contains("the record has: user, n"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let via_call = s.call("f", (record(1),)).expect_err("no amount");
        assert_eq!(via_call, e, "a plain call explains it the same way");

        let mut nested = script("fn f(r) { r.inner.x }");
        let mut m = Map::new();
        m.insert("inner".into(), record(1));
        let e = nested
            .invoke("f", &mut [Dynamic::from_map(m)])
            .expect_err("no x");
        assert!(e.contains("missing field `x`") && e.contains("n, user"), "{e}");

        let mut optional = script("fn f(r) { get(r, \"amount\", 0) + r.n }");
        let v = optional.invoke("f", &mut [record(4)]).expect("get with a default");
        assert_eq!(v.as_int(), Ok(4));
    }

    #[test]
    fn a_string_plus_an_int_is_an_error_not_a_concatenation() {
        let mut s = script("fn f(r) { (r.user + 1) > 0 }");
        let e = s.invoke_on_copy("f", &[record(1)]).expect_err("mismatch");
        assert!(e.contains("cannot apply `+` to string and int"), "{e}");
    }

    #[test]
    fn a_missing_function_is_reported_like_a_call() {
        let mut s = script("fn f(r) { r }");
        let mut args = [record(1)];
        let e = s.invoke("g", &mut args).expect_err("no g");
        assert!(e.contains("g"), "{e}");
        assert_eq!(field(&args[0], "n"), "1", "arguments survive the fallback");
    }
}
