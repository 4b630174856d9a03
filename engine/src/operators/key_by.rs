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
    Script(Box<ScriptFn>),
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
    /// Records leave as they came, with their keys added.
    fn keeps_times(&self) -> bool {
        true
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        // The event times of the records kept (see `keeps_times`).
        let timed = batch.has_times();
        let records = std::mem::take(&mut batch.records);
        let mut times = std::mem::take(&mut batch.times).into_iter();
        batch.keys.clear();
        batch.keys.reserve(records.len());
        batch.records.reserve(records.len());
        for r in records {
            let time = times.next().filter(|_| timed);
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
            batch.times.extend(time);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::{ErrorPolicy, Harness};

    #[test]
    fn event_times_follow_the_records_kept() {
        let path = FieldPath::new("user");
        let op = KeyByOperator::new(KeySelector::Field(path));
        let mut ctx = OperatorContext::standalone("p", "k", 128);
        ctx.on_error = ErrorPolicy::Skip;
        let mut h = Harness::new(Box::new(op), ctx).expect("open");
        let records: Vec<rhai::Dynamic> = [r#"{"user":"a"}"#, r#"{"other":1}"#, r#"{"user":"b"}"#]
            .iter()
            .map(|s| serde_json::from_str(s).expect("json"))
            .collect();
        let mut batch = Batch::new(records);
        batch.times = vec![10, 20, 30];
        let out = h.push(batch).expect("push");
        assert_eq!(out.len(), 2);
        assert_eq!(out.times, vec![10, 30], "the skipped record's time goes with it");
        assert!(h.operator.keeps_times());
    }
}

