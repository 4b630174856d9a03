//! Coordinator bookkeeping under a storm of requests, through the real control API: hundreds
//! of concurrent manual checkpoints and savepoints against a running exactly-once pipeline.
//! Afterwards checkpoint storage holds exactly `retain` complete checkpoints and nothing
//! else, no checkpoint was left complete-looking but untracked (no "metadata written, but no
//! write was requested"), every savepoint that was reported is whole on disk, and the
//! committed output holds every record once.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::output::committed;
use common::run::Run;
use weir_engine::api::ApiClient;
use weir_engine::control::SavepointRequest;

const JOB: &str = r#"version: 1
pipelines:
  - id: storm
    parallelism: 2
    state: { backend: fs }
    checkpoints: { mode: exactly_once, interval: 200ms, storage: ck, retain: 3 }
    savepoints: { dir: sp }
    restart: { strategy: none }
    sources:
      - id: gen
        type: generator
        parallelism: 1
        rate: 3000
        fields:
          seq: { kind: sequence }
          user: { kind: key, prefix: u, cardinality: 20 }
    operators:
      - id: shape
        type: map
        input: gen
        script: "fn map(r) { #{user: r.user, n: 1, last: r.seq} }"
      - { id: by_user, type: key_by, input: shape, field: user }
      - id: running
        type: reduce
        input: by_user
        emit: updates
        script: |
          fn reduce(acc, r) { #{n: acc.n + 1, last: r.last} }
    sinks:
      - { id: out, type: file, input: running, path: out }
"#;

/// Requests in all, and how many are in flight at once.
const REQUESTS: usize = 1_000;
const CONCURRENCY: usize = 50;

/// Every `chk-<n>` directory of the pipeline's checkpoint storage, and the other entries.
fn storage(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut chk = Vec::new();
    let mut other = Vec::new();
    for e in std::fs::read_dir(dir.join("ck/storm")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("chk-") {
            chk.push(name);
        } else {
            other.push(name);
        }
    }
    chk.sort();
    other.sort();
    (chk, other)
}

#[test]
fn a_storm_of_checkpoint_and_savepoint_requests_leaves_exactly_retain_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("job.yaml");
    std::fs::write(&yaml, JOB).unwrap();
    let savepoints = dir.path().join("sp");
    let mut run = Run::start(dir.path(), &yaml, &[]);
    run.wait_checkpoints(&["storm"], 1);

    let next = Arc::new(AtomicUsize::new(0));
    let reported = Arc::new(Mutex::new(Vec::new()));
    let answered = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (next, reported, answered, completed, errors) = (
                Arc::clone(&next),
                Arc::clone(&reported),
                Arc::clone(&answered),
                Arc::clone(&completed),
                Arc::clone(&errors),
            );
            let api = run.api.clone();
            std::thread::spawn(move || {
                let client = ApiClient::new(&api, None).unwrap();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        break;
                    }
                    // One request in four is a savepoint; aborted ones (subsumed, declined)
                    // answer with an error, which is fine: only the bookkeeping is judged.
                    if i % 4 == 0 {
                        // Into the pipeline's `savepoints.dir` (a request may only name a
                        // directory under it).
                        let request = SavepointRequest { dir: None };
                        match client.savepoint("storm", &request) {
                            Ok(sp) => reported.lock().unwrap().push(sp.path),
                            Err(e) => errors.lock().unwrap().push(e.to_string()),
                        }
                    } else {
                        match client.trigger_checkpoint("storm") {
                            Ok(_) => {
                                completed.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => errors.lock().unwrap().push(e.to_string()),
                        }
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(
        answered.load(Ordering::Relaxed),
        REQUESTS,
        "every request was answered"
    );
    // The storm reached the coordinator: checkpoints completed and many were aborted
    // (subsumed by a later one) while others were in flight; every refusal is one of the
    // expected answers, never a failure.
    let errors = errors.lock().unwrap().clone();
    assert!(
        completed.load(Ordering::Relaxed) > 3,
        "too few manual checkpoints completed: {errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("subsumed by checkpoint")),
        "no checkpoint was aborted while others were in flight"
    );
    let unexpected: Vec<&String> = errors
        .iter()
        .filter(|e| !e.contains("was aborted: subsumed by") && !e.contains("already in progress"))
        .collect();
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    eprintln!(
        "{} checkpoints completed, {} errors, e.g. {:?}",
        completed.load(Ordering::Relaxed),
        errors.len(),
        errors
            .iter()
            .map(|e| e.split(" (").next().unwrap_or(e))
            .collect::<BTreeSet<_>>()
    );

    // A couple of ordinary checkpoints after the storm, then SIGTERM (a final checkpoint).
    run.wait_checkpoints(&["storm"], 2);
    let log = run.terminate();

    let bad = log.matches("no write was requested").count();
    assert_eq!(bad, 0, "untracked metadata writes:\n{log}");
    assert!(!log.contains("Checkpoint protocol."), "{log}");

    let (chk, other) = storage(dir.path());
    assert_eq!(chk.len(), 3, "retain: 3 keeps exactly 3, found {chk:?}");
    for c in &chk {
        assert!(
            dir.path()
                .join("ck/storm")
                .join(c)
                .join("_metadata")
                .is_file(),
            "{c} is not a complete checkpoint"
        );
    }
    assert!(
        other.iter().all(|o| o == "shared"),
        "unexpected entries in checkpoint storage: {other:?}"
    );

    // Every savepoint that was reported is whole; nothing half-assembled is left.
    let reported = reported.lock().unwrap().clone();
    assert!(!reported.is_empty(), "no savepoint of the storm completed");
    for sp in &reported {
        assert!(
            sp.join("_metadata").is_file(),
            "{} is not whole",
            sp.display()
        );
    }
    let on_disk: BTreeSet<_> = std::fs::read_dir(&savepoints)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let reported: BTreeSet<_> = reported.into_iter().collect();
    assert_eq!(
        on_disk, reported,
        "savepoint directories on disk vs reported"
    );

    // The committed output: the updates of records 0..n, each once.
    let lines = committed(&dir.path().join("out"));
    let seqs: Vec<i64> = lines
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["last"]
                .as_i64()
                .unwrap_or_else(|| panic!("no `last` in {l}"))
        })
        .collect();
    let distinct: BTreeSet<i64> = seqs.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        seqs.len(),
        "a record's update was committed twice"
    );
    let n = seqs.len() as i64;
    assert!(n > 0);
    assert_eq!(
        distinct,
        (0..n).collect(),
        "the committed output is not a clean prefix"
    );
}
