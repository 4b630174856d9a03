//! `union`: merges its inputs; the runtime already delivers every input on one channel, so the
//! operator passes batches through.

use crate::operators::{Operator, OperatorContext};
use crate::runtime::Batch;
use crate::runtime::error::Result;

/// The `union` operator (also the pass-through at the head of a source's chain).
#[derive(Default)]
pub struct UnionOperator;

impl Operator for UnionOperator {
    fn process(&mut self, _batch: &mut Batch, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }
}
