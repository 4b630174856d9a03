//! Running a [`FilePlan`]: every pipeline at once on one pool of worker threads
//! ([`crate::runtime::workers`]), each pipeline's chains spawned as one task per subtask and
//! wired with bounded channels; then a
//! [`JobSummary`] per operator (records in/out, errors), wall time and throughput.
//!
//! Each pipeline runs under its own supervisor (`pipeline`), which takes checkpoints and
//! applies the restart and failover strategies; a pipeline that fails for good never stops
//! the others.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::base::error::{Result, RunError};
use crate::base::human::{Elapsed, OneLine};
use crate::base::metrics::{NodeReport, PipelineMetrics};
use crate::plan::{FilePlan, PipelinePlan, Role};
use crate::runtime::fault::Fault;
use crate::runtime::task::Control;
use crate::runtime::workers::{WorkerPool, Workers};

mod apply_reload;
mod confine;
mod manager;
mod pipeline;
mod tap;
mod wiring;

pub use pipeline::{CheckpointStats, RecoveryOptions};

/// Live progress of one pipeline, for status lines.
#[derive(Clone, Debug)]
pub struct PipelineProgress {
    /// Pipeline id.
    pub id: String,
    /// Records produced by its sources so far.
    pub source_records: u64,
    /// Records written by its sinks so far.
    pub sink_records: u64,
    /// Whether it has finished.
    pub finished: bool,
}

/// Called periodically with every pipeline's progress.
pub type ProgressFn = Arc<dyn Fn(&[PipelineProgress], Duration) + Send + Sync>;

/// How to run a job.
#[derive(Clone, Default)]
pub struct JobOptions {
    /// Set to stop every pipeline cleanly (sources stop, operators drain, sinks flush).
    pub stop: Arc<AtomicBool>,
    /// Also stop on SIGINT/SIGTERM.
    pub handle_signals: bool,
    /// Progress callback (about every 250 ms).
    pub progress: Option<ProgressFn>,
    /// Worker threads the tasks are placed on (default: one per core).
    pub worker_threads: Option<usize>,
    /// The instant times are measured from (default: when the job starts), e.g. the
    /// process start so that validation counts in the time to first record.
    pub started: Option<Instant>,
    /// Where pipelines with checkpoints start from.
    pub recovery: RecoveryOptions,
    /// Faults to inject (recovery tests): `(pipeline id, operator id, fault)`.
    pub faults: Vec<(String, String, Arc<Fault>)>,
    /// The pipeline file the plan came from (reloads re-read it).
    pub file: Option<PathBuf>,
    /// Watch `file` and every script it references; reload on changes.
    pub watch: bool,
    /// Serve the control API. When its address is taken the job does not start.
    pub api: Option<crate::api::ApiConfig>,
    /// The file's `api:` section the API settings came from; a reload that changes it says
    /// that the change waits for the next start.
    pub api_spec: Option<weir_schema::ApiSpec>,
    /// Let savepoint requests name any directory instead of one under the pipeline's
    /// `savepoints.dir` (`weir run --allow-any-savepoint-dir`).
    pub allow_any_savepoint_dir: bool,
    /// Called with the API's address once it listens.
    pub api_ready: Option<Arc<dyn Fn(std::net::SocketAddr) + Send + Sync>>,
    /// Renders validation diagnostics for reload reports (the CLI's miette rendering).
    pub render: Option<RenderFn>,
    /// Savepoints to start pipelines from: `(pipeline id, savepoint directory)`.
    pub from_savepoints: Vec<(String, PathBuf)>,
    /// Skip the optional per-batch measurements (busy and backpressured time, input queue
    /// fill, source lag; `weir run --no-metrics`). Record counts are always kept.
    pub no_metrics: bool,
    /// Where processing time comes from: the system clock, or a manual one that `weir test`
    /// moves with its `advance_time` steps.
    pub clock: crate::base::clock::Clock,
}

/// Renders diagnostics as text.
pub type RenderFn = Arc<dyn Fn(&[&weir_schema::Diagnostic]) -> String + Send + Sync>;

/// One node's totals.
#[derive(Clone, Debug)]
pub struct NodeSummary {
    /// Element id.
    pub id: String,
    /// Source, operator or sink.
    pub role: Role,
    /// The `type:`.
    pub type_name: &'static str,
    /// Parallelism.
    pub parallelism: u32,
    /// Records in (a source: produced).
    pub records_in: u64,
    /// Records out (sinks: 0).
    pub records_out: u64,
    /// Records failed and skipped or dead-lettered (a source: skipped lines).
    pub errors: u64,
}

/// One pipeline's outcome.
#[derive(Debug)]
pub struct PipelineSummary {
    /// Pipeline id.
    pub id: String,
    /// Per node, in plan order.
    pub nodes: Vec<NodeSummary>,
    /// Why it failed, if it did.
    pub error: Option<RunError>,
    /// Wall time from start to its last task's end.
    pub wall: Duration,
    /// Time from the job's start until the first record reached a sink, if any did.
    pub first_output: Option<Duration>,
    /// Time from the job's start until a source produced its first record.
    pub first_record: Option<Duration>,
    /// Restarts after failures.
    pub restarts: u32,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// The checkpoint the run resumed from.
    pub restored_from: Option<u64>,
    /// Tasks left down by failover `noop`.
    pub degraded: usize,
    /// Figures of every completed checkpoint.
    pub checkpoint_stats: Vec<CheckpointStats>,
    /// Time from the job's start until every operator had processed a record (after a
    /// restore: until processing was going again everywhere).
    pub all_processing: Option<Duration>,
    /// Reloads the job applied.
    pub reloads: u64,
}

impl PipelineSummary {
    /// Records produced by the sources.
    pub fn source_records(&self) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::Source)
            .map(|n| n.records_in)
            .sum()
    }

    /// Source records per second of wall time.
    pub fn throughput(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.source_records() as f64 / secs
        } else {
            0.0
        }
    }
}

/// The outcome of a whole run.
#[derive(Debug)]
pub struct JobSummary {
    /// Per pipeline, in file order.
    pub pipelines: Vec<PipelineSummary>,
    /// Wall time of the whole job.
    pub wall: Duration,
}

impl JobSummary {
    /// Whether every pipeline finished without error.
    pub fn is_ok(&self) -> bool {
        self.pipelines.iter().all(|p| p.error.is_none())
    }
}

/// Runs every pipeline of `plan` to completion (or until stopped) on a new tokio runtime.
///
/// # Errors
/// When the runtime cannot start, or the control API cannot listen ([`RunError::Api`]: no
/// pipeline started); pipeline failures are reported in the summary.
pub fn run(plan: FilePlan, options: JobOptions) -> Result<JobSummary> {
    // One thread per core unless told otherwise, each task placed on one of them for good
    // (see `runtime::workers`). Scripts run on the workers and recurse on their stack: size
    // it for what `limits:` allows (tokio's default of 2 MiB is too small; see
    // `SCRIPT_STACK_SIZE`). Only the pages a thread touches take memory.
    let threads = options.worker_threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let pool = WorkerPool::start(threads, crate::script::SCRIPT_STACK_SIZE)?;
    // The control plane (supervisors, checkpoint timers, progress, the API) runs on its own
    // thread, so that checkpoints trigger on time however busy the workers are.
    let control = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("weir-control")
        .thread_stack_size(crate::script::SCRIPT_STACK_SIZE)
        .build()
    {
        Ok(control) => control,
        Err(e) => {
            pool.shutdown();
            return Err(RunError::Internal(format!(
                "cannot start the control runtime: {e}"
            )));
        }
    };
    let summary = control.block_on(run_async(plan, options, Workers::Pool(Arc::clone(&pool))));
    drop(control);
    pool.shutdown();
    crate::base::dispose::wait_disposed();
    summary
}

/// Runs every pipeline of `plan` concurrently: supervisors on the current tokio runtime,
/// tasks on `workers`; serves the control API and watches the file when asked to.
///
/// # Errors
/// When the control API cannot listen or the file watcher cannot start.
pub async fn run_async(
    plan: FilePlan,
    options: JobOptions,
    workers: Workers,
) -> Result<JobSummary> {
    run_async_observed(plan, options, workers, None).await
}

/// As [`run_async`], handing the job's control surface to `ready` as soon as the job exists
/// (before any pipeline starts): how `testing` drives a job with checkpoints, savepoints and
/// reloads between its inputs.
pub(crate) async fn run_async_observed(
    plan: FilePlan,
    options: JobOptions,
    workers: Workers,
    ready: Option<tokio::sync::oneshot::Sender<Arc<dyn crate::control::JobControl>>>,
) -> Result<JobSummary> {
    let started = options.started.unwrap_or_else(Instant::now);
    let job = manager::Job::new(&options, workers, started);
    if let Some(ready) = ready {
        let control: Arc<dyn crate::control::JobControl> = Arc::new(Arc::clone(&job));
        let _ = ready.send(control);
    }
    let api = match &options.api {
        Some(config) => {
            let control: Arc<dyn crate::control::JobControl> = Arc::new(Arc::clone(&job));
            match crate::api::serve(control, config.clone()).await {
                Ok(server) => {
                    let addr = server.local_addr();
                    // One start-up line: the caller's (`weir run` prints where it listens), or
                    // this one.
                    match &options.api_ready {
                        Some(cb) => cb(addr),
                        None => tracing::info!(%addr, "Control API listening on http://{addr}."),
                    }
                    Some(server)
                }
                Err(e) => return Err(RunError::Api(e)),
            }
        }
        None => None,
    };
    if options.handle_signals {
        spawn_signal_watch(Arc::clone(&options.stop));
    }
    {
        let stop = Arc::clone(&options.stop);
        let job = Arc::clone(&job);
        tokio::spawn(async move {
            loop {
                if stop.load(Ordering::Relaxed) {
                    job.stop_all();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    let watcher = match (&options.file, options.watch) {
        (Some(file), true) => Some(spawn_watch(&job, file)?),
        _ => None,
    };
    for pipeline in plan.pipelines {
        let mut recovery = options.recovery.clone();
        if let Some((_, path)) = options
            .from_savepoints
            .iter()
            .find(|(id, _)| *id == pipeline.id)
        {
            recovery.from_savepoint = Some(path.clone());
        }
        drop(job.launch(pipeline, recovery, pipeline::StartWatch::default()));
    }
    let progress_task = options.progress.clone().map(|cb| {
        let job = Arc::clone(&job);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                cb(&job.progress(), started.elapsed());
            }
        })
    });
    job.wait().await;
    if let Some(t) = progress_task {
        t.abort();
    }
    if let Some(w) = watcher {
        w.abort();
    }
    if let Some(server) = api {
        // Answer the calls still in flight (a `weir stop` of the last pipeline waits for
        // its end, which is this end) before the runtime goes away.
        server.shutdown().await;
    }
    Ok(JobSummary {
        pipelines: job.summaries(),
        wall: started.elapsed(),
    })
}

/// Watches the pipeline file and its scripts; reloads on every change.
fn spawn_watch(
    job: &Arc<manager::Job>,
    file: &std::path::Path,
) -> Result<tokio::task::JoinHandle<()>> {
    use crate::control::JobControl;
    let files = watched_files(file).unwrap_or_else(|| vec![file.to_path_buf()]);
    let (mut watcher, mut changes) =
        crate::reload::watch::FileWatcher::new(&files, manager::WATCH_DEBOUNCE)
            .map_err(|e| RunError::Internal(e.to_string()))?;
    tracing::info!(files = %paths(&files), "Watching the pipeline file for changes (hot reload).");
    let job = Arc::clone(job);
    let file = file.to_path_buf();
    Ok(tokio::spawn(async move {
        while let Some(changed) = changes.recv().await {
            tracing::info!(files = %paths(&changed.paths), "Pipeline file changed; reloading.");
            let control = Arc::clone(&job);
            match control
                .reload(crate::control::ReloadRequest::default())
                .await
            {
                Ok(outcome) => {
                    let text = crate::api::render::render_reload(&outcome);
                    match outcome.result.as_str() {
                        "applied" | "unchanged" => {
                            tracing::info!("Reload {}:\n{text}", outcome.result)
                        }
                        _ => tracing::error!("Reload {}:\n{text}", outcome.result),
                    }
                }
                Err(e) => tracing::error!(error = %OneLine(&e), "Reload failed."),
            }
            if let Some(files) = watched_files(&file)
                && let Err(e) = watcher.set_files(&files)
            {
                tracing::warn!(error = %e, "Cannot watch every referenced file.");
            }
        }
    }))
}

/// The file plus every script file it references, from a fresh parse (so that scripts an
/// edit adds are watched too); `None` when the file does not parse.
fn watched_files(file: &std::path::Path) -> Option<Vec<PathBuf>> {
    let loaded = crate::validate::validate_file(file);
    loaded
        .spec
        .as_ref()
        .map(|spec| crate::reload::watch::referenced_files(file, spec))
}

fn spawn_signal_watch(stop: Arc<AtomicBool>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("Stop requested; draining pipelines.");
        stop.store(true, Ordering::Relaxed);
    });
}

pub(super) struct PipelineOutcome {
    error: Option<RunError>,
    wall: Duration,
    first_output: Option<Duration>,
    first_record: Option<Duration>,
    restored_from: Option<u64>,
    degraded: usize,
    stats: Vec<CheckpointStats>,
    all_processing: Option<Duration>,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_pipeline(
    plan: PipelinePlan,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    started: Instant,
    recovery: RecoveryOptions,
    faults: Vec<(String, Arc<Fault>)>,
    workers: Workers,
    links: pipeline::SupervisorLinks,
) -> PipelineOutcome {
    let id = plan.id.clone();
    let store = Arc::clone(&links.metrics);
    let elements: Vec<(String, Role)> = reports.iter().map(|r| (r.id.clone(), r.role)).collect();
    let handover = links.handover.clone();
    let ended = pipeline::supervise(plan, reports, control, recovery, faults, workers, links).await;
    // A version stopped for a hot reload has not finished: the pipeline goes on in the new
    // version, and the reload's own lines tell what happened.
    let reloading = handover.is_some_and(|h| h.is_expecting(&id));
    store.generation_ended();
    let wall = started.elapsed();
    match &ended.error {
        None if reloading => {
            tracing::debug!(pipeline = %id, wall = %Elapsed(wall), restarts = ended.restarts, checkpoints = ended.checkpoints, "The version before the reload stopped.")
        }
        None => {
            // Over the whole run: every version and restart of the pipeline.
            let restarts = store.restarts.load(std::sync::atomic::Ordering::Relaxed);
            let checkpoints = store.checkpoints().completed;
            tracing::info!(pipeline = %id, wall = %Elapsed(wall), restarts, checkpoints, "Pipeline finished.")
        }
        // The failure that made the strategy give up has its own line ("Task failed.").
        Some(RunError::GaveUp { reason, .. }) => {
            tracing::error!(pipeline = %id, reason = %pipeline::give_up_head(reason), "Pipeline failed.")
        }
        Some(e) => tracing::error!(pipeline = %id, error = %OneLine(e), "Pipeline failed."),
    }
    let (first_record, first_output, all_processing) = firsts(&store, &elements, started);
    PipelineOutcome {
        stats: ended.stats,
        all_processing,
        error: ended.error,
        wall,
        first_output,
        first_record,
        restored_from: ended.restored_from,
        degraded: ended.degraded.len(),
    }
}

/// Paths as a comma-separated list.
fn paths(paths: &[std::path::PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// From `started`: the first record out of a source, the first record into a sink, and the
/// time every operator had processed a record (sinks left out: after an `emit: final` stage
/// they see records only at the end), over every generation of the pipeline so far.
fn firsts(
    store: &PipelineMetrics,
    elements: &[(String, Role)],
    started: Instant,
) -> (Option<Duration>, Option<Duration>, Option<Duration>) {
    let since = |t: Instant| t.saturating_duration_since(started);
    let first_of = |role: Role| {
        elements
            .iter()
            .filter(|(_, r)| *r == role)
            .filter_map(|(id, _)| store.first_in(id))
            .min()
            .map(since)
    };
    let operators: Vec<Option<Instant>> = elements
        .iter()
        .filter(|(_, r)| *r == Role::Operator)
        .map(|(id, _)| store.first_in(id))
        .collect();
    let all_processing = if operators.iter().all(Option::is_some) {
        operators.into_iter().flatten().max().map(since)
    } else {
        None
    };
    (first_of(Role::Source), first_of(Role::Sink), all_processing)
}
