//! Hot reload end to end, through the real `weir` binary, the real file watcher and the real
//! control API: `weir run --watch` over a long exactly-once run whose file is edited many
//! times (applied, rejected, invalid and rolled-back edits), `weir reload --plan FILE`
//! against a running job, an unchanged pipeline that keeps running while the other pipeline
//! of its file reloads, and pipelines removed from the file that stop.
//!
//! Every applied edit keeps the output values the same (a script refactor, parallelism, a
//! pass-through operator, the rate limit), so the whole output of the edited run must equal a
//! straight run of the final file; keyed state must carry across every reload (per user the
//! running total grows with every record).
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::files::write_by_rename;
use common::output::{canonical_lines, committed};
use common::run::run_to_end;
use common::running::Running;

use weir_engine::control::{JobStatus, PipelineReloadPlan, PipelineStatus, ReloadOutcome};

fn pipeline<'a>(status: &'a JobStatus, id: &str) -> &'a PipelineStatus {
    status
        .pipelines
        .iter()
        .find(|p| p.id == id)
        .unwrap_or_else(|| panic!("no pipeline `{id}` in {status:#?}"))
}

fn plan_of<'a>(outcome: &'a ReloadOutcome, id: &str) -> &'a PipelineReloadPlan {
    outcome
        .pipelines
        .iter()
        .find(|p| p.pipeline == id)
        .unwrap_or_else(|| panic!("no plan for `{id}` in {outcome:#?}"))
}

/// `(state, script_changed, parallelism)` of one operator in a pipeline's plan.
fn op_plan(plan: &PipelineReloadPlan, id: &str) -> (String, bool, Option<(u32, u32)>) {
    let op = plan
        .operators
        .iter()
        .find(|o| o.id == id)
        .unwrap_or_else(|| panic!("no operator `{id}` in {plan:#?}"));
    (op.state.clone(), op.script_changed, op.parallelism)
}

/// The number of subtasks whose keyed state a reload handed over in memory, if it says so.
fn handed_over(outcome: &ReloadOutcome) -> Option<u64> {
    outcome.messages.iter().find_map(|m| {
        let rest = m.split("the keyed state of ").nth(1)?;
        rest.split(' ').next()?.parse().ok()
    })
}

/// Rewrites the file in place (truncate and write), as some editors and `echo >` do.
fn write_in_place(path: &Path, text: &str) {
    std::fs::write(path, text).expect("rewrite the pipeline file");
}

/// One output record of the running totals: `(user, n, amount)`.
fn parse_total(line: &str) -> (String, i64, i64) {
    let v: serde_json::Value = serde_json::from_str(line).expect("an output line is JSON");
    (
        v["user"].as_str().expect("a user").to_owned(),
        v["n"].as_i64().expect("an n"),
        v["amount"].as_i64().expect("an amount"),
    )
}

/// Keyed state continued: every input record appears once, and per user the running total
/// grows with `n` by at most 10 (an amount is 1..=10) and starts at 1..=10, so a reset (or a
/// lost or doubled record) shows.
fn check_running_totals(lines: &[String], count: i64) {
    let mut by_user: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let mut ns: Vec<i64> = Vec::with_capacity(lines.len());
    for line in lines {
        let (user, n, amount) = parse_total(line);
        ns.push(n);
        by_user.entry(user).or_default().push((n, amount));
    }
    ns.sort_unstable();
    assert_eq!(
        ns,
        (0..count).collect::<Vec<_>>(),
        "every input record gives exactly one update"
    );
    assert_eq!(by_user.len(), 50, "50 users");
    for (user, mut updates) in by_user {
        updates.sort_unstable();
        let mut previous = 0;
        for (n, amount) in updates {
            assert!(
                amount > previous && amount <= previous + 10,
                "the running total of {user} went from {previous} to {amount} at n = {n}: \
                 its state did not carry over"
            );
            previous = amount;
        }
    }
}

// --- The pipeline versions --------------------------------------------------------------

const SUM: &str = "fn reduce(acc, r) { #{user: acc.user, n: r.n, amount: acc.amount + r.amount} }";
/// The same sums, written differently, with a `migrate` that keeps the restored totals.
const SUM_REFACTORED: &str = "fn reduce(acc, r) {
    let amount = acc.amount + r.amount;
    #{user: acc.user, n: r.n, amount: amount}
}
fn migrate(old) { old }";
/// Compiles, throws on every record (`undefined_helper` does not exist).
const SUM_THROWS: &str = "fn reduce(acc, r) {
    let checked = undefined_helper(r);
    #{user: acc.user, n: r.n, amount: acc.amount + checked.amount}
}";

/// The script file of the pass-through map, relative to the pipeline file.
const PASS_SCRIPT: &str = "scripts/pass.rhai";
const PASS: &str = "fn map(r) { r }\n";
/// The same, written differently.
const PASS_REFACTORED: &str = "fn map(r) {\n    let same = r;\n    same\n}\n";

fn write_pass_script(dir: &Path, text: &str) {
    let path = dir.join(PASS_SCRIPT);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("create scripts/");
    std::fs::write(path, text).expect("write the script");
}

/// One version of the edited pipeline.
#[derive(Clone)]
struct Version {
    count: u64,
    rate: Option<u64>,
    /// A filter keeping every record, between the source and the `key_by`.
    keep_all: bool,
    /// The keyed reduce (`None`: removed, the sink reads the `key_by`).
    total: Option<&'static str>,
    total_parallelism: Option<u32>,
    /// A map returning its record unchanged, between the reduce and the sink; its script is
    /// the file [`PASS_SCRIPT`].
    pass: bool,
}

impl Version {
    fn yaml(&self) -> String {
        let indent = |script: &str, by: usize| {
            script
                .lines()
                .map(|l| format!("{}{l}\n", " ".repeat(by)))
                .collect::<String>()
        };
        let rate = self
            .rate
            .map(|r| format!("        rate: {r}\n"))
            .unwrap_or_default();
        let mut operators = String::new();
        let mut upstream = "events";
        if self.keep_all {
            operators.push_str(
                "      - id: keep_all\n        type: filter\n        input: events\n        script: |\n          fn filter(r) { true }\n",
            );
            upstream = "keep_all";
        }
        operators.push_str(&format!(
            "      - {{id: by_user, type: key_by, input: {upstream}, field: user}}\n"
        ));
        upstream = "by_user";
        if let Some(script) = self.total {
            operators.push_str("      - id: total\n        type: reduce\n        input: by_user\n        emit: updates\n");
            if let Some(p) = self.total_parallelism {
                operators.push_str(&format!("        parallelism: {p}\n"));
            }
            operators.push_str("        script: |\n");
            operators.push_str(&indent(script, 10));
            upstream = "total";
        }
        if self.pass {
            operators.push_str(&format!(
                "      - id: pass\n        type: map\n        input: {upstream}\n        script_file: {PASS_SCRIPT}\n"
            ));
            upstream = "pass";
        }
        format!(
            "version: 1
pipelines:
  - id: totals
    state: {{backend: fs}}
    checkpoints: {{mode: exactly_once, interval: 1s, storage: .weir/checkpoints}}
    sources:
      - id: events
        type: generator
        count: {count}
{rate}        fields:
          n: {{kind: sequence}}
          user: {{kind: key, prefix: u, cardinality: 50}}
          amount: {{kind: int, min: 1, max: 10}}
    operators:
{operators}    sinks:
      - {{id: out, type: file, input: {upstream}, path: out/totals}}
",
            count = self.count,
        )
    }
}

/// Runs `yaml` (and the pass-through script `pass`) straight through in a fresh directory
/// and returns its committed output.
fn straight_run(yaml: &str, pass: &str) -> Vec<String> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    write_pass_script(dir.path(), pass);
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, yaml).expect("write the pipeline");
    let (ok, log) = run_to_end(dir.path(), &file, &[]);
    assert!(ok, "the straight run failed:\n{log}");
    committed(&dir.path().join("out/totals"))
}

/// What the long test knows about the reloads so far.
#[derive(Default)]
struct Tracker {
    /// `at_ms` of the latest outcome seen.
    at: u64,
    /// Applied reloads.
    reloads: u64,
}

/// An applied edit: the outcome, the reload count, and the pipeline restored from the
/// reload's savepoint.
fn applied(run: &Running, t: &mut Tracker, what: &str) -> ReloadOutcome {
    let (status, outcome) = run.wait_outcome(t.at, "applied");
    t.at = outcome.at_ms;
    t.reloads += 1;
    assert_eq!(
        status.reloads, t.reloads,
        "{what}: reloads counts applied ones"
    );
    assert!(outcome.pause_ms.is_some(), "{what}: {outcome:#?}");
    let p = pipeline(&status, "totals");
    assert!(
        p.restored_from.as_deref().is_some_and(|r| !r.is_empty()),
        "{what}: the new version restored from the reload's savepoint: {p:#?}"
    );
    outcome
}

/// After a refused edit: the old version still runs (and, unless `restarted`, was never
/// stopped: its source count did not start over), records keep flowing; then the file goes
/// back to the running version `valid`, which reloads as `unchanged`.
fn still_running(
    run: &Running,
    t: &mut Tracker,
    file: &Path,
    valid: &str,
    before: u64,
    restarted: bool,
    what: &str,
) -> JobStatus {
    let first = run.status();
    let p = pipeline(&first, "totals");
    assert_eq!(
        p.state, "running",
        "{what}: the old version runs: {first:#?}"
    );
    if !restarted {
        assert!(
            p.source_records >= before,
            "{what}: the running version was restarted (its source count went from {before} \
             to {})",
            p.source_records
        );
    }
    let from = p.source_records;
    run.wait_until(&format!("records to flow after {what}"), |s| {
        let p = pipeline(s, "totals");
        p.state == "running" && p.source_records > from
    });
    write_by_rename(file, valid);
    let (status, outcome) = run.wait_outcome(t.at, "unchanged");
    t.at = outcome.at_ms;
    assert_eq!(
        plan_of(&outcome, "totals").change,
        "unchanged",
        "{outcome:#?}"
    );
    status
}

/// One long exactly-once run, its file edited many times while it runs.
#[test]
fn a_long_run_survives_many_edits_and_ends_with_the_output_of_its_final_version() {
    // ~48 s of input at the limited rate: more than the edits take; the last edit lifts the
    // limit, so the rest goes fast.
    const COUNT: u64 = 120_000;
    let v0 = Version {
        count: COUNT,
        rate: Some(2_500),
        keep_all: false,
        total: Some(SUM),
        total_parallelism: None,
        pass: false,
    };
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let file = tmp.path().join("p.yaml");
    std::fs::write(&file, v0.yaml()).expect("write the pipeline");
    let mut run = Running::start(tmp.path(), &file, &["--watch"]);

    // Mid-stream before the first edit: a checkpoint completed, records flow.
    let mut status = run.wait_until("a first checkpoint", |s| {
        s.pipelines
            .first()
            .is_some_and(|p| p.state == "running" && p.latest_checkpoint.is_some())
    });
    assert_eq!(status.reloads, 0);
    assert!(status.last_reload.is_none(), "{status:#?}");
    let mut t = Tracker::default();

    // 1. A script refactor (same results) with a `migrate` that keeps the totals, saved by
    // rename: state migrated.
    let v1 = Version {
        total: Some(SUM_REFACTORED),
        ..v0.clone()
    };
    write_by_rename(&file, &v1.yaml());
    let outcome = applied(&run, &mut t, "script refactor");
    let plan = plan_of(&outcome, "totals");
    assert_eq!(plan.change, "changed");
    assert_eq!(op_plan(plan, "total"), ("migrated".into(), true, None));
    assert_eq!(op_plan(plan, "events").0, "kept");
    assert_eq!(op_plan(plan, "out").0, "kept");
    // Same backend and key groups: the reduce's state moved over in memory (and was
    // migrated there); the totals check at the end shows it continued.
    assert_eq!(handed_over(&outcome), Some(1), "{outcome:#?}");

    // 2. Parallelism 1 → 2 of the reduce, written in place: key groups redistributed.
    let v2 = Version {
        total_parallelism: Some(2),
        ..v1.clone()
    };
    write_in_place(&file, &v2.yaml());
    let outcome = applied(&run, &mut t, "parallelism 1 → 2");
    assert_eq!(
        op_plan(plan_of(&outcome, "totals"), "total"),
        ("kept".into(), false, Some((1, 2)))
    );
    assert_eq!(
        handed_over(&outcome),
        None,
        "rescaled: read from the savepoint"
    );

    // 3. A pass-through map between the reduce and the sink, its script in a file of a
    // sub-directory.
    let v3 = Version {
        pass: true,
        ..v2.clone()
    };
    write_pass_script(tmp.path(), PASS);
    write_by_rename(&file, &v3.yaml());
    let outcome = applied(&run, &mut t, "a new pass-through operator");
    assert_eq!(
        op_plan(plan_of(&outcome, "totals"), "pass"),
        ("stateless".into(), false, None)
    );

    // 3b. Only the script file changes (in place): the watcher follows referenced scripts.
    write_pass_script(tmp.path(), PASS_REFACTORED);
    let outcome = applied(&run, &mut t, "the script file of `pass`");
    let plan = plan_of(&outcome, "totals");
    assert_eq!(op_plan(plan, "pass"), ("stateless".into(), true, None));
    assert_eq!(op_plan(plan, "total"), ("kept".into(), false, None));
    assert_eq!(handed_over(&outcome), Some(2), "{outcome:#?}");

    // 4. The stateful reduce removed, without --allow-non-restored-state: rejected.
    status = run.status();
    let before = pipeline(&status, "totals").source_records;
    let v4 = Version {
        total: None,
        ..v3.clone()
    };
    write_by_rename(&file, &v4.yaml());
    let (status, outcome) = run.wait_outcome(t.at, "rejected");
    t.at = outcome.at_ms;
    assert_eq!(status.reloads, t.reloads, "a rejected edit is not counted");
    let plan = plan_of(&outcome, "totals");
    assert_eq!(op_plan(plan, "total").0, "dropped");
    assert!(
        plan.problems
            .iter()
            .any(|m| m.contains("`total`") && m.contains("--allow-non-restored-state")),
        "{outcome:#?}"
    );
    let status = still_running(
        &run,
        &mut t,
        &file,
        &v3.yaml(),
        before,
        false,
        "the removal",
    );
    assert_eq!(status.reloads, t.reloads);

    // 5. Invalid YAML, written in place: rejected with diagnostics.
    let before = pipeline(&status, "totals").source_records;
    let broken = v3.yaml().replace("    sinks:\n", "    sinks: [\n");
    write_in_place(&file, &broken);
    let (status, outcome) = run.wait_outcome(t.at, "rejected");
    t.at = outcome.at_ms;
    assert_eq!(status.reloads, t.reloads);
    assert!(
        outcome
            .messages
            .iter()
            .any(|m| m.contains("the running version is left untouched")),
        "{outcome:#?}"
    );
    let status = still_running(
        &run,
        &mut t,
        &file,
        &v3.yaml(),
        before,
        false,
        "the invalid file",
    );
    assert_eq!(status.reloads, t.reloads);

    // 6. A script that throws on every record: the new version fails before its probation
    // checkpoint, and the old one comes back from the same savepoint.
    let before = pipeline(&status, "totals").source_records;
    let v6 = Version {
        total: Some(SUM_THROWS),
        ..v3.clone()
    };
    write_by_rename(&file, &v6.yaml());
    let (status, outcome) = run.wait_outcome(t.at, "rolled_back");
    t.at = outcome.at_ms;
    assert_eq!(status.reloads, t.reloads, "a rollback is not counted");
    let text = outcome.messages.join("\n");
    assert!(
        text.contains("the new version failed to start") && text.contains("undefined_helper"),
        "{outcome:#?}"
    );
    assert!(text.contains("rolled back"), "{outcome:#?}");
    let status = still_running(
        &run,
        &mut t,
        &file,
        &v3.yaml(),
        before,
        true,
        "the rollback",
    );
    assert_eq!(status.reloads, t.reloads);

    // 7. After the rollback, reloads apply again: a keep-everything filter before the
    // `key_by`, and parallelism 2 → 3.
    let v7 = Version {
        keep_all: true,
        total_parallelism: Some(3),
        ..v3.clone()
    };
    write_by_rename(&file, &v7.yaml());
    let outcome = applied(&run, &mut t, "a filter and parallelism 2 → 3");
    let plan = plan_of(&outcome, "totals");
    assert_eq!(op_plan(plan, "keep_all"), ("stateless".into(), false, None));
    assert_eq!(op_plan(plan, "total"), ("kept".into(), false, Some((2, 3))));

    // 8. The rate limit lifted (in place): the rest of the input goes fast. The pipeline was
    // still running, so every edit above happened mid-stream.
    let status = run.status();
    assert_eq!(
        pipeline(&status, "totals").state,
        "running",
        "the input ended before the last edit; make it longer: {status:#?}"
    );
    let v8 = Version {
        rate: None,
        ..v7.clone()
    };
    write_in_place(&file, &v8.yaml());
    // Without the limit the rest of the input goes in well under a second, so the run may
    // end before a status poll sees this reload (under load it did): the log tells instead.
    assert!(run.wait_exit(Duration::from_secs(120)), "{}", run.log());
    let log = run.log();
    assert_eq!(t.reloads, 5);
    assert_eq!(
        log.matches("Reload applied. pipeline=totals").count(),
        6,
        "the rate-limit edit was the sixth reload applied:\n{log}"
    );
    // Seven reloads took a savepoint (six applied, one rolled back); the last three stay.
    let kept: Vec<String> = std::fs::read_dir(tmp.path().join(".weir/savepoints"))
        .expect("the savepoint directory")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("savepoint-totals-"))
        .collect();
    assert_eq!(kept.len(), 3, "{kept:?}\n{log}");
    assert_eq!(
        log.matches("Removed the savepoint of an older reload.")
            .count(),
        4
    );
    for needle in [
        "Pipeline file changed; reloading.",
        "Reload applied.",
        "reload rejected",
        "reload rolled back",
    ] {
        assert!(
            log.contains(needle),
            "missing `{needle}` in the log:\n{log}"
        );
    }

    let lines = committed(&tmp.path().join("out/totals"));
    check_running_totals(&lines, COUNT as i64);
    let golden = straight_run(&v8.yaml(), PASS_REFACTORED);
    assert_eq!(golden.len(), COUNT as usize);
    let (got, want) = (
        canonical_lines(&lines.join("\n")),
        canonical_lines(&golden.join("\n")),
    );
    if got != want {
        let extra = got.iter().filter(|l| !want.contains(l)).take(5);
        let missing = want.iter().filter(|l| !got.contains(l)).take(5);
        panic!(
            "the output differs from a straight run of the final file ({} vs {} lines);\n\
             extra: {:?}\nmissing: {:?}",
            got.len(),
            want.len(),
            extra.collect::<Vec<_>>(),
            missing.collect::<Vec<_>>()
        );
    }
}

/// `weir reload --plan FILE` prints what a reload would do and applies nothing.
#[test]
fn reload_plan_prints_the_plan_and_applies_nothing() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let file = tmp.path().join("p.yaml");
    let running = Version {
        count: 200_000,
        rate: Some(2_000),
        keep_all: false,
        total: Some(SUM),
        total_parallelism: None,
        pass: false,
    };
    std::fs::write(&file, running.yaml()).expect("write the pipeline");
    let run = Running::start(tmp.path(), Path::new("p.yaml"), &[]);
    run.wait_until("the pipeline to run", |s| {
        s.pipelines
            .first()
            .is_some_and(|p| p.state == "running" && p.source_records > 0)
    });

    write_pass_script(tmp.path(), PASS);
    let plan = |candidate: Option<&Path>| {
        let mut args = vec!["reload", "--plan"];
        let candidate = candidate.map(|f| f.to_str().expect("a UTF-8 path"));
        args.extend(candidate);
        let out = run.cli(&args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // New script and parallelism of the reduce, a new stateless map before the sink.
    let good = tmp.path().join("good.yaml");
    std::fs::write(
        &good,
        Version {
            total: Some(SUM_REFACTORED),
            total_parallelism: Some(3),
            pass: true,
            ..running.clone()
        }
        .yaml(),
    )
    .expect("write the candidate");
    let (code, stdout, stderr) = plan(Some(&good));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    for needle in [
        "reload plan (nothing applied)",
        "pipeline totals: changed",
        "events",
        "total         state migrated (script changed)",
        "total         parallelism 1 → 3 (key groups redistributed)",
        "pass          stateless",
        "out           state kept",
    ] {
        assert!(stdout.contains(needle), "missing `{needle}` in:\n{stdout}");
    }

    // The reduce removed: its state would be dropped, so the plan has a problem (exit 1).
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(
        &bad,
        Version {
            total: None,
            ..running.clone()
        }
        .yaml(),
    )
    .expect("write the candidate");
    let (code, stdout, stderr) = plan(Some(&bad));
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("total         state dropped"),
        "missing the dropped state in:\n{stdout}"
    );
    assert!(
        stdout.contains("problem:") && stdout.contains("weir reload --allow-non-restored-state"),
        "{stdout}"
    );
    assert!(stderr.contains("would be rejected"), "{stderr}");

    // With no file: the running file against itself.
    let (code, stdout, stderr) = plan(None);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("pipeline totals: unchanged"), "{stdout}");

    // Nothing was applied: no reload, the same generation still running.
    let status = run.status();
    assert_eq!(status.reloads, 0, "{status:#?}");
    assert!(status.last_reload.is_none(), "{status:#?}");
    let p = pipeline(&status, "totals");
    assert_eq!(p.state, "running");
    assert!(p.restored_from.is_none(), "{p:#?}");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read the file"),
        running.yaml(),
        "the running file is untouched"
    );
}

/// The two-pipeline file: `steady` writes every generated record; `totals` is reloaded.
fn two_pipelines(totals_script: &'static str) -> String {
    let totals = Version {
        count: 30_000,
        rate: Some(2_500),
        keep_all: false,
        total: Some(totals_script),
        total_parallelism: None,
        pass: false,
    }
    .yaml();
    let totals = totals
        .strip_prefix("version: 1\npipelines:\n")
        .expect("the header");
    format!(
        "version: 1
pipelines:
  - id: steady
    state: {{backend: fs}}
    checkpoints: {{mode: exactly_once, interval: 1s, storage: .weir/checkpoints}}
    sources:
      - id: ticks
        type: generator
        count: 30000
        rate: 2500
        fields:
          n: {{kind: sequence}}
    operators:
      - id: tag
        type: map
        input: ticks
        script: |
          fn map(r) {{ r.tag = \"steady\"; r }}
    sinks:
      - {{id: copied, type: file, input: tag, path: out/steady}}
{totals}"
    )
}

/// An unchanged pipeline keeps running, without a pause or a restart, while another pipeline
/// of the same file reloads.
#[test]
fn an_unchanged_pipeline_keeps_running_while_another_reloads() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let file = tmp.path().join("p.yaml");
    std::fs::write(&file, two_pipelines(SUM)).expect("write the pipeline");
    // Started by a relative name: the reload re-reads it by its absolute path, and must still
    // see `steady` as unchanged.
    let mut run = Running::start(tmp.path(), Path::new("p.yaml"), &["--watch"]);
    let status = run.wait_until("both pipelines to checkpoint", |s| {
        s.pipelines.len() == 2
            && s.pipelines
                .iter()
                .all(|p| p.state == "running" && p.latest_checkpoint.is_some())
    });
    let steady_before = pipeline(&status, "steady").clone();

    write_by_rename(&file, &two_pipelines(SUM_REFACTORED));
    // Poll through the reload: `steady` never restarts (its counters only grow) and stays
    // running.
    let mut last = steady_before.clone();
    let status = run.wait_until("the reload of `totals`", |s| {
        let steady = pipeline(s, "steady");
        assert_eq!(steady.state, "running", "{s:#?}");
        assert!(
            steady.source_records >= last.source_records && steady.checkpoints >= last.checkpoints,
            "`steady` restarted: {last:#?} then {steady:#?}"
        );
        assert!(steady.restored_from.is_none(), "{steady:#?}");
        last = steady.clone();
        s.last_reload.is_some()
    });
    let outcome = status.last_reload.clone().expect("an outcome");
    assert_eq!(outcome.result, "applied", "{outcome:#?}\n{}", run.log());
    assert_eq!(status.reloads, 1);
    assert_eq!(plan_of(&outcome, "steady").change, "unchanged");
    assert_eq!(plan_of(&outcome, "totals").change, "changed");
    let steady = pipeline(&status, "steady");
    assert!(
        steady.source_records > steady_before.source_records,
        "`steady` went on during the reload: {steady_before:#?} then {steady:#?}"
    );
    assert!(
        pipeline(&status, "totals")
            .restored_from
            .as_deref()
            .is_some_and(|r| !r.is_empty()),
        "{status:#?}"
    );
    // `steady` never restored anything (it would have restarted).
    assert!(
        run.log()
            .lines()
            .filter(|l| l.contains("Pipeline started. pipeline=steady"))
            .all(|l| l.contains("restored_from=nothing")),
        "{}",
        run.log()
    );

    assert!(run.wait_exit(Duration::from_secs(120)), "{}", run.log());
    // `steady` wrote every record exactly once (a restart would have been visible as a
    // restore; a duplicate as a repeated `n`).
    let mut ns: Vec<i64> = committed(&tmp.path().join("out/steady"))
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            assert_eq!(v["tag"], "steady");
            v["n"].as_i64().expect("an n")
        })
        .collect();
    ns.sort_unstable();
    assert_eq!(ns, (0..30_000).collect::<Vec<_>>());
    check_running_totals(&committed(&tmp.path().join("out/totals")), 30_000);
    // `steady` started once; `totals` twice (the start and the reload).
    let log = run.log();
    assert_eq!(
        log.matches("Pipeline started. pipeline=steady").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("Pipeline started. pipeline=totals").count(),
        2,
        "{log}"
    );
}

/// A generator pipeline writing `n` to `out/<id>`; with `checkpoints`, exactly-once.
fn counter(id: &str, count: u64, checkpoints: bool) -> String {
    let checkpoints = if checkpoints {
        "    checkpoints: {mode: exactly_once, interval: 1s, storage: .weir/checkpoints}\n"
    } else {
        ""
    };
    format!(
        "  - id: {id}
{checkpoints}    sources:
      - {{id: ev, type: generator, count: {count}, rate: 2000, fields: {{n: {{kind: sequence}}}}}}
    sinks:
      - {{id: out, type: file, input: ev, path: out/{id}}}
"
    )
}

/// The `n` of every committed line of `out/<id>`, sorted.
fn counted(dir: &Path, id: &str) -> Vec<i64> {
    let mut ns: Vec<i64> = committed(&dir.join("out").join(id))
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            v["n"].as_i64().expect("an n")
        })
        .collect();
    ns.sort_unstable();
    ns
}

/// Pipelines removed from the file stop (with a savepoint when they take checkpoints, with a
/// plain stop when they do not); the one left runs to its end.
#[test]
fn pipelines_removed_from_the_file_stop() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let file = tmp.path().join("p.yaml");
    let kept = counter("kept", 12_000, true);
    std::fs::write(
        &file,
        format!(
            "version: 1\npipelines:\n{kept}{}{}",
            counter("plain", 40_000, false),
            counter("saved", 40_000, true)
        ),
    )
    .expect("write the pipeline");
    let mut run = Running::start(tmp.path(), Path::new("p.yaml"), &["--watch"]);
    run.wait_until("every pipeline to run", |s| {
        s.pipelines.len() == 3
            && s.pipelines.iter().all(|p| p.state == "running")
            && pipeline(s, "saved").latest_checkpoint.is_some()
    });

    write_by_rename(&file, &format!("version: 1\npipelines:\n{kept}"));
    let (status, outcome) = run.wait_outcome(0, "applied");
    assert_eq!(status.reloads, 1);
    assert_eq!(plan_of(&outcome, "kept").change, "unchanged");
    assert_eq!(plan_of(&outcome, "plain").change, "removed");
    assert_eq!(plan_of(&outcome, "saved").change, "removed");
    let text = outcome.messages.join("\n");
    assert!(
        text.contains("pipeline `saved` removed; its state is in savepoint"),
        "{outcome:#?}"
    );
    assert!(
        text.contains("pipeline `plain` removed; it took no checkpoints"),
        "{outcome:#?}"
    );
    let ids: Vec<&str> = status.pipelines.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["kept"], "{status:#?}");

    // The job ends with `kept`: the removed ones do not run on unseen to the end of their
    // input.
    assert!(run.wait_exit(Duration::from_secs(120)), "{}", run.log());
    assert_eq!(counted(tmp.path(), "kept"), (0..12_000).collect::<Vec<_>>());
    for id in ["plain", "saved"] {
        let ns = counted(tmp.path(), id);
        assert!(
            ns.len() < 40_000,
            "`{id}` ran to its end after its removal:\n{}",
            run.log()
        );
        assert_eq!(ns, (0..ns.len() as i64).collect::<Vec<_>>(), "{id}");
    }
}

/// A file nested 5 000 levels deep, whether a plan compares it (`POST /v1/reload` with
/// `plan_only`, on the control thread) or an edit brings it under `--watch`, is refused with
/// a depth diagnostic, and the job runs on: such a file used to overflow the control thread's
/// stack and abort the whole process.
#[test]
fn a_file_too_deep_to_load_is_refused_and_the_job_keeps_running() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let file = tmp.path().join("p.yaml");
    let running = format!(
        "version: 1\npipelines:\n{}",
        counter("steady", 400_000, false)
    );
    std::fs::write(&file, &running).expect("write the pipeline");
    let mut run = Running::start(tmp.path(), Path::new("p.yaml"), &["--watch"]);
    run.wait_until("the pipeline to run", |s| {
        s.pipelines
            .first()
            .is_some_and(|p| p.state == "running" && p.source_records > 0)
    });
    let deep = format!("{running}x:\n{}z\n", "- ".repeat(5_000));

    // A plan against a deep candidate file.
    let candidate = tmp.path().join("deep.yaml");
    std::fs::write(&candidate, &deep).expect("write the candidate");
    let out = run.cli(&[
        "reload",
        "--plan",
        candidate.to_str().expect("a UTF-8 path"),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}\nrun log:\n{}",
        run.log()
    );
    assert!(text.contains("weir::yaml::depth"), "{text}");
    assert!(text.contains("256 levels"), "{text}");
    assert!(run.is_running(), "`weir run` died:\n{}", run.log());

    // The watched file itself.
    write_by_rename(&file, &deep);
    let (status, outcome) = run.wait_outcome(0, "rejected");
    let messages = outcome.messages.join("\n");
    assert!(messages.contains("weir::yaml::depth"), "{outcome:#?}");
    assert!(
        messages.contains("the running version is left untouched"),
        "{outcome:#?}"
    );
    assert_eq!(status.reloads, 0);
    let from = pipeline(&status, "steady").source_records;
    run.wait_until("records to flow after the deep edit", |s| {
        let p = pipeline(s, "steady");
        p.state == "running" && p.source_records > from
    });
    assert!(run.is_running(), "`weir run` died:\n{}", run.log());
}

/// A pipeline whose script fails on every record, restarting in a loop: it cannot take a
/// savepoint, yet editing its file fixes it (the new version starts from the latest completed
/// checkpoint) and the output is exactly once; `weir stop` during a restart back-off stops it
/// at once.
#[test]
fn a_crash_looping_pipeline_is_fixed_by_an_edit_and_stops_during_back_off() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let file = tmp.path().join("p.yaml");
    let version = |script: &str| {
        format!(
            "version: 1
pipelines:
  - id: loop
    checkpoints: {{mode: exactly_once, interval: 300ms, storage: .weir/checkpoints}}
    restart: {{strategy: fixed_delay, attempts: 1000, delay: 400ms}}
    sources:
      - {{id: ev, type: generator, count: 8000, rate: 2000, fields: {{n: {{kind: sequence}}}}}}
    operators:
      - id: check
        type: map
        input: ev
        script: |
          {script}
    sinks:
      - {{id: out, type: file, input: check, path: out/loop}}
"
        )
    };
    // Fails from record 3000 on: checkpoints before that complete.
    let broken = "fn map(r) { if r.n >= 3000 { missing_helper(r) } else { r } }";
    let fixed = "fn map(r) { r }";
    // Edited during a restart back-off (2 s long, so the edit lands inside it however
    // loaded the machine): a savepoint cannot be taken then. Edited while a restarted
    // attempt still runs (before it reaches record 3000), a savepoint could succeed.
    std::fs::write(&file, version(broken).replace("delay: 400ms", "delay: 2s"))
        .expect("write the pipeline");
    let mut run = Running::start(tmp.path(), Path::new("p.yaml"), &["--watch"]);
    run.wait_until("the pipeline to wait to restart after failures", |s| {
        let p = pipeline(s, "loop");
        p.restarts >= 2 && p.state == "restarting"
    });
    write_by_rename(&file, &version(fixed));
    let (_, outcome) = run.wait_outcome(0, "applied");
    assert!(
        outcome
            .messages
            .join("\n")
            .contains("starts from its latest completed checkpoint"),
        "{outcome:#?}"
    );
    assert!(run.wait_exit(Duration::from_secs(120)), "{}", run.log());
    assert_eq!(counted(tmp.path(), "loop"), (0..8000).collect::<Vec<_>>());

    // Broken again, and stopped while it waits to restart.
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let file = tmp.path().join("p.yaml");
    std::fs::write(&file, version(broken).replace("delay: 400ms", "delay: 3s"))
        .expect("write the pipeline");
    let mut run = Running::start(tmp.path(), Path::new("p.yaml"), &[]);
    run.wait_until("a restart back-off", |s| pipeline(s, "loop").restarts >= 1);
    let out = run.cli(&["stop", "loop"]);
    assert!(
        out.status.success(),
        "weir stop failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        run.log()
    );
    // It used to hang here: the stop waited for a checkpoint no task could take.
    run.wait_exit(Duration::from_secs(60));
    let log = run.log();
    assert!(
        log.contains("the restart is called off") || log.contains("Stop requested (no savepoint)"),
        "{log}"
    );
}
