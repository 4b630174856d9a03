//! `process` (keyed): Rhai `fn process(r)` with named keyed state (`state_get`, `list_push`,
//! `map_put`, ...) and `emit(record)`; optional `fn on_end(key)` per key at the end of a
//! bounded input.

use std::collections::HashSet;

use rhai::Dynamic;
use weir_schema::StateKind;

use super::reduce::require_keys;
use crate::operators::{Operator, OperatorContext};
use crate::record::{Key, KeyBuildHasher};
use crate::runtime::Batch;
use crate::runtime::error::Result;
use crate::script::runtime::{ScriptFn, discard_emitted, set_key, take_emitted, with_frame};
use crate::state::StateId;

/// The `process` operator.
pub struct ProcessOperator {
    script: ScriptFn,
    declared: Vec<(String, StateKind)>,
    names: Vec<(String, StateId)>,
}

impl ProcessOperator {
    /// A process operator with its compiled script and declared state.
    pub fn new(script: ScriptFn, declared: Vec<(String, StateKind)>) -> Self {
        Self {
            script,
            declared,
            names: Vec::new(),
        }
    }
}

impl Operator for ProcessOperator {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let state = ctx.state_mut()?;
        for (name, kind) in &self.declared {
            let id = state.register(name, *kind)?;
            self.names.push((name.clone(), id));
        }
        Ok(())
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        require_keys(batch, ctx)?;
        let records = std::mem::take(&mut batch.records);
        let keys = std::mem::take(&mut batch.keys);
        let mut failures = Vec::new();
        let script = &mut self.script;
        let out = &mut batch.records;
        with_frame(&mut ctx.state, &self.names, || {
            for (r, k) in records.into_iter().zip(keys) {
                set_key(Some(k));
                match script.call("process", (r.clone(),)) {
                    Ok(_) => take_emitted(out),
                    Err(e) => {
                        discard_emitted();
                        failures.push((r, e));
                    }
                }
            }
        });
        for (r, e) in failures {
            ctx.record_failed(r, e)?;
        }
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        if !self.script.defines("on_end", 1) {
            return Ok(());
        }
        let mut keys: HashSet<Key, KeyBuildHasher> = HashSet::default();
        {
            let state = ctx.state_mut()?;
            for (_, id) in &self.names {
                keys.extend(state.keys(*id)?);
            }
        }
        let mut failures = Vec::new();
        let script = &mut self.script;
        with_frame(&mut ctx.state, &self.names, || {
            for k in keys {
                let kd = k.to_dynamic();
                set_key(Some(k));
                match script.call("on_end", (kd.clone(),)) {
                    Ok(_) => take_emitted(out),
                    Err(e) => {
                        discard_emitted();
                        failures.push((kd, e));
                    }
                }
            }
        });
        for (r, e) in failures {
            ctx.record_failed(r, e)?;
        }
        Ok(())
    }
}
