//! Running compiled scripts: [`ScriptFn`] (one operator subtask's compiled AST, engine and
//! reused scope) and the runtime functions scripts call: `emit(r)`, `key()`, and keyed state
//! access `state_get`/`state_set`/`state_clear`, `list_push`/`list_get`,
//! `map_put`/`map_get`/`map_remove`.
//!
//! Those functions reach the current operator through a thread-local frame that
//! [`with_frame`] installs around a synchronous batch of calls (so no lock is taken per call
//! and nothing crosses an `.await`). Outside a frame they fail with a script error.

use std::cell::RefCell;
use std::sync::Arc;

use rhai::{
    AST, Array, CallFnOptions, Dynamic, Engine, EvalAltResult, FuncArgs, ImmutableString, Position,
    Scope,
};
use weir_schema::ScriptLimitsSpec;

use crate::record::Key;
use crate::state::{StateBackend, StateId};

/// One compiled script, ready to call per record.
pub struct ScriptFn {
    engine: Arc<Engine>,
    ast: Arc<AST>,
    scope: Scope<'static>,
}

impl ScriptFn {
    /// Wraps a compiled script; each subtask gets its own (the AST and engine are shared).
    pub fn new(engine: Arc<Engine>, ast: Arc<AST>) -> Self {
        Self {
            engine,
            ast,
            scope: Scope::new(),
        }
    }

    /// Calls `name` with `args`; a script error, thrown value or sandbox breach becomes the
    /// message (with its script position).
    ///
    /// # Errors
    /// The script's error as text.
    pub fn call(&mut self, name: &str, args: impl FuncArgs) -> Result<Dynamic, String> {
        let options = CallFnOptions::new().eval_ast(false).rewind_scope(true);
        self.engine
            .call_fn_with_options::<Dynamic>(options, &mut self.scope, &self.ast, name, args)
            .map_err(|e| describe(&e))
    }

    /// Whether the script defines `name` with `arity` parameters.
    pub fn defines(&self, name: &str, arity: usize) -> bool {
        super::defines(&self.ast, name, arity)
    }
}

fn describe(e: &EvalAltResult) -> String {
    let text = e.to_string();
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

#[derive(Default)]
struct Frame {
    active: bool,
    key: Option<Key>,
    emitted: Vec<Dynamic>,
    state: Option<Box<dyn StateBackend>>,
    names: Vec<(String, StateId)>,
}

thread_local! {
    static FRAME: RefCell<Frame> = RefCell::new(Frame::default());
}

/// Runs `f` with a frame holding the operator's state and declared state names; returns `f`'s
/// result. The state is moved into the frame and back, so it is never shared.
pub fn with_frame<R>(
    state: &mut Option<Box<dyn StateBackend>>,
    names: &[(String, StateId)],
    f: impl FnOnce() -> R,
) -> R {
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        fr.active = true;
        fr.state = state.take();
        fr.names.clear();
        fr.names.extend(names.iter().cloned());
    });
    let out = f();
    FRAME.with(|fr| {
        let mut fr = fr.borrow_mut();
        *state = fr.state.take();
        fr.active = false;
        fr.key = None;
    });
    out
}

/// Sets the key the next calls see (inside [`with_frame`]).
pub fn set_key(key: Option<Key>) {
    FRAME.with(|fr| fr.borrow_mut().key = key);
}

/// Takes the records emitted with `emit` so far.
pub fn take_emitted(out: &mut Vec<Dynamic>) {
    FRAME.with(|fr| out.append(&mut fr.borrow_mut().emitted));
}

/// Discards emitted records (after a failed call).
pub fn discard_emitted() {
    FRAME.with(|fr| fr.borrow_mut().emitted.clear());
}

type Res<T> = Result<T, Box<EvalAltResult>>;

fn err<T>(msg: String) -> Res<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(msg),
        Position::NONE,
    )))
}

/// Runs `f` on the frame's state backend, the current key and the handle of state `name`.
fn with_state<T>(
    name: &str,
    f: impl FnOnce(&mut dyn StateBackend, &Key, StateId) -> crate::runtime::error::Result<T>,
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
        f(state, key, id).or_else(|e| err(e.to_string()))
    })
}

fn register(engine: &mut Engine) {
    engine.register_fn("emit", |r: Dynamic| -> Res<()> {
        FRAME.with(|fr| {
            let mut fr = fr.borrow_mut();
            if !fr.active {
                return err("`emit` is only available in a `process` operator".to_owned());
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
        with_state(&name, |s, k, id| Ok(s.get(id, k)?.unwrap_or(Dynamic::UNIT)))
    });
    engine.register_fn(
        "state_set",
        |name: ImmutableString, v: Dynamic| -> Res<()> {
            with_state(&name, |s, k, id| s.put(id, k, v))
        },
    );
    engine.register_fn("state_clear", |name: ImmutableString| -> Res<()> {
        with_state(&name, |s, k, id| s.clear(id, k))
    });
    engine.register_fn(
        "list_push",
        |name: ImmutableString, v: Dynamic| -> Res<()> {
            with_state(&name, |s, k, id| s.list_push(id, k, v))
        },
    );
    engine.register_fn("list_get", |name: ImmutableString| -> Res<Array> {
        with_state(&name, |s, k, id| {
            Ok(s.get(id, k)?
                .and_then(|d| d.into_array().ok())
                .unwrap_or_default())
        })
    });
    engine.register_fn(
        "map_put",
        |name: ImmutableString, field: ImmutableString, v: Dynamic| -> Res<()> {
            with_state(&name, |s, k, id| s.map_put(id, k, &field, v))
        },
    );
    engine.register_fn(
        "map_get",
        |name: ImmutableString, field: ImmutableString| -> Res<Dynamic> {
            with_state(&name, |s, k, id| {
                Ok(s.map_get(id, k, &field)?.unwrap_or(Dynamic::UNIT))
            })
        },
    );
    engine.register_fn(
        "map_remove",
        |name: ImmutableString, field: ImmutableString| -> Res<()> {
            with_state(&name, |s, k, id| s.map_remove(id, k, &field))
        },
    );
}
