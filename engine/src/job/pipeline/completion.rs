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
    /// The highest id the tasks were told completed: they are told in increasing order only.
    notified: Option<CheckpointId>,
    /// Deletions in flight (aborted checkpoints, retention), awaited at the end of the run:
    /// a blocking task not started when the runtime shuts down is dropped, which left a
    /// deleted checkpoint's directory behind.
    cleanups: Vec<tokio::task::JoinHandle<()>>,
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
            notified: None,
            cleanups: Vec::new(),
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
    pub(super) fn discard(&mut self, id: CheckpointId) {
        let Some(ck) = self.setup.as_ref() else {
            return;
        };
        let store = Arc::clone(&ck.store);
        self.cleanup(move || {
            let _ = delete_checkpoint(&*store, id);
        });
    }

    /// Runs a deletion on the blocking pool, tracked until [`Self::settle`].
    fn cleanup(&mut self, f: impl FnOnce() + Send + 'static) {
        self.cleanups.retain(|h| !h.is_finished());
        self.cleanups.push(tokio::task::spawn_blocking(f));
    }

    /// Waits for every deletion in flight (the end of the run).
    pub(super) async fn settle(&mut self) {
        for h in self.cleanups.drain(..) {
            let _ = h.await;
        }
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

    /// Whether the tasks are to be told that checkpoint `id` completed: only when it is above
    /// every completion they were told of. A savepoint is never subsumed, so it may complete
    /// after a newer checkpoint did; that checkpoint's notice already committed everything up
    /// to its id, the savepoint's output included (sinks commit every pending transaction up
    /// to the notified id), so telling the tasks again could only commit out of order.
    pub(super) fn notify_tasks(&mut self, id: CheckpointId) -> bool {
        if self.notified.is_some_and(|n| n >= id) {
            return false;
        }
        self.notified = Some(id);
        true
    }

    /// Checkpoint `barrier` completed: its statistics and history entry, the latest restore
    /// point (never moved back: a savepoint completing after a newer checkpoint is not the
    /// latest), the answer to the request that waited for it (a savepoint is copied out
    /// first), the live status, then retention. What is tracked of older checkpoints still in
    /// flight stays (a savepoint goes on after newer completions; a checkpoint aborted while
    /// its metadata was written is forgotten at its abort); that of aborted ones is dropped.
    pub(super) fn completed(
        &mut self,
        plan: &PipelinePlan,
        barrier: Barrier,
        status: &SharedStatus,
    ) {
        let id = barrier.checkpoint;
        let in_flight: BTreeSet<CheckpointId> = self
            .coordinator
            .as_ref()
            .map(|c| c.in_flight().into_iter().collect())
            .unwrap_or_default();
        let tracked = |k: CheckpointId| k > id || in_flight.contains(&k);
        let Some(ck) = self.setup.as_mut() else {
            return;
        };
        let Some(meta) = ck.metadata.remove(&id) else {
            return;
        };
        ck.metadata.retain(|&k, _| tracked(k));
        let started = self.triggered.remove(&id);
        self.triggered.retain(|&k, _| tracked(k));
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
        self.acks.retain(|&k, _| tracked(k));
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
        let newest = ck
            .latest
            .as_ref()
            .is_none_or(|l| l.metadata.checkpoint < id);
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
            newest,
        );
        if newest {
            self.metrics.set_state_sizes(state_sizes(&meta));
        }
        self.stats.push(stats);
        ck.completed.push(CheckpointFiles::from_metadata(&meta));
        let meta = Arc::new(meta);
        if newest {
            ck.latest = Some(TaskRestore {
                store: Arc::clone(&ck.store),
                metadata: Arc::clone(&meta),
                savepoint: false,
                plan: None,
            });
        }
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
            st.latest = st.latest.max(Some(id));
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
            self.cleanup(move || {
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
        if self.checkpoints.notify_tasks(id) {
            self.tasks.send_all(TaskCommand::Complete(id));
        }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::checkpoint::{
        AlignmentMode, CheckpointPlan, Command, CoordinatorConfig, MemoryStore,
    };
    use crate::job::pipeline::storage::CheckpointSetup;

    /// Feeds `cmds` to `ck` as the supervisor does with metadata writes; returns the
    /// completions, which the test carries out itself.
    fn write_all(ck: &mut Checkpoints, plan: &PipelinePlan, cmds: Vec<Command>) -> Vec<Barrier> {
        let mut completed = Vec::new();
        for cmd in cmds {
            match cmd {
                Command::WriteMetadata(meta) => ck.write_metadata(plan, *meta),
                Command::NotifyComplete(b) => completed.push(b),
                other => panic!("unexpected {other:?}"),
            }
        }
        completed
    }

    /// A savepoint whose metadata is being written when a newer checkpoint completes (it is
    /// never subsumed): its completion still answers its request with a whole savepoint, and
    /// neither the restore point, the status nor the tasks' commit notices go back to it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_savepoint_completing_after_a_newer_checkpoint_is_answered_and_moves_nothing_back() {
        let plan = crate::plan::plan_test_yaml(crate::plan::TEST_JOB, Path::new("/jobs"));
        let cp = CheckpointPlan::from_plan(&plan);
        let tasks: Vec<TaskId> = cp.tasks.iter().map(|t| t.task).collect();
        let config = CoordinatorConfig {
            periodic: false,
            ..CoordinatorConfig::from_spec(&plan.spec.checkpoints)
        };
        let setup = CheckpointSetup {
            store: Arc::new(MemoryStore::new()),
            durable: false,
            mode: AlignmentMode::ExactlyOnce,
            retain: 1,
            completed: Vec::new(),
            metadata: BTreeMap::new(),
            latest: None,
        };
        let now = Instant::now();
        let mut ck = Checkpoints::new(Some(setup), Some(Coordinator::new(config, cp, now)));
        let status = SharedStatus::default();
        let dir = tempfile::tempdir().expect("a temporary directory");

        let c = ck.coordinator.as_mut().expect("a coordinator");
        let sp = c
            .trigger_now(now, BarrierKind::Savepoint)
            .expect("savepoint");
        let chk = c
            .trigger_now(now, BarrierKind::Checkpoint)
            .expect("checkpoint");
        ck.triggered(sp.checkpoint);
        ck.triggered(chk.checkpoint);
        let (reply, answer) = oneshot::channel();
        ck.waiters.insert(
            sp.checkpoint,
            Waiter::Savepoint {
                dir: dir.path().to_path_buf(),
                reply,
            },
        );
        // Every task acknowledges both; both metadata writes start and end.
        for id in [sp.checkpoint, chk.checkpoint] {
            for &task in &tasks {
                let c = ck.coordinator.as_mut().expect("a coordinator");
                let cmds = c.ack(id, task, Vec::new()).expect("a valid ack");
                assert!(write_all(&mut ck, &plan, cmds).is_empty());
            }
        }
        for _ in 0..2 {
            let written = ck.internal_rx.recv().await;
            assert!(
                matches!(written, Some(Internal::MetadataWritten(_, Ok(())))),
                "the metadata is written"
            );
        }

        // The checkpoint's write reports back first: it completes, the savepoint goes on.
        let c = ck.coordinator.as_mut().expect("a coordinator");
        let cmds = c.metadata_written(chk.checkpoint, now).expect("requested");
        assert_eq!(write_all(&mut ck, &plan, cmds), vec![chk]);
        assert!(ck.notify_tasks(chk.checkpoint));
        ck.completed(&plan, chk, &status);
        assert!(ck.waiters.contains_key(&sp.checkpoint), "still awaited");

        // Then the savepoint's: it completes after the newer checkpoint.
        let c = ck.coordinator.as_mut().expect("a coordinator");
        let cmds = c.metadata_written(sp.checkpoint, now).expect("requested");
        assert_eq!(write_all(&mut ck, &plan, cmds), vec![sp]);
        assert!(
            !ck.notify_tasks(sp.checkpoint),
            "the tasks committed up to the newer checkpoint already"
        );
        ck.completed(&plan, sp, &status);
        let latest = ck.setup.as_ref().and_then(|s| s.latest.as_ref());
        assert_eq!(
            latest.map(|l| l.metadata.checkpoint),
            Some(chk.checkpoint),
            "the restore point stays the newer checkpoint"
        );
        assert_eq!(status.lock().expect("status").latest, Some(chk.checkpoint));

        // Its copy ends: the request is answered with a whole savepoint.
        match ck.internal_rx.recv().await {
            Some(Internal::SavepointWritten { reply, result }) => {
                ck.savepoint_written(&plan, reply, result);
            }
            _ => panic!("expected the savepoint copy to end"),
        }
        let info = answer
            .await
            .expect("the request is answered")
            .expect("the savepoint is written");
        assert_eq!(info.checkpoint, sp.checkpoint);
        assert!(info.path.join("_metadata").is_file());
        assert!(ck.waiters.is_empty());
        assert!(ck.triggered.is_empty() && ck.acks.is_empty());
        let setup = ck.setup.as_ref().expect("a setup");
        assert!(setup.metadata.is_empty(), "nothing in flight is tracked");
        let retained: Vec<CheckpointId> = setup.completed.iter().map(|c| c.checkpoint).collect();
        assert_eq!(retained, vec![chk.checkpoint], "retain: 1 keeps the newest");
    }
}
