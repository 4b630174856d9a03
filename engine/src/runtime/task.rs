//! The task loop: one tokio task per (chain, subtask). A chain is the run of operators that
//! execute back to back on the same batch; each node may also send to other tasks through
//! [`Output`]s. Source tasks poll a [`Source`]; other tasks read their input channels until
//! every one has delivered end-of-stream.
//!
//! Checkpoints happen here, not in operators: a source task takes its snapshot when the
//! coordinator's trigger arrives between two polls; any other task feeds the barriers it
//! reads into a [`BarrierAligner`] and snapshots when the aligner says so. A snapshot has a
//! synchronous half on the task (each operator's local state, each backend's frozen state)
//! and an asynchronous half (writing the files) on the blocking pool, after which the task
//! acknowledges with its file handles. Processing continues meanwhile. With unaligned
//! checkpoints a task also snapshots at a barrier announced on a priority lane (or when its
//! alignment outlasts `aligned_timeout`), records what that barrier overtook in a
//! [`ChannelLog`], and acknowledges once the log is complete; a restored task replays its
//! channel state before its first new record. It never does so ahead of a savepoint announced
//! before that barrier: the checkpoint waits for the savepoint's (aligned) snapshot.
//!
//! Backpressure never holds a task in the middle of a batch (unless an operator expands one
//! record into many): a batch runs through the chain and whatever its full output channels do
//! not take waits in the outputs' own queues ([`ChainTask::push_buffered`]); the loop then
//! empties those queues before it reads new input, in a `select!` that still takes commands
//! (a source's checkpoint trigger), priority lanes and the channel state of an open unaligned
//! snapshot. An unaligned barrier that arrives while the outputs are full is thus taken at
//! once, and so is the next one downstream: the barrier is not held back one full channel
//! per stage. Where those files go
//! and how they are read back (also after a change of parallelism) is
//! [`crate::state::snapshot_files`]'s business, not the loop's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rhai::Dynamic;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;

use super::exchange::Output;
use super::fault::{Fault, FaultKind};
use super::input::{InputLease, InputSet, Received};
use super::tap::{TapCursor, TapRegistry, TapSide};
use super::watermark::{Advance, WatermarkCombiner};
use crate::base::dispose::dispose;
use crate::base::error::{Result, RunError};
use crate::base::message::{
    BATCH_SIZE, Barrier, BarrierKind, Batch, Message, Pending, WATERMARK_END, WATERMARK_MIN,
    Watermark,
};
use crate::base::metrics::SubtaskMetrics;
use crate::checkpoint::restore_plan::RestorePlan;
use crate::checkpoint::channel_state::{ChannelEntry, ChannelLog};
use crate::checkpoint::{
    AlignerAction, AlignerStep, AlignmentMode, BarrierAligner, CheckpointId, CheckpointMetadata,
    CheckpointStore, SubtaskState, TaskId,
};
use crate::connectors::{Poll, Source, SourceContext};
use crate::element::{Operator, OperatorContext};
use crate::script::runtime::running;
use crate::state::handover::{Handover, HandoverKey};
use crate::state::snapshot_files::{
    KeyedFilter, LocalState, NodeSnapshot, read_channel_state, read_local_state, restore_keyed,
    restored_watermark, write_channel_state, write_snapshots,
};
use crate::state::{CanonicalSnapshot, PendingSnapshot};

/// One node of a chain in one subtask.
pub struct ChainNode {
    /// The operator (a pass-through for a source node).
    pub operator: Box<dyn Operator>,
    /// Its context.
    pub ctx: OperatorContext,
    /// The counters of this subtask of the plan node.
    pub metrics: Arc<SubtaskMetrics>,
    /// Data edges leaving the chain from this node.
    pub outputs: Vec<Output>,
    /// Side-output edges from this node: dead letters, then (from `late_from` on) a
    /// `window`'s late records. One list, so that barriers, watermarks and the end of input
    /// reach every side output alike.
    pub dead_letters: Vec<Output>,
    /// Index of the first side output in `dead_letters` that carries late records rather
    /// than dead letters (`dead_letters.len()` when there is none).
    pub late_from: usize,
    /// Whether records leaving this node are counted as output (sinks count input only).
    pub counts_output: bool,
    /// A fault to inject (recovery tests).
    pub fault: Option<Arc<Fault>>,
}

/// The nodes of one chain in one subtask, upstream first.
pub struct ChainTask {
    /// The nodes.
    pub nodes: Vec<ChainNode>,
    /// The pipeline's taps (`weir tap`), looked at once per batch.
    pub taps: Arc<TapRegistry>,
    /// This task's view of the taps on each node's input and output (filled on first use).
    pub tap_cursors: Vec<[TapCursor; 2]>,
}

impl ChainTask {
    /// Lets go of every node's keyed state: parked for the next version when the task
    /// stopped right after a stop-with-savepoint snapshot and nothing changed since (see
    /// [`crate::state::handover`]), otherwise freed through [`dispose`] (during a hot reload,
    /// after the new version started rather than in the pause).
    fn free_state(&mut self, env: &TaskEnv) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let Some(state) = node.ctx.state.take() else {
                continue;
            };
            let frozen = env.handover.as_ref().and_then(|h| {
                let (checkpoint, generations) = h.frozen.as_ref()?;
                let then = (*generations.get(i)?)?;
                (state.generation() == Some(then)).then_some((h, *checkpoint))
            });
            match frozen {
                Some((h, checkpoint)) => h.registry.put(
                    HandoverKey {
                        pipeline: Arc::clone(&env.pipeline),
                        operator: Arc::clone(&node.ctx.operator),
                        subtask: node.ctx.subtask,
                        checkpoint,
                    },
                    Arc::clone(&h.backend),
                    state,
                ),
                None => dispose(state),
            }
        }
    }

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

    /// Sends what the node's last call left in `ctx.dead_letters` and `ctx.late` to their
    /// side outputs, and counts them (and the late records it dropped).
    async fn flush_dead_letters(node: &mut ChainNode) -> Result<()> {
        let dropped = std::mem::take(&mut node.ctx.late_dropped);
        if dropped > 0 || !node.ctx.late.is_empty() {
            let late = std::mem::take(&mut node.ctx.late);
            node.metrics.add_late(dropped, late.len() as u64);
            let from = node.late_from.min(node.dead_letters.len());
            Self::send_to_all(&mut node.dead_letters[from..], late).await?;
        }
        if node.ctx.dead_letters.is_empty() {
            return Ok(());
        }
        let letters = std::mem::take(&mut node.ctx.dead_letters);
        node.metrics.add_dead_lettered(letters.len() as u64);
        let to = node.late_from.min(node.dead_letters.len());
        Self::send_to_all(&mut node.dead_letters[..to], letters).await
    }

    /// Sends `records` to every output of `outs` (nothing when there is none).
    async fn send_to_all(outs: &mut [Output], records: Vec<Dynamic>) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let k = outs.len();
        let mut records = Some(records);
        for (j, out) in outs.iter_mut().enumerate() {
            let batch = if j + 1 == k {
                records.take().unwrap_or_default()
            } else {
                records.clone().unwrap_or_default()
            };
            out.send_overdraft(Batch::new(batch)).await?;
        }
        Ok(())
    }

    /// Runs a batch through the chain from node `from` and waits until everything it sent
    /// is in the channels ([`Self::push_buffered`], then [`Self::flush`]).
    ///
    /// # Errors
    /// An operator failure or a disconnected downstream.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn push(&mut self, from: usize, batch: Batch) -> Result<()> {
        self.push_buffered(from, batch).await?;
        self.flush().await
    }

    /// Whether an output of the chain still queues messages for a full channel.
    pub fn has_queued(&self) -> bool {
        self.nodes.iter().any(|n| {
            n.outputs
                .iter()
                .chain(n.dead_letters.iter())
                .any(Output::has_queued)
        })
    }

    /// Waits until every output's queue is in its channels, the wait counted as the node's
    /// blocked time. Cancel-safe: what is not sent stays queued, in order.
    ///
    /// # Errors
    /// A disconnected downstream.
    pub async fn flush(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            for o in node.outputs.iter_mut().chain(node.dead_letters.iter_mut()) {
                if !o.has_queued() {
                    continue;
                }
                o.flush().await?;
                if node.metrics.detailed {
                    node.metrics.add_time(Duration::ZERO, o.take_blocked());
                }
            }
        }
        Ok(())
    }

    /// Runs a batch through the chain from node `from`. What the chain sends may stay in its
    /// outputs' queues, at most [`OVERDRAFT`](super::exchange::OVERDRAFT) messages per
    /// target (see [`Self::has_queued`], [`Self::flush`]): a task under backpressure waits
    /// for room between batches, where it can still take an unaligned checkpoint.
    ///
    /// Memory stays bounded whatever the operators produce: each node gets at most
    /// [`BATCH_SIZE`] records per call, and an operator that [`expands`](Operator::expands)
    /// (one record into many) is driven in steps, each step's output going all the way
    /// downstream before the next step runs (depth first, so records keep their order). A
    /// chain of two `flat_map`s that turn one record into millions thus holds about one
    /// batch per node, never the millions.
    ///
    /// # Errors
    /// An operator failure or a disconnected downstream.
    pub async fn push_buffered(&mut self, from: usize, batch: Batch) -> Result<()> {
        let n = self.nodes.len();
        if from >= n || batch.is_empty() {
            return Ok(());
        }
        // Work still to do, innermost (most downstream) last: node index and its input.
        let mut stack: Vec<(usize, Pending)> = Vec::with_capacity(n - from);
        self.strike(from, &batch)?;
        // One relaxed load per batch while nobody taps.
        let tapping = self.taps.is_active();
        if tapping {
            self.tap(from, TapSide::Input, &batch.records);
        }
        stack.push((from, Pending::new(batch)));
        while let Some((i, input)) = stack.last_mut() {
            let i = *i;
            let node = &mut self.nodes[i];
            let errors_before = node.ctx.errors;
            let before = input.len();
            let clock = node.metrics.detailed.then(Instant::now);
            running(&node.ctx.pipeline, &node.ctx.operator);
            let processed = if node.operator.expands() {
                let mut out = Batch::default();
                node.operator
                    .process_some(input, &mut out, BATCH_SIZE, &mut node.ctx)
                    .map(|()| out)
            } else {
                let mut chunk = input.take(BATCH_SIZE);
                node.operator
                    .process(&mut chunk, &mut node.ctx)
                    .map(|()| chunk)
            };
            let n_in = (before - input.len()) as u64;
            let mut batch = match processed {
                Ok(mut batch) => {
                    if !node.operator.keeps_times() {
                        batch.times.clear();
                    }
                    batch
                }
                Err(e) => {
                    // The records that entered before the failure still count.
                    node.metrics.add(n_in, 0, node.ctx.errors - errors_before);
                    return Err(e);
                }
            };
            if input.is_empty() {
                stack.pop();
            } else {
                // Another step of this node follows: let the other tasks on this worker
                // run in between, as a channel send would.
                tokio::task::coop::consume_budget().await;
            }
            let out = if node.counts_output {
                batch.len() as u64
            } else {
                0
            };
            node.metrics.add(n_in, out, node.ctx.errors - errors_before);
            if tapping && node.counts_output {
                self.tap(i, TapSide::Output, &batch.records);
            }
            let node = &mut self.nodes[i];
            Self::flush_dead_letters(node).await?;
            let last = i + 1 == n;
            let k = node.outputs.len();
            for j in 0..k {
                if last && j + 1 == k {
                    node.outputs[j]
                        .send_overdraft(std::mem::take(&mut batch))
                        .await?;
                } else {
                    node.outputs[j].send_overdraft(batch.clone()).await?;
                }
            }
            if let Some(t0) = clock {
                let blocked = node
                    .outputs
                    .iter_mut()
                    .chain(node.dead_letters.iter_mut())
                    .map(Output::take_blocked)
                    .sum::<Duration>();
                node.metrics
                    .add_time(t0.elapsed().saturating_sub(blocked), blocked);
            }
            if !last && !batch.is_empty() {
                self.strike(i + 1, &batch)?;
                if tapping {
                    self.tap(i + 1, TapSide::Input, &batch.records);
                }
                stack.push((i + 1, Pending::new(batch)));
            }
        }
        Ok(())
    }

    /// Offers `records` to the taps open on `side` of node `i`.
    fn tap(&mut self, i: usize, side: TapSide, records: &[Dynamic]) {
        if self.tap_cursors.len() < self.nodes.len() {
            self.tap_cursors.resize_with(self.nodes.len(), Default::default);
        }
        let ctx = &self.nodes[i].ctx;
        let cursor = &mut self.tap_cursors[i][usize::from(side == TapSide::Output)];
        self.taps
            .offer_cached(cursor, &ctx.operator, side, ctx.subtask, records);
    }

    /// Counts `batch` into node `i`'s injected fault, if any, and strikes when it is due.
    ///
    /// # Errors
    /// The injected error.
    fn strike(&self, i: usize, batch: &Batch) -> Result<()> {
        let node = &self.nodes[i];
        if let Some(f) = &node.fault
            && let Some((at, kind)) = f.hit(batch.len())
        {
            let record = &batch.records[at.min(batch.len().saturating_sub(1))];
            match kind {
                FaultKind::Error => {
                    return Err(node.ctx.error(record, "injected fault (recovery test)"));
                }
                FaultKind::Panic => panic!(
                    "injected panic in `{}` subtask {} (recovery test)",
                    node.ctx.operator, node.ctx.subtask
                ),
            }
        }
        Ok(())
    }

    /// Calls one of node `i`'s hooks that emit outside `process` (`on_watermark`,
    /// `on_processing_time`, `on_end`) and sends what it emitted on: counted as the node's
    /// output, offered to taps, out of the node's outputs and through the rest of the chain,
    /// in [`BATCH_SIZE`] pieces.
    ///
    /// # Errors
    /// The hook's failure or a disconnected downstream.
    async fn run_hook(
        &mut self,
        i: usize,
        hook: impl FnOnce(&mut dyn Operator, &mut Vec<Dynamic>, &mut OperatorContext) -> Result<()>,
    ) -> Result<()> {
        let mut out: Vec<Dynamic> = Vec::new();
        {
            let node = &mut self.nodes[i];
            let errors_before = node.ctx.errors;
            running(&node.ctx.pipeline, &node.ctx.operator);
            hook(&mut *node.operator, &mut out, &mut node.ctx)?;
            let counted = if node.counts_output {
                out.len() as u64
            } else {
                0
            };
            node.metrics
                .add(0, counted, node.ctx.errors - errors_before);
            if node.counts_output && !out.is_empty() && self.taps.is_active() {
                self.taps
                    .offer(&node.ctx.operator, TapSide::Output, node.ctx.subtask, &out);
            }
            Self::flush_dead_letters(node).await?;
        }
        while !out.is_empty() {
            let rest = out.split_off(out.len().min(BATCH_SIZE));
            let chunk = Batch::new(std::mem::replace(&mut out, rest));
            let node = &mut self.nodes[i];
            for o in &mut node.outputs {
                o.send_overdraft(chunk.clone()).await?;
            }
            if i + 1 < self.nodes.len() {
                self.push_buffered(i + 1, chunk).await?;
            }
        }
        Ok(())
    }

    /// The task's event-time watermark advanced (or the task went idle): each node, upstream
    /// first, gets `on_watermark` when its watermark grows, what that emits flows downstream
    /// like records, and then the watermark goes out of every output of the node (dead
    /// letters included), so it follows everything the node emitted before it.
    ///
    /// # Errors
    /// An operator failure or a disconnected downstream.
    pub async fn advance_watermark(&mut self, watermark: Watermark) -> Result<()> {
        for i in 0..self.nodes.len() {
            if let Watermark::At(w) = watermark
                && w > self.nodes[i].ctx.watermark
            {
                self.nodes[i].ctx.watermark = w;
                self.run_hook(i, |op, out, ctx| op.on_watermark(w, out, ctx))
                    .await?;
            }
            let node = &mut self.nodes[i];
            for o in node.outputs.iter_mut().chain(node.dead_letters.iter_mut()) {
                o.queue_watermark(watermark)?;
            }
        }
        Ok(())
    }

    /// The earliest processing time any node wants to be woken at.
    pub fn next_processing_time(&self) -> Option<i64> {
        self.nodes
            .iter()
            .filter_map(|n| n.operator.next_processing_time())
            .min()
    }

    /// Processing time reached `now`: every node whose wake-up is due gets
    /// `on_processing_time`, upstream first; what it emits flows downstream like records.
    ///
    /// # Errors
    /// An operator failure or a disconnected downstream.
    pub async fn fire_processing_time(&mut self, now: i64) -> Result<()> {
        for i in 0..self.nodes.len() {
            if self.nodes[i]
                .operator
                .next_processing_time()
                .is_some_and(|t| t <= now)
            {
                self.run_hook(i, |op, out, ctx| op.on_processing_time(now, out, ctx))
                    .await?;
            }
        }
        Ok(())
    }

    /// Ends the input: each node, upstream first, gets `on_watermark(WATERMARK_END)` (every
    /// event-time timer and window fires) and then `on_end` (again while `end_pending`),
    /// their output flowing downstream;
    /// then every operator closes and every output gets end-of-stream.
    ///
    /// # Errors
    /// An operator failure or a disconnected downstream.
    pub async fn end(&mut self) -> Result<()> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].ctx.watermark < WATERMARK_END {
                self.nodes[i].ctx.watermark = WATERMARK_END;
                self.run_hook(i, |op, out, ctx| op.on_watermark(WATERMARK_END, out, ctx))
                    .await?;
            }
            self.run_hook(i, |op, out, ctx| op.on_end(out, ctx)).await?;
            while self.nodes[i].operator.end_pending() {
                self.run_hook(i, |op, out, ctx| op.on_end(out, ctx)).await?;
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

    /// The synchronous half of a checkpoint: every node's local state and frozen keyed
    /// state, upstream first (the backend's native format for periodic checkpoints, the
    /// canonical one for savepoints).
    ///
    /// # Errors
    /// An operator or backend that cannot snapshot (the checkpoint is declined).
    pub fn snapshot(&mut self, barrier: Barrier) -> Result<Vec<NodeSnapshot>> {
        let checkpoint = barrier.checkpoint;
        let mut out = Vec::with_capacity(self.nodes.len());
        for n in &mut self.nodes {
            let local = n.operator.snapshot(checkpoint, &mut n.ctx)?;
            let keyed = match n.ctx.state.as_mut() {
                // Savepoints (and the final checkpoint of a stop) use the canonical format,
                // which every backend restores, with no file shared with other checkpoints.
                Some(state) if barrier.kind != BarrierKind::Checkpoint => {
                    let range = state.key_groups();
                    Some(Box::new(CanonicalSnapshot(state.snapshot(range)?))
                        as Box<dyn PendingSnapshot>)
                }
                Some(state) => Some(state.checkpoint(checkpoint)?),
                None => None,
            };
            out.push(NodeSnapshot {
                operator: Arc::clone(&n.ctx.operator),
                subtask: n.ctx.subtask,
                key_groups: n.ctx.key_groups,
                local,
                keyed,
                watermark: (n.ctx.watermark > WATERMARK_MIN).then_some(n.ctx.watermark),
            });
        }
        Ok(out)
    }

    /// Sends a barrier on every output, dead-letter outputs included, without waiting: the
    /// priority lanes get it now, the channels after what the outputs queue (the task loop
    /// [flushes](Self::flush) them before it reads new input).
    ///
    /// # Errors
    /// A disconnected downstream.
    pub fn forward_barrier(&mut self, barrier: Barrier) -> Result<()> {
        for node in &mut self.nodes {
            for o in node.outputs.iter_mut().chain(node.dead_letters.iter_mut()) {
                o.queue_barrier(barrier)?;
            }
        }
        Ok(())
    }

    /// Checkpoint `checkpoint` completed: sinks commit, backends may reuse its files.
    ///
    /// # Errors
    /// A failure to commit.
    pub fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        for n in &mut self.nodes {
            n.operator
                .notify_checkpoint_complete(checkpoint, &mut n.ctx)?;
            if let Some(state) = n.ctx.state.as_mut() {
                state.checkpoint_complete(checkpoint);
            }
        }
        Ok(())
    }

    /// Restores every node from checkpoint files, after `open`: local state from this
    /// subtask's own `.op` file, keyed state from the files of every old subtask whose key
    /// groups overlap this one's, and the watermark the node had (the smallest of the old
    /// subtasks' after a rescale), so that lateness is judged as before the restore even
    /// before every input said its watermark again. With `skip_first`, node 0 (a source's pass-through, whose
    /// `.op` file is the source position) gets no local state.
    ///
    /// # Errors
    /// Missing, corrupt or undecodable files.
    /// `received[i]`: node `i`'s keyed state was handed over from the version that took
    /// this savepoint ([`crate::state::handover`]) and is not read from its files.
    pub fn restore(
        &mut self,
        from: &TaskRestore,
        skip_first: bool,
        received: &[bool],
    ) -> Result<()> {
        let store = &*from.store;
        for (i, n) in self.nodes.iter_mut().enumerate() {
            let op = Arc::clone(&n.ctx.operator);
            let op: &str = &op;
            if !(skip_first && i == 0) {
                match read_local_state(store, &from.metadata, op, n.ctx.subtask, n.ctx.parallelism)?
                {
                    LocalState::Same(local) => n.operator.restore(local.as_deref(), &mut n.ctx)?,
                    LocalState::Rescaled(blobs) => {
                        let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
                        n.operator.restore_rescaled(&refs, &mut n.ctx)?;
                    }
                }
            }
            n.ctx.watermark =
                restored_watermark(&from.metadata, op, n.ctx.subtask, n.ctx.parallelism);
            let handed_over = received.get(i).copied().unwrap_or(false);
            let decision = from
                .plan
                .as_ref()
                .and_then(|p| p.node(op).map(|d| (p, d)))
                .filter(|(_, d)| d.filters_keyed_state());
            let max_parallelism = n.ctx.max_parallelism;
            let pipeline = Arc::clone(&n.ctx.pipeline);
            let range = n.ctx.key_groups;
            if let Some(state) = n.ctx.state.as_mut().filter(|_| !handed_over) {
                let filter = decision.map(|(plan, d)| KeyedFilter {
                    pipeline: &pipeline,
                    max_parallelism,
                    decision: d,
                    allow_non_restored_state: plan.allow_non_restored_state,
                });
                restore_keyed(&mut **state, store, &from.metadata, op, range, filter)?;
            }
            if n.ctx.migrate {
                running(&n.ctx.pipeline, &n.ctx.operator);
                n.operator.migrate_state(&mut n.ctx)?;
            }
            if n.ctx.state.is_some() {
                n.operator.state_restored(&mut n.ctx)?;
            }
        }
        Ok(())
    }

    /// Sends end-of-stream on every output without running anything (a task restored as
    /// finished).
    ///
    /// # Errors
    /// A disconnected downstream.
    pub async fn end_outputs(&mut self) -> Result<()> {
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
    /// Stop requested (SIGINT/SIGTERM). Without checkpoints, sources stop at the next batch
    /// boundary and the pipeline drains; with checkpoints, the supervisor takes a final
    /// checkpoint and then stops every task (the next run resumes from it).
    pub stop: AtomicBool,
    /// Wakes the supervisor when `stop` is set.
    pub stop_requested: tokio::sync::Notify,
}

impl Control {
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// What a task restores from.
#[derive(Clone)]
pub struct TaskRestore {
    /// The checkpoint storage.
    pub store: Arc<dyn CheckpointStore>,
    /// The checkpoint.
    pub metadata: Arc<CheckpointMetadata>,
    /// Restoring a savepoint (its keyed state may be handed over in memory by the version
    /// that took it, on a reload).
    pub savepoint: bool,
    /// What the restore does to each node's state (decided by
    /// [`crate::checkpoint::restore_plan::decide`] before anything starts): which named
    /// states it loads, under which kind, and whether `migrate` runs. `None` for a restart
    /// within a run from that run's own checkpoint: everything as recorded, no `migrate`.
    pub plan: Option<Arc<RestorePlan>>,
}

/// What the pipeline's supervisor tells a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskCommand {
    /// Sources: take checkpoint `barrier` now and send the barrier downstream.
    Trigger(Barrier),
    /// The checkpoint completed (commit).
    Complete(CheckpointId),
    /// Stop now, without end-of-input processing: the pipeline stops after a final
    /// checkpoint and resumes from it next time.
    Stop,
    /// Sources paused after a stop-with-savepoint barrier: end the input now (end-of-stream
    /// flows down, `emit: final` results are flushed, sinks commit); other tasks ignore it.
    Drain,
    /// Sources paused after a stop-with-savepoint barrier whose savepoint failed: go on
    /// producing (the stop is called off).
    Resume,
    /// Sources: send [`TaskEvent::Produced`] once the next records are produced (a
    /// probation waits for them); other tasks ignore it.
    NotifyProduced,
}

/// What a task tells the pipeline's supervisor.
#[derive(Debug)]
pub enum TaskEvent {
    /// The task's part of a checkpoint is written.
    Ack {
        /// The task.
        task: TaskId,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// One entry per node.
        states: Vec<SubtaskState>,
        /// From the first barrier of this checkpoint on an input to the snapshot (zero for
        /// sources and single-input tasks that never wait).
        alignment: std::time::Duration,
    },
    /// The task opened its operators and restored its state; it is about to process.
    Started {
        /// The task.
        task: TaskId,
    },
    /// A source produced records after a [`TaskCommand::NotifyProduced`].
    Produced,
    /// The task could not take part in a checkpoint.
    Decline {
        /// The task.
        task: TaskId,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// `None`: subsumed by a newer barrier (not a failure); otherwise the error's class
        /// and text.
        error: Option<(crate::base::error::ErrorClass, String)>,
    },
}

/// Checkpoint settings of a task.
#[derive(Clone)]
pub struct Checkpointing {
    /// Where snapshots go.
    pub store: Arc<dyn CheckpointStore>,
    /// Whether inputs are parked during alignment.
    pub mode: AlignmentMode,
    /// Unaligned checkpoints (exactly-once only): how long a checkpoint may align before the
    /// task takes it unaligned (zero: unaligned at the first barrier). `None`: always aligned.
    pub unaligned: Option<std::time::Duration>,
}

/// A task's link to its pipeline: identity, commands in, events out, checkpoint settings.
pub struct TaskEnv {
    /// The task.
    pub task: TaskId,
    /// Pipeline id (for errors).
    pub pipeline: Arc<str>,
    /// Id of the chain's first element (for errors).
    pub element: Arc<str>,
    /// Commands from the supervisor.
    pub commands: UnboundedReceiver<TaskCommand>,
    /// Events to the supervisor.
    pub events: UnboundedSender<TaskEvent>,
    /// Checkpoints, when enabled.
    pub checkpointing: Option<Checkpointing>,
    /// Restore from this checkpoint before the first record.
    pub restore: Option<TaskRestore>,
    /// Stop flag.
    pub control: Arc<Control>,
    /// Snapshot writes in flight; awaited before the task reports itself finished, so that
    /// its acknowledgements always precede its end.
    writes: Vec<JoinHandle<()>>,
    /// When the alignment in progress saw its first barrier.
    aligning_since: Option<std::time::Instant>,
    /// How long the last completed alignment took.
    alignment: std::time::Duration,
    /// The job's hand-over of keyed state between versions, when it has one.
    pub handover: Option<HandoverSlot>,
    /// A source tells the supervisor when it next produces records
    /// ([`TaskCommand::NotifyProduced`]).
    notify_produced: bool,
}

/// A task's link to its job's [`Handover`].
pub struct HandoverSlot {
    /// The job's parked states.
    pub registry: Arc<Handover>,
    /// The pipeline's state-backend configuration, as [`Handover::take`] compares it.
    pub backend: Arc<weir_schema::StateSpec>,
    /// By node: its keyed state was handed over (its restore skips the savepoint's files).
    pub received: Vec<bool>,
    /// The last stop-with-savepoint snapshot: its checkpoint, and each node's backend
    /// generation then.
    frozen: Option<(CheckpointId, Vec<Option<u64>>)>,
}

impl HandoverSlot {
    /// A slot for a task whose nodes' keyed state was handed over as `received` says.
    pub fn new(
        registry: Arc<Handover>,
        backend: Arc<weir_schema::StateSpec>,
        received: Vec<bool>,
    ) -> Self {
        Self {
            registry,
            backend,
            received,
            frozen: None,
        }
    }
}

impl TaskEnv {
    /// An environment for a task.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        task: TaskId,
        pipeline: Arc<str>,
        element: Arc<str>,
        commands: UnboundedReceiver<TaskCommand>,
        events: UnboundedSender<TaskEvent>,
        checkpointing: Option<Checkpointing>,
        restore: Option<TaskRestore>,
        control: Arc<Control>,
    ) -> Self {
        Self {
            task,
            pipeline,
            element,
            commands,
            events,
            checkpointing,
            restore,
            control,
            writes: Vec::new(),
            aligning_since: None,
            alignment: std::time::Duration::ZERO,
            handover: None,
            notify_produced: false,
        }
    }

    /// By node: whether its keyed state was handed over rather than restored from files.
    fn received(&self) -> Vec<bool> {
        self.handover
            .as_ref()
            .map(|h| h.received.clone())
            .unwrap_or_default()
    }

    /// Tells the supervisor the task is open and restored.
    fn started(&self) {
        let _ = self.events.send(TaskEvent::Started { task: self.task });
    }

    /// A source produced records: tells the supervisor when it asked to be told.
    fn produced(&mut self) {
        if std::mem::take(&mut self.notify_produced) {
            let _ = self.events.send(TaskEvent::Produced);
        }
    }

    /// Starts writing a snapshot off the task; the ack (or decline) follows when it is done.
    fn write_async(&mut self, checkpoint: CheckpointId, snapshots: Vec<NodeSnapshot>) {
        let alignment = std::mem::take(&mut self.alignment);
        self.write_with_channel_state(checkpoint, snapshots, Vec::new(), alignment);
    }

    /// [`Self::write_async`] with the channel state of an unaligned snapshot, written as the
    /// head node's `.channel` file (none when empty).
    fn write_with_channel_state(
        &mut self,
        checkpoint: CheckpointId,
        snapshots: Vec<NodeSnapshot>,
        channel: Vec<ChannelEntry>,
        alignment: std::time::Duration,
    ) {
        let Some(ck) = &self.checkpointing else {
            return;
        };
        let store = Arc::clone(&ck.store);
        let events = self.events.clone();
        let task = self.task;
        let head = snapshots
            .first()
            .map(|s| (Arc::clone(&s.operator), s.subtask));
        self.writes.retain(|h| !h.is_finished());
        self.writes.push(tokio::task::spawn_blocking(move || {
            let written = write_snapshots(&*store, checkpoint, snapshots).and_then(|mut states| {
                if let (Some((op, subtask)), Some(first)) = (head, states.first_mut())
                    && let Some(file) =
                        write_channel_state(&*store, checkpoint, &op, subtask, &channel)?
                {
                    first.files.push(file);
                }
                Ok(states)
            });
            let event = match written {
                Ok(states) => TaskEvent::Ack {
                    task,
                    checkpoint,
                    states,
                    alignment,
                },
                Err(e) => TaskEvent::Decline {
                    task,
                    checkpoint,
                    error: Some((e.class(), e.to_string())),
                },
            };
            let _ = events.send(event);
        }));
    }

    fn decline(&self, checkpoint: CheckpointId, error: Option<&RunError>) {
        let _ = self.events.send(TaskEvent::Decline {
            task: self.task,
            checkpoint,
            error: error.map(|e| (e.class(), e.to_string())),
        });
    }

    /// Waits for every snapshot write in flight.
    async fn settle(&mut self) {
        for h in self.writes.drain(..) {
            let _ = h.await;
        }
    }
}

/// Takes a checkpoint on a task: synchronous half, barrier downstream, asynchronous half.
/// A failed synchronous half declines the checkpoint but still forwards the barrier, so
/// that downstream alignment is not stuck.
async fn checkpoint_task(
    chain: &mut ChainTask,
    env: &mut TaskEnv,
    barrier: Barrier,
    source: Option<&mut Box<dyn Source>>,
) -> Result<()> {
    tracing::trace!(pipeline = %env.pipeline, task = %env.task, checkpoint = barrier.checkpoint, queued = chain.has_queued(), "Snapshot.");
    let taken = snapshot_sync(chain, env, barrier, source);
    chain.forward_barrier(barrier)?;
    match taken {
        Ok(snaps) => env.write_async(barrier.checkpoint, snaps),
        Err(e) => decline_failed(env, barrier.checkpoint, &e),
    }
    Ok(())
}

fn decline_failed(env: &TaskEnv, checkpoint: CheckpointId, e: &RunError) {
    // The supervisor reports the failed checkpoint once, with this error as its reason.
    tracing::debug!(pipeline = %env.pipeline, task = %env.task, checkpoint, error = %e, "Snapshot failed; declining the checkpoint.");
    env.decline(checkpoint, Some(e));
}

/// The synchronous half of a task's checkpoint (and the hand-over's note of a
/// stop-with-savepoint).
fn snapshot_sync(
    chain: &mut ChainTask,
    env: &mut TaskEnv,
    barrier: Barrier,
    source: Option<&mut Box<dyn Source>>,
) -> Result<Vec<NodeSnapshot>> {
    let taken = (|| {
        let position = match source {
            Some(s) => Some(s.snapshot_for(barrier.checkpoint)?),
            None => None,
        };
        let mut snaps = chain.snapshot(barrier)?;
        if let (Some(p), Some(first)) = (position, snaps.first_mut()) {
            first.local = Some(p);
        }
        Ok::<_, RunError>(snaps)
    })();
    if let (Ok(_), Some(h)) = (&taken, env.handover.as_mut())
        && barrier.kind == BarrierKind::SavepointThenStop
    {
        let generations = chain
            .nodes
            .iter()
            .map(|n| n.ctx.state.as_ref().and_then(|s| s.generation()))
            .collect();
        h.frozen = Some((barrier.checkpoint, generations));
    }
    taken
}

/// Runs a source task: polls the source and pushes each batch through the chain (whose first
/// node is the source's pass-through); takes checkpoints when the supervisor triggers them.
///
/// # Errors
/// The source's or an operator's failure.
pub async fn run_source(
    mut source: Box<dyn Source>,
    mut sctx: SourceContext,
    mut chain: ChainTask,
    mut env: TaskEnv,
) -> Result<()> {
    let result = async {
        source.open(&mut sctx)?;
        chain.open()?;
        if let Some(from) = env.restore.clone() {
            let op = chain.nodes.first().map(|n| Arc::clone(&n.ctx.operator));
            if let Some(op) = op {
                match read_local_state(
                    &*from.store,
                    &from.metadata,
                    &op,
                    sctx.subtask,
                    sctx.parallelism,
                )? {
                    LocalState::Same(Some(position)) => source.restore(&position)?,
                    LocalState::Same(None) => {}
                    LocalState::Rescaled(blobs) => {
                        let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
                        source.restore_rescaled(&refs, &sctx)?;
                    }
                }
            }
            chain.restore(&from, true, &env.received())?;
        }
        env.started();
        // A restored source with event time says its watermark before any record, so that
        // downstream judges lateness as the run before the restore did.
        if let Some(w) = source.take_watermark() {
            chain.advance_watermark(w).await?;
        }
        let processing = chain.nodes[0].ctx.clock.clone();
        // After a stop-with-savepoint barrier the source is paused: it produces nothing
        // more and waits for the stop, the drain, or a resume when the savepoint failed.
        // Every command goes through `source_command`, wherever it is received, so that a
        // drain or resume that arrives together with other commands is never lost.
        let mut paused = false;
        // When the source's lag was last asked for (detailed metrics only).
        let mut lag_at: Option<Instant> = None;
        let flow = 'run: loop {
            // Under backpressure the outputs queue what their full channels do not take: the
            // source polls again only when they are empty, and takes commands (a checkpoint
            // trigger) meanwhile. A snapshot then covers every record it polled; the queued
            // ones reach the receivers before the barrier, which record them as channel state
            // when the checkpoint is unaligned.
            if chain.has_queued() {
                let flow = tokio::select! {
                    biased;
                    Some(cmd) = env.commands.recv() => {
                        source_command(cmd, &mut chain, &mut env, &mut source, &mut paused).await?
                    }
                    r = chain.flush() => {
                        r?;
                        SourceFlow::Continue
                    }
                };
                if flow != SourceFlow::Continue {
                    break 'run flow;
                }
                continue;
            }
            // Due processing time first: a barrier triggered after the clock moved comes
            // after what the move fired.
            if !paused && let Some(t) = chain.next_processing_time() {
                let now = processing.now_ms();
                if now >= t {
                    chain.fire_processing_time(now).await?;
                }
            }
            while let Ok(cmd) = env.commands.try_recv() {
                match source_command(cmd, &mut chain, &mut env, &mut source, &mut paused).await? {
                    SourceFlow::Continue => {}
                    end => break 'run end,
                }
            }
            if env.control.should_stop() && env.checkpointing.is_none() {
                break SourceFlow::EndInput;
            }
            // A barrier forwarded by a command just now may wait in an output's queue (its
            // channel was full): it goes out (at the top of the loop) before the source
            // polls again or, paused after a stop-with-savepoint, waits for the next command.
            if chain.has_queued() {
                continue;
            }
            if paused {
                let flow = match env.commands.recv().await {
                    Some(cmd) => {
                        source_command(cmd, &mut chain, &mut env, &mut source, &mut paused).await?
                    }
                    None => SourceFlow::EndInput,
                };
                match flow {
                    SourceFlow::Continue => continue,
                    end => break end,
                }
            }
            let mut out = Vec::with_capacity(BATCH_SIZE);
            let skipped_before = sctx.skipped;
            let bytes_before = sctx.bytes_read;
            let metrics = &chain.nodes[0].metrics;
            let clock = metrics.detailed.then(Instant::now);
            let poll = source.poll(&mut out, &mut sctx)?;
            let failed = sctx.skipped - skipped_before + sctx.dead_letters.len() as u64;
            if failed > 0 {
                metrics.add(0, 0, failed);
            }
            metrics.add_bytes_read(sctx.bytes_read - bytes_before);
            if let Some(t0) = clock {
                metrics.add_time(t0.elapsed(), Duration::ZERO);
                if lag_at.is_none_or(|at| t0.duration_since(at) >= LAG_EVERY)
                    || matches!(poll, Poll::Done)
                {
                    metrics.set_lag(source.lag());
                    metrics.set_partitions(source.partitions());
                    lag_at = Some(t0);
                }
            }
            if !sctx.dead_letters.is_empty() {
                // Sent before the next snapshot, like the records of the same poll: a restore
                // resumes after them, so no dead letter is lost or repeated.
                let head = &mut chain.nodes[0];
                head.ctx.dead_letters.append(&mut sctx.dead_letters);
                ChainTask::flush_dead_letters(head).await?;
            }
            if !out.is_empty() {
                let mut batch = Batch::new(out);
                // The event times the source read, when it read one for every record.
                if sctx.times.len() == batch.len() {
                    batch.times = std::mem::take(&mut sctx.times);
                }
                sctx.times.clear();
                chain.push_buffered(0, batch).await?;
                env.produced();
            }
            if let Some(w) = source.take_watermark() {
                chain.advance_watermark(w).await?;
            }
            match poll {
                // Yield after every batch, not only when tokio's budget runs out: the task
                // that the batch just woke (downstream, often on this worker) then processes
                // it while it is still in this core's cache, and the first records reach the
                // end of the pipeline within milliseconds. Waiting for the budget let each
                // source run ~64 batches ahead: W1 at parallelism 2 took 30 % more CPU (the
                // records crossed cores cold) and its first record took 150-200 ms to get
                // through a scripted map.
                Poll::Ready => tokio::task::yield_now().await,
                // What the outputs queue goes first (at the top of the loop).
                Poll::Idle(_) if chain.has_queued() => {}
                Poll::Idle(d) => {
                    let wake = chain.next_processing_time();
                    let flow = tokio::select! {
                        biased;
                        // Before commands, for the same reason as above.
                        () = processing.wait_until(wake.unwrap_or(i64::MAX)), if wake.is_some() => {
                            SourceFlow::Continue
                        }
                        Some(cmd) = env.commands.recv() => {
                            source_command(cmd, &mut chain, &mut env, &mut source, &mut paused)
                                .await?
                        }
                        () = tokio::time::sleep(d) => SourceFlow::Continue,
                    };
                    if flow != SourceFlow::Continue {
                        break flow;
                    }
                }
                Poll::Done => break SourceFlow::EndInput,
            }
        };
        source.close()?;
        if flow == SourceFlow::Stop {
            chain.close()?;
        } else {
            chain.end().await?;
        }
        env.settle().await;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = chain.close();
    }
    chain.free_state(&env);
    result
}

/// How often a source task asks its source for its lag.
const LAG_EVERY: Duration = Duration::from_secs(1);

/// What a source task does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SourceFlow {
    /// Go on (polling, or waiting while paused).
    Continue,
    /// Stop now, without end-of-input processing.
    Stop,
    /// End the input: end-of-stream flows down, `emit: final` results are flushed.
    EndInput,
}

/// Carries out a command on a source task. A stop-with-savepoint trigger pauses the source,
/// a resume unpauses it, a drain ends its input.
async fn source_command(
    cmd: TaskCommand,
    chain: &mut ChainTask,
    env: &mut TaskEnv,
    source: &mut Box<dyn Source>,
    paused: &mut bool,
) -> Result<SourceFlow> {
    match cmd {
        TaskCommand::Trigger(barrier) => {
            if barrier.kind == BarrierKind::SavepointThenStop {
                *paused = true;
            }
            checkpoint_task(chain, env, barrier, Some(source)).await?;
            Ok(SourceFlow::Continue)
        }
        TaskCommand::Complete(n) => {
            source.notify_checkpoint_complete(n)?;
            chain.notify_complete(n).map(|()| SourceFlow::Continue)
        }
        TaskCommand::Stop => Ok(SourceFlow::Stop),
        TaskCommand::Drain => Ok(SourceFlow::EndInput),
        TaskCommand::Resume => {
            *paused = false;
            Ok(SourceFlow::Continue)
        }
        TaskCommand::NotifyProduced => {
            env.notify_produced = true;
            Ok(SourceFlow::Continue)
        }
    }
}

/// A chain task whose batch took at least this long yields before its next one.
const YIELD_AFTER: Duration = Duration::from_millis(1);

/// An unaligned snapshot whose channel state is still being recorded: its files are written
/// (and the checkpoint acknowledged) once every input delivered its in-band barrier.
struct Unaligned {
    log: ChannelLog,
    snapshots: Vec<NodeSnapshot>,
    alignment: Duration,
}

/// Runs a task fed by channels until every input has delivered end-of-stream, aligning
/// barriers as the pipeline's checkpoint mode says. With unaligned checkpoints, a checkpoint
/// barrier announced on a priority lane (or, with an `aligned_timeout`, one whose alignment
/// lasted too long) is taken at once and the records it overtook are recorded as channel
/// state; a restored task replays its channel state before any new input.
///
/// # Errors
/// An operator failure, or [`RunError::Disconnected`] when an upstream vanished early.
pub async fn run_chain(
    mut inputs: InputLease,
    mut chain: ChainTask,
    mut env: TaskEnv,
) -> Result<()> {
    let result = async {
        chain.open()?;
        let mut replay = Vec::new();
        if let Some(from) = env.restore.clone() {
            chain.restore(&from, false, &env.received())?;
            let head = &chain.nodes[0].ctx;
            replay = read_channel_state(
                &*from.store,
                &from.metadata,
                &head.operator,
                head.subtask,
                head.parallelism,
            )?;
        }
        env.started();
        tracing::trace!(task = %env.task, "Chain running.");
        let n = inputs.get().len();
        let mode = env
            .checkpointing
            .as_ref()
            .map_or(AlignmentMode::AtLeastOnce, |c| c.mode);
        let unaligned = env.checkpointing.as_ref().and_then(|c| c.unaligned);
        let mut aligner = BarrierAligner::new(n as u32, mode);
        // A restored task goes on from the watermark it had (see `ChainTask::restore`).
        let mut watermarks = WatermarkCombiner::new(n).starting_at(chain.nodes[0].ctx.watermark);
        for i in 0..n {
            if inputs.get().ended(i) {
                let _ = aligner.on_end_of_stream(i as u32);
                let _ = watermarks.on_end(i);
            }
        }
        // The restored checkpoint's channel state goes first, before any new input.
        for entry in replay {
            match entry {
                ChannelEntry::Records { batch, .. } => chain.push_buffered(0, batch).await?,
                ChannelEntry::Watermark { input, watermark } if (input as usize) < n => {
                    let advance = watermarks.on_watermark(input as usize, watermark);
                    follow_watermark(advance, &mut chain).await?;
                }
                ChannelEntry::Watermark { .. } => {}
            }
        }
        let mut pending: Option<Unaligned> = None;
        // The newest checkpoint barrier seen (announced or in-band) and since when; with an
        // `aligned_timeout`, it is taken unaligned once that much time has passed.
        let mut first_seen: Option<(Barrier, Instant)> = None;
        // A checkpoint due to go unaligned while a savepoint announced before it is still to
        // be taken here: it goes right after the savepoint's snapshot, never ahead of it.
        let mut deferred: Option<(Barrier, Instant)> = None;
        let clock = chain.nodes[0].ctx.clock.clone();
        while !inputs.get().all_ended() {
            // An unaligned snapshot records what its barrier overtook as soon as it is queued,
            // not when the task gets to process it: the checkpoint then completes without
            // waiting for the queues to drain (and the senders blocked on them go on).
            if let Some(u) = pending.as_mut() {
                prefetch_channel_state(&mut u.log, inputs.get());
                if u.log.is_complete()
                    && let Some(u) = pending.take()
                {
                    finish_unaligned(u, &mut env);
                }
            }
            let wake = chain.next_processing_time();
            let deadline = match (unaligned, first_seen) {
                (Some(t), Some((_, since))) if !t.is_zero() => Some(since + t),
                _ => None,
            };
            // Under backpressure the outputs queue what their full channels do not take (one
            // batch's output at most): no new input is read, and no timer fires, until they
            // are empty, but commands, priority lanes and the channel state of an open
            // unaligned snapshot still are. A barrier announced meanwhile is taken at once:
            // the snapshot covers every record processed, and what the outputs queue goes
            // downstream before the in-band barrier (channel state of the receivers).
            let queued = chain.has_queued();
            // The inputs whose channel state is being recorded (none without an open log).
            let logging: Vec<bool> = match &pending {
                Some(u) => (0..n as u32).map(|i| u.log.is_logging(i)).collect(),
                None => Vec::new(),
            };
            let received = tokio::select! {
                biased;
                // Due processing time before anything read after it.
                () = clock.wait_until(wake.unwrap_or(i64::MAX)), if wake.is_some() && !queued => {
                    chain.fire_processing_time(clock.now_ms()).await?;
                    continue;
                }
                Some(cmd) = env.commands.recv() => {
                    match cmd {
                        TaskCommand::Complete(n) => chain.notify_complete(n)?,
                        TaskCommand::Stop => {
                            chain.close()?;
                            env.settle().await;
                            return Ok(());
                        }
                        TaskCommand::Trigger(_)
                        | TaskCommand::Drain
                        | TaskCommand::Resume
                        | TaskCommand::NotifyProduced => {}
                    }
                    continue;
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now).into()), if deadline.is_some() => {
                    // The alignment lasted longer than `aligned_timeout`: go unaligned.
                    if let Some((barrier, since)) = first_seen.take() {
                        if aligner.savepoint_ahead(barrier.checkpoint) {
                            deferred = Some((barrier, since));
                        } else {
                            start_unaligned(barrier, since, &mut aligner, &mut pending, inputs.get(), &mut chain, &mut env).await?;
                        }
                    }
                    continue;
                }
                r = inputs.get().recv_logging(
                    |i| queued || aligner.is_blocked(i),
                    |i| logging.get(i as usize).copied().unwrap_or(false),
                ) => r,
                r = chain.flush(), if queued => {
                    r?;
                    continue;
                }
            };
            let (input, message, fresh) = match received {
                Received::Message(i, m) => (i, m, true),
                // Recorded when it was prefetched.
                Received::Prefetched(i, m) => (i, m, false),
                Received::Logged(i, m) => {
                    if let Some(u) = pending.as_mut() {
                        log_message(&mut u.log, i, &m);
                    }
                    inputs.get().buffer(i, m);
                    continue;
                }
                Received::Priority(b) => {
                    // A savepoint's announcement is only a notice (it is aligned in band).
                    aligner.announced(b);
                    if let Some(timeout) = unaligned
                        && b.kind == BarrierKind::Checkpoint
                        && !aligner.is_done(b.checkpoint)
                    {
                        let since = match first_seen {
                            Some((f, t)) if f.checkpoint == b.checkpoint => t,
                            _ => Instant::now(),
                        };
                        if timeout.is_zero() {
                            first_seen = None;
                            if aligner.savepoint_ahead(b.checkpoint) {
                                if deferred.is_none_or(|(d, _)| d.checkpoint < b.checkpoint) {
                                    deferred = Some((b, since));
                                }
                            } else {
                                start_unaligned(b, since, &mut aligner, &mut pending, inputs.get(), &mut chain, &mut env).await?;
                            }
                        } else if first_seen.is_none_or(|(f, _)| f.checkpoint < b.checkpoint) {
                            first_seen = Some((b, since));
                        }
                    }
                    continue;
                }
                Received::Closed(_) => {
                    return Err(RunError::Disconnected {
                        pipeline: env.pipeline.to_string(),
                        element: env.element.to_string(),
                    });
                }
            };
            if let Some(u) = pending.as_mut() {
                if fresh {
                    u.log.record(input, &message);
                }
                match &message {
                    Message::Barrier(b) => u.log.on_barrier(input, b.checkpoint),
                    Message::EndOfStream => u.log.on_end(input),
                    Message::Records(_) | Message::Watermark(_) => {}
                }
                if u.log.is_complete()
                    && let Some(u) = pending.take()
                {
                    finish_unaligned(u, &mut env);
                }
            }
            let step = match message {
                Message::Records(batch) => {
                    if let Some(head) = chain.nodes.first()
                        && head.metrics.detailed
                    {
                        head.metrics.set_queue_fill(inputs.get().fill());
                    }
                    let started = Instant::now();
                    chain.push_buffered(0, batch).await?;
                    // A slow batch (a throttled operator) lets the other tasks of this worker
                    // run before the next: buffered input is served without waiting, so the
                    // task might otherwise hold its thread for many batches, and a task that
                    // it woke (an upstream sender that got room) would wait there all along,
                    // on the same worker, holding its barrier back.
                    if started.elapsed() >= YIELD_AFTER {
                        tokio::task::yield_now().await;
                    }
                    continue;
                }
                Message::Barrier(b) => {
                    tracing::trace!(task = %env.task, input, checkpoint = b.checkpoint, fresh, "Barrier in.");
                    if aligner.aligning().is_none() {
                        env.aligning_since = Some(Instant::now());
                    }
                    if unaligned.is_some()
                        && b.kind == BarrierKind::Checkpoint
                        && !aligner.is_done(b.checkpoint)
                        && first_seen.is_none_or(|(f, _)| f.checkpoint < b.checkpoint)
                    {
                        first_seen = Some((b, Instant::now()));
                    }
                    aligner.on_barrier(input, b)
                }
                Message::Watermark(w) => {
                    let advance = watermarks.on_watermark(input as usize, w);
                    follow_watermark(advance, &mut chain).await?;
                    continue;
                }
                Message::EndOfStream => {
                    tracing::trace!(task = %env.task, input, "End in.");
                    let advance = watermarks.on_end(input as usize);
                    follow_watermark(advance, &mut chain).await?;
                    aligner.on_end_of_stream(input)
                }
            };
            let step = step.map_err(|e| RunError::Internal(format!("{}: {e}", env.element)))?;
            if let AlignerAction::Snapshot(b) = step.action {
                env.alignment = env
                    .aligning_since
                    .take()
                    .map(|t| t.elapsed())
                    .unwrap_or_default();
                // An unaligned snapshot still recording an older checkpoint can no longer
                // complete here (its checkpoint was aborted upstream).
                if let Some(old) = pending.take_if(|u| u.log.checkpoint() < b.checkpoint) {
                    env.decline(old.log.checkpoint(), None);
                }
            }
            if first_seen.is_some_and(|(f, _)| aligner.is_done(f.checkpoint)) {
                first_seen = None;
            }
            apply_step(step, &mut chain, &mut env).await?;
            if let Some((b, since)) =
                deferred.take_if(|(b, _)| !aligner.savepoint_ahead(b.checkpoint))
            {
                start_unaligned(b, since, &mut aligner, &mut pending, inputs.get(), &mut chain, &mut env).await?;
            }
        }
        if let Some(u) = pending.take() {
            finish_unaligned(u, &mut env);
        }
        chain.end().await?;
        env.settle().await;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = chain.close();
    }
    chain.free_state(&env);
    result
}

/// Takes checkpoint `barrier` unaligned, if it is not done here yet: the synchronous half of
/// the snapshot now, the barrier downstream (on the priority lanes first), and a channel log
/// for the inputs that have not delivered it; the files are written when the log completes.
async fn start_unaligned(
    barrier: Barrier,
    since: Instant,
    aligner: &mut BarrierAligner,
    pending: &mut Option<Unaligned>,
    inputs: &InputSet,
    chain: &mut ChainTask,
    env: &mut TaskEnv,
) -> Result<()> {
    let Some(start) = aligner.unaligned(barrier) else {
        return Ok(());
    };
    for id in start.aborted {
        env.decline(id, None);
    }
    if let Some(old) = pending.take() {
        env.decline(old.log.checkpoint(), None);
    }
    env.aligning_since = None;
    let alignment = since.elapsed();
    tracing::trace!(pipeline = %env.pipeline, task = %env.task, checkpoint = barrier.checkpoint, queued = chain.has_queued(), "Unaligned snapshot.");
    let taken = snapshot_sync(chain, env, barrier, None);
    chain.forward_barrier(barrier)?;
    match taken {
        Ok(snapshots) => {
            let mut u = Unaligned {
                log: ChannelLog::new(barrier.checkpoint, start.log),
                snapshots,
                alignment,
            };
            log_buffered(&mut u.log, inputs);
            if u.log.is_complete() {
                finish_unaligned(u, env);
            } else {
                *pending = Some(u);
            }
        }
        Err(e) => decline_failed(env, barrier.checkpoint, &e),
    }
    Ok(())
}

/// Records one message of input `i` in an open channel log; returns whether the input
/// still logs after it.
fn log_message(log: &mut ChannelLog, i: u32, m: &Message) -> bool {
    log.record(i, m);
    match m {
        Message::Barrier(b) => log.on_barrier(i, b.checkpoint),
        Message::EndOfStream => log.on_end(i),
        Message::Records(_) | Message::Watermark(_) => {}
    }
    log.is_logging(i)
}

/// Moves what is queued on every input an unaligned snapshot still records into the task's
/// input buffers, recording it, up to each input's in-band barrier.
fn prefetch_channel_state(log: &mut ChannelLog, inputs: &mut InputSet) {
    for i in 0..inputs.len() as u32 {
        if log.is_logging(i) {
            inputs.prefetch(i, |m| log_message(log, i, m));
        }
    }
}

/// A new channel log starts with what the task already took out of its channels but has not
/// processed (prefetched for an earlier checkpoint): the snapshot has not seen it either, and
/// it will not pass the log again when it is served.
fn log_buffered(log: &mut ChannelLog, inputs: &InputSet) {
    for i in 0..inputs.len() as u32 {
        if log.is_logging(i) {
            for m in inputs.buffered(i) {
                if !log_message(log, i, m) {
                    break;
                }
            }
        }
    }
}

/// Writes an unaligned snapshot whose channel state is complete, then acknowledges it.
fn finish_unaligned(u: Unaligned, env: &mut TaskEnv) {
    let checkpoint = u.log.checkpoint();
    tracing::trace!(pipeline = %env.pipeline, task = %env.task, checkpoint, "Channel state recorded.");
    env.write_with_channel_state(checkpoint, u.snapshots, u.log.into_entries(), u.alignment);
}

/// Does what the combined watermark says: advance the chain, or tell downstream that this
/// task is idle or active again.
async fn follow_watermark(advance: Advance, chain: &mut ChainTask) -> Result<()> {
    match advance {
        Advance::None => Ok(()),
        Advance::To(w) | Advance::Active(w) => chain.advance_watermark(Watermark::At(w)).await,
        Advance::Idle => chain.advance_watermark(Watermark::Idle).await,
    }
}

async fn apply_step(step: AlignerStep, chain: &mut ChainTask, env: &mut TaskEnv) -> Result<()> {
    for id in step.aborted {
        env.decline(id, None);
    }
    if let AlignerAction::Snapshot(barrier) = step.action {
        if env.checkpointing.is_some() {
            checkpoint_task(chain, env, barrier, None).await?;
        } else {
            chain.forward_barrier(barrier)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::*;
    use crate::checkpoint::MemoryStore;

    /// A source that never ends and produces nothing: it only counts its polls.
    struct Endless {
        polls: Arc<AtomicU64>,
    }

    impl Source for Endless {
        fn poll(&mut self, _out: &mut Vec<Dynamic>, _ctx: &mut SourceContext) -> Result<Poll> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            Ok(Poll::Idle(Duration::from_millis(1)))
        }
    }

    /// A pass-through that notes whether its input ended (`on_end`).
    struct EndProbe {
        ended: Arc<AtomicBool>,
    }

    impl Operator for EndProbe {
        fn process(&mut self, _batch: &mut Batch, _ctx: &mut OperatorContext) -> Result<()> {
            Ok(())
        }

        fn on_end(&mut self, _out: &mut Vec<Dynamic>, _ctx: &mut OperatorContext) -> Result<()> {
            self.ended.store(true, Ordering::Relaxed);
            Ok(())
        }
    }

    struct Probe {
        polls: Arc<AtomicU64>,
        ended: Arc<AtomicBool>,
        commands: mpsc::UnboundedSender<TaskCommand>,
        task: tokio::task::JoinHandle<Result<()>>,
    }

    /// Spawns a source task over [`Endless`] with `queued` already waiting in its command
    /// channel (as when the supervisor sends several commands at once).
    fn spawn_source(queued: &[TaskCommand]) -> Probe {
        spawn_source_with(queued, Vec::new())
    }

    /// [`spawn_source`] whose chain sends on `outputs`.
    fn spawn_source_with(queued: &[TaskCommand], outputs: Vec<Output>) -> Probe {
        let polls = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(AtomicBool::new(false));
        let (commands, rx) = mpsc::unbounded_channel();
        for c in queued {
            commands.send(*c).expect("the task's receiver is alive");
        }
        let (events, _events_rx) = mpsc::unbounded_channel();
        let env = TaskEnv::new(
            TaskId::new(0, 0),
            "p".into(),
            "src".into(),
            rx,
            events,
            Some(Checkpointing {
                store: Arc::new(MemoryStore::new()),
                mode: AlignmentMode::ExactlyOnce,
                unaligned: None,
            }),
            None,
            Arc::new(Control::default()),
        );
        let chain = ChainTask {
            nodes: vec![ChainNode {
                operator: Box::new(EndProbe {
                    ended: Arc::clone(&ended),
                }),
                ctx: OperatorContext::standalone("p", "src", 128),
                metrics: Arc::new(SubtaskMetrics::default()),
                outputs,
                dead_letters: Vec::new(),
                late_from: 0,
                counts_output: true,
                fault: None,
            }],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let sctx = SourceContext::new("p", "src", 0, 1, None);
        let source = Box::new(Endless {
            polls: Arc::clone(&polls),
        });
        let task = tokio::spawn(run_source(source, sctx, chain, env));
        Probe {
            polls,
            ended,
            commands,
            task,
        }
    }

    /// A sink that notes the largest batch and the records it received.
    struct BatchProbe {
        largest: Arc<AtomicU64>,
        records: Arc<AtomicU64>,
    }

    impl Operator for BatchProbe {
        fn process(&mut self, batch: &mut Batch, _ctx: &mut OperatorContext) -> Result<()> {
            self.largest
                .fetch_max(batch.len() as u64, Ordering::Relaxed);
            self.records
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            batch.records.clear();
            Ok(())
        }
    }

    fn node(operator: Box<dyn Operator>, id: &str, outputs: Vec<Output>) -> ChainNode {
        ChainNode {
            operator,
            ctx: OperatorContext::standalone("p", id, 128),
            metrics: Arc::new(SubtaskMetrics::default()),
            outputs,
            dead_letters: Vec::new(),
            late_from: 0,
            counts_output: true,
            fault: None,
        }
    }

    #[tokio::test]
    async fn chained_expansion_goes_downstream_in_batch_sized_pieces() {
        use crate::operators::flat_map::FlatMapOperator;
        use crate::operators::reduce::tests::script;
        use crate::runtime::exchange::Target;

        // Two records, each becomes 300 x 500 = 150 000: 300 000 in all.
        let wide = script("fn flat_map(r) { let a = []; a.pad(300, r); a }");
        let wider = script("fn flat_map(r) { let a = []; a.pad(500, r); a }");
        let (tx, mut rx) = mpsc::channel(crate::base::message::CHANNEL_CAPACITY);
        let exchange = Output::new(
            crate::plan::Partitioning::Forward,
            vec![Target::new(tx)],
            128,
            "p".into(),
            "wider".into(),
        );
        let (largest, records) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let probe = BatchProbe {
            largest: Arc::clone(&largest),
            records: Arc::clone(&records),
        };
        let mut chain = ChainTask {
            nodes: vec![
                node(
                    Box::new(FlatMapOperator::new(wide, 10_000)),
                    "wide",
                    Vec::new(),
                ),
                node(
                    Box::new(FlatMapOperator::new(wider, 10_000)),
                    "wider",
                    vec![exchange],
                ),
                node(Box::new(probe), "probe", Vec::new()),
            ],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let reader = tokio::spawn(async move {
            let (mut largest, mut records) = (0, 0);
            while let Some(Message::Records(b)) = rx.recv().await {
                largest = largest.max(b.len());
                records += b.len();
            }
            (largest, records)
        });
        let input = Batch::new(vec![Dynamic::from(1_i64), Dynamic::from(2_i64)]);
        chain.push(0, input).await.expect("runs");
        drop(chain);
        let (sent_largest, sent) = reader.await.expect("reader");
        assert_eq!(
            records.load(Ordering::Relaxed),
            300_000,
            "every record arrives"
        );
        assert_eq!(sent, 300_000);
        // `wider` stops a step once it holds a batch (at most one input record's 500
        // outputs past BATCH_SIZE); the next node takes that in BATCH_SIZE pieces, and so
        // does the exchange.
        assert!(
            largest.load(Ordering::Relaxed) <= BATCH_SIZE as u64,
            "largest batch in the chain: {}",
            largest.load(Ordering::Relaxed)
        );
        assert!(
            sent_largest <= BATCH_SIZE,
            "largest batch sent: {sent_largest}"
        );
    }

    /// Turns each record into a dead letter and a late record.
    struct SideProbe;

    impl Operator for SideProbe {
        fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
            for r in batch.records.drain(..) {
                ctx.late.push(r.clone());
                ctx.late_dropped += 1;
                ctx.errors += 1;
                ctx.dead_letters.push(r);
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn late_records_and_dead_letters_go_to_their_own_side_outputs() {
        use crate::runtime::exchange::Target;

        let mut receivers = Vec::new();
        let mut sides = Vec::new();
        for name in ["dlq", "late"] {
            let (tx, rx) = mpsc::channel(crate::base::message::CHANNEL_CAPACITY);
            sides.push(Output::new(
                crate::plan::Partitioning::Forward,
                vec![Target::new(tx)],
                128,
                "p".into(),
                name.into(),
            ));
            receivers.push(rx);
        }
        let mut side = node(Box::new(SideProbe), "w", Vec::new());
        side.dead_letters = sides;
        side.late_from = 1;
        let metrics = Arc::clone(&side.metrics);
        let mut chain = ChainTask {
            nodes: vec![side],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let input = Batch::new(vec![Dynamic::from(1_i64), Dynamic::from(2_i64)]);
        chain.push(0, input).await.expect("runs");
        drop(chain);
        for mut rx in receivers {
            let mut got = 0;
            while let Some(Message::Records(b)) = rx.recv().await {
                got += b.len();
            }
            assert_eq!(got, 2, "each side output gets its own records once");
        }
        let f = metrics.figures();
        assert_eq!((f.dead_lettered, f.late_sent, f.late_dropped), (2, 2, 2));
    }

    const STOP_SAVEPOINT_BARRIER: Barrier = Barrier {
        checkpoint: 1,
        kind: BarrierKind::SavepointThenStop,
    };

    const STOP_SAVEPOINT: TaskCommand = TaskCommand::Trigger(STOP_SAVEPOINT_BARRIER);

    #[tokio::test]
    async fn a_drain_queued_behind_the_stop_savepoint_ends_the_input() {
        // The supervisor sends `Complete` and `Drain` back to back once the savepoint
        // completed: the drain must not be lost whichever receive picks it up.
        let p = spawn_source(&[STOP_SAVEPOINT, TaskCommand::Complete(1), TaskCommand::Drain]);
        let result = tokio::time::timeout(Duration::from_secs(60), p.task)
            .await
            .expect("the drained source task ends")
            .expect("the task does not panic");
        assert!(result.is_ok(), "{result:?}");
        assert!(
            p.ended.load(Ordering::Relaxed),
            "a drain ends the input (on_end runs)"
        );
    }

    #[tokio::test]
    async fn a_stop_savepoint_barrier_queued_behind_a_full_channel_still_goes_out() {
        // The output's channel is full when the trigger arrives, so the barrier waits in the
        // output's queue; the paused source must still send it once the channel has room.
        let (tx, mut rx) = mpsc::channel(1);
        tx.try_send(batch(0)).expect("room for the filler");
        let mut p = spawn_source_with(&[STOP_SAVEPOINT], vec![forward_to(tx)]);
        // The source takes the trigger (and pauses) while the channel is still full.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let first = rx.recv().await;
        assert!(matches!(first, Some(Message::Records(_))), "{first:?}");
        let next = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("the barrier leaves the paused source");
        assert!(
            matches!(next, Some(Message::Barrier(b)) if b == STOP_SAVEPOINT_BARRIER),
            "{next:?}"
        );
        p.commands
            .send(TaskCommand::Stop)
            .expect("the task is running");
        let result = tokio::time::timeout(Duration::from_secs(60), &mut p.task)
            .await
            .expect("the stopped source task ends")
            .expect("the task does not panic");
        assert!(result.is_ok(), "{result:?}");
    }

    #[tokio::test]
    async fn a_resume_queued_behind_the_stop_savepoint_unpauses_the_source() {
        let p = spawn_source(&[STOP_SAVEPOINT, TaskCommand::Resume]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while p.polls.load(Ordering::Relaxed) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the source never polled again after the resume"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        p.commands
            .send(TaskCommand::Stop)
            .expect("the task is running");
        let result = tokio::time::timeout(Duration::from_secs(60), p.task)
            .await
            .expect("the stopped source task ends")
            .expect("the task does not panic");
        assert!(result.is_ok(), "{result:?}");
        assert!(
            !p.ended.load(Ordering::Relaxed),
            "a stop does not end the input"
        );
    }

    /// What a [`Recorder`] saw, in order.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Seen {
        Records(usize),
        Watermark(i64),
        Snapshot(u64),
        ProcessingTime(i64),
        End,
    }

    /// A pass-through that records every call the task loop makes into it; it may ask for
    /// one processing-time wake-up (and emits one record `{"fired": now}` then).
    struct Recorder {
        seen: Arc<std::sync::Mutex<Vec<Seen>>>,
        wake_at: Option<i64>,
    }

    impl Recorder {
        fn new(wake_at: Option<i64>) -> (Self, Arc<std::sync::Mutex<Vec<Seen>>>) {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            (
                Self {
                    seen: Arc::clone(&seen),
                    wake_at,
                },
                seen,
            )
        }

        fn note(&self, s: Seen) {
            self.seen.lock().expect("not poisoned").push(s);
        }
    }

    impl Operator for Recorder {
        fn process(&mut self, batch: &mut Batch, _ctx: &mut OperatorContext) -> Result<()> {
            self.note(Seen::Records(batch.len()));
            Ok(())
        }

        fn snapshot(
            &mut self,
            checkpoint: u64,
            _ctx: &mut OperatorContext,
        ) -> Result<Option<Vec<u8>>> {
            self.note(Seen::Snapshot(checkpoint));
            Ok(None)
        }

        fn on_watermark(
            &mut self,
            watermark: i64,
            _out: &mut Vec<Dynamic>,
            ctx: &mut OperatorContext,
        ) -> Result<()> {
            assert_eq!(ctx.watermark, watermark, "the context holds the new watermark");
            self.note(Seen::Watermark(watermark));
            Ok(())
        }

        fn next_processing_time(&self) -> Option<i64> {
            self.wake_at
        }

        fn on_processing_time(
            &mut self,
            now: i64,
            out: &mut Vec<Dynamic>,
            _ctx: &mut OperatorContext,
        ) -> Result<()> {
            self.note(Seen::ProcessingTime(now));
            self.wake_at = None;
            let mut m = rhai::Map::new();
            m.insert("fired".into(), Dynamic::from(now));
            out.push(Dynamic::from_map(m));
            Ok(())
        }

        fn on_end(&mut self, _out: &mut Vec<Dynamic>, _ctx: &mut OperatorContext) -> Result<()> {
            self.note(Seen::End);
            Ok(())
        }
    }

    fn chain_env(checkpointing: bool) -> (TaskEnv, mpsc::UnboundedSender<TaskCommand>) {
        let (commands, rx) = mpsc::unbounded_channel();
        let (events, events_rx) = mpsc::unbounded_channel();
        // Acks are not looked at; keep the receiver alive.
        std::mem::forget(events_rx);
        let env = TaskEnv::new(
            TaskId::new(1, 0),
            "p".into(),
            "rec".into(),
            rx,
            events,
            checkpointing.then(|| Checkpointing {
                store: Arc::new(MemoryStore::new()),
                mode: AlignmentMode::ExactlyOnce,
                unaligned: None,
            }),
            None,
            Arc::new(Control::default()),
        );
        (env, commands)
    }

    fn forward_to(tx: mpsc::Sender<Message>) -> Output {
        Output::new(
            crate::plan::Partitioning::Forward,
            vec![crate::runtime::exchange::Target::new(tx)],
            128,
            "p".into(),
            "rec".into(),
        )
    }

    /// What arrives on a channel until its end-of-stream, records as their count.
    async fn drain(mut rx: mpsc::Receiver<Message>) -> Vec<String> {
        let mut got = Vec::new();
        while let Some(m) = rx.recv().await {
            got.push(match m {
                Message::Records(b) => format!("records {}", b.len()),
                Message::Barrier(b) => format!("barrier {}", b.checkpoint),
                Message::Watermark(Watermark::At(w)) => format!("watermark {w}"),
                Message::Watermark(Watermark::Idle) => "idle".into(),
                Message::EndOfStream => {
                    got.push("end".into());
                    break;
                }
            });
        }
        got
    }

    fn batch(n: i64) -> Message {
        Message::Records(Batch::new((0..n).map(Dynamic::from).collect()))
    }

    const B1: Barrier = Barrier {
        checkpoint: 1,
        kind: BarrierKind::Checkpoint,
    };

    #[tokio::test]
    async fn a_task_combines_its_inputs_watermarks_in_order_with_barriers() {
        use crate::runtime::input::InputSet;
        let (t0, r0) = mpsc::channel(64);
        let (t1, r1) = mpsc::channel(64);
        let slot = Arc::new(std::sync::Mutex::new(Some(InputSet::new(vec![r0, r1]))));
        let (out_tx, out_rx) = mpsc::channel(64);
        let (rec, seen) = Recorder::new(None);
        let chain = ChainTask {
            nodes: vec![node(Box::new(rec), "rec", vec![forward_to(out_tx)])],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let (env, _commands) = chain_env(true);
        use Watermark::{At, Idle};
        for m in [
            batch(2),
            Message::Watermark(At(10)),
            Message::Barrier(B1),
            // Behind the barrier: input 0 is parked until input 1 delivers barrier 1.
            Message::Watermark(At(30)),
            Message::EndOfStream,
        ] {
            t0.send(m).await.expect("send");
        }
        for m in [
            Message::Watermark(At(20)),
            batch(3),
            Message::Watermark(At(25)),
            Message::Barrier(B1),
            Message::Watermark(Idle),
            Message::EndOfStream,
        ] {
            t1.send(m).await.expect("send");
        }
        let lease = InputLease::take(&slot).expect("free");
        let reader = tokio::spawn(drain(out_rx));
        run_chain(lease, chain, env).await.expect("runs");
        let seen = seen.lock().expect("not poisoned").clone();
        let marks: Vec<&Seen> = seen
            .iter()
            .filter(|s| !matches!(s, Seen::Records(_)))
            .collect();
        assert_eq!(
            marks,
            vec![
                &Seen::Watermark(10),
                &Seen::Snapshot(1),
                // Input 0's 30 only after the snapshot; the minimum with input 1 (25).
                &Seen::Watermark(25),
                // Input 1 idle: input 0 alone.
                &Seen::Watermark(30),
                // The end of the input: every timer due, before on_end.
                &Seen::Watermark(WATERMARK_END),
                &Seen::End,
            ],
            "{seen:?}"
        );
        let sent = reader.await.expect("reader");
        let at = |what: &str| sent.iter().position(|s| s == what).expect(what);
        assert!(at("watermark 10") < at("barrier 1"), "{sent:?}");
        assert!(at("barrier 1") < at("watermark 25"), "{sent:?}");
        assert!(at("watermark 25") < at("watermark 30"), "{sent:?}");
        assert_eq!(sent.last().map(String::as_str), Some("end"));
        assert_eq!(
            sent.iter()
                .filter(|s| s.starts_with("records"))
                .count(),
            2,
            "{sent:?}"
        );
    }

    #[tokio::test]
    async fn watermarks_go_to_every_subtask_of_hash_and_rebalance_exchanges() {
        for partitioning in [
            crate::plan::Partitioning::Hash,
            crate::plan::Partitioning::Rebalance,
        ] {
            let (mut targets, mut receivers) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                let (tx, rx) = mpsc::channel(8);
                targets.push(crate::runtime::exchange::Target::new(tx));
                receivers.push(rx);
            }
            let mut out = Output::new(partitioning, targets, 128, "p".into(), "x".into());
            let mut b = Batch::new(vec![Dynamic::from(1_i64)]);
            b.keys
                .push(crate::record::Key::from_dynamic(&Dynamic::from(7_i64)));
            out.send(b).await.expect("send");
            out.watermark(Watermark::At(5)).await.expect("send");
            out.watermark(Watermark::Idle).await.expect("send");
            out.end().await.expect("send");
            let mut records = 0;
            for rx in receivers {
                let got = drain(rx).await;
                records += got.iter().filter(|s| s.starts_with("records")).count();
                let marks: Vec<&str> = got
                    .iter()
                    .map(String::as_str)
                    .filter(|s| !s.starts_with("records"))
                    .collect();
                assert_eq!(marks, ["watermark 5", "idle", "end"], "{partitioning:?}");
            }
            assert_eq!(records, 1, "the record went to one subtask only");
        }
    }

    #[tokio::test]
    async fn a_source_task_sends_its_watermarks_after_the_records_that_made_them() {
        use crate::connectors::event_time::EventTimeSource;
        use weir_schema::{EventTimeSpec, SourceOnError};

        /// Three polls of two records each, then done.
        struct Timed {
            polls: i64,
        }
        impl Source for Timed {
            fn poll(&mut self, out: &mut Vec<Dynamic>, _ctx: &mut SourceContext) -> Result<Poll> {
                if self.polls == 3 {
                    return Ok(Poll::Done);
                }
                self.polls += 1;
                for ts in [self.polls * 1_000, self.polls * 1_000 - 500] {
                    let mut m = rhai::Map::new();
                    m.insert("ts".into(), Dynamic::from(ts));
                    out.push(Dynamic::from_map(m));
                }
                Ok(Poll::Ready)
            }
        }
        let spec = EventTimeSpec {
            field: "ts".into(),
            unit: None,
            format: None,
            max_out_of_orderness: Some(weir_schema::units::DurationSpec::from_millis(100)),
            idle_timeout: None,
        };
        let source = Box::new(EventTimeSource::new(
            Box::new(Timed { polls: 0 }),
            &spec,
            &SourceOnError::Fail,
        ));
        let (mut targets, mut receivers) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let (tx, rx) = mpsc::channel(64);
            targets.push(crate::runtime::exchange::Target::new(tx));
            receivers.push(rx);
        }
        let out = Output::new(
            crate::plan::Partitioning::Rebalance,
            targets,
            128,
            "p".into(),
            "src".into(),
        );
        let (rec, seen) = Recorder::new(None);
        let chain = ChainTask {
            nodes: vec![node(Box::new(rec), "src", vec![out])],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let (env, _commands) = chain_env(false);
        let sctx = SourceContext::new("p", "src", 0, 1, None);
        run_source(source, sctx, chain, env).await.expect("runs");
        let seen = seen.lock().expect("not poisoned").clone();
        assert_eq!(
            seen,
            vec![
                Seen::Records(2),
                Seen::Watermark(899),
                Seen::Records(2),
                Seen::Watermark(1_899),
                Seen::Records(2),
                Seen::Watermark(2_899),
                Seen::Watermark(WATERMARK_END),
                Seen::End,
            ]
        );
        for rx in receivers {
            let got = drain(rx).await;
            let marks: Vec<&str> = got
                .iter()
                .map(String::as_str)
                .filter(|s| !s.starts_with("records"))
                .collect();
            assert_eq!(
                marks,
                ["watermark 899", "watermark 1899", "watermark 2899", "end"],
                "every subtask gets every watermark"
            );
        }
    }

    #[tokio::test]
    async fn processing_time_wakes_a_task_on_a_manual_clock_when_it_is_moved() {
        use crate::base::clock::Clock;
        use crate::runtime::input::InputSet;
        let clock = Clock::manual(0);
        let (t0, r0) = mpsc::channel(8);
        let slot = Arc::new(std::sync::Mutex::new(Some(InputSet::new(vec![r0]))));
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let (rec, seen) = Recorder::new(Some(1_000));
        let mut n = node(Box::new(rec), "rec", vec![forward_to(out_tx)]);
        n.ctx.clock = clock.clone();
        let chain = ChainTask {
            nodes: vec![n],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let (env, _commands) = chain_env(false);
        let lease = InputLease::take(&slot).expect("free");
        let task = tokio::spawn(run_chain(lease, chain, env));
        t0.send(batch(1)).await.expect("send");
        // A record flows through, the clock stands still: no wake-up yet.
        assert!(matches!(out_rx.recv().await, Some(Message::Records(_))));
        clock.advance(999);
        clock.advance(1);
        let fired = tokio::time::timeout(Duration::from_secs(60), out_rx.recv())
            .await
            .expect("the move of the clock wakes the task");
        let Some(Message::Records(b)) = fired else {
            panic!("expected the fired record, got {fired:?}");
        };
        assert_eq!(b.records[0].as_map_ref().expect("map")["fired"].as_int(), Ok(1_000));
        t0.send(Message::EndOfStream).await.expect("send");
        task.await.expect("no panic").expect("runs");
        let seen = seen.lock().expect("not poisoned").clone();
        assert_eq!(
            seen,
            vec![
                Seen::Records(1),
                Seen::ProcessingTime(1_000),
                Seen::Watermark(WATERMARK_END),
                Seen::End
            ]
        );
    }

    #[tokio::test]
    async fn processing_time_wakes_a_task_on_the_system_clock() {
        use crate::base::clock::Clock;
        use crate::runtime::input::InputSet;
        let (t0, r0) = mpsc::channel(8);
        let slot = Arc::new(std::sync::Mutex::new(Some(InputSet::new(vec![r0]))));
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let at = Clock::System.now_ms() + 20;
        let (rec, _seen) = Recorder::new(Some(at));
        let chain = ChainTask {
            nodes: vec![node(Box::new(rec), "rec", vec![forward_to(out_tx)])],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let (env, _commands) = chain_env(false);
        let lease = InputLease::take(&slot).expect("free");
        let task = tokio::spawn(run_chain(lease, chain, env));
        let fired = tokio::time::timeout(Duration::from_secs(60), out_rx.recv())
            .await
            .expect("the wall clock wakes the task");
        let Some(Message::Records(b)) = fired else {
            panic!("expected the fired record, got {fired:?}");
        };
        let now = b.records[0].as_map_ref().expect("map")["fired"]
            .as_int()
            .expect("int");
        assert!(now >= at, "fired at {now}, due at {at}");
        t0.send(Message::EndOfStream).await.expect("send");
        task.await.expect("no panic").expect("runs");
    }

    /// Numbers the records it sees: each record `r` becomes `n * 1000 + r`, `n` its running
    /// count (the operator's local state, snapshotted and restored).
    struct Numbering {
        seen: i64,
    }

    impl Operator for Numbering {
        fn process(&mut self, batch: &mut Batch, _ctx: &mut OperatorContext) -> Result<()> {
            for r in &mut batch.records {
                self.seen += 1;
                *r = Dynamic::from(self.seen * 1000 + r.as_int().unwrap_or(-1));
            }
            Ok(())
        }

        fn snapshot(
            &mut self,
            _checkpoint: u64,
            _ctx: &mut OperatorContext,
        ) -> Result<Option<Vec<u8>>> {
            Ok(Some(self.seen.to_le_bytes().to_vec()))
        }

        fn restore(&mut self, snapshot: Option<&[u8]>, _ctx: &mut OperatorContext) -> Result<()> {
            let bytes = snapshot.and_then(|s| <[u8; 8]>::try_from(s).ok());
            self.seen = bytes.map_or(0, i64::from_le_bytes);
            Ok(())
        }
    }

    fn numbers(from: i64, n: i64) -> Message {
        Message::Records(Batch::new((from..from + n).map(Dynamic::from).collect()))
    }

    /// The records of `messages` up to the first barrier (`before`) or after it.
    fn ints_of(messages: &[Message]) -> Vec<i64> {
        messages
            .iter()
            .filter_map(|m| match m {
                Message::Records(b) => Some(b),
                _ => None,
            })
            .flat_map(|b| b.records.iter().map(|r| r.as_int().expect("int")))
            .collect()
    }

    /// A `Numbering` task with unaligned checkpoints: one input (with its priority lane) and
    /// one output channel of capacity 1 (with its priority lane). Returns the input's senders,
    /// the output's receivers, the task's events and the task.
    #[allow(clippy::type_complexity)]
    fn spawn_numbering(
        store: Arc<MemoryStore>,
        restore: Option<TaskRestore>,
    ) -> (
        mpsc::Sender<Message>,
        mpsc::UnboundedSender<Barrier>,
        mpsc::Receiver<Message>,
        mpsc::UnboundedReceiver<Barrier>,
        mpsc::UnboundedReceiver<TaskEvent>,
        tokio::task::JoinHandle<Result<()>>,
    ) {
        use crate::runtime::exchange::Target;
        let (t0, r0) = mpsc::channel(16);
        let (p0, l0) = mpsc::unbounded_channel();
        let slot = Arc::new(std::sync::Mutex::new(Some(
            InputSet::new(vec![r0]).with_priority(vec![l0]),
        )));
        let (out_tx, out_rx) = mpsc::channel(1);
        let (lane_tx, lane_rx) = mpsc::unbounded_channel();
        let output = Output::new(
            crate::plan::Partitioning::Forward,
            vec![Target {
                sender: out_tx,
                priority: Some(lane_tx),
            }],
            128,
            "p".into(),
            "num".into(),
        );
        let chain = ChainTask {
            nodes: vec![node(Box::new(Numbering { seen: 0 }), "num", vec![output])],
            taps: Arc::default(),
            tap_cursors: Vec::new(),
        };
        let (commands, rx) = mpsc::unbounded_channel();
        // No commands; keep the sender alive.
        std::mem::forget(commands);
        let (events, events_rx) = mpsc::unbounded_channel();
        let env = TaskEnv::new(
            TaskId::new(1, 0),
            "p".into(),
            "num".into(),
            rx,
            events,
            Some(Checkpointing {
                store,
                mode: AlignmentMode::ExactlyOnce,
                unaligned: Some(Duration::ZERO),
            }),
            restore,
            Arc::new(Control::default()),
        );
        let lease = InputLease::take(&slot).expect("free");
        let task = tokio::spawn(run_chain(lease, chain, env));
        (t0, p0, out_rx, lane_rx, events_rx, task)
    }

    /// Every message until end-of-stream.
    async fn collect(rx: &mut mpsc::Receiver<Message>) -> Vec<Message> {
        let mut got = Vec::new();
        while let Some(m) = rx.recv().await {
            if matches!(m, Message::EndOfStream) {
                break;
            }
            got.push(m);
        }
        got
    }

    /// Sends batches 0..4 to a [`spawn_numbering`] task whose output nobody reads, and waits
    /// until it has taken two: batch 0 fills the output channel, batch 1 waits in the output's
    /// queue, and batches 2 and 3 stay in the input channel (the task reads no more input).
    async fn stall_behind_full_output(t0: &mpsc::Sender<Message>) {
        for k in 0..4 {
            t0.send(numbers(k * 10, 3)).await.expect("send");
        }
        while t0.capacity() != 16 - 2 {
            tokio::task::yield_now().await;
        }
    }

    /// Issue 19: a task whose output channel is full (its downstream reads nothing) still
    /// takes an unaligned checkpoint announced on its priority lane, forwards the barrier on
    /// its output's priority lane and acknowledges, without a single record being read
    /// downstream; and a task restored from that checkpoint, fed what its upstream sends
    /// after the barrier, completes the output exactly once (equal to the failure-free run).
    #[tokio::test]
    async fn an_unaligned_checkpoint_completes_while_the_output_is_full_and_restores_exactly_once() {
        let store = Arc::new(MemoryStore::new());
        let (t0, p0, mut out_rx, mut lane_rx, mut events, task) =
            spawn_numbering(Arc::clone(&store), None);
        // Batch 0 fills the output channel, batch 1 waits in the output's queue; the task
        // then reads no more input, so batches 2 and 3 stay in its input channel.
        stall_behind_full_output(&t0).await;
        // The upstream's checkpoint 1: announced, then in band behind batches 2 and 3; batch
        // 4 comes after the barrier.
        p0.send(B1).expect("lane");
        t0.send(Message::Barrier(B1)).await.expect("send");
        t0.send(numbers(40, 3)).await.expect("send");
        let ack = loop {
            match events.recv().await.expect("the task acknowledges") {
                TaskEvent::Ack {
                    checkpoint, states, ..
                } => break (checkpoint, states),
                TaskEvent::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!(ack.0, 1);
        assert_eq!(lane_rx.try_recv().ok(), Some(B1), "the barrier went ahead downstream");
        // Only now does the downstream read: the failure-free output.
        t0.send(Message::EndOfStream).await.expect("send");
        let sent = collect(&mut out_rx).await;
        task.await.expect("no panic").expect("runs");
        let cut = sent
            .iter()
            .position(|m| matches!(m, Message::Barrier(b) if *b == B1))
            .expect("the barrier in band");
        let (before, after) = (ints_of(&sent[..cut]), ints_of(&sent[cut..]));
        // The snapshot came after batches 0 and 1: what the output still queued then went
        // ahead of the in-band barrier (the receiver's channel state).
        assert_eq!(before, vec![1000, 2001, 3002, 4010, 5011, 6012]);
        let all: Vec<i64> = (0..15)
            .map(|i| (i + 1) * 1000 + (i / 3) * 10 + i % 3)
            .collect();
        assert_eq!([before.clone(), after].concat(), all, "the failure-free output");

        // Restore from checkpoint 1: the task replays its channel state (batches 2 and 3),
        // then gets what its upstream sends after the barrier (batch 4).
        let metadata = CheckpointMetadata {
            format_version: crate::checkpoint::metadata::METADATA_FORMAT_VERSION,
            pipeline: "p".into(),
            checkpoint: 1,
            kind: BarrierKind::Checkpoint,
            config_hash: String::new(),
            max_parallelism: 128,
            backend: None,
            operators: Vec::new(),
            subtasks: ack.1,
            finished_tasks: Vec::new(),
            finished_operators: Vec::new(),
        };
        let restore = TaskRestore {
            store: Arc::clone(&store) as Arc<dyn CheckpointStore>,
            metadata: Arc::new(metadata),
            savepoint: false,
            plan: None,
        };
        let (t0, _p0, mut out_rx, _lane, _events, task) =
            spawn_numbering(Arc::clone(&store), Some(restore));
        t0.send(numbers(40, 3)).await.expect("send");
        t0.send(Message::EndOfStream).await.expect("send");
        let resent = ints_of(&collect(&mut out_rx).await);
        task.await.expect("no panic").expect("runs");
        assert_eq!(
            [before, resent].concat(),
            all,
            "before the barrier, then the restored task: each record exactly once"
        );
    }

    /// A savepoint announced on the priority lane ahead of a newer checkpoint: the task takes
    /// the checkpoint unaligned only after the savepoint's aligned snapshot, so that neither
    /// barrier overtakes the other downstream and both are acknowledged (taken at once, the
    /// checkpoint would have made the task drop the savepoint's barrier unanswered).
    #[tokio::test]
    async fn a_newer_unaligned_checkpoint_never_overtakes_a_savepoint() {
        const SP1: Barrier = Barrier {
            checkpoint: 1,
            kind: BarrierKind::Savepoint,
        };
        const B2: Barrier = Barrier {
            checkpoint: 2,
            kind: BarrierKind::Checkpoint,
        };
        let store = Arc::new(MemoryStore::new());
        let (t0, p0, mut out_rx, mut lane_rx, mut events, task) =
            spawn_numbering(Arc::clone(&store), None);
        // As above, the output is full and the task reads no more input; the savepoint and
        // the checkpoint are announced, then come in band behind batches 2 and 3.
        stall_behind_full_output(&t0).await;
        p0.send(SP1).expect("lane");
        t0.send(Message::Barrier(SP1)).await.expect("send");
        t0.send(numbers(40, 3)).await.expect("send");
        p0.send(B2).expect("lane");
        t0.send(Message::Barrier(B2)).await.expect("send");
        t0.send(numbers(50, 3)).await.expect("send");
        // Nothing is taken while the savepoint's barrier is still queued in band.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(lane_rx.try_recv().is_err(), "nothing went ahead downstream yet");
        t0.send(Message::EndOfStream).await.expect("send");
        let sent = collect(&mut out_rx).await;
        task.await.expect("no panic").expect("runs");
        let barriers: Vec<Barrier> = sent
            .iter()
            .filter_map(|m| match m {
                Message::Barrier(b) => Some(*b),
                _ => None,
            })
            .collect();
        assert_eq!(barriers, vec![SP1, B2], "in band, in order");
        let mut announced = Vec::new();
        while let Ok(b) = lane_rx.try_recv() {
            announced.push(b);
        }
        assert_eq!(announced, vec![SP1, B2], "on the lane, in order");
        let mut acked = Vec::new();
        while let Ok(event) = events.try_recv() {
            match event {
                TaskEvent::Ack { checkpoint, .. } => acked.push(checkpoint),
                TaskEvent::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        // Written on the blocking pool: the acknowledgements may come in either order.
        acked.sort_unstable();
        assert_eq!(acked, vec![1, 2], "both acknowledged, none declined");
        let all: Vec<i64> = (0..18)
            .map(|i| (i + 1) * 1000 + (i / 3) * 10 + i % 3)
            .collect();
        assert_eq!(ints_of(&sent), all, "every record once, in order");
    }
}
