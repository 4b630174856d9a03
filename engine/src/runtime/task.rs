//! The task loop: one tokio task per (chain, subtask). A chain is the run of operators that
//! execute back to back on the same batch; each node may also send to other tasks through
//! [`Output`]s. Source tasks poll a [`Source`]; other tasks read their one input channel
//! until every upstream sender has sent end-of-stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rhai::Dynamic;
use tokio::sync::mpsc::Receiver;

use super::error::{Result, RunError};
use super::exchange::Output;
use super::{BATCH_SIZE, Batch, Envelope, Message, NodeMetrics};
use crate::connectors::{Poll, Source, SourceContext};
use crate::operators::{Operator, OperatorContext};

/// One node of a chain in one subtask.
pub struct ChainNode {
    /// The operator (a pass-through for a source node).
    pub operator: Box<dyn Operator>,
    /// Its context.
    pub ctx: OperatorContext,
    /// Shared counters of the plan node.
    pub metrics: Arc<NodeMetrics>,
    /// Data edges leaving the chain from this node.
    pub outputs: Vec<Output>,
    /// Dead-letter edges from this node.
    pub dead_letters: Vec<Output>,
    /// Whether records leaving this node are counted as output (sinks count input only).
    pub counts_output: bool,
}

/// The nodes of one chain in one subtask, upstream first.
pub struct ChainTask {
    /// The nodes.
    pub nodes: Vec<ChainNode>,
}

impl ChainTask {
    /// Opens every operator, upstream first.
    ///
    /// # Errors
    /// The first failure to open.
    pub fn open(&mut self) -> Result<()> {
        for n in &mut self.nodes {
            n.operator.open(&mut n.ctx)?;
        }
        Ok(())
    }

    async fn flush_dead_letters(node: &mut ChainNode) -> Result<()> {
        if node.ctx.dead_letters.is_empty() {
            return Ok(());
        }
        let letters = std::mem::take(&mut node.ctx.dead_letters);
        let k = node.dead_letters.len();
        for (j, out) in node.dead_letters.iter_mut().enumerate() {
            if j + 1 == k {
                out.send(Batch::new(letters)).await?;
                break;
            }
            out.send(Batch::new(letters.clone())).await?;
        }
        Ok(())
    }

    /// Runs a batch through the chain from node `from`.
    ///
    /// # Errors
    /// An operator failure or a disconnected downstream.
    pub async fn push(&mut self, from: usize, batch: Batch) -> Result<()> {
        let mut batch = batch;
        let n = self.nodes.len();
        for i in from..n {
            let node = &mut self.nodes[i];
            let n_in = batch.len() as u64;
            let errors_before = node.ctx.errors;
            node.operator.process(&mut batch, &mut node.ctx)?;
            let out = if node.counts_output {
                batch.len() as u64
            } else {
                0
            };
            node.metrics.add(n_in, out, node.ctx.errors - errors_before);
            Self::flush_dead_letters(node).await?;
            let last = i + 1 == n;
            let k = node.outputs.len();
            for j in 0..k {
                if last && j + 1 == k {
                    node.outputs[j].send(std::mem::take(&mut batch)).await?;
                } else {
                    node.outputs[j].send(batch.clone()).await?;
                }
            }
            if last || batch.is_empty() {
                break;
            }
        }
        Ok(())
    }

    /// Ends the input: each node's `on_end` output flows downstream, then every operator
    /// closes and every output gets end-of-stream.
    ///
    /// # Errors
    /// An operator failure or a disconnected downstream.
    pub async fn end(&mut self) -> Result<()> {
        for i in 0..self.nodes.len() {
            let mut out: Vec<Dynamic> = Vec::new();
            {
                let node = &mut self.nodes[i];
                let errors_before = node.ctx.errors;
                node.operator.on_end(&mut out, &mut node.ctx)?;
                let counted = if node.counts_output {
                    out.len() as u64
                } else {
                    0
                };
                node.metrics
                    .add(0, counted, node.ctx.errors - errors_before);
                Self::flush_dead_letters(node).await?;
            }
            while !out.is_empty() {
                let rest = out.split_off(out.len().min(BATCH_SIZE));
                let chunk = Batch::new(std::mem::replace(&mut out, rest));
                let node = &mut self.nodes[i];
                for o in &mut node.outputs {
                    o.send(chunk.clone()).await?;
                }
                if i + 1 < self.nodes.len() {
                    self.push(i + 1, chunk).await?;
                }
            }
        }
        self.close()?;
        for node in &mut self.nodes {
            for o in node.outputs.iter_mut().chain(node.dead_letters.iter_mut()) {
                o.end().await?;
            }
        }
        Ok(())
    }

    /// Closes every operator (flushes sinks); the first error wins.
    ///
    /// # Errors
    /// The first failure to close.
    pub fn close(&mut self) -> Result<()> {
        let mut first = None;
        for n in &mut self.nodes {
            if let Err(e) = n.operator.close(&mut n.ctx) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Flags shared by a pipeline's tasks.
#[derive(Debug, Default)]
pub struct Control {
    /// Sources stop at the next batch boundary and the pipeline drains (SIGINT/SIGTERM).
    pub stop: AtomicBool,
    /// A task failed: sources stop and the pipeline winds down.
    pub failed: AtomicBool,
}

impl Control {
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.failed.load(Ordering::Relaxed)
    }
}

/// Runs a source task: polls the source and pushes each batch through the chain (whose first
/// node is the source's pass-through).
///
/// # Errors
/// The source's or an operator's failure.
pub async fn run_source(
    mut source: Box<dyn Source>,
    mut sctx: SourceContext,
    mut chain: ChainTask,
    control: Arc<Control>,
) -> Result<()> {
    let result = async {
        source.open(&mut sctx)?;
        chain.open()?;
        loop {
            if control.should_stop() {
                break;
            }
            let mut out = Vec::with_capacity(BATCH_SIZE);
            let skipped_before = sctx.skipped;
            let poll = source.poll(&mut out, &mut sctx)?;
            if sctx.skipped > skipped_before {
                chain.nodes[0]
                    .metrics
                    .add(0, 0, sctx.skipped - skipped_before);
            }
            if !out.is_empty() {
                chain.push(0, Batch::new(out)).await?;
            }
            match poll {
                Poll::Ready => tokio::task::consume_budget().await,
                Poll::Idle(d) => tokio::time::sleep(d).await,
                Poll::Done => break,
            }
        }
        if control.failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        source.close()?;
        chain.end().await
    }
    .await;
    if result.is_err() {
        let _ = chain.close();
    }
    result
}

/// Runs a task fed by a channel until every one of `expected_ends` senders has sent
/// end-of-stream.
///
/// # Errors
/// An operator failure, or [`RunError::Disconnected`] when upstream vanished early.
pub async fn run_chain(
    mut rx: Receiver<Envelope>,
    expected_ends: usize,
    mut chain: ChainTask,
    pipeline: Arc<str>,
    element: Arc<str>,
) -> Result<()> {
    let result = async {
        chain.open()?;
        let mut ends = 0;
        while ends < expected_ends {
            let Some(env) = rx.recv().await else {
                return Err(RunError::Disconnected {
                    pipeline: pipeline.to_string(),
                    element: element.to_string(),
                });
            };
            match env.message {
                Message::Records(batch) => chain.push(0, batch).await?,
                Message::EndOfStream => ends += 1,
                // Checkpointing (next issue) aligns barriers here; watermarks pass untouched.
                Message::Barrier(_) | Message::Watermark(_) => {}
            }
        }
        drop(rx);
        chain.end().await
    }
    .await;
    if result.is_err() {
        let _ = chain.close();
    }
    result
}
