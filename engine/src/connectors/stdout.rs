//! The `stdout` sink: jsonl or csv on standard output, flushed after every batch.

use std::io::Write;

use super::RecordWriter;
use crate::base::error::{Result, RunError};
use crate::base::message::Batch;
use crate::element::{Operator, OperatorContext};

/// The `stdout` sink.
pub struct StdoutSink {
    writer: RecordWriter,
    buf: Vec<u8>,
}

impl StdoutSink {
    /// A sink writing csv (`true`) or jsonl.
    pub fn new(csv: bool) -> Self {
        Self {
            writer: RecordWriter::new(csv),
            buf: Vec::with_capacity(1 << 16),
        }
    }

    fn flush(&mut self, ctx: &OperatorContext) -> Result<()> {
        let mut out = std::io::stdout().lock();
        let res = out.write_all(&self.buf).and_then(|()| out.flush());
        self.buf.clear();
        res.map_err(|source| RunError::Io {
            pipeline: ctx.pipeline.to_string(),
            element: ctx.operator.to_string(),
            what: "cannot write",
            path: "<stdout>".into(),
            source,
        })
    }
}

impl Operator for StdoutSink {
    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        for r in batch.records.drain(..) {
            self.writer.write(&mut self.buf, &r);
        }
        batch.keys.clear();
        self.flush(ctx)
    }

    fn close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.flush(ctx)
    }
}
