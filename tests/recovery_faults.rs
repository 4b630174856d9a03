//! Recovery by equivalence, in process: every reference pipeline, with checkpoints on,
//! must produce its failure-free golden output after (a) an operator that fails once on
//! record k (as a script that throws) and (b) an operator that panics once; on the memory
//! backend (checkpoints kept in the process) and on fs. A longer keyed job checks that the
//! restore happens mid-stream from a completed checkpoint. Failover scopes (`region`,
//! `full`, `individual`, `noop`) are checked on a pipeline with two disconnected parts.
//! Unaligned checkpoints recover on the memory backend with their channel state replayed.
//! Processes killed with SIGKILL are `recovery_kill.rs`'s business.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;
use common::in_process::{
    assert_ok, copy_reference_pipelines, file_sinks, golden, plan_of, reference_files,
};
use common::output::committed;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_engine::job::{self, JobOptions, JobSummary};
use weir_engine::plan::{FilePlan, NodeKind};
use weir_engine::runtime::fault::{Fault, FaultKind};
use weir_schema::units::DurationSpec;
use weir_schema::{CheckpointMode, CheckpointSpec, FixedDelaySpec, RestartSpec, StateSpec};

/// Checkpoints every `interval` ms in `mode`, restarts without delay, on `state`.
fn with_checkpoints(plan: &mut FilePlan, state: &StateSpec, interval: u64, storage: &Path) {
    for p in &mut plan.pipelines {
        p.spec.state = state.clone();
        p.spec.checkpoints = CheckpointSpec {
            enabled: true,
            interval: DurationSpec::from_millis(interval),
            mode: CheckpointMode::ExactlyOnce,
            storage: storage.to_string_lossy().into_owned(),
            ..CheckpointSpec::default()
        };
        p.spec.restart = Some(RestartSpec::FixedDelay(FixedDelaySpec {
            attempts: 3,
            delay: DurationSpec::from_millis(0),
        }));
    }
}

/// The first operator with input of each pipeline, and half its failure-free input count.
fn fault_targets(plan: &FilePlan, summary: &JobSummary) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    for (p, s) in plan.pipelines.iter().zip(&summary.pipelines) {
        let target = p
            .nodes
            .iter()
            .filter(|n| matches!(n.kind, NodeKind::Operator(_)))
            .find_map(|n| {
                let node = s.nodes.iter().find(|x| x.id == n.id)?;
                (node.records_in > 0).then(|| (n.id.clone(), node.records_in))
            });
        if let Some((op, n)) = target {
            out.push((p.id.clone(), op, n.div_ceil(2)));
        }
    }
    out
}

fn reference_pipelines_recover_from(kind: FaultKind, state: StateSpec) {
    let tmp = tempfile::tempdir().unwrap();
    let root = copy_reference_pipelines(tmp.path());
    let mut compared = 0;
    for yaml in reference_files(&root) {
        let name = yaml.file_stem().unwrap().to_string_lossy().into_owned();
        // A failure-free run tells how many records reach each operator.
        let mut clean = plan_of(&yaml);
        with_checkpoints(&mut clean, &state, 5, &tmp.path().join("ck-clean"));
        let clean_summary = job::run(clean.clone(), JobOptions::default()).unwrap();
        assert_ok(&clean_summary, &name);
        let targets = fault_targets(&clean, &clean_summary);
        assert!(!targets.is_empty(), "{name}: no operator to fail");

        let mut plan = plan_of(&yaml);
        with_checkpoints(&mut plan, &state, 5, &tmp.path().join(format!("ck-{name}")));
        let sinks = file_sinks(&plan);
        let faults: Vec<(String, String, Arc<Fault>)> = targets
            .iter()
            .map(|(p, op, k)| (p.clone(), op.clone(), Arc::new(Fault::new(*k, kind))))
            .collect();
        let options = JobOptions {
            faults: faults.clone(),
            ..JobOptions::default()
        };
        let summary = job::run(plan, options).unwrap();
        assert_ok(&summary, &name);
        for (p, op, f) in &faults {
            assert!(f.fired(), "{name}/{p}: the fault in `{op}` never struck");
            let ps = summary.pipelines.iter().find(|s| &s.id == p).unwrap();
            assert_eq!(ps.restarts, 1, "{name}/{p}: one failure, one restart");
        }
        for (pipeline, sink, dir) in sinks {
            let Some(expected) = golden(&root, &name, &pipeline, &sink) else {
                continue;
            };
            assert_eq!(
                committed(&dir),
                expected,
                "{name}/{pipeline}/{sink} after {kind:?}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 5, "only {compared} sinks compared");
}

#[test]
fn reference_pipelines_recover_from_a_script_error_on_memory() {
    reference_pipelines_recover_from(FaultKind::Error, StateSpec::Memory);
}

#[test]
fn reference_pipelines_recover_from_a_panic_on_memory() {
    reference_pipelines_recover_from(FaultKind::Panic, StateSpec::Memory);
}

#[test]
fn reference_pipelines_recover_from_a_script_error_on_fs() {
    reference_pipelines_recover_from(FaultKind::Error, StateSpec::Fs);
}

/// W1-like input: `n` records over `users` users, deterministic.
fn write_input(path: &Path, n: u64, users: u64) -> BTreeMap<String, (i64, i64)> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut totals = BTreeMap::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let user = format!("u{}", x % users);
        let amount = (x >> 20) % 100;
        writeln!(f, r#"{{"user":"{user}","amount":{amount},"ts":{i}}}"#).unwrap();
        let e = totals.entry(user).or_insert((0, 0));
        e.0 += amount as i64;
        e.1 += 1;
    }
    totals
}

fn keyed_job(dir: &Path, state: &str, failover: &str) -> PathBuf {
    let yaml = dir.join("job.yaml");
    std::fs::write(
        &yaml,
        format!(
            r#"version: 1
pipelines:
  - id: totals
    parallelism: 2
    state: {{ backend: {state} }}
    checkpoints: {{ interval: 20ms, storage: ck }}
    restart: {{ strategy: fixed_delay, attempts: 3, delay: 0ms }}
    failover: {failover}
    sources:
      - {{ id: in, type: file, path: in.jsonl }}
    operators:
      - {{ id: by_user, type: key_by, input: in, field: user }}
      - id: sum
        type: reduce
        input: by_user
        emit: final
        script: |
          fn reduce(acc, r) {{ #{{user: acc.user, amount: acc.amount + r.amount, n: acc.n + r.n}} }}
      - id: ones
        type: map
        input: in
        script: |
          fn map(r) {{ #{{user: r.user, amount: r.amount, n: 1}} }}
    sinks:
      - {{ id: out, type: file, input: sum, path: out }}
"#
        ),
    )
    .unwrap();
    yaml
}

/// A keyed job long enough for checkpoints to complete before the fault: the restart
/// resumes from one (not from the start), and the totals are exact.
#[test]
fn keyed_job_resumes_mid_stream_from_a_checkpoint() {
    for state in ["memory", "fs"] {
        let tmp = tempfile::tempdir().unwrap();
        let expected = write_input(&tmp.path().join("in.jsonl"), 200_000, 2_000);
        let yaml = keyed_job(tmp.path(), state, "region");
        // `ones` feeds `sum`: rewire (the YAML lists `sum` on `by_user`, which reads `in`).
        let text = std::fs::read_to_string(&yaml)
            .unwrap()
            .replace("input: in, field: user", "input: ones, field: user");
        std::fs::write(&yaml, text).unwrap();
        let plan = plan_of(&yaml);
        let fault = Arc::new(Fault::new(150_000, FaultKind::Error));
        let options = JobOptions {
            faults: vec![("totals".into(), "sum".into(), Arc::clone(&fault))],
            ..JobOptions::default()
        };
        let summary = job::run(plan, options).unwrap();
        assert_ok(&summary, state);
        assert!(fault.fired());
        let p = &summary.pipelines[0];
        assert_eq!(p.restarts, 1, "{state}");
        assert!(
            p.checkpoints > 0,
            "{state}: no checkpoint completed before the end"
        );
        let source_in = p.nodes.iter().find(|n| n.id == "in").unwrap().records_in;
        // The restart replayed only what followed the restored checkpoint.
        assert!(
            source_in < 2 * 200_000,
            "{state}: the source re-read everything ({source_in} records)"
        );
        let got: BTreeMap<String, (i64, i64)> = committed(&tmp.path().join("out"))
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["user"].as_str().unwrap().to_owned(),
                    (v["amount"].as_i64().unwrap(), v["n"].as_i64().unwrap()),
                )
            })
            .collect();
        assert_eq!(got.len(), expected.len(), "{state}: one line per user");
        assert_eq!(got, expected, "{state}: totals after recovery");
    }
}

/// Unaligned checkpoints on the memory backend (checkpoints kept in the process; SIGKILL
/// runs are `recovery_kill.rs`'s, on fs and RocksDB): a slow keyed reduce keeps its input
/// channels full, so barriers overtake queued records, which the checkpoints store as channel
/// state; a fault then makes the pipeline restore from one, replaying it. The totals are exact.
#[test]
fn unaligned_checkpoints_recover_in_process_on_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = write_input(&tmp.path().join("in.jsonl"), 120_000, 2_000);
    let yaml = keyed_job(tmp.path(), "memory", "region");
    let text = std::fs::read_to_string(&yaml)
        .unwrap()
        .replace("input: in, field: user", "input: ones, field: user")
        .replace(
            "checkpoints: { interval: 20ms, storage: ck }",
            "checkpoints: { interval: 20ms, storage: ck, unaligned: true }",
        )
        .replace(
            "fn reduce(acc, r) { #",
            "fn reduce(acc, r) { let x = 0; for i in 0..60 { x += i; } #",
        );
    assert!(text.contains("unaligned: true") && text.contains("0..60"));
    std::fs::write(&yaml, text).unwrap();
    let plan = plan_of(&yaml);
    let fault = Arc::new(Fault::new(90_000, FaultKind::Error));
    let options = JobOptions {
        faults: vec![("totals".into(), "sum".into(), Arc::clone(&fault))],
        // A thread per task: with one per core the spinning reduce tasks starve the sources
        // of their thread, the channels run dry and no barrier has anything to overtake.
        worker_threads: Some(8),
        ..JobOptions::default()
    };
    let summary = job::run(plan, options).unwrap();
    assert_ok(&summary, "unaligned");
    assert!(fault.fired());
    let p = &summary.pipelines[0];
    assert_eq!(p.restarts, 1);
    assert!(
        p.checkpoint_stats.iter().any(|c| c.channel_state_bytes > 0),
        "no completed checkpoint stored channel state: {:?}",
        p.checkpoint_stats
            .iter()
            .map(|c| (c.checkpoint, c.channel_state_bytes))
            .collect::<Vec<_>>()
    );
    let got: BTreeMap<String, (i64, i64)> = committed(&tmp.path().join("out"))
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["user"].as_str().unwrap().to_owned(),
                (v["amount"].as_i64().unwrap(), v["n"].as_i64().unwrap()),
            )
        })
        .collect();
    assert_eq!(
        got, expected,
        "totals after recovery with unaligned checkpoints"
    );
}

/// Two disconnected parts in one pipeline; `a` fails once. `region` restarts only `a`'s
/// part (`b`'s source reads its input once), `full` restarts both, `individual` restarts
/// the failed subtask alone, `noop` leaves it down and reports the pipeline degraded.
#[test]
fn failover_strategies_restart_their_scope() {
    let tmp = tempfile::tempdir().unwrap();
    write_input(&tmp.path().join("a.jsonl"), 20_000, 100);
    write_input(&tmp.path().join("b.jsonl"), 20_000, 100);
    let run = |failover: &str| -> JobSummary {
        let yaml = tmp.path().join(format!("{failover}.yaml"));
        std::fs::write(
            &yaml,
            format!(
                r#"version: 1
pipelines:
  - id: two_parts
    parallelism: 1
    restart: {{ strategy: fixed_delay, attempts: 3, delay: 0ms }}
    failover: {failover}
    sources:
      - {{ id: a_in, type: file, path: a.jsonl }}
      - {{ id: b_in, type: file, path: b.jsonl }}
    operators:
      - id: a_map
        type: map
        input: a_in
        script: "fn map(r) {{ r }}"
      - id: b_map
        type: map
        input: b_in
        script: "fn map(r) {{ r }}"
    sinks:
      - {{ id: a_out, type: file, input: a_map, path: out-{failover}/a }}
      - {{ id: b_out, type: file, input: b_map, path: out-{failover}/b }}
"#
            ),
        )
        .unwrap();
        let plan = plan_of(&yaml);
        let fault = Arc::new(Fault::new(10_000, FaultKind::Error));
        let options = JobOptions {
            faults: vec![("two_parts".into(), "a_map".into(), Arc::clone(&fault))],
            ..JobOptions::default()
        };
        let s = job::run(plan, options).unwrap();
        assert!(fault.fired());
        s
    };
    let count = |s: &JobSummary, id: &str| {
        s.pipelines[0]
            .nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap()
            .records_in
    };

    let region = run("region");
    assert_ok(&region, "region");
    assert_eq!(region.pipelines[0].restarts, 1);
    assert_eq!(count(&region, "b_in"), 20_000, "region: b kept running");
    assert!(count(&region, "a_in") > 20_000, "region: a restarted");
    assert_eq!(committed(&tmp.path().join("out-region/a")).len(), 20_000);

    let full = run("full");
    assert_ok(&full, "full");
    assert!(count(&full, "a_in") > 20_000, "full: a restarted");
    assert!(
        count(&full, "b_in") >= 20_000,
        "full: b restarted too (it may have finished first)"
    );
    assert_eq!(committed(&tmp.path().join("out-full/a")).len(), 20_000);
    assert_eq!(committed(&tmp.path().join("out-full/b")).len(), 20_000);

    let individual = run("individual");
    assert_ok(&individual, "individual");
    assert_eq!(individual.pipelines[0].restarts, 1);
    assert_eq!(
        count(&individual, "b_in"),
        20_000,
        "individual: b untouched"
    );

    let noop = run("noop");
    assert_ok(&noop, "noop");
    assert_eq!(noop.pipelines[0].restarts, 0, "noop restarts nothing");
    assert_eq!(noop.pipelines[0].degraded, 1, "noop: one task down");
    assert_eq!(committed(&tmp.path().join("out-noop/b")).len(), 20_000);
}

/// `restart: none` gives up at the first failure: the pipeline fails with the operator,
/// subtask and record in its error.
#[test]
fn restart_none_fails_the_pipeline_with_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    write_input(&tmp.path().join("a.jsonl"), 1_000, 10);
    let yaml = tmp.path().join("none.yaml");
    std::fs::write(
        &yaml,
        r#"version: 1
pipelines:
  - id: p
    restart: { strategy: none }
    sources:
      - { id: a_in, type: file, path: a.jsonl }
    operators:
      - { id: a_map, type: map, input: a_in, script: "fn map(r) { r }" }
    sinks:
      - { id: a_out, type: file, input: a_map, path: out }
"#,
    )
    .unwrap();
    let fault = Arc::new(Fault::new(500, FaultKind::Error));
    let options = JobOptions {
        faults: vec![("p".into(), "a_map".into(), Arc::clone(&fault))],
        ..JobOptions::default()
    };
    let s = job::run(plan_of(&yaml), options).unwrap();
    let e = s.pipelines[0].error.as_ref().expect("the pipeline fails");
    let text = e.to_string();
    assert!(text.contains("a_map"), "{text}");
    assert!(text.contains("subtask 0"), "{text}");
    assert!(text.contains("record:"), "{text}");
    assert!(text.contains("never restarts"), "{text}");
}
