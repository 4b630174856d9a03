//! Running a [`FilePlan`]: every pipeline at once on one tokio multi-thread runtime, each
//! pipeline's chains spawned as one task per subtask and wired with bounded channels; then a
//! [`JobSummary`] per operator (records in/out, errors), wall time and throughput.
//!
//! Restart strategies and checkpoints belong to the next issue: today a failed task fails its
//! pipeline (other pipelines go on), and `checkpoints:` is accepted but not yet acted on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::connectors::SourceContext;
use crate::operators::registry::{self, BuildContext, NodeBuilder};
use crate::operators::union::UnionOperator;
use crate::operators::{ErrorPolicy, Operator, OperatorContext};
use crate::plan::{FilePlan, NodeKind, Partitioning, PipelinePlan};
use crate::record::KeyGroupRange;
use crate::runtime::error::{Result, RunError};
use crate::runtime::exchange::{Output, Target};
use crate::runtime::task::{ChainNode, ChainTask, Control, run_chain, run_source};
use crate::runtime::{CHANNEL_CAPACITY, Envelope, NodeMetrics, NodeReport};
use crate::state::MemoryBackend;

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
    Ok(rt.block_on(run_async(plan, options)))
}

/// Runs every pipeline of `plan` concurrently on the current tokio runtime.
pub async fn run_async(plan: FilePlan, options: JobOptions) -> JobSummary {
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
        running.push(tokio::spawn(async move {
            run_pipeline(pipeline, r, control, started).await
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
}

async fn run_pipeline(
    plan: PipelinePlan,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    started: Instant,
) -> PipelineOutcome {
    if plan.spec.checkpoints.enabled {
        tracing::warn!(pipeline = %plan.id, "Checkpoints are not implemented yet; running without them.");
    }
    let handles = match spawn_pipeline(&plan, &reports, &control) {
        Ok(h) => h,
        Err(e) => {
            return PipelineOutcome {
                error: Some(e),
                wall: started.elapsed(),
                first_output: None,
                first_record: None,
            };
        }
    };
    tracing::info!(pipeline = %plan.id, tasks = handles.len(), "Pipeline started.");
    // Watch for the first record out of a source and into a sink (latency figures).
    let of_role = |role: &str| -> Vec<Arc<NodeMetrics>> {
        reports
            .iter()
            .filter(|r| r.role == role)
            .map(|r| Arc::clone(&r.metrics))
            .collect()
    };
    let (sources, sinks) = (of_role("source"), of_role("sink"));
    let first = Arc::new(std::sync::Mutex::new((None::<Duration>, None::<Duration>)));
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
                    if f.0.is_some() && f.1.is_some() {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let mut primary: Option<RunError> = None;
    let mut secondary: Option<RunError> = None;
    for h in handles {
        let res = match h.await {
            Ok(r) => r,
            Err(e) => Err(RunError::Internal(format!("task panicked: {e}"))),
        };
        if let Err(e) = res {
            control.failed.store(true, Ordering::Relaxed);
            if e.is_secondary() {
                secondary.get_or_insert(e);
            } else {
                primary.get_or_insert(e);
            }
        }
    }
    watcher.abort();
    let error = primary.or(secondary);
    let wall = started.elapsed();
    match &error {
        None => {
            tracing::info!(pipeline = %plan.id, wall_ms = wall.as_millis() as u64, "Pipeline finished.")
        }
        Some(e) => tracing::error!(pipeline = %plan.id, error = %e, "Pipeline failed."),
    }
    let (first_record, first_output) = first.lock().map(|f| *f).unwrap_or_default();
    PipelineOutcome {
        error,
        wall,
        first_output,
        first_record,
    }
}

type TaskHandle = tokio::task::JoinHandle<Result<()>>;

fn spawn_pipeline(
    plan: &PipelinePlan,
    reports: &[NodeReport],
    control: &Arc<Control>,
) -> Result<Vec<TaskHandle>> {
    let engine = Arc::new(crate::script::runtime::runtime_engine(&plan.spec.limits));
    let bctx = BuildContext { plan, engine };
    let builders: Vec<NodeBuilder> = plan
        .nodes
        .iter()
        .map(|n| registry::build(n, &bctx))
        .collect::<Result<_>>()?;
    let pipeline: Arc<str> = plan.id.as_str().into();
    let maxp = plan.max_parallelism;

    // One channel per (chain, subtask) whose head is not a source.
    let mut senders: Vec<Vec<Option<mpsc::Sender<Envelope>>>> = Vec::new();
    let mut receivers: Vec<Vec<Option<mpsc::Receiver<Envelope>>>> = Vec::new();
    let mut inputs: Vec<Vec<u32>> = Vec::new();
    for chain in &plan.chains {
        let head = chain
            .nodes
            .first()
            .ok_or_else(|| RunError::Internal("empty chain".into()))?;
        let is_source = matches!(plan.nodes[head.0].kind, NodeKind::Source(_));
        let (mut tx, mut rx) = (Vec::new(), Vec::new());
        for _ in 0..chain.parallelism {
            if is_source {
                tx.push(None);
                rx.push(None);
            } else {
                let (t, r) = mpsc::channel(CHANNEL_CAPACITY);
                tx.push(Some(t));
                rx.push(Some(r));
            }
        }
        senders.push(tx);
        receivers.push(rx);
        inputs.push(vec![0; chain.parallelism as usize]);
    }

    let mut handles = Vec::new();
    let mut pending: Vec<(usize, u32, ChainTask)> = Vec::new();
    for (ci, chain) in plan.chains.iter().enumerate() {
        let p = chain.parallelism;
        for s in 0..p {
            let mut nodes = Vec::with_capacity(chain.nodes.len());
            for (pos, &nid) in chain.nodes.iter().enumerate() {
                let node = &plan.nodes[nid.0];
                let (operator, keyed, counts_output): (Box<dyn Operator>, bool, bool) =
                    match &builders[nid.0] {
                        NodeBuilder::Source(_) => (Box::new(UnionOperator), false, true),
                        NodeBuilder::Operator { factory, keyed } => (factory(s, p)?, *keyed, true),
                        NodeBuilder::Sink(factory) => (factory(s, p)?, false, false),
                    };
                let on_error = match &node.kind {
                    NodeKind::Operator(o) => ErrorPolicy::from(o.on_error()),
                    _ => ErrorPolicy::Fail,
                };
                let key_groups = KeyGroupRange::for_subtask(maxp, p, s);
                let ctx = OperatorContext {
                    pipeline: Arc::clone(&pipeline),
                    operator: node.id.as_str().into(),
                    subtask: s,
                    parallelism: p,
                    max_parallelism: maxp,
                    key_groups,
                    on_error,
                    dead_letters: Vec::new(),
                    errors: 0,
                    state: keyed.then(|| {
                        Box::new(MemoryBackend::new(maxp, key_groups))
                            as Box<dyn crate::state::StateBackend>
                    }),
                };
                let next_in_chain = chain.nodes.get(pos + 1).copied();
                let mut outputs = Vec::new();
                let mut dead_letters = Vec::new();
                for edge in plan.outputs_of(nid) {
                    if Some(edge.to) == next_in_chain && !edge.dead_letter {
                        continue;
                    }
                    let tc = plan.chain_of(edge.to).ok_or_else(|| {
                        RunError::Internal(format!("node {} has no chain", edge.to.0))
                    })?;
                    if plan.chains[tc].nodes.first() != Some(&edge.to) {
                        return Err(RunError::Internal(format!(
                            "edge into `{}` enters the middle of a chain",
                            plan.nodes[edge.to.0].id
                        )));
                    }
                    let tp = plan.chains[tc].parallelism;
                    let partitioning = match edge.partitioning {
                        Partitioning::Forward if tp != p => Partitioning::Rebalance,
                        other => other,
                    };
                    let subtasks: Vec<u32> = if partitioning == Partitioning::Forward {
                        vec![s]
                    } else {
                        (0..tp).collect()
                    };
                    let mut targets = Vec::new();
                    for t in subtasks {
                        let sender = senders[tc][t as usize]
                            .clone()
                            .ok_or_else(|| RunError::Internal("an edge enters a source".into()))?;
                        let input = inputs[tc][t as usize];
                        inputs[tc][t as usize] += 1;
                        targets.push(Target { sender, input });
                    }
                    let out = Output::new(
                        partitioning,
                        targets,
                        maxp,
                        Arc::clone(&pipeline),
                        node.id.as_str().into(),
                    );
                    if edge.dead_letter {
                        dead_letters.push(out)
                    } else {
                        outputs.push(out)
                    }
                }
                nodes.push(ChainNode {
                    operator,
                    ctx,
                    metrics: Arc::clone(&reports[nid.0].metrics),
                    outputs,
                    dead_letters,
                    counts_output,
                });
            }
            pending.push((ci, s, ChainTask { nodes }));
        }
    }
    drop(senders);

    for (ci, s, task) in pending {
        let chain = &plan.chains[ci];
        let head = &plan.nodes[chain.nodes[0].0];
        let element: Arc<str> = head.id.as_str().into();
        let control = Arc::clone(control);
        match &builders[head.index.0] {
            NodeBuilder::Source(factory) => {
                let source = factory(s, chain.parallelism)?;
                let sctx = SourceContext {
                    pipeline: plan.id.clone(),
                    source: head.id.clone(),
                    subtask: s,
                    parallelism: chain.parallelism,
                    skipped: 0,
                };
                handles.push(tokio::spawn(async move {
                    let r = run_source(source, sctx, task, Arc::clone(&control)).await;
                    if r.is_err() {
                        control.failed.store(true, Ordering::Relaxed);
                    }
                    r
                }));
            }
            _ => {
                let rx = receivers[ci][s as usize]
                    .take()
                    .ok_or_else(|| RunError::Internal("receiver taken twice".into()))?;
                let expected = inputs[ci][s as usize] as usize;
                let pipeline = Arc::clone(&pipeline);
                handles.push(tokio::spawn(async move {
                    let r = run_chain(rx, expected, task, pipeline, element).await;
                    if r.is_err() {
                        control.failed.store(true, Ordering::Relaxed);
                    }
                    r
                }));
            }
        }
    }
    Ok(handles)
}
