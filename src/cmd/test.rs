//! `weir test [FILES]`: runs declarative test files (`*.test.yaml`) against their pipelines
//! and reports pass or fail per test, with diffs; `--format junit` writes JUnit XML for CI.
//! Loading a test file is `weir_schema::test_file`'s business, running it
//! `weir_engine::testing`'s; this module turns one into the other and prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use weir_engine::testing::{self, Outcome, Scenario, Step};
use weir_schema::diagnostic::codes;
use weir_schema::test_file::{BackendChoice, StepSpec, TestFileSpec, TestSpec, load_test_file};
use weir_schema::units::DurationSpec;
use weir_schema::{Diagnostic, PathSeg, YamlPath};

/// Output format of `weir test`.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Format {
    /// A summary for people: pass or fail per test, its time, diffs of what failed.
    #[default]
    Text,
    /// JUnit XML on standard output (one `testsuite` per file), for CI.
    Junit,
}

/// Arguments of `weir test`.
#[derive(Args, Debug)]
#[command(after_long_help = HELP)]
pub struct TestArgs {
    /// Test files, or directories standing for every `*.test.yaml` under them. Default: the
    /// current directory.
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// How long any one wait of a test may take (a source reading its input, a checkpoint,
    /// a savepoint, a reload, the drain at the end) before the test fails, saying which step
    /// waited for what (`500ms`, `30s`, `2m`).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub timeout: DurationSpec,
    /// Where each run keeps its checkpoints, savepoints and outputs (a temporary directory
    /// inside, deleted afterwards). Default: /dev/shm when it exists (memory: nothing there
    /// needs to survive a power loss, and a disk makes every checkpoint pay for fsyncs), else
    /// the system's temporary directory.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

const HELP: &str = "\
How a test runs:
  Sources named under `inputs:` (and in `input` steps) read exactly those records; other
  sources run as configured and must end by themselves (a file source without `follow`, a
  generator with `count`). Every sink is captured: assertions see what it committed, as JSON.
  Checkpoints are on, taken only at `checkpoint` steps, savepoints and the end, in a temporary
  directory (under --work-dir); heap (`memory`) state runs on `fs` so that a `crash` can
  restore it; a failure fails the test (no restarts). Every wait (a source reading its input,
  a checkpoint, a savepoint, a reload, the drain at the end) is bounded by --timeout: one that
  takes longer fails its test, naming the step and what it waited for.

Steps:
  input: {SOURCE: [records]}  feed more records
  checkpoint                   checkpoint once everything fed so far has been read
  crash                        every task dies; a new job restores the latest checkpoint
  savepoint                    stop with a savepoint
  restore: {parallelism: N, backend: memory|fs|rocksdb}   start again from it (changes optional)
  reload: FILE                 apply another version of the pipeline file, as --watch does
                               (the new version's probation checkpoint is taken at once,
                               not after waiting for records: they come in later steps)
  advance_time: 5s             once everything fed so far went through the pipeline, move
                               the test's clock (processing time; it starts at 0, the Unix
                               epoch, and moves only here) by 5s: processing-time timers and
                               windows now due fire
  A test with steps also runs the same inputs without them (keeping only `input`, `reload`
  and `advance_time` steps: they change what the pipeline computes, not only how it runs);
  every sink must receive the same records (exactly-once equivalence), or the test fails
  with the difference.

Exit status: 0 when every test passed, 1 otherwise.";

/// One test's result.
struct TestResult {
    name: String,
    time: Duration,
    failures: Vec<String>,
}

/// One file's results.
struct FileResult {
    file: PathBuf,
    /// Problems with the file itself (diagnostics, an unreadable pipeline).
    error: Option<String>,
    tests: Vec<TestResult>,
    time: Duration,
}

/// Runs `weir test`.
pub fn run(args: &TestArgs) -> ExitCode {
    // The engine's log, for debugging a test (`RUST_LOG=debug`); warnings and errors only by
    // default, on standard error.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    // A directory stands for every test file under it.
    let mut files = Vec::new();
    let named = if args.files.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.files.clone()
    };
    for f in named {
        if f.is_dir() {
            let mut found = Vec::new();
            find_test_files(&f, &mut found);
            found.sort();
            files.extend(found);
        } else {
            files.push(f);
        }
    }
    if files.is_empty() {
        eprintln!("no test files (`*.test.yaml`) found");
        return ExitCode::FAILURE;
    }
    let mut results = Vec::new();
    for file in &files {
        let r = run_file(file, args, matches!(args.format, Format::Text));
        results.push(r);
    }
    let failed = results
        .iter()
        .any(|f| f.error.is_some() || f.tests.iter().any(|t| !t.failures.is_empty()));
    match args.format {
        Format::Text => print_summary(&results),
        Format::Junit => print!("{}", junit(&results)),
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Every `*.test.yaml` under `dir`, skipping hidden directories and `target`.
fn find_test_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                find_test_files(&path, out);
            }
        } else if name.ends_with(".test.yaml") {
            out.push(
                path.strip_prefix("./")
                    .map_or(path.clone(), Path::to_path_buf),
            );
        }
    }
}

fn run_file(file: &Path, args: &TestArgs, live: bool) -> FileResult {
    let started = Instant::now();
    let mut result = FileResult {
        file: file.to_path_buf(),
        error: None,
        tests: Vec::new(),
        time: Duration::ZERO,
    };
    let loaded = load_test_file(file);
    let spec = match loaded.spec {
        Some(spec) if !loaded.diagnostics.has_errors() => spec,
        _ => {
            let all: Vec<&Diagnostic> = loaded.diagnostics.iter().collect();
            result.error = Some(format!(
                "{}{}: invalid test file",
                super::validate::render(&all),
                file.display()
            ));
            result.time = started.elapsed();
            return result;
        }
    };
    let dir = file.parent().unwrap_or(Path::new(""));
    let pipeline = dir.join(&spec.pipeline);
    if live {
        println!("{} ({})", file.display(), pipeline.display());
    }
    // What the tests name (the pipeline, sources, sinks, operators, reload files) must exist:
    // located diagnostics, as for the schema.
    let problems = match (&loaded.spans, testing::load_pipeline(&pipeline)) {
        (Some(spans), Ok(pipeline_spec)) => {
            references(&spec, &pipeline_spec, dir, &loaded.source, spans)
        }
        (Some(spans), Err(e)) => {
            let mut d = weir_schema::Diagnostics::new();
            d.push(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    format!("the pipeline file {} does not validate", pipeline.display()),
                )
                .at(&loaded.source, spans.span(&path(&[Seg::K("pipeline")])))
                .label("this pipeline file")
                .help(format!(
                    "`weir validate {}` shows why:\n{e}",
                    pipeline.display()
                )),
            );
            d
        }
        (None, _) => weir_schema::Diagnostics::new(),
    };
    if problems.has_errors() {
        let all: Vec<&Diagnostic> = problems.iter().collect();
        result.error = Some(format!(
            "{}{}: invalid test file",
            super::validate::render(&all),
            file.display()
        ));
        result.time = started.elapsed();
        return result;
    }
    for test in &spec.tests {
        let t = Instant::now();
        // A bug of Weir's own that panics fails this test, not the whole run.
        let failures = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_test(&spec, test, &pipeline, dir, args)
        }))
        .unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            vec![format!("weir test panicked (a bug in Weir): {why}")]
        });
        let r = TestResult {
            name: test.name.clone(),
            time: t.elapsed(),
            failures,
        };
        if live {
            print_test(&r);
        }
        result.tests.push(r);
    }
    result.time = started.elapsed();
    result
}

/// A segment of a path into the test file.
enum Seg<'a> {
    K(&'a str),
    I(usize),
}

fn path(segs: &[Seg<'_>]) -> YamlPath {
    YamlPath(
        segs.iter()
            .map(|s| match s {
                Seg::K(k) => PathSeg::Key((*k).to_owned()),
                Seg::I(i) => PathSeg::Index(*i),
            })
            .collect(),
    )
}

/// Checks every name a test file uses against its pipeline file: the `pipeline_id`, the
/// sources fed (in `inputs` and `input` steps), the sinks expected, the operators whose dead
/// letters are asserted, the files reloaded. Each problem is a diagnostic at its place.
fn references(
    spec: &TestFileSpec,
    pipeline: &weir_schema::FileSpec,
    dir: &Path,
    source: &std::sync::Arc<weir_schema::SourceFile>,
    spans: &weir_schema::SpanIndex,
) -> weir_schema::Diagnostics {
    let mut out = weir_schema::Diagnostics::new();
    // A name used as a key (a source fed, a sink expected) is pointed at by its key; a
    // value (`pipeline_id`, a reload's file) by the value.
    let mut problem = |at: &[Seg<'_>], message: String, label: &str, help: &str| {
        let here = path(at);
        let named_by_key = at.len() >= 2
            && matches!(
                at[at.len() - 2],
                Seg::K("inputs" | "input" | "expect" | "dead_letters")
            );
        let span = if named_by_key {
            spans.key_span(&here)
        } else {
            spans.span(&here)
        };
        out.push(
            Diagnostic::error(codes::INVALID_VALUE, message)
                .at(source, span)
                .label(label)
                .help(help)
                .with_path(path(at)),
        );
    };
    let only = spec.pipeline_id.as_deref();
    if let Some(id) = only
        && !pipeline.pipelines.iter().any(|p| p.id == id)
    {
        let ids: Vec<String> = pipeline
            .pipelines
            .iter()
            .map(|p| format!("`{}`", p.id))
            .collect();
        problem(
            &[Seg::K("pipeline_id")],
            format!("the pipeline file has no pipeline `{id}`"),
            "no such pipeline",
            &format!("its pipelines are {}", ids.join(", ")),
        );
        return out;
    }
    let operators: Vec<&str> = pipeline
        .pipelines
        .iter()
        .filter(|p| only.is_none_or(|id| p.id == id))
        .flat_map(|p| p.operators.iter().map(|o| o.id()))
        .collect();
    const SOURCE: (&str, &str) = (
        "not a source of the pipeline",
        "name a source id of the pipeline file",
    );
    for (i, test) in spec.tests.iter().enumerate() {
        for name in test.inputs.keys() {
            if let Err(e) = testing::resolve_source(pipeline, only, name) {
                let at = [Seg::K("tests"), Seg::I(i), Seg::K("inputs"), Seg::K(name)];
                problem(&at, e, SOURCE.0, SOURCE.1);
            }
        }
        for (j, step) in test.steps.iter().enumerate() {
            match step {
                StepSpec::Input(records) => {
                    for name in records.keys() {
                        if let Err(e) = testing::resolve_source(pipeline, only, name) {
                            let at = [
                                Seg::K("tests"),
                                Seg::I(i),
                                Seg::K("steps"),
                                Seg::I(j),
                                Seg::K("input"),
                                Seg::K(name),
                            ];
                            problem(&at, e, SOURCE.0, SOURCE.1);
                        }
                    }
                }
                StepSpec::Reload(f) if !dir.join(f).is_file() => {
                    let at = [
                        Seg::K("tests"),
                        Seg::I(i),
                        Seg::K("steps"),
                        Seg::I(j),
                        Seg::K("reload"),
                    ];
                    problem(
                        &at,
                        format!("no file {}", dir.join(f).display()),
                        "no such file",
                        "a reload names a pipeline file, relative to the test file",
                    );
                }
                _ => {}
            }
        }
        for name in test.expect.keys() {
            if let Err(e) = testing::resolve_sink(pipeline, only, name) {
                let at = [Seg::K("tests"), Seg::I(i), Seg::K("expect"), Seg::K(name)];
                problem(
                    &at,
                    e,
                    "not a sink of the pipeline",
                    "name a sink id of the pipeline file",
                );
            }
        }
        for name in test.dead_letters.keys() {
            if !operators.contains(&name.as_str()) {
                let at = [
                    Seg::K("tests"),
                    Seg::I(i),
                    Seg::K("dead_letters"),
                    Seg::K(name),
                ];
                let all: Vec<String> = operators.iter().map(|o| format!("`{o}`")).collect();
                problem(
                    &at,
                    format!("no operator `{name}`; the pipeline has {}", all.join(", ")),
                    "not an operator of the pipeline",
                    "dead letters are asserted per operator id",
                );
            }
        }
    }
    out
}

/// Runs one test; its failures (none: it passed).
fn run_test(
    file: &TestFileSpec,
    test: &TestSpec,
    pipeline: &Path,
    dir: &Path,
    args: &TestArgs,
) -> Vec<String> {
    let spec = match testing::load_pipeline(pipeline) {
        Ok(spec) => spec,
        Err(e) => return vec![format!("{} does not validate:\n{e}", pipeline.display())],
    };
    let only = file.pipeline_id.as_deref();
    let mut failures = Vec::new();
    let mut batch = |records: &indexmap::IndexMap<String, Vec<serde_json::Value>>| {
        records
            .iter()
            .filter_map(
                |(name, rs)| match testing::resolve_source(&spec, only, name) {
                    Ok(key) => Some((key, rs.clone())),
                    Err(e) => {
                        failures.push(format!("inputs: {e}"));
                        None
                    }
                },
            )
            .collect::<Vec<_>>()
    };
    let inputs = batch(&test.inputs);
    let steps: Vec<Step> = test
        .steps
        .iter()
        .map(|s| match s {
            StepSpec::Input(records) => Step::Input(batch(records)),
            StepSpec::Checkpoint => Step::Checkpoint,
            StepSpec::Crash => Step::Crash,
            StepSpec::Savepoint => Step::Savepoint,
            StepSpec::Restore(r) => Step::Restore {
                parallelism: r.parallelism,
                backend: r.backend.map(|b| {
                    match b {
                        BackendChoice::Memory => "memory",
                        BackendChoice::Fs => "fs",
                        BackendChoice::Rocksdb => "rocksdb",
                    }
                    .to_owned()
                }),
            },
            StepSpec::Reload(f) => Step::Reload(dir.join(f)),
            StepSpec::AdvanceTime(d) => Step::AdvanceTime(d.0),
        })
        .collect();
    let mut expect = Vec::new();
    for (name, e) in &test.expect {
        match testing::resolve_sink(&spec, only, name) {
            Ok(sink) => expect.push((sink, e)),
            Err(e) => failures.push(format!("expect: {e}")),
        }
    }
    if !failures.is_empty() {
        return failures;
    }
    let scenario = Scenario {
        file: pipeline.to_path_buf(),
        pipeline: file.pipeline_id.clone(),
        inputs,
        steps,
        patience: args.timeout.0,
        work_dir: args.work_dir.clone(),
    };
    let outcome = match testing::run_scenario(&scenario, !scenario.steps.is_empty()) {
        Ok(o) => o,
        Err(e) => return vec![e.to_string()],
    };
    failures.extend(outcome.failures.iter().cloned());
    for (sink, e) in &expect {
        let got = outcome.sinks.get(sink).map_or(&[][..], Vec::as_slice);
        for f in testing::check_sink(e, got) {
            failures.push(format!("sink `{sink}`: {f}"));
        }
    }
    let dead: Vec<(String, Vec<serde_json::Value>)> = test
        .dead_letters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    failures.extend(testing::check_dead_letters(&dead, &outcome));
    if !scenario.steps.is_empty() {
        failures.extend(equivalence(&scenario, &outcome));
    }
    failures
}

/// Runs the scenario without its steps and compares every sink with the stepped run.
fn equivalence(scenario: &Scenario, stepped: &Outcome) -> Vec<String> {
    let straight = match testing::run_scenario(scenario, false) {
        Ok(o) => o,
        Err(e) => return vec![format!("the run without steps: {e}")],
    };
    let mut failures = Vec::new();
    for (sink, got) in &stepped.sinks {
        let want = straight.sinks.get(sink).map_or(&[][..], Vec::as_slice);
        if let Some(d) = testing::diff(want, got) {
            failures.push(format!(
                "sink `{sink}`: the run with steps differs from the run without them \
                 (- only without steps, + only with steps):\n{d}"
            ));
        }
    }
    failures
}

fn print_test(r: &TestResult) {
    let verdict = if r.failures.is_empty() {
        "ok  "
    } else {
        "FAIL"
    };
    println!("  {verdict} {} ({})", r.name, seconds(r.time));
    for f in &r.failures {
        for line in f.lines() {
            println!("       {line}");
        }
    }
}

fn print_summary(results: &[FileResult]) {
    let mut passed = 0;
    let mut failed = 0;
    let mut total = Duration::ZERO;
    for f in results {
        total += f.time;
        if let Some(e) = &f.error {
            eprintln!("{e}");
            failed += 1;
        }
        for t in &f.tests {
            if t.failures.is_empty() {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    println!(
        "\n{} passed, {} failed ({})",
        passed,
        failed,
        seconds(total)
    );
    let slowest = results
        .iter()
        .flat_map(|f| f.tests.iter().map(move |t| (t.time, f, t)))
        .max_by_key(|(time, _, _)| *time);
    if let Some((time, f, t)) = slowest.filter(|_| passed + failed > 1) {
        println!(
            "slowest: {}: {} ({})",
            f.file.display(),
            t.name,
            seconds(time)
        );
    }
}

/// A duration for people: `7ms` below a second, `1.25s` beyond.
fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

/// JUnit XML: one `testsuite` per file; a file that does not load is one failed test case.
fn junit(results: &[FileResult]) -> String {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"weir test\">\n",
    );
    for f in results {
        let name = f.file.display().to_string();
        let mut cases = String::new();
        let (mut tests, mut failures) = (0, 0);
        if let Some(e) = &f.error {
            tests += 1;
            failures += 1;
            cases.push_str(&format!(
                "    <testcase name=\"(load)\" classname=\"{}\" time=\"0\">\n      <failure message=\"invalid test file\">{}</failure>\n    </testcase>\n",
                escape(&name),
                escape(e)
            ));
        }
        for t in &f.tests {
            tests += 1;
            cases.push_str(&format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\">\n",
                escape(&t.name),
                escape(&name),
                t.time.as_secs_f64()
            ));
            if !t.failures.is_empty() {
                failures += 1;
                let first = t.failures[0].lines().next().unwrap_or("");
                cases.push_str(&format!(
                    "      <failure message=\"{}\">{}</failure>\n",
                    escape(first),
                    escape(&t.failures.join("\n"))
                ));
            }
            cases.push_str("    </testcase>\n");
        }
        xml.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" time=\"{:.3}\">\n{cases}  </testsuite>\n",
            escape(&name),
            f.time.as_secs_f64()
        ));
    }
    xml.push_str("</testsuites>\n");
    xml
}

/// Escapes text for XML attributes and content; drops characters XML 1.0 cannot hold.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escape_keeps_xml_well_formed() {
        assert_eq!(escape("a<b & \"c\"\u{1}"), "a&lt;b &amp; &quot;c&quot;");
    }
}
