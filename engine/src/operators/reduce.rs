//! `reduce` (keyed): Rhai `fn reduce(acc, r)` folds each key's records; a key's first record
//! is its initial accumulator. Emits `{<key_field>: key, ...acc}` (or `value: acc` when the
//! accumulator is not a map) after every record (`updates`) or once per key at the end
//! (`final`).

use rhai::{Dynamic, Map};
use weir_schema::{EmitMode, StateKind};

use crate::operators::{ErrorPolicy, Operator, OperatorContext};
use crate::record::Key;
use crate::runtime::Batch;
use crate::runtime::error::{Result, RunError};
use crate::script::runtime::ScriptFn;
use crate::state::StateId;

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
    Err(RunError::Build {
        pipeline: ctx.pipeline.to_string(),
        element: ctx.operator.to_string(),
        message: "a keyed operator received records without keys; put a `key_by` right before it"
            .to_owned(),
    })
}

/// The `reduce` operator.
pub struct ReduceOperator {
    script: ScriptFn,
    emit: EmitMode,
    key_field: String,
    state: Option<StateId>,
}

impl ReduceOperator {
    /// A reduce with its compiled script.
    pub fn new(script: ScriptFn, emit: EmitMode, key_field: String) -> Self {
        Self {
            script,
            emit,
            key_field,
            state: None,
        }
    }
}

impl Operator for ReduceOperator {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.state = Some(ctx.state_mut()?.register("acc", StateKind::Value)?);
        Ok(())
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        require_keys(batch, ctx)?;
        let id = self
            .state
            .ok_or_else(|| RunError::Internal("reduce used before open".into()))?;
        let keep_backup = ctx.on_error != ErrorPolicy::Fail;
        let updates = self.emit == EmitMode::Updates;
        let records = std::mem::take(&mut batch.records);
        let keys = std::mem::take(&mut batch.keys);
        for (r, k) in records.into_iter().zip(keys) {
            let original = r.clone();
            let mut rec = Some(r);
            let mut failure = None;
            let mut emitted = None;
            let script = &mut self.script;
            let key_field = &self.key_field;
            ctx.state_mut()?.update(id, &k, &mut |slot| {
                let Some(r) = rec.take() else { return };
                let new = match slot.take() {
                    None => r,
                    Some(acc) => {
                        let backup = keep_backup.then(|| acc.clone());
                        match script.call("reduce", (acc, r)) {
                            Ok(new) => new,
                            Err(e) => {
                                failure = Some(e);
                                *slot = backup;
                                return;
                            }
                        }
                    }
                };
                if updates {
                    emitted = Some(keyed_output(key_field, &k, &new));
                }
                *slot = Some(new);
            })?;
            if let Some(e) = failure {
                ctx.record_failed(original, e)?;
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
        for k in state.keys(id)? {
            if let Some(v) = state.get(id, &k)? {
                out.push(keyed_output(&self.key_field, &k, &v));
            }
        }
        Ok(())
    }
}
