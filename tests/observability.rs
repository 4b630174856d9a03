//! Seeing what a pipeline does, through the real `weir` binary: `weir checkpoints` against a
//! running `weir run` (completed and failed checkpoints, table and JSON); `weir inspect` on
//! savepoints and checkpoints of every state backend taken by real runs (figures, source
//! positions and a dump checked against the known input; a damaged file named); and the log
//! of `weir run` (checkpoints only at debug, the start-up line once, a failure once,
//! `--log-format json`, `--log-level`, the help).
//!
//! No assertion is about time: every wait polls the job's status against a generous deadline.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::binary::{plain, weir};
use common::run::{Run, beside, run_to_end_with};
use serde_json::Value;
use weir_engine::control::CheckpointInfo;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write_yaml(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("p.yaml");
    std::fs::write(&path, text).expect("write the pipeline");
    path
}

/// An endless rate-limited generator into a keyed count, checkpoints every 100 ms that may
/// fail without failing the pipeline.
const ENDLESS: &str = r#"version: 1
pipelines:
  - id: counts
    state: { backend: fs }
    checkpoints: { mode: exactly_once, interval: 100ms, tolerable_failures: 100000 }
    sources:
      - id: gen
        type: generator
        seed: 7
        rate: 2000
        fields:
          user: { kind: key, prefix: u-, cardinality: 7 }
    operators:
      - id: by_user
        type: key_by
        input: gen
        field: user
      - id: running
        type: process
        input: by_user
        state: { clicks: value }
        script: |
          fn process(r) {
              let n = state_get("clicks");
              if n == () { n = 0; }
              state_set("clicks", n + 1);
              emit(#{user: r.user, clicks: n + 1});
          }
    sinks:
      - id: out
        type: file
        input: running
        path: out/counts
"#;

fn history(run: &Run, pipeline: &str) -> Vec<CheckpointInfo> {
    let out = run.cli(&["checkpoints", pipeline, "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("a JSON array of checkpoints")
}

#[test]
fn checkpoints_shows_completed_and_failed_checkpoints_of_a_running_pipeline() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let yaml = write_yaml(dir.path(), ENDLESS);
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_checkpoints(&["counts"], 3);

    let done = history(&run, "counts");
    assert!(done.len() >= 3, "{done:#?}");
    assert!(done.windows(2).all(|w| w[0].id < w[1].id), "{done:#?}");
    for c in &done {
        assert_eq!(
            (c.kind.as_str(), c.status.as_str()),
            ("checkpoint", "completed")
        );
        assert!(c.size > 0 && c.failure.is_none(), "{c:#?}");
        assert!(c.end_time_ms() >= c.trigger_time_ms, "{c:#?}");
        let tasks: Vec<&str> = c.subtasks.iter().map(|s| s.task.as_str()).collect();
        assert!(
            tasks.contains(&"gen[0]") && tasks.contains(&"running[0]"),
            "{c:#?}"
        );
    }

    let out = run.cli(&["checkpoints", "counts"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .map(|l| {
            l.split("  ")
                .filter(|c| !c.is_empty())
                .map(str::trim)
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        header,
        [
            "ID",
            "KIND",
            "STATUS",
            "TRIGGERED",
            "ENDED",
            "DURATION",
            "SIZE",
            "NEW",
            "SLOWEST SUBTASK",
            "ALIGNMENT"
        ],
        "{table}"
    );
    let first = lines.next().unwrap_or_default();
    assert!(
        first.trim_start().starts_with(&done[0].id.to_string())
            && first.contains("checkpoint  completed"),
        "{table}"
    );

    // Checkpoint storage turns into a file: every checkpoint after that fails (the tasks
    // cannot write their snapshots), and the pipeline runs on.
    let storage = dir.path().join(".weir/checkpoints/counts");
    std::fs::rename(&storage, dir.path().join("moved")).expect("move the checkpoint storage");
    std::fs::write(&storage, "not a directory").expect("put a file in its place");
    let client = weir_engine::api::ApiClient::new(&run.api, None).expect("a client");
    run.wait_until("a failed checkpoint in the history", || {
        client
            .checkpoints("counts")
            .is_ok_and(|h| h.iter().any(|c| c.status == "failed"))
    });
    let all = history(&run, "counts");
    let failed = all
        .iter()
        .find(|c| c.status == "failed")
        .expect("a failed checkpoint");
    // A task could not write its snapshot, or the metadata could not be written.
    let reason = failed.failure.clone().unwrap_or_default();
    assert!(
        reason.contains("declined by") || reason.contains("writing metadata failed"),
        "{failed:#?}"
    );
    assert_eq!((failed.size, failed.new_bytes), (0, 0), "{failed:#?}");
    let table = stdout(&run.cli(&["checkpoints", "counts"]));
    assert!(
        table.contains(&format!("checkpoint {} failed: {reason}", failed.id)),
        "{table}"
    );
    assert!(run.log().contains("Checkpoint failed."), "{}", run.log());
    // Once per failed checkpoint, not once more per declining task.
    assert!(!run.log().contains("Snapshot failed"), "{}", run.log());

    let out = run.cli(&["checkpoints", "nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("weir::api::no_such_pipeline") && stderr(&out).contains("counts"),
        "{}",
        stderr(&out)
    );
    run.kill();
}

/// Five users, twelve records each, `v` 0..60: per user the count (12) and the sum of `v`.
fn input() -> String {
    (0..60)
        .map(|i| format!("{{\"user\":\"u{}\",\"v\":{i}}}\n", i % 5))
        .collect()
}

fn total_of(user: &str) -> i64 {
    (0..60i64).filter(|i| format!("u{}", i % 5) == user).sum()
}

/// A followed file (the pipeline runs on after the input) into per-user `clicks` and `total`.
fn keyed(backend: &str) -> String {
    format!(
        r#"version: 1
pipelines:
  - id: p
    state: {backend}
    checkpoints: {{ mode: exactly_once, interval: 100ms }}
    sources:
      - id: lines
        type: file
        path: in.jsonl
        follow: true
    operators:
      - id: by_user
        type: key_by
        input: lines
        field: user
      - id: running
        type: process
        input: by_user
        state: {{ clicks: value, total: value }}
        script: |
          fn process(r) {{
              let n = state_get("clicks");
              if n == () {{ n = 0; }}
              let t = state_get("total");
              if t == () {{ t = 0; }}
              state_set("clicks", n + 1);
              state_set("total", t + r.v);
              emit(#{{user: r.user, clicks: n + 1}});
          }}
    sinks:
      - id: out
        type: file
        input: running
        path: out
"#
    )
}

fn inspect(args: &[&str]) -> Output {
    plain()
        .arg("inspect")
        .args(args)
        .output()
        .expect("run weir inspect")
}

/// Checks what `weir inspect` says of a snapshot taken after the whole input was processed.
fn check_snapshot(path: &Path, input_len: u64, what: &str) {
    let p = path.to_str().expect("a UTF-8 path");
    let out = inspect(&[p, "--format", "json"]);
    assert!(out.status.success(), "{what}: {}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["pipeline"], "p", "{what}: {report:#}");
    assert_eq!(
        report["problems"],
        Value::Array(vec![]),
        "{what}: {report:#}"
    );
    let op = |id: &str| -> Value {
        report["operators"]
            .as_array()
            .and_then(|ops| ops.iter().find(|o| o["id"] == id))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let running = op("running");
    assert_eq!(running["type"], "process", "{what}: {running:#}");
    assert_eq!(running["entries"], 10, "{what}: {running:#}");
    let mut states: Vec<(String, u64)> = running["states"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| {
                    (
                        s["name"].as_str().unwrap_or_default().to_owned(),
                        s["keys"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    states.sort();
    assert_eq!(
        states,
        [("clicks".to_owned(), 5), ("total".to_owned(), 5)],
        "{what}: {running:#}"
    );
    let groups: u64 = running["key_groups"]
        .as_array()
        .map(|g| g.iter().map(|g| g["entries"].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0);
    assert_eq!(groups, 10, "{what}: {running:#}");
    // The source's position: its one file read to the end of the input.
    let local = &op("lines")["subtasks"][0]["local"];
    let split = &local["splits"][0];
    assert!(
        split["split"]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("in.jsonl")),
        "{what}: {local:#}"
    );
    assert_eq!(
        split["progress"]["Reading"]["offset"].as_u64(),
        Some(input_len),
        "{what}: {local:#}"
    );

    let text = stdout(&inspect(&[p]));
    for needle in [
        "state clicks (value): 5 keys",
        "state total (value): 5 keys",
        "source `lines` (file)",
        "operator `running` (process)",
    ] {
        assert!(
            text.contains(needle),
            "{what}: missing `{needle}` in:\n{text}"
        );
    }

    let out = inspect(&[p, "--dump", "running", "--state", "total"]);
    assert!(out.status.success(), "{what}: {}", stderr(&out));
    let mut dumped: Vec<(String, i64)> = stdout(&out)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(v["state"], "total", "{l}");
            (
                v["key"].as_str().unwrap_or_default().to_owned(),
                v["value"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    dumped.sort();
    let want: Vec<(String, i64)> = (0..5)
        .map(|u| (format!("u{u}"), total_of(&format!("u{u}"))))
        .collect();
    assert_eq!(dumped, want, "{what}");
    let out = inspect(&[p, "--dump", "running"]);
    let clicks: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|v| v["state"] == "clicks")
        .collect();
    assert_eq!(clicks.len(), 5, "{what}");
    assert!(
        clicks.iter().all(|v| v["value"] == 12),
        "{what}: {clicks:?}"
    );

    let out = inspect(&[p, "--dump", "running", "--state", "nope"]);
    assert_eq!(out.status.code(), Some(1), "{what}");
    assert!(
        stderr(&out).contains("no keyed state `nope`") && stderr(&out).contains("clicks"),
        "{what}: {}",
        stderr(&out)
    );
}

/// The newest checkpoint directory in `storage`.
fn latest_checkpoint(storage: &Path) -> PathBuf {
    let mut dirs: Vec<(u64, PathBuf)> = std::fs::read_dir(storage)
        .expect("checkpoint storage")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name.strip_prefix("chk-")?.parse().ok()?;
            e.path().join("_metadata").is_file().then(|| (n, e.path()))
        })
        .collect();
    dirs.sort();
    dirs.pop().expect("a completed checkpoint").1
}

#[test]
fn inspect_reads_savepoints_and_checkpoints_of_every_backend() {
    let data = input();
    for backend in [
        "{ backend: memory }",
        "{ backend: fs }",
        "{ backend: rocksdb, incremental: true }",
    ] {
        // One run for a savepoint, one stopped for its last checkpoint (`memory` keeps its
        // checkpoints in the process: a savepoint only).
        for savepoint in [true, false] {
            if !savepoint && backend.contains("memory") {
                continue;
            }
            let dir = tempfile::tempdir().expect("a temporary directory");
            std::fs::write(dir.path().join("in.jsonl"), &data).expect("write the input");
            let yaml = write_yaml(dir.path(), &keyed(backend));
            let mut run = Run::start(beside(&yaml), &yaml, &[]);
            run.wait_for("the whole input read", |s| {
                common::run::pipeline_of(s, "p")["sink_records"].as_u64() == Some(60)
            });
            run.wait_checkpoints(&["p"], 2);
            if savepoint {
                let out = run.cli(&["savepoint", "p"]);
                let path = run.savepoint_path(&out, "weir savepoint");
                check_snapshot(&path, data.len() as u64, &format!("savepoint, {backend}"));
                run.kill();
            } else {
                let out = run.cli(&["stop", "p"]);
                assert!(out.status.success(), "{}", stderr(&out));
                run.finish_ok();
                let chk = latest_checkpoint(&dir.path().join(".weir/checkpoints/p"));
                check_snapshot(
                    &chk,
                    data.len() as u64,
                    &format!("{}, {backend}", chk.display()),
                );
            }
        }
    }
}

#[test]
fn inspect_names_a_damaged_or_missing_file() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let data = input();
    std::fs::write(dir.path().join("in.jsonl"), &data).expect("write the input");
    let yaml = write_yaml(dir.path(), &keyed("{ backend: fs }"));
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_for("the whole input read", |s| {
        common::run::pipeline_of(s, "p")["sink_records"].as_u64() == Some(60)
    });
    let out = run.cli(&["savepoint", "p"]);
    let savepoint = run.savepoint_path(&out, "weir savepoint");
    run.kill();

    let keyed: PathBuf = std::fs::read_dir(
        savepoint.join(
            std::fs::read_dir(&savepoint)
                .expect("the savepoint")
                .filter_map(Result::ok)
                .find(|e| e.path().is_dir())
                .expect("its chk- directory")
                .file_name(),
        ),
    )
    .expect("the chk- directory")
    .filter_map(Result::ok)
    .map(|e| e.path())
    .find(|p| p.to_string_lossy().ends_with("running-0.keyed"))
    .expect("the keyed state of `running`");
    let bytes = std::fs::read(&keyed).expect("read it");
    std::fs::write(&keyed, &bytes[..bytes.len() / 2]).expect("truncate it");
    let sp = savepoint.to_str().expect("UTF-8");

    let out = inspect(&[sp]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&keyed.display().to_string()) && err.contains("1 damaged or missing file"),
        "{err}"
    );
    // The rest is still shown.
    assert!(
        stdout(&out).contains("source `lines` (file)"),
        "{}",
        stdout(&out)
    );

    let out = inspect(&[sp, "--dump", "running"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("weir::inspect::damaged")
            && stderr(&out).contains(&keyed.display().to_string()),
        "{}",
        stderr(&out)
    );

    std::fs::remove_file(&keyed).expect("remove it");
    let out = inspect(&[sp]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&keyed.display().to_string()),
        "{}",
        stderr(&out)
    );

    std::fs::write(
        savepoint.join("_metadata"),
        b"weir-checkpoint-metadata v1 len=3",
    )
    .expect("w");
    let out = inspect(&[sp]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("_metadata") && stderr(&out).contains("weir::inspect::damaged"),
        "{}",
        stderr(&out)
    );
    let out = inspect(&[dir.path().to_str().expect("UTF-8")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("weir::inspect::not_a_snapshot"),
        "{}",
        stderr(&out)
    );
}

/// A pipeline with checkpoints whose map throws on one record: it fails once, for good.
const POISON: &str = r#"version: 1
pipelines:
  - id: poison
    state: { backend: fs }
    checkpoints: { mode: exactly_once, interval: 50ms }
    restart: { strategy: none }
    sources:
      - id: g
        type: generator
        seed: 3
        count: 400
        rate: 400
        fields:
          n: { kind: sequence }
    operators:
      - id: boom
        type: map
        input: g
        script: |
          fn map(r) { if r.n == 150 { throw "n 150 is not allowed: " + r.to_json(); } r }
    sinks:
      - id: o
        type: file
        input: boom
        path: out
"#;

/// The lines of the log proper (before the summary `weir run` prints at the end).
fn log_lines(log: &str) -> Vec<&str> {
    log.lines()
        .take_while(|l| !l.starts_with("pipeline poison:"))
        .collect()
}

#[test]
fn the_log_says_each_thing_once_in_human_terms() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let yaml = write_yaml(dir.path(), POISON);
    let (status, log) = run_to_end_with(
        beside(&yaml),
        &yaml,
        &["--api-port", "0"],
        &[("RUST_LOG", "info")],
    );
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("checkpoints (median"),
        "checkpoints were taken:\n{log}"
    );
    let lines = log_lines(&log);
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("Checkpoint completed") || l.contains("Checkpoint statistics")),
        "{log}"
    );
    assert_eq!(
        log.matches("control API on http://").count()
            + log.matches("Control API listening").count(),
        1,
        "{log}"
    );
    // The failure: once in the log, once in the report at the end.
    let told = |l: &str| l.contains("n 150 is not allowed");
    assert_eq!(lines.iter().filter(|l| told(l)).count(), 1, "{log}");
    assert_eq!(log.lines().filter(|l| told(l)).count(), 2, "{log}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Pipeline failed.") && l.contains("gave up")),
        "{log}"
    );
    // Values as people write them; the record excerpt unbroken on one line.
    assert!(!log.contains("Some(") && !log.contains("=None"), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains(r#"n 150 is not allowed: {"n":150}"#) && !l.contains('\u{2502}')),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Pipeline started.") && l.contains("restored_from=nothing")),
        "{log}"
    );
}

#[test]
fn the_log_can_be_json_and_its_level_set_by_a_flag() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let yaml = write_yaml(dir.path(), POISON);
    let (_, log) = run_to_end_with(
        beside(&yaml),
        &yaml,
        &["--api-port", "0", "--log-format", "json"],
        &[("RUST_LOG", "info")],
    );
    let lines = log_lines(&log);
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{log}")))
        .collect();
    let message = |v: &Value| {
        v["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        events
            .iter()
            .any(|v| message(v).starts_with("Control API listening on http://")),
        "{log}"
    );
    assert!(
        events
            .iter()
            .any(|v| message(v) == "Task failed." && v["level"] == "ERROR"),
        "{log}"
    );

    // The flag wins over RUST_LOG: at debug, completed checkpoints are logged.
    let (_, log) = run_to_end_with(
        beside(&yaml),
        &yaml,
        &["--no-api", "--fresh", "--log-level", "debug"],
        &[("RUST_LOG", "warn")],
    );
    assert!(log.contains("Checkpoint completed."), "{log}");
    assert!(log.contains("Checkpoint statistics."), "{log}");

    let help = weir()
        .args(["run", "--help"])
        .output()
        .expect("weir run --help");
    let help = stdout(&help);
    for needle in ["--log-level", "--log-format", "RUST_LOG", "json"] {
        assert!(help.contains(needle), "missing `{needle}` in:\n{help}");
    }
}
