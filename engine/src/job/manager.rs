//! The running job as a set of pipeline slots that can change while it runs: one slot per
//! pipeline of the running version of the file, each holding the current generation of the
//! pipeline (its supervisor's request channel and live status) and, once it ended, its
//! summary; and, per pipeline id, the metrics store every generation counts into (so the
//! status, `/metrics` and the summaries cover the whole run). The [`JobControl`] surface is
//! implemented here; applying a hot reload is `apply_reload`'s.
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
use crate::base::metrics::{NodeReport, PipelineMetrics};
use crate::control::{
    BoxFuture, CheckpointInfo, ControlError, JobControl, JobStatus, LastCheckpointStatus,
    OperatorStatus, PipelineStatus, ReloadOutcome, ReloadRequest, SavepointInfo, SavepointRequest,
    StateSizeStatus, StopOutcome, StopRequest, SubtaskAlignment, SubtaskStatus, TapRequest,
    TapStream,
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
    pub(super) control: Arc<Control>,
    /// How the current generation ended, once it did. It stays after the job collected
    /// `summary` at its own end, so that a stop waiting for this end, the status and taps
    /// still see it.
    pub(super) ended: Option<SlotEnd>,
    /// The current generation's summary once it ended, until [`Job::summaries`] takes it.
    pub(super) summary: Option<PipelineSummary>,
    /// Stopped through the control surface.
    pub(super) stopped: bool,
    /// Being replaced by a reload: its end does not end the job.
    pub(super) reloading: bool,
    /// Removed from the file by a reload.
    pub(super) removed: bool,
}

/// How a generation of a pipeline ended, as the control surface reports it.
#[derive(Clone, Debug)]
pub(super) struct SlotEnd {
    /// Why it failed; `None` when it finished.
    pub(super) error: Option<String>,
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
    pub(super) workers: crate::runtime::workers::Workers,
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
    /// Per pipeline id, its figures over every generation (reloads) and restart.
    pub(super) metrics: Mutex<HashMap<String, Arc<PipelineMetrics>>>,
    /// Per pipeline id, what the summaries of its ended generations carry on.
    earlier: Mutex<HashMap<String, Earlier>>,
    /// Whether the optional per-batch figures are measured.
    detailed_metrics: bool,
    /// Processing time for every pipeline (manual under `weir test`).
    pub(super) clock: crate::base::clock::Clock,
    /// Reloads that did not apply (applied ones are `reloads`), and the last pause.
    pub(super) reload_counts: ReloadCounts,
}

/// Reloads by result, besides the applied ones.
#[derive(Debug, Default)]
pub(super) struct ReloadCounts {
    pub(super) rejected: AtomicU64,
    pub(super) rolled_back: AtomicU64,
    pub(super) failed: AtomicU64,
    /// The pause of the last reload that paused a pipeline, milliseconds (`u64::MAX`: none).
    pub(super) last_pause_ms: AtomicU64,
}

/// What the summary of a pipeline's last generation takes from its earlier ones.
#[derive(Default)]
struct Earlier {
    /// Statistics of every checkpoint completed so far.
    stats: Vec<super::CheckpointStats>,
    /// The checkpoint the first generation resumed from.
    restored_from: Option<Option<u64>>,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The reports of `plan`'s nodes, their counters taken from the pipeline's `store`.
fn reports_of(plan: &PipelinePlan, store: &PipelineMetrics) -> Arc<Vec<NodeReport>> {
    Arc::new(
        plan.nodes
            .iter()
            .map(|n| NodeReport {
                id: n.id.clone(),
                role: n.kind.role(),
                type_name: n.type_name(),
                parallelism: n.parallelism,
                metrics: store.node(&n.id, n.parallelism),
            })
            .collect(),
    )
}

/// Each node's totals over every generation and every subtask that ever ran.
fn node_summaries(reports: &[NodeReport], store: &PipelineMetrics) -> Vec<NodeSummary> {
    reports
        .iter()
        .map(|r| {
            let (i, o, e) = store.totals(&r.id);
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
        workers: crate::runtime::workers::Workers,
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
            metrics: Mutex::default(),
            earlier: Mutex::default(),
            detailed_metrics: !options.no_metrics,
            clock: options.clock.clone(),
            reload_counts: ReloadCounts {
                last_pause_ms: AtomicU64::new(u64::MAX),
                ..ReloadCounts::default()
            },
        })
    }

    /// The figures of pipeline `id` over the whole run (created on first use).
    pub(super) fn pipeline_metrics(&self, id: &str) -> Arc<PipelineMetrics> {
        let mut all = self
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(
            all.entry(id.to_owned())
                .or_insert_with(|| Arc::new(PipelineMetrics::new(self.detailed_metrics))),
        )
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
        let store = self.pipeline_metrics(&plan.id);
        let reports = reports_of(&plan, &store);
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
                control: Arc::clone(&control),
                ended: None,
                summary: None,
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
            metrics: Arc::clone(&store),
            clock: self.clock.clone(),
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
            let (checkpoint_stats, restored_from) = {
                let mut earlier = job
                    .earlier
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let e = earlier.entry(id.clone()).or_default();
                e.stats.extend(outcome.stats);
                let first = *e.restored_from.get_or_insert(outcome.restored_from);
                (e.stats.clone(), first)
            };
            let summary = PipelineSummary {
                id: id.clone(),
                nodes: node_summaries(&reports, &store),
                error: outcome.error,
                wall: outcome.wall,
                first_output: outcome.first_output,
                first_record: outcome.first_record,
                restarts: store.restarts.load(Ordering::Relaxed) as u32,
                checkpoints: store.checkpoints().completed,
                restored_from,
                degraded: outcome.degraded,
                checkpoint_stats,
                all_processing: outcome.all_processing,
                reloads: 0,
            };
            {
                let mut slots = job.slots();
                if let Some(slot) = slots
                    .iter_mut()
                    .find(|s| s.plan.id == id && s.generation == generation)
                {
                    slot.ended = Some(SlotEnd {
                        error: error.clone(),
                    });
                    slot.summary = Some(summary);
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
                s.summary.take().map(|mut p| {
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
                source_records: role_records(
                    &s.plan,
                    &self.pipeline_metrics(&s.plan.id),
                    Role::Source,
                ),
                sink_records: role_records(&s.plan, &self.pipeline_metrics(&s.plan.id), Role::Sink),
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

/// Records into the nodes of `role` over the whole run.
fn role_records(plan: &PipelinePlan, store: &PipelineMetrics, role: Role) -> u64 {
    plan.nodes
        .iter()
        .filter(|n| n.kind.role() == role)
        .map(|n| store.totals(&n.id).0)
        .sum()
}

/// Every node of `plan` with its figures per subtask (every generation), in plan order.
fn operator_statuses(plan: &PipelinePlan, store: &PipelineMetrics) -> Vec<OperatorStatus> {
    plan.nodes
        .iter()
        .map(|node| {
            let mut inputs: Vec<String> = Vec::new();
            for e in plan.edges.iter().filter(|e| e.to == node.index) {
                let from = &plan.nodes[e.from.0].id;
                if !inputs.contains(from) {
                    inputs.push(from.clone());
                }
            }
            OperatorStatus {
                id: node.id.clone(),
                role: node.kind.role().as_str().to_owned(),
                type_name: node.type_name().to_owned(),
                parallelism: node.parallelism,
                inputs,
                subtasks: store
                    .subtasks(&node.id)
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        let f = m.figures();
                        SubtaskStatus {
                            subtask: i as u32,
                            records_in: f.records_in,
                            records_out: f.records_out,
                            errors: f.errors,
                            skipped: f.skipped,
                            dead_lettered: f.dead_lettered,
                            late_dropped: f.late_dropped,
                            late_sent: f.late_sent,
                            bytes_read: f.bytes_read,
                            busy_ms: f.busy.as_millis() as u64,
                            backpressured_ms: f.backpressured.as_millis() as u64,
                            queue_fill: f.queue_fill,
                            lag: f.lag,
                            partitions: f.partitions,
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The checkpoint and state figures of `store` for the status.
fn checkpoint_status(
    store: &PipelineMetrics,
) -> (
    u64,
    u64,
    u64,
    Option<LastCheckpointStatus>,
    Vec<StateSizeStatus>,
) {
    let c = store.checkpoints();
    let last = c.last.map(|l| LastCheckpointStatus {
        id: l.id,
        duration_ms: l.duration.as_millis() as u64,
        size: l.size,
        new_bytes: l.new_bytes,
        alignment: c
            .alignment
            .iter()
            .map(|(task, subtask, d)| SubtaskAlignment {
                task: task.clone(),
                subtask: *subtask,
                alignment_ms: d.as_millis() as u64,
            })
            .collect(),
        channel_state_bytes: l.channel_state_bytes,
    });
    let sizes = store
        .state_sizes()
        .into_iter()
        .map(|s| StateSizeStatus {
            operator: s.operator,
            backend: s.backend,
            bytes: s.bytes,
        })
        .collect();
    (c.completed, c.failed, c.in_progress, last, sizes)
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
                        Some(end) if end.error.is_some() => {
                            ("failed".to_owned(), end.error.clone())
                        }
                        Some(_) if s.stopped => ("stopped".to_owned(), None),
                        Some(_) if s.reloading => ("reloading".to_owned(), None),
                        Some(_) => ("finished".to_owned(), None),
                        None if s.reloading => ("reloading".to_owned(), None),
                        None => (live.state.as_str().to_owned(), None),
                    };
                    let store = self.pipeline_metrics(&s.plan.id);
                    let (completed, failed, in_progress, last_checkpoint, state_sizes) =
                        checkpoint_status(&store);
                    PipelineStatus {
                        id: s.plan.id.clone(),
                        state,
                        source_records: role_records(&s.plan, &store, Role::Source),
                        sink_records: role_records(&s.plan, &store, Role::Sink),
                        restarts: store.restarts.load(Ordering::Relaxed) as u32,
                        checkpoints: completed,
                        latest_checkpoint: live.latest,
                        restored_from: live.restored_from,
                        error,
                        consecutive_failures: live.consecutive_failures,
                        failing: live.failing,
                        last_error: live.last_error,
                        operators: operator_statuses(&s.plan, &store),
                        checkpoints_failed: failed,
                        checkpoints_in_progress: in_progress,
                        last_checkpoint,
                        state_sizes,
                    }
                })
                .collect(),
            reloads: self.reloads.load(Ordering::Relaxed),
            last_reload: self.last_reload.lock().ok().and_then(|l| l.clone()),
            reloads_rejected: self.reload_counts.rejected.load(Ordering::Relaxed),
            reloads_rolled_back: self.reload_counts.rolled_back.load(Ordering::Relaxed),
            reloads_failed: self.reload_counts.failed.load(Ordering::Relaxed),
            last_reload_pause_ms: Some(self.reload_counts.last_pause_ms.load(Ordering::Relaxed))
                .filter(|&ms| ms != u64::MAX),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::control::StopRequest;
    use crate::job::{JobOptions, run_async_observed};

    /// A pipeline's end stays visible after the job collected its summary at its own end. A
    /// stop waits for the end of the pipeline it stops; when the job's end took the summary
    /// first (the last pipeline ended while the stop's answer was on its way), the stop waited
    /// for ever. `weir test` hung in a savepoint step when the job won that race.
    #[test]
    fn a_stop_after_the_job_ended_does_not_wait_for_ever() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let yaml = format!(
            "version: 1\npipelines:\n  - id: p\n    sources:\n      - {{type: generator, id: g, \
             count: 3, fields: {{n: {{kind: int, min: 1, max: 9}}}}}}\n    sinks:\n      - {{type: \
             file, id: out, input: g, format: jsonl, path: '{}'}}\n",
            dir.path().join("out").display()
        );
        let validation = crate::validate::validate_str("p.yaml", &yaml, dir.path());
        let plan = validation
            .plan()
            .expect("the file validates")
            .expect("the plan compiles");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let (ready, job) = tokio::sync::oneshot::channel();
            let workers = tokio::runtime::Handle::current().into();
            let run = tokio::spawn(run_async_observed(
                plan,
                JobOptions::default(),
                workers,
                Some(ready),
            ));
            let job = job.await.expect("the job's control surface");
            let summary = run.await.expect("the job ran").expect("the job succeeded");
            assert_eq!(summary.pipelines.len(), 1);
            let stop = job.stop(
                "p",
                StopRequest {
                    savepoint: false,
                    drain: true,
                    dir: None,
                },
            );
            let stopped = tokio::time::timeout(Duration::from_secs(60), stop).await;
            assert!(
                stopped.is_ok(),
                "the stop waited for an end that had already happened"
            );
            let state = job.status().pipelines[0].state.clone();
            assert!(state == "stopped" || state == "finished", "{state}");
        });
    }
}
