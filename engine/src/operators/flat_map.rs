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
        let exact = ctx.keeps_failed_records();
        for r in records {
            let original = exact.then(|| r.clone());
            let mut args = [r];
            let message = match self.script.invoke("flat_map", &mut args) {
                Ok(v) => match v.into_array() {
                    Ok(items) => {
                        batch.records.extend(items);
                        continue;
                    }
                    Err(t) => format!("`fn flat_map` must return an array, not {t}"),
                },
                Err(e) => e,
            };
            let [left] = args;
            ctx.record_failed(original.unwrap_or(left), message)?;
        }
        Ok(())
    }
}
