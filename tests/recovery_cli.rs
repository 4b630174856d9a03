//! Crash recovery through the `weir` binary: a run killed after some checkpoints resumes from
//! the latest valid one; a damaged latest checkpoint is skipped with a warning and the
//! previous retained one is used; `--fresh` starts over; `--from-checkpoint` picks one; a
//! restart strategy that gives up ends `weir run` with a non-zero exit and a report naming
//! the pipeline, operator, subtask, error and record.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

use common::binary::{signal, weir};
use common::output::{assert_exactly_once, committed, part_files};
use common::run::{beside, kill_when, run_to_end};

/// A generator at a bounded rate: long enough to be killed after a few checkpoints.
fn job(dir: &Path, rate: u64) -> std::path::PathBuf {
    job_on(dir, rate, "fs")
}

fn job_on(dir: &Path, rate: u64, backend: &str) -> std::path::PathBuf {
    let yaml = dir.join("job.yaml");
    std::fs::write(
        &yaml,
        format!(
            r#"version: 1
pipelines:
  - id: counts
    parallelism: 2
    state: {{ backend: {backend} }}
    checkpoints: {{ interval: 100ms, storage: ck, retain: 3 }}
    restart: {{ strategy: none }}
    sources:
      - id: gen
        type: generator
        seed: 7
        count: 40000
        rate: {rate}
        fields:
          seq: {{ kind: sequence }}
          user: {{ kind: key, prefix: u, cardinality: 50 }}
    operators:
      - {{ id: by_user, type: key_by, input: gen, field: user }}
      - id: totals
        type: aggregate
        input: by_user
        emit: final
        aggregations:
          - {{ fn: count, as: n }}
          - {{ fn: sum, field: seq, as: s }}
    sinks:
      - {{ id: out, type: file, input: totals, path: out }}
"#
        ),
    )
    .unwrap();
    yaml
}

/// Runs until `checkpoints` checkpoints completed, then SIGKILLs the process.
fn run_and_kill(yaml: &Path, checkpoints: usize) -> String {
    let mut seen = 0;
    let (killed, log) = kill_when(beside(yaml), yaml, &[], |line| {
        seen += usize::from(line.contains("Checkpoint completed."));
        seen >= checkpoints
    });
    assert!(
        killed,
        "the run ended before {checkpoints} checkpoints:\n{log}"
    );
    log
}

/// `user -> (n, s)` from the committed part files.
fn totals(dir: &Path) -> BTreeMap<String, (i64, i64)> {
    let mut m = BTreeMap::new();
    for p in part_files(dir) {
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let key = v["key"].as_str().unwrap().to_owned();
            let prev = m.insert(key, (v["n"].as_i64().unwrap(), v["s"].as_i64().unwrap()));
            assert!(prev.is_none(), "a key appears twice in {}", dir.display());
        }
    }
    m
}

fn checkpoints_on_disk(dir: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir.join("ck/counts"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_prefix("chk-")?.parse().ok()
        })
        .filter(|id| dir.join(format!("ck/counts/chk-{id}/_metadata")).exists())
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn a_killed_run_resumes_and_skips_a_damaged_checkpoint() {
    // The failure-free totals.
    let clean = tempfile::tempdir().unwrap();
    let yaml = job(clean.path(), 1_000_000);
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    let expected = totals(&clean.path().join("out"));
    assert_eq!(expected.len(), 50);

    let tmp = tempfile::tempdir().unwrap();
    let yaml = job(tmp.path(), 8_000);
    run_and_kill(&yaml, 4);
    let ids = checkpoints_on_disk(tmp.path());
    assert!(ids.len() >= 2, "retain: 3 keeps several: {ids:?}");
    let latest = *ids.last().unwrap();
    let previous = ids[ids.len() - 2];
    // Damage the latest checkpoint: truncate one of its state files.
    let chk = tmp.path().join(format!("ck/counts/chk-{latest}"));
    let victim = std::fs::read_dir(&chk)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "keyed"))
        .expect("a keyed-state file");
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() / 2]).unwrap();

    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    assert!(
        log.contains("Skipping a checkpoint that cannot be restored") && log.contains("corrupt"),
        "no warning about the damaged checkpoint:\n{log}"
    );
    assert!(
        log.contains(&format!("resumed from checkpoint {previous}")),
        "did not resume from checkpoint {previous}:\n{log}"
    );
    assert_eq!(totals(&tmp.path().join("out")), expected);

    // The run finished: the next one starts fresh (and gives the same result).
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    assert!(log.contains("previous run finished"), "{log}");
    assert!(!log.contains("resumed from checkpoint"), "{log}");
    assert_eq!(totals(&tmp.path().join("out")), expected);
}

#[test]
fn fresh_and_from_checkpoint_choose_where_to_start() {
    let clean = tempfile::tempdir().unwrap();
    let yaml = job(clean.path(), 1_000_000);
    assert!(run_to_end(beside(&yaml), &yaml, &[]).0);
    let expected = totals(&clean.path().join("out"));

    let tmp = tempfile::tempdir().unwrap();
    let yaml = job(tmp.path(), 8_000);
    run_and_kill(&yaml, 3);
    let ids = checkpoints_on_disk(tmp.path());
    let first = ids[0];

    assert!(ids.len() >= 2, "{ids:?}");

    // --from-checkpoint picks an older one than the latest.
    let chk = tmp.path().join(format!("ck/counts/chk-{first}"));
    let (ok, log) = run_to_end(
        beside(&yaml),
        &yaml,
        &["--from-checkpoint", chk.to_str().unwrap()],
    );
    assert!(ok, "{log}");
    assert!(
        log.contains(&format!("resumed from checkpoint {first}")),
        "{log}"
    );
    assert_eq!(totals(&tmp.path().join("out")), expected);

    // --fresh ignores (and deletes) what is there.
    run_and_kill(&yaml, 2);
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--fresh"]);
    assert!(ok, "{log}");
    assert!(log.contains("--fresh"), "{log}");
    assert!(!log.contains("resumed from checkpoint"), "{log}");
    assert_eq!(totals(&tmp.path().join("out")), expected);
}

/// SIGTERM with checkpoints on: a final checkpoint, then a clean exit; the next run resumes
/// from that checkpoint and the output is exact.
#[test]
fn sigterm_takes_a_final_checkpoint_and_the_next_run_resumes_from_it() {
    for backend in ["fs", "rocksdb"] {
        sigterm_then_resume(backend);
    }
}

fn sigterm_then_resume(backend: &str) {
    let clean = tempfile::tempdir().unwrap();
    let yaml = job(clean.path(), 1_000_000);
    assert!(run_to_end(beside(&yaml), &yaml, &[]).0);
    let expected = totals(&clean.path().join("out"));

    let tmp = tempfile::tempdir().unwrap();
    let yaml = job_on(tmp.path(), 8_000, backend);
    let mut child = weir()
        .args(["run", "--no-progress", "--no-api"])
        .arg(&yaml)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut log = String::new();
    let mut seen = 0;
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen += usize::from(line.contains("Checkpoint completed."));
        log.push_str(&line);
        log.push('\n');
        if seen >= 2 {
            break;
        }
    }
    assert!(signal(child.id(), "TERM"));
    for line in lines {
        log.push_str(&line.unwrap());
        log.push('\n');
    }
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{backend}: {log}");
    assert!(
        log.contains("Final checkpoint complete"),
        "{backend}: {log}"
    );
    let (ok, log2) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{backend}: {log2}");
    assert!(
        log2.contains("resumed from checkpoint"),
        "{backend}: {log2}"
    );
    assert_eq!(totals(&tmp.path().join("out")), expected, "{backend}");
}

#[test]
fn giving_up_exits_non_zero_with_a_report_naming_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("in.jsonl"),
        "{\"id\":1}\n{\"id\":2}\n{\"id\":42,\"note\":\"the bad one\"}\n{\"id\":4}\n",
    )
    .unwrap();
    let yaml = tmp.path().join("p.yaml");
    std::fs::write(
        &yaml,
        r#"version: 1
pipelines:
  - id: strict
    restart: { strategy: fixed_delay, attempts: 2, delay: 10ms }
    sources:
      - { id: in, type: file, path: in.jsonl }
    operators:
      - id: check
        type: map
        input: in
        script: |
          fn map(r) { if r.id == 42 { throw "id 42 is not allowed"; } r }
    sinks:
      - { id: out, type: file, input: check, path: out }
"#,
    )
    .unwrap();
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(!ok, "the run must fail:\n{log}");
    for needle in [
        "weir::run::pipeline_failed",
        "strict",
        "check",
        "subtask 0",
        "id 42 is not allowed",
        "the bad one",
        "all 2 restart attempts used",
    ] {
        assert!(log.contains(needle), "missing `{needle}` in:\n{log}");
    }
    assert_eq!(
        log.matches("Restarting after a failure.").count(),
        2,
        "{log}"
    );
}

/// A pipeline that commits output while it runs (an update per record), so that a killed
/// run leaves committed part files behind.
fn updates_job(dir: &Path, backend: &str) -> std::path::PathBuf {
    let yaml = dir.join("updates.yaml");
    std::fs::write(
        &yaml,
        format!(
            r#"version: 1
pipelines:
  - id: counts
    parallelism: 2
    state: {{ {backend} }}
    checkpoints: {{ interval: 100ms, storage: ck, retain: 3 }}
    restart: {{ strategy: none }}
    sources:
      - id: gen
        type: generator
        parallelism: 1
        seed: 7
        count: 20000
        rate: 4000
        fields:
          seq: {{ kind: sequence }}
          user: {{ kind: key, prefix: u, cardinality: 50 }}
    operators:
      - id: shape
        type: map
        input: gen
        parallelism: 1
        script: "fn map(r) {{ #{{user: r.user, n: 1, last: r.seq}} }}"
      - {{ id: by_user, type: key_by, input: shape, field: user, parallelism: 1 }}
      - id: running
        type: reduce
        input: by_user
        emit: updates
        script: |
          fn reduce(acc, r) {{ #{{n: acc.n + 1, last: r.last}} }}
    sinks:
      - {{ id: out, type: file, input: running, path: out }}
"#
        ),
    )
    .unwrap();
    yaml
}

/// Every file of a directory with its bytes (the committed output, compared byte for byte).
fn snapshot_dir(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// The file paths (store-relative) a checkpoint's `_metadata` lists.
fn files_of(dir: &Path, id: u64) -> Vec<String> {
    let bytes = std::fs::read(dir.join(format!("ck/counts/chk-{id}/_metadata"))).unwrap();
    let json = &bytes[bytes.iter().position(|&b| b == b'\n').unwrap() + 1..];
    let meta: serde_json::Value = serde_json::from_slice(json).unwrap();
    meta["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["files"].as_array().unwrap().iter())
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect()
}

fn flip_a_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

/// Every retained checkpoint damaged: `weir run` refuses to start, names each damaged
/// checkpoint and file, says how to go on, and leaves the committed output untouched;
/// `--fresh` then starts over and ends with the failure-free output.
fn no_silent_fresh_start(backend: &str) {
    let clean = tempfile::tempdir().unwrap();
    let yaml = updates_job(clean.path(), backend);
    let unlimited = std::fs::read_to_string(&yaml)
        .unwrap()
        .replace("rate: 4000", "rate: 1000000");
    std::fs::write(&yaml, unlimited).unwrap();
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    let expected = committed(&clean.path().join("out"));

    let tmp = tempfile::tempdir().unwrap();
    let yaml = updates_job(tmp.path(), backend);
    run_and_kill(&yaml, 6);
    let ids = checkpoints_on_disk(tmp.path());
    assert!(!ids.is_empty());
    let parts = snapshot_dir(&tmp.path().join("out"));
    assert!(
        parts.keys().any(|n| !n.starts_with('.')),
        "the killed run committed nothing: {:?}",
        parts.keys()
    );

    // Damage every retained checkpoint: one byte of a file each references, a shared
    // RocksDB SST they all reference when there is one (one flip damages them all).
    let files: Vec<Vec<String>> = ids.iter().map(|&id| files_of(tmp.path(), id)).collect();
    let common_shared = files[0]
        .iter()
        .find(|f| f.starts_with("shared/") && files.iter().all(|fs| fs.contains(f)));
    let victims: std::collections::BTreeSet<String> = match common_shared {
        Some(f) => [f.clone()].into(),
        None => files
            .iter()
            .map(|fs| {
                fs.iter()
                    .find(|f| f.ends_with(".keyed") || f.ends_with(".sst"))
                    .or_else(|| fs.iter().find(|f| !f.ends_with(".op")))
                    .expect("a keyed-state file")
                    .clone()
            })
            .collect(),
    };
    // (Compactions may have replaced every SST between the oldest and the newest retained
    // checkpoint; then each checkpoint gets a flipped byte in a file it references, each file
    // flipped once.)
    for v in &victims {
        flip_a_byte(&tmp.path().join("ck/counts").join(v));
    }

    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(!ok, "the run must refuse to start:\n{log}");
    assert!(
        log.contains("none of the") && log.contains("can be restored"),
        "{log}"
    );
    for id in &ids {
        assert!(
            log.contains(&format!("chk-{id}: ")),
            "chk-{id} not named:\n{log}"
        );
    }
    for v in &victims {
        assert!(log.contains(v.as_str()), "file `{v}` not named:\n{log}");
    }
    for way in ["--from-checkpoint", "--fresh"] {
        assert!(log.contains(way), "`{way}` not suggested:\n{log}");
    }
    assert_eq!(
        snapshot_dir(&tmp.path().join("out")),
        parts,
        "the refused start changed the committed output"
    );
    assert_eq!(
        checkpoints_on_disk(tmp.path()),
        ids,
        "checkpoints were deleted"
    );

    // --fresh starts over: the failure-free output.
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--fresh"]);
    assert!(ok, "{log}");
    assert_exactly_once(
        &committed(&tmp.path().join("out")),
        &expected,
        "after --fresh",
    );
}

#[test]
fn every_checkpoint_damaged_refuses_to_start_fs() {
    no_silent_fresh_start("backend: fs");
}

#[test]
fn every_checkpoint_damaged_refuses_to_start_rocksdb() {
    no_silent_fresh_start("backend: rocksdb, incremental: true");
}
