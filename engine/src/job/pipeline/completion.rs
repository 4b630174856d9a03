//! What the checkpoint coordinator's commands set off in the world: metadata writes, and
//! once a checkpoint or savepoint completed its effects — statistics, the status history,
//! answers to the requests that waited for it, the savepoint copy, retention — or, once it
//! was aborted, the cleanup. The protocol decisions (when to trigger, complete, abort) are
//! the coordinator's; what the lifecycle does about them (a stop, a probation) is the
//! `requests` and `probation` modules'.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;

use super::storage::CheckpointSetup;
use super::supervisor::Supervisor;
use super::{CheckpointStats, HISTORY, SharedStatus};
use crate::base::error::ErrorClass;
use crate::base::human::{Bytes, Elapsed};
use crate::base::message::{Barrier, BarrierKind};
use crate::base::metrics::{LastCheckpoint, PipelineMetrics, StateSize};
use crate::checkpoint::coordinator::AbortReason;
use crate::checkpoint::metadata::is_channel_file;
use crate::checkpoint::retention::CheckpointFiles;
use crate::checkpoint::savepoint::{savepoint_dir_name, write_savepoint};
use crate::checkpoint::storage::{delete_checkpoint, write_metadata};
use crate::checkpoint::{CheckpointId, CheckpointMetadata, Coordinator, TaskId, plan_retention};
use crate::control::{CheckpointInfo, ControlError, SavepointInfo, SubtaskCheckpointInfo};
use crate::plan::PipelinePlan;
use crate::runtime::task::{TaskCommand, TaskRestore};

/// A request waiting for a checkpoint to complete.
pub(super) enum Waiter {
    Checkpoint(oneshot::Sender<Result<CheckpointInfo, ControlError>>),
    Savepoint {
        dir: PathBuf,
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
    },
}

impl Waiter {
    /// Answers the request with `e`.
    pub(super) fn fail(self, e: ControlError) {
        let _ = match self {
            Waiter::Checkpoint(reply) => reply.send(Err(e)).map_err(drop),
            Waiter::Savepoint { reply, .. } => reply.send(Err(e)).map_err(drop),
        };
    }
}

/// The result of blocking work the supervisor started (storage I/O off the loop).
pub(super) enum Internal {
    /// A metadata write ended; a failure with its class.
    MetadataWritten(CheckpointId, std::result::Result<(), (ErrorClass, String)>),
    SavepointWritten {
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
        result: std::result::Result<SavepointInfo, String>,
    },
}

/// A pipeline's checkpointing: its storage, its coordinator, and what the supervisor tracks
/// of checkpoints in flight and completed.
pub(super) struct Checkpoints {
    pub setup: Option<CheckpointSetup>,
    pub coordinator: Option<Coordinator>,
    /// When each checkpoint in flight was triggered.
    triggered: BTreeMap<CheckpointId, Instant>,
    /// Per-subtask figures of checkpoints in flight.
    acks: BTreeMap<CheckpointId, Vec<SubtaskCheckpointInfo>>,
    /// Statistics of completed checkpoints.
    pub stats: Vec<CheckpointStats>,
    /// Requests waiting for a checkpoint to complete.
    pub waiters: BTreeMap<CheckpointId, Waiter>,
    /// Savepoint copies in flight (retention waits for them).
    pub savepoint_writes: usize,
    internal_tx: UnboundedSender<Internal>,
    pub internal_rx: UnboundedReceiver<Internal>,
    /// Checkpoints completed in this run.
    pub completed_count: u64,
    /// The class of the last checkpoint failure a task or a metadata write reported (a
    /// failover after too many failed checkpoints carries it; storage trouble by default).
    pub failure_class: ErrorClass,
    /// The pipeline's figures (the job's, across generations, once linked).
    pub metrics: Arc<PipelineMetrics>,
}

impl Checkpoints {
    /// Checkpointing with `setup` driven by `coordinator` (both `None`: no checkpoints).
    pub(super) fn new(setup: Option<CheckpointSetup>, coordinator: Option<Coordinator>) -> Self {
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        Self {
            setup,
            coordinator,
            triggered: BTreeMap::new(),
            acks: BTreeMap::new(),
            stats: Vec::new(),
            waiters: BTreeMap::new(),
            savepoint_writes: 0,
            internal_tx,
            internal_rx,
            completed_count: 0,
            failure_class: ErrorClass::Io,
            metrics: Arc::default(),
        }
    }

    /// Notes that checkpoint `id` was triggered now.
    pub(super) fn triggered(&mut self, id: CheckpointId) {
        self.triggered.insert(id, Instant::now());
        self.metrics
            .set_checkpoints_in_progress(self.triggered.len() as u64);
    }

    /// Notes `task`'s acknowledgement figures for checkpoint `id`.
    pub(super) fn acked(&mut self, id: CheckpointId, info: SubtaskCheckpointInfo) {
        self.acks.entry(id).or_default().push(info);
    }

    /// Milliseconds since checkpoint `id` was triggered (0 when unknown).
    pub(super) fn since_trigger_ms(&self, id: CheckpointId) -> u64 {
        self.triggered
            .get(&id)
            .map_or(0, |t| t.elapsed().as_millis() as u64)
    }

    /// Writes `meta` into checkpoint storage off the loop; the result comes back as
    /// [`Internal::MetadataWritten`].
    pub(super) fn write_metadata(&mut self, plan: &PipelinePlan, mut meta: CheckpointMetadata) {
        meta.finished_operators = finished_operators(plan, &meta.finished_tasks);
        let Some(ck) = self.setup.as_mut() else {
            return;
        };
        let id = meta.checkpoint;
        ck.metadata.insert(id, meta.clone());
        let store = Arc::clone(&ck.store);
        let tx = self.internal_tx.clone();
        tokio::task::spawn_blocking(move || {
            let r = write_metadata(&*store, &meta).map_err(|e| (e.class(), e.to_string()));
            let _ = tx.send(Internal::MetadataWritten(id, r));
        });
    }

    /// Deletes checkpoint `id`'s files off the loop.
    pub(super) fn discard(&self, id: CheckpointId) {
        let Some(ck) = self.setup.as_ref() else {
            return;
        };
        let store = Arc::clone(&ck.store);
        tokio::task::spawn_blocking(move || {
            let _ = delete_checkpoint(&*store, id);
        });
    }

    /// Checkpoint `barrier` was aborted: records it in the history (`failed`, or `aborted`
    /// when subsumed or cancelled by a restart), forgets it,
    /// fails the request that waited for it and deletes what it wrote.
    pub(super) fn aborted(
        &mut self,
        plan: &PipelinePlan,
        barrier: Barrier,
        reason: &AbortReason,
        status: &SharedStatus,
    ) {
        let id = barrier.checkpoint;
        let duration_ms = self.since_trigger_ms(id);
        self.triggered.remove(&id);
        if reason.is_failure() {
            self.metrics.checkpoint_failed();
        }
        self.metrics
            .set_checkpoints_in_progress(self.triggered.len() as u64);
        let mut subtasks = self.acks.remove(&id).unwrap_or_default();
        subtasks.sort_by(|a, b| a.task.cmp(&b.task));
        let info = CheckpointInfo {
            id,
            kind: kind_name(barrier.kind).into(),
            status: if reason.is_failure() {
                "failed"
            } else {
                "aborted"
            }
            .into(),
            failure: Some(reason.to_string()),
            trigger_time_ms: unix_ms(SystemTime::now()).saturating_sub(duration_ms),
            duration_ms,
            size: 0,
            new_bytes: 0,
            alignment_ms: subtasks.iter().map(|s| s.alignment_ms).max().unwrap_or(0),
            channel_state_bytes: subtasks.iter().map(|s| s.channel_state_bytes).sum(),
            subtasks,
        };
        push_history(status, info);
        if let Some(w) = self.waiters.remove(&id) {
            w.fail(ControlError::Failed(format!(
                "checkpoint {id} of pipeline `{}` was aborted: {reason}",
                plan.id
            )));
        }
        let Some(ck) = self.setup.as_mut() else {
            return;
        };
        ck.metadata.remove(&id);
        self.discard(id);
    }

    /// Checkpoint `barrier` completed: its statistics and history entry, the latest restore
    /// point, the answer to the request that waited for it (a savepoint is copied out first),
    /// the live status, then retention.
    pub(super) fn completed(
        &mut self,
        plan: &PipelinePlan,
        barrier: Barrier,
        status: &SharedStatus,
    ) {
        let id = barrier.checkpoint;
        let Some(ck) = self.setup.as_mut() else {
            return;
        };
        let Some(meta) = ck.metadata.remove(&id) else {
            return;
        };
        ck.metadata.retain(|&k, _| k > id);
        let started = self.triggered.remove(&id);
        self.triggered.retain(|&k, _| k > id);
        self.metrics
            .set_checkpoints_in_progress(self.triggered.len() as u64);
        let stats = checkpoint_stats(&meta, ck.latest.as_ref(), started);
        tracing::debug!(
            pipeline = %plan.id,
            checkpoint = id,
            duration = %Elapsed(stats.duration),
            size = %Bytes(stats.size),
            new = %Bytes(stats.new_bytes),
            channel_state = %Bytes(stats.channel_state_bytes),
            "Checkpoint statistics."
        );
        let now = SystemTime::now();
        let mut subtasks = self.acks.remove(&id).unwrap_or_default();
        self.acks.retain(|&k, _| k > id);
        subtasks.sort_by(|a, b| a.task.cmp(&b.task));
        let info = CheckpointInfo {
            id,
            kind: kind_name(barrier.kind).into(),
            status: "completed".into(),
            failure: None,
            trigger_time_ms: unix_ms(now - stats.duration),
            duration_ms: stats.duration.as_millis() as u64,
            size: stats.size,
            new_bytes: stats.new_bytes,
            alignment_ms: subtasks.iter().map(|s| s.alignment_ms).max().unwrap_or(0),
            channel_state_bytes: subtasks.iter().map(|s| s.channel_state_bytes).sum(),
            subtasks,
        };
        self.metrics.checkpoint_completed(
            LastCheckpoint {
                id,
                duration: stats.duration,
                size: stats.size,
                new_bytes: stats.new_bytes,
                channel_state_bytes: info.channel_state_bytes,
            },
            info.subtasks
                .iter()
                .map(|s| {
                    (
                        s.task.clone(),
                        s.subtask,
                        Duration::from_millis(s.alignment_ms),
                    )
                })
                .collect(),
        );
        self.metrics.set_state_sizes(state_sizes(&meta));
        self.stats.push(stats);
        ck.completed.push(CheckpointFiles::from_metadata(&meta));
        let meta = Arc::new(meta);
        ck.latest = Some(TaskRestore {
            store: Arc::clone(&ck.store),
            metadata: Arc::clone(&meta),
            savepoint: false,
            plan: None,
        });
        match self.waiters.remove(&id) {
            Some(Waiter::Checkpoint(reply)) => {
                let _ = reply.send(Ok(info.clone()));
            }
            Some(Waiter::Savepoint { dir, reply }) => {
                self.copy_savepoint(plan, &meta, now, info.duration_ms, dir, reply);
            }
            None => {}
        }
        if let Ok(mut st) = status.lock() {
            st.checkpoints = self.completed_count;
            st.latest = Some(id);
        }
        push_history(status, info);
        self.run_retention(plan);
    }

    /// Copies completed checkpoint `meta` into a savepoint under `dir` off the loop; the
    /// answer goes to `reply` once it is written, and retention waits for it.
    fn copy_savepoint(
        &mut self,
        plan: &PipelinePlan,
        meta: &Arc<CheckpointMetadata>,
        now: SystemTime,
        duration_ms: u64,
        dir: PathBuf,
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
    ) {
        let Some(ck) = self.setup.as_ref() else {
            return;
        };
        self.savepoint_writes += 1;
        let store = Arc::clone(&ck.store);
        let tx = self.internal_tx.clone();
        let pipeline = plan.id.clone();
        let started = instant_before(duration_ms);
        let meta = Arc::clone(meta);
        let id = meta.checkpoint;
        tokio::task::spawn_blocking(move || {
            let name = savepoint_dir_name(
                &pipeline,
                id,
                now.duration_since(UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0),
            );
            let result = write_savepoint(&*store, &meta, &dir, &name)
                .map(|w| SavepointInfo {
                    pipeline: pipeline.clone(),
                    path: w.path,
                    checkpoint: id,
                    size: w.size,
                    duration_ms: started.elapsed().as_millis() as u64,
                })
                .map_err(|e| format!("savepoint {id} of pipeline `{pipeline}` completed but could not be written to `{}`: {e}", dir.display()));
            let _ = tx.send(Internal::SavepointWritten { reply, result });
        });
    }

    /// A savepoint copy ended: answers its request, then runs the retention it held back.
    pub(super) fn savepoint_written(
        &mut self,
        plan: &PipelinePlan,
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
        result: std::result::Result<SavepointInfo, String>,
    ) {
        self.savepoint_writes = self.savepoint_writes.saturating_sub(1);
        match &result {
            Ok(info) => {
                tracing::info!(pipeline = %plan.id, checkpoint = info.checkpoint, path = %info.path.display(), size = %Bytes(info.size), duration = %Elapsed::ms(info.duration_ms), "Savepoint written.");
            }
            Err(e) => {
                tracing::error!(pipeline = %plan.id, error = %e, "Savepoint failed.");
            }
        }
        let _ = reply.send(result.map_err(ControlError::Failed));
        // Retention waited for the copy.
        self.run_retention(plan);
    }

    /// Deletes the completed checkpoints beyond `retain` (and the files only they
    /// reference), unless a savepoint is being copied out of checkpoint storage: then nothing
    /// is deleted until the copy is done, and the end of the copy runs retention again.
    fn run_retention(&mut self, plan: &PipelinePlan) {
        if self.savepoint_writes > 0 {
            return;
        }
        let Some(ck) = self.setup.as_mut() else {
            return;
        };
        let retention = plan_retention(&ck.completed, ck.retain);
        ck.completed
            .retain(|c| retention.retained.contains(&c.checkpoint));
        if !retention.is_empty() {
            let store = Arc::clone(&ck.store);
            let pipeline = plan.id.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = retention.execute(&*store) {
                    tracing::warn!(%pipeline, error = %e, "Deleting old checkpoints failed; they will be retried at the next start.");
                }
            });
        }
    }
}

impl Supervisor {
    /// Checkpoint `barrier` completed: failures behind, commits, the lifecycle's part (a
    /// stop, a probation), then the effects.
    pub(super) fn on_checkpoint_completed(&mut self, barrier: Barrier) {
        let id = barrier.checkpoint;
        self.checkpoints.completed_count += 1;
        self.failures.checkpoints_since += 1;
        if self.failures.consecutive > 0 && self.failures.checkpoints_since >= 2 {
            self.failures.consecutive = 0;
            self.publish(self.status_state());
        }
        self.tasks.send_all(TaskCommand::Complete(id));
        self.stop_after_checkpoint(id);
        self.probation_checkpoint_completed(id);
        self.checkpoints
            .completed(&self.plan, barrier, &self.status);
    }

    /// Checkpoint `barrier` was aborted for `reason`.
    pub(super) fn on_checkpoint_aborted(&mut self, barrier: Barrier, reason: &AbortReason) {
        let id = barrier.checkpoint;
        if reason.is_failure() {
            tracing::warn!(pipeline = %self.plan.id, checkpoint = id, reason = %reason, "Checkpoint failed.");
        } else {
            tracing::debug!(pipeline = %self.plan.id, checkpoint = id, reason = %reason, "Checkpoint aborted.");
        }
        self.checkpoints
            .aborted(&self.plan, barrier, reason, &self.status);
        self.stop_checkpoint_aborted(id, reason);
        self.probation_checkpoint_aborted(id, reason);
    }
}

/// The statistics of completed checkpoint `meta`, triggered at `started`, whose predecessor
/// was `previous`.
fn checkpoint_stats(
    meta: &CheckpointMetadata,
    previous: Option<&TaskRestore>,
    started: Option<Instant>,
) -> CheckpointStats {
    let previous: BTreeSet<&str> = previous
        .map(|l| l.metadata.files().map(|f| f.path.as_str()).collect())
        .unwrap_or_default();
    CheckpointStats {
        checkpoint: meta.checkpoint,
        duration: started.map(|t| t.elapsed()).unwrap_or_default(),
        size: meta.files().map(|f| f.size).sum(),
        new_bytes: meta
            .files()
            .filter(|f| !previous.contains(f.path.as_str()))
            .map(|f| f.size)
            .sum(),
        channel_state_bytes: meta
            .files()
            .filter(|f| is_channel_file(&f.path))
            .map(|f| f.size)
            .sum(),
    }
}

/// `(operator id, subtask)` of every node of the finished tasks' chains.
fn finished_operators(plan: &PipelinePlan, tasks: &[TaskId]) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for t in tasks {
        if let Some(chain) = plan.chains.get(t.chain as usize) {
            for n in &chain.nodes {
                out.push((plan.nodes[n.0].id.clone(), t.subtask));
            }
        }
    }
    out
}

/// Appends `info` to the status history, keeping the last [`HISTORY`] entries.
fn push_history(status: &SharedStatus, info: CheckpointInfo) {
    if let Ok(mut st) = status.lock() {
        st.history.push_back(info);
        while st.history.len() > HISTORY {
            st.history.pop_front();
        }
    }
}

/// `checkpoint` or `savepoint`, as the history names a barrier's kind.
fn kind_name(kind: BarrierKind) -> &'static str {
    match kind {
        BarrierKind::Checkpoint => "checkpoint",
        _ => "savepoint",
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The instant `ms` milliseconds ago.
fn instant_before(ms: u64) -> Instant {
    Instant::now()
        .checked_sub(Duration::from_millis(ms))
        .unwrap_or_else(Instant::now)
}

/// Bytes each operator holds in checkpoint `meta` (its subtasks' files summed), under the
/// backend that wrote them.
fn state_sizes(meta: &CheckpointMetadata) -> Vec<StateSize> {
    let backend = meta
        .backend
        .map_or_else(|| "none".to_owned(), |b| b.as_str().to_owned());
    let mut by_operator: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &meta.subtasks {
        *by_operator.entry(s.operator.as_str()).or_default() +=
            s.files.iter().map(|f| f.size).sum::<u64>();
    }
    by_operator
        .into_iter()
        .map(|(operator, bytes)| StateSize {
            operator: operator.to_owned(),
            backend: backend.clone(),
            bytes,
        })
        .collect()
}
