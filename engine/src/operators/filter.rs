//! `filter`: keeps the records for which Rhai `fn filter(r)` returns `true`.

use crate::base::error::Result;
use crate::base::message::Batch;
use crate::element::{Operator, OperatorContext};
use crate::script::runtime::ScriptFn;

/// The `filter` operator.
pub struct FilterOperator {
    script: ScriptFn,
}

impl FilterOperator {
    /// Wraps the compiled script.
    pub fn new(script: ScriptFn) -> Self {
        Self { script }
    }
}

impl Operator for FilterOperator {
    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        let keyed = batch.is_keyed();
        let keys = std::mem::take(&mut batch.keys);
        let records = std::mem::take(&mut batch.records);
        for (i, r) in records.into_iter().enumerate() {
            // A filter passes its records on unchanged: the script works on a copy.
            let keep = match self
                .script
                .invoke_on_copy("filter", std::slice::from_ref(&r))
            {
                Ok(v) => match v.as_bool() {
                    Ok(b) => b,
                    Err(t) => {
                        ctx.record_failed(r, format!("`fn filter` must return a bool, not {t}"))?;
                        continue;
                    }
                },
                Err(e) => {
                    ctx.record_failed(r, e)?;
                    continue;
                }
            };
            if keep {
                batch.records.push(r);
                if keyed {
                    batch.keys.push(keys[i].clone());
                }
            }
        }
        Ok(())
    }
}
