//! `flat_map`: Rhai `fn flat_map(r)` returns an array of records (possibly empty), at most
//! `limits.max_outputs_per_record` of them; a longer array is a record error.

use crate::base::error::Result;
use crate::base::message::{Batch, Pending};
use crate::element::{Operator, OperatorContext};
use crate::script::runtime::ScriptFn;

/// The `flat_map` operator.
pub struct FlatMapOperator {
    script: ScriptFn,
    /// Most records one input record may turn into.
    max_outputs: usize,
}

impl FlatMapOperator {
    /// Wraps the compiled script; `max_outputs` is the pipeline's
    /// `limits.max_outputs_per_record`.
    pub fn new(script: ScriptFn, max_outputs: usize) -> Self {
        Self {
            script,
            max_outputs,
        }
    }
}

impl Operator for FlatMapOperator {
    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        let mut input = Pending::new(std::mem::take(batch));
        self.process_some(&mut input, batch, usize::MAX, ctx)
    }

    fn expands(&self) -> bool {
        true
    }

    fn process_some(
        &mut self,
        input: &mut Pending,
        out: &mut Batch,
        limit: usize,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let exact = ctx.keeps_failed_records();
        while out.records.len() < limit {
            let Some((r, _)) = input.next_record() else {
                break;
            };
            let original = exact.then(|| r.clone());
            let mut args = [r];
            let message = match self.script.invoke("flat_map", &mut args) {
                Ok(v) => match v.into_array() {
                    Ok(items) if items.len() <= self.max_outputs => {
                        out.records.extend(items);
                        continue;
                    }
                    Ok(items) => format!(
                        "`fn flat_map` returned {} records for one input record, more than \
                         `limits.max_outputs_per_record` ({})",
                        items.len(),
                        self.max_outputs
                    ),
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

#[cfg(test)]
mod tests {
    use rhai::Dynamic;

    use super::*;
    use crate::element::{ErrorPolicy, Harness};
    use crate::operators::reduce::tests::script;

    fn harness(max_outputs: usize, on_error: ErrorPolicy) -> Harness {
        let op = FlatMapOperator::new(
            script("fn flat_map(r) { let a = []; a.pad(r, r); a }"),
            max_outputs,
        );
        let mut ctx = OperatorContext::standalone("p", "fm", 128);
        ctx.on_error = on_error;
        Harness::new(Box::new(op), ctx).expect("opens")
    }

    fn ints(v: &[i64]) -> Batch {
        Batch::new(v.iter().map(|&n| Dynamic::from(n)).collect())
    }

    #[test]
    fn more_outputs_than_the_budget_is_a_record_error_under_on_error() {
        let mut h = harness(3, ErrorPolicy::DeadLetter);
        let out = h.push(ints(&[2, 4, 3])).expect("runs");
        assert_eq!(out.len(), 5, "2 + 3 records; the 4 is over the budget");
        assert_eq!(h.ctx.errors, 1);
        let letter = h.ctx.dead_letters[0]
            .read_lock::<rhai::Map>()
            .expect("a map")
            .clone();
        assert_eq!(letter["record"].as_int(), Ok(4));
        let error = letter["error"].to_string();
        assert!(error.contains("returned 4 records"), "{error}");
        assert!(
            error.contains("`limits.max_outputs_per_record` (3)"),
            "{error}"
        );

        let mut h = harness(3, ErrorPolicy::Fail);
        let e = h.push(ints(&[1, 5])).expect_err("fails");
        assert!(e.to_string().contains("max_outputs_per_record"), "{e}");
    }

    #[test]
    fn process_some_stops_once_the_output_reaches_the_limit() {
        let mut h = harness(100, ErrorPolicy::Fail);
        let mut input = Pending::new(ints(&[3, 3, 3, 3]));
        let mut out = Batch::default();
        h.operator
            .process_some(&mut input, &mut out, 5, &mut h.ctx)
            .expect("runs");
        assert_eq!(
            (out.len(), input.len()),
            (6, 2),
            "a record's outputs stay together"
        );
        h.operator
            .process_some(&mut input, &mut out, usize::MAX, &mut h.ctx)
            .expect("runs");
        assert_eq!((out.len(), input.len()), (12, 0));
    }
}
