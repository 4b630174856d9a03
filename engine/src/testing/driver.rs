//! Driving one run of a test: a job on runtimes of its own, fed through input files that
//! grow step by step, and the steps themselves (checkpoint, crash, savepoint and restore,
//! reload) done through the job's control surface, the same calls `weir checkpoints`,
//! `weir savepoint`, `weir stop` and `weir reload` make. A crash drops both runtimes with
//! every task still running (as a killed process would lose them) and starts a new job that
//! restores the latest completed checkpoint.
//!
//! Every wait is bounded by the scenario's patience: a source reading what it was fed, the
//! job starting, a checkpoint, a savepoint, a reload, a drain and the job's end. When one
//! expires the run ends with [`ScenarioError::Timeout`] saying what it waited for (the caller
//! adds the step); the runtimes are shut down without waiting for what still runs, so an
//! expired wait never turns into a hang.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_schema::FileSpec;

use super::rewrite::{Layout, Rewrite, rewrite};
use super::{Outcome, Scenario, ScenarioError, Step};
use crate::base::clock::Clock;
use crate::control::{JobControl, ReloadRequest, StopRequest};
use crate::job::{JobOptions, JobSummary, RecoveryOptions};

type SourceKey = (String, String);

/// The savepoint a `restore` starts from: its directory per pipeline, and what every fed
/// source had read when it was taken.
type Savepoint = (Vec<(String, PathBuf)>, BTreeMap<SourceKey, u64>);

/// A job running on runtimes of its own.
struct Live {
    /// The job's own tasks and the calls made to it (taken when shut down).
    control: Option<tokio::runtime::Runtime>,
    /// The pipelines' tasks (taken when shut down).
    workers: Option<tokio::runtime::Runtime>,
    job: Arc<dyn JobControl>,
    task: Option<tokio::task::JoinHandle<crate::base::error::Result<JobSummary>>>,
    /// What each fed source had read when this job started (where it resumed).
    base: BTreeMap<SourceKey, u64>,
    /// How long any one wait may take.
    patience: Duration,
}

impl Live {
    /// Runs `work` on the control runtime for at most the patience; `what` says what it
    /// waited for when it takes longer.
    fn wait<T>(
        &self,
        what: impl FnOnce() -> String,
        work: impl Future<Output = T>,
    ) -> Result<T, ScenarioError> {
        let Some(control) = &self.control else {
            return Err(ScenarioError::Run(format!("{}: the job is down", what())));
        };
        control
            .block_on(async { tokio::time::timeout(self.patience, work).await })
            .map_err(|_| timed_out(self.patience, &what()))
    }

    /// Ends the job where it is: its task and every pipeline task are dropped (as a killed
    /// process loses them), waiting at most the patience for work off the runtimes (a
    /// snapshot being written) to return.
    fn shut_down(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(workers) = self.workers.take() {
            workers.shutdown_timeout(self.patience);
        }
        if let Some(control) = self.control.take() {
            control.shutdown_timeout(self.patience);
        }
    }
}

impl Drop for Live {
    /// A run that ends early (a failed or expired step) leaves the job behind without
    /// waiting for it: dropping a runtime would wait for its blocking work for ever.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(workers) = self.workers.take() {
            workers.shutdown_background();
        }
        if let Some(control) = self.control.take() {
            control.shutdown_background();
        }
    }
}

/// The error of a wait that expired.
fn timed_out(patience: Duration, what: &str) -> ScenarioError {
    ScenarioError::Timeout(format!(
        "timed out after {} waiting for {what}",
        crate::base::human::Elapsed(patience)
    ))
}

/// One run of a scenario, with or without its steps.
pub(super) struct Driver<'a> {
    scenario: &'a Scenario,
    spec: FileSpec,
    raw: Value,
    base_dir: PathBuf,
    layout: Layout,
    fed: BTreeSet<SourceKey>,
    pipelines: Vec<String>,
    /// The rewritten file the job runs (a reload rewrites it in place).
    running_file: PathBuf,
    follow: bool,
    parallelism: Option<u32>,
    backend: Option<String>,
    /// Records written to each input file so far.
    written: BTreeMap<SourceKey, u64>,
    /// Records read at the latest checkpoint (or reload).
    at_checkpoint: BTreeMap<SourceKey, u64>,
    /// The last savepoint per pipeline and what had been read then.
    savepoint: Option<Savepoint>,
    /// Processing time of every job of the run: manual, moved by `advance_time` steps
    /// (starting at 0, the Unix epoch), shared across crashes, restores and reloads.
    clock: Clock,
    failures: Vec<String>,
}

impl<'a> Driver<'a> {
    pub(super) fn new(
        scenario: &'a Scenario,
        spec: FileSpec,
        fed: BTreeSet<SourceKey>,
        dir: &Path,
        follow: bool,
    ) -> Result<Self, ScenarioError> {
        let base_dir = scenario
            .file
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let layout = Layout {
            inputs: dir.join("inputs"),
            outputs: dir.join("outputs"),
            work: dir.join("work"),
        };
        let pipelines = spec
            .pipelines
            .iter()
            .filter(|p| scenario.pipeline.as_deref().is_none_or(|id| p.id == id))
            .map(|p| p.id.clone())
            .collect();
        let raw = super::rewrite::raw_json(&scenario.file)?;
        let mut d = Self {
            scenario,
            spec,
            raw,
            base_dir,
            running_file: dir.join("pipeline.yaml"),
            layout,
            fed,
            pipelines,
            follow,
            parallelism: None,
            backend: None,
            written: BTreeMap::new(),
            at_checkpoint: BTreeMap::new(),
            savepoint: None,
            clock: Clock::manual(0),
            failures: Vec::new(),
        };
        for key in d.fed.clone() {
            let path = d.layout.input_file(&key.0, &key.1);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            std::fs::write(&path, b"").map_err(io("create", &path))?;
            d.written.insert(key, 0);
        }
        d.write_running_file(None)?;
        Ok(d)
    }

    /// Rewrites `spec` (default: the file under test) into the running file.
    fn write_running_file(
        &mut self,
        spec: Option<(&FileSpec, &Value, &Path)>,
    ) -> Result<(), ScenarioError> {
        let (spec, raw, base_dir) = spec.unwrap_or((&self.spec, &self.raw, &self.base_dir));
        let text = rewrite(
            spec,
            raw,
            base_dir,
            &Rewrite {
                layout: &self.layout,
                fed: &self.fed,
                pipeline: self.scenario.pipeline.as_deref(),
                follow: self.follow,
                parallelism: self.parallelism,
                backend: self.backend.as_deref(),
            },
        )?;
        std::fs::write(&self.running_file, text).map_err(io("write", &self.running_file))
    }

    /// Appends records to the input files.
    fn feed(&mut self, batch: &[(SourceKey, Vec<Value>)]) -> Result<(), ScenarioError> {
        for (key, records) in batch {
            let path = self.layout.input_file(&key.0, &key.1);
            let mut text = Vec::new();
            for r in records {
                serde_json::to_writer(&mut text, r)
                    .map_err(|e| ScenarioError::Setup(format!("a record of `{}`: {e}", key.1)))?;
                text.push(b'\n');
            }
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io("open", &path))?;
            f.write_all(&text).map_err(io("write", &path))?;
            *self.written.entry(key.clone()).or_default() += records.len() as u64;
        }
        Ok(())
    }

    /// Starts a job on the running file, from a savepoint if given.
    fn start(
        &self,
        from_savepoints: Vec<(String, PathBuf)>,
        base: BTreeMap<SourceKey, u64>,
    ) -> Result<Live, ScenarioError> {
        let validation = crate::validate::validate_file(&self.running_file);
        let plan = match validation.plan() {
            Some(Ok(plan)) => plan,
            Some(Err(e)) => return Err(ScenarioError::Setup(e.to_string())),
            None => {
                let messages: Vec<String> = validation
                    .diagnostics
                    .iter()
                    .map(|d| format!("{}: {}", d.code, d.message))
                    .collect();
                return Err(ScenarioError::Setup(format!(
                    "the pipeline does not validate once its sources and sinks are replaced:\n  {}",
                    messages.join("\n  ")
                )));
            }
        };
        let workers = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .worker_threads(2)
            .thread_name("weir-test-worker")
            .thread_stack_size(crate::script::SCRIPT_STACK_SIZE)
            .build()
            .map_err(|e| ScenarioError::Setup(format!("cannot start a runtime: {e}")))?;
        let control = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .worker_threads(1)
            .thread_name("weir-test-control")
            .thread_stack_size(crate::script::SCRIPT_STACK_SIZE)
            .build()
            .map_err(|e| ScenarioError::Setup(format!("cannot start a runtime: {e}")))?;
        let options = JobOptions {
            file: Some(self.running_file.clone()),
            recovery: RecoveryOptions::default(),
            from_savepoints,
            clock: self.clock.clone(),
            ..JobOptions::default()
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = control.spawn(crate::job::run_async_observed(
            plan,
            options,
            workers.handle().clone().into(),
            Some(tx),
        ));
        let patience = self.scenario.patience;
        let job = match control.block_on(async { tokio::time::timeout(patience, rx).await }) {
            Ok(Ok(job)) => job,
            Ok(Err(_)) => {
                let ended = control.block_on(async { tokio::time::timeout(patience, task).await });
                workers.shutdown_background();
                control.shutdown_background();
                return Err(ScenarioError::Run(match ended {
                    Ok(Ok(Err(e))) => format!("the job did not start: {e}"),
                    _ => "the job ended before it started".into(),
                }));
            }
            Err(_) => {
                task.abort();
                workers.shutdown_background();
                control.shutdown_background();
                return Err(timed_out(patience, "the job to start"));
            }
        };
        Ok(Live {
            control: Some(control),
            workers: Some(workers),
            job,
            task: Some(task),
            base,
            patience,
        })
    }

    /// Waits until every fed source has read everything written to it.
    fn caught_up(&mut self, live: &Live) -> Result<(), ScenarioError> {
        let deadline = Instant::now() + live.patience;
        loop {
            let status = live.job.status();
            let mut behind = None;
            for p in &self.pipelines {
                match status.pipelines.iter().find(|s| s.id == *p) {
                    Some(s) if s.state == "running" => {}
                    Some(s) if matches!(s.state.as_str(), "failed" | "finished" | "stopped") => {
                        return Err(ScenarioError::Run(format!(
                            "pipeline `{p}` is {}: {}",
                            s.state,
                            s.error.clone().unwrap_or_default()
                        )));
                    }
                    _ => behind = Some(format!("pipeline `{p}` to run")),
                }
            }
            for (key, written) in &self.written {
                let Some(p) = status.pipelines.iter().find(|p| p.id == key.0) else {
                    continue;
                };
                if matches!(p.state.as_str(), "failed" | "finished" | "stopped") {
                    return Err(ScenarioError::Run(format!(
                        "pipeline `{}` is {} while its sources still had input: {}",
                        p.id,
                        p.state,
                        p.error.clone().unwrap_or_default()
                    )));
                }
                let read: u64 = p
                    .operators
                    .iter()
                    .filter(|o| o.id == key.1 && o.role == "source")
                    .flat_map(|o| o.subtasks.iter().map(|s| s.records_in + s.errors))
                    .sum();
                let want = written.saturating_sub(live.base.get(key).copied().unwrap_or(0));
                if read < want {
                    behind = Some(format!(
                        "source `{}` to read what it was fed (it read {read} of {want} records)",
                        key.1
                    ));
                }
            }
            let Some(behind) = behind else {
                return Ok(());
            };
            if Instant::now() > deadline {
                return Err(timed_out(live.patience, &behind));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Takes a checkpoint of every pipeline once everything fed so far has been read.
    fn checkpoint(&mut self, l: &Live) -> Result<(), ScenarioError> {
        self.caught_up(l)?;
        for p in &self.pipelines {
            let info = l
                .wait(
                    || format!("a checkpoint of pipeline `{p}` to complete"),
                    l.job.trigger_checkpoint(p),
                )?
                .map_err(|e| ScenarioError::Run(e.to_string()))?;
            if info.failed() {
                return Err(ScenarioError::Run(format!(
                    "checkpoint {} of `{p}` failed",
                    info.id
                )));
            }
        }
        self.at_checkpoint = self.written.clone();
        Ok(())
    }

    /// Waits for a job's end and records its failures.
    fn finish(&mut self, mut live: Live) -> Result<(), ScenarioError> {
        tracing::debug!("Waiting for the job's end.");
        let summary = match live.task.take() {
            Some(task) => live.wait(|| "the job to end".into(), task),
            None => Err(ScenarioError::Run("the job is down".into())),
        };
        live.shut_down();
        tracing::debug!("The job ended.");
        match summary? {
            Err(e) => return Err(ScenarioError::Run(format!("the job panicked: {e}"))),
            Ok(Err(e)) => return Err(ScenarioError::Run(e.to_string())),
            Ok(Ok(summary)) => {
                for p in summary.pipelines {
                    if let Some(e) = p.error {
                        self.failures
                            .push(format!("pipeline `{}` failed: {e}", p.id));
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs the scenario: without steps, every input at once to the end; with steps, fed
    /// and stepped as written, then drained.
    pub(super) fn run(mut self) -> Result<Outcome, ScenarioError> {
        let steps = &self.scenario.steps;
        if !self.follow {
            let mut all: Vec<(SourceKey, Vec<Value>)> = self.scenario.inputs.clone();
            for step in steps {
                if let Step::Input(batch) = step {
                    all.extend(batch.iter().cloned());
                }
            }
            self.feed(&all)?;
            let live = self.start(Vec::new(), BTreeMap::new())?;
            self.finish(live)?;
            return self.outcome();
        }
        let first = self.scenario.inputs.clone();
        self.feed(&first)?;
        let mut live = Some(self.start(Vec::new(), BTreeMap::new())?);
        for (i, step) in steps.iter().enumerate() {
            let n = i + 1;
            let context = |e: ScenarioError| e.at_step(n, step.name());
            tracing::debug!(step = n, name = step.name(), "Test step.");
            match step {
                Step::Input(batch) => self.feed(batch).map_err(context)?,
                Step::AdvanceTime(d) => {
                    // Everything fed so far goes through the whole pipeline first (a
                    // checkpoint's barrier follows it everywhere), so what the move of the
                    // clock fires sees every record fed before it, in every run alike.
                    if let Some(l) = &live {
                        self.checkpoint(l).map_err(context)?;
                    }
                    self.clock
                        .advance(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                }
                Step::Checkpoint => {
                    let l = live.as_ref().ok_or_else(|| stopped(n, step))?;
                    self.checkpoint(l).map_err(context)?;
                }
                Step::Crash => {
                    let mut l = live.take().ok_or_else(|| stopped(n, step))?;
                    self.caught_up(&l).map_err(context)?;
                    l.shut_down();
                    live = Some(
                        self.start(Vec::new(), self.at_checkpoint.clone())
                            .map_err(context)?,
                    );
                }
                Step::Savepoint => {
                    let l = live.take().ok_or_else(|| stopped(n, step))?;
                    self.caught_up(&l).map_err(context)?;
                    let mut paths = Vec::new();
                    for p in &self.pipelines {
                        let request = StopRequest {
                            savepoint: true,
                            drain: false,
                            dir: None,
                        };
                        let out = l
                            .wait(
                                || format!("pipeline `{p}` to stop with a savepoint"),
                                l.job.stop(p, request),
                            )
                            .map_err(context)?
                            .map_err(|e| context(ScenarioError::Run(e.to_string())))?;
                        let sp = out.savepoint.ok_or_else(|| {
                            context(ScenarioError::Run(format!(
                                "`{p}` stopped without a savepoint"
                            )))
                        })?;
                        paths.push((p.clone(), sp.path));
                    }
                    self.finish(l).map_err(context)?;
                    self.savepoint = Some((paths, self.written.clone()));
                }
                Step::Restore {
                    parallelism,
                    backend,
                } => {
                    if live.is_some() {
                        return Err(context(ScenarioError::Setup(
                            "`restore` needs a `savepoint` step before it".into(),
                        )));
                    }
                    if parallelism.is_some() {
                        self.parallelism = *parallelism;
                    }
                    if backend.is_some() {
                        self.backend.clone_from(backend);
                    }
                    self.write_running_file(None).map_err(context)?;
                    live = Some(self.restore().map_err(context)?);
                }
                Step::Reload(file) => {
                    let l = live.as_ref().ok_or_else(|| stopped(n, step))?;
                    self.caught_up(l).map_err(context)?;
                    let validation = crate::validate::validate_file(file);
                    let Some(spec) = validation
                        .spec
                        .filter(|_| !validation.diagnostics.has_errors())
                    else {
                        return Err(context(ScenarioError::Setup(format!(
                            "{} does not validate",
                            file.display()
                        ))));
                    };
                    let base_dir = file
                        .parent()
                        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
                    let raw = super::rewrite::raw_json(file).map_err(context)?;
                    self.write_running_file(Some((&spec, &raw, &base_dir)))
                        .map_err(context)?;
                    let outcome = l
                        .wait(
                            || format!("the reload of {} to be applied", file.display()),
                            l.job.reload(ReloadRequest {
                                // The inputs that prove the new version come in the next
                                // steps, after the reload: waiting a second for them would
                                // only slow the test.
                                probation_idle_wait: Some(Duration::from_millis(1)),
                                ..ReloadRequest::default()
                            }),
                        )
                        .map_err(context)?
                        .map_err(|e| context(ScenarioError::Run(e.to_string())))?;
                    if !matches!(outcome.result.as_str(), "applied" | "unchanged") {
                        return Err(context(ScenarioError::Run(format!(
                            "the reload was {}: {}",
                            outcome.result,
                            outcome.messages.join("\n")
                        ))));
                    }
                    self.at_checkpoint = self.written.clone();
                }
            }
        }
        // The end: every input read, then every pipeline drained (its sources end, as bounded
        // ones do, and everything is flushed and committed).
        let end = |e: ScenarioError| e.at_end();
        let l = match live {
            Some(l) => l,
            None => self.restore().map_err(end)?,
        };
        self.caught_up(&l).map_err(end)?;
        for p in &self.pipelines {
            let request = StopRequest {
                savepoint: false,
                drain: true,
                dir: None,
            };
            let drained = l
                .wait(
                    || format!("pipeline `{p}` to drain"),
                    l.job.stop(p, request),
                )
                .map_err(end)?;
            // A pipeline that failed meanwhile is reported by the job's summary.
            if let Err(e) = drained {
                tracing::debug!(pipeline = %p, error = %e, "Draining failed.");
            }
        }
        self.finish(l).map_err(end)?;
        self.outcome()
    }

    fn restore(&mut self) -> Result<Live, ScenarioError> {
        let (paths, at) = self.savepoint.clone().ok_or_else(|| {
            ScenarioError::Setup("`restore` needs a `savepoint` step before it".into())
        })?;
        self.at_checkpoint = at.clone();
        self.start(paths, at)
    }

    /// What every sink committed, part files in `(subtask, part)` order.
    fn outcome(self) -> Result<Outcome, ScenarioError> {
        let mut sinks = BTreeMap::new();
        for (p, s) in super::rewrite::sinks(&self.spec, self.scenario.pipeline.as_deref()) {
            let dir = self.layout.sink_dir(&p, &s);
            let mut records = read_sink(&dir)?;
            let (running, file) = (
                self.running_file.display().to_string(),
                self.scenario.file.display().to_string(),
            );
            for r in &mut records {
                relocate(r, &running, &file);
            }
            sinks.insert(
                super::sink_name(&self.spec, self.scenario.pipeline.as_deref(), &p, &s),
                records,
            );
        }
        Ok(Outcome {
            sinks,
            failures: self.failures,
        })
    }
}

/// Errors in the output (dead letters) name the rewritten file the run used, which lives in
/// the run's temporary directory, at a line and column of that rewriting: they name the
/// pipeline file under test instead, without the position, so that they read the same in
/// every run (with steps or without) and point where the user looks.
fn relocate(v: &mut Value, running: &str, file: &str) {
    match v {
        Value::String(s) if s.contains(running) => {
            let mut out = String::with_capacity(s.len());
            let mut rest = s.as_str();
            while let Some(at) = rest.find(running) {
                out.push_str(&rest[..at]);
                out.push_str(file);
                rest = &rest[at + running.len()..];
                // `:LINE:COLUMN` after the path.
                for _ in 0..2 {
                    let digits = rest
                        .strip_prefix(':')
                        .map_or(0, |r| r.bytes().take_while(u8::is_ascii_digit).count());
                    if digits > 0 {
                        rest = &rest[1 + digits..];
                    }
                }
            }
            out.push_str(rest);
            *s = out;
        }
        Value::Array(a) => a.iter_mut().for_each(|v| relocate(v, running, file)),
        Value::Object(m) => m.values_mut().for_each(|v| relocate(v, running, file)),
        _ => {}
    }
}

fn stopped(n: usize, step: &Step) -> ScenarioError {
    ScenarioError::Setup("the job is stopped after a `savepoint`: `restore` it first".into())
        .at_step(n, step.name())
}

fn io<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> ScenarioError + 'p {
    move |e| ScenarioError::Setup(format!("cannot {what} {}: {e}", path.display()))
}

/// The committed records of a sink directory: visible part files `part-<subtask>-<n>.jsonl`
/// in `(subtask, n)` order.
fn read_sink(dir: &Path) -> Result<Vec<Value>, ScenarioError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut parts: Vec<((u64, u64), PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            let rest = name.strip_prefix("part-")?.strip_suffix(".jsonl")?;
            let (s, n) = rest.split_once('-')?;
            Some(((s.parse().ok()?, n.parse().ok()?), p))
        })
        .collect();
    parts.sort();
    let mut out = Vec::new();
    for (_, path) in parts {
        let text = std::fs::read_to_string(&path).map_err(io("read", &path))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            out.push(serde_json::from_str(line).map_err(|e| {
                ScenarioError::Run(format!("{}: a line is not JSON: {e}", path.display()))
            })?);
        }
    }
    Ok(out)
}
