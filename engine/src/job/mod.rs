//! Running a [`FilePlan`]: every pipeline at once on one tokio multi-thread runtime, each
//! pipeline's chains spawned as one task per subtask and wired with bounded channels; then a
//! [`JobSummary`] per operator (records in/out, errors), wall time and throughput.
//!
//! Each pipeline runs under its own supervisor (`pipeline`), which takes checkpoints and
//! applies the restart and failover strategies; a pipeline that fails for good never stops
//! the others.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::plan::{FilePlan, NodeKind, PipelinePlan};
use crate::runtime::error::{Result, RunError};
use crate::runtime::task::{Control, Fault};
use crate::runtime::{NodeMetrics, NodeReport};

mod pipeline;
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
    /// Tokio worker threads (default: one per core).
    pub worker_threads: Option<usize>,
    /// The instant times are measured from (default: when the job starts), e.g. the
    /// process start so that validation counts in the time to first record.
    pub started: Option<Instant>,
    /// Where pipelines with checkpoints start from.
    pub recovery: RecoveryOptions,
    /// Faults to inject (recovery tests): `(pipeline id, operator id, fault)`.
    pub faults: Vec<(String, String, Arc<Fault>)>,
}

/// One node's totals.
#[derive(Clone, Debug)]
pub struct NodeSummary {
    /// Element id.
    pub id: String,
    /// `source`, `operator` or `sink`.
    pub role: &'static str,
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
}

impl PipelineSummary {
    /// Records produced by the sources.
    pub fn source_records(&self) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.role == "source")
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
/// When the runtime cannot start; pipeline failures are reported in the summary.
pub fn run(plan: FilePlan, options: JobOptions) -> Result<JobSummary> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("weir-worker");
    if let Some(n) = options.worker_threads {
        builder.worker_threads(n.max(1));
    }
    let rt = builder
        .build()
        .map_err(|e| RunError::Internal(format!("cannot start the tokio runtime: {e}")))?;
    // The control plane (supervisors, checkpoint timers, progress) runs on its own thread, so
    // that checkpoints trigger on time however busy the workers are.
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("weir-control")
        .build()
        .map_err(|e| RunError::Internal(format!("cannot start the control runtime: {e}")))?;
    let workers = rt.handle().clone();
    let summary = control.block_on(run_async(plan, options, workers));
    drop(control);
    drop(rt);
    Ok(summary)
}

/// Runs every pipeline of `plan` concurrently: supervisors on the current tokio runtime,
/// tasks on `workers`.
pub async fn run_async(
    plan: FilePlan,
    options: JobOptions,
    workers: tokio::runtime::Handle,
) -> JobSummary {
    let started = options.started.unwrap_or_else(Instant::now);
    let controls: Vec<Arc<Control>> = plan
        .pipelines
        .iter()
        .map(|_| Arc::new(Control::default()))
        .collect();
    if options.handle_signals {
        spawn_signal_watch(Arc::clone(&options.stop));
    }
    {
        let stop = Arc::clone(&options.stop);
        let controls = controls.clone();
        tokio::spawn(async move {
            loop {
                if stop.load(Ordering::Relaxed) {
                    for c in &controls {
                        c.stop.store(true, Ordering::Relaxed);
                        c.stop_requested.notify_one();
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    let mut running = Vec::new();
    let mut reports_all = Vec::new();
    for (pipeline, control) in plan.pipelines.into_iter().zip(controls) {
        let reports: Arc<Vec<NodeReport>> = Arc::new(
            pipeline
                .nodes
                .iter()
                .map(|n| NodeReport {
                    id: n.id.clone(),
                    role: match n.kind {
                        NodeKind::Source(_) => "source",
                        NodeKind::Operator(_) => "operator",
                        NodeKind::Sink(_) => "sink",
                    },
                    type_name: n.type_name(),
                    parallelism: n.parallelism,
                    metrics: Arc::new(NodeMetrics::default()),
                })
                .collect(),
        );
        reports_all.push((pipeline.id.clone(), Arc::clone(&reports)));
        let r = Arc::clone(&reports);
        let recovery = options.recovery.clone();
        let faults: Vec<(String, Arc<Fault>)> = options
            .faults
            .iter()
            .filter(|(p, _, _)| *p == pipeline.id)
            .map(|(_, op, f)| (op.clone(), Arc::clone(f)))
            .collect();
        let workers = workers.clone();
        running.push(tokio::spawn(async move {
            run_pipeline(pipeline, r, control, started, recovery, faults, workers).await
        }));
    }
    let done = Arc::new(std::sync::Mutex::new(vec![false; running.len()]));
    let progress_task = options.progress.clone().map(|cb| {
        let reports_all = reports_all.clone();
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let finished = done.lock().map(|d| d.clone()).unwrap_or_default();
                let p = progress_of(&reports_all, &finished);
                cb(&p, started.elapsed());
            }
        })
    });
    let mut summaries = Vec::new();
    for (i, handle) in running.into_iter().enumerate() {
        let (id, reports) = &reports_all[i];
        let outcome = handle.await.unwrap_or_else(|e| PipelineOutcome {
            error: Some(RunError::Internal(format!("pipeline task panicked: {e}"))),
            wall: started.elapsed(),
            first_output: None,
            first_record: None,
            restarts: 0,
            checkpoints: 0,
            restored_from: None,
            degraded: 0,
            stats: Vec::new(),
            all_processing: None,
        });
        if let Ok(mut d) = done.lock() {
            d[i] = true;
        }
        summaries.push(PipelineSummary {
            id: id.clone(),
            nodes: reports
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
                .collect(),
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
        });
    }
    if let Some(t) = progress_task {
        t.abort();
    }
    JobSummary {
        pipelines: summaries,
        wall: started.elapsed(),
    }
}

fn progress_of(
    reports: &[(String, Arc<Vec<NodeReport>>)],
    finished: &[bool],
) -> Vec<PipelineProgress> {
    reports
        .iter()
        .enumerate()
        .map(|(i, (id, nodes))| PipelineProgress {
            id: id.clone(),
            source_records: nodes
                .iter()
                .filter(|n| n.role == "source")
                .map(|n| n.metrics.read().0)
                .sum(),
            sink_records: nodes
                .iter()
                .filter(|n| n.role == "sink")
                .map(|n| n.metrics.read().0)
                .sum(),
            finished: finished.get(i).copied().unwrap_or(false),
        })
        .collect()
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

struct PipelineOutcome {
    error: Option<RunError>,
    wall: Duration,
    first_output: Option<Duration>,
    first_record: Option<Duration>,
    restarts: u32,
    checkpoints: u64,
    restored_from: Option<u64>,
    degraded: usize,
    stats: Vec<CheckpointStats>,
    all_processing: Option<Duration>,
}

async fn run_pipeline(
    plan: PipelinePlan,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    started: Instant,
    recovery: RecoveryOptions,
    faults: Vec<(String, Arc<Fault>)>,
    workers: tokio::runtime::Handle,
) -> PipelineOutcome {
    let id = plan.id.clone();
    // Watch for the first record out of a source and into a sink (latency figures).
    let of_role = |role: &str| -> Vec<Arc<NodeMetrics>> {
        reports
            .iter()
            .filter(|r| r.role == role)
            .map(|r| Arc::clone(&r.metrics))
            .collect()
    };
    let (sources, sinks) = (of_role("source"), of_role("sink"));
    // Operators only: a sink after an `emit: final` stage sees its first record at the end.
    let downstream: Vec<Arc<NodeMetrics>> = reports
        .iter()
        .filter(|r| r.role == "operator")
        .map(|r| Arc::clone(&r.metrics))
        .collect();
    type Firsts = (Option<Duration>, Option<Duration>, Option<Duration>);
    let first = Arc::new(std::sync::Mutex::new(Firsts::default()));
    let watcher = {
        let first = Arc::clone(&first);
        tokio::spawn(async move {
            loop {
                if let Ok(mut f) = first.lock() {
                    if f.0.is_none() && sources.iter().any(|m| m.read().0 > 0) {
                        f.0 = Some(started.elapsed());
                    }
                    if f.1.is_none() && sinks.iter().any(|m| m.read().0 > 0) {
                        f.1 = Some(started.elapsed());
                    }
                    if f.2.is_none() && downstream.iter().all(|m| m.read().0 > 0) {
                        f.2 = Some(started.elapsed());
                    }
                    if f.0.is_some() && f.1.is_some() && f.2.is_some() {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let ended = pipeline::supervise(plan, reports, control, recovery, faults, workers).await;
    watcher.abort();
    let wall = started.elapsed();
    match &ended.error {
        None => {
            tracing::info!(pipeline = %id, wall_ms = wall.as_millis() as u64, restarts = ended.restarts, checkpoints = ended.checkpoints, "Pipeline finished.")
        }
        Some(e) => tracing::error!(pipeline = %id, error = %e, "Pipeline failed."),
    }
    let (first_record, first_output, all_processing) = first.lock().map(|f| *f).unwrap_or_default();
    PipelineOutcome {
        stats: ended.stats,
        all_processing,
        error: ended.error,
        wall,
        first_output,
        first_record,
        restarts: ended.restarts,
        checkpoints: ended.checkpoints,
        restored_from: ended.restored_from,
        degraded: ended.degraded.len(),
    }
}
