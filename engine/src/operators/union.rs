//! `union`: merges its inputs; the runtime already delivers every input on one channel, so the
//! operator passes batches through.

use crate::base::error::Result;
use crate::base::message::Batch;
use crate::element::{Operator, OperatorContext};

/// The `union` operator (also the pass-through at the head of a source's chain).
#[derive(Default)]
pub struct UnionOperator;

impl Operator for UnionOperator {
    /// Batches pass through as they are, event times included.
    fn keeps_times(&self) -> bool {
        true
    }

    fn process(&mut self, _batch: &mut Batch, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }
}
