//! `reduce` (keyed): Rhai `fn reduce(acc, r)` folds each key's records; a key's first record
//! is its initial accumulator. Emits `{<key_field>: key, ...acc}` (or `value: acc` when the
//! accumulator is not a map) after every record (`updates`) or once per key at the end
//! (`final`).
//!
//! Also home of [`migrate_keyed_state`], the savepoint `migrate` hook shared by the scripted
//! keyed operators (`reduce`, `process`, scripted `aggregate`).

use rhai::{Dynamic, Map};
use weir_schema::{EmitMode, StateKind};

use crate::base::error::{Result, RunError};
use crate::base::message::Batch;
use crate::element::{ErrorPolicy, Operator, OperatorContext};
use crate::record::{Key, excerpt};
use crate::script::runtime::{ScriptFn, set_key, with_frame};
use crate::state::{END_CHUNK, EndCursor, RecordPrefetch, StateBackend, StateId, prefetch_ahead};

/// How many records ahead of the one it folds a `reduce` hints the state backend that a key's
/// accumulator is next ([`StateBackend::prefetch`]), as `process` does (see there).
const PREFETCH_AHEAD: usize = crate::operators::process::PREFETCH_AHEAD;

/// Rewrites every restored keyed value through the script's `migrate` function, after a
/// savepoint restore (`ctx.migrate`); does nothing otherwise, or when the script defines no
/// `migrate`.
///
/// `fn migrate(old)` is preferred; `fn migrate(name, old)` (the state's name first) is used
/// when there is no one-parameter form. It runs once per key and state with `key()` giving
/// the key (other state functions are not available: `migrate` is a pure function of the old
/// value); returning `()` deletes the value. A list state must stay an array and a map state
/// a map. `states` lists every state the operator registered, as `(name, kind, handle)`.
///
/// # Errors
/// The first failing call, under any `on_error` (a restore cannot skip state): an operator
/// error naming the pipeline, the operator, the state, the key and the old value. A backend
/// failure.
pub fn migrate_keyed_state(
    script: &mut ScriptFn,
    states: &[(String, StateKind, StateId)],
    ctx: &mut OperatorContext,
) -> Result<()> {
    if !ctx.migrate {
        return Ok(());
    }
    let Some(with_name) = migrate_form(script) else {
        return Ok(());
    };
    let mut migrated = 0_u64;
    let mut deleted = 0_u64;
    for (name, kind, id) in states {
        let keys = ctx.state_mut()?.keys(*id)?;
        for k in keys {
            // `(message, old value)` of a failed call.
            let mut failure: Option<(String, Dynamic)> = None;
            let mut removed = false;
            let mut no_frame_state: Option<Box<dyn StateBackend>> = None;
            let state = ctx.state_mut()?;
            with_frame(&mut no_frame_state, &[], 0, || {
                set_key(Some(k.clone()));
                state.update(*id, &k, &mut |slot| {
                    let Some(old) = slot.take() else { return };
                    match call_migrate(script, with_name, name, &old) {
                        Ok(new) if new.is_unit() => removed = true,
                        Ok(new) => match shape_error(*kind, &new) {
                            None => *slot = Some(new),
                            Some(message) => {
                                failure = Some((message, old.clone()));
                                *slot = Some(old);
                            }
                        },
                        Err(e) => {
                            failure = Some((e, old.clone()));
                            *slot = Some(old);
                        }
                    }
                })
            })?;
            if let Some((message, old)) = failure {
                return Err(migrate_failure(ctx, &k, name, &message, &old));
            }
            if removed {
                deleted += 1;
            } else {
                migrated += 1;
            }
        }
    }
    migrated_log(ctx, migrated, deleted);
    Ok(())
}

/// Which `migrate` a script defines: `Some(false)` for `migrate(old)` (preferred),
/// `Some(true)` for `migrate(name, old)`, `None` for neither.
pub(crate) fn migrate_form(script: &ScriptFn) -> Option<bool> {
    if script.defines("migrate", 1) {
        Some(false)
    } else if script.defines("migrate", 2) {
        Some(true)
    } else {
        None
    }
}

/// Calls the script's `migrate` (in the form [`migrate_form`] found) on one old value.
pub(crate) fn call_migrate(
    script: &mut ScriptFn,
    with_name: bool,
    name: &str,
    old: &Dynamic,
) -> std::result::Result<Dynamic, String> {
    if with_name {
        script.call("migrate", (Dynamic::from(name.to_owned()), old.clone()))
    } else {
        script.call("migrate", (old.clone(),))
    }
}

/// The error of a failed `migrate` call: the operator, the state, the key and the old value.
pub(crate) fn migrate_failure(
    ctx: &OperatorContext,
    key: &Key,
    name: &str,
    message: &str,
    old: &Dynamic,
) -> RunError {
    let key = excerpt(&key.to_dynamic());
    RunError::Operator {
        pipeline: ctx.pipeline.to_string(),
        operator: ctx.operator.to_string(),
        subtask: ctx.subtask,
        message: format!(
            "`fn migrate` failed on the value of key {key} in state `{name}` while restoring a \
             savepoint: {message}; fix `migrate` (or remove it to keep the old values) and \
             restore again"
        ),
        record: excerpt(old),
    }
}

/// Logs how many restored values `migrate` rewrote and deleted.
pub(crate) fn migrated_log(ctx: &OperatorContext, migrated: u64, deleted: u64) {
    tracing::info!(
        pipeline = %ctx.pipeline,
        operator = %ctx.operator,
        subtask = ctx.subtask,
        migrated,
        deleted,
        "Migrated restored state through `fn migrate`."
    );
}

/// Why `value` cannot be stored in a state of `kind`, if it cannot.
fn shape_error(kind: StateKind, value: &Dynamic) -> Option<String> {
    let (ok, state, holds) = match kind {
        StateKind::Value => return None,
        StateKind::List => (value.is_array(), "list", "arrays"),
        StateKind::Map => (value.is_map(), "map", "object maps"),
    };
    (!ok).then(|| {
        format!(
            "it returned a value of type `{}`, but a {state} state holds {holds}",
            value.type_name()
        )
    })
}

/// `{key_field: key, ...value}` when `value` is a map, else `{key_field: key, value: value}`.
pub fn keyed_output(key_field: &str, key: &Key, value: &Dynamic) -> Dynamic {
    let mut m = match value.as_map_ref() {
        Ok(map) => map.clone(),
        Err(_) => {
            let mut m = Map::new();
            m.insert("value".into(), value.clone());
            m
        }
    };
    m.insert(key_field.into(), key.to_dynamic());
    Dynamic::from_map(m)
}

/// Fails when a keyed operator receives records without keys (it must follow a `key_by`).
pub(crate) fn require_keys(batch: &Batch, ctx: &OperatorContext) -> Result<()> {
    if batch.is_empty() || batch.is_keyed() {
        return Ok(());
    }
    Err(unkeyed(ctx))
}

/// The error of a keyed operator fed records without keys (a wiring bug).
pub(crate) fn unkeyed(ctx: &OperatorContext) -> RunError {
    RunError::Build {
        pipeline: ctx.pipeline.to_string(),
        element: ctx.operator.to_string(),
        message: "a keyed operator received records without keys; put a `key_by` right before it"
            .to_owned(),
    }
}

/// The name of the accumulator state of `reduce` (and `aggregate`): declared by the plan.
pub use crate::plan::declared::ACC;

/// The `reduce` operator.
pub struct ReduceOperator {
    script: ScriptFn,
    emit: EmitMode,
    key_field: String,
    state: Option<StateId>,
    /// How far the end-of-input pass got (`emit: final`).
    end: EndCursor,
}

impl ReduceOperator {
    /// A reduce with its compiled script.
    pub fn new(script: ScriptFn, emit: EmitMode, key_field: String) -> Self {
        Self {
            script,
            emit,
            key_field,
            state: None,
            end: EndCursor::default(),
        }
    }
}

impl Operator for ReduceOperator {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.state = Some(ctx.state_mut()?.register(ACC, StateKind::Value)?);
        Ok(())
    }

    /// Rewrites the restored accumulators through `fn migrate` ([`migrate_keyed_state`]).
    fn migrate_state(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let id = self
            .state
            .ok_or_else(|| RunError::Internal("reduce used before open".into()))?;
        migrate_keyed_state(
            &mut self.script,
            &[(ACC.to_owned(), StateKind::Value, id)],
            ctx,
        )
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        require_keys(batch, ctx)?;
        let id = self
            .state
            .ok_or_else(|| RunError::Internal("reduce used before open".into()))?;
        // Unless the job fails, a failed record leaves its key's accumulator as it was and is
        // reported as it came.
        let keep_acc = ctx.on_error != ErrorPolicy::Fail;
        let updates = self.emit == EmitMode::Updates;
        let records = std::mem::take(&mut batch.records);
        let prefetch = RecordPrefetch::new();
        let keys = std::mem::take(&mut batch.keys);
        let mut records = records.into_iter();
        for (i, k) in keys.iter().enumerate() {
            let Some(r) = records.next() else { break };
            prefetch_ahead(&**ctx.state_mut()?, PREFETCH_AHEAD, |n| keys.get(i + n));
            let ahead = records.as_slice();
            prefetch.ahead(ahead.get(2 * PREFETCH_AHEAD - 1), ahead.get(PREFETCH_AHEAD - 1));
            let mut rec = Some(r);
            let mut failure = None;
            let mut emitted = None;
            let script = &mut self.script;
            let key_field = &self.key_field;
            ctx.state_mut()?.update(id, k, &mut |slot| {
                let Some(r) = rec.take() else { return };
                let new = match slot.take() {
                    None => r,
                    Some(acc) => {
                        let mut args = [acc, r];
                        let result = if keep_acc {
                            script.invoke_owned_keeping("reduce", &mut args)
                        } else {
                            script.invoke_owned("reduce", &mut args)
                        };
                        match result {
                            Ok(new) => new,
                            Err(e) => {
                                let [acc, left] = args;
                                failure = Some((e, left));
                                *slot = keep_acc.then_some(acc);
                                return;
                            }
                        }
                    }
                };
                if updates {
                    emitted = Some(keyed_output(key_field, k, &new));
                }
                *slot = Some(new);
            })?;
            if let Some((e, left)) = failure {
                ctx.record_failed(left, e)?;
            }
            batch.records.extend(emitted);
        }
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        if self.emit != EmitMode::Final {
            return Ok(());
        }
        let id = self
            .state
            .ok_or_else(|| RunError::Internal("reduce used before open".into()))?;
        let state = ctx.state_mut()?;
        let start = out.len();
        while out.len() - start < END_CHUNK {
            let Some(keys) = self.end.next_keys(state.as_ref(), &[id], |_, _, _| Ok(true))? else {
                break;
            };
            for k in keys {
                if let Some(v) = state.get(id, &k)? {
                    out.push(keyed_output(&self.key_field, &k, &v));
                }
            }
        }
        Ok(())
    }

    fn end_pending(&self) -> bool {
        self.end.pending()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use weir_schema::ScriptLimitsSpec;

    use super::*;
    use crate::element::Harness;
    use crate::record::KeyGroupRange;
    use crate::script::runtime::CompiledScript;
    use crate::state::MemoryBackend;

    const MAX: u32 = 128;

    pub(crate) fn script(text: &str) -> ScriptFn {
        script_with(&ScriptLimitsSpec::default(), text)
    }

    pub(crate) fn script_with(limits: &ScriptLimitsSpec, text: &str) -> ScriptFn {
        let engine = Arc::new(crate::script::runtime::runtime_engine(limits));
        let script = CompiledScript::compile(&engine, text).expect("compile");
        ScriptFn::new(engine, Arc::new(script))
    }

    pub(crate) fn keyed_ctx() -> OperatorContext {
        let mut c = OperatorContext::standalone("p", "sum", MAX);
        c.state = Some(Box::new(MemoryBackend::new(MAX, KeyGroupRange::all(MAX))));
        c
    }

    pub(crate) fn key(k: &str) -> Key {
        Key::from_dynamic(&Dynamic::from(k.to_owned()))
    }

    /// Sums `a: 1 + 2` and `b: 5` with the first script, snapshots the keyed state and
    /// restores it into a reduce running `text` (a savepoint restore when `migrate`).
    fn restored(text: &str, migrate: bool) -> Result<Harness> {
        let sum = "fn reduce(acc, r) { acc + r }";
        let mut first = Harness::new(
            Box::new(ReduceOperator::new(
                script(sum),
                EmitMode::Final,
                "k".into(),
            )),
            keyed_ctx(),
        )?;
        let records = [("a", 1_i64), ("a", 2), ("b", 5)];
        first.push(Batch {
            times: Vec::new(),
            records: records.iter().map(|(_, n)| Dynamic::from(*n)).collect(),
            keys: records.iter().map(|(k, _)| key(k)).collect(),
        })?;
        let snap = first.ctx.state_mut()?.snapshot(KeyGroupRange::all(MAX))?;
        let mut ctx = keyed_ctx();
        ctx.restored_from = Some(1);
        let op = ReduceOperator::new(script(text), EmitMode::Updates, "k".into());
        let mut h = Harness::new(Box::new(op), ctx)?;
        h.ctx.state_mut()?.restore(&[snap.as_slice()])?;
        h.ctx.migrate = migrate;
        h.operator.migrate_state(&mut h.ctx)?;
        Ok(h)
    }

    fn value(h: &mut Harness, k: &str) -> Option<String> {
        let state = h.ctx.state_mut().expect("state");
        let id = state.register(ACC, StateKind::Value).expect("handle");
        state.get(id, &key(k)).expect("get").map(|v| excerpt(&v))
    }

    /// Under `skip` and `dead_letter`, a record whose call fails leaves the accumulator as it
    /// was before the call and is reported as it came, whichever path ran it: a body the
    /// native path takes (it declines the bad record, and Rhai fails part-way, after changing
    /// both arguments) and a body only Rhai runs.
    #[test]
    fn a_failed_record_leaves_the_accumulator_as_it_was() {
        let bodies = [
            (
                "fn reduce(acc, r) { r.seen = 1; acc.n = 0; acc.amount += r.amount; acc }",
                7,
                &[r#"{"other":true}"#][..],
            ),
            (
                r#"fn reduce(acc, r) { r.seen = 1; acc.n = 0; if r.amount == 2 { throw "two" } acc.amount += r.amount; acc }"#,
                5,
                &[r#"{"other":true}"#, r#"{"amount":2}"#][..],
            ),
        ];
        let batch = |lines: &[&str]| Batch {
            times: Vec::new(),
            records: lines
                .iter()
                .map(|l| crate::record::parse_json(l.as_bytes()).expect("json"))
                .collect(),
            keys: vec![key("a"); lines.len()],
        };
        for policy in [ErrorPolicy::Skip, ErrorPolicy::DeadLetter] {
            for (body, sum, failed) in bodies {
                let mut ctx = keyed_ctx();
                ctx.on_error = policy.clone();
                let op = ReduceOperator::new(script(body), EmitMode::Updates, "k".into());
                let mut h = Harness::new(Box::new(op), ctx).expect("harness");
                h.push(batch(&[r#"{"amount":1}"#, r#"{"other":true}"#]))
                    .expect("push");
                let first = Some(r#"{"amount":1}"#);
                assert_eq!(value(&mut h, "a").as_deref(), first, "{body}");
                h.push(batch(&[r#"{"amount":2}"#, r#"{"amount":4}"#]))
                    .expect("push");
                let expected = format!(r#"{{"amount":{sum},"n":0}}"#);
                assert_eq!(value(&mut h, "a"), Some(expected), "{body}");
                assert_eq!(h.ctx.errors, failed.len() as u64, "{body}");
                let reported: Vec<String> = h
                    .ctx
                    .dead_letters
                    .iter()
                    .map(|d| excerpt(&d.read_lock::<Map>().expect("map")["record"]))
                    .collect();
                match policy {
                    ErrorPolicy::DeadLetter => assert_eq!(reported, failed, "{body}"),
                    _ => assert!(reported.is_empty(), "{body}"),
                }
            }
        }
    }

    #[test]
    fn migrate_rewrites_every_restored_accumulator() {
        let reduce = "fn reduce(acc, r) { acc + r }";
        let mut h =
            restored(&format!("{reduce} fn migrate(old) {{ old * 10 }}"), true).expect("restore");
        assert_eq!(value(&mut h, "a").as_deref(), Some("30"));
        assert_eq!(value(&mut h, "b").as_deref(), Some("50"));
        let out = h
            .push(Batch {
                times: Vec::new(),
                records: vec![Dynamic::from(1_i64)],
                keys: vec![key("a")],
            })
            .expect("push");
        assert_eq!(excerpt(&out.records[0]), r#"{"k":"a","value":31}"#);

        let mut h = restored(
            "fn reduce(acc, r) { acc.total += r; acc } fn migrate(old) { #{total: old} }",
            true,
        )
        .expect("restore");
        assert_eq!(value(&mut h, "a").as_deref(), Some(r#"{"total":3}"#));

        let mut h = restored(
            &format!("{reduce} fn migrate(old) {{ if old > 4 {{ () }} else {{ old }} }}"),
            true,
        )
        .expect("restore");
        assert_eq!(value(&mut h, "a").as_deref(), Some("3"));
        assert_eq!(value(&mut h, "b"), None, "`()` deletes");

        let mut h = restored(
            &format!("{reduce} fn migrate(name, old) {{ `${{name}}:${{old}}` }}"),
            true,
        )
        .expect("restore");
        assert_eq!(value(&mut h, "a").as_deref(), Some(r#""acc:3""#));
    }

    #[test]
    fn a_failing_migrate_names_the_key_and_value() {
        let err = restored(
            r#"fn reduce(acc, r) { acc + r } fn migrate(old) { if old == 5 { throw "too big" } old }"#,
            true,
        )
        .err()
        .expect("migrate throws");
        let msg = err.to_string();
        for part in [
            "pipeline `p`",
            "operator `sum`",
            "fn migrate",
            "\"b\"",
            "too big",
            "record: 5",
        ] {
            assert!(msg.contains(part), "`{part}` missing from: {msg}");
        }
    }

    #[test]
    fn without_migrate_or_outside_a_savepoint_values_stay() {
        let mut h = restored("fn reduce(acc, r) { acc + r }", true).expect("restore");
        assert_eq!(value(&mut h, "a").as_deref(), Some("3"));
        let mut h = restored(
            r#"fn reduce(acc, r) { acc + r } fn migrate(old) { throw "must not run" }"#,
            false,
        )
        .expect("a checkpoint restore never migrates");
        assert_eq!(value(&mut h, "a").as_deref(), Some("3"));
        assert_eq!(value(&mut h, "b").as_deref(), Some("5"));
    }
}
