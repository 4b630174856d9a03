//! `flat_map`: Rhai `fn flat_map(r)` returns an array of records (possibly empty).

use crate::operators::{Operator, OperatorContext};
use crate::runtime::Batch;
use crate::runtime::error::Result;
use crate::script::runtime::ScriptFn;

/// The `flat_map` operator.
pub struct FlatMapOperator {
    script: ScriptFn,
}

impl FlatMapOperator {
    /// Wraps the compiled script.
    pub fn new(script: ScriptFn) -> Self {
        Self { script }
    }
}

impl Operator for FlatMapOperator {
    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        batch.keys.clear();
        let records = std::mem::take(&mut batch.records);
        for r in records {
            let original = r.clone();
            match self.script.call("flat_map", (r,)) {
                Ok(v) => match v.into_array() {
                    Ok(items) => batch.records.extend(items),
                    Err(t) => ctx.record_failed(
                        original,
                        format!("`fn flat_map` must return an array, not {t}"),
                    )?,
                },
                Err(e) => ctx.record_failed(original, e)?,
            }
        }
        Ok(())
    }
}
