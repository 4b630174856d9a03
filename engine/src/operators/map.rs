//! `map`: Rhai `fn map(r)` returns the new record.

use crate::base::error::Result;
use crate::base::message::Batch;
use crate::element::{Operator, OperatorContext};
use crate::script::runtime::ScriptFn;

/// The `map` operator.
pub struct MapOperator {
    script: ScriptFn,
}

impl MapOperator {
    /// Wraps the compiled script.
    pub fn new(script: ScriptFn) -> Self {
        Self { script }
    }
}

impl Operator for MapOperator {
    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        let keyed = batch.is_keyed();
        let keys = std::mem::take(&mut batch.keys);
        let records = std::mem::take(&mut batch.records);
        batch.records.reserve(records.len());
        // A dead letter carries the record as it came.
        let exact = ctx.keeps_failed_records();
        for (i, r) in records.into_iter().enumerate() {
            let mut args = [r];
            let result = if exact {
                self.script.invoke_keeping("map", &mut args)
            } else {
                self.script.invoke("map", &mut args)
            };
            match result {
                Ok(v) => {
                    batch.records.push(v);
                    if keyed {
                        batch.keys.push(keys[i].clone());
                    }
                }
                Err(e) => {
                    let [left] = args;
                    ctx.record_failed(left, e)?;
                }
            }
        }
        Ok(())
    }
}
