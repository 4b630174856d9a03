//! The supervisor of one pipeline: builds and spawns its tasks, drives its checkpoint
//! coordinator (triggers, acknowledgements, metadata writes, completion notices, retention),
//! and handles task failures with the pipeline's restart and failover strategies.
//!
//! One async loop owns everything here, so there is no lock: task results, task events
//! (acks, declines), metadata-write results and timers all arrive at one `select!`. The
//! protocol decisions are the coordinator's and the strategies' (pure logic elsewhere); this
//! module only carries them out.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinSet};
use weir_schema::{FailoverSpec, StateSpec};

use super::wiring::{Channels, Topology};
use crate::base::error::{ErrorClass, Result, RunError};
use crate::base::message::{BarrierKind, Message};
use crate::base::metrics::NodeReport;
use crate::checkpoint::coordinator::{AbortReason, DeclineReason};
use crate::checkpoint::metadata::checkpoint_dir;
use crate::checkpoint::restore_plan::{self, PipelineShape, RestoreKind, RestorePlan};
use crate::checkpoint::retention::{CheckpointFiles, orphaned_shared};
use crate::checkpoint::savepoint::{read_savepoint, savepoint_dir_name, write_savepoint};
use crate::checkpoint::storage::{
    Verification, delete_checkpoint, latest_valid, read_metadata, write_metadata,
};
use crate::checkpoint::{
    AlignmentMode, CheckpointId, CheckpointMetadata, CheckpointPlan, CheckpointStore, Command,
    Coordinator, CoordinatorConfig, LocalStore, MemoryStore, TaskId, plan_retention,
};
use crate::connectors::SourceContext;
use crate::control::{CheckpointInfo, ControlError, SavepointInfo, SubtaskCheckpointInfo};
use crate::element::{ErrorPolicy, Operator, OperatorContext};
use crate::operators::union::UnionOperator;
use crate::plan::{NodeKind, PipelinePlan};
use crate::record::KeyGroupRange;
use crate::recovery::failover::{FailoverAction, RestartFrom, all_tasks, failover_scope};
use crate::recovery::restart::{Decision, Failure, RestartStrategy};
use crate::registry::{self, BuildContext, NodeBuilder};
use crate::runtime::exchange::{Output, Target};
use crate::runtime::input::InputLease;
use crate::runtime::task::{
    ChainNode, ChainTask, Checkpointing, Control, Fault, HandoverSlot, TaskCommand, TaskEnv,
    TaskEvent, TaskRestore, run_chain, run_source,
};
use crate::state::handover::{Handover, HandoverKey};
use crate::state::{MemoryBackend, StateBackend};

/// Where a run starts from.
#[derive(Clone, Debug, Default)]
pub struct RecoveryOptions {
    /// Ignore (and delete) existing checkpoints and start from the beginning.
    pub fresh: bool,
    /// Restore from this checkpoint directory (`.../<pipeline>/chk-<n>`) instead of the
    /// latest valid one.
    pub from_checkpoint: Option<PathBuf>,
    /// Restore from this savepoint directory (state by operator id, rescaled, migrated).
    pub from_savepoint: Option<PathBuf>,
    /// Let a savepoint hold state of operators the pipeline no longer has (it is dropped).
    pub allow_non_restored_state: bool,
    /// The latest checkpoint is restored into a new version of the pipeline (a reload of a
    /// pipeline that could not take a savepoint): the savepoint restore rules apply.
    pub latest_into_new_version: bool,
}

/// A request from the job's control surface to one pipeline's supervisor.
pub(crate) enum Request {
    /// Take a checkpoint now; answer when it completed.
    Checkpoint(oneshot::Sender<Result<CheckpointInfo, ControlError>>),
    /// Take a savepoint into `dir` (default: `savepoints.dir`), then go on, stop or
    /// drain; answer when it is on disk.
    Savepoint {
        dir: Option<PathBuf>,
        after: AfterSavepoint,
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
    },
    /// Stop without a savepoint; answer when every task stopped.
    Stop(oneshot::Sender<Result<(), ControlError>>),
}

/// What a pipeline does once its savepoint is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterSavepoint {
    /// Go on.
    Continue,
    /// Stop (sources stop at the savepoint's barrier; nothing after it is processed).
    Stop,
    /// End the input: end-of-stream flows down, `emit: final` results are flushed and
    /// committed, then the pipeline ends.
    Drain,
}

/// Live figures of a pipeline, read by the control surface.
#[derive(Clone, Debug, Default)]
pub(crate) struct LiveStatus {
    /// `running`, `restarting`, `stopping`, `degraded` (the job adds the end states).
    pub state: &'static str,
    pub restarts: u32,
    pub checkpoints: u64,
    pub latest: Option<CheckpointId>,
    /// The most recent completed checkpoints and savepoints (at most [`HISTORY`]).
    pub history: VecDeque<CheckpointInfo>,
    pub restored_from: Option<String>,
    /// Failures in a row (see `Failures`).
    pub consecutive_failures: u32,
    /// The operator (or task) of the last failure.
    pub failing: Option<String>,
    /// The last failure.
    pub last_error: Option<String>,
}

/// Checkpoints kept in [`LiveStatus::history`].
const HISTORY: usize = 100;

/// Shared [`LiveStatus`].
pub(crate) type SharedStatus = Arc<std::sync::Mutex<LiveStatus>>;

/// How the supervisor tells the job that the pipeline is up.
#[derive(Default)]
pub(crate) struct StartWatch {
    /// When every task opened and restored.
    pub all_started: Option<oneshot::Sender<Instant>>,
    /// On probation (a reload), `Ok` once the first checkpoint after the start completed
    /// (every task processed up to its barrier), `Err` with the failure when a task failed
    /// before that: the pipeline then stops at once instead of restarting.
    pub probation: Option<oneshot::Sender<std::result::Result<(), String>>>,
}

/// The links between the job and one supervisor.
pub(crate) struct SupervisorLinks {
    pub requests: UnboundedReceiver<Request>,
    pub status: SharedStatus,
    pub start: StartWatch,
    /// The job's hand-over of keyed state between versions (hot reload).
    pub handover: Option<Arc<Handover>>,
}

enum Waiter {
    Checkpoint(oneshot::Sender<Result<CheckpointInfo, ControlError>>),
    Savepoint {
        dir: PathBuf,
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
    },
}

impl Waiter {
    /// Answers the request with `e`.
    fn fail(self, e: ControlError) {
        let _ = match self {
            Waiter::Checkpoint(reply) => reply.send(Err(e)).map_err(drop),
            Waiter::Savepoint { reply, .. } => reply.send(Err(e)).map_err(drop),
        };
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
    /// A metadata write ended; a failure with its class.
    MetadataWritten(CheckpointId, std::result::Result<(), (ErrorClass, String)>),
    SavepointWritten {
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
        result: std::result::Result<SavepointInfo, String>,
    },
}

struct Running {
    abort: AbortHandle,
    commands: UnboundedSender<TaskCommand>,
    attempt: u64,
}

/// The failures of a pipeline in a row: what `weir status` shows and what a stop during a
/// restart reports. A failure is behind the pipeline once two checkpoints completed after it
/// (one can complete between a restore and a record that fails deterministically again).
#[derive(Default)]
struct Failures {
    /// How many, in a row.
    consecutive: u32,
    /// Checkpoints completed since the last failure.
    checkpoints_since: u32,
    /// The last one: the failing operator (or task, or `pipeline`), its text and class.
    last: Option<(String, String, ErrorClass)>,
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
    links: SupervisorLinks,
) -> Ended {
    let mut ended = Ended {
        error: None,
        restarts: 0,
        checkpoints: 0,
        restored_from: None,
        degraded: Vec::new(),
        stats: Vec::new(),
    };
    let SupervisorLinks {
        requests,
        status,
        start,
        handover,
    } = links;
    let mut sup = match Supervisor::new(plan, reports, control, &recovery, workers) {
        Ok(mut s) => {
            s.faults = faults.into_iter().collect();
            s.requests = Some(requests);
            s.status = status;
            s.start = start;
            s.handover = handover;
            s
        }
        Err(e) => {
            if let Some(tx) = start.probation {
                let _ = tx.send(Err(e.to_string()));
            }
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
    /// The job's hand-over of keyed state between versions, and this pipeline's
    /// state-backend configuration as it compares.
    handover: Option<Arc<Handover>>,
    backend_id: Arc<str>,
    /// The runtime tasks run on (the supervisor itself runs on the control thread).
    workers: tokio::runtime::Handle,
    /// The final checkpoint of a requested stop, once triggered.
    stopping: Option<CheckpointId>,
    /// When a stop stops waiting for its final checkpoint.
    stop_deadline: Option<Instant>,
    /// The stop was asked for through the control surface (not a signal).
    stop_by_request: bool,
    /// After the stop's savepoint, drain instead of stopping.
    draining: bool,
    /// Answer to a stop without savepoint, sent when every task stopped.
    stop_reply: Option<oneshot::Sender<Result<(), ControlError>>>,
    /// Requests from the control surface.
    requests: Option<UnboundedReceiver<Request>>,
    /// What the control surface reads.
    status: SharedStatus,
    /// Start notifications.
    start: StartWatch,
    /// Tasks of the first attempt that have not reported `Started` yet.
    not_started: BTreeSet<TaskId>,
    /// The checkpoint that ends probation.
    probation_checkpoint: Option<CheckpointId>,
    /// Probation waits for the sources' first records: since when, and their count then.
    probation_armed: Option<(Instant, u64)>,
    /// Every task was stopped on purpose (a stop while restarting): the loop ends once they
    /// are gone.
    halted: bool,
    probation_attempts: u32,
    /// Requests waiting for a checkpoint to complete.
    waiters: BTreeMap<CheckpointId, Waiter>,
    /// Per-subtask figures of checkpoints in flight.
    acks: BTreeMap<CheckpointId, Vec<SubtaskCheckpointInfo>>,
    /// Savepoint copies in flight (retention waits for them).
    savepoint_writes: usize,
    /// A failure that ends the pipeline, raised where it could not be returned (see
    /// `execute_or_end`).
    fatal: Option<RunError>,
    /// The class of the last checkpoint failure a task or a metadata write reported (a
    /// failover after too many failed checkpoints carries it; storage trouble by default).
    checkpoint_failure_class: ErrorClass,
    /// The failures since the last completed checkpoint.
    failures: Failures,
    /// A stop called a pending restart off: the pipeline ends as failed.
    stopped_restarting: bool,
    /// Where savepoints go by default.
    savepoint_dir: PathBuf,
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
            handover: None,
            backend_id: format!("{:?}", plan.spec.state).into(),
            workers,
            stopping: None,
            stop_deadline: None,
            stop_by_request: false,
            draining: false,
            stop_reply: None,
            requests: None,
            status: SharedStatus::default(),
            start: StartWatch::default(),
            not_started: BTreeSet::new(),
            probation_checkpoint: None,
            probation_armed: None,
            halted: false,
            probation_attempts: 0,
            waiters: BTreeMap::new(),
            acks: BTreeMap::new(),
            savepoint_writes: 0,
            fatal: None,
            checkpoint_failure_class: ErrorClass::Io,
            failures: Failures::default(),
            stopped_restarting: false,
            savepoint_dir: default_savepoint_dir(&plan),
            plan: Arc::new(plan),
        })
    }

    async fn run(&mut self) -> Result<()> {
        let all = self.all.clone();
        let restore = self.initial_restore.clone();
        self.channels.renew(&self.topology, &all);
        let restored_finished: BTreeSet<TaskId> = restore
            .as_ref()
            .map(|r| r.metadata.finished_tasks.iter().copied().collect())
            .unwrap_or_default();
        self.not_started = all.difference(&restored_finished).copied().collect();
        for task in &all {
            self.spawn(*task, restore.clone())?;
        }
        self.publish("running");
        if self.not_started.is_empty() {
            self.on_all_started();
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
                && self.savepoint_writes == 0
                && (self.halted
                    || self
                        .all
                        .iter()
                        .all(|t| self.finished.contains(t) || self.degraded.contains(t)))
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
                self.probation_armed
                    .as_ref()
                    .map(|_| Instant::now() + Duration::from_millis(5)),
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
                Some(request) = recv_request(&mut self.requests) => self.on_request(request),
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
            if let Some(e) = self.fatal.take() {
                return Err(e);
            }
            if let Some((at, baseline)) = self.probation_armed
                && (self.source_records() > baseline || at.elapsed() >= Duration::from_secs(1))
            {
                self.probation_armed = None;
                self.trigger_probation();
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
        self.end_probation(Ok(()));
        for (_, w) in std::mem::take(&mut self.waiters) {
            let e = ControlError::Failed(format!(
                "pipeline `{}` ended before the checkpoint completed",
                self.plan.id
            ));
            w.fail(e);
        }
        if let Some(reply) = self.stop_reply.take() {
            let _ = reply.send(Ok(()));
        }
        if let Some(ck) = &self.ck
            && ck.durable
            && !self.control.stop.load(std::sync::atomic::Ordering::Relaxed)
            && self.stopping.is_none()
            && self.degraded.is_empty()
            && let Err(e) = ck.store.put(FINISHED_MARKER, b"finished\n")
        {
            tracing::warn!(pipeline = %self.plan.id, error = %e, "Cannot mark the run finished; the next run will resume from the last checkpoint.");
        }
        if self.stopped_restarting {
            let (failing, last, class) = self
                .failures
                .last
                .take()
                .unwrap_or_else(|| ("pipeline".into(), "unknown".into(), ErrorClass::Internal));
            return Err(RunError::StoppedWhileRestarting {
                consecutive: self.failures.consecutive,
                failing,
                last,
                class,
            });
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
        if let TaskEvent::Started { task } = event {
            if self.not_started.remove(&task) && self.not_started.is_empty() {
                self.on_all_started();
            }
            return;
        }
        if let TaskEvent::Ack {
            task,
            checkpoint,
            states,
            alignment,
        } = &event
        {
            let info = SubtaskCheckpointInfo {
                task: self.task_name(*task),
                subtask: task.subtask,
                size: states
                    .iter()
                    .flat_map(|s| s.files.iter())
                    .map(|f| f.size)
                    .sum(),
                ack_ms: self
                    .triggered
                    .get(checkpoint)
                    .map_or(0, |t| t.elapsed().as_millis() as u64),
                alignment_ms: alignment.as_millis() as u64,
            };
            self.acks.entry(*checkpoint).or_default().push(info);
        }
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let cmds = match event {
            TaskEvent::Started { .. } => Vec::new(),
            TaskEvent::Ack {
                task,
                checkpoint,
                states,
                ..
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
                    Some((class, e)) => {
                        self.checkpoint_failure_class = class;
                        DeclineReason::Failed(e)
                    }
                };
                c.decline(checkpoint, task, reason)
            }
        };
        self.execute_or_end(cmds);
    }

    /// Carries out commands that arrived outside the loop's own error path (acknowledgements,
    /// metadata writes, finished tasks): a failure there (the restart strategy giving up after
    /// too many failed checkpoints, a restart that cannot spawn) ends the pipeline at the top
    /// of the loop, never silently.
    fn execute_or_end(&mut self, cmds: Vec<Command>) {
        if let Err(e) = self.execute(cmds) {
            tracing::error!(pipeline = %self.plan.id, error = %e, "Checkpoint command failed; the pipeline ends.");
            self.abort_all();
            self.pending_restart = None;
            self.fatal.get_or_insert(e);
        }
    }

    fn on_internal(&mut self, internal: Internal) {
        let (id, result) = match internal {
            Internal::MetadataWritten(id, result) => (id, result),
            Internal::SavepointWritten { reply, result } => {
                self.savepoint_writes = self.savepoint_writes.saturating_sub(1);
                match &result {
                    Ok(info) => {
                        tracing::info!(pipeline = %self.plan.id, checkpoint = info.checkpoint, path = %info.path.display(), size_bytes = info.size, duration_ms = info.duration_ms, "Savepoint written.");
                    }
                    Err(e) => {
                        tracing::error!(pipeline = %self.plan.id, error = %e, "Savepoint failed.");
                    }
                }
                let _ = reply.send(result.map_err(ControlError::Failed));
                // Retention waited for the copy.
                self.run_retention();
                return;
            }
        };
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let cmds = match result {
            Ok(()) => c.metadata_written(id, Instant::now()),
            Err((class, e)) => {
                self.checkpoint_failure_class = class;
                c.metadata_failed(id, e)
            }
        };
        match cmds {
            Ok(cmds) => self.execute_or_end(cmds),
            Err(e) => tracing::warn!(pipeline = %self.plan.id, error = %e, "Checkpoint protocol."),
        }
    }

    fn on_task_finished(&mut self, task: TaskId) {
        self.finished.insert(task);
        if let Some(c) = self.coordinator.as_mut() {
            let cmds = c.task_finished(task);
            self.execute_or_end(cmds);
        }
    }

    /// Carries out the coordinator's commands.
    fn execute(&mut self, cmds: Vec<Command>) -> Result<()> {
        for cmd in cmds {
            match cmd {
                Command::Trigger(barrier) => self.inject(barrier),
                Command::WriteMetadata(mut meta) => {
                    meta.finished_operators = finished_operators(&self.plan, &meta.finished_tasks);
                    let Some(ck) = self.ck.as_mut() else { continue };
                    let id = meta.checkpoint;
                    ck.metadata.insert(id, (*meta).clone());
                    let store = Arc::clone(&ck.store);
                    let tx = self.internal_tx.clone();
                    tokio::task::spawn_blocking(move || {
                        let r =
                            write_metadata(&*store, &meta).map_err(|e| (e.class(), e.to_string()));
                        let _ = tx.send(Internal::MetadataWritten(id, r));
                    });
                }
                Command::NotifyComplete(barrier) => {
                    let id = barrier.checkpoint;
                    self.completed_count += 1;
                    self.failures.checkpoints_since += 1;
                    if self.failures.consecutive > 0 && self.failures.checkpoints_since >= 2 {
                        self.failures.consecutive = 0;
                        self.publish(self.status_state());
                    }
                    for r in self.running.values() {
                        let _ = r.commands.send(TaskCommand::Complete(id));
                    }
                    if self.stopping == Some(id) {
                        self.stop_deadline = None;
                        let command = if self.draining {
                            tracing::info!(pipeline = %self.plan.id, checkpoint = id, "Savepoint complete; draining (sources end, results are flushed).");
                            TaskCommand::Drain
                        } else if matches!(self.waiters.get(&id), Some(Waiter::Savepoint { .. })) {
                            tracing::info!(pipeline = %self.plan.id, checkpoint = id, "Savepoint complete; stopping.");
                            TaskCommand::Stop
                        } else {
                            tracing::info!(pipeline = %self.plan.id, checkpoint = id, "Final checkpoint complete; stopping (the next run resumes from it).");
                            TaskCommand::Stop
                        };
                        for r in self.running.values() {
                            let _ = r.commands.send(command);
                        }
                    }
                    if self.probation_checkpoint.is_some_and(|p| p <= id) {
                        self.end_probation(Ok(()));
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
                    let now = SystemTime::now();
                    let mut subtasks = self.acks.remove(&id).unwrap_or_default();
                    self.acks.retain(|&k, _| k > id);
                    subtasks.sort_by(|a, b| a.task.cmp(&b.task));
                    let info = CheckpointInfo {
                        id,
                        kind: match barrier.kind {
                            BarrierKind::Checkpoint => "checkpoint",
                            _ => "savepoint",
                        }
                        .into(),
                        trigger_time_ms: unix_ms(now - stats.duration),
                        duration_ms: stats.duration.as_millis() as u64,
                        size,
                        new_bytes,
                        alignment_ms: subtasks.iter().map(|s| s.alignment_ms).max().unwrap_or(0),
                        subtasks,
                    };
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
                            self.savepoint_writes += 1;
                            let store = Arc::clone(&ck.store);
                            let tx = self.internal_tx.clone();
                            let pipeline = self.plan.id.clone();
                            let started = instant_before(info.duration_ms);
                            let meta = Arc::clone(&meta);
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
                        None => {}
                    }
                    if let Ok(mut st) = self.status.lock() {
                        st.checkpoints = self.completed_count;
                        st.latest = Some(id);
                        st.history.push_back(info);
                        while st.history.len() > HISTORY {
                            st.history.pop_front();
                        }
                    }
                    self.run_retention();
                }
                Command::Discard { checkpoint } => {
                    let Some(ck) = self.ck.as_ref() else { continue };
                    let store = Arc::clone(&ck.store);
                    tokio::task::spawn_blocking(move || {
                        let _ = delete_checkpoint(&*store, checkpoint);
                    });
                }
                Command::Abort { barrier, reason } => {
                    let id = barrier.checkpoint;
                    self.acks.remove(&id);
                    if let Some(w) = self.waiters.remove(&id) {
                        let e = ControlError::Failed(format!(
                            "checkpoint {id} of pipeline `{}` was aborted: {reason}",
                            self.plan.id
                        ));
                        w.fail(e);
                    }
                    if self.stopping == Some(id) && self.stop_by_request {
                        tracing::warn!(pipeline = %self.plan.id, %reason, "The stop's savepoint failed; the pipeline goes on.");
                        self.stopping = None;
                        self.stop_by_request = false;
                        self.draining = false;
                        for (task, r) in &self.running {
                            if self.topology.sources.contains(task) {
                                let _ = r.commands.send(TaskCommand::Resume);
                            }
                        }
                        self.publish("running");
                    } else if self.stopping == Some(id) {
                        tracing::warn!(pipeline = %self.plan.id, %reason, "The final checkpoint failed; stopping anyway (the next run resumes from the last completed one).");
                        for r in self.running.values() {
                            let _ = r.commands.send(TaskCommand::Stop);
                        }
                    }
                    if self.probation_checkpoint == Some(id) {
                        self.probation_checkpoint = None;
                        self.probation_attempts += 1;
                        if self.probation_attempts >= 3 {
                            self.end_probation(Err(format!(
                                "the first checkpoints after the start failed: {reason}"
                            )));
                        } else {
                            self.trigger_probation();
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
                    let class = match last {
                        AbortReason::Timeout => ErrorClass::Io,
                        _ => self.checkpoint_failure_class,
                    };
                    let e = RunError::CheckpointsFailing {
                        consecutive: consecutive_failures,
                        tolerable: self.plan.spec.checkpoints.tolerable_failures,
                        last: last.to_string(),
                        class,
                    };
                    self.on_task_failed(None, e)?;
                }
            }
        }
        Ok(())
    }

    /// Deletes the completed checkpoints beyond `retain` (and the files only they
    /// reference), unless a savepoint is being copied out of checkpoint storage: then nothing
    /// is deleted until the copy is done, and the end of the copy runs retention again.
    fn run_retention(&mut self) {
        if self.savepoint_writes > 0 {
            return;
        }
        let Some(ck) = self.ck.as_mut() else { return };
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

    /// Handles a failure of `task` (`None`: of the whole pipeline, e.g. too many failed
    /// checkpoints): ask the restart strategy, then the failover strategy.
    fn on_task_failed(&mut self, task: Option<TaskId>, error: RunError) -> Result<()> {
        let node = task.map_or_else(|| "pipeline".to_owned(), |t| self.task_name(t));
        tracing::error!(pipeline = %self.plan.id, task = %node, error = %error, "Task failed.");
        self.failures.consecutive += 1;
        self.failures.checkpoints_since = 0;
        let failing = error.element().map_or_else(|| node.clone(), str::to_owned);
        self.failures.last = Some((failing, error.to_string(), error.class()));
        if self.start.probation.is_some() {
            // A new version on probation (a reload) failed before its first checkpoint: no
            // restart; the job brings the previous version back.
            self.end_probation(Err(error.to_string()));
            self.abort_all();
            self.pending_restart = None;
            return Err(error);
        }
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
                self.publish("restarting");
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
        self.publish(if self.degraded.is_empty() {
            "running"
        } else {
            "degraded"
        });
        Ok(())
    }

    /// Sends `barrier` to every running source task.
    fn inject(&mut self, barrier: crate::base::message::Barrier) {
        self.triggered.insert(barrier.checkpoint, Instant::now());
        for (task, r) in &self.running {
            if self.topology.sources.contains(task) {
                let _ = r.commands.send(TaskCommand::Trigger(barrier));
            }
        }
    }

    /// Updates the live status.
    fn publish(&self, state: &'static str) {
        if let Ok(mut st) = self.status.lock() {
            st.state = state;
            st.restarts = self.restarts;
            st.checkpoints = self.completed_count;
            st.restored_from = self.restored_from.map(|c| format!("checkpoint {c}"));
            st.consecutive_failures = self.failures.consecutive;
            st.failing = self.failures.last.as_ref().map(|(op, _, _)| op.clone());
            st.last_error = self.failures.last.as_ref().map(|(_, e, _)| e.clone());
            if let Some(r) = &self.initial_restore
                && r.savepoint
            {
                st.restored_from =
                    Some(format!("savepoint (checkpoint {})", r.metadata.checkpoint));
            }
        }
    }

    /// Every task of the first attempt opened and restored.
    fn on_all_started(&mut self) {
        if let Some(tx) = self.start.all_started.take() {
            let _ = tx.send(Instant::now());
        }
        if self.start.probation.is_some() {
            self.on_all_started_probation();
        }
    }

    /// Probation: a checkpoint as soon as the sources produced something since the start (or
    /// after a second, for an idle input), so that its barrier follows records: its
    /// completion proves every task processes them.
    fn on_all_started_probation(&mut self) {
        self.probation_armed = Some((Instant::now(), self.source_records()));
    }

    /// Records produced by this pipeline's sources so far.
    fn source_records(&self) -> u64 {
        self.reports
            .iter()
            .filter(|r| r.role == "source")
            .map(|r| r.metrics.read().0)
            .sum()
    }

    fn trigger_probation(&mut self) {
        let Some(c) = self.coordinator.as_mut() else {
            self.end_probation(Ok(()));
            return;
        };
        match c.trigger_now(Instant::now(), BarrierKind::Checkpoint) {
            Ok(barrier) => {
                self.probation_checkpoint = Some(barrier.checkpoint);
                self.inject(barrier);
            }
            // Every task already finished (a short bounded input): nothing failed.
            Err(_) => self.end_probation(Ok(())),
        }
    }

    fn end_probation(&mut self, result: std::result::Result<(), String>) {
        self.probation_checkpoint = None;
        self.probation_armed = None;
        if let Some(tx) = self.start.probation.take() {
            let _ = tx.send(result);
        }
    }

    /// Carries out a request of the control surface.
    fn on_request(&mut self, request: Request) {
        let id = self.plan.id.clone();
        let busy = |what: &str| {
            ControlError::Busy(format!(
                "pipeline `{id}` is {what}; try again when it is done"
            ))
        };
        match request {
            Request::Checkpoint(reply) => {
                let Some(c) = self.coordinator.as_mut() else {
                    let _ = reply.send(Err(ControlError::Invalid(format!(
                        "pipeline `{id}` takes no checkpoints (`checkpoints: {{enabled: false}}`)"
                    ))));
                    return;
                };
                match c.trigger_now(Instant::now(), BarrierKind::Checkpoint) {
                    Ok(barrier) => {
                        self.waiters
                            .insert(barrier.checkpoint, Waiter::Checkpoint(reply));
                        self.inject(barrier);
                    }
                    Err(e) => {
                        let _ =
                            reply.send(Err(ControlError::Invalid(format!("pipeline `{id}`: {e}"))));
                    }
                }
            }
            Request::Savepoint { dir, after, reply } => {
                if self.stopping.is_some() {
                    let _ = reply.send(Err(busy("stopping")));
                    return;
                }
                if self.pending_restart.is_some() {
                    let _ = reply.send(Err(ControlError::Busy(format!(
                        "pipeline `{id}` is restarting after a failure: a savepoint needs every task running; try again when it runs (`weir status`), or stop it without a savepoint"
                    ))));
                    return;
                }
                if let Some((n, _)) = self
                    .waiters
                    .iter()
                    .find(|(_, w)| matches!(w, Waiter::Savepoint { .. }))
                {
                    let _ = reply.send(Err(ControlError::Busy(format!(
                        "a savepoint of pipeline `{id}` is already in progress (checkpoint {n})"
                    ))));
                    return;
                }
                let Some(c) = self.coordinator.as_mut() else {
                    let _ = reply.send(Err(ControlError::Invalid(format!(
                        "pipeline `{id}` takes no checkpoints (`checkpoints: {{enabled: false}}`), so it cannot take a savepoint; enable checkpoints to keep its state across stops and reloads"
                    ))));
                    return;
                };
                let dir = dir.unwrap_or_else(|| self.savepoint_dir.clone());
                // Once a stop-with-savepoint's checkpoint completes the tasks stop, whether or
                // not the copy into `dir` succeeds: find out now that it cannot.
                if let Err(e) = check_writable(&dir) {
                    let _ = reply.send(Err(ControlError::Invalid(format!(
                        "pipeline `{id}`: cannot write a savepoint into `{}`: {e}; nothing was stopped or taken",
                        dir.display()
                    ))));
                    return;
                }
                let kind = if after == AfterSavepoint::Continue {
                    BarrierKind::Savepoint
                } else {
                    BarrierKind::SavepointThenStop
                };
                match c.trigger_now(Instant::now(), kind) {
                    Ok(barrier) => {
                        tracing::info!(pipeline = %id, checkpoint = barrier.checkpoint, dir = %dir.display(), then = ?after, "Taking a savepoint.");
                        self.waiters
                            .insert(barrier.checkpoint, Waiter::Savepoint { dir, reply });
                        if after != AfterSavepoint::Continue {
                            self.stopping = Some(barrier.checkpoint);
                            self.stop_by_request = true;
                            self.draining = after == AfterSavepoint::Drain;
                            self.publish("stopping");
                        }
                        self.inject(barrier);
                    }
                    Err(e) => {
                        let _ =
                            reply.send(Err(ControlError::Invalid(format!("pipeline `{id}`: {e}"))));
                    }
                }
            }
            Request::Stop(reply) => {
                if self.stopping.is_some() {
                    let _ = reply.send(Err(busy("stopping")));
                    return;
                }
                tracing::info!(pipeline = %id, "Stop requested (no savepoint).");
                self.stopping = Some(0);
                self.stop_by_request = true;
                self.stop_reply = Some(reply);
                self.publish("stopping");
                if self.halt_restart() {
                    return;
                }
                for r in self.running.values() {
                    let _ = r.commands.send(TaskCommand::Stop);
                }
            }
        }
    }

    /// A stop while the pipeline waits to restart after a failure: no checkpoint can be taken
    /// (tasks are down), so the restart is called off and every task stops now; the next run
    /// resumes from the latest completed checkpoint.
    fn halt_restart(&mut self) -> bool {
        if self.pending_restart.take().is_none() {
            return false;
        }
        tracing::info!(pipeline = %self.plan.id, "Stop requested while restarting after a failure: the restart is called off.");
        self.abort_all();
        self.halted = true;
        self.stopped_restarting = true;
        true
    }

    /// The live state name the pipeline is in now (for a publish outside a transition).
    fn status_state(&self) -> &'static str {
        self.status.lock().map(|st| st.state).unwrap_or("running")
    }

    /// A stop was requested: take a final checkpoint; the tasks stop when it completes.
    fn begin_stop(&mut self) {
        if self.halt_restart() {
            self.stopping = Some(0);
            return;
        }
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
        let mut received = Vec::with_capacity(chain.nodes.len());
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
                // A reload's new version takes the old version's state as it was at the
                // savepoint when it fits, instead of decoding the savepoint's files.
                // Not when the restore must leave some of its named states out or retype
                // them: the old version's backend holds them all, as they were.
                let handed = restore
                    .as_ref()
                    .filter(|r| r.savepoint)
                    .filter(|r| {
                        r.plan
                            .as_ref()
                            .and_then(|p| p.node(&node.id))
                            .is_none_or(|d| !d.filters_keyed_state())
                    })
                    .zip(self.handover.as_ref())
                    .and_then(|(r, h)| {
                        let key = HandoverKey {
                            pipeline: Arc::clone(&pipeline),
                            operator: node.id.as_str().into(),
                            subtask: s,
                            checkpoint: r.metadata.checkpoint,
                        };
                        h.take(&key, key_groups, &self.backend_id)
                    });
                received.push(handed.is_some());
                Some(match handed {
                    Some(state) => state,
                    None => self.open_state(&node.id, s, key_groups)?,
                })
            } else {
                received.push(false);
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
                migrate: restore
                    .as_ref()
                    .and_then(|r| r.plan.as_ref())
                    .and_then(|p| p.node(&node.id))
                    .is_some_and(|d| d.migrate),
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
        let mut env = TaskEnv::new(
            task,
            Arc::clone(&pipeline),
            head.id.as_str().into(),
            cmd_rx,
            self.events_tx.clone(),
            checkpointing,
            restore,
            Arc::clone(&self.control),
        );
        if received.iter().any(|&r| r) {
            tracing::debug!(pipeline = %plan.id, %task, "Keyed state handed over from the previous version.");
        }
        env.handover = self
            .handover
            .as_ref()
            .map(|h| HandoverSlot::new(Arc::clone(h), Arc::clone(&self.backend_id), received));
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

/// Where savepoints go when a request names no directory: the pipeline's `savepoints.dir`
/// (default `.weir/savepoints` next to the file), absolute.
fn default_savepoint_dir(plan: &PipelinePlan) -> PathBuf {
    let d = plan.resolve_path(&plan.spec.savepoints.dir);
    std::path::absolute(&d).unwrap_or(d)
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

/// The instant `ms` milliseconds ago.
fn instant_before(ms: u64) -> Instant {
    Instant::now()
        .checked_sub(Duration::from_millis(ms))
        .unwrap_or_else(Instant::now)
}

async fn recv_request(requests: &mut Option<UnboundedReceiver<Request>>) -> Option<Request> {
    match requests {
        Some(rx) => match rx.recv().await {
            Some(r) => Some(r),
            None => {
                // The job dropped its end: no more requests.
                *requests = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
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

/// The tasks of `plan` that a savepoint says had finished: those whose chain's head had
/// finished as the same subtask at the same parallelism.
fn finished_in(plan: &PipelinePlan, meta: &CheckpointMetadata) -> Vec<TaskId> {
    let finished: BTreeSet<(&str, u32)> = meta
        .finished_operators
        .iter()
        .map(|(o, s)| (o.as_str(), *s))
        .collect();
    let mut out = Vec::new();
    for (c, chain) in plan.chains.iter().enumerate() {
        let head = &plan.nodes[chain.nodes[0].0];
        let same_parallelism = meta
            .operators
            .iter()
            .any(|o| o.id == head.id && o.parallelism == chain.parallelism);
        if !same_parallelism {
            continue;
        }
        for s in 0..chain.parallelism {
            if finished.contains(&(head.id.as_str(), s)) {
                out.push(TaskId::new(c as u32, s));
            }
        }
    }
    out
}

/// Decides what restoring `meta` does to every node's state (see
/// [`crate::checkpoint::restore_plan`]) and refuses the restore when the decision has a
/// problem, listing every one; state dropped on purpose (`--allow-non-restored-state`) is
/// logged. `what` names the restored point for the messages.
fn restore_decision(
    plan: &PipelinePlan,
    meta: &CheckpointMetadata,
    kind: RestoreKind,
    what: &str,
    allow_non_restored_state: bool,
) -> Result<Arc<RestorePlan>> {
    let decision = restore_plan::decide(
        &PipelineShape::of_metadata(meta),
        &PipelineShape::of_plan(plan),
        kind,
        allow_non_restored_state,
    );
    if !decision.problems.is_empty() {
        let list = decision
            .problems
            .iter()
            .map(|p| format!("\n  - {p}"))
            .collect::<String>();
        return Err(build_error(
            plan,
            format!("cannot restore {what} into this version of the pipeline:{list}"),
        ));
    }
    for w in &decision.waived {
        tracing::warn!(pipeline = %plan.id, restore = %what, "State not restored (--allow-non-restored-state): {w}");
    }
    if let Some((from, to)) = decision.backend {
        tracing::info!(pipeline = %plan.id, from = from.as_str(), to = to.as_str(), "Restoring into another state backend.");
    }
    for n in decision.nodes.iter().filter(|n| n.unrecorded) {
        tracing::warn!(pipeline = %plan.id, operator = %n.id, "The restored metadata does not record which states this operator declared (an older Weir): names and kinds are not compared; a state it no longer declares is refused unless --allow-non-restored-state.");
    }
    Ok(Arc::new(decision))
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

/// Whether savepoints can be written into `dir`: creates it, then a probe file in it.
fn check_writable(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".weir-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(&probe)
}

/// Written into durable checkpoint storage when a run starts from a savepoint or from a
/// checkpoint named on the command line. The restore rolls sinks back to that point, so the
/// storage's checkpoints up to `after` (taken before the restore, possibly later than the
/// restored point) no longer match the output: until the restored run completes a
/// checkpoint of its own, a plain restart restores the same point again.
const RESTORED_MARKER: &str = "_restored_from";

/// The content of [`RESTORED_MARKER`] (JSON).
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct RestoredFrom {
    /// The savepoint or checkpoint directory, absolute.
    path: PathBuf,
    /// A savepoint (restored under the savepoint rules) or a checkpoint.
    savepoint: bool,
    /// The highest checkpoint id in the storage when the restore started.
    after: CheckpointId,
    /// `--allow-non-restored-state` was given.
    allow_non_restored_state: bool,
}

fn write_restored_marker(plan: &PipelinePlan, store: &dyn CheckpointStore, marker: &RestoredFrom) {
    let written = serde_json::to_vec(marker)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            store
                .put(RESTORED_MARKER, &bytes)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        tracing::warn!(pipeline = %plan.id, error = %e, "Cannot record the restore in checkpoint storage; if this run dies before its first checkpoint, restore the same point again by hand.");
    }
}

/// Records, in durable checkpoint storage, that this run restored `path` (a savepoint when
/// `savepoint`) over checkpoints up to `after` (see [`RestoredFrom`]).
fn mark_restored(
    plan: &PipelinePlan,
    ck: &CheckpointSetup,
    path: &Path,
    savepoint: bool,
    after: CheckpointId,
    recovery: &RecoveryOptions,
) {
    if !ck.durable {
        return;
    }
    let marker = RestoredFrom {
        path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        savepoint,
        after,
        allow_non_restored_state: recovery.allow_non_restored_state,
    };
    write_restored_marker(plan, &*ck.store, &marker);
}

fn read_restored_marker(store: &dyn CheckpointStore) -> Option<RestoredFrom> {
    store
        .get(RESTORED_MARKER)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
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
    store.delete(RESTORED_MARKER)?;
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
    if let Some(path) = &recovery.from_savepoint {
        let (mut meta, at) = read_savepoint(path).map_err(|e| {
            build_error(
                plan,
                format!("cannot restore savepoint `{}`: {e}", path.display()),
            )
        })?;
        if meta.pipeline != plan.id {
            tracing::warn!(pipeline = %plan.id, savepoint = %path.display(), from = %meta.pipeline, "Restoring a savepoint taken by another pipeline; state maps by operator id.");
            meta.pipeline = plan.id.clone();
        }
        let decision = restore_decision(
            plan,
            &meta,
            RestoreKind::Savepoint,
            &format!("savepoint `{}`", path.display()),
            recovery.allow_non_restored_state,
        )?;
        meta.finished_tasks = finished_in(plan, &meta);
        let last = store.list_checkpoints()?.into_iter().max().unwrap_or(0);
        let last = last.max(meta.checkpoint);
        mark_restored(plan, ck, path, true, last, recovery);
        tracing::info!(pipeline = %plan.id, checkpoint = meta.checkpoint, path = %path.display(), "Restoring from a savepoint.");
        return Ok((
            Some(TaskRestore {
                store: Arc::new(at),
                metadata: Arc::new(meta),
                savepoint: true,
                plan: Some(decision),
            }),
            last,
        ));
    }
    if let Some(path) = &recovery.from_checkpoint {
        let (mut meta, at) = read_checkpoint_at(plan, path)?;
        let last = store.list_checkpoints()?.into_iter().max().unwrap_or(0);
        tracing::info!(pipeline = %plan.id, checkpoint = meta.checkpoint, path = %path.display(), "Restoring from the checkpoint given on the command line.");
        warn_if_changed(plan, &meta);
        let decision = restore_decision(
            plan,
            &meta,
            RestoreKind::Checkpoint,
            &format!("checkpoint `{}`", path.display()),
            recovery.allow_non_restored_state,
        )?;
        if meta.config_hash != crate::checkpoint::metadata::config_hash(&plan.spec) {
            meta.finished_tasks = finished_in(plan, &meta);
        }
        mark_restored(plan, ck, path, false, last, recovery);
        return Ok((
            Some(TaskRestore {
                store: Arc::new(at),
                metadata: Arc::new(meta),
                savepoint: false,
                plan: Some(decision),
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
            Err(crate::base::error::CheckpointError::NotFound { .. })
        ) {
            let _ = delete_checkpoint(store, id);
        }
    }
    let choice = latest_valid(store, Verification::Checksums)?;
    for s in &choice.skipped {
        tracing::warn!(pipeline = %plan.id, checkpoint = s.checkpoint, reason = %s.reason, "Skipping a checkpoint that cannot be restored.");
    }
    if let Some(marker) = read_restored_marker(store)
        && choice
            .checkpoint
            .as_ref()
            .is_none_or(|m| m.checkpoint <= marker.after)
    {
        // The last run started from `marker.path` and completed no checkpoint of its own.
        let what = if marker.savepoint {
            "savepoint"
        } else {
            "checkpoint"
        };
        tracing::warn!(pipeline = %plan.id, path = %marker.path.display(), "The last run started from this {what} and died before its first checkpoint; restoring it again (the checkpoints the storage holds from before that restore no longer match the output).");
        let again = RecoveryOptions {
            from_savepoint: marker.savepoint.then(|| marker.path.clone()),
            from_checkpoint: (!marker.savepoint).then(|| marker.path.clone()),
            allow_non_restored_state: marker.allow_non_restored_state
                || recovery.allow_non_restored_state,
            ..RecoveryOptions::default()
        };
        return choose_restore(plan, ck, &again).map_err(|e| {
            build_error(
                plan,
                format!(
                    "the last run started from {what} `{}` and died before its first \
                     checkpoint, so it must be restored again: {e}. Give it again with \
                     --from-{what}, or start over with --fresh",
                    marker.path.display()
                ),
            )
        });
    }
    let Some(meta) = choice.checkpoint else {
        if !choice.skipped.is_empty() {
            return Err(build_error(plan, nothing_restorable(plan, &choice.skipped)));
        }
        return Ok((None, last));
    };
    let mut meta = meta;
    if !recovery.latest_into_new_version {
        warn_if_changed(plan, &meta);
    }
    let decision = restore_decision(
        plan,
        &meta,
        RestoreKind::Checkpoint,
        &format!("checkpoint {}", meta.checkpoint),
        recovery.allow_non_restored_state,
    )?;
    if recovery.latest_into_new_version
        || meta.config_hash != crate::checkpoint::metadata::config_hash(&plan.spec)
    {
        // Another version (chains may differ): finished tasks map by operator id.
        meta.finished_tasks = finished_in(plan, &meta);
    }
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
            savepoint: recovery.latest_into_new_version,
            plan: Some(decision),
        }),
        last,
    ))
}

/// The refusal to start when checkpoints exist but none can be restored: each damaged
/// checkpoint with its reason (the file and what is wrong with it), then the ways on. A fresh
/// start would replace the sinks' committed output, so it is never taken silently.
fn nothing_restorable(
    plan: &PipelinePlan,
    skipped: &[crate::checkpoint::storage::SkippedCheckpoint],
) -> String {
    let root = plan
        .resolve_path(&plan.spec.checkpoints.storage)
        .join(&plan.id);
    let at = format!(" in `{}`", root.display());
    let mut out = format!(
        "checkpoints exist{at}, but none of the {} can be restored:",
        skipped.len()
    );
    for s in skipped {
        out.push_str(&format!(
            "\n  {}: {}",
            checkpoint_dir(s.checkpoint),
            s.reason
        ));
    }
    let savepoints = savepoints_of(plan);
    out.push_str(
        "\nStarting from the beginning would read every source again and replace the committed \
         output of the file sinks, so Weir does not do it on its own. To go on:",
    );
    for sp in &savepoints {
        out.push_str(&format!(
            "\n  weir run --from-savepoint {} ...   (a savepoint of this pipeline)",
            sp.display()
        ));
    }
    out.push_str(
        &format!("\n  weir run --from-checkpoint {}/chk-<n> ...   (an older checkpoint you kept, or a repaired one)\n  weir run --fresh ...   (start over: deletes the checkpoints and the file sinks' committed output)", root.display()),
    );
    out
}

/// The savepoint directories of `plan`'s pipeline in its default savepoint directory,
/// newest first (by name: the id, then the time).
fn savepoints_of(plan: &PipelinePlan) -> Vec<PathBuf> {
    let prefix = format!("savepoint-{}-", plan.id);
    let Ok(entries) = std::fs::read_dir(default_savepoint_dir(plan)) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name
                .strip_prefix(&prefix)?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            e.path().join("_metadata").is_file().then(|| (id, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().rev().map(|(_, p)| p).collect()
}

/// Warns when the pipeline changed since checkpoint `meta` was taken (a resume or
/// `--from-checkpoint` into an edited file): the restore plan decides per node what happens.
fn warn_if_changed(plan: &PipelinePlan, meta: &CheckpointMetadata) {
    if meta.config_hash != crate::checkpoint::metadata::config_hash(&plan.spec) {
        tracing::warn!(pipeline = %plan.id, checkpoint = meta.checkpoint, "The pipeline changed since this checkpoint; state is restored by operator id and state name.");
    }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn plan(yaml: &str) -> PipelinePlan {
        crate::plan::plan_test_yaml(yaml, Path::new("/jobs"))
    }

    const JOB: &str = r#"version: 1
pipelines:
  - id: p
    checkpoints: { interval: 1s, storage: ck }
    sources:
      - { id: gen, type: generator, count: 1, fields: { seq: { kind: sequence } } }
    sinks:
      - { id: out, type: stdout, input: gen }
"#;

    #[test]
    fn the_restore_marker_round_trips_and_a_fresh_start_removes_it() {
        let store = MemoryStore::new();
        let marker = RestoredFrom {
            path: "/sp/savepoint-p-4-1".into(),
            savepoint: true,
            after: 9,
            allow_non_restored_state: false,
        };
        write_restored_marker(&plan(JOB), &store, &marker);
        assert_eq!(read_restored_marker(&store), Some(marker));
        wipe(&store).expect("wipe");
        assert_eq!(read_restored_marker(&store), None);
    }

    #[test]
    fn savepoints_go_to_the_configured_dir_else_under_checkpoint_storage() {
        assert_eq!(
            default_savepoint_dir(&plan(JOB)),
            Path::new("/jobs/.weir/savepoints")
        );
        let configured = JOB.replace(
            "    sources:",
            "    savepoints: { dir: backups/sp }\n    sources:",
        );
        assert_eq!(
            default_savepoint_dir(&plan(&configured)),
            Path::new("/jobs/backups/sp")
        );
    }
}
