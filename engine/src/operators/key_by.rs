//! `key_by`: attaches a key to every record, from a field path (built in) or Rhai
//! `fn key(r)`. The hash exchange after it routes each record by the key's key group.

use crate::base::error::Result;
use crate::base::message::Batch;
use crate::element::{Operator, OperatorContext};
use crate::record::{FieldPath, Key};
use crate::script::runtime::ScriptFn;

/// Where the key comes from.
pub enum KeySelector {
    /// A field path.
    Field(FieldPath),
    /// A script's `fn key(r)`.
    Script(ScriptFn),
}

/// The `key_by` operator.
pub struct KeyByOperator {
    selector: KeySelector,
}

impl KeyByOperator {
    /// A key_by with its selector.
    pub fn new(selector: KeySelector) -> Self {
        Self { selector }
    }
}

impl Operator for KeyByOperator {
    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        let records = std::mem::take(&mut batch.records);
        batch.keys.clear();
        batch.keys.reserve(records.len());
        batch.records.reserve(records.len());
        for r in records {
            let key = match &mut self.selector {
                KeySelector::Field(path) => match path.with(&r, Key::from_dynamic) {
                    Some(k) => k,
                    None => {
                        let msg = format!("the record has no key field `{}`", path.as_str());
                        ctx.record_failed(r, msg)?;
                        continue;
                    }
                },
                // `key_by` passes its records on unchanged: the script works on a copy.
                KeySelector::Script(s) => match s.invoke_on_copy("key", std::slice::from_ref(&r)) {
                    Ok(v) => Key::from_dynamic(&v),
                    Err(e) => {
                        ctx.record_failed(r, e)?;
                        continue;
                    }
                },
            };
            batch.records.push(r);
            batch.keys.push(key);
        }
        Ok(())
    }
}
