//! The supervisor of one pipeline: builds and spawns its tasks, drives its checkpoint
//! coordinator (triggers, acknowledgements, metadata writes, completion notices, retention),
//! and handles task failures with the pipeline's restart and failover strategies.
//!
//! One async loop owns everything here, so there is no lock: task results, task events
//! (acks, declines), metadata-write results and timers all arrive at one `select!`. The
//! protocol decisions are the coordinator's and the strategies' (pure logic elsewhere); this
//! module only carries them out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::task::{AbortHandle, JoinSet};
use weir_schema::{FailoverSpec, StateSpec};

use super::wiring::{Channels, Topology};
use crate::checkpoint::coordinator::DeclineReason;
use crate::checkpoint::metadata::checkpoint_dir;
use crate::checkpoint::retention::{CheckpointFiles, orphaned_shared};
use crate::checkpoint::storage::{
    Verification, delete_checkpoint, latest_valid, read_metadata, write_metadata,
};
use crate::checkpoint::{
    AlignmentMode, CheckpointId, CheckpointMetadata, CheckpointPlan, CheckpointStore, Command,
    Coordinator, CoordinatorConfig, LocalStore, MemoryStore, TaskId, plan_retention,
};
use crate::connectors::SourceContext;
use crate::operators::registry::{self, BuildContext, NodeBuilder};
use crate::operators::union::UnionOperator;
use crate::operators::{ErrorPolicy, Operator, OperatorContext};
use crate::plan::{NodeKind, PipelinePlan};
use crate::record::KeyGroupRange;
use crate::recovery::failover::{FailoverAction, RestartFrom, all_tasks, failover_scope};
use crate::recovery::restart::{Decision, Failure, RestartStrategy};
use crate::runtime::error::{Result, RunError};
use crate::runtime::exchange::{Output, Target};
use crate::runtime::input::InputLease;
use crate::runtime::task::{
    ChainNode, ChainTask, Checkpointing, Control, Fault, TaskCommand, TaskEnv, TaskEvent,
    TaskRestore, run_chain, run_source,
};
use crate::runtime::{BarrierKind, Message, NodeReport};
use crate::state::{MemoryBackend, StateBackend};

/// Where a run starts from.
#[derive(Clone, Debug, Default)]
pub struct RecoveryOptions {
    /// Ignore (and delete) existing checkpoints and start from the beginning.
    pub fresh: bool,
    /// Restore from this checkpoint directory (`.../<pipeline>/chk-<n>`) instead of the
    /// latest valid one.
    pub from_checkpoint: Option<PathBuf>,
}

/// Figures of one completed checkpoint.
#[derive(Clone, Debug)]
pub struct CheckpointStats {
    /// Its id.
    pub checkpoint: CheckpointId,
    /// From trigger to completion.
    pub duration: Duration,
    /// Bytes of every file it references.
    pub size: u64,
    /// Bytes of the files the previous completed checkpoint did not reference (what this one
    /// wrote; for incremental RocksDB much less than `size`).
    pub new_bytes: u64,
}

/// How a pipeline ended.
pub(super) struct Ended {
    pub stats: Vec<CheckpointStats>,
    pub error: Option<RunError>,
    pub restarts: u32,
    pub checkpoints: u64,
    pub restored_from: Option<CheckpointId>,
    pub degraded: Vec<TaskId>,
}

/// Marker written when a pipeline with durable checkpoints ran to the end: the next run
/// starts fresh instead of resuming.
const FINISHED_MARKER: &str = "_finished";

struct CheckpointSetup {
    store: Arc<dyn CheckpointStore>,
    durable: bool,
    mode: AlignmentMode,
    retain: u32,
    /// Completed checkpoints still retained, oldest first.
    completed: Vec<CheckpointFiles>,
    /// Metadata of checkpoints whose write is in flight or done, until retention.
    metadata: BTreeMap<CheckpointId, CheckpointMetadata>,
    /// The latest completed checkpoint (restored or taken) and the store holding it.
    latest: Option<TaskRestore>,
}

enum Internal {
    MetadataWritten(CheckpointId, std::result::Result<(), String>),
}

struct Running {
    abort: AbortHandle,
    commands: UnboundedSender<TaskCommand>,
    attempt: u64,
}

struct PendingRestart {
    at: Instant,
    tasks: BTreeSet<TaskId>,
    from: RestartFrom,
}

/// Supervises one pipeline until it finishes, is stopped, or its restart strategy gives up.
pub(super) async fn supervise(
    plan: PipelinePlan,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    recovery: RecoveryOptions,
    faults: Vec<(String, Arc<Fault>)>,
    workers: tokio::runtime::Handle,
) -> Ended {
    let mut ended = Ended {
        error: None,
        restarts: 0,
        checkpoints: 0,
        restored_from: None,
        degraded: Vec::new(),
        stats: Vec::new(),
    };
    let mut sup = match Supervisor::new(plan, reports, control, &recovery, workers) {
        Ok(mut s) => {
            s.faults = faults.into_iter().collect();
            s
        }
        Err(e) => {
            ended.error = Some(e);
            return ended;
        }
    };
    ended.restored_from = sup.restored_from;
    let error = sup.run().await.err();
    ended.error = error;
    ended.restarts = sup.restarts;
    ended.checkpoints = sup.completed_count;
    ended.degraded = sup.degraded.iter().copied().collect();
    ended.stats = std::mem::take(&mut sup.stats);
    ended
}

struct Supervisor {
    plan: Arc<PipelinePlan>,
    builders: Arc<Vec<NodeBuilder>>,
    topology: Topology,
    channels: Channels,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    ck: Option<CheckpointSetup>,
    coordinator: Option<Coordinator>,
    restart: RestartStrategy,
    failover: FailoverSpec,
    all: BTreeSet<TaskId>,
    running: HashMap<TaskId, Running>,
    attempts: HashMap<tokio::task::Id, (TaskId, u64)>,
    join: JoinSet<Result<()>>,
    next_attempt: u64,
    finished: BTreeSet<TaskId>,
    degraded: BTreeSet<TaskId>,
    pending_restart: Option<PendingRestart>,
    events_tx: UnboundedSender<TaskEvent>,
    events_rx: UnboundedReceiver<TaskEvent>,
    internal_tx: UnboundedSender<Internal>,
    internal_rx: UnboundedReceiver<Internal>,
    restarts: u32,
    completed_count: u64,
    restored_from: Option<CheckpointId>,
    /// The first restore of the run.
    initial_restore: Option<TaskRestore>,
    /// Tasks aborted for a restart whose end has not been observed yet.
    aborting: BTreeSet<tokio::task::Id>,
    /// When each checkpoint in flight was triggered.
    triggered: BTreeMap<CheckpointId, Instant>,
    /// Statistics of completed checkpoints.
    stats: Vec<CheckpointStats>,
    /// Faults to inject, by operator id.
    faults: HashMap<String, Arc<Fault>>,
    /// The runtime tasks run on (the supervisor itself runs on the control thread).
    workers: tokio::runtime::Handle,
    /// The final checkpoint of a requested stop, once triggered.
    stopping: Option<CheckpointId>,
    /// When a stop stops waiting for its final checkpoint.
    stop_deadline: Option<Instant>,
}

fn build_error(plan: &PipelinePlan, message: impl Into<String>) -> RunError {
    RunError::Build {
        pipeline: plan.id.clone(),
        element: "checkpoints".into(),
        message: message.into(),
    }
}

impl Supervisor {
    fn new(
        plan: PipelinePlan,
        reports: Arc<Vec<NodeReport>>,
        control: Arc<Control>,
        recovery: &RecoveryOptions,
        workers: tokio::runtime::Handle,
    ) -> Result<Self> {
        let engine = Arc::new(crate::script::runtime::runtime_engine(&plan.spec.limits));
        let builders: Vec<NodeBuilder> = {
            let bctx = BuildContext {
                plan: &plan,
                engine,
            };
            plan.nodes
                .iter()
                .map(|n| registry::build(n, &bctx))
                .collect::<Result<_>>()?
        };
        let topology = Topology::of(&plan);
        clear_local_state(&plan);
        let all: BTreeSet<TaskId> = all_tasks(&plan).into_iter().collect();
        let mut ck = setup_checkpoints(&plan)?;
        let mut restored: Option<TaskRestore> = None;
        let mut last_used: CheckpointId = 0;
        if let Some(ck) = ck.as_mut() {
            let (from, last) = choose_restore(&plan, ck, recovery)?;
            restored = from;
            last_used = last;
            ck.latest = restored.clone();
        }
        let coordinator = ck.as_ref().map(|_| {
            let mut c = Coordinator::new(
                CoordinatorConfig::from_spec(&plan.spec.checkpoints),
                CheckpointPlan::from_plan(&plan),
                Instant::now(),
            )
            .resume_after(last_used);
            if let Some(r) = &restored {
                c = c.with_finished(r.metadata.finished_tasks.iter().copied());
            }
            c
        });
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        Ok(Self {
            restart: RestartStrategy::from_spec(&plan.spec.effective_restart()),
            failover: plan.spec.failover,
            builders: Arc::new(builders),
            channels: Channels::default(),
            topology,
            reports,
            control,
            ck,
            coordinator,
            all,
            running: HashMap::new(),
            attempts: HashMap::new(),
            join: JoinSet::new(),
            next_attempt: 0,
            finished: BTreeSet::new(),
            degraded: BTreeSet::new(),
            pending_restart: None,
            events_tx,
            events_rx,
            internal_tx,
            internal_rx,
            restarts: 0,
            completed_count: 0,
            restored_from: restored.as_ref().map(|r| r.metadata.checkpoint),
            initial_restore: restored,
            aborting: BTreeSet::new(),
            triggered: BTreeMap::new(),
            stats: Vec::new(),
            faults: HashMap::new(),
            workers,
            stopping: None,
            stop_deadline: None,
            plan: Arc::new(plan),
        })
    }

    async fn run(&mut self) -> Result<()> {
        let all = self.all.clone();
        let restore = self.initial_restore.clone();
        self.channels.renew(&self.topology, &all);
        for task in &all {
            self.spawn(*task, restore.clone())?;
        }
        tracing::info!(
            pipeline = %self.plan.id,
            tasks = all.len(),
            restored_from = ?self.restored_from,
            "Pipeline started."
        );
        loop {
            if self.pending_restart.is_none()
                && self.running.is_empty()
                && self
                    .all
                    .iter()
                    .all(|t| self.finished.contains(t) || self.degraded.contains(t))
            {
                break;
            }
            let wake = [
                self.coordinator.as_ref().and_then(Coordinator::next_wakeup),
                self.pending_restart
                    .as_ref()
                    .filter(|_| self.aborting.is_empty())
                    .map(|p| p.at),
                self.stop_deadline,
            ]
            .into_iter()
            .flatten()
            .min();
            tokio::select! {
                biased;
                Some(event) = self.events_rx.recv() => self.on_task_event(event),
                Some(internal) = self.internal_rx.recv() => self.on_internal(internal),
                () = self.control.stop_requested.notified(), if self.stopping.is_none() && self.coordinator.is_some() => {
                    self.begin_stop();
                }
                Some(joined) = self.join.join_next_with_id(), if !self.join.is_empty() => {
                    let (id, result) = match joined {
                        Ok((id, r)) => (id, r),
                        Err(e) if e.is_cancelled() => {
                            self.attempts.remove(&e.id());
                            self.aborting.remove(&e.id());
                            continue;
                        }
                        Err(e) => {
                            let id = e.id();
                            (id, Err(RunError::Internal(format!("task panicked: {}", panic_message(e)))))
                        }
                    };
                    self.aborting.remove(&id);
                    let Some((task, attempt)) = self.attempts.remove(&id) else { continue };
                    if self.running.get(&task).is_none_or(|r| r.attempt != attempt) {
                        continue;
                    }
                    self.running.remove(&task);
                    match result {
                        Ok(()) => self.on_task_finished(task),
                        Err(e) => self.on_task_failed(Some(task), e)?,
                    }
                }
                () = sleep_until(wake) => {
                    if self.stop_deadline.is_some_and(|d| d <= Instant::now()) {
                        self.stop_deadline = None;
                        tracing::warn!(pipeline = %self.plan.id, "The final checkpoint is taking too long; stopping without it (the next run resumes from the last completed one).");
                        for r in self.running.values() {
                            let _ = r.commands.send(TaskCommand::Stop);
                        }
                    }
                    if let Some(c) = self.coordinator.as_mut() {
                        let cmds = c.poll(Instant::now());
                        self.execute(cmds)?;
                    }
                }
            }
            if self.aborting.is_empty()
                && self
                    .pending_restart
                    .as_ref()
                    .is_some_and(|p| p.at <= Instant::now())
                && let Some(p) = self.pending_restart.take()
            {
                self.do_restart(p)?;
            }
        }
        // Let the last metadata writes and retention settle before reporting the end.
        self.drain_internal().await;
        if let Some(ck) = &self.ck
            && ck.durable
            && !self.control.stop.load(std::sync::atomic::Ordering::Relaxed)
            && self.degraded.is_empty()
            && let Err(e) = ck.store.put(FINISHED_MARKER, b"finished\n")
        {
            tracing::warn!(pipeline = %self.plan.id, error = %e, "Cannot mark the run finished; the next run will resume from the last checkpoint.");
        }
        Ok(())
    }

    async fn drain_internal(&mut self) {
        // Metadata writes issued before the end complete quickly; wait a little for them.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self
            .coordinator
            .as_ref()
            .is_some_and(|c| !c.in_flight().is_empty())
            && Instant::now() < deadline
        {
            tokio::select! {
                Some(internal) = self.internal_rx.recv() => self.on_internal(internal),
                Some(event) = self.events_rx.recv() => self.on_task_event(event),
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    // Nothing more will be acknowledged: every task ended.
                    break;
                }
            }
        }
    }

    fn on_task_event(&mut self, event: TaskEvent) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let cmds = match event {
            TaskEvent::Ack {
                task,
                checkpoint,
                states,
            } => match c.ack(checkpoint, task, states) {
                Ok(cmds) => cmds,
                Err(e) => {
                    tracing::warn!(pipeline = %self.plan.id, %task, checkpoint, error = %e, "Acknowledgement refused.");
                    Vec::new()
                }
            },
            TaskEvent::Decline {
                task,
                checkpoint,
                error,
            } => {
                let reason = match error {
                    None => DeclineReason::Subsumed,
                    Some(e) => DeclineReason::Failed(e),
                };
                c.decline(checkpoint, task, reason)
            }
        };
        if let Err(e) = self.execute(cmds) {
            tracing::error!(pipeline = %self.plan.id, error = %e, "Checkpoint command failed.");
        }
    }

    fn on_internal(&mut self, internal: Internal) {
        let Internal::MetadataWritten(id, result) = internal;
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let cmds = match result {
            Ok(()) => c.metadata_written(id, Instant::now()),
            Err(e) => c.metadata_failed(id, e),
        };
        match cmds {
            Ok(cmds) => {
                if let Err(e) = self.execute(cmds) {
                    tracing::error!(pipeline = %self.plan.id, error = %e, "Checkpoint command failed.");
                }
            }
            Err(e) => tracing::warn!(pipeline = %self.plan.id, error = %e, "Checkpoint protocol."),
        }
    }

    fn on_task_finished(&mut self, task: TaskId) {
        self.finished.insert(task);
        if let Some(c) = self.coordinator.as_mut() {
            let cmds = c.task_finished(task);
            if let Err(e) = self.execute(cmds) {
                tracing::error!(pipeline = %self.plan.id, error = %e, "Checkpoint command failed.");
            }
        }
    }

    /// Carries out the coordinator's commands.
    fn execute(&mut self, cmds: Vec<Command>) -> Result<()> {
        for cmd in cmds {
            match cmd {
                Command::Trigger(barrier) => {
                    self.triggered.insert(barrier.checkpoint, Instant::now());
                    for (task, r) in &self.running {
                        if self.topology.sources.contains(task) {
                            let _ = r.commands.send(TaskCommand::Trigger(barrier));
                        }
                    }
                }
                Command::WriteMetadata(meta) => {
                    let Some(ck) = self.ck.as_mut() else { continue };
                    let id = meta.checkpoint;
                    ck.metadata.insert(id, (*meta).clone());
                    let store = Arc::clone(&ck.store);
                    let tx = self.internal_tx.clone();
                    tokio::task::spawn_blocking(move || {
                        let r = write_metadata(&*store, &meta).map_err(|e| e.to_string());
                        let _ = tx.send(Internal::MetadataWritten(id, r));
                    });
                }
                Command::NotifyComplete(barrier) => {
                    let id = barrier.checkpoint;
                    self.completed_count += 1;
                    for r in self.running.values() {
                        let _ = r.commands.send(TaskCommand::Complete(id));
                    }
                    if self.stopping == Some(id) {
                        self.stop_deadline = None;
                        tracing::info!(pipeline = %self.plan.id, checkpoint = id, "Final checkpoint complete; stopping (the next run resumes from it).");
                        for r in self.running.values() {
                            let _ = r.commands.send(TaskCommand::Stop);
                        }
                    }
                    let Some(ck) = self.ck.as_mut() else { continue };
                    let Some(meta) = ck.metadata.remove(&id) else {
                        continue;
                    };
                    ck.metadata.retain(|&k, _| k > id);
                    let started = self.triggered.remove(&id);
                    self.triggered.retain(|&k, _| k > id);
                    let previous: BTreeSet<&str> = ck
                        .latest
                        .as_ref()
                        .map(|l| l.metadata.files().map(|f| f.path.as_str()).collect())
                        .unwrap_or_default();
                    let size: u64 = meta.files().map(|f| f.size).sum();
                    let new_bytes: u64 = meta
                        .files()
                        .filter(|f| !previous.contains(f.path.as_str()))
                        .map(|f| f.size)
                        .sum();
                    let stats = CheckpointStats {
                        checkpoint: id,
                        duration: started.map(|t| t.elapsed()).unwrap_or_default(),
                        size,
                        new_bytes,
                    };
                    tracing::info!(
                        pipeline = %self.plan.id,
                        checkpoint = id,
                        duration_ms = stats.duration.as_millis() as u64,
                        size_bytes = size,
                        new_bytes,
                        "Checkpoint statistics."
                    );
                    self.stats.push(stats);
                    ck.completed.push(CheckpointFiles::from_metadata(&meta));
                    ck.latest = Some(TaskRestore {
                        store: Arc::clone(&ck.store),
                        metadata: Arc::new(meta),
                        savepoint: false,
                    });
                    let retention = plan_retention(&ck.completed, ck.retain);
                    ck.completed
                        .retain(|c| retention.retained.contains(&c.checkpoint));
                    if !retention.is_empty() {
                        let store = Arc::clone(&ck.store);
                        let pipeline = self.plan.id.clone();
                        tokio::task::spawn_blocking(move || {
                            if let Err(e) = retention.execute(&*store) {
                                tracing::warn!(%pipeline, error = %e, "Deleting old checkpoints failed; they will be retried at the next start.");
                            }
                        });
                    }
                }
                Command::Abort { barrier, reason } => {
                    if self.stopping == Some(barrier.checkpoint) {
                        tracing::warn!(pipeline = %self.plan.id, %reason, "The final checkpoint failed; stopping anyway (the next run resumes from the last completed one).");
                        for r in self.running.values() {
                            let _ = r.commands.send(TaskCommand::Stop);
                        }
                    }
                    let Some(ck) = self.ck.as_mut() else { continue };
                    ck.metadata.remove(&barrier.checkpoint);
                    let store = Arc::clone(&ck.store);
                    tokio::task::spawn_blocking(move || {
                        let _ = delete_checkpoint(&*store, barrier.checkpoint);
                    });
                }
                Command::Failover {
                    consecutive_failures,
                    last,
                } => {
                    let e = RunError::Checkpoint(crate::checkpoint::CheckpointError::Protocol(
                        format!(
                            "{consecutive_failures} checkpoints failed in a row (tolerable_failures: {}); last: {last}",
                            self.plan.spec.checkpoints.tolerable_failures
                        ),
                    ));
                    self.on_task_failed(None, e)?;
                }
            }
        }
        Ok(())
    }

    /// Handles a failure of `task` (`None`: of the whole pipeline, e.g. too many failed
    /// checkpoints): ask the restart strategy, then the failover strategy.
    fn on_task_failed(&mut self, task: Option<TaskId>, error: RunError) -> Result<()> {
        let node = task.map_or_else(|| "pipeline".to_owned(), |t| self.task_name(t));
        tracing::error!(pipeline = %self.plan.id, task = %node, error = %error, "Task failed.");
        if self.control.stop.load(std::sync::atomic::Ordering::Relaxed) {
            // Stopping: no restart, the failure stands.
            self.abort_all();
            self.pending_restart = None;
            return Err(error);
        }
        let decision = self
            .restart
            .on_failure(Instant::now(), &Failure::from(&error));
        let (delay, attempt) = match decision {
            Decision::GiveUp { reason } => {
                tracing::error!(pipeline = %self.plan.id, %reason, "Not restarting.");
                self.abort_all();
                return Err(RunError::GaveUp {
                    reason,
                    cause: Box::new(error),
                });
            }
            Decision::Restart { delay, attempt } => (delay, attempt),
        };
        let action = match task {
            Some(task) => failover_scope(&self.plan, self.failover, task)
                .map_err(|e| RunError::Internal(e.to_string()))?,
            None => FailoverAction::Restart {
                tasks: self.all.iter().copied().collect(),
                from: RestartFrom::LatestCheckpoint,
            },
        };
        match action {
            FailoverAction::Degrade { down } => {
                tracing::warn!(pipeline = %self.plan.id, task = %self.task_name(down), "Failover `noop`: the task stays down; the pipeline runs degraded.");
                self.degraded.insert(down);
                self.spawn_drainer(down);
                if let Some(c) = self.coordinator.as_mut() {
                    let cmds = c.task_finished(down);
                    self.execute(cmds)?;
                }
            }
            FailoverAction::Restart { tasks, from } => {
                let mut scope: BTreeSet<TaskId> = tasks.into_iter().collect();
                if let Some(p) = self.pending_restart.take() {
                    scope.extend(p.tasks);
                }
                for t in &scope {
                    if let Some(r) = self.running.remove(t) {
                        r.abort.abort();
                        self.aborting.insert(r.abort.id());
                    }
                    self.finished.remove(t);
                }
                self.restarts += 1;
                tracing::warn!(
                    pipeline = %self.plan.id,
                    cause = %error,
                    attempt,
                    delay_ms = delay.as_millis() as u64,
                    tasks = scope.len(),
                    strategy = self.restart.name(),
                    failover = ?self.failover,
                    "Restarting after a failure."
                );
                self.pending_restart = Some(PendingRestart {
                    at: Instant::now() + delay,
                    tasks: scope,
                    from,
                });
            }
        }
        Ok(())
    }

    fn do_restart(&mut self, p: PendingRestart) -> Result<()> {
        let restore = self.ck.as_ref().and_then(|ck| ck.latest.clone());
        let finished_in_restore: BTreeSet<TaskId> = restore
            .as_ref()
            .map(|r| r.metadata.finished_tasks.iter().copied().collect())
            .unwrap_or_default();
        if let Some(c) = self.coordinator.as_mut() {
            let mut finished: BTreeSet<TaskId> = self
                .finished
                .iter()
                .chain(self.degraded.iter())
                .copied()
                .collect();
            finished.extend(p.tasks.intersection(&finished_in_restore).copied());
            let cmds = c.restart(Instant::now(), finished);
            self.execute(cmds)?;
        }
        if p.from == RestartFrom::LatestCheckpoint {
            self.channels.renew(&self.topology, &p.tasks);
        }
        tracing::info!(
            pipeline = %self.plan.id,
            tasks = p.tasks.len(),
            from_checkpoint = ?restore.as_ref().map(|r| r.metadata.checkpoint),
            "Restarting tasks."
        );
        for t in &p.tasks {
            self.spawn(*t, restore.clone())?;
        }
        Ok(())
    }

    /// A stop was requested: take a final checkpoint; the tasks stop when it completes.
    fn begin_stop(&mut self) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        match c.trigger_now(Instant::now(), BarrierKind::SavepointThenStop) {
            Ok(barrier) => {
                tracing::info!(pipeline = %self.plan.id, checkpoint = barrier.checkpoint, "Stop requested: taking a final checkpoint.");
                self.stopping = Some(barrier.checkpoint);
                let wait = self
                    .plan
                    .spec
                    .checkpoints
                    .timeout
                    .get()
                    .min(Duration::from_secs(30));
                self.stop_deadline = Some(Instant::now() + wait);
                self.triggered.insert(barrier.checkpoint, Instant::now());
                for (task, r) in &self.running {
                    if self.topology.sources.contains(task) {
                        let _ = r.commands.send(TaskCommand::Trigger(barrier));
                    }
                }
            }
            Err(e) => {
                tracing::info!(pipeline = %self.plan.id, reason = %e, "Stop requested; no final checkpoint.");
                self.stopping = Some(0);
                for r in self.running.values() {
                    let _ = r.commands.send(TaskCommand::Stop);
                }
            }
        }
    }

    fn abort_all(&mut self) {
        for (_, r) in self.running.drain() {
            r.abort.abort();
        }
    }

    fn task_name(&self, task: TaskId) -> String {
        let head = self
            .plan
            .chains
            .get(task.chain as usize)
            .and_then(|c| c.nodes.first())
            .map(|n| self.plan.nodes[n.0].id.clone())
            .unwrap_or_default();
        format!("{head}[{}]", task.subtask)
    }

    /// Keeps a `noop`-failed task's inputs flowing: records are dropped, barriers and the end
    /// of the stream are passed on so that downstream alignment and termination go on.
    fn spawn_drainer(&mut self, task: TaskId) {
        let Some(slot) = self.channels.slot(task) else {
            return;
        };
        let mut outputs = match self.outputs_of_task(task) {
            Ok(o) => o,
            Err(_) => return,
        };
        let id = self.join.spawn_on(
            async move {
                let Some(mut lease) = InputLease::take(&slot) else {
                    return Ok(());
                };
                let mut last = 0;
                while !lease.get().all_ended() {
                    match lease.get().recv(|_| false).await {
                        crate::runtime::input::Received::Message(_, Message::Barrier(b))
                            if b.checkpoint > last =>
                        {
                            last = b.checkpoint;
                            for o in &mut outputs {
                                o.barrier(b).await?;
                            }
                        }
                        _ => {}
                    }
                }
                for o in &mut outputs {
                    o.end().await?;
                }
                Ok(())
            },
            &self.workers,
        );
        let _ = id;
    }

    /// Every output of every node of `task`'s chain (the drainer's view).
    fn outputs_of_task(&self, task: TaskId) -> Result<Vec<Output>> {
        let chain = &self.plan.chains[task.chain as usize];
        let mut outs = Vec::new();
        for (pos, &nid) in chain.nodes.iter().enumerate() {
            let (o, d) = self.node_outputs(task, pos, nid)?;
            outs.extend(o);
            outs.extend(d);
        }
        Ok(outs)
    }

    fn node_outputs(
        &self,
        task: TaskId,
        pos: usize,
        nid: crate::plan::NodeId,
    ) -> Result<(Vec<Output>, Vec<Output>)> {
        let plan = &*self.plan;
        let chain = &plan.chains[task.chain as usize];
        let next_in_chain = chain.nodes.get(pos + 1).copied();
        let pipeline: Arc<str> = plan.id.as_str().into();
        let node = &plan.nodes[nid.0];
        let (mut outputs, mut dead) = (Vec::new(), Vec::new());
        for (ei, edge) in plan.edges.iter().enumerate() {
            if edge.from != nid || (Some(edge.to) == next_in_chain && !edge.dead_letter) {
                continue;
            }
            let route = self
                .topology
                .routes
                .get(&(ei, task.subtask))
                .ok_or_else(|| RunError::Internal(format!("no route for edge {ei} from {task}")))?;
            let mut targets = Vec::new();
            for &(to, input) in &route.targets {
                let sender = self.channels.sender(to, input).ok_or_else(|| {
                    RunError::Internal(format!("no channel into {to} input {input}"))
                })?;
                targets.push(Target { sender });
            }
            let out = Output::new(
                route.partitioning,
                targets,
                plan.max_parallelism,
                Arc::clone(&pipeline),
                node.id.as_str().into(),
            );
            if edge.dead_letter {
                dead.push(out);
            } else {
                outputs.push(out);
            }
        }
        Ok((outputs, dead))
    }

    fn open_state(
        &self,
        operator: &str,
        subtask: u32,
        range: KeyGroupRange,
    ) -> Result<Box<dyn StateBackend>> {
        let plan = &*self.plan;
        match &plan.spec.state {
            StateSpec::Memory | StateSpec::Fs => {
                Ok(Box::new(MemoryBackend::new(plan.max_parallelism, range)))
            }
            StateSpec::Rocksdb(spec) => {
                let dir = rocksdb_dir(plan, spec).join(format!("{operator}-{subtask}"));
                Ok(Box::new(crate::state::rocksdb::RocksdbBackend::open(
                    &dir,
                    plan.max_parallelism,
                    range,
                    spec,
                )?))
            }
        }
    }

    /// Builds and spawns one task, restoring from `restore` when given.
    fn spawn(&mut self, task: TaskId, restore: Option<TaskRestore>) -> Result<()> {
        let plan = Arc::clone(&self.plan);
        let chain = &plan.chains[task.chain as usize];
        let (s, p) = (task.subtask, chain.parallelism);
        let pipeline: Arc<str> = plan.id.as_str().into();
        let restored_finished = restore
            .as_ref()
            .is_some_and(|r| r.metadata.finished_tasks.contains(&task));
        let restored_from = restore.as_ref().map(|r| r.metadata.checkpoint);
        let mut nodes = Vec::with_capacity(chain.nodes.len());
        for (pos, &nid) in chain.nodes.iter().enumerate() {
            let node = &plan.nodes[nid.0];
            let (operator, keyed, counts_output): (Box<dyn Operator>, bool, bool) =
                match &self.builders[nid.0] {
                    NodeBuilder::Source(_) => (Box::new(UnionOperator), false, true),
                    NodeBuilder::Operator { factory, keyed } => (factory(s, p)?, *keyed, true),
                    NodeBuilder::Sink(factory) => (factory(s, p)?, false, false),
                };
            let on_error = match &node.kind {
                NodeKind::Operator(o) => ErrorPolicy::from(o.on_error()),
                _ => ErrorPolicy::Fail,
            };
            let key_groups = KeyGroupRange::for_subtask(plan.max_parallelism, p, s);
            let state = if keyed && !restored_finished {
                Some(self.open_state(&node.id, s, key_groups)?)
            } else {
                None
            };
            let ctx = OperatorContext {
                pipeline: Arc::clone(&pipeline),
                operator: node.id.as_str().into(),
                subtask: s,
                parallelism: p,
                max_parallelism: plan.max_parallelism,
                key_groups,
                on_error,
                dead_letters: Vec::new(),
                errors: 0,
                state,
                restored_from,
                migrate: false,
            };
            let (outputs, dead_letters) = self.node_outputs(task, pos, nid)?;
            nodes.push(ChainNode {
                operator,
                ctx,
                metrics: Arc::clone(&self.reports[nid.0].metrics),
                outputs,
                dead_letters,
                counts_output,
                fault: self.faults.get(&node.id).cloned(),
            });
        }
        let mut chain_task = ChainTask { nodes };
        let head = &plan.nodes[chain.nodes[0].0];
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let checkpointing = self.ck.as_ref().map(|ck| Checkpointing {
            store: Arc::clone(&ck.store),
            mode: ck.mode,
        });
        let env = TaskEnv::new(
            task,
            Arc::clone(&pipeline),
            head.id.as_str().into(),
            cmd_rx,
            self.events_tx.clone(),
            checkpointing,
            restore,
            Arc::clone(&self.control),
        );
        let handle = if restored_finished {
            // Finished before the checkpoint: everything it produced is in downstream state,
            // and its upstream is finished too. It only ends its outputs.
            self.join
                .spawn_on(async move { chain_task.end_outputs().await }, &self.workers)
        } else {
            match &self.builders[head.index.0] {
                NodeBuilder::Source(factory) => {
                    let source = factory(s, p)?;
                    let sctx = SourceContext {
                        pipeline: plan.id.clone(),
                        source: head.id.clone(),
                        subtask: s,
                        parallelism: p,
                        skipped: 0,
                        restored_from,
                    };
                    self.join.spawn_on(
                        async move { run_source(source, sctx, chain_task, env).await },
                        &self.workers,
                    )
                }
                _ => {
                    let slot = self
                        .channels
                        .slot(task)
                        .ok_or_else(|| RunError::Internal(format!("{task} has no inputs")))?;
                    let element = head.id.clone();
                    let pipeline_id = plan.id.clone();
                    self.join.spawn_on(async move {
                        let Some(lease) = InputLease::take(&slot) else {
                            return Err(RunError::Internal(format!(
                                "pipeline `{pipeline_id}`, `{element}`: inputs still held by a previous attempt"
                            )));
                        };
                        run_chain(lease, chain_task, env).await
                    }, &self.workers)
                }
            }
        };
        self.next_attempt += 1;
        let attempt = self.next_attempt;
        self.attempts.insert(handle.id(), (task, attempt));
        self.running.insert(
            task,
            Running {
                abort: handle,
                commands: cmd_tx,
                attempt,
            },
        );
        Ok(())
    }
}

/// The local working directory of a pipeline's RocksDB instances:
/// `<path>/<pipeline>/<operator>-<subtask>/db-<instance>/`.
fn rocksdb_dir(plan: &PipelinePlan, spec: &weir_schema::RocksdbSpec) -> PathBuf {
    let base = match &spec.path {
        Some(p) => plan.resolve_path(p),
        None => plan.resolve_path(".weir/rocksdb"),
    };
    base.join(&plan.id)
}

/// Removes RocksDB instances left behind by a killed process: local state is only a working
/// copy (every restore downloads it again from checkpoint storage). Only directories the
/// backend itself creates (`db-<hex>` under `<operator>-<subtask>/`) are touched, never
/// anything else the directory may hold.
fn clear_local_state(plan: &PipelinePlan) {
    let StateSpec::Rocksdb(spec) = &plan.spec.state else {
        return;
    };
    let dir = rocksdb_dir(plan, spec);
    let Ok(subtasks) = std::fs::read_dir(&dir) else {
        return;
    };
    for sub in subtasks.flatten() {
        let Ok(instances) = std::fs::read_dir(sub.path()) else {
            continue;
        };
        for inst in instances.flatten() {
            let name = inst.file_name().to_string_lossy().into_owned();
            let ours = name
                .strip_prefix("db-")
                .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
            if ours
                && inst.path().is_dir()
                && let Err(e) = std::fs::remove_dir_all(inst.path())
            {
                tracing::warn!(pipeline = %plan.id, dir = %inst.path().display(), error = %e, "Cannot remove a stale RocksDB instance.");
            }
        }
    }
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into()),
        Err(e) => e.to_string(),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

fn setup_checkpoints(plan: &PipelinePlan) -> Result<Option<CheckpointSetup>> {
    let spec = &plan.spec.checkpoints;
    if !spec.enabled {
        return Ok(None);
    }
    let (store, durable): (Arc<dyn CheckpointStore>, bool) = match plan.spec.state {
        StateSpec::Memory => (Arc::new(MemoryStore::new()), false),
        StateSpec::Fs | StateSpec::Rocksdb(_) => {
            let root = plan.resolve_path(&spec.storage);
            let store =
                LocalStore::new(&root, &plan.id).map_err(|e| build_error(plan, e.to_string()))?;
            (Arc::new(store), true)
        }
    };
    Ok(Some(CheckpointSetup {
        store,
        durable,
        mode: spec.mode.into(),
        retain: spec.retain.max(1),
        completed: Vec::new(),
        metadata: BTreeMap::new(),
        latest: None,
    }))
}

/// Deletes every checkpoint and shared file of a store (a fresh start must never fall back
/// to an older run's checkpoint).
fn wipe(store: &dyn CheckpointStore) -> Result<()> {
    for id in store.list_checkpoints()? {
        delete_checkpoint(store, id)?;
    }
    for f in store.list_shared()? {
        store.delete(&f)?;
    }
    store.delete(FINISHED_MARKER)?;
    Ok(())
}

/// Picks the checkpoint to restore (if any) and the highest id used so far; cleans up
/// what a fresh start or earlier crashes left behind.
fn choose_restore(
    plan: &PipelinePlan,
    ck: &mut CheckpointSetup,
    recovery: &RecoveryOptions,
) -> Result<(Option<TaskRestore>, CheckpointId)> {
    let store = &*ck.store;
    if let Some(path) = &recovery.from_checkpoint {
        let (meta, at) = read_checkpoint_at(plan, path)?;
        let last = store.list_checkpoints()?.into_iter().max().unwrap_or(0);
        tracing::info!(pipeline = %plan.id, checkpoint = meta.checkpoint, path = %path.display(), "Restoring from the checkpoint given on the command line.");
        check_compatible(plan, &meta)?;
        return Ok((
            Some(TaskRestore {
                store: Arc::new(at),
                metadata: Arc::new(meta),
                savepoint: false,
            }),
            last,
        ));
    }
    let finished = store.size(FINISHED_MARKER).is_ok();
    if recovery.fresh || finished {
        let last = store.list_checkpoints()?.into_iter().max().unwrap_or(0);
        if last > 0 || finished {
            if recovery.fresh {
                tracing::warn!(pipeline = %plan.id, "--fresh: deleting the existing checkpoints and starting from the beginning.");
            } else {
                tracing::info!(pipeline = %plan.id, "The previous run finished; starting from the beginning.");
            }
        }
        wipe(store)?;
        return Ok((None, last));
    }
    let last = store.list_checkpoints()?.into_iter().max().unwrap_or(0);
    // Directories without metadata never completed (a crash while writing): debris.
    for id in store.list_checkpoints()? {
        if matches!(
            read_metadata(store, id),
            Err(crate::checkpoint::CheckpointError::NotFound { .. })
        ) {
            let _ = delete_checkpoint(store, id);
        }
    }
    let choice = latest_valid(store, Verification::Checksums)?;
    for s in &choice.skipped {
        tracing::warn!(pipeline = %plan.id, checkpoint = s.checkpoint, reason = %s.reason, "Skipping a checkpoint that cannot be restored.");
    }
    let Some(meta) = choice.checkpoint else {
        return Ok((None, last));
    };
    check_compatible(plan, &meta)?;
    // Retention bookkeeping: every complete checkpoint still on disk.
    for id in store.list_checkpoints()? {
        if let Ok(m) = read_metadata(store, id) {
            ck.completed.push(CheckpointFiles::from_metadata(&m));
        }
    }
    let orphans = orphaned_shared(&store.list_shared()?, &ck.completed);
    for f in orphans {
        let _ = store.delete(&f);
    }
    tracing::info!(pipeline = %plan.id, checkpoint = meta.checkpoint, dir = %checkpoint_dir(meta.checkpoint), "Resuming from the latest completed checkpoint.");
    Ok((
        Some(TaskRestore {
            store: Arc::clone(&ck.store),
            metadata: Arc::new(meta),
            savepoint: false,
        }),
        last,
    ))
}

fn check_compatible(plan: &PipelinePlan, meta: &CheckpointMetadata) -> Result<()> {
    if meta.pipeline != plan.id {
        return Err(build_error(
            plan,
            format!(
                "checkpoint {} belongs to pipeline `{}`, not `{}`",
                meta.checkpoint, meta.pipeline, plan.id
            ),
        ));
    }
    if meta.max_parallelism != plan.max_parallelism {
        return Err(build_error(
            plan,
            format!(
                "checkpoint {} was taken with max_parallelism {}, the pipeline now has {}; key groups cannot be remapped. Restore with the old max_parallelism, or start over with --fresh",
                meta.checkpoint, meta.max_parallelism, plan.max_parallelism
            ),
        ));
    }
    if meta.config_hash != crate::checkpoint::metadata::config_hash(&plan.spec) {
        tracing::warn!(pipeline = %plan.id, checkpoint = meta.checkpoint, "The pipeline changed since this checkpoint; state is restored by operator id.");
    }
    Ok(())
}

/// Reads the metadata of a checkpoint directory given on the command line.
fn read_checkpoint_at(
    plan: &PipelinePlan,
    path: &std::path::Path,
) -> Result<(CheckpointMetadata, LocalStore)> {
    let dir = if path.file_name().is_some_and(|n| n == "_metadata") {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(crate::checkpoint::metadata::parse_checkpoint_dir)
        .ok_or_else(|| {
            build_error(
                plan,
                format!(
                    "`{}` is not a checkpoint directory (expected `.../<pipeline>/chk-<n>`)",
                    path.display()
                ),
            )
        })?;
    let root = dir.parent().unwrap_or(dir);
    let store = LocalStore::at(root);
    let meta = read_metadata(&store, name).map_err(|e| build_error(plan, e.to_string()))?;
    Ok((meta, store))
}
