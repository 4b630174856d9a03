//! The running job as a set of pipeline slots that can change while it runs: one slot per
//! pipeline of the running version of the file, each holding the current generation of the
//! pipeline (its supervisor's request channel, live status and metrics) and, once it ended,
//! its summary. The [`JobControl`] surface is implemented here; applying a hot reload is
//! `apply_reload`'s.
//!
//! Slots are guarded by one std mutex, never held across an await. Supervisors run on the
//! control runtime; the job only talks to them through their request channels.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, watch};

use super::pipeline::{
    AfterSavepoint, LiveState, LiveStatus, Request, SharedStatus, StartWatch, SupervisorLinks,
};
use super::{JobOptions, NodeSummary, PipelineSummary, RecoveryOptions, RenderFn, run_pipeline};
use crate::base::metrics::{NodeMetrics, NodeReport};
use crate::control::{
    BoxFuture, CheckpointInfo, ControlError, JobControl, JobStatus, OperatorStatus, PipelineStatus,
    ReloadOutcome, ReloadRequest, SavepointInfo, SavepointRequest, StopOutcome, StopRequest,
    SubtaskStatus, TapRequest, TapStream,
};
use crate::plan::{FilePlan, PipelinePlan, Role};
use crate::runtime::fault::Fault;
use crate::runtime::task::Control;

/// One pipeline of the running version.
pub(super) struct Slot {
    pub(super) plan: Arc<PipelinePlan>,
    pub(super) generation: u64,
    pub(super) requests: mpsc::UnboundedSender<Request>,
    pub(super) status: SharedStatus,
    pub(super) reports: Arc<Vec<NodeReport>>,
    pub(super) control: Arc<Control>,
    /// Its summary once the current generation ended.
    pub(super) ended: Option<PipelineSummary>,
    /// Stopped through the control surface.
    pub(super) stopped: bool,
    /// Being replaced by a reload: its end does not end the job.
    pub(super) reloading: bool,
    /// Removed from the file by a reload.
    pub(super) removed: bool,
}

/// What one launch reports when its supervisor ends.
pub(super) type Ended = oneshot::Receiver<Option<String>>;

/// The running job.
pub(super) struct Job {
    pub(super) file: Option<PathBuf>,
    pub(super) slots: Mutex<Vec<Slot>>,
    /// Bumped whenever a slot ends or changes; the job waits on it.
    pub(super) changes: watch::Sender<u64>,
    pub(super) generations: AtomicU64,
    pub(super) reloads: AtomicU64,
    pub(super) last_reload: Mutex<Option<ReloadOutcome>>,
    /// The latest reload attempts, oldest first (at most
    /// [`RELOAD_HISTORY_KEPT`](crate::control::RELOAD_HISTORY_KEPT)).
    pub(super) reload_history: Mutex<VecDeque<ReloadOutcome>>,
    pub(super) reload_lock: tokio::sync::Mutex<()>,
    pub(super) started: Instant,
    pub(super) workers: tokio::runtime::Handle,
    pub(super) faults: Vec<(String, String, Arc<Fault>)>,
    pub(super) render: Option<RenderFn>,
    pub(super) allow_non_restored_state: bool,
    pub(super) stop: Arc<std::sync::atomic::AtomicBool>,
    /// Keyed state handed from a reloaded pipeline's old version to its new one.
    pub(super) handover: Arc<crate::state::handover::Handover>,
    /// Savepoints this job took for reloads, oldest first, per pipeline (see
    /// [`RELOAD_SAVEPOINTS_KEPT`]).
    pub(super) reload_savepoints: Mutex<HashMap<String, VecDeque<PathBuf>>>,
    /// Savepoint requests may name any directory (`--allow-any-savepoint-dir`).
    pub(super) allow_any_savepoint_dir: bool,
    /// The file's `api:` section the control API was set up from (a reload that changes it
    /// is reported: the API keeps its settings until the next start).
    pub(super) api_spec: Option<weir_schema::ApiSpec>,
    /// Open taps by pipeline id: they outlive generations (see `tap`).
    pub(super) taps: Mutex<HashMap<String, Arc<crate::runtime::tap::TapRegistry>>>,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn reports_of(plan: &PipelinePlan) -> Arc<Vec<NodeReport>> {
    Arc::new(
        plan.nodes
            .iter()
            .map(|n| NodeReport {
                id: n.id.clone(),
                role: n.kind.role(),
                type_name: n.type_name(),
                parallelism: n.parallelism,
                metrics: Arc::new(NodeMetrics::new(n.parallelism)),
            })
            .collect(),
    )
}

fn node_summaries(reports: &[NodeReport]) -> Vec<NodeSummary> {
    reports
        .iter()
        .map(|r| {
            let (i, o, e) = r.metrics.read();
            NodeSummary {
                id: r.id.clone(),
                role: r.role,
                type_name: r.type_name,
                parallelism: r.parallelism,
                records_in: i,
                records_out: o,
                errors: e,
            }
        })
        .collect()
}

/// Savepoints of a pipeline's reloads kept on disk (the newest; older ones this job took
/// for reloads are deleted).
pub const RELOAD_SAVEPOINTS_KEPT: usize = 3;

impl Job {
    pub(super) fn new(
        options: &JobOptions,
        workers: tokio::runtime::Handle,
        started: Instant,
    ) -> Arc<Self> {
        let (changes, _) = watch::channel(0);
        Arc::new(Self {
            file: options
                .file
                .as_ref()
                .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone())),
            slots: Mutex::new(Vec::new()),
            changes,
            generations: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            last_reload: Mutex::new(None),
            reload_history: Mutex::default(),
            reload_lock: tokio::sync::Mutex::new(()),
            started,
            workers,
            faults: options.faults.clone(),
            render: options.render.clone(),
            allow_non_restored_state: options.recovery.allow_non_restored_state,
            stop: Arc::clone(&options.stop),
            handover: Arc::default(),
            reload_savepoints: Mutex::default(),
            allow_any_savepoint_dir: options.allow_any_savepoint_dir,
            api_spec: options.api_spec.clone(),
            taps: Mutex::default(),
        })
    }

    pub(super) fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn bump(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Starts (a new generation of) `plan`, replacing the slot of the same id or appending
    /// one. Returns the receiver of its end.
    pub(super) fn launch(
        self: &Arc<Self>,
        plan: PipelinePlan,
        recovery: RecoveryOptions,
        start: StartWatch,
    ) -> Ended {
        let plan = Arc::new(plan);
        let reports = reports_of(&plan);
        let control = Arc::new(Control::default());
        if self.stop.load(Ordering::Relaxed) {
            control.stop.store(true, Ordering::Relaxed);
        }
        let status: SharedStatus = Arc::new(Mutex::new(LiveStatus {
            state: LiveState::Starting,
            ..LiveStatus::default()
        }));
        let (requests_tx, requests_rx) = mpsc::unbounded_channel();
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut slots = self.slots();
            let slot = Slot {
                plan: Arc::clone(&plan),
                generation,
                requests: requests_tx,
                status: Arc::clone(&status),
                reports: Arc::clone(&reports),
                control: Arc::clone(&control),
                ended: None,
                stopped: false,
                reloading: false,
                removed: false,
            };
            match slots.iter_mut().position(|s| s.plan.id == plan.id) {
                Some(i) => {
                    let reloading = slots[i].reloading;
                    slots[i] = Slot { reloading, ..slot };
                }
                None => slots.push(slot),
            }
        }
        let faults: Vec<(String, Arc<Fault>)> = self
            .faults
            .iter()
            .filter(|(p, _, _)| *p == plan.id)
            .map(|(_, op, f)| (op.clone(), Arc::clone(f)))
            .collect();
        let links = SupervisorLinks {
            requests: requests_rx,
            status,
            start,
            handover: Some(Arc::clone(&self.handover)),
            taps: Some(self.tap_registry(&plan.id)),
        };
        let (ended_tx, ended_rx) = oneshot::channel();
        let job = Arc::clone(self);
        let started = self.started;
        let workers = self.workers.clone();
        tokio::spawn(async move {
            let id = plan.id.clone();
            let outcome = run_pipeline(
                (*plan).clone(),
                Arc::clone(&reports),
                control,
                started,
                recovery,
                faults,
                workers,
                links,
            )
            .await;
            let error = outcome.error.as_ref().map(ToString::to_string);
            let summary = PipelineSummary {
                id: id.clone(),
                nodes: node_summaries(&reports),
                error: outcome.error,
                wall: outcome.wall,
                first_output: outcome.first_output,
                first_record: outcome.first_record,
                restarts: outcome.restarts,
                checkpoints: outcome.checkpoints,
                restored_from: outcome.restored_from,
                degraded: outcome.degraded,
                checkpoint_stats: outcome.stats,
                all_processing: outcome.all_processing,
                reloads: 0,
            };
            {
                let mut slots = job.slots();
                if let Some(slot) = slots
                    .iter_mut()
                    .find(|s| s.plan.id == id && s.generation == generation)
                {
                    slot.ended = Some(summary);
                }
            }
            let _ = ended_tx.send(error);
            job.bump();
        });
        self.bump();
        ended_rx
    }

    /// Waits until every pipeline ended and no reload is in progress.
    pub(super) async fn wait(&self) {
        let mut rx = self.changes.subscribe();
        loop {
            let done = {
                let slots = self.slots();
                slots.iter().all(|s| s.ended.is_some() && !s.reloading)
            };
            if done {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Asks every running pipeline to stop (SIGINT/SIGTERM).
    pub(super) fn stop_all(&self) {
        for s in self.slots().iter() {
            s.control.stop.store(true, Ordering::Relaxed);
            s.control.stop_requested.notify_one();
        }
    }

    /// Summaries of the last generation of every pipeline, in file order.
    pub(super) fn summaries(&self) -> Vec<PipelineSummary> {
        let reloads = self.reloads.load(Ordering::Relaxed);
        let mut slots = self.slots();
        slots
            .iter_mut()
            .filter_map(|s| {
                s.ended.take().map(|mut p| {
                    p.reloads = reloads;
                    p
                })
            })
            .collect()
    }

    /// Every pipeline's progress (for status lines).
    pub(super) fn progress(&self) -> Vec<super::PipelineProgress> {
        self.slots()
            .iter()
            .filter(|s| !s.removed)
            .map(|s| super::PipelineProgress {
                id: s.plan.id.clone(),
                source_records: role_records(&s.reports, Role::Source),
                sink_records: role_records(&s.reports, Role::Sink),
                finished: s.ended.is_some(),
            })
            .collect()
    }

    /// The running version of the file.
    pub(super) fn file_plan(&self) -> FilePlan {
        FilePlan {
            pipelines: self
                .slots()
                .iter()
                .filter(|s| !s.removed)
                .map(|s| (*s.plan).clone())
                .collect(),
        }
    }

    pub(super) fn sender(
        &self,
        pipeline: &str,
    ) -> Result<mpsc::UnboundedSender<Request>, ControlError> {
        let slots = self.slots();
        let slot = slots
            .iter()
            .find(|s| s.plan.id == pipeline && !s.removed)
            .ok_or_else(|| ControlError::NoSuchPipeline(pipeline.to_owned()))?;
        if slot.ended.is_some() && !slot.reloading {
            return Err(ControlError::Invalid(format!(
                "pipeline `{pipeline}` is not running any more"
            )));
        }
        Ok(slot.requests.clone())
    }

    /// Sends a request and waits for its answer.
    pub(super) async fn ask<T>(
        &self,
        pipeline: &str,
        make: impl FnOnce(oneshot::Sender<Result<T, ControlError>>) -> Request,
    ) -> Result<T, ControlError> {
        let tx = self.sender(pipeline)?;
        let (reply_tx, reply_rx) = oneshot::channel();
        tx.send(make(reply_tx)).map_err(|_| {
            ControlError::Invalid(format!("pipeline `{pipeline}` is not running any more"))
        })?;
        reply_rx.await.map_err(|_| {
            ControlError::Failed(format!(
                "pipeline `{pipeline}` ended before answering the request"
            ))
        })?
    }

    /// Waits for the current generation of `pipeline` to end.
    pub(super) async fn wait_ended(&self, pipeline: &str) {
        let mut rx = self.changes.subscribe();
        loop {
            let ended = self
                .slots()
                .iter()
                .find(|s| s.plan.id == pipeline)
                .is_none_or(|s| s.ended.is_some());
            if ended || rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Whether the current generation of `pipeline` still runs.
    pub(super) fn is_running(&self, pipeline: &str) -> bool {
        self.slots()
            .iter()
            .any(|s| s.plan.id == pipeline && !s.removed && s.ended.is_none())
    }

    pub(super) fn set_slot(&self, pipeline: &str, f: impl FnOnce(&mut Slot)) {
        if let Some(s) = self.slots().iter_mut().find(|s| s.plan.id == pipeline) {
            f(s);
        }
        self.bump();
    }

    /// Stops one pipeline as asked.
    pub(super) async fn stop_pipeline(
        &self,
        pipeline: &str,
        request: StopRequest,
    ) -> Result<StopOutcome, ControlError> {
        let has_checkpoints = {
            let slots = self.slots();
            let slot = slots
                .iter()
                .find(|s| s.plan.id == pipeline && !s.removed)
                .ok_or_else(|| ControlError::NoSuchPipeline(pipeline.to_owned()))?;
            slot.plan.spec.checkpoints.enabled
        };
        let savepoint = if request.savepoint || (request.drain && has_checkpoints) {
            let after = if request.drain {
                AfterSavepoint::Drain
            } else {
                AfterSavepoint::Stop
            };
            let dir = request.dir.clone();
            let info = self
                .ask(pipeline, |reply| Request::Savepoint { dir, after, reply })
                .await?;
            Some(info)
        } else if request.drain {
            // No checkpoints: the sources stop and everything in flight drains.
            let slots = self.slots();
            if let Some(s) = slots.iter().find(|s| s.plan.id == pipeline) {
                s.control.stop.store(true, Ordering::Relaxed);
                s.control.stop_requested.notify_one();
            }
            None
        } else {
            self.ask(pipeline, Request::Stop).await?;
            None
        };
        self.set_slot(pipeline, |s| s.stopped = true);
        self.wait_ended(pipeline).await;
        Ok(StopOutcome {
            pipeline: pipeline.to_owned(),
            savepoint,
        })
    }

    /// The directory a savepoint request for `pipeline` names, resolved and confined to the
    /// pipeline's savepoint root (see [`super::confine`]); `None` when it names none.
    pub(super) fn requested_savepoint_dir(
        &self,
        pipeline: &str,
        dir: Option<&std::path::Path>,
    ) -> Result<Option<PathBuf>, ControlError> {
        let Some(dir) = dir else {
            return Ok(None);
        };
        let root = {
            let slots = self.slots();
            let slot = slots
                .iter()
                .find(|s| s.plan.id == pipeline && !s.removed)
                .ok_or_else(|| ControlError::NoSuchPipeline(pipeline.to_owned()))?;
            super::confine::savepoint_root(&slot.plan)
        };
        super::confine::savepoint_dir(pipeline, &root, dir, self.allow_any_savepoint_dir).map(Some)
    }

    /// The live state of a running pipeline.
    pub(super) fn live_state(&self, pipeline: &str) -> Option<LiveState> {
        let slots = self.slots();
        let slot = slots.iter().find(|s| s.plan.id == pipeline)?;
        if slot.ended.is_some() {
            return None;
        }
        slot.status.lock().ok().map(|l| l.state)
    }
}

fn role_records(reports: &[NodeReport], role: Role) -> u64 {
    reports
        .iter()
        .filter(|n| n.role == role)
        .map(|n| n.metrics.read().0)
        .sum()
}

/// Every node of `plan` with its figures per subtask, in plan order.
fn operator_statuses(plan: &PipelinePlan, reports: &[NodeReport]) -> Vec<OperatorStatus> {
    plan.nodes
        .iter()
        .zip(reports)
        .map(|(node, report)| {
            let mut inputs: Vec<String> = Vec::new();
            for e in plan.edges.iter().filter(|e| e.to == node.index) {
                let from = &plan.nodes[e.from.0].id;
                if !inputs.contains(from) {
                    inputs.push(from.clone());
                }
            }
            OperatorStatus {
                id: node.id.clone(),
                role: report.role.as_str().to_owned(),
                type_name: report.type_name.to_owned(),
                parallelism: node.parallelism,
                inputs,
                subtasks: report
                    .metrics
                    .subtasks
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        let (records_in, records_out, errors) = m.read();
                        SubtaskStatus {
                            subtask: i as u32,
                            records_in,
                            records_out,
                            errors,
                            ..SubtaskStatus::default()
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

impl JobControl for Arc<Job> {
    fn status(&self) -> JobStatus {
        let slots = self.slots();
        JobStatus {
            file: self.file.clone().unwrap_or_default(),
            pipelines: slots
                .iter()
                .filter(|s| !s.removed)
                .map(|s| {
                    let live = s.status.lock().map(|l| l.clone()).unwrap_or_default();
                    let (state, error) = match &s.ended {
                        Some(p) if p.error.is_some() => (
                            "failed".to_owned(),
                            p.error.as_ref().map(ToString::to_string),
                        ),
                        Some(_) if s.stopped => ("stopped".to_owned(), None),
                        Some(_) if s.reloading => ("reloading".to_owned(), None),
                        Some(_) => ("finished".to_owned(), None),
                        None if s.reloading => ("reloading".to_owned(), None),
                        None => (live.state.as_str().to_owned(), None),
                    };
                    PipelineStatus {
                        id: s.plan.id.clone(),
                        state,
                        source_records: role_records(&s.reports, Role::Source),
                        sink_records: role_records(&s.reports, Role::Sink),
                        restarts: live.restarts,
                        checkpoints: live.checkpoints,
                        latest_checkpoint: live.latest,
                        restored_from: live.restored_from,
                        error,
                        consecutive_failures: live.consecutive_failures,
                        failing: live.failing,
                        last_error: live.last_error,
                        operators: operator_statuses(&s.plan, &s.reports),
                    }
                })
                .collect(),
            reloads: self.reloads.load(Ordering::Relaxed),
            last_reload: self.last_reload.lock().ok().and_then(|l| l.clone()),
            reload_history: self
                .reload_history
                .lock()
                .map(|h| h.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }

    fn checkpoints(&self, pipeline: &str) -> Result<Vec<CheckpointInfo>, ControlError> {
        let slots = self.slots();
        let slot = slots
            .iter()
            .find(|s| s.plan.id == pipeline && !s.removed)
            .ok_or_else(|| ControlError::NoSuchPipeline(pipeline.to_owned()))?;
        Ok(slot
            .status
            .lock()
            .map(|l| l.history.iter().cloned().collect())
            .unwrap_or_default())
    }

    fn trigger_checkpoint(
        &self,
        pipeline: &str,
    ) -> BoxFuture<'_, Result<CheckpointInfo, ControlError>> {
        let pipeline = pipeline.to_owned();
        Box::pin(async move { self.ask(&pipeline, Request::Checkpoint).await })
    }

    fn savepoint(
        &self,
        pipeline: &str,
        request: SavepointRequest,
    ) -> BoxFuture<'_, Result<SavepointInfo, ControlError>> {
        let pipeline = pipeline.to_owned();
        Box::pin(async move {
            let dir = self.requested_savepoint_dir(&pipeline, request.dir.as_deref())?;
            self.ask(&pipeline, |reply| Request::Savepoint {
                dir,
                after: AfterSavepoint::Continue,
                reply,
            })
            .await
        })
    }

    fn stop(
        &self,
        pipeline: &str,
        request: StopRequest,
    ) -> BoxFuture<'_, Result<StopOutcome, ControlError>> {
        let pipeline = pipeline.to_owned();
        Box::pin(async move {
            let dir = self.requested_savepoint_dir(&pipeline, request.dir.as_deref())?;
            self.stop_pipeline(&pipeline, StopRequest { dir, ..request })
                .await
        })
    }

    fn reload(&self, request: ReloadRequest) -> BoxFuture<'_, Result<ReloadOutcome, ControlError>> {
        Box::pin(async move { self.do_reload(request).await })
    }

    fn tap(&self, pipeline: &str, request: TapRequest) -> Result<TapStream, ControlError> {
        self.open_tap(pipeline, request)
    }
}

/// How long the watcher waits for a burst of file events to settle.
pub(super) const WATCH_DEBOUNCE: Duration = Duration::from_millis(200);
