//! Checkpoints on S3-compatible object storage (`checkpoints.storage: s3://bucket/prefix`),
//! against the real server `scripts/services/s3.sh` starts (moto): reference pipelines killed
//! with SIGKILL again and again, on the `fs` and `rocksdb` backends, must commit exactly the
//! output of a failure-free run; and S3 going away mid-run (a proxy in front of the server
//! stops answering) fails the run with a clear error, the restart strategy retries until it is
//! back, and nothing is lost or duplicated.
//!
//! Every test works in a bucket of its own. Nothing here asserts on timing.
#![cfg(unix)]
#![allow(clippy::unwrap_used, missing_docs)]

mod common;
use common::in_process::{copy_reference_pipelines, golden};
use common::kill::{
    Backend, KillPlan, Recovery, Rng, Runner, Scratch, assert_exactly, file_sinks, kill_loop,
    log_excerpt, read_log, restores_in, wait_bounded, with_recovery,
};
use common::output::committed_marking_torn;
use common::services;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The `AWS_*` settings of the local S3 server (started when needed).
fn s3() -> Vec<(String, String)> {
    services::ensure("s3")
        .into_iter()
        .filter(|(k, _)| k.starts_with("AWS_"))
        .collect()
}

fn endpoint(settings: &[(String, String)]) -> String {
    settings
        .iter()
        .find(|(k, _)| k == "AWS_ENDPOINT_URL")
        .map(|(_, v)| v.clone())
        .expect("AWS_ENDPOINT_URL")
}

/// A new bucket, unique to this test process and call (moto takes unsigned requests).
fn fresh_bucket(settings: &[(String, String)], what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "weir-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let host = endpoint(settings).trim_start_matches("http://").to_owned();
    let mut conn = TcpStream::connect(&host).unwrap();
    write!(
        conn,
        "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "cannot create bucket {name}: {answer}"
    );
    name
}

/// The keys under `prefix` in `bucket` (one listing page is enough for these tests).
fn keys(settings: &[(String, String)], bucket: &str, prefix: &str) -> Vec<String> {
    let host = endpoint(settings).trim_start_matches("http://").to_owned();
    let mut conn = TcpStream::connect(&host).unwrap();
    write!(
        conn,
        "GET /{bucket}?list-type=2&prefix={prefix} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
        .split("<Key>")
        .skip(1)
        .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_owned()))
        .collect()
}

/// Uploads the local directory `dir` under `key_prefix` in `bucket`, file by file.
fn upload_dir(settings: &[(String, String)], bucket: &str, key_prefix: &str, dir: &Path) {
    let host = endpoint(settings).trim_start_matches("http://").to_owned();
    let mut todo = vec![(dir.to_path_buf(), key_prefix.to_owned())];
    while let Some((d, prefix)) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let key = format!("{prefix}/{name}");
            if e.path().is_dir() {
                todo.push((e.path(), key));
                continue;
            }
            let body = std::fs::read(e.path()).unwrap();
            let mut conn = TcpStream::connect(&host).unwrap();
            write!(
                conn,
                "PUT /{bucket}/{key} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .unwrap();
            conn.write_all(&body).unwrap();
            let mut answer = String::new();
            conn.read_to_string(&mut answer).unwrap();
            assert!(
                answer.starts_with("HTTP/1.1 200"),
                "cannot upload {key}: {answer}"
            );
        }
    }
}

/// `weir inspect URL --format json` with the S3 settings: its report.
fn inspect_json(settings: &[(String, String)], url: &str) -> Value {
    let out = common::binary::plain()
        .arg("inspect")
        .arg(url)
        .args(["--format", "json"])
        .envs(settings.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "weir inspect {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Rewrites every pipeline of the JSON pipeline file `file` to checkpoint to `storage`.
fn checkpoint_to(file: &Path, storage: &str) {
    let mut spec: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    for p in spec["pipelines"].as_array_mut().unwrap() {
        p["checkpoints"]["storage"] = json!(storage);
    }
    std::fs::write(file, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 1. Reference pipelines checkpointing to S3, killed again and again.

fn checkpoints_on_s3_survive_sigkill(backend: Backend, seed: u64) {
    let settings = s3();
    let bucket = fresh_bucket(&settings, &format!("kill-{}", backend.name()));
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let root = copy_reference_pipelines(tmp);
    let mut rng = Rng::new(seed);
    let mut kills = 0;
    let mut restores = 0;
    // Two reference pipelines (golden output, finished in a blink) and a paced generator
    // with keyed state, long enough for kills mid-stream and restores from S3.
    let generated = json!({
        "version": 1,
        "pipelines": [{
            "id": "generated",
            "parallelism": 2,
            "sources": [{
                "id": "orders",
                "type": "generator",
                "seed": 3,
                "count": 2000,
                "rate": 1000,
                "fields": {
                    "seq": {"kind": "sequence"},
                    "user": {"kind": "key", "prefix": "u-", "cardinality": 20},
                    "amount": {"kind": "int", "min": 1, "max": 100},
                },
            }],
            "operators": [
                {"id": "by_user", "type": "key_by", "input": "orders", "field": "user"},
                {
                    "id": "totals",
                    "type": "aggregate",
                    "input": "by_user",
                    "aggregations": [
                        {"fn": "sum", "field": "amount", "as": "sum"},
                        {"fn": "count", "as": "count"},
                    ],
                    "emit": "final",
                },
            ],
            "sinks": [
                {"id": "totals_out", "type": "file", "input": "totals", "path": "out/generated/totals"},
                {"id": "raw", "type": "file", "input": "orders", "path": "out/generated/raw"},
            ],
        }],
    });
    std::fs::write(
        root.join("generated.yaml"),
        serde_json::to_string_pretty(&generated).unwrap(),
    )
    .unwrap();
    for stem in ["orders_totals", "sessions", "generated"] {
        let yaml = root.join(format!("{stem}.yaml"));
        let file = with_recovery(
            &yaml,
            &Recovery {
                backend,
                mode: "exactly_once",
                interval: "20ms",
                root: tmp,
            },
        );
        checkpoint_to(&file, &format!("s3://{bucket}/checkpoints/{stem}"));
        let sinks = file_sinks(&file);
        let mut runner = Runner::new(&file, &tmp.join("logs"), stem);
        runner.env = settings.clone();

        let (wall, _) = runner.run_to_end();
        let mut expected = BTreeMap::new();
        for s in &sinks {
            let got = committed_marking_torn(&s.dir);
            if let Some(want) = golden(&root, stem, &s.pipeline, &s.id) {
                assert_eq!(
                    got,
                    want,
                    "{stem} {}: failure-free run vs golden",
                    s.label()
                );
            }
            expected.insert(s.label(), got);
        }
        assert!(
            !tmp.join("checkpoints").join(stem).exists(),
            "{stem}: checkpoints went to the local disk"
        );

        let mut st = kill_loop(
            &mut runner,
            &mut rng,
            &KillPlan {
                random: 6,
                window: (Duration::ZERO, wall.mul_f64(1.2)),
                targeted: 2,
            },
        );
        let (_, log) = runner.run_to_end();
        st.restored.extend(restores_in(&read_log(&log)));
        assert_exactly(
            stem,
            &expected,
            &sinks,
            &format!(
                "{stem} ({}, checkpoints on S3): output after {} SIGKILLs at {:?} ms differs \
                 from the failure-free output\n{}",
                backend.name(),
                st.kills,
                st.moments,
                log_excerpt(&log)
            ),
        );
        println!("{}", st.report(stem));
        kills += st.kills;
        restores += st.restored.len();
        let stored = keys(&settings, &bucket, &format!("checkpoints/{stem}/"));
        assert!(
            stored.iter().any(|k| k.ends_with("/_finished")),
            "{stem}: the finished marker is in the bucket: {stored:?}"
        );
    }
    assert!(kills >= 10, "only {kills} kills");
    assert!(restores > 0, "no run restored a checkpoint from S3");
}

#[test]
fn checkpoints_on_s3_survive_sigkill_fs() {
    checkpoints_on_s3_survive_sigkill(Backend::Fs, 0x53_0001);
}

#[test]
fn checkpoints_on_s3_survive_sigkill_rocksdb() {
    checkpoints_on_s3_survive_sigkill(Backend::Rocksdb, 0x53_0002);
}

// ---------------------------------------------------------------------------------------------
// 2. S3 goes away mid-run.

/// A TCP proxy in front of the S3 server that can be cut: while down it closes every
/// connection, open ones included, as a dead or unreachable service would.
struct Proxy {
    addr: String,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let up = Arc::new(AtomicBool::new(true));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (up2, open2) = (Arc::clone(&up), Arc::clone(&open));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                {
                    let mut open = open2.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Self { addr, up, open }
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

fn wait_for(log: &Path, what: &str, child: &mut std::process::Child) {
    let started = Instant::now();
    while !read_log(log).contains(what) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "`weir run` ended before logging {what:?}\n{}",
            log_excerpt(log)
        );
        assert!(
            started.elapsed() < common::kill::HANG,
            "no {what:?} in the log\n{}",
            log_excerpt(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn s3_down_mid_run_fails_clearly_and_the_restart_strategy_recovers_without_loss() {
    let settings = s3();
    let bucket = fresh_bucket(&settings, "down");
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let proxy = Proxy::start(endpoint(&settings).trim_start_matches("http://").to_owned());
    let out = tmp.join("out");
    let count = 3000;
    let file: PathBuf = tmp.join("down.json");
    let spec = json!({
        "version": 1,
        "api": {"enabled": false},
        "pipelines": [{
            "id": "down",
            "state": {"backend": "fs"},
            "checkpoints": {
                "interval": "50ms",
                "mode": "exactly_once",
                "storage": format!("s3://{bucket}/ck"),
            },
            "restart": {"strategy": "fixed_delay", "attempts": 1000, "delay": "100ms"},
            "sources": [{
                "id": "numbers",
                "type": "generator",
                "count": count,
                "rate": 600,
                "fields": {"seq": {"kind": "sequence"}},
            }],
            "sinks": [{"id": "out", "type": "file", "input": "numbers", "path": out.to_str().unwrap()}],
        }],
    });
    std::fs::write(&file, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    let mut runner = Runner::new(&file, &tmp.join("logs"), "down");
    runner.env = settings
        .iter()
        .map(|(k, v)| {
            if k == "AWS_ENDPOINT_URL" {
                (k.clone(), format!("http://{}", proxy.addr))
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect();
    let (mut child, log) = runner.spawn(&[]);
    wait_for(&log, "Checkpoint completed.", &mut child);
    proxy.down();
    wait_for(&log, "checkpoint storage unavailable", &mut child);
    // Stay down for a few restarts.
    std::thread::sleep(Duration::from_secs(2));
    proxy.up();
    let status = wait_bounded(&mut child, common::kill::HANG, &log);
    let text = read_log(&log);
    assert!(
        status.success(),
        "`weir run` exited with {status}\n{}",
        log_excerpt(&log)
    );
    let error = text
        .lines()
        .find(|l| l.contains("checkpoint storage unavailable"))
        .unwrap();
    assert!(
        error.contains(&format!("s3://{bucket}/ck/down/")) && error.contains(&proxy.addr),
        "the error names the object and the endpoint: {error}"
    );
    assert!(
        text.contains("Restarting after a failure."),
        "the restart strategy took over\n{}",
        log_excerpt(&log)
    );
    let got = committed_marking_torn(&out);
    let mut want: Vec<String> = (0..count).map(|i| json!({"seq": i}).to_string()).collect();
    want.sort();
    assert_eq!(
        got.len(),
        want.len(),
        "exactly one line per generated record\n{}",
        log_excerpt(&log)
    );
    assert_eq!(got, want, "nothing lost, nothing duplicated");
}

// ---------------------------------------------------------------------------------------------
// 3. A savepoint from local storage into S3 storage, and from there back.

const KEYED: &str = r#"version: 1
pipelines:
  - id: totals
    parallelism: 2
    max_parallelism: 128
    state: { backend: STATE }
    checkpoints: { mode: exactly_once, interval: 300ms, storage: STORAGE }
    restart: { strategy: none }
    sources:
      - id: gen
        type: generator
        parallelism: 1
        seed: 11
        count: 20000
        rate: 5000
        fields:
          seq: { kind: sequence }
          user: { kind: key, prefix: u, cardinality: 40 }
          amount: { kind: int, min: 1, max: 100 }
    operators:
      - id: shape
        type: map
        input: gen
        parallelism: 1
        script: |
          fn map(r) { #{user: r.user, n: 1, total: r.amount, last: r.seq} }
      - { id: by_user, type: key_by, input: shape, field: user, parallelism: 1 }
      - id: running
        type: reduce
        input: by_user
        emit: updates
        script: |
          fn reduce(acc, r) { #{n: acc.n + 1, total: acc.total + r.total, last: r.last} }
    sinks:
      - { id: out, type: file, input: running, path: out }
"#;

fn keyed_at(dir: &Path, state: &str, storage: &str) -> PathBuf {
    let path = dir.join("totals.yaml");
    let text = KEYED.replace("STATE", state).replace("STORAGE", storage);
    std::fs::write(&path, text).unwrap();
    path
}

fn savepoint_local_to_s3_and_back(state: &str) {
    use common::output::{assert_exactly_once, committed};
    use common::run::{Run, beside, run_to_end_with};

    let settings = s3();
    let env: Vec<(&str, &str)> = settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let bucket = fresh_bucket(&settings, &format!("sp-{state}"));
    let s3_storage = format!("s3://{bucket}/ck");

    // The straight run, local storage.
    let straight_dir = tempfile::tempdir().unwrap();
    let yaml = keyed_at(straight_dir.path(), state, "ck");
    let (status, log) = run_to_end_with(beside(&yaml), &yaml, &["--no-api"], &[]);
    assert!(status.success(), "the straight run failed:\n{log}");
    let straight = committed(&straight_dir.path().join("out"));

    let dir = tempfile::tempdir().unwrap();
    // 1. Local storage, stopped with a savepoint mid-run.
    let yaml = keyed_at(dir.path(), state, "ck");
    let mut run = Run::start_with(beside(&yaml), &yaml, &["--api-port", "0"], &env);
    run.wait_mid_run("totals", 2000);
    let local_savepoint = run.stop_with_savepoint("totals");
    run.finish_ok();

    // 2. Restored into S3 storage, checkpoints there, stopped with a savepoint again.
    let yaml = keyed_at(dir.path(), state, &s3_storage);
    let mut run = Run::start_with(
        beside(&yaml),
        &yaml,
        &[
            "--api-port",
            "0",
            "--from-savepoint",
            local_savepoint.to_str().unwrap(),
        ],
        &env,
    );
    run.wait_checkpoints(&["totals"], 2);
    // While it runs: its latest checkpoint is on S3 (with RocksDB, an incremental one whose
    // SSTs are under `shared/`; the savepoint that stops it is in the canonical format).
    let stored = keys(&settings, &bucket, "ck/totals/");
    let s3_savepoint = run.stop_with_savepoint("totals");
    let log = run.finish_ok();
    assert!(log.contains("Restoring from a savepoint"), "{log}");
    assert!(
        stored.iter().any(|k| k.ends_with("/_metadata")),
        "checkpoints on S3: {stored:?}"
    );
    if state == "rocksdb" {
        assert!(
            stored.iter().any(|k| k.starts_with("ck/totals/shared/")),
            "RocksDB's incremental checkpoints keep their SSTs under shared/ on S3: {stored:?}"
        );
    }

    // 3. Back to local storage from the savepoint the S3 run wrote, read from a copy of it
    //    on S3, to the end.
    let name = s3_savepoint
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    upload_dir(
        &settings,
        &bucket,
        &format!("savepoints/{name}"),
        &s3_savepoint,
    );
    let remote_savepoint = format!("s3://{bucket}/savepoints/{name}");
    let report = inspect_json(&settings, &remote_savepoint);
    assert_eq!(report["pipeline"], "totals", "{report:#}");
    assert_eq!(report["layout"], "savepoint", "{report:#}");
    assert_eq!(report["problems"], json!([]), "{report:#}");
    let yaml = keyed_at(dir.path(), state, "ck-again");
    let (status, log) = run_to_end_with(
        beside(&yaml),
        &yaml,
        &["--no-api", "--from-savepoint", &remote_savepoint],
        &env,
    );
    assert!(
        log.contains("Restoring from a savepoint") && log.contains(&remote_savepoint),
        "{log}"
    );
    assert!(status.success(), "the restore back to local failed:\n{log}");
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &straight,
        &format!("{state}: local -> S3 -> local"),
    );
}

#[test]
fn a_savepoint_goes_from_local_storage_to_s3_and_back_fs() {
    savepoint_local_to_s3_and_back("fs");
}

#[test]
fn a_savepoint_goes_from_local_storage_to_s3_and_back_rocksdb() {
    savepoint_local_to_s3_and_back("rocksdb");
}

/// `--from-checkpoint` takes a checkpoint on S3 (`s3://bucket/prefix/<pipeline>/chk-<n>`).
#[test]
fn a_checkpoint_on_s3_is_restored_with_from_checkpoint() {
    use common::output::{assert_exactly_once, committed};
    use common::run::{beside, run_to_end_with};

    let settings = s3();
    let env: Vec<(&str, &str)> = settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let bucket = fresh_bucket(&settings, "from-ck");
    let dir = tempfile::tempdir().unwrap();
    let yaml = keyed_at(dir.path(), "fs", &format!("s3://{bucket}/ck"));
    let (status, log) = run_to_end_with(beside(&yaml), &yaml, &["--no-api"], &env);
    assert!(status.success(), "the run on S3 failed:\n{log}");
    let straight = committed(&dir.path().join("out"));
    let latest = keys(&settings, &bucket, "ck/totals/")
        .iter()
        .filter_map(|k| {
            k.strip_prefix("ck/totals/chk-")?
                .strip_suffix("/_metadata")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .expect("a checkpoint with metadata on S3");
    let checkpoint = format!("s3://{bucket}/ck/totals/chk-{latest}");
    let report = inspect_json(&settings, &checkpoint);
    assert_eq!(report["pipeline"], "totals", "{report:#}");
    assert_eq!(report["layout"], "checkpoint", "{report:#}");
    assert_eq!(report["checkpoint"], latest, "{report:#}");
    assert_eq!(report["problems"], json!([]), "{report:#}");
    let yaml = keyed_at(dir.path(), "fs", "ck-local");
    let (status, log) = run_to_end_with(
        beside(&yaml),
        &yaml,
        &["--no-api", "--from-checkpoint", &checkpoint],
        &env,
    );
    assert!(
        status.success(),
        "the restore from {checkpoint} failed:\n{log}"
    );
    assert!(
        log.contains("Restoring from the checkpoint given on the command line"),
        "{log}"
    );
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &straight,
        "restored from a checkpoint on S3",
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Savepoints written directly to S3 (`savepoints.dir: s3://...`, or a request naming one).

/// `KEYED` with its savepoints going to `savepoints` (a directory or an `s3://` location),
/// its generator paced at `rate` records/s (the same records, over a longer time).
fn keyed_saving_to(dir: &Path, state: &str, storage: &str, savepoints: &str, rate: u32) -> PathBuf {
    let path = keyed_at(dir, state, storage);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "    sources:\n",
            &format!("    savepoints: {{ dir: '{savepoints}' }}\n    sources:\n"),
        )
        .replace("rate: 5000", &format!("rate: {rate}"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Replaces directory `to` with a copy of `from`.
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A running job writes its savepoints straight to S3: `weir savepoint` (the job goes on)
/// and `weir stop --savepoint` answer with `s3://` URLs, nothing lands on the local disk,
/// `weir inspect` reads them in place, and the stop's savepoint restores both into local
/// checkpoint storage and into S3 checkpoint storage, each to the output of a straight run.
#[test]
fn savepoints_are_written_to_s3_and_restore_locally_and_into_s3_storage() {
    use common::output::{assert_exactly_once, committed};
    use common::run::{Run, beside, run_to_end_with};

    let settings = s3();
    let env: Vec<(&str, &str)> = settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let bucket = fresh_bucket(&settings, "sp-direct");
    let savepoints = format!("s3://{bucket}/savepoints");

    let straight_dir = tempfile::tempdir().unwrap();
    let yaml = keyed_at(straight_dir.path(), "rocksdb", "ck");
    let (status, log) = run_to_end_with(beside(&yaml), &yaml, &["--no-api"], &[]);
    assert!(status.success(), "the straight run failed:\n{log}");
    let straight = committed(&straight_dir.path().join("out"));

    // 1. Local checkpoints (RocksDB), savepoints to S3.
    let dir = tempfile::tempdir().unwrap();
    let yaml = keyed_saving_to(dir.path(), "rocksdb", "ck", &savepoints, 2000);
    let mut run = Run::start_with(beside(&yaml), &yaml, &["--api-port", "0"], &env);
    run.wait_mid_run("totals", 2000);
    let out = run.cli(&["savepoint", "totals"]);
    assert!(
        out.status.success(),
        "weir savepoint: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        run.log()
    );
    let first = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        first.starts_with(&format!("{savepoints}/savepoint-totals-")),
        "the savepoint went to S3: {first}"
    );
    // A directory named in the request, relative to the S3 root.
    let out = run.cli(&["savepoint", "totals", "--dir", "nightly"]);
    assert!(
        out.status.success(),
        "weir savepoint --dir: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let named = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        named.starts_with(&format!("{savepoints}/nightly/savepoint-totals-")),
        "{named}"
    );
    run.wait_checkpoints(&["totals"], 1);
    let out = run.cli(&["stop", "totals", "--savepoint"]);
    assert!(
        out.status.success(),
        "weir stop --savepoint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    run.finish_ok();
    assert!(
        !dir.path().join(".weir/savepoints").exists(),
        "a savepoint went to the local disk"
    );
    for url in [&first, &named, &last] {
        let report = inspect_json(&settings, url);
        assert_eq!(report["pipeline"], "totals", "{url}: {report:#}");
        assert_eq!(report["layout"], "savepoint", "{url}: {report:#}");
        assert_eq!(report["problems"], json!([]), "{url}: {report:#}");
        let prefix = url.strip_prefix(&format!("s3://{bucket}/")).unwrap();
        let stored = keys(&settings, &bucket, &format!("{prefix}/"));
        assert!(
            stored.iter().any(|k| k.ends_with("/_metadata"))
                && stored.iter().any(|k| k.ends_with(".keyed")),
            "{url}: {stored:?}"
        );
        assert!(
            stored.iter().all(|k| !k.contains("/shared/")),
            "a savepoint is self-contained: {stored:?}"
        );
    }
    let stopped = dir.path().join("out-at-stop");
    copy_dir(&dir.path().join("out"), &stopped);

    // A resume that finds no restorable checkpoint offers the savepoints on S3 as ways on.
    let ck = dir.path().join("ck/totals");
    let mut damaged = 0;
    for e in std::fs::read_dir(&ck).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("chk-") {
            std::fs::write(e.path().join("_metadata"), b"not a checkpoint").unwrap();
            damaged += 1;
        }
    }
    assert!(damaged > 0, "no checkpoint to damage in {}", ck.display());
    let (status, log) = run_to_end_with(beside(&yaml), &yaml, &["--no-api"], &env);
    assert!(!status.success(), "the run must refuse to start:\n{log}");
    assert!(log.contains("can be restored"), "{log}");
    for url in [&first, &last] {
        assert!(
            log.contains("--from-savepoint") && log.contains(url.as_str()),
            "{url} not offered:\n{log}"
        );
    }
    assert!(
        !log.contains(&named),
        "a savepoint in a subdirectory is not listed:\n{log}"
    );

    // 2. Restored into local checkpoint storage (the fs backend), to the end.
    let yaml = keyed_saving_to(dir.path(), "fs", "ck-local", &savepoints, 5000);
    let (status, log) = run_to_end_with(
        beside(&yaml),
        &yaml,
        &["--no-api", "--from-savepoint", &last],
        &env,
    );
    assert!(status.success(), "the local restore failed:\n{log}");
    assert!(log.contains("Restoring from a savepoint"), "{log}");
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &straight,
        "savepoint on S3 -> local checkpoint storage",
    );

    // 3. The same savepoint into S3 checkpoint storage, from the output as it was at the stop.
    copy_dir(&stopped, &dir.path().join("out"));
    let yaml = keyed_saving_to(
        dir.path(),
        "rocksdb",
        &format!("s3://{bucket}/ck"),
        &savepoints,
        5000,
    );
    let (status, log) = run_to_end_with(
        beside(&yaml),
        &yaml,
        &["--no-api", "--from-savepoint", &last],
        &env,
    );
    assert!(
        status.success(),
        "the restore into S3 storage failed:\n{log}"
    );
    assert!(
        keys(&settings, &bucket, "ck/totals/")
            .iter()
            .any(|k| k.ends_with("/_metadata")),
        "checkpoints went to S3"
    );
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &straight,
        "savepoint on S3 -> S3 checkpoint storage",
    );
}

/// A savepoint that cannot be written (a bucket that does not exist; an endpoint that does
/// not answer) fails with an error naming the target, and the job goes on to its normal
/// end: a failed savepoint never kills the job.
#[test]
fn a_savepoint_to_an_unwritable_s3_target_fails_clearly_and_the_job_goes_on() {
    use common::output::committed;
    use common::run::{Run, beside};

    let settings = s3();
    for (case, endpoint_override) in [
        ("missing bucket", None),
        ("unreachable", Some("http://127.0.0.1:9")),
    ] {
        let env: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| match endpoint_override {
                Some(e) if k == "AWS_ENDPOINT_URL" => (k.clone(), e.to_owned()),
                _ => (k.clone(), v.clone()),
            })
            .collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let bucket = format!("weir-never-created-{}", std::process::id());
        let target = format!("s3://{bucket}/sp");
        let dir = tempfile::tempdir().unwrap();
        let yaml = keyed_saving_to(dir.path(), "fs", "ck", &target, 1000);
        let mut run = Run::start_with(beside(&yaml), &yaml, &["--api-port", "0"], &env);
        run.wait_mid_run("totals", 2000);
        let out = run.cli(&["savepoint", "totals"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{case}: the savepoint cannot succeed"
        );
        assert!(
            stderr.contains("could not be written") && stderr.contains(&target),
            "{case}: the error names the target: {stderr}"
        );
        if let Some(e) = endpoint_override {
            assert!(
                stderr.contains(e),
                "{case}: the error names the endpoint: {stderr}"
            );
        }
        assert!(
            run.try_wait().is_none(),
            "{case}: the job died:\n{}",
            run.log()
        );
        // The job goes on: more checkpoints, then its normal end with every record.
        run.wait_checkpoints(&["totals"], 1);
        let log = run.finish_ok();
        assert!(log.contains("Savepoint failed."), "{case}: {log}");
        let lines = committed(&dir.path().join("out"));
        assert_eq!(
            lines.len(),
            20000,
            "{case}: one update per generated record"
        );
    }
}
