//! The checkpoint coordinator of one pipeline (ARCHITECTURE.md 5.1, 5.5, 5.6): a state
//! machine driven by explicit time and by the events the runtime observed, returning the
//! [`Command`]s the runtime must carry out.
//!
//! Life of a checkpoint: *pending* (triggered, barriers injected) → *acknowledged* (every
//! expected task acked; [`Command::WriteMetadata`] issued) → *completed* (the runtime reported
//! the metadata durable; [`Command::NotifyComplete`] issued) or *aborted* (timeout, decline,
//! failed metadata write, subsumption, cancellation; [`Command::Abort`] issued).
//!
//! Subsumption (as in Flink): a completion aborts the lower *checkpoints* still in flight, so
//! checkpoints complete in id order. Savepoints are never subsumed by a newer checkpoint: a
//! savepoint may complete after a newer checkpoint did, and the runtime must then neither
//! move its restore point back nor notify the tasks out of order (see
//! `job::pipeline::completion`). Only a stop-with-savepoint ends every lower one.
//!
//! The coordinator never sleeps, spawns or does I/O: the runtime calls [`Coordinator::poll`]
//! at [`Coordinator::next_wakeup`] (or whenever convenient) and feeds acknowledgements,
//! declines, finished tasks and metadata-write results as they arrive.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use weir_schema::CheckpointSpec;

use super::metadata::{
    BackendKind, CheckpointMetadata, METADATA_FORMAT_VERSION, OperatorInfo, SubtaskState,
    config_hash,
};
use super::{CheckpointId, Result, TaskId};
use crate::base::error::CheckpointError;
use crate::base::message::{Barrier, BarrierKind};
use crate::plan::PipelinePlan;

/// The coordinator's timing and failure settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Trigger periodic checkpoints (`checkpoints.enabled`). Savepoints work either way.
    pub periodic: bool,
    /// Time between the starts of two periodic checkpoints.
    pub interval: Duration,
    /// Minimum time from the completion of one checkpoint to the start of the next periodic
    /// one. When non-zero, at most one periodic checkpoint is in flight (as in Flink).
    pub min_pause: Duration,
    /// A checkpoint not fully acknowledged after this long is aborted.
    pub timeout: Duration,
    /// Periodic checkpoints in flight at most.
    pub max_concurrent: u32,
    /// Consecutive failed periodic checkpoints tolerated; one more triggers a failover.
    pub tolerable_failures: u32,
}

impl CoordinatorConfig {
    /// The settings of a pipeline's `checkpoints:` section.
    pub fn from_spec(spec: &CheckpointSpec) -> Self {
        Self {
            periodic: spec.enabled,
            interval: spec.interval.get(),
            min_pause: spec.min_pause.get(),
            timeout: spec.timeout.get(),
            max_concurrent: spec.max_concurrent.max(1),
            tolerable_failures: spec.tolerable_failures,
        }
    }
}

/// One task as the coordinator sees it: who acknowledges, for which operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    /// The task.
    pub task: TaskId,
    /// Ids of the operators chained in it (sources and sinks included), upstream first.
    pub operators: Vec<String>,
}

/// What the coordinator needs to know about a pipeline's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// The pipeline's id.
    pub pipeline: String,
    /// Hash of the pipeline's configuration, recorded in metadata.
    pub config_hash: String,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// The pipeline's state backend, recorded in metadata.
    pub backend: Option<BackendKind>,
    /// Every operator (source, sink) with its parallelism, type and declared state, in plan
    /// order.
    pub operators: Vec<OperatorInfo>,
    /// Every task, each of which acknowledges every checkpoint.
    pub tasks: Vec<TaskInfo>,
}

impl CheckpointPlan {
    /// Derives the checkpoint view of a compiled plan: one task per chain and subtask.
    pub fn from_plan(plan: &PipelinePlan) -> Self {
        let mut tasks = Vec::new();
        for (index, chain) in plan.chains.iter().enumerate() {
            let operators: Vec<String> = chain
                .nodes
                .iter()
                .filter_map(|n| plan.nodes.get(n.0).map(|node| node.id.clone()))
                .collect();
            for subtask in 0..chain.parallelism {
                tasks.push(TaskInfo {
                    task: TaskId::new(index as u32, subtask),
                    operators: operators.clone(),
                });
            }
        }
        Self {
            pipeline: plan.id.clone(),
            config_hash: config_hash(&plan.spec),
            max_parallelism: plan.max_parallelism,
            backend: Some(BackendKind::of(&plan.spec.state)),
            operators: plan
                .nodes
                .iter()
                .map(|n| super::restore_plan::operator_info(plan, n))
                .collect(),
            tasks,
        }
    }
}

/// Why a task declined a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeclineReason {
    /// Its aligner gave the checkpoint up for a newer barrier (not counted as a failure).
    Subsumed,
    /// The snapshot failed (counted against `tolerable_failures` for periodic checkpoints).
    Failed(String),
}

/// Why a checkpoint was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// Not fully acknowledged within `timeout`.
    Timeout,
    /// A task declined it.
    Declined {
        /// The declining task.
        task: TaskId,
        /// Its reason.
        reason: DeclineReason,
    },
    /// Writing its metadata failed.
    MetadataWriteFailed(String),
    /// A newer checkpoint (or savepoint) completed first; never the reason a savepoint is
    /// aborted, except by a stop-with-savepoint.
    Subsumed {
        /// The completed checkpoint.
        by: CheckpointId,
    },
    /// The pipeline is failing over or restarting.
    Cancelled,
}

impl AbortReason {
    /// Whether this abort counts against `tolerable_failures` (for periodic checkpoints).
    pub fn is_failure(&self) -> bool {
        match self {
            Self::Timeout | Self::MetadataWriteFailed(_) => true,
            Self::Declined { reason, .. } => matches!(reason, DeclineReason::Failed(_)),
            Self::Subsumed { .. } | Self::Cancelled => false,
        }
    }
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out"),
            Self::Declined {
                task,
                reason: DeclineReason::Subsumed,
            } => write!(f, "declined by {task}: subsumed by a newer barrier"),
            Self::Declined {
                task,
                reason: DeclineReason::Failed(why),
            } => write!(f, "declined by {task}: {why}"),
            Self::MetadataWriteFailed(why) => write!(f, "writing metadata failed: {why}"),
            Self::Subsumed { by } => write!(f, "subsumed by checkpoint {by}"),
            Self::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// What the runtime must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Inject this barrier at every source subtask.
    Trigger(Barrier),
    /// Every task acknowledged: write this metadata durably to `chk-<n>/_metadata` (after its
    /// files), then call [`Coordinator::metadata_written`] or
    /// [`Coordinator::metadata_failed`].
    WriteMetadata(Box<CheckpointMetadata>),
    /// The checkpoint is complete: notify every task (two-phase-commit sinks commit), and run
    /// retention. For [`BarrierKind::SavepointThenStop`], stop the pipeline. A checkpoint's
    /// id is above every earlier completion's; a savepoint's may be below a newer
    /// checkpoint's that completed first: what it would commit is committed already (sinks
    /// commit everything up to the notified id), so the tasks need no notice of it.
    NotifyComplete(Barrier),
    /// The checkpoint is aborted: tell the tasks to drop it and delete its `chk-<n>/`
    /// directory. For a savepoint, report the failure to whoever asked for it.
    Abort {
        /// The aborted checkpoint.
        barrier: Barrier,
        /// Why.
        reason: AbortReason,
    },
    /// A task acknowledged (or declined) a checkpoint that was already aborted: its files
    /// were written after the abort deleted `chk-<n>/`. Delete that directory again (never
    /// anything in `shared/`, which retained checkpoints may reference).
    Discard {
        /// The aborted checkpoint.
        checkpoint: CheckpointId,
    },
    /// Too many consecutive checkpoint failures: fail the pipeline over (its restart
    /// strategy decides what follows; the cause is external).
    Failover {
        /// Consecutive failed checkpoints.
        consecutive_failures: u32,
        /// The last failure.
        last: AbortReason,
    },
}

#[derive(Clone, Debug)]
struct Pending {
    barrier: Barrier,
    deadline: Instant,
    /// Tasks that have not acknowledged yet.
    awaiting: BTreeSet<TaskId>,
    acks: BTreeMap<TaskId, Vec<SubtaskState>>,
    /// [`Command::WriteMetadata`] was issued; waiting for the write's outcome.
    writing: bool,
    /// Aborted while its metadata write was in flight: the abort is issued when the write
    /// reports back, so the runtime never deletes files under a writer.
    doomed: Option<AbortReason>,
}

/// The checkpoint coordinator of one pipeline (see the module docs).
#[derive(Clone, Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    plan: CheckpointPlan,
    /// Tasks that acknowledge new checkpoints (every task not finished).
    live: BTreeSet<TaskId>,
    finished: BTreeSet<TaskId>,
    pending: BTreeMap<CheckpointId, Pending>,
    last_id: CheckpointId,
    last_completed: Option<CheckpointId>,
    last_completion_at: Option<Instant>,
    next_periodic: Instant,
    consecutive_failures: u32,
    /// The reason of the last counted failure.
    last_failure: Option<AbortReason>,
    failed_over: bool,
    /// A stop-with-savepoint is in flight or done: no more periodic checkpoints.
    stopping: Option<CheckpointId>,
    /// The most recently aborted ids (at most [`ABORTED_REMEMBERED`]): a late acknowledgement
    /// of one of them asks for its directory to be deleted again ([`Command::Discard`]).
    aborted: BTreeSet<CheckpointId>,
}

/// Aborted checkpoint ids the coordinator remembers for [`Command::Discard`]. A task
/// acknowledges within `timeout` of the trigger or not at all, so only the latest aborts
/// matter; older ones are forgotten (a stray directory of theirs is removed at the next
/// start, as debris without metadata).
const ABORTED_REMEMBERED: usize = 1024;

impl Coordinator {
    /// A coordinator started at `now`; the first periodic checkpoint is due at
    /// `now + interval`, and ids start at 1.
    pub fn new(config: CoordinatorConfig, plan: CheckpointPlan, now: Instant) -> Self {
        let live = plan.tasks.iter().map(|t| t.task).collect();
        Self {
            next_periodic: now + config.interval,
            config,
            plan,
            live,
            finished: BTreeSet::new(),
            pending: BTreeMap::new(),
            last_id: 0,
            last_completed: None,
            last_completion_at: None,
            consecutive_failures: 0,
            last_failure: None,
            failed_over: false,
            stopping: None,
            aborted: BTreeSet::new(),
        }
    }

    /// Continues the id sequence after `last_used`: pass the highest `chk-<n>` found in the
    /// store (not only the restored one), so that no directory is ever reused.
    #[must_use]
    pub fn resume_after(mut self, last_used: CheckpointId) -> Self {
        self.last_id = self.last_id.max(last_used);
        self
    }

    /// Marks tasks as finished before the first trigger (restored from a checkpoint's
    /// `finished_tasks`).
    #[must_use]
    pub fn with_finished(mut self, finished: impl IntoIterator<Item = TaskId>) -> Self {
        for task in finished {
            self.live.remove(&task);
            self.finished.insert(task);
        }
        self
    }

    /// The plan view this coordinator was built with.
    #[cfg(any(test, feature = "testkit"))]
    pub fn plan(&self) -> &CheckpointPlan {
        &self.plan
    }

    /// The last id assigned (0 before the first).
    #[cfg(any(test, feature = "testkit"))]
    pub fn last_id(&self) -> CheckpointId {
        self.last_id
    }

    /// The latest completed checkpoint.
    #[cfg(any(test, feature = "testkit"))]
    pub fn last_completed(&self) -> Option<CheckpointId> {
        self.last_completed
    }

    /// Ids of checkpoints in flight (pending or writing metadata), ascending.
    pub fn in_flight(&self) -> Vec<CheckpointId> {
        self.pending.keys().copied().collect()
    }

    /// Consecutive failed periodic checkpoints so far.
    #[cfg(any(test, feature = "testkit"))]
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Whether a failover was requested (the coordinator is idle until
    /// [`restart`](Self::restart)).
    #[cfg(any(test, feature = "testkit"))]
    pub fn is_failed_over(&self) -> bool {
        self.failed_over
    }

    /// The earliest instant at which [`poll`](Self::poll) has something to do (a periodic
    /// trigger or a timeout); `None` when only events can make progress.
    pub fn next_wakeup(&self) -> Option<Instant> {
        if self.failed_over {
            return None;
        }
        let timeout = self
            .pending
            .values()
            .filter(|p| !p.writing)
            .map(|p| p.deadline)
            .min();
        let trigger = self.periodic_allowed().then(|| {
            let pause = self
                .last_completion_at
                .map_or(self.next_periodic, |t| t + self.config.min_pause);
            self.next_periodic.max(pause)
        });
        match (timeout, trigger) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a periodic checkpoint could start once its time comes (ignoring time).
    fn periodic_allowed(&self) -> bool {
        if !self.config.periodic || self.failed_over || self.stopping.is_some() {
            return false;
        }
        if self.live.is_empty() {
            return false;
        }
        let in_flight = self
            .pending
            .values()
            .filter(|p| p.barrier.kind == BarrierKind::Checkpoint && p.doomed.is_none())
            .count();
        let limit = if self.config.min_pause.is_zero() {
            self.config.max_concurrent.max(1) as usize
        } else {
            1
        };
        in_flight < limit
    }

    /// Advances time: aborts timed-out checkpoints, requests a failover when too many failed
    /// in a row, and triggers a periodic checkpoint when it is due and allowed.
    pub fn poll(&mut self, now: Instant) -> Vec<Command> {
        let mut out = Vec::new();
        if self.failed_over {
            return out;
        }
        let expired: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.writing && p.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.abort(id, AbortReason::Timeout, &mut out);
        }
        if self.check_failover(&mut out) {
            return out;
        }
        let paused = self
            .last_completion_at
            .is_some_and(|t| now < t + self.config.min_pause);
        if self.periodic_allowed() && now >= self.next_periodic && !paused {
            let barrier = self.start(now, BarrierKind::Checkpoint);
            self.next_periodic = now + self.config.interval;
            out.push(Command::Trigger(barrier));
        }
        out
    }

    /// Triggers a checkpoint of `kind` now, regardless of interval, `min_pause` and
    /// `max_concurrent` (a savepoint, or a checkpoint asked for by hand). Inject the returned
    /// barrier at every source subtask, as for [`Command::Trigger`]. After a
    /// [`BarrierKind::SavepointThenStop`] no periodic checkpoint starts unless it aborts.
    ///
    /// # Errors
    /// [`CheckpointError::Protocol`] while failing over, when every task has finished, or
    /// while a stop-with-savepoint is in flight.
    pub fn trigger_now(&mut self, now: Instant, kind: BarrierKind) -> Result<Barrier> {
        if self.failed_over {
            return Err(CheckpointError::Protocol(
                "cannot trigger: the pipeline is failing over".into(),
            ));
        }
        if self.live.is_empty() {
            return Err(CheckpointError::Protocol(
                "cannot trigger: every task has finished".into(),
            ));
        }
        if let Some(id) = self.stopping {
            return Err(CheckpointError::Protocol(format!(
                "cannot trigger: stop-with-savepoint {id} is in progress"
            )));
        }
        let barrier = self.start(now, kind);
        if kind == BarrierKind::SavepointThenStop {
            self.stopping = Some(barrier.checkpoint);
        }
        Ok(barrier)
    }

    fn start(&mut self, now: Instant, kind: BarrierKind) -> Barrier {
        self.last_id += 1;
        let barrier = Barrier {
            checkpoint: self.last_id,
            kind,
        };
        self.pending.insert(
            barrier.checkpoint,
            Pending {
                barrier,
                deadline: now + self.config.timeout,
                awaiting: self.live.clone(),
                acks: BTreeMap::new(),
                writing: false,
                doomed: None,
            },
        );
        tracing::debug!(
            pipeline = %self.plan.pipeline,
            checkpoint = barrier.checkpoint,
            kind = ?kind,
            "Triggered checkpoint."
        );
        barrier
    }

    /// A task acknowledged checkpoint `id` with the snapshots of its operators. When it was
    /// the last one expected, returns [`Command::WriteMetadata`]. Acks of checkpoints already
    /// aborted or completed are ignored (their files go with the aborted `chk-<n>/`).
    ///
    /// # Errors
    /// [`CheckpointError::Protocol`] for an id never triggered, a task not in the plan, a
    /// second ack from one task, or a snapshot of an operator or subtask not in the task.
    pub fn ack(
        &mut self,
        id: CheckpointId,
        task: TaskId,
        states: Vec<SubtaskState>,
    ) -> Result<Vec<Command>> {
        if id > self.last_id {
            return Err(CheckpointError::Protocol(format!(
                "ack from {task} for checkpoint {id}, which was never triggered"
            )));
        }
        let info = self
            .plan
            .tasks
            .iter()
            .find(|t| t.task == task)
            .ok_or_else(|| {
                CheckpointError::Protocol(format!("ack from {task}, which is not in the plan"))
            })?;
        if let Some(bad) = states
            .iter()
            .find(|s| s.subtask != task.subtask || !info.operators.contains(&s.operator))
        {
            return Err(CheckpointError::Protocol(format!(
                "ack from {task} carries a snapshot of `{}` subtask {}, which it does not run",
                bad.operator, bad.subtask
            )));
        }
        let Some(pending) = self.pending.get_mut(&id) else {
            tracing::debug!(checkpoint = id, %task, "Late acknowledgement of an aborted checkpoint.");
            return Ok(self.discard_late(id).into_iter().collect());
        };
        if pending.writing || pending.doomed.is_some() {
            return Ok(Vec::new());
        }
        if pending.acks.contains_key(&task) {
            return Err(CheckpointError::Protocol(format!(
                "second ack from {task} for checkpoint {id}"
            )));
        }
        pending.awaiting.remove(&task);
        tracing::trace!(checkpoint = id, %task, awaiting = ?pending.awaiting, "Ack.");
        pending.acks.insert(task, states);
        Ok(self.maybe_acknowledged(id).into_iter().collect())
    }

    /// Issues [`Command::WriteMetadata`] when nobody is awaited any more.
    fn maybe_acknowledged(&mut self, id: CheckpointId) -> Option<Command> {
        let pending = self.pending.get_mut(&id)?;
        if pending.writing || pending.doomed.is_some() || !pending.awaiting.is_empty() {
            return None;
        }
        pending.writing = true;
        let mut subtasks: Vec<SubtaskState> = pending.acks.values().flatten().cloned().collect();
        let order = |op: &str| self.plan.operators.iter().position(|o| o.id == op);
        subtasks.sort_by_key(|s| (order(&s.operator), s.subtask));
        let finished_tasks = self
            .finished
            .iter()
            .filter(|t| !pending.acks.contains_key(t))
            .copied()
            .collect();
        Some(Command::WriteMetadata(Box::new(CheckpointMetadata {
            format_version: METADATA_FORMAT_VERSION,
            pipeline: self.plan.pipeline.clone(),
            checkpoint: id,
            kind: pending.barrier.kind,
            config_hash: self.plan.config_hash.clone(),
            max_parallelism: self.plan.max_parallelism,
            backend: self.plan.backend,
            operators: self.plan.operators.clone(),
            subtasks,
            finished_tasks,
            finished_operators: Vec::new(),
        })))
    }

    /// A task declined checkpoint `id`: the checkpoint is aborted. Unknown or finished ids
    /// are ignored.
    pub fn decline(
        &mut self,
        id: CheckpointId,
        task: TaskId,
        reason: DeclineReason,
    ) -> Vec<Command> {
        let mut out = Vec::new();
        match self.pending.get(&id) {
            Some(p) if !p.writing => {
                self.abort(id, AbortReason::Declined { task, reason }, &mut out);
                self.check_failover(&mut out);
            }
            Some(_) => {}
            // A failed snapshot may have written part of its files after the abort.
            None => out.extend(self.discard_late(id)),
        }
        out
    }

    /// [`Command::Discard`] for a late acknowledgement or decline of `id`, when `id` is a
    /// checkpoint this coordinator aborted (never one that completed).
    fn discard_late(&self, id: CheckpointId) -> Option<Command> {
        self.aborted
            .contains(&id)
            .then_some(Command::Discard { checkpoint: id })
    }

    /// A task reached the end of its input and stopped: it acknowledges nothing any more.
    /// Pending checkpoints stop waiting for it (and may be acknowledged now); it is recorded
    /// in later metadata as finished.
    pub fn task_finished(&mut self, task: TaskId) -> Vec<Command> {
        self.live.remove(&task);
        self.finished.insert(task);
        let ids: Vec<CheckpointId> = self.pending.keys().copied().collect();
        let mut out = Vec::new();
        for id in ids {
            if let Some(p) = self.pending.get_mut(&id) {
                p.awaiting.remove(&task);
            }
            out.extend(self.maybe_acknowledged(id));
        }
        out
    }

    /// The metadata of checkpoint `id` is durable: the checkpoint is complete. Returns
    /// [`Command::NotifyComplete`], preceded by aborts of the lower checkpoints in flight that
    /// it subsumes (see [`subsumes`]); or, when `id` was aborted while its write was in
    /// flight, that abort.
    ///
    /// # Errors
    /// [`CheckpointError::Protocol`] when no metadata write for `id` was requested.
    pub fn metadata_written(&mut self, id: CheckpointId, now: Instant) -> Result<Vec<Command>> {
        let Some(pending) = self.pending.get(&id).filter(|p| p.writing) else {
            return Err(CheckpointError::Protocol(format!(
                "metadata of checkpoint {id} written, but no write was requested"
            )));
        };
        let mut out = Vec::new();
        if let Some(reason) = pending.doomed.clone() {
            // The write is over: the abort (and the deletion of `chk-<n>/`, whose metadata
            // now exists) can be carried out without racing it.
            if let Some(p) = self.pending.get_mut(&id) {
                p.writing = false;
            }
            self.abort(id, reason, &mut out);
            return Ok(out);
        }
        let Some(pending) = self.pending.remove(&id) else {
            return Ok(out);
        };
        self.last_completed = Some(self.last_completed.map_or(id, |c| c.max(id)));
        self.last_completion_at = Some(now);
        self.consecutive_failures = 0;
        let lower: Vec<CheckpointId> = self
            .pending
            .range(..id)
            .filter(|(_, p)| subsumes(pending.barrier.kind, p.barrier.kind))
            .map(|(&n, _)| n)
            .collect();
        for n in lower {
            self.abort(n, AbortReason::Subsumed { by: id }, &mut out);
        }
        tracing::debug!(
            pipeline = %self.plan.pipeline,
            checkpoint = id,
            kind = %pending.barrier.kind.name(),
            "Checkpoint completed."
        );
        if self.stopping == Some(id) {
            // Stopped: nothing more is triggered.
            self.config.periodic = false;
        }
        out.push(Command::NotifyComplete(pending.barrier));
        Ok(out)
    }

    /// Writing checkpoint `id`'s metadata failed: the checkpoint is aborted (and counts as a
    /// failure unless it was already doomed).
    ///
    /// # Errors
    /// [`CheckpointError::Protocol`] when no metadata write for `id` was requested.
    pub fn metadata_failed(&mut self, id: CheckpointId, reason: String) -> Result<Vec<Command>> {
        let Some(pending) = self.pending.get_mut(&id).filter(|p| p.writing) else {
            return Err(CheckpointError::Protocol(format!(
                "metadata of checkpoint {id} failed, but no write was requested"
            )));
        };
        // The write reported back: nothing is in flight any more, abort for real.
        pending.writing = false;
        let reason = pending
            .doomed
            .clone()
            .unwrap_or(AbortReason::MetadataWriteFailed(reason));
        let mut out = Vec::new();
        self.abort(id, reason, &mut out);
        self.check_failover(&mut out);
        Ok(out)
    }

    /// The pipeline (or part of it) restarted at `now`: every checkpoint in flight is
    /// cancelled, the failure count and any failover request are cleared, `finished` becomes
    /// the set of finished tasks (from the restored checkpoint and the tasks that kept
    /// running), and the next periodic checkpoint is due at `now + interval`. Ids keep
    /// increasing.
    pub fn restart(
        &mut self,
        now: Instant,
        finished: impl IntoIterator<Item = TaskId>,
    ) -> Vec<Command> {
        let mut out = Vec::new();
        let ids: Vec<CheckpointId> = self.pending.keys().copied().collect();
        for id in ids {
            self.abort(id, AbortReason::Cancelled, &mut out);
        }
        self.finished = finished.into_iter().collect();
        self.live = self
            .plan
            .tasks
            .iter()
            .map(|t| t.task)
            .filter(|t| !self.finished.contains(t))
            .collect();
        self.consecutive_failures = 0;
        self.failed_over = false;
        self.stopping = None;
        self.next_periodic = now + self.config.interval;
        out
    }

    /// Aborts `id`, or dooms it when its metadata write is in flight: a checkpoint whose
    /// write has not reported back is never aborted (its directory would be deleted under the
    /// writer, which then leaves a complete-looking checkpoint nothing tracks). The first
    /// reason wins; the abort is issued when the write reports back.
    fn abort(&mut self, id: CheckpointId, reason: AbortReason, out: &mut Vec<Command>) {
        let Some(pending) = self.pending.get_mut(&id) else {
            return;
        };
        if pending.writing {
            pending.doomed.get_or_insert(reason);
            return;
        }
        let Some(pending) = self.pending.remove(&id) else {
            return;
        };
        self.aborted.insert(id);
        while self.aborted.len() > ABORTED_REMEMBERED {
            self.aborted.pop_first();
        }
        // Only periodic checkpoints count: a failed savepoint is reported to its requester.
        if pending.barrier.kind == BarrierKind::Checkpoint && reason.is_failure() {
            self.consecutive_failures += 1;
            self.last_failure = Some(reason.clone());
        }
        if self.stopping == Some(id) {
            self.stopping = None;
        }
        tracing::warn!(
            pipeline = %self.plan.pipeline,
            checkpoint = id,
            %reason,
            "Checkpoint aborted."
        );
        out.push(Command::Abort {
            barrier: pending.barrier,
            reason,
        });
    }

    /// Requests a failover when the consecutive failures exceed the tolerance.
    fn check_failover(&mut self, out: &mut Vec<Command>) -> bool {
        if self.failed_over || self.consecutive_failures <= self.config.tolerable_failures {
            return false;
        }
        let last = self.last_failure.clone().unwrap_or(AbortReason::Timeout);
        let ids: Vec<CheckpointId> = self.pending.keys().copied().collect();
        for id in ids {
            self.abort(id, AbortReason::Cancelled, out);
        }
        self.failed_over = true;
        out.push(Command::Failover {
            consecutive_failures: self.consecutive_failures,
            last,
        });
        true
    }
}

/// Whether a completed checkpoint of kind `completed` subsumes a lower one of kind `lower`
/// still in flight (as in Flink): only checkpoints are subsumed. A savepoint was asked for by
/// someone who waits for it, and a newer checkpoint does not replace it; it goes on and
/// completes (possibly after newer checkpoints) or ends by its own abort (timeout, decline,
/// failed write, restart). Only a stop-with-savepoint's completion ends every lower one,
/// savepoints included: the pipeline stops at it, so nothing lower is still taken (and
/// nothing is left in flight when the tasks end).
fn subsumes(completed: BarrierKind, lower: BarrierKind) -> bool {
    lower == BarrierKind::Checkpoint || completed == BarrierKind::SavepointThenStop
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::metadata::{FileRef, KeyGroups};

    const SEC: Duration = Duration::from_secs(1);

    fn config() -> CoordinatorConfig {
        CoordinatorConfig {
            periodic: true,
            interval: 10 * SEC,
            min_pause: Duration::ZERO,
            timeout: 60 * SEC,
            max_concurrent: 1,
            tolerable_failures: 0,
        }
    }

    /// A coordinator over [`plan`] with [`config`], allowing `max_concurrent` checkpoints in
    /// flight.
    fn concurrent(max_concurrent: u32, t0: Instant) -> Coordinator {
        Coordinator::new(
            CoordinatorConfig {
                max_concurrent,
                ..config()
            },
            plan(),
            t0,
        )
    }

    /// Two tasks: a source (`src`) and a sink chain (`map`, `out`), parallelism 1.
    fn plan() -> CheckpointPlan {
        CheckpointPlan {
            pipeline: "p".into(),
            config_hash: "h".into(),
            max_parallelism: 128,
            backend: None,
            operators: ["src", "map", "out"]
                .map(|id| OperatorInfo {
                    id: id.into(),
                    parallelism: 1,
                    script_hash: None,
                    node: None,
                    keyed_state: None,
                    local_state: None,
                })
                .into(),
            tasks: vec![
                TaskInfo {
                    task: TaskId::new(0, 0),
                    operators: vec!["src".into()],
                },
                TaskInfo {
                    task: TaskId::new(1, 0),
                    operators: vec!["map".into(), "out".into()],
                },
            ],
        }
    }

    const SRC: TaskId = TaskId::new(0, 0);
    const SINK: TaskId = TaskId::new(1, 0);

    fn state(op: &str, id: CheckpointId) -> Vec<SubtaskState> {
        vec![SubtaskState {
            operator: op.into(),
            subtask: 0,
            key_groups: KeyGroups { start: 0, end: 128 },
            files: vec![FileRef::of(format!("chk-{id}/{op}-0"), b"s")],
            watermark: None,
        }]
    }

    fn triggered(cmds: &[Command]) -> Vec<CheckpointId> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::Trigger(b) => Some(b.checkpoint),
                _ => None,
            })
            .collect()
    }

    fn aborted(cmds: &[Command]) -> Vec<(CheckpointId, AbortReason)> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::Abort { barrier, reason } => Some((barrier.checkpoint, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// Acks `id` from both tasks and returns the metadata to write.
    fn ack_all(c: &mut Coordinator, id: CheckpointId) -> CheckpointMetadata {
        assert!(c.ack(id, SRC, state("src", id)).expect("ack").is_empty());
        let cmds = c.ack(id, SINK, state("map", id)).expect("ack");
        match cmds.as_slice() {
            [Command::WriteMetadata(meta)] => (**meta).clone(),
            other => panic!("expected WriteMetadata, got {other:?}"),
        }
    }

    #[test]
    fn triggers_on_the_interval_with_strictly_increasing_ids() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(config(), plan(), t0);
        assert_eq!(c.next_wakeup(), Some(t0 + 10 * SEC));
        assert!(c.poll(t0 + 9 * SEC).is_empty());
        assert_eq!(triggered(&c.poll(t0 + 10 * SEC)), vec![1]);
        // max_concurrent = 1: nothing while 1 is in flight.
        assert!(triggered(&c.poll(t0 + 25 * SEC)).is_empty());
        ack_all(&mut c, 1);
        let done = c.metadata_written(1, t0 + 26 * SEC).expect("written");
        assert_eq!(
            done,
            vec![Command::NotifyComplete(Barrier {
                checkpoint: 1,
                kind: BarrierKind::Checkpoint
            })]
        );
        assert_eq!(c.last_completed(), Some(1));
        // Overdue: triggers at once, then every interval.
        assert_eq!(triggered(&c.poll(t0 + 26 * SEC)), vec![2]);
        ack_all(&mut c, 2);
        assert!(c.metadata_written(2, t0 + 27 * SEC).is_ok());
        assert!(triggered(&c.poll(t0 + 30 * SEC)).is_empty());
        assert_eq!(triggered(&c.poll(t0 + 36 * SEC)), vec![3]);
    }

    #[test]
    fn metadata_lists_every_subtask_state_in_plan_order() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(config(), plan(), t0);
        let _ = c.poll(t0 + 10 * SEC);
        assert!(c.ack(1, SINK, state("map", 1)).expect("ack").is_empty());
        let cmds = c.ack(1, SRC, state("src", 1)).expect("ack");
        let Some(Command::WriteMetadata(meta)) = cmds.first() else {
            panic!("expected WriteMetadata, got {cmds:?}");
        };
        assert_eq!(meta.checkpoint, 1);
        assert_eq!(meta.pipeline, "p");
        assert_eq!(meta.max_parallelism, 128);
        let ops: Vec<&str> = meta.subtasks.iter().map(|s| s.operator.as_str()).collect();
        assert_eq!(ops, vec!["src", "map"]);
        assert_eq!(meta.files().count(), 2);
        // Not complete until the write is reported.
        assert_eq!(c.last_completed(), None);
    }

    #[test]
    fn max_concurrent_and_min_pause_gate_triggers() {
        let t0 = Instant::now();
        let mut c = concurrent(2, t0);
        assert_eq!(triggered(&c.poll(t0 + 10 * SEC)), vec![1]);
        assert_eq!(triggered(&c.poll(t0 + 20 * SEC)), vec![2]);
        assert!(
            triggered(&c.poll(t0 + 30 * SEC)).is_empty(),
            "two in flight"
        );

        let mut c = Coordinator::new(
            CoordinatorConfig {
                max_concurrent: 2,
                min_pause: 15 * SEC,
                ..config()
            },
            plan(),
            t0,
        );
        assert_eq!(triggered(&c.poll(t0 + 10 * SEC)), vec![1]);
        assert!(
            triggered(&c.poll(t0 + 20 * SEC)).is_empty(),
            "min_pause allows one in flight"
        );
        ack_all(&mut c, 1);
        assert!(c.metadata_written(1, t0 + 21 * SEC).is_ok());
        assert_eq!(c.next_wakeup(), Some(t0 + 36 * SEC));
        assert!(triggered(&c.poll(t0 + 35 * SEC)).is_empty(), "pausing");
        assert_eq!(triggered(&c.poll(t0 + 36 * SEC)), vec![2]);
    }

    #[test]
    fn completing_a_checkpoint_subsumes_lower_pending_ones() {
        let t0 = Instant::now();
        let mut c = concurrent(3, t0);
        let _ = c.poll(t0 + 10 * SEC);
        let _ = c.poll(t0 + 20 * SEC);
        assert_eq!(c.in_flight(), vec![1, 2]);
        ack_all(&mut c, 2);
        let cmds = c.metadata_written(2, t0 + 21 * SEC).expect("written");
        assert_eq!(aborted(&cmds), vec![(1, AbortReason::Subsumed { by: 2 })]);
        assert!(matches!(cmds.last(), Some(Command::NotifyComplete(b)) if b.checkpoint == 2));
        assert_eq!(c.consecutive_failures(), 0, "subsumption is no failure");
        // A late ack of the subsumed checkpoint only has its late files deleted.
        assert_eq!(
            c.ack(1, SRC, state("src", 1)).expect("late ack"),
            vec![Command::Discard { checkpoint: 1 }]
        );
        assert!(c.ack(9, SRC, state("src", 9)).is_err(), "never triggered");
    }

    #[test]
    fn a_checkpoint_being_written_is_aborted_only_after_its_write_reports_back() {
        let t0 = Instant::now();
        let mut c = concurrent(2, t0);
        let _ = c.poll(t0 + 10 * SEC);
        let _ = c.poll(t0 + 20 * SEC);
        ack_all(&mut c, 1);
        ack_all(&mut c, 2);
        let cmds = c.metadata_written(2, t0 + 21 * SEC).expect("written");
        assert!(aborted(&cmds).is_empty(), "1's write is still in flight");
        let cmds = c.metadata_written(1, t0 + 22 * SEC).expect("reported");
        assert_eq!(aborted(&cmds), vec![(1, AbortReason::Subsumed { by: 2 })]);
        assert_eq!(c.last_completed(), Some(2));
        assert!(c.metadata_written(1, t0 + 23 * SEC).is_err());
    }

    #[test]
    fn a_completed_checkpoint_does_not_subsume_a_savepoint_in_flight() {
        let t0 = Instant::now();
        let mut c = concurrent(3, t0);
        let _ = c.poll(t0 + 10 * SEC);
        c.trigger_now(t0 + 11 * SEC, BarrierKind::Savepoint)
            .expect("savepoint triggered");
        let _ = c.poll(t0 + 20 * SEC);
        assert_eq!(c.in_flight(), vec![1, 2, 3]);
        ack_all(&mut c, 3);
        let cmds = c.metadata_written(3, t0 + 21 * SEC).expect("written");
        assert_eq!(
            aborted(&cmds),
            vec![(1, AbortReason::Subsumed { by: 3 })],
            "the older checkpoint is subsumed, the savepoint is not"
        );
        assert!(matches!(cmds.last(), Some(Command::NotifyComplete(b)) if b.checkpoint == 3));
        assert_eq!(c.in_flight(), vec![2], "the savepoint goes on");
        // Its tasks acknowledge it after the newer checkpoint completed: it completes too.
        let meta = ack_all(&mut c, 2);
        assert_eq!(meta.kind, BarrierKind::Savepoint);
        let cmds = c.metadata_written(2, t0 + 22 * SEC).expect("written");
        assert_eq!(
            cmds,
            vec![Command::NotifyComplete(Barrier {
                checkpoint: 2,
                kind: BarrierKind::Savepoint
            })]
        );
        assert!(c.in_flight().is_empty());
        assert_eq!(c.last_completed(), Some(3), "the newest completion stays 3");
        // A late ack of the subsumed checkpoint still only deletes its files.
        assert_eq!(
            c.ack(1, SRC, state("src", 1)).expect("late ack"),
            vec![Command::Discard { checkpoint: 1 }]
        );
    }

    #[test]
    fn a_savepoint_being_written_when_a_newer_checkpoint_completes_is_not_doomed() {
        let t0 = Instant::now();
        let mut c = concurrent(2, t0);
        let sp = c
            .trigger_now(t0 + SEC, BarrierKind::Savepoint)
            .expect("savepoint triggered");
        assert_eq!(triggered(&c.poll(t0 + 10 * SEC)), vec![2]);
        ack_all(&mut c, sp.checkpoint);
        ack_all(&mut c, 2);
        let cmds = c.metadata_written(2, t0 + 11 * SEC).expect("written");
        assert!(aborted(&cmds).is_empty(), "{cmds:?}");
        let cmds = c
            .metadata_written(sp.checkpoint, t0 + 12 * SEC)
            .expect("written");
        assert_eq!(cmds, vec![Command::NotifyComplete(sp)]);
        assert_eq!(c.last_completed(), Some(2));
    }

    #[test]
    fn a_savepoint_outliving_a_newer_checkpoint_is_aborted_by_its_own_timeout() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(
            CoordinatorConfig {
                max_concurrent: 2,
                timeout: 30 * SEC,
                ..config()
            },
            plan(),
            t0,
        );
        let sp = c
            .trigger_now(t0 + 5 * SEC, BarrierKind::Savepoint)
            .expect("savepoint triggered");
        assert_eq!(triggered(&c.poll(t0 + 10 * SEC)), vec![2]);
        ack_all(&mut c, 2);
        let cmds = c.metadata_written(2, t0 + 11 * SEC).expect("written");
        assert!(aborted(&cmds).is_empty());
        // Only the source acknowledges the savepoint; it times out 30 s after its trigger.
        assert!(c.ack(1, SRC, state("src", 1)).expect("ack").is_empty());
        assert!(aborted(&c.poll(t0 + 34 * SEC)).is_empty(), "not due yet");
        let cmds = c.poll(t0 + 35 * SEC);
        assert_eq!(aborted(&cmds), vec![(sp.checkpoint, AbortReason::Timeout)]);
        assert!(
            matches!(&cmds[0], Command::Abort { barrier, .. } if *barrier == sp),
            "the abort names the savepoint: {cmds:?}"
        );
        assert_eq!(c.consecutive_failures(), 0, "a savepoint is no periodic failure");
        assert!(!c.in_flight().contains(&sp.checkpoint));
        // The sink's late acknowledgement has its files deleted; nothing else remains.
        assert_eq!(
            c.ack(1, SINK, state("map", 1)).expect("late ack"),
            vec![Command::Discard { checkpoint: 1 }]
        );
    }

    #[test]
    fn a_completed_stop_with_savepoint_ends_every_lower_one_savepoints_included() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(config(), plan(), t0);
        let sp = c
            .trigger_now(t0 + SEC, BarrierKind::Savepoint)
            .expect("savepoint");
        let stop = c
            .trigger_now(t0 + 2 * SEC, BarrierKind::SavepointThenStop)
            .expect("stop");
        ack_all(&mut c, stop.checkpoint);
        let cmds = c
            .metadata_written(stop.checkpoint, t0 + 3 * SEC)
            .expect("written");
        assert_eq!(
            aborted(&cmds),
            vec![(
                sp.checkpoint,
                AbortReason::Subsumed {
                    by: stop.checkpoint
                }
            )]
        );
        assert_eq!(cmds.last(), Some(&Command::NotifyComplete(stop)));
        assert!(c.in_flight().is_empty(), "nothing left in flight at the stop");
    }

    #[test]
    fn a_checkpoint_subsumed_twice_while_writing_is_aborted_once_after_its_write() {
        let t0 = Instant::now();
        let mut c = concurrent(3, t0);
        for at in [10, 20, 30] {
            let _ = c.poll(t0 + at * SEC);
        }
        ack_all(&mut c, 1);
        ack_all(&mut c, 2);
        ack_all(&mut c, 3);
        // 2 completes: 1 (still writing) is doomed, not aborted.
        let cmds = c.metadata_written(2, t0 + 31 * SEC).expect("written");
        assert!(aborted(&cmds).is_empty(), "{cmds:?}");
        // 3 completes: 1 is subsumed again, and still must not be aborted under its writer.
        let cmds = c.metadata_written(3, t0 + 32 * SEC).expect("written");
        assert!(aborted(&cmds).is_empty(), "{cmds:?}");
        assert_eq!(c.in_flight(), vec![1]);
        // Its write reports back: now it is aborted, once, with the first reason.
        let cmds = c
            .metadata_written(1, t0 + 33 * SEC)
            .expect("the write was requested");
        assert_eq!(aborted(&cmds), vec![(1, AbortReason::Subsumed { by: 2 })]);
        assert!(c.in_flight().is_empty());
        assert_eq!(c.last_completed(), Some(3));
    }

    #[test]
    fn a_restart_or_failover_while_writing_waits_for_the_write() {
        let t0 = Instant::now();
        let mut c = concurrent(2, t0);
        let _ = c.poll(t0 + 10 * SEC);
        let _ = c.poll(t0 + 20 * SEC);
        ack_all(&mut c, 1);
        // 2 is pending (no ack), 1 is writing: a restart aborts 2 at once, dooms 1.
        let cmds = c.restart(t0 + 21 * SEC, []);
        assert_eq!(aborted(&cmds), vec![(2, AbortReason::Cancelled)]);
        assert_eq!(c.in_flight(), vec![1]);
        // A failed write of the doomed one reports the cancellation, not a failure.
        let cmds = c.metadata_failed(1, "no space".into()).expect("requested");
        assert_eq!(aborted(&cmds), vec![(1, AbortReason::Cancelled)]);
        assert_eq!(c.consecutive_failures(), 0);

        // Failover while a write is in flight: doomed, aborted when the write succeeds.
        let _ = c.poll(t0 + 40 * SEC);
        ack_all(&mut c, 3);
        let _ = c.poll(t0 + 50 * SEC);
        let cmds = c.decline(4, SRC, DeclineReason::Failed("disk".into()));
        assert!(c.is_failed_over());
        assert_eq!(aborted(&cmds).len(), 1, "only 4: 3 is being written");
        assert_eq!(c.in_flight(), vec![3]);
        let cmds = c.metadata_written(3, t0 + 51 * SEC).expect("requested");
        assert_eq!(aborted(&cmds), vec![(3, AbortReason::Cancelled)]);
        assert_eq!(c.last_completed(), None);
    }

    #[test]
    fn a_late_acknowledgement_of_an_aborted_checkpoint_discards_its_files() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(
            CoordinatorConfig {
                timeout: 5 * SEC,
                tolerable_failures: 9,
                ..config()
            },
            plan(),
            t0,
        );
        let _ = c.poll(t0 + 10 * SEC);
        assert!(c.ack(1, SRC, state("src", 1)).expect("ack").is_empty());
        assert_eq!(aborted(&c.poll(t0 + 15 * SEC)).len(), 1, "timed out");
        // The sink's snapshot was still being written when the abort deleted `chk-1/`.
        let cmds = c.ack(1, SINK, state("map", 1)).expect("late ack");
        assert_eq!(cmds, vec![Command::Discard { checkpoint: 1 }]);
        // Likewise a late decline (a failed write may have left part of its files).
        let cmds = c.decline(1, SINK, DeclineReason::Failed("x".into()));
        assert_eq!(cmds, vec![Command::Discard { checkpoint: 1 }]);
        // A completed checkpoint is never discarded.
        let _ = c.poll(t0 + 20 * SEC);
        ack_all(&mut c, 2);
        let _ = c.metadata_written(2, t0 + 21 * SEC).expect("written");
        assert!(c.decline(2, SINK, DeclineReason::Subsumed).is_empty());
    }

    /// A small deterministic generator for the interleaving test.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Random interleavings of triggers (periodic and by hand, savepoints too), acks,
    /// declines, metadata writes reporting back in any order, timeouts, finished tasks and
    /// restarts. Whatever the order: a write the coordinator asked for is always accepted
    /// when it reports back; no abort is ever issued while a checkpoint's write is in
    /// flight; every checkpoint ends exactly once (completed or aborted); completed ids only
    /// grow, and nothing stays in flight once every write reported back and every task
    /// answered.
    #[test]
    fn random_interleavings_keep_the_bookkeeping_consistent() {
        for seed in 1..=200_u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let t0 = Instant::now();
            let mut c = Coordinator::new(
                CoordinatorConfig {
                    max_concurrent: 1 + rng.below(3) as u32,
                    timeout: 30 * SEC,
                    tolerable_failures: 2,
                    ..config()
                },
                plan(),
                t0,
            );
            let mut now = t0;
            // Checkpoint -> tasks that still owe an answer.
            let mut owed: BTreeMap<CheckpointId, Vec<TaskId>> = BTreeMap::new();
            let mut writing: BTreeSet<CheckpointId> = BTreeSet::new();
            let mut ended: BTreeMap<CheckpointId, &'static str> = BTreeMap::new();
            let mut completed: Vec<CheckpointId> = Vec::new();
            let mut handle = |cmds: Vec<Command>,
                              owed: &mut BTreeMap<CheckpointId, Vec<TaskId>>,
                              writing: &mut BTreeSet<CheckpointId>| {
                for cmd in cmds {
                    match cmd {
                        Command::Trigger(b) => {
                            owed.insert(b.checkpoint, vec![SRC, SINK]);
                        }
                        Command::WriteMetadata(m) => {
                            assert!(writing.insert(m.checkpoint), "seed {seed}: written twice");
                        }
                        Command::NotifyComplete(b) => {
                            let id = b.checkpoint;
                            assert!(
                                !writing.contains(&id),
                                "seed {seed}: {id} completes while written"
                            );
                            assert!(
                                ended.insert(id, "completed").is_none(),
                                "seed {seed}: {id} ended twice"
                            );
                            // A checkpoint completes above every earlier completion; a
                            // savepoint is never subsumed, so it may complete below one.
                            if b.kind == BarrierKind::Checkpoint {
                                assert!(
                                    completed.iter().all(|&l| l < id),
                                    "seed {seed}: completions out of order"
                                );
                            }
                            completed.push(id);
                        }
                        Command::Abort { barrier, reason } => {
                            let id = barrier.checkpoint;
                            assert!(
                                barrier.kind == BarrierKind::Checkpoint
                                    || !matches!(reason, AbortReason::Subsumed { .. }),
                                "seed {seed}: savepoint {id} subsumed"
                            );
                            assert!(
                                !writing.contains(&id),
                                "seed {seed}: {id} aborted while its write is in flight"
                            );
                            assert!(
                                ended.insert(id, "aborted").is_none(),
                                "seed {seed}: {id} ended twice"
                            );
                        }
                        Command::Discard { checkpoint } => {
                            assert_eq!(
                                ended.get(&checkpoint),
                                Some(&"aborted"),
                                "seed {seed}: discarded {checkpoint}"
                            );
                        }
                        Command::Failover { .. } => {}
                    }
                }
            };
            for _ in 0..300 {
                now += Duration::from_millis(100 * (1 + rng.below(40)));
                match rng.below(10) {
                    0 => {
                        let cmds = c.poll(now);
                        handle(cmds, &mut owed, &mut writing);
                    }
                    1 => {
                        let kind = if rng.below(2) == 0 {
                            BarrierKind::Checkpoint
                        } else {
                            BarrierKind::Savepoint
                        };
                        if let Ok(b) = c.trigger_now(now, kind) {
                            handle(vec![Command::Trigger(b)], &mut owed, &mut writing);
                        }
                    }
                    2..=4 => {
                        // Some task answers some checkpoint, possibly long aborted.
                        let Some((&id, tasks)) = owed.iter_mut().nth(rng.below(8) as usize) else {
                            continue;
                        };
                        let task = tasks.remove(rng.below(tasks.len() as u64) as usize);
                        if tasks.is_empty() {
                            owed.remove(&id);
                        }
                        let op = if task == SRC { "src" } else { "map" };
                        let cmds = if rng.below(8) == 0 {
                            c.decline(id, task, DeclineReason::Failed("x".into()))
                        } else {
                            c.ack(id, task, state(op, id)).expect("a valid ack")
                        };
                        handle(cmds, &mut owed, &mut writing);
                    }
                    5..=7 => {
                        // Some write reports back, in any order.
                        let Some(&id) = writing.iter().nth(rng.below(4) as usize) else {
                            continue;
                        };
                        writing.remove(&id);
                        let cmds = if rng.below(6) == 0 {
                            c.metadata_failed(id, "disk".into())
                        } else {
                            c.metadata_written(id, now)
                        };
                        let cmds = cmds.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                        handle(cmds, &mut owed, &mut writing);
                    }
                    8 => {
                        let cmds = c.restart(now, []);
                        handle(cmds, &mut owed, &mut writing);
                    }
                    _ => {}
                }
            }
            // Settle: every task answers what it owes, every write reports back.
            while !owed.is_empty() || !writing.is_empty() {
                while let Some((id, tasks)) = owed.pop_first() {
                    for task in tasks {
                        let op = if task == SRC { "src" } else { "map" };
                        let cmds = c.ack(id, task, state(op, id)).expect("a valid ack");
                        handle(cmds, &mut owed, &mut writing);
                    }
                }
                while let Some(id) = writing.pop_first() {
                    let cmds = c
                        .metadata_written(id, now)
                        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                    handle(cmds, &mut owed, &mut writing);
                }
            }
            assert!(
                c.in_flight().is_empty(),
                "seed {seed}: {:?} still in flight with nothing owed",
                c.in_flight()
            );
            assert_eq!(
                c.last_completed(),
                completed.iter().max().copied(),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn timeouts_and_declines_count_against_tolerable_failures() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(
            CoordinatorConfig {
                tolerable_failures: 1,
                timeout: 5 * SEC,
                ..config()
            },
            plan(),
            t0,
        );
        assert_eq!(triggered(&c.poll(t0 + 10 * SEC)), vec![1]);
        let cmds = c.poll(t0 + 15 * SEC);
        assert_eq!(aborted(&cmds), vec![(1, AbortReason::Timeout)]);
        assert_eq!(c.consecutive_failures(), 1);
        assert!(!c.is_failed_over());
        assert_eq!(triggered(&c.poll(t0 + 20 * SEC)), vec![2]);
        // A subsumed decline does not count.
        let cmds = c.decline(2, SINK, DeclineReason::Subsumed);
        assert_eq!(aborted(&cmds).len(), 1);
        assert_eq!(c.consecutive_failures(), 1);
        assert_eq!(triggered(&c.poll(t0 + 30 * SEC)), vec![3]);
        let cmds = c.decline(3, SINK, DeclineReason::Failed("disk full".into()));
        assert_eq!(
            cmds.last(),
            Some(&Command::Failover {
                consecutive_failures: 2,
                last: AbortReason::Declined {
                    task: SINK,
                    reason: DeclineReason::Failed("disk full".into())
                }
            })
        );
        assert!(c.is_failed_over());
        assert!(c.poll(t0 + 100 * SEC).is_empty(), "idle after failover");
        assert!(c.trigger_now(t0, BarrierKind::Savepoint).is_err());

        // After the restart, ids keep increasing and the count starts over.
        assert!(c.restart(t0 + 100 * SEC, []).is_empty());
        assert_eq!(c.consecutive_failures(), 0);
        assert_eq!(triggered(&c.poll(t0 + 110 * SEC)), vec![4]);
    }

    #[test]
    fn a_completion_resets_the_failure_count() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(
            CoordinatorConfig {
                tolerable_failures: 1,
                ..config()
            },
            plan(),
            t0,
        );
        let _ = c.poll(t0 + 10 * SEC);
        let _ = c.decline(1, SRC, DeclineReason::Failed("x".into()));
        assert_eq!(c.consecutive_failures(), 1);
        let _ = c.poll(t0 + 20 * SEC);
        ack_all(&mut c, 2);
        let _ = c.metadata_written(2, t0 + 21 * SEC).expect("written");
        assert_eq!(c.consecutive_failures(), 0);
        let _ = c.poll(t0 + 31 * SEC);
        let cmds = c.metadata_failed(3, "x".into());
        assert!(cmds.is_err(), "no write was requested for 3");
        ack_all(&mut c, 3);
        let cmds = c.metadata_failed(3, "no space".into()).expect("reported");
        assert_eq!(
            aborted(&cmds),
            vec![(3, AbortReason::MetadataWriteFailed("no space".into()))]
        );
        assert!(!c.is_failed_over(), "one failure is tolerated");
    }

    #[test]
    fn savepoints_are_triggered_on_demand_and_do_not_count_as_failures() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(
            CoordinatorConfig {
                periodic: false,
                timeout: 5 * SEC,
                ..config()
            },
            plan(),
            t0,
        );
        assert!(
            c.poll(t0 + 100 * SEC).is_empty(),
            "periodic checkpoints off"
        );
        let sp = c
            .trigger_now(t0 + 100 * SEC, BarrierKind::Savepoint)
            .expect("sp");
        assert_eq!(sp.checkpoint, 1);
        let cmds = c.poll(t0 + 106 * SEC);
        assert_eq!(aborted(&cmds), vec![(1, AbortReason::Timeout)]);
        assert_eq!(c.consecutive_failures(), 0);
        assert!(!c.is_failed_over());

        let stop = c
            .trigger_now(t0 + 110 * SEC, BarrierKind::SavepointThenStop)
            .expect("stop");
        assert!(
            c.trigger_now(t0 + 110 * SEC, BarrierKind::Savepoint)
                .is_err()
        );
        let meta = ack_all(&mut c, stop.checkpoint);
        assert_eq!(meta.kind, BarrierKind::SavepointThenStop);
        let cmds = c
            .metadata_written(stop.checkpoint, t0 + 111 * SEC)
            .expect("ok");
        assert_eq!(cmds, vec![Command::NotifyComplete(stop)]);
    }

    #[test]
    fn stop_with_savepoint_suspends_periodic_checkpoints() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(config(), plan(), t0);
        let stop = c
            .trigger_now(t0, BarrierKind::SavepointThenStop)
            .expect("stop");
        assert!(triggered(&c.poll(t0 + 50 * SEC)).is_empty());
        // It fails: periodic checkpoints resume.
        let _ = c.decline(stop.checkpoint, SRC, DeclineReason::Failed("x".into()));
        assert_eq!(c.consecutive_failures(), 0);
        assert_eq!(triggered(&c.poll(t0 + 50 * SEC)), vec![2]);
    }

    #[test]
    fn finished_tasks_are_not_awaited_and_are_recorded() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(config(), plan(), t0).resume_after(41);
        let _ = c.poll(t0 + 10 * SEC);
        assert_eq!(c.in_flight(), vec![42]);
        assert!(c.ack(42, SINK, state("map", 42)).expect("ack").is_empty());
        let cmds = c.task_finished(SRC);
        let Some(Command::WriteMetadata(meta)) = cmds.first() else {
            panic!("expected WriteMetadata, got {cmds:?}");
        };
        assert_eq!(meta.finished_tasks, vec![SRC]);
        assert!(c.metadata_written(42, t0 + 11 * SEC).is_ok());
        // Everything finished: nothing more to trigger.
        let _ = c.task_finished(SINK);
        assert!(c.poll(t0 + 100 * SEC).is_empty());
        assert_eq!(c.next_wakeup(), None);
    }

    #[test]
    fn protocol_violations_are_errors() {
        let t0 = Instant::now();
        let mut c = Coordinator::new(config(), plan(), t0);
        let _ = c.poll(t0 + 10 * SEC);
        assert!(c.ack(1, TaskId::new(7, 0), vec![]).is_err(), "unknown task");
        assert!(
            c.ack(1, SRC, state("map", 1)).is_err(),
            "operator of another task"
        );
        assert!(c.ack(1, SRC, state("src", 1)).expect("ack").is_empty());
        assert!(c.ack(1, SRC, state("src", 1)).is_err(), "duplicate ack");
        assert!(c.metadata_written(1, t0).is_err(), "not acknowledged yet");
    }

    #[test]
    fn checkpoint_plan_from_a_compiled_pipeline() {
        let yaml = r#"
version: 1
pipelines:
  - id: p
    parallelism: 2
    checkpoints:
      interval: 1s
    sources:
      - id: gen
        type: generator
        parallelism: 1
        fields:
          v: { kind: int, min: 1, max: 9 }
    operators:
      - id: double
        type: map
        input: gen
        script: "fn map(r) { r }"
    sinks:
      - id: out
        type: stdout
        input: double
"#;
        let loaded = weir_schema::load_str("p.yaml", yaml);
        let spec = loaded.spec.expect("valid YAML");
        let plan =
            crate::plan::compile(&spec.pipelines[0], std::path::Path::new(".")).expect("compiles");
        let cp = CheckpointPlan::from_plan(&plan);
        assert_eq!(cp.pipeline, "p");
        assert_eq!(cp.config_hash.len(), 16);
        assert_eq!(cp.operators.len(), 3);
        let expected: usize = plan.chains.iter().map(|c| c.parallelism as usize).sum();
        assert_eq!(cp.tasks.len(), expected);
        let config = CoordinatorConfig::from_spec(&spec.pipelines[0].checkpoints);
        assert!(config.periodic);
        assert_eq!(config.interval, SEC);
    }
}
