//! The supervisor loop of one pipeline: one `select!` over task events, internal results,
//! stop signals, control requests, task ends and timers, each dispatched to the module that
//! owns it, until every task is done. It also builds the supervisor (operators, checkpoint
//! storage, the restore, the coordinator) and settles the end of the run (late metadata
//! writes, the finished marker, the answers still owed).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::sync::oneshot;
use weir_schema::FailoverSpec;

use super::completion::{Checkpoints, Internal};
use super::failure::Failures;
use super::phase::{Phase, Probation};
use super::restore::choose_restore;
use super::spawn::{Joined, Tasks};
use super::storage::{FINISHED_MARKER, clear_local_state, setup_checkpoints};
use super::{LiveState, RecoveryOptions, Request, SharedStatus, SupervisorLinks};
use crate::base::error::{ErrorClass, Result, RunError};
use crate::base::human::{Maybe, OneLine};
use crate::base::message::Barrier;
use crate::base::metrics::NodeReport;
use crate::checkpoint::coordinator::DeclineReason;
use crate::checkpoint::metadata::is_channel_file;
use crate::checkpoint::{CheckpointId, CheckpointPlan, Command, Coordinator, CoordinatorConfig};
use crate::control::{ControlError, SubtaskCheckpointInfo};
use crate::plan::PipelinePlan;
use crate::recovery::restart::RestartStrategy;
use crate::registry::{self, BuildContext, NodeBuilder};
use crate::runtime::fault::Fault;
use crate::runtime::task::{Checkpointing, Control, TaskEvent, TaskRestore};

/// The supervisor of one pipeline (see the module docs).
pub(super) struct Supervisor {
    pub plan: Arc<PipelinePlan>,
    pub control: Arc<Control>,
    /// The pipeline's tasks.
    pub tasks: Tasks,
    /// Checkpoint storage, the coordinator and what is tracked of checkpoints.
    pub checkpoints: Checkpoints,
    /// Where the pipeline is in its life.
    pub phase: Phase,
    pub restart: RestartStrategy,
    pub failover: FailoverSpec,
    pub restarts: u32,
    /// The failures since the last completed checkpoint.
    pub failures: Failures,
    pub restored_from: Option<CheckpointId>,
    /// The first restore of the run.
    initial_restore: Option<TaskRestore>,
    events: UnboundedReceiver<TaskEvent>,
    /// Requests from the control surface.
    requests: Option<UnboundedReceiver<Request>>,
    /// What the control surface reads.
    pub status: SharedStatus,
    /// Told when every task of the first attempt opened and restored.
    all_started: Option<oneshot::Sender<Instant>>,
    /// Tasks of the first attempt that have not reported `Started` yet.
    not_started: BTreeSet<crate::checkpoint::TaskId>,
    /// A failure that ends the pipeline, raised where it could not be returned (see
    /// `execute_or_end`).
    fatal: Option<RunError>,
}

impl Supervisor {
    /// Builds the operators, opens checkpoint storage, chooses the restore and sets up the
    /// coordinator; spawns nothing yet.
    pub(super) fn new(
        plan: PipelinePlan,
        reports: Arc<Vec<NodeReport>>,
        control: Arc<Control>,
        recovery: &RecoveryOptions,
        workers: crate::runtime::workers::Workers,
        faults: Vec<(String, Arc<Fault>)>,
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
        clear_local_state(&plan);
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
        let spec = &plan.spec.checkpoints;
        let unaligned = (spec.unaligned && spec.mode == weir_schema::CheckpointMode::ExactlyOnce)
            .then(|| spec.aligned_timeout.get());
        let checkpointing = ck.as_ref().map(|ck| Checkpointing {
            store: Arc::clone(&ck.store),
            mode: ck.mode,
            unaligned,
        });
        let (events_tx, events) = mpsc::unbounded_channel();
        let plan = Arc::new(plan);
        Ok(Self {
            restart: RestartStrategy::from_spec(&plan.spec.effective_restart()),
            failover: plan.spec.failover,
            tasks: Tasks::new(
                Arc::clone(&plan),
                builders,
                reports,
                Arc::clone(&control),
                workers,
                faults,
                events_tx,
                checkpointing,
            ),
            checkpoints: Checkpoints::new(ck, coordinator),
            phase: Phase::Running,
            control,
            restarts: 0,
            failures: Failures::default(),
            restored_from: restored.as_ref().map(|r| r.metadata.checkpoint),
            initial_restore: restored,
            events,
            requests: None,
            status: SharedStatus::default(),
            all_started: None,
            not_started: BTreeSet::new(),
            fatal: None,
            plan,
        })
    }

    /// Connects the supervisor to the job; a probation watch puts it on probation.
    pub(super) fn linked(mut self, links: SupervisorLinks) -> Self {
        self.requests = Some(links.requests);
        self.status = links.status;
        self.all_started = links.start.all_started;
        self.tasks.handover = links.handover;
        if let Some(taps) = links.taps {
            self.tasks.taps = taps;
        }
        self.checkpoints.metrics = links.metrics;
        self.tasks.clock = links.clock;
        if let Some(verdict) = links.start.probation {
            let mut probation = Probation::new(verdict);
            if let Some(wait) = links.start.probation_idle_wait {
                probation.idle_wait = wait;
            }
            self.phase = Phase::Probation(probation);
        }
        self
    }

    /// Spawns every task, then runs the loop until the pipeline ends.
    pub(super) async fn run(&mut self) -> Result<()> {
        self.start()?;
        while !self.done() {
            let wake = [
                self.checkpoints
                    .coordinator
                    .as_ref()
                    .and_then(Coordinator::next_wakeup),
                self.phase.next_wakeup(self.tasks.aborting()),
            ]
            .into_iter()
            .flatten()
            .min();
            tokio::select! {
                biased;
                Some(event) = self.events.recv() => self.on_task_event(event),
                Some(internal) = self.checkpoints.internal_rx.recv() => self.on_internal(internal),
                () = self.control.stop_requested.notified(), if !self.phase.is_stopping() && self.checkpoints.coordinator.is_some() => {
                    self.begin_stop();
                }
                Some(request) = recv_request(&mut self.requests) => self.on_request(request),
                joined = self.tasks.join_next(), if self.tasks.any_spawned() => match joined {
                    Joined::Task(task, Ok(())) => self.on_task_finished(task),
                    Joined::Task(task, Err(e)) => self.on_task_failed(Some(task), e)?,
                    Joined::Other => {}
                },
                () = sleep_until(wake) => self.on_timer()?,
            }
            if let Some(e) = self.fatal.take() {
                return Err(e);
            }
            self.probation_due();
            self.restart_if_due()?;
        }
        self.finish().await
    }

    /// Spawns every task of the first attempt.
    fn start(&mut self) -> Result<()> {
        let all = self.tasks.all.clone();
        let restore = self.initial_restore.clone();
        self.tasks.channels.renew(&self.tasks.topology, &all);
        let restored_finished: BTreeSet<_> = restore
            .as_ref()
            .map(|r| r.metadata.finished_tasks.iter().copied().collect())
            .unwrap_or_default();
        self.not_started = all.difference(&restored_finished).copied().collect();
        for task in &all {
            self.tasks.spawn(*task, restore.clone())?;
        }
        self.publish(LiveState::Running);
        if self.not_started.is_empty() {
            self.on_all_started();
        }
        tracing::info!(
            pipeline = %self.plan.id,
            tasks = all.len(),
            restored_from = %Maybe::or(self.restored_from, "nothing (fresh start)"),
            "Pipeline started."
        );
        Ok(())
    }

    /// Whether the loop is over: nothing runs, nothing waits to restart or to be written,
    /// and every task is done (or was stopped on purpose).
    fn done(&self) -> bool {
        self.phase.pending_restart().is_none()
            && self.tasks.none_running()
            && self.checkpoints.savepoint_writes == 0
            && (matches!(self.phase, Phase::Halted { .. }) || self.tasks.all_done())
    }

    /// A timer went off: a stop's deadline, the coordinator's schedule.
    fn on_timer(&mut self) -> Result<()> {
        self.stop_deadline_passed();
        if let Some(c) = self.checkpoints.coordinator.as_mut() {
            let cmds = c.poll(Instant::now());
            self.execute(cmds)?;
        }
        Ok(())
    }

    /// The end of the run: late metadata writes settle, the answers still owed are sent, and
    /// a durable pipeline that ran to its end is marked finished.
    async fn finish(&mut self) -> Result<()> {
        // Let the last metadata writes and retention settle before reporting the end.
        self.drain_internal().await;
        self.checkpoints.settle().await;
        self.end_probation(Ok(()));
        for (_, w) in std::mem::take(&mut self.checkpoints.waiters) {
            w.fail(ControlError::Failed(format!(
                "pipeline `{}` ended before the checkpoint completed",
                self.plan.id
            )));
        }
        let stopping = self.phase.is_stopping();
        let (reply, halted) = match &mut self.phase {
            Phase::Halted { reply } => (reply.take(), true),
            Phase::Stopping(s) => (s.reply.take(), false),
            _ => (None, false),
        };
        if let Some(reply) = reply {
            let _ = reply.send(Ok(()));
        }
        if let Some(ck) = &self.checkpoints.setup
            && ck.durable
            && !self.control.stop.load(std::sync::atomic::Ordering::Relaxed)
            && !stopping
            && self.tasks.degraded.is_empty()
            && let Err(e) = ck.store.put(FINISHED_MARKER, b"finished\n")
        {
            tracing::warn!(pipeline = %self.plan.id, error = %e, "Cannot mark the run finished; the next run will resume from the last checkpoint.");
        }
        if halted {
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
            .checkpoints
            .coordinator
            .as_ref()
            .is_some_and(|c| !c.in_flight().is_empty())
            && Instant::now() < deadline
        {
            tokio::select! {
                Some(internal) = self.checkpoints.internal_rx.recv() => self.on_internal(internal),
                Some(event) = self.events.recv() => self.on_task_event(event),
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    // Nothing more will be acknowledged: every task ended.
                    break;
                }
            }
        }
    }

    fn on_task_event(&mut self, event: TaskEvent) {
        let cmds = match event {
            TaskEvent::Started { task } => {
                if self.not_started.remove(&task) && self.not_started.is_empty() {
                    self.on_all_started();
                }
                return;
            }
            TaskEvent::Produced => {
                self.on_produced();
                return;
            }
            TaskEvent::Ack {
                task,
                checkpoint,
                states,
                alignment,
            } => {
                let info = SubtaskCheckpointInfo {
                    task: self.tasks.task_name(task),
                    subtask: task.subtask,
                    size: states
                        .iter()
                        .flat_map(|s| s.files.iter())
                        .map(|f| f.size)
                        .sum(),
                    ack_ms: self.checkpoints.since_trigger_ms(checkpoint),
                    alignment_ms: alignment.as_millis() as u64,
                    channel_state_bytes: states
                        .iter()
                        .flat_map(|s| s.files.iter())
                        .filter(|f| is_channel_file(&f.path))
                        .map(|f| f.size)
                        .sum(),
                };
                self.checkpoints.acked(checkpoint, info);
                let Some(c) = self.checkpoints.coordinator.as_mut() else {
                    return;
                };
                match c.ack(checkpoint, task, states) {
                    Ok(cmds) => cmds,
                    Err(e) => {
                        tracing::warn!(pipeline = %self.plan.id, %task, checkpoint, error = %e, "Acknowledgement refused.");
                        Vec::new()
                    }
                }
            }
            TaskEvent::Decline {
                task,
                checkpoint,
                error,
            } => {
                let Some(c) = self.checkpoints.coordinator.as_mut() else {
                    return;
                };
                let reason = match error {
                    None => DeclineReason::Subsumed,
                    Some((class, e)) => {
                        self.checkpoints.failure_class = class;
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
            tracing::error!(pipeline = %self.plan.id, error = %OneLine(&e), "Checkpoint command failed; the pipeline ends.");
            self.halt_tasks();
            self.fatal.get_or_insert(e);
        }
    }

    fn on_internal(&mut self, internal: Internal) {
        let (id, result) = match internal {
            Internal::MetadataWritten(id, result) => (id, result),
            Internal::SavepointWritten { reply, result } => {
                self.checkpoints
                    .savepoint_written(&self.plan, reply, result);
                return;
            }
        };
        let Some(c) = self.checkpoints.coordinator.as_mut() else {
            return;
        };
        let cmds = match result {
            Ok(()) => c.metadata_written(id, Instant::now()),
            Err((class, e)) => {
                self.checkpoints.failure_class = class;
                c.metadata_failed(id, e)
            }
        };
        match cmds {
            Ok(cmds) => self.execute_or_end(cmds),
            Err(e) => tracing::warn!(pipeline = %self.plan.id, error = %e, "Checkpoint protocol."),
        }
    }

    fn on_task_finished(&mut self, task: crate::checkpoint::TaskId) {
        self.tasks.finished.insert(task);
        // A task told to stop did not reach the end of its input: recorded as finished, a
        // later checkpoint would hold no state for it and a resume would lose that state and
        // never read its source again.
        if self.tasks.stopped {
            return;
        }
        if let Some(c) = self.checkpoints.coordinator.as_mut() {
            let cmds = c.task_finished(task);
            self.execute_or_end(cmds);
        }
    }

    /// Carries out the coordinator's commands.
    pub(super) fn execute(&mut self, cmds: Vec<Command>) -> Result<()> {
        for cmd in cmds {
            match cmd {
                Command::Trigger(barrier) => self.inject(barrier),
                Command::WriteMetadata(meta) => self.checkpoints.write_metadata(&self.plan, *meta),
                Command::NotifyComplete(barrier) => self.on_checkpoint_completed(barrier),
                Command::Discard { checkpoint } => self.checkpoints.discard(checkpoint),
                Command::Abort { barrier, reason } => self.on_checkpoint_aborted(barrier, &reason),
                Command::Failover {
                    consecutive_failures,
                    last,
                } => {
                    let class = match last {
                        crate::checkpoint::coordinator::AbortReason::Timeout => ErrorClass::Io,
                        _ => self.checkpoints.failure_class,
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

    /// Sends `barrier` to every running source task.
    pub(super) fn inject(&mut self, barrier: Barrier) {
        self.checkpoints.triggered(barrier.checkpoint);
        self.tasks.inject(barrier);
    }

    /// Updates the live status.
    pub(super) fn publish(&self, state: LiveState) {
        if let Ok(mut st) = self.status.lock() {
            st.state = state;
            st.restarts = self.restarts;
            st.checkpoints = self.checkpoints.completed_count;
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

    /// The live state name the pipeline is in now (for a publish outside a transition).
    pub(super) fn status_state(&self) -> LiveState {
        self.status
            .lock()
            .map(|st| st.state)
            .unwrap_or(LiveState::Running)
    }

    /// Every task of the first attempt opened and restored.
    fn on_all_started(&mut self) {
        if let Some(tx) = self.all_started.take() {
            let _ = tx.send(Instant::now());
        }
        self.arm_probation();
    }
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

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
