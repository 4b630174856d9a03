//! The running job as a set of pipeline slots that can change while it runs: one slot per
//! pipeline of the running version of the file, each holding the current generation of the
//! pipeline (its supervisor's request channel, live status and metrics) and, once it ended,
//! its summary. The [`JobControl`] surface is implemented here, and so is hot reload:
//! validate, diff, then per changed pipeline stop-with-savepoint → build the new version →
//! restore → resume on probation, and bring the old version back from the same savepoint when
//! the new one fails to start.
//!
//! Slots are guarded by one std mutex, never held across an await. Supervisors run on the
//! control runtime; the job only talks to them through their request channels.

use std::collections::{BTreeMap, HashMap, VecDeque};
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
    BoxFuture, CheckpointInfo, ControlError, JobControl, JobStatus, PipelineStatus, ReloadOutcome,
    ReloadRequest, SavepointInfo, SavepointRequest, StopOutcome, StopRequest,
};
use crate::plan::{FilePlan, PipelinePlan, Role};
use crate::reload::plan::{Change, PipelineDiff};
use crate::runtime::fault::Fault;
use crate::runtime::task::Control;

/// One pipeline of the running version.
struct Slot {
    plan: Arc<PipelinePlan>,
    generation: u64,
    requests: mpsc::UnboundedSender<Request>,
    status: SharedStatus,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    /// Its summary once the current generation ended.
    ended: Option<PipelineSummary>,
    /// Stopped through the control surface.
    stopped: bool,
    /// Being replaced by a reload: its end does not end the job.
    reloading: bool,
    /// Removed from the file by a reload.
    removed: bool,
}

/// What one launch reports when its supervisor ends.
type Ended = oneshot::Receiver<Option<String>>;

/// The running job.
pub(super) struct Job {
    file: Option<PathBuf>,
    slots: Mutex<Vec<Slot>>,
    /// Bumped whenever a slot ends or changes; the job waits on it.
    changes: watch::Sender<u64>,
    generations: AtomicU64,
    reloads: AtomicU64,
    last_reload: Mutex<Option<ReloadOutcome>>,
    reload_lock: tokio::sync::Mutex<()>,
    started: Instant,
    workers: tokio::runtime::Handle,
    faults: Vec<(String, String, Arc<Fault>)>,
    render: Option<RenderFn>,
    allow_non_restored_state: bool,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Keyed state handed from a reloaded pipeline's old version to its new one.
    handover: Arc<crate::state::handover::Handover>,
    /// Savepoints this job took for reloads, oldest first, per pipeline (see
    /// [`RELOAD_SAVEPOINTS_KEPT`]).
    reload_savepoints: Mutex<HashMap<String, VecDeque<PathBuf>>>,
    /// Savepoint requests may name any directory (`--allow-any-savepoint-dir`).
    allow_any_savepoint_dir: bool,
    /// The file's `api:` section the control API was set up from (a reload that changes it
    /// is reported: the API keeps its settings until the next start).
    api_spec: Option<weir_schema::ApiSpec>,
}

fn now_ms() -> u64 {
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
                metrics: Arc::new(NodeMetrics::default()),
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
        })
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
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
    fn file_plan(&self) -> FilePlan {
        FilePlan {
            pipelines: self
                .slots()
                .iter()
                .filter(|s| !s.removed)
                .map(|s| (*s.plan).clone())
                .collect(),
        }
    }

    fn sender(&self, pipeline: &str) -> Result<mpsc::UnboundedSender<Request>, ControlError> {
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
    async fn ask<T>(
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
    async fn wait_ended(&self, pipeline: &str) {
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
    fn is_running(&self, pipeline: &str) -> bool {
        self.slots()
            .iter()
            .any(|s| s.plan.id == pipeline && !s.removed && s.ended.is_none())
    }

    fn set_slot(&self, pipeline: &str, f: impl FnOnce(&mut Slot)) {
        if let Some(s) = self.slots().iter_mut().find(|s| s.plan.id == pipeline) {
            f(s);
        }
        self.bump();
    }

    /// Stops one pipeline as asked.
    async fn stop_pipeline(
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

    fn render(&self, validation: &crate::validate::Validation) -> Vec<String> {
        let diags: Vec<&weir_schema::Diagnostic> = validation.diagnostics.iter().collect();
        match &self.render {
            Some(r) => vec![r(&diags)],
            None => diags.iter().map(|d| d.to_string()).collect(),
        }
    }

    /// A note when the `api:` section of a reloaded file differs from the one the control API
    /// was set up from: the API is not rebound by a reload (its clients would lose it
    /// mid-call), so the change waits for the next start of `weir run`.
    fn api_change(&self, new: Option<&weir_schema::ApiSpec>) -> Option<String> {
        let (old, new) = (self.api_spec.as_ref()?, new?);
        if old == new {
            return None;
        }
        let show = |a: &weir_schema::ApiSpec| {
            format!(
                "enabled: {}, port: {}, token_env: {}",
                a.enabled,
                a.port,
                a.token_env.as_deref().unwrap_or("none")
            )
        };
        Some(format!(
            "the file's `api:` section changed ({} → {}); the control API keeps its current \
             settings until `weir run` restarts (and `weir run`'s --no-api, --api-port and \
             --api-token flags win over the file)",
            show(old),
            show(new)
        ))
    }

    /// Applies (or plans) a reload.
    async fn do_reload(
        self: &Arc<Self>,
        request: ReloadRequest,
    ) -> Result<ReloadOutcome, ControlError> {
        let running = self.file.clone().ok_or_else(|| {
            ControlError::Invalid(
                "this job was not started from a file, so it cannot reload".into(),
            )
        })?;
        if request.file.is_some() && !request.plan_only {
            return Err(ControlError::Invalid(
                "a reload applies the running file; another file can only be compared (plan_only)"
                    .into(),
            ));
        }
        let file = match &request.file {
            Some(f) => super::confine::reload_file(&running, f)?,
            None => running,
        };
        let _guard = self
            .reload_lock
            .try_lock()
            .map_err(|_| ControlError::Busy("a reload is already in progress".into()))?;
        let mut outcome = ReloadOutcome::default();
        let validation = {
            let file = file.clone();
            tokio::task::spawn_blocking(move || crate::validate::validate_file(&file))
                .await
                .map_err(|e| ControlError::Failed(format!("validation panicked: {e}")))?
        };
        let new_plan = match validation.plan() {
            Some(Ok(plan)) => plan,
            Some(Err(e)) => {
                outcome.messages = vec![format!("{}: {e}", file.display())];
                return Ok(self.finish_reload(outcome, ReloadResult::Rejected, request.plan_only));
            }
            None => {
                outcome.messages = self.render(&validation);
                outcome.messages.push(format!(
                    "{}: invalid; the running version is left untouched",
                    file.display()
                ));
                return Ok(self.finish_reload(outcome, ReloadResult::Rejected, request.plan_only));
            }
        };
        if let Some(note) = self.api_change(validation.spec.as_ref().map(|s| &s.api)) {
            tracing::warn!("{note}");
            outcome.messages.push(note);
        }
        let old_plan = self.file_plan();
        let allow_non_restored_state =
            request.allow_non_restored_state || self.allow_non_restored_state;
        let plans = crate::reload::plan::diff(&old_plan, &new_plan, allow_non_restored_state);
        outcome.pipelines = plans.iter().map(PipelineDiff::to_wire).collect();
        if request.plan_only {
            return Ok(self.finish_reload(outcome, ReloadResult::Planned, true));
        }
        if !crate::reload::plan::is_applicable(&plans) {
            outcome.messages = plans
                .iter()
                .flat_map(|p| {
                    p.problems()
                        .iter()
                        .map(move |m| format!("pipeline `{}`: {m}", p.pipeline))
                })
                .collect();
            outcome
                .messages
                .push("the running version is left untouched".into());
            return Ok(self.finish_reload(outcome, ReloadResult::Rejected, false));
        }
        if plans.iter().all(|p| p.change == Change::Unchanged) {
            return Ok(self.finish_reload(outcome, ReloadResult::Unchanged, false));
        }
        let by_id: BTreeMap<&str, &PipelinePlan> = new_plan
            .pipelines
            .iter()
            .map(|p| (p.id.as_str(), p))
            .collect();
        let mut result = ReloadResult::Applied;
        let mut pause: Option<u64> = None;
        for p in &plans {
            match &p.change {
                Change::Added => {
                    if let Some(plan) = by_id.get(p.pipeline.as_str()) {
                        tracing::info!(pipeline = %p.pipeline, "Reload: starting a new pipeline.");
                        drop(self.launch(
                            (*plan).clone(),
                            RecoveryOptions::default(),
                            StartWatch::default(),
                        ));
                    }
                }
                Change::Removed => {
                    // With checkpoints, stopped with a savepoint that keeps its state;
                    // without, a plain stop (a savepoint would be refused, and the pipeline
                    // would run on unseen).
                    let checkpoints = self
                        .slots()
                        .iter()
                        .find(|s| s.plan.id == p.pipeline && !s.removed)
                        .is_some_and(|s| s.plan.spec.checkpoints.enabled);
                    tracing::info!(pipeline = %p.pipeline, savepoint = checkpoints, "Reload: the pipeline is gone from the file; stopping it.");
                    let stopped = self
                        .stop_pipeline(
                            &p.pipeline,
                            StopRequest {
                                savepoint: checkpoints,
                                ..StopRequest::default()
                            },
                        )
                        .await;
                    match stopped {
                        Ok(StopOutcome {
                            savepoint: Some(sp),
                            ..
                        }) => outcome.messages.push(format!(
                            "pipeline `{}` removed; its state is in savepoint {}",
                            p.pipeline,
                            sp.path.display()
                        )),
                        Ok(StopOutcome {
                            savepoint: None, ..
                        }) => outcome.messages.push(format!(
                            "pipeline `{}` removed; it took no checkpoints, so no state was kept",
                            p.pipeline
                        )),
                        Err(e) if self.is_running(&p.pipeline) => {
                            // The savepoint failed: stop it anyway, it is gone from the file.
                            outcome.messages.push(format!(
                                "pipeline `{}` removed without a savepoint (it failed: {e})",
                                p.pipeline
                            ));
                            if let Err(e) = self
                                .stop_pipeline(&p.pipeline, StopRequest::default())
                                .await
                            {
                                outcome
                                    .messages
                                    .push(format!("pipeline `{}`: {e}", p.pipeline));
                            }
                        }
                        // It had ended already.
                        Err(_) => {}
                    }
                    self.set_slot(&p.pipeline, |s| s.removed = true);
                }
                Change::Changed(_) => {
                    let Some(new) = by_id.get(p.pipeline.as_str()) else {
                        continue;
                    };
                    match self
                        .replace(new, allow_non_restored_state, &mut outcome.messages)
                        .await
                    {
                        Ok(ms) => pause = Some(pause.map_or(ms, |p| p.max(ms))),
                        Err(e) => {
                            result = result.worse(e.into());
                            if e == ReplaceError::Failed {
                                break;
                            }
                        }
                    }
                }
                Change::Unchanged => {}
            }
        }
        outcome.pause_ms = pause;
        Ok(self.finish_reload(outcome, result, false))
    }

    /// Replaces one running pipeline by its new version: savepoint and stop, start the new
    /// version from the savepoint on probation; on failure start the old one again from the
    /// same savepoint. `Ok(pause ms)`, or how it did not apply.
    async fn replace(
        self: &Arc<Self>,
        new: &PipelinePlan,
        allow_non_restored_state: bool,
        messages: &mut Vec<String>,
    ) -> Result<u64, ReplaceError> {
        let id = new.id.clone();
        let old = {
            let slots = self.slots();
            match slots.iter().find(|s| s.plan.id == id) {
                Some(s) => Arc::clone(&s.plan),
                None => return Err(ReplaceError::Failed),
            }
        };
        self.set_slot(&id, |s| s.reloading = true);
        // The old version's state is handed over to the new one where it fits, and what is
        // left is freed after this reload, not during its pause.
        let _free_later = crate::base::dispose::hold();
        self.handover.expect(&id);
        let result = self
            .replace_inner(new, &old, allow_non_restored_state, messages)
            .await;
        self.handover.clear(&id);
        self.prune_reload_savepoints(&id);
        result
    }

    /// Deletes the savepoints of this pipeline's older reloads beyond the last
    /// [`RELOAD_SAVEPOINTS_KEPT`]. Only savepoints this job took for reloads: those taken
    /// with `weir savepoint` or `weir stop --savepoint`, or when a pipeline is removed from
    /// the file, are the user's and stay.
    fn prune_reload_savepoints(&self, pipeline: &str) {
        let old: Vec<PathBuf> = {
            let mut all = self
                .reload_savepoints
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(list) = all.get_mut(pipeline) else {
                return;
            };
            let excess = list.len().saturating_sub(RELOAD_SAVEPOINTS_KEPT);
            list.drain(..excess).collect()
        };
        for path in old {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(pipeline, path = %path.display(), kept = RELOAD_SAVEPOINTS_KEPT, "Removed the savepoint of an older reload.");
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(pipeline, path = %path.display(), error = %e, "Cannot remove the savepoint of an older reload; delete it by hand.");
                }
            }
        }
    }

    async fn replace_inner(
        self: &Arc<Self>,
        new: &PipelinePlan,
        old: &Arc<PipelinePlan>,
        allow_non_restored_state: bool,
        messages: &mut Vec<String>,
    ) -> Result<u64, ReplaceError> {
        let id = new.id.clone();
        let paused_at = Instant::now();
        let mut crash_looping = false;
        let savepoint = if old.spec.checkpoints.enabled {
            match self
                .ask(&id, |reply| Request::Savepoint {
                    dir: None,
                    after: AfterSavepoint::Stop,
                    reply,
                })
                .await
            {
                Ok(sp) => {
                    self.reload_savepoints
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(id.clone())
                        .or_default()
                        .push_back(sp.path.clone());
                    Some(sp)
                }
                Err(e) if self.live_state(&id) == Some(LiveState::Restarting) => {
                    // A crash-looping pipeline cannot take a savepoint, and editing its file
                    // is how it gets fixed: stop it, and start the new version from its latest
                    // completed checkpoint instead.
                    tracing::warn!(pipeline = %id, error = %e, "The pipeline is restarting after failures; the new version starts from its latest completed checkpoint.");
                    messages.push(format!(
                        "pipeline `{id}` was restarting after failures (no savepoint possible): the new version starts from its latest completed checkpoint"
                    ));
                    let _ = self.ask(&id, Request::Stop).await;
                    crash_looping = true;
                    None
                }
                Err(e) => {
                    // The old version goes on (a failed stop-savepoint resumes it).
                    self.set_slot(&id, |s| s.reloading = false);
                    messages.push(format!(
                        "pipeline `{id}`: the savepoint before the reload failed, the running version goes on: {e}"
                    ));
                    return Err(ReplaceError::Rejected);
                }
            }
        } else {
            messages.push(format!(
                "pipeline `{id}` takes no checkpoints: it restarts without its state"
            ));
            let _ = self.ask(&id, Request::Stop).await;
            None
        };
        self.wait_ended(&id).await;
        let recovery = RecoveryOptions {
            from_savepoint: savepoint.as_ref().map(|s| s.path.clone()),
            allow_non_restored_state,
            latest_into_new_version: crash_looping,
            ..RecoveryOptions::default()
        };
        let (started_tx, started_rx) = oneshot::channel();
        let (probation_tx, probation_rx) = oneshot::channel();
        let ended = self.launch(
            new.clone(),
            recovery.clone(),
            StartWatch {
                all_started: Some(started_tx),
                probation: Some(probation_tx),
            },
        );
        let verdict = probation_rx
            .await
            .unwrap_or_else(|_| Err("the new version ended before it started".into()));
        match verdict {
            Ok(()) => {
                let started_at = started_rx.await.unwrap_or_else(|_| Instant::now());
                let pause = started_at.saturating_duration_since(paused_at).as_millis() as u64;
                let handed = self.handover.taken(&id);
                tracing::info!(pipeline = %id, pause_ms = pause, handed_over = handed, savepoint = ?savepoint.as_ref().map(|s| s.path.display().to_string()), "Reload applied.");
                if handed > 0 {
                    messages.push(format!(
                        "pipeline `{id}`: the keyed state of {handed} subtask(s) was handed over in memory instead of being read back from the savepoint"
                    ));
                }
                self.set_slot(&id, |s| s.reloading = false);
                Ok(pause)
            }
            Err(why) => {
                tracing::error!(pipeline = %id, error = %why, "The new version failed to start; bringing the previous version back.");
                messages.push(format!(
                    "pipeline `{id}`: the new version failed to start: {why}"
                ));
                // The failed version stops by itself on probation; wait for its end.
                let _ = ended.await;
                let (probation_tx, probation_rx) = oneshot::channel();
                let _restarted = self.launch(
                    (**old).clone(),
                    RecoveryOptions {
                        allow_non_restored_state: true,
                        ..recovery
                    },
                    StartWatch {
                        all_started: None,
                        // A version that was crash-looping goes back to its restart strategy.
                        probation: (!crash_looping).then_some(probation_tx),
                    },
                );
                let back = if crash_looping {
                    Ok(())
                } else {
                    probation_rx.await.unwrap_or_else(|_| {
                        Err("the previous version ended before it started".into())
                    })
                };
                self.set_slot(&id, |s| s.reloading = false);
                match back {
                    Ok(()) => {
                        messages.push(if crash_looping {
                            format!("pipeline `{id}`: rolled back; the previous version runs again from its latest checkpoint")
                        } else {
                            format!("pipeline `{id}`: rolled back; the previous version runs again from the same savepoint")
                        });
                        Err(ReplaceError::RolledBack)
                    }
                    Err(e) => {
                        messages.push(format!(
                            "pipeline `{id}`: the previous version failed to come back too: {e}"
                        ));
                        Err(ReplaceError::Failed)
                    }
                }
            }
        }
    }

    /// The directory a savepoint request for `pipeline` names, resolved and confined to the
    /// pipeline's savepoint root (see [`super::confine`]); `None` when it names none.
    fn requested_savepoint_dir(
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
    fn live_state(&self, pipeline: &str) -> Option<LiveState> {
        let slots = self.slots();
        let slot = slots.iter().find(|s| s.plan.id == pipeline)?;
        if slot.ended.is_some() {
            return None;
        }
        slot.status.lock().ok().map(|l| l.state)
    }

    fn finish_reload(
        &self,
        mut outcome: ReloadOutcome,
        result: ReloadResult,
        plan_only: bool,
    ) -> ReloadOutcome {
        outcome.result = result.as_str().to_owned();
        outcome.at_ms = now_ms();
        if !plan_only {
            if result == ReloadResult::Applied {
                self.reloads.fetch_add(1, Ordering::Relaxed);
            }
            if let Ok(mut last) = self.last_reload.lock() {
                *last = Some(outcome.clone());
            }
        }
        outcome
    }
}

/// The result of a reload. The order ranks how bad a pipeline's result is: the overall
/// result is the worst (`failed`, then `rolled_back`, then `rejected`, then `applied`), so that
/// a pipeline reloaded later in the same file never hides an earlier pipeline's rollback or
/// failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ReloadResult {
    /// Only compared (`plan_only`).
    Planned,
    /// Nothing changed.
    Unchanged,
    /// Every change applied.
    Applied,
    /// Nothing changed: the file or the plan was refused, or a savepoint failed.
    Rejected,
    /// A new version failed to start; the previous one runs again.
    RolledBack,
    /// The previous version did not come back either.
    Failed,
}

impl ReloadResult {
    /// The worse of `self` and `other`.
    fn worse(self, other: Self) -> Self {
        self.max(other)
    }

    /// The wire form ([`ReloadOutcome::result`]).
    fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Planned => "planned",
            ReloadResult::Unchanged => "unchanged",
            ReloadResult::Applied => "applied",
            ReloadResult::Rejected => "rejected",
            ReloadResult::RolledBack => "rolled_back",
            ReloadResult::Failed => "failed",
        }
    }
}

/// How the replacement of one pipeline by its new version did not apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplaceError {
    /// The savepoint before it failed: the running version goes on.
    Rejected,
    /// The new version failed to start: the previous one runs again.
    RolledBack,
    /// The previous version did not come back either (or was gone).
    Failed,
}

impl From<ReplaceError> for ReloadResult {
    fn from(e: ReplaceError) -> Self {
        match e {
            ReplaceError::Rejected => ReloadResult::Rejected,
            ReplaceError::RolledBack => ReloadResult::RolledBack,
            ReplaceError::Failed => ReloadResult::Failed,
        }
    }
}

fn role_records(reports: &[NodeReport], role: Role) -> u64 {
    reports
        .iter()
        .filter(|n| n.role == role)
        .map(|n| n.metrics.read().0)
        .sum()
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
                    }
                })
                .collect(),
            reloads: self.reloads.load(Ordering::Relaxed),
            last_reload: self.last_reload.lock().ok().and_then(|l| l.clone()),
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
}

/// How long the watcher waits for a burst of file events to settle.
pub(super) const WATCH_DEBOUNCE: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::ReloadResult::{Applied, Failed, Rejected, RolledBack};

    #[test]
    fn the_worst_pipeline_result_is_the_reload_result() {
        assert_eq!(Applied.worse(Rejected), Rejected);
        assert_eq!(Applied.worse(RolledBack), RolledBack);
        // A pipeline rejected after another one rolled back does not hide the rollback.
        assert_eq!(RolledBack.worse(Rejected), RolledBack);
        assert_eq!(Rejected.worse(RolledBack), RolledBack);
        assert_eq!(RolledBack.worse(Failed), Failed);
        assert_eq!(Failed.worse(Rejected), Failed);
        assert_eq!(Failed.as_str(), "failed");
        assert_eq!(RolledBack.as_str(), "rolled_back");
    }
}
