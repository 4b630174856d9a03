//! Running a pipeline against in-memory inputs, with steps: the engine half of `weir test`.
//! A [`Scenario`] names a pipeline file, records for some of its sources and steps between
//! them (checkpoint, crash, savepoint and restore, reload); [`run_scenario`] runs it on the
//! real job (the same supervisors, checkpoints, restores and reloads as `weir run`) and
//! returns what every sink committed. [`check_sink`] and [`check_dead_letters`] hold the
//! assertions of a test file; [`diff`] shows how two outputs differ.
//!
//! How a run is made (documented for users in `weir test --help`):
//! - Fed sources become `file` sources over a JSON-lines file per source in a temporary
//!   directory; every sink becomes a `jsonl` file sink there (`rewrite`). Checkpoints are on
//!   (taken only at `checkpoint` steps, by savepoints and at the end), storage and
//!   savepoints live in the temporary directory, the restart strategy is `none` (a failure
//!   fails the test), and heap state runs on the `fs` backend so that a `crash` (every task
//!   dropped, as a killed process) can restore it. Sink output is what was committed.
//! - Without steps the sources read every record and end. With steps they follow their
//!   files as the steps append to them, and the job is drained at the end, which ends the
//!   input exactly as a bounded source does (`emit: final` results and `on_end` included).
//!
//! It owns no operator or connector: it drives `job` through `control` and reads files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use weir_schema::FileSpec;
use weir_schema::test_file::SinkExpectation;

mod driver;
mod rewrite;

/// A step between inputs (see `weir_schema::test_file::StepSpec`).
#[derive(Clone, Debug)]
pub enum Step {
    /// More records, by source.
    Input(Vec<((String, String), Vec<Value>)>),
    /// A checkpoint once everything fed has been read.
    Checkpoint,
    /// The whole job dies; a new one restores the latest checkpoint.
    Crash,
    /// Every pipeline stops with a savepoint.
    Savepoint,
    /// Start again from the savepoint, with changes.
    Restore {
        /// A new pipeline parallelism.
        parallelism: Option<u32>,
        /// A new state backend (`memory`, `fs`, `rocksdb`).
        backend: Option<String>,
    },
    /// Apply another version of the pipeline file.
    Reload(PathBuf),
    /// Let processing time pass: once every record fed so far went through the pipeline (a
    /// checkpoint), the run's manual clock moves forward by this much, and processing-time
    /// timers and windows now due fire.
    AdvanceTime(Duration),
}

impl Step {
    /// The step's name in test files.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Input(_) => "input",
            Self::Checkpoint => "checkpoint",
            Self::Crash => "crash",
            Self::Savepoint => "savepoint",
            Self::Restore { .. } => "restore",
            Self::Reload(_) => "reload",
            Self::AdvanceTime(_) => "advance_time",
        }
    }
}

/// A test's run: the pipeline file, which pipeline, inputs and steps.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The pipeline file.
    pub file: PathBuf,
    /// Only this pipeline of the file.
    pub pipeline: Option<String>,
    /// The first records, by `(pipeline, source)`.
    pub inputs: Vec<((String, String), Vec<Value>)>,
    /// The steps after them.
    pub steps: Vec<Step>,
    /// How long any one wait of the run may take (a source reading what it was fed, a
    /// checkpoint, a savepoint, a reload, a drain, the job's end) before the run fails with
    /// [`ScenarioError::Timeout`].
    pub patience: Duration,
    /// Where the run's temporary directory goes; `None`: a memory-backed file system when
    /// there is one ([`MEMORY_DIRS`]), else the system's temporary directory.
    pub work_dir: Option<PathBuf>,
}

/// Memory-backed directories a run's temporary directory goes to by default. Nothing a test
/// run writes needs to survive a power loss (a `crash` step ends the job, not the machine,
/// and the directory is deleted afterwards), but on a disk every checkpoint, savepoint and
/// sink commit pays for fsyncs and journaled metadata: several times the run itself.
pub const MEMORY_DIRS: &[&str] = &["/dev/shm"];

/// The default [`Scenario::patience`]: generous, for loaded machines (a reference test
/// waits a few milliseconds at each step).
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(30);

/// What a run produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Committed records per sink, by the sink's name ([`sink_name`]), in part order.
    pub sinks: BTreeMap<String, Vec<Value>>,
    /// Pipelines that failed, with why.
    pub failures: Vec<String>,
}

/// Why a scenario could not run.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The test and the pipeline do not fit together (a source never ends, an unknown id, a
    /// pipeline that does not validate once rewritten).
    #[error("{0}")]
    Setup(String),
    /// The run went wrong (a job that could not be stopped or restored, a pipeline that
    /// failed while a step waited for it).
    #[error("{0}")]
    Run(String),
    /// A wait took longer than the scenario's patience; the message says what it waited for
    /// and at which step.
    #[error("{0}")]
    Timeout(String),
}

impl ScenarioError {
    /// The same error, prefixed with where it happened.
    fn at(self, place: &str) -> Self {
        match self {
            Self::Setup(m) => Self::Setup(format!("{place}: {m}")),
            Self::Run(m) => Self::Run(format!("{place}: {m}")),
            Self::Timeout(m) => Self::Timeout(format!("{place}: {m}")),
        }
    }

    fn at_step(self, n: usize, name: &str) -> Self {
        self.at(&format!("step {n} (`{name}`)"))
    }

    /// At the end of a run with steps: reading the last inputs, draining, the job's end.
    fn at_end(self) -> Self {
        self.at("the end (after the last step)")
    }
}

/// The validated spec of a pipeline file.
///
/// # Errors
/// The file's diagnostics, as text, when it does not validate.
pub fn load_pipeline(file: &std::path::Path) -> Result<FileSpec, String> {
    let v = crate::validate::validate_file(file);
    match v.spec {
        Some(spec) if !v.diagnostics.has_errors() => Ok(spec),
        _ => Err(v
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| format!("{}: {}", d.code, d.message))
            .collect::<Vec<_>>()
            .join("\n")),
    }
}

/// Resolves a source id of a test (`source`, or `pipeline/source` when ids repeat across
/// pipelines) to `(pipeline, source)`.
///
/// # Errors
/// No such source, or an ambiguous id.
pub fn resolve_source(
    spec: &FileSpec,
    pipeline: Option<&str>,
    name: &str,
) -> Result<(String, String), String> {
    resolve(&rewrite::sources(spec, pipeline), name, "source")
}

/// Resolves a sink id of a test as [`resolve_source`] does.
///
/// # Errors
/// No such sink, or an ambiguous id.
pub fn resolve_sink(spec: &FileSpec, pipeline: Option<&str>, name: &str) -> Result<String, String> {
    let (p, s) = resolve(&rewrite::sinks(spec, pipeline), name, "sink")?;
    Ok(sink_name(spec, pipeline, &p, &s))
}

fn resolve(all: &[(String, String)], name: &str, what: &str) -> Result<(String, String), String> {
    let hits: Vec<&(String, String)> = all
        .iter()
        .filter(|(p, s)| s == name || format!("{p}/{s}") == name)
        .collect();
    match hits.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(format!(
            "no {what} `{name}`; the pipeline has {}",
            all.iter()
                .map(|(_, s)| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Err(format!(
            "{what} `{name}` is in several pipelines: write `PIPELINE/{name}` or set `pipeline_id`"
        )),
    }
}

/// A sink's name in an [`Outcome`]: its id, or `pipeline/sink` when several pipelines of the
/// run have a sink of that id.
pub fn sink_name(spec: &FileSpec, pipeline: Option<&str>, p: &str, s: &str) -> String {
    let repeated = rewrite::sinks(spec, pipeline)
        .iter()
        .filter(|(_, id)| id == s)
        .count()
        > 1;
    if repeated {
        format!("{p}/{s}")
    } else {
        s.to_owned()
    }
}

/// Runs a scenario in a temporary directory: with its steps when `with_steps`; otherwise
/// every input at once, straight through (keeping only `input`, `reload` and `advance_time`
/// steps when it has reloads or moves of processing time).
///
/// # Errors
/// A setup or run problem (see [`ScenarioError`]); a pipeline that fails is reported in
/// [`Outcome::failures`].
pub fn run_scenario(scenario: &Scenario, with_steps: bool) -> Result<Outcome, ScenarioError> {
    let spec = load_pipeline(&scenario.file).map_err(|e| {
        ScenarioError::Setup(format!(
            "{} does not validate:\n{e}",
            scenario.file.display()
        ))
    })?;
    let mut fed: BTreeSet<(String, String)> =
        scenario.inputs.iter().map(|(k, _)| k.clone()).collect();
    for step in &scenario.steps {
        if let Step::Input(batch) = step {
            fed.extend(batch.iter().map(|(k, _)| k.clone()));
        }
    }
    let dir = scratch(scenario.work_dir.as_deref())?;
    // Without steps, a reload still happens where it was written (a reload changes the
    // pipeline, not only how it runs), with its inputs fed step by step; otherwise every
    // input is read at once.
    // Likewise the moves of processing time: what a processing-time window holds depends
    // on which records came before the clock moved.
    let kept = |s: &Step| matches!(s, Step::Input(_) | Step::Reload(_) | Step::AdvanceTime(_));
    let stepped = scenario
        .steps
        .iter()
        .any(|s| matches!(s, Step::Reload(_) | Step::AdvanceTime(_)));
    let plain;
    let (scenario, follow) = if with_steps {
        (scenario, true)
    } else if stepped {
        plain = Scenario {
            steps: scenario.steps.iter().filter(|s| kept(s)).cloned().collect(),
            ..scenario.clone()
        };
        (&plain, true)
    } else {
        (scenario, false)
    };
    let driver = driver::Driver::new(scenario, spec, fed, dir.path(), follow)?;
    driver.run()
}

/// A new temporary directory for one run, in `work_dir` or by default in the first usable
/// [`MEMORY_DIRS`] (else the system's temporary directory).
fn scratch(work_dir: Option<&std::path::Path>) -> Result<tempfile::TempDir, ScenarioError> {
    let mut builder = tempfile::Builder::new();
    builder.prefix("weir-test-");
    let created = match work_dir {
        Some(dir) => builder.tempdir_in(dir),
        None => MEMORY_DIRS
            .iter()
            .map(std::path::Path::new)
            .filter(|d| d.is_dir())
            .find_map(|d| builder.tempdir_in(d).ok())
            .map_or_else(|| builder.tempdir(), Ok),
    };
    created.map_err(|e| {
        ScenarioError::Setup(format!(
            "cannot create a temporary directory{}: {e}",
            work_dir.map_or(String::new(), |d| format!(" in {}", d.display()))
        ))
    })
}

/// Checks one sink's records against an expectation; one message per broken assertion.
pub fn check_sink(expect: &SinkExpectation, got: &[Value]) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(want) = &expect.exact
        && let Some(d) = diff(want, got)
    {
        failures.push(format!("`exact` does not hold:\n{d}"));
    }
    if let Some(want) = &expect.ordered
        && want.as_slice() != got
    {
        let mut text = String::from("`ordered` does not hold:\n");
        for i in 0..want.len().max(got.len()) {
            let (w, g) = (want.get(i), got.get(i));
            if w != g {
                text.push_str(&format!(
                    "  at {i}: expected {}, got {}\n",
                    w.map_or("nothing".into(), Value::to_string),
                    g.map_or("nothing".into(), Value::to_string)
                ));
            }
        }
        failures.push(text.trim_end().to_owned());
    }
    if let Some(last) = &expect.last_per_key {
        let mut latest: BTreeMap<String, &Value> = BTreeMap::new();
        for r in got {
            let key = r
                .get(&last.field)
                .map_or_else(|| "null".into(), Value::to_string);
            latest.insert(key, r);
        }
        let latest: Vec<Value> = latest.into_values().cloned().collect();
        if let Some(d) = diff(&last.records, &latest) {
            failures.push(format!(
                "`last_per_key` (by `{}`) does not hold:\n{d}",
                last.field
            ));
        }
    }
    if let Some(n) = expect.count
        && n != got.len() as u64
    {
        failures.push(format!("`count`: expected {n} records, got {}", got.len()));
    }
    if expect.empty && !got.is_empty() {
        failures.push(format!(
            "`empty`: expected no records, got {}:\n{}",
            got.len(),
            got.iter()
                .take(10)
                .map(|r| format!("  + {r}"))
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    failures.extend(check_conditions(&expect.conditions, got));
    failures
}

/// Evaluates each condition (a Rhai boolean expression over `r`) on every record.
fn check_conditions(conditions: &[String], got: &[Value]) -> Vec<String> {
    if conditions.is_empty() {
        return Vec::new();
    }
    let engine = crate::script::build_engine(&weir_schema::ScriptLimitsSpec::default());
    let mut failures = Vec::new();
    for c in conditions {
        let ast = match engine.compile_expression(c) {
            Ok(ast) => ast,
            Err(e) => {
                failures.push(format!("condition `{c}` does not compile: {e}"));
                continue;
            }
        };
        let mut broken = Vec::new();
        for r in got {
            let record = match crate::record::parse_json(r.to_string().as_bytes()) {
                Ok(record) => record,
                Err(e) => {
                    broken.push(format!("  {r}: {e}"));
                    continue;
                }
            };
            let mut scope = rhai::Scope::new();
            scope.push("r", record);
            match engine.eval_ast_with_scope::<rhai::Dynamic>(&mut scope, &ast) {
                Ok(v) if v.as_bool() == Ok(true) => {}
                Ok(v) if v.is_bool() => broken.push(format!("  false for {r}")),
                Ok(v) => broken.push(format!("  not a boolean ({}) for {r}", v.type_name())),
                Err(e) => broken.push(format!("  error for {r}: {e}")),
            }
        }
        if !broken.is_empty() {
            let n = broken.len();
            broken.truncate(10);
            failures.push(format!(
                "condition `{c}` does not hold for {n} of {} records:\n{}",
                got.len(),
                broken.join("\n")
            ));
        }
    }
    failures
}

/// Checks the dead letters of each operator: the `record` field of every dead letter whose
/// `operator` is the operator's id, over every sink, as a multiset.
pub fn check_dead_letters(expect: &[(String, Vec<Value>)], outcome: &Outcome) -> Vec<String> {
    let mut failures = Vec::new();
    for (operator, want) in expect {
        let got: Vec<Value> = outcome
            .sinks
            .values()
            .flatten()
            .filter(|r| {
                r.get("operator").and_then(Value::as_str) == Some(operator.as_str())
                    && r.get("error").is_some()
            })
            .filter_map(|r| r.get("record").cloned())
            .collect();
        if let Some(d) = diff(want, &got) {
            failures.push(format!("dead letters of `{operator}` do not match:\n{d}"));
        }
    }
    failures
}

/// How two outputs differ as multisets: `- expected but missing` and `+ unexpected` lines,
/// canonical JSON; `None` when they are equal.
pub fn diff(want: &[Value], got: &[Value]) -> Option<String> {
    let count = |v: &[Value]| {
        let mut m: BTreeMap<String, i64> = BTreeMap::new();
        for r in v {
            *m.entry(canonical(r)).or_default() += 1;
        }
        m
    };
    let (w, g) = (count(want), count(got));
    let mut lines = Vec::new();
    for (r, n) in &w {
        let extra = n - g.get(r).copied().unwrap_or(0);
        for _ in 0..extra {
            lines.push(format!("  - {r}"));
        }
    }
    for (r, n) in &g {
        let extra = n - w.get(r).copied().unwrap_or(0);
        for _ in 0..extra {
            lines.push(format!("  + {r}"));
        }
    }
    if lines.is_empty() {
        return None;
    }
    let total = lines.len();
    lines.truncate(50);
    if total > 50 {
        lines.push(format!("  ... and {} more", total - 50));
    }
    Some(format!(
        "  (- expected, missing; + received, unexpected; {} expected, {} received)\n{}",
        want.len(),
        got.len(),
        lines.join("\n")
    ))
}

/// A record as JSON with sorted keys; numbers compared by value (`1` and `1.0` differ, as
/// they do in the output).
fn canonical(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let b: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, sorted(v))).collect();
                Value::Object(b.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}
