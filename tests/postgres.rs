//! The `postgres` sink against a real PostgreSQL (`scripts/services/postgres.sh`, started by
//! the test when it is not running), proved by equivalence:
//!
//! - exactly-once: a pipeline killed with SIGKILL again and again while its input grows, then
//!   run once more and stopped, leaves exactly the table of a failure-free run (nothing lost,
//!   nothing applied twice) and no prepared transaction behind;
//! - at-least-once with `upsert`: the same under kills, the replays absorbed by the key;
//! - the database down in the middle of a run (a private server of its own, stopped and
//!   started again): the restart strategy takes over and nothing is lost or doubled; a server
//!   with `max_prepared_transactions = 0` is refused by `weir run` with a clear message.
//!
//! Each test writes into a database of its own (named after the test and the process), so the
//! tests share one server. A failing test keeps its directory (logs of every run) and prints
//! its path. Nothing here asserts on timing.
#![cfg(unix)]
#![allow(clippy::unwrap_used, missing_docs)]

mod common;
use common::binary::weir;
use common::kill::{Rng, Scratch, log_excerpt, read_log, restores_in, wait_bounded};
use common::pg::{Pg, SETTLE, db_name, settle_and_stop};

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weir_engine::base::message::Batch;
use weir_engine::connectors::postgres::{PostgresConfig, PostgresSink};
use weir_engine::element::{Operator, OperatorContext};
use weir_engine::record::parse_json;
use weir_schema::PostgresSinkSpec;

/// The environment variable the pipelines read their connection string from.
const URL_ENV: &str = "WEIR_TEST_PG_SINK_URL";
/// Records of every test input.
const RECORDS: u64 = 20_000;
/// The input grows in this many chunks.
const CHUNKS: u64 = 40;

// ---------------------------------------------------------------------------------------------
// The table `events` of these tests.

impl Pg {
    fn count(&self, db: &str) -> u64 {
        self.count_in(db, "events")
    }

    fn count_in(&self, db: &str, table: &str) -> u64 {
        self.sql(db, &format!("SELECT count(*) FROM {table}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// The table as sorted lines.
    fn dump(&self, db: &str) -> Vec<String> {
        self.dump_of(db, "events")
    }

    fn dump_of(&self, db: &str, table: &str) -> Vec<String> {
        self.sorted_rows(db, &format!("SELECT id, name, total, meta FROM {table}"))
    }

    /// `events (id, name)` of [`upsert_sink`] as sorted lines.
    fn dump_of_names(&self, db: &str) -> Vec<String> {
        self.sorted_rows(db, "SELECT id, name FROM events")
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs and pipelines.

/// Input line `i`.
fn record(i: u64) -> String {
    json!({"id": i, "name": format!("n{i}"), "amount": i % 100, "meta": {"k": i}}).to_string()
}

/// The row a failure-free run writes for record `i` (as `dump` prints it).
fn expected_row(i: u64) -> String {
    format!("{i}|n{i}|{}|{{\"k\": {i}}}", (i % 100) * 3)
}

fn expected_rows() -> Vec<String> {
    let mut rows: Vec<String> = (0..RECORDS).map(expected_row).collect();
    rows.sort();
    rows
}

/// Appends records `from..to` to `path`.
fn append(path: &Path, from: u64, to: u64) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut text = String::new();
    for i in from..to {
        text.push_str(&record(i));
        text.push('\n');
    }
    f.write_all(text.as_bytes()).unwrap();
}

/// Grows `path` to [`RECORDS`] records in [`CHUNKS`] chunks, one every `every`, on a thread;
/// the flag turns true at the end.
fn grow(path: &Path, every: Duration) -> (std::thread::JoinHandle<()>, Arc<AtomicBool>) {
    let done = Arc::new(AtomicBool::new(false));
    let (path, flag) = (path.to_owned(), Arc::clone(&done));
    let per = RECORDS / CHUNKS;
    let handle = std::thread::spawn(move || {
        for c in 0..CHUNKS {
            append(&path, c * per, (c + 1) * per);
            std::thread::sleep(every);
        }
        flag.store(true, Ordering::SeqCst);
    });
    (handle, done)
}

/// A pipeline file: a followed JSON-lines file → a map → the `postgres` sink (parallelism 2),
/// checkpoints every 100 ms in `mode`, restarts for ever.
fn pipeline(dir: &Path, input: &Path, mode: &str, sink: Value, restart_delay: &str) -> PathBuf {
    let mut sink = sink;
    let m = sink.as_object_mut().unwrap();
    m.insert("id".into(), json!("db"));
    m.insert("type".into(), json!("postgres"));
    m.insert("input".into(), json!("shape"));
    m.insert("connection_env".into(), json!(URL_ENV));
    m.entry("table").or_insert(json!("events"));
    m.insert(
        "columns".into(),
        json!({"id": "id", "name": "name", "total": "total", "meta": "meta"}),
    );
    let file = json!({
        "version": 1,
        "api": {"enabled": false},
        "pipelines": [{
            "id": "pg",
            "parallelism": 2,
            "state": {"backend": "fs"},
            "checkpoints": {"interval": "100ms", "mode": mode, "storage": dir.join("checkpoints").to_str().unwrap()},
            "restart": {"strategy": "fixed_delay", "attempts": 100000, "delay": restart_delay},
            "sources": [{"id": "in", "type": "file", "path": input.to_str().unwrap(),
                         "follow": true, "poll_interval": "20ms", "parallelism": 1}],
            "operators": [{"id": "shape", "type": "map", "input": "in", "partitioning": "rebalance",
                           "script": "fn map(r) { r.total = r.amount * 3; r }"}],
            "sinks": [sink],
        }],
    });
    let path = dir.join("job.json");
    std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    let v = weir().arg("validate").arg(&path).output().unwrap();
    assert!(
        v.status.success(),
        "{} does not validate:\n{}{}",
        path.display(),
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
    path
}

// ---------------------------------------------------------------------------------------------
// Runs.

/// Runs of one pipeline file against one database, each logging to `<logs>/<label>-<n>.err`.
struct Runs {
    file: PathBuf,
    url: String,
    logs: PathBuf,
    label: String,
    n: usize,
}

impl Runs {
    fn new(file: &Path, url: String, logs: &Path, label: &str) -> Self {
        std::fs::create_dir_all(logs).unwrap();
        Self {
            file: file.to_owned(),
            url,
            logs: logs.to_owned(),
            label: label.to_owned(),
            n: 0,
        }
    }

    fn spawn(&mut self) -> (Child, PathBuf) {
        self.n += 1;
        let base = self.logs.join(format!("{}-{:03}", self.label, self.n));
        let err = base.with_extension("err");
        let child = weir()
            .args(["run", "--no-progress", "--no-api"])
            .arg(&self.file)
            .env(URL_ENV, &self.url)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(base.with_extension("out")).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        (child, err)
    }
}

/// Runs `file` with all of the input present until the table has every record, then stops it;
/// returns the table.
fn failure_free(pg: &Pg, db: &str, dir: &Path, sink: Value) -> Vec<String> {
    failure_free_into(pg, db, "events", dir, sink).0
}

/// [`failure_free`] into `table`; also returns the run's log.
fn failure_free_into(
    pg: &Pg,
    db: &str,
    table: &str,
    dir: &Path,
    sink: Value,
) -> (Vec<String>, String) {
    let input = dir.join("input.jsonl");
    append(&input, 0, RECORDS);
    let mut sink = sink;
    sink.as_object_mut()
        .unwrap()
        .insert("table".into(), json!(table));
    let file = pipeline(dir, &input, "exactly_once", sink, "10ms");
    let mut runs = Runs::new(&file, pg.url(db), &dir.join("logs"), "clean");
    let (mut child, log) = runs.spawn();
    let status = settle_and_stop(&mut child, &log, "failure-free run", || {
        pg.count_in(db, table) >= RECORDS
    });
    assert!(
        status.success(),
        "failure-free run into {db}.{table}: {status}\n{}",
        log_excerpt(&log)
    );
    let text = read_log(&log);
    // Failure-free means no task failed either: a restart's restore would hide a failing
    // commit in the table.
    assert!(
        !text.contains("Task failed"),
        "failure-free run into {db}.{table} had a task fail\n{}",
        log_excerpt(&log)
    );
    (pg.dump_of(db, table), text)
}

/// What the kill loop saw.
#[derive(Default)]
struct Kills {
    kills: usize,
    /// Of which right after a checkpoint completed (before its commit, with luck).
    targeted: usize,
    resumed: usize,
    moments: Vec<String>,
    restored: Vec<u64>,
    /// Prepared transactions a restore committed (its checkpoint completed, but the run died
    /// before committing them), and those it found committed already.
    committed_at_restore: usize,
    already_committed: usize,
    rolled_back: usize,
}

/// Kills runs of `runs` at least `kills` times and until `grown` is set: every other run at a
/// random moment in `window` after its start, the others as soon as their first checkpoint
/// completed (so that a restore finds transactions prepared for a completed checkpoint).
fn kill_loop(
    runs: &mut Runs,
    rng: &mut Rng,
    kills: usize,
    window: (Duration, Duration),
    grown: &AtomicBool,
) -> Kills {
    let mut k = Kills::default();
    while k.kills < kills || !grown.load(Ordering::SeqCst) {
        assert!(
            k.kills < kills * 10,
            "{}: the input never finished growing",
            runs.label
        );
        let targeted = k.kills % 2 == 1;
        let at = rng.between(window.0, window.1);
        let (mut child, log) = runs.spawn();
        if targeted {
            let until = Instant::now() + SETTLE;
            while !read_log(&log).contains("Checkpoint completed.") && Instant::now() < until {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        } else {
            std::thread::sleep(at);
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "{}: a run that was not killed ended with {status}\n{}",
                runs.label,
                log_excerpt(&log)
            );
        }
        child.kill().unwrap();
        let status = wait_bounded(&mut child, SETTLE, &log);
        assert!(!status.success());
        let text = read_log(&log);
        k.kills += 1;
        k.targeted += usize::from(targeted);
        k.moments.push(if targeted {
            "ck".to_owned()
        } else {
            at.as_millis().to_string()
        });
        for line in text.lines() {
            if line.contains("Committed a prepared transaction of the restored checkpoint") {
                if line.contains("already=true") {
                    k.already_committed += 1;
                } else {
                    k.committed_at_restore += 1;
                }
            }
            k.rolled_back += usize::from(line.contains("Rolled back a prepared transaction"));
        }
        let restored = restores_in(&text);
        k.resumed += usize::from(!restored.is_empty());
        k.restored.extend(restored.into_iter().map(|(_, c)| c));
    }
    k
}

// ---------------------------------------------------------------------------------------------
// 1. Exactly-once under SIGKILL.

#[test]
fn exactly_once_under_sigkills_equals_the_failure_free_run() {
    let started = Instant::now();
    let pg = Pg::shared();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    // No key: a row applied twice would show as a duplicate.
    let ddl = "CREATE TABLE events (id bigint NOT NULL, name text, total bigint, meta jsonb)";
    let sink = json!({});

    let clean_db = db_name("eo_clean");
    pg.fresh_db(&clean_db, ddl);
    let clean_dir = tmp.join("clean");
    std::fs::create_dir_all(&clean_dir).unwrap();
    let expected = failure_free(&pg, &clean_db, &clean_dir, sink.clone());
    assert_eq!(expected, expected_rows(), "failure-free run vs the input");

    let db = db_name("eo_crash");
    pg.fresh_db(&db, ddl);
    // A transaction an earlier run prepared and never committed: a fresh start rolls it back.
    pg.sql(
        &db,
        "BEGIN; INSERT INTO events VALUES (-1, 'stale', 0, NULL); \
         PREPARE TRANSACTION 'weir:pg:db:1:999999'",
    );
    assert_eq!(pg.prepared(&db).len(), 1);
    let dir = tmp.join("crash");
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("input.jsonl");
    std::fs::write(&input, "").unwrap();
    let file = pipeline(&dir, &input, "exactly_once", sink, "10ms");
    let mut runs = Runs::new(&file, pg.url(&db), &tmp.join("logs"), "crash");
    let (writer, grown) = grow(&input, Duration::from_millis(250));
    let mut rng = Rng::new(0x5eed_0016);
    let k = kill_loop(
        &mut runs,
        &mut rng,
        24,
        (Duration::from_millis(150), Duration::from_millis(900)),
        &grown,
    );
    writer.join().unwrap();
    let committed_before_final = pg.count(&db);
    let (mut child, log) = runs.spawn();
    let status = settle_and_stop(&mut child, &log, "final run", || pg.count(&db) >= RECORDS);
    assert!(
        status.success(),
        "final run: {status}\n{}",
        log_excerpt(&log)
    );
    let got = pg.dump(&db);
    pg.assert_exactly_once(
        &db,
        &got,
        &expected,
        &format!("after {} SIGKILLs at {:?} ms", k.kills, k.moments),
        &log,
    );
    assert!(
        k.kills >= 20 && k.resumed > 0,
        "kills {}, resumed {}",
        k.kills,
        k.resumed
    );
    println!(
        "exactly-once into PostgreSQL in {:.1}s: {} SIGKILLs ({} right after a checkpoint \
         completed) at {:?} ms, {} runs resumed from checkpoints {:?}; restores committed {} \
         prepared transactions (and found {} committed already) and rolled back {}; \
         {committed_before_final} of {RECORDS} rows committed before the final run; equal to \
         the failure-free run",
        started.elapsed().as_secs_f64(),
        k.kills,
        k.targeted,
        k.moments,
        k.resumed,
        k.restored,
        k.committed_at_restore,
        k.already_committed,
        k.rolled_back
    );
}

// ---------------------------------------------------------------------------------------------
// 2. At-least-once upsert is idempotent.

#[test]
fn at_least_once_upsert_absorbs_replays() {
    let pg = Pg::shared();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let ddl = "CREATE TABLE events (id bigint PRIMARY KEY, name text, total bigint, meta jsonb)";
    let db = db_name("alo_upsert");
    pg.fresh_db(&db, ddl);
    let input = tmp.join("input.jsonl");
    std::fs::write(&input, "").unwrap();
    let file = pipeline(
        tmp,
        &input,
        "at_least_once",
        // The sink's own parallelism and exchange, as the pipeline's would be.
        json!({"mode": "upsert", "key": ["id"], "batch_size": 300, "parallelism": 2,
               "partitioning": "forward"}),
        "10ms",
    );
    let mut runs = Runs::new(&file, pg.url(&db), &tmp.join("logs"), "alo");
    let (writer, grown) = grow(&input, Duration::from_millis(150));
    let mut rng = Rng::new(0x05ee_da10);
    let k = kill_loop(
        &mut runs,
        &mut rng,
        10,
        (Duration::from_millis(150), Duration::from_millis(900)),
        &grown,
    );
    writer.join().unwrap();
    let (mut child, log) = runs.spawn();
    let status = settle_and_stop(&mut child, &log, "final run", || pg.count(&db) >= RECORDS);
    assert!(
        status.success(),
        "final run: {status}\n{}",
        log_excerpt(&log)
    );
    let got = pg.dump(&db);
    assert!(
        got == expected_rows(),
        "after {} SIGKILLs: {} rows, {RECORDS} expected\n{}",
        k.kills,
        got.len(),
        log_excerpt(&log)
    );
    assert_eq!(pg.prepared(&db), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// 2b. Copies of one pipeline on one server.

/// Three copies of one pipeline (the same pipeline and sink ids) run at once on one server:
/// two into tables `events` and `events2` of one database, one into `events` of another.
/// Transaction names are unique in the whole server, so each copy's must differ from the
/// others' (or a `PREPARE` is refused), and a copy's fresh start must roll back only its own
/// (or it would undo another copy's checkpoint). Transactions an older version left, named
/// without a target, are each rolled back once, by a copy writing into their database, and
/// neither copy fails when the other is rolling back the same one (the server calls it busy).
#[test]
fn copies_of_one_pipeline_on_one_server_keep_to_their_own_transactions() {
    const STALE: usize = 20;
    let pg = Pg::shared();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let columns = "(id bigint NOT NULL, name text, total bigint, meta jsonb)";
    let (one, two) = (db_name("copies_one"), db_name("copies_two"));
    pg.fresh_db(
        &one,
        &format!("CREATE TABLE events {columns}; CREATE TABLE events2 {columns}"),
    );
    pg.fresh_db(&two, &format!("CREATE TABLE events {columns}"));
    // Left by an older version's run into `one`.`events`, of both subtasks: more than one,
    // so that the two copies in `one` (which both take them for their own) meet on some.
    let stale: Vec<String> = (0..STALE)
        .map(|i| format!("weir:pg:db:{}:{}", i % 2, 999_900 + i))
        .collect();
    for gid in &stale {
        pg.sql(
            &one,
            &format!(
                "BEGIN; INSERT INTO events VALUES (-1, 'stale', 0, NULL); \
                 PREPARE TRANSACTION '{gid}'"
            ),
        );
    }
    let copies = [
        (one.clone(), "events"),
        (one.clone(), "events2"),
        (two.clone(), "events"),
    ];
    let runs: Vec<_> = copies
        .iter()
        .enumerate()
        .map(|(i, (db, table))| {
            let dir = tmp.join(format!("copy{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let (db, table) = (db.clone(), *table);
            std::thread::spawn(move || {
                failure_free_into(&Pg::shared(), &db, table, &dir, json!({}))
            })
        })
        .collect();
    let mut rolled_back = Vec::new();
    for ((db, table), run) in copies.iter().zip(runs) {
        let (got, log) = run.join().unwrap();
        assert!(
            got == expected_rows(),
            "the copy into {db}.{table} committed {} rows, {RECORDS} expected\n{log}",
            got.len()
        );
        assert!(!log.contains("cannot prepare"), "{db}.{table}:\n{log}");
        rolled_back.extend(
            log.lines()
                .filter(|l| l.contains("Rolled back a prepared transaction"))
                .map(|l| format!("{db}.{table}: {l}")),
        );
    }
    // Each exactly once, by either copy in `one`.
    assert_eq!(rolled_back.len(), stale.len(), "{rolled_back:#?}");
    for gid in &stale {
        let by: Vec<_> = rolled_back
            .iter()
            .filter(|l| l.contains(&format!("transaction={gid} ")) || l.ends_with(gid))
            .collect();
        assert!(
            by.len() == 1 && by[0].starts_with(&format!("{one}.events")),
            "{gid}: {by:#?}"
        );
    }
    assert_eq!(pg.prepared(&one), Vec::<String>::new());
    assert_eq!(pg.prepared(&two), Vec::<String>::new());
    println!("three copies of one pipeline on one server: each table exact, no checkpoint aborted");
}

/// Exactly-once `upsert` with keys that come back in every checkpoint interval, more of them
/// than a statement's batch: a subtask's statement must never wait on the row locks of its
/// own prepared transaction (only the subtask can commit it, on hearing of the checkpoint's
/// completion), and the table ends with each key's last record.
#[test]
fn exactly_once_upsert_of_returning_keys_never_waits_on_its_own_transaction() {
    const KEYS: u64 = 2_000;
    const CHUNKS: u64 = 20;
    let pg = Pg::shared();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let db = db_name("eo_upsert_keys");
    pg.fresh_db(
        &db,
        "CREATE TABLE events (id bigint PRIMARY KEY, name text, total bigint, meta jsonb)",
    );
    let input = tmp.join("input.jsonl");
    std::fs::write(&input, "").unwrap();
    let sink = json!({"mode": "upsert", "key": ["id"], "batch_size": 100});
    let file = pipeline(tmp, &input, "exactly_once", sink, "10ms");
    // One subtask throughout, so that a key's records reach the table in input order.
    let mut job: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    job["pipelines"][0]["parallelism"] = json!(1);
    std::fs::write(&file, serde_json::to_string_pretty(&job).unwrap()).unwrap();
    // Record `i` of chunk `c` is key `i`, named after the chunk.
    let chunk = |c: u64| -> String {
        (0..KEYS)
            .map(|i| {
                format!(
                    "{}\n",
                    json!({"id": i, "name": format!("c{c}"), "amount": i % 100, "meta": {"k": i}})
                )
            })
            .collect()
    };
    let mut runs = Runs::new(&file, pg.url(&db), &tmp.join("logs"), "upsert");
    let (mut child, log) = runs.spawn();
    let writer = {
        let input = input.clone();
        std::thread::spawn(move || {
            for c in 0..CHUNKS {
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&input)
                    .unwrap();
                f.write_all(chunk(c).as_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(60));
            }
        })
    };
    let last = format!("c{}", CHUNKS - 1);
    let status = settle_and_stop(&mut child, &log, "upsert run", || {
        pg.sql(
            &db,
            &format!("SELECT count(*) FROM events WHERE name = '{last}'"),
        )
        .trim()
            == KEYS.to_string()
    });
    writer.join().unwrap();
    let text = read_log(&log);
    assert!(
        status.success(),
        "upsert run: {status}\n{}",
        log_excerpt(&log)
    );
    assert!(!text.contains("Task failed"), "{}", log_excerpt(&log));
    let expected: Vec<String> = {
        let mut rows: Vec<String> = (0..KEYS)
            .map(|i| format!("{i}|{last}|{}|{{\"k\": {i}}}", (i % 100) * 3))
            .collect();
        rows.sort();
        rows
    };
    assert!(
        pg.dump(&db) == expected,
        "the table is not every key's last record"
    );
    assert_eq!(pg.prepared(&db), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// 2c. A barrier while a prepared transaction is not committed, driven on the sink itself.

/// An exactly-once `upsert` sink into `events (id, name)` of `db`, batches of 50 rows.
fn upsert_sink(pg: &Pg, db: &str) -> PostgresSink {
    let spec: PostgresSinkSpec = serde_json::from_value(json!({
        "id": "out", "input": "in", "connection_env": "UNUSED", "table": "events",
        "columns": {"id": "id", "name": "name"}, "mode": "upsert", "key": ["id"],
        "batch_size": 50,
    }))
    .unwrap();
    let config = PostgresConfig::with_connection(&spec, "pg", true, &pg.url(db)).unwrap();
    PostgresSink::new(Arc::new(config), 0)
}

/// Records `{id, name}` for the ids `ids`.
fn named(ids: std::ops::Range<u64>, name: &str) -> Batch {
    Batch::new(
        ids.map(|i| parse_json(json!({"id": i, "name": name}).to_string().as_bytes()).unwrap())
            .collect(),
    )
}

/// `(id, name)` rows: `name` for each range.
fn rows_named(parts: &[(std::ops::Range<u64>, &str)]) -> Vec<String> {
    let mut rows: Vec<String> = parts
        .iter()
        .flat_map(|(ids, name)| ids.clone().map(move |i| format!("{i}|{name}")))
        .collect();
    rows.sort();
    rows
}

/// Checkpoint 1 prepares the rows of its records; then the same keys come again and the
/// barrier of checkpoint 2 arrives before the sink hears that checkpoint 1 completed (late,
/// or checkpoint 1 failed). The prepared transaction holds those rows locked, and only this
/// subtask can commit it: barrier 2 must not send the new rows (it would wait on the locks
/// for good), and its snapshot must carry them. Then, both ways on:
/// - no failure: the completion commits checkpoint 1, the rows go out with the next
///   checkpoint, and the end of the input commits a last checkpoint not yet completed
///   before it sends its last rows (those update rows that checkpoint holds locked);
/// - a restore from checkpoint 2: it commits checkpoint 1's transaction and writes the rows
///   checkpoint 2 carried.
///
/// Either way the table ends as the records say, with no prepared transaction left.
#[test]
fn a_barrier_before_the_previous_commit_carries_its_rows_instead_of_waiting_on_their_locks() {
    let pg = Pg::shared();
    let mut ctx = OperatorContext::standalone("pg", "out", 128);
    let mut out = Vec::new();
    // Up to checkpoint 2's snapshot, in database `db`.
    let up_to_2 = |db: &str| -> (PostgresSink, Vec<u8>) {
        pg.fresh_db(db, "CREATE TABLE events (id bigint PRIMARY KEY, name text)");
        let mut ctx = OperatorContext::standalone("pg", "out", 128);
        let mut sink = upsert_sink(&pg, db);
        sink.open(&mut ctx).unwrap();
        sink.process(&mut named(0..100, "a"), &mut ctx).unwrap();
        sink.snapshot(1, &mut ctx).unwrap();
        assert_eq!(pg.prepared(db).len(), 1, "checkpoint 1 prepared");
        sink.process(&mut named(0..100, "b"), &mut ctx).unwrap();
        let two = sink.snapshot(2, &mut ctx).unwrap().unwrap();
        assert_eq!(pg.prepared(db).len(), 1, "checkpoint 2 prepared nothing");
        assert_eq!(pg.count_in(db, "events"), 0);
        (sink, two)
    };

    let db = db_name("carried_late");
    let (mut sink, _) = up_to_2(&db);
    sink.notify_checkpoint_complete(2, &mut ctx).unwrap();
    assert_eq!(pg.dump_of_names(&db), rows_named(&[(0..100, "a")]));
    sink.process(&mut named(0..50, "c"), &mut ctx).unwrap();
    sink.snapshot(3, &mut ctx).unwrap();
    sink.process(&mut named(0..10, "d"), &mut ctx).unwrap();
    sink.on_end(&mut out, &mut ctx).unwrap();
    assert_eq!(
        pg.dump_of_names(&db),
        rows_named(&[(0..10, "d"), (10..50, "c"), (50..100, "b")])
    );
    assert_eq!(pg.prepared(&db), Vec::<String>::new());

    let db = db_name("carried_restored");
    let (mut sink, two) = up_to_2(&db);
    sink.close(&mut ctx).unwrap();
    let mut restored = upsert_sink(&pg, &db);
    let mut ctx = OperatorContext::standalone("pg", "out", 128);
    ctx.restored_from = Some(2);
    restored.open(&mut ctx).unwrap();
    restored.restore(Some(&two), &mut ctx).unwrap();
    assert_eq!(pg.dump_of_names(&db), rows_named(&[(0..100, "b")]));
    assert_eq!(pg.prepared(&db), Vec::<String>::new());
    // A second restore from the same checkpoint (a failure right after the first) writes the
    // carried rows again, over later rows of the same keys: still checkpoint 2's table.
    restored.process(&mut named(0..100, "e"), &mut ctx).unwrap();
    restored.snapshot(3, &mut ctx).unwrap();
    restored.close(&mut ctx).unwrap();
    let mut again = upsert_sink(&pg, &db);
    again.open(&mut ctx).unwrap();
    again.restore(Some(&two), &mut ctx).unwrap();
    assert_eq!(pg.dump_of_names(&db), rows_named(&[(0..100, "b")]));
    assert_eq!(pg.prepared(&db), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// 3. The database goes down mid-run; a server without prepared transactions is refused.

/// A private server (its own cache dir and port) that a test may stop and start.
struct PrivateServer {
    dir: PathBuf,
    port: u16,
}

impl PrivateServer {
    fn new() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = PathBuf::from(format!(
            "/var/tmp/weir-services/test-pg-{}-{port}",
            std::process::id()
        ));
        Self { dir, port }
    }

    fn script(&self, cmd: &str, max_prepared: u32) -> std::collections::BTreeMap<String, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services/postgres.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(cmd)
            .env("WEIR_SERVICES_DIR", &self.dir)
            .env("WEIR_POSTGRES_PORT", self.port.to_string())
            .env("WEIR_POSTGRES_MAX_PREPARED", max_prepared.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "postgres.sh {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        common::services::parse_service_settings(&out.stdout)
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| self.script("stop", 64));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn database_down_mid_run_loses_nothing_and_prepared_transactions_are_required() {
    let server = PrivateServer::new();
    let pg = Pg::from_settings(&server.script("ensure", 64));
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let db = "weir_down";
    pg.fresh_db(
        db,
        "CREATE TABLE events (id bigint NOT NULL, name text, total bigint, meta jsonb)",
    );
    let input = tmp.join("input.jsonl");
    std::fs::write(&input, "").unwrap();
    let file = pipeline(tmp, &input, "exactly_once", json!({}), "200ms");
    let mut runs = Runs::new(&file, pg.url(db), &tmp.join("logs"), "down");
    let (writer, grown) = grow(&input, Duration::from_millis(100));
    let (mut child, log) = runs.spawn();
    // Down once some rows are committed, while the input still grows.
    let until = Instant::now() + SETTLE;
    while pg.count(db) == 0 {
        assert!(
            Instant::now() < until,
            "nothing committed\n{}",
            log_excerpt(&log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.script("stop", 64);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended while the database was down\n{}",
        log_excerpt(&log)
    );
    server.script("ensure", 64);
    writer.join().unwrap();
    assert!(grown.load(Ordering::SeqCst));
    let status = settle_and_stop(&mut child, &log, "run with the database down", || {
        pg.count(db) >= RECORDS
    });
    assert!(status.success(), "{status}\n{}", log_excerpt(&log));
    let text = read_log(&log);
    assert!(
        text.contains("PostgreSQL"),
        "the log names no PostgreSQL failure\n{}",
        log_excerpt(&log)
    );
    assert!(
        pg.dump(db) == expected_rows(),
        "rows lost or doubled\n{}",
        log_excerpt(&log)
    );
    assert_eq!(pg.prepared(db), Vec::<String>::new());

    // The same server without prepared transactions: `weir run` refuses, and says why.
    server.script("stop", 64);
    server.script("ensure", 0);
    let out = weir()
        .args(["run", "--no-progress", "--no-api"])
        .arg(&file)
        .env(URL_ENV, pg.url(db))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "ran without prepared transactions:\n{err}"
    );
    assert!(
        err.contains("max_prepared_transactions = 0") && err.contains("at_least_once"),
        "the refusal does not say why and what to do:\n{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Rescaled through savepoints.

/// The exactly-once pipeline of [`pipeline`] with its control API on (for savepoints),
/// checkpoints every `interval`, and every node but the source at `parallelism`.
fn rescaled_pipeline(dir: &Path, input: &Path, parallelism: u32, interval: &str) -> PathBuf {
    let path = pipeline(dir, input, "exactly_once", json!({}), "10ms");
    let mut file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    file.as_object_mut().unwrap().remove("api");
    file["pipelines"][0]["parallelism"] = json!(parallelism);
    file["pipelines"][0]["checkpoints"]["interval"] = json!(interval);
    std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    path
}

/// The exactly-once sink rescaled 2 → 3 → 1 through savepoints while its input grows, and
/// the table ends equal to the failure-free one, with no prepared transaction behind:
/// - at 2, without periodic checkpoints, `weir savepoint` and at once SIGKILL: the
///   savepoint's prepared transactions may still be outstanding (the count is printed); the
///   run at 3 commits them, each by the new subtask that owns the old one's number;
/// - at 3, `weir stop --savepoint`;
/// - at 1, to the end.
#[test]
fn exactly_once_rescaled_through_savepoints_equals_the_failure_free_run() {
    use common::run::{Run, beside, pipeline_of};

    let pg = Pg::shared();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let db = db_name("eo_rescale");
    pg.fresh_db(
        &db,
        "CREATE TABLE events (id bigint NOT NULL, name text, total bigint, meta jsonb)",
    );
    let url = pg.url(&db);
    let env = [(URL_ENV, url.as_str())];
    let input = tmp.join("input.jsonl");
    std::fs::write(&input, "").unwrap();
    let (writer, grown) = grow(&input, Duration::from_millis(150));
    let start = |file: &Path, savepoint: Option<&Path>| {
        let mut args = vec!["--api-port".to_owned(), "0".to_owned()];
        if let Some(p) = savepoint {
            args.extend([
                "--from-savepoint".to_owned(),
                p.to_str().unwrap().to_owned(),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Run::start_with(beside(file), file, &args, &env)
    };
    let read_by_this_run = |run: &mut Run, records: u64| {
        run.wait_for(&format!("{records} records read"), |s| {
            pipeline_of(s, "pg")["source_records"].as_u64().unwrap_or(0) >= records
        });
    };

    // At 2: a savepoint (the only checkpoint), then SIGKILL.
    let file = rescaled_pipeline(tmp, &input, 2, "1h");
    let mut run = start(&file, None);
    read_by_this_run(&mut run, 3000);
    let out = run.cli(&["savepoint", "pg"]);
    let first = run.savepoint_path(&out, "weir savepoint");
    run.kill();
    let outstanding = pg.prepared(&db).len();
    let after_kill = pg.count(&db);

    // At 3: restored, then stopped with a savepoint.
    let file = rescaled_pipeline(tmp, &input, 3, "100ms");
    let mut run = start(&file, Some(&first));
    read_by_this_run(&mut run, 3000);
    run.wait_checkpoints(&["pg"], 1);
    let second = run.stop_with_savepoint("pg");
    let log = run.finish_ok();
    assert!(log.contains("Restoring from a savepoint"), "{log}");
    // How the run at 3 found the savepoint's transactions (committed by it, or before).
    let reconciled = log
        .lines()
        .filter(|l| l.contains("Committed a prepared transaction of the restored checkpoint"))
        .map(|l| {
            if l.contains("already=true") {
                "already"
            } else {
                "now"
            }
        })
        .collect::<Vec<_>>();
    assert_eq!(
        pg.prepared(&db),
        Vec::<String>::new(),
        "the run at 3 committed the savepoint's transactions"
    );
    let after_second = pg.count(&db);
    assert!(after_second > after_kill, "the run at 3 committed rows");

    // At 1: to the end.
    let file = rescaled_pipeline(tmp, &input, 1, "100ms");
    let mut run = start(&file, Some(&second));
    run.wait_until("every row committed", || {
        grown.load(Ordering::SeqCst) && pg.count(&db) >= RECORDS
    });
    let log = run.terminate();
    assert!(log.contains("Restoring from a savepoint"), "{log}");
    writer.join().unwrap();
    let got = pg.dump(&db);
    assert!(
        got == expected_rows(),
        "rescaled 2 -> 3 -> 1 ({outstanding} prepared transactions outstanding after the \
         SIGKILL): {} rows, {RECORDS} expected",
        got.len()
    );
    assert_eq!(pg.prepared(&db), Vec::<String>::new());
    println!(
        "exactly-once into PostgreSQL rescaled 2 -> 3 -> 1 through savepoints: {outstanding} \
         prepared transactions outstanding after the SIGKILL at 2 ({after_kill} rows \
         committed; the restore at 3 committed them: {reconciled:?}), {after_second} rows \
         after the stop at 3; equal to the failure-free table"
    );
}
