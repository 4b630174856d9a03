//! Kafka → Weir → PostgreSQL, exactly once, against the real services (tansu and PostgreSQL,
//! started by `scripts/services/`; nothing is mocked): orders read from a 3-partition topic
//! while they are produced, per-user totals kept as keyed state, every update inserted into a
//! table by the `postgres` sink's two-phase commit. A pipeline killed with SIGKILL again and
//! again at random moments (and right after checkpoints) and then run once more leaves exactly
//! the table of a failure-free run, which equals a sequential reference: nothing lost, nothing
//! applied twice, no prepared transaction left behind.
//!
//! The table has no key: an update applied twice would be a duplicate row, one lost a missing
//! row. Topics, databases and checkpoint directories are the test's own. Nothing here asserts
//! on timing.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::kafka::{Broker, orders, unique_topic};
use common::kill::{
    Backend, KillPlan, Recovery, Rng, Runner, Scratch, kill_loop, log_excerpt, read_log,
    restores_in, with_recovery,
};
use common::pg::{Pg, db_name, settle_and_stop};

/// The environment variable the pipeline reads its connection string from.
const URL_ENV: &str = "WEIR_TEST_KAFKA_PG_URL";
/// Partitions of the topic.
const PARTITIONS: i32 = 3;
/// Orders in all; one row each.
const ORDERS: usize = 12_000;
/// The orders are produced in this many chunks while the job runs.
const CHUNKS: usize = 40;
const DDL: &str = "CREATE TABLE user_totals (user_id text NOT NULL, total bigint, orders bigint)";
const DUMP: &str = "SELECT user_id, total, orders FROM user_totals";

/// Kafka (`topic`) → key_by user → running sum and count per user (one update per order) →
/// the `postgres` sink inserting each update, parallelism 2; exactly-once checkpoints every
/// 100 ms on the fs backend, restarts for ever.
fn job(dir: &Path, brokers: &str, topic: &str) -> PathBuf {
    let file = json!({
        "version": 1,
        "pipelines": [{
            "id": "kafka_pg",
            "parallelism": 2,
            "sources": [{"id": "orders", "type": "kafka", "brokers": brokers,
                         "topics": [topic], "start": "earliest"}],
            "operators": [
                {"id": "by_user", "type": "key_by", "input": "orders", "field": "user"},
                {"id": "totals", "type": "aggregate", "input": "by_user", "emit": "updates",
                 "aggregations": [{"fn": "sum", "field": "amount", "as": "total"},
                                  {"fn": "count", "as": "orders"}]},
            ],
            "sinks": [{"id": "db", "type": "postgres", "input": "totals",
                       "connection_env": URL_ENV, "table": "user_totals",
                       "columns": {"user_id": "key", "total": "total", "orders": "orders"}}],
        }],
    });
    std::fs::create_dir_all(dir).unwrap();
    let yaml = dir.join("kafka_pg.yaml");
    std::fs::write(&yaml, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    with_recovery(
        &yaml,
        &Recovery {
            backend: Backend::Fs,
            mode: "exactly_once",
            interval: "100ms",
            root: dir,
        },
    )
}

/// The table a correct run leaves, computed sequentially: per user, a row after each of its
/// orders with the running total and count (as `psql` prints them, sorted).
fn reference(orders: &[(String, String)]) -> Vec<String> {
    let mut per_user: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut rows: Vec<String> = orders
        .iter()
        .map(|(_, value)| {
            let v: Value = serde_json::from_str(value).unwrap();
            let user = v["user"].as_str().unwrap().to_owned();
            let (total, count) = per_user.entry(user.clone()).or_insert((0, 0));
            *total += v["amount"].as_i64().unwrap();
            *count += 1;
            format!("{user}|{total}|{count}")
        })
        .collect();
    rows.sort();
    rows
}

/// Produces `all` to `topic` in [`CHUNKS`] chunks, one every `every`, on a thread; the flag
/// turns true once the last is acknowledged.
fn produce_while_running(
    kafka: &Broker,
    topic: &str,
    all: &[(String, String)],
    every: Duration,
) -> (std::thread::JoinHandle<()>, Arc<AtomicBool>) {
    let done = Arc::new(AtomicBool::new(false));
    let (kafka, topic, all, flag) = (
        kafka.clone(),
        topic.to_owned(),
        all.to_vec(),
        Arc::clone(&done),
    );
    let handle = std::thread::spawn(move || {
        for chunk in all.chunks(all.len().div_ceil(CHUNKS)) {
            kafka.produce(&topic, PARTITIONS, chunk);
            std::thread::sleep(every);
        }
        flag.store(true, Ordering::SeqCst);
    });
    (handle, done)
}

/// Runs `file` once more until the table has every row, then stops it with SIGTERM; returns
/// the table.
fn final_run(runner: &mut Runner, pg: &Pg, db: &str, what: &str) -> (Vec<String>, PathBuf) {
    let (mut child, log) = runner.spawn(&[]);
    let rows = || {
        pg.sql(db, "SELECT count(*) FROM user_totals")
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    let status = settle_and_stop(&mut child, &log, what, || rows() >= ORDERS);
    assert!(status.success(), "{what}: {status}\n{}", log_excerpt(&log));
    (pg.sorted_rows(db, DUMP), log)
}

#[test]
fn kafka_to_postgres_is_exactly_once_under_random_sigkills() {
    let started = Instant::now();
    let kafka = Broker::shared();
    let pg = Pg::shared();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let input = orders(0, ORDERS);
    let want = reference(&input);

    // Failure-free: every order in the topic before the run starts.
    let clean_topic = unique_topic("kpg-clean");
    kafka.create_topic(&clean_topic, PARTITIONS.unsigned_abs());
    kafka.produce(&clean_topic, PARTITIONS, &input);
    let clean_db = db_name("kpg_clean");
    pg.fresh_db(&clean_db, DDL);
    let file = job(&tmp.join("clean"), &kafka.brokers, &clean_topic);
    let mut runner = Runner::new(&file, &tmp.join("logs"), "clean");
    runner.env.push((URL_ENV.to_owned(), pg.url(&clean_db)));
    let (expected, _) = final_run(&mut runner, &pg, &clean_db, "failure-free run");
    assert!(
        expected == want,
        "the failure-free run differs from the sequential reference: {} rows, {} expected; \
         first differing: {:?}",
        expected.len(),
        want.len(),
        expected.iter().zip(&want).find(|(a, b)| a != b)
    );

    // Killed again and again while the orders are produced, then run to completion.
    let topic = unique_topic("kpg-crash");
    kafka.create_topic(&topic, PARTITIONS.unsigned_abs());
    let db = db_name("kpg_crash");
    pg.fresh_db(&db, DDL);
    let file = job(&tmp.join("crash"), &kafka.brokers, &topic);
    let mut runner = Runner::new(&file, &tmp.join("logs"), "crash");
    runner.env.push((URL_ENV.to_owned(), pg.url(&db)));
    let (producer, produced) =
        produce_while_running(&kafka, &topic, &input, Duration::from_millis(400));
    let mut rng = Rng::new(0x6b70_6731);
    let mut st = kill_loop(
        &mut runner,
        &mut rng,
        &KillPlan {
            random: 20,
            window: (Duration::from_millis(200), Duration::from_millis(2500)),
            targeted: 5,
        },
    );
    // More random kills while the input still grows, so that some land after it is complete.
    while !produced.load(Ordering::SeqCst) {
        st.absorb(kill_loop(
            &mut runner,
            &mut rng,
            &KillPlan {
                random: 1,
                window: (Duration::from_millis(200), Duration::from_millis(2500)),
                targeted: 0,
            },
        ));
    }
    producer.join().unwrap();
    let before_final = pg.sql(&db, "SELECT count(*) FROM user_totals");
    let (got, log) = final_run(&mut runner, &pg, &db, "final run");
    st.restored.extend(restores_in(&read_log(&log)));

    // The topic holds exactly the orders (the input is what the reference was computed from).
    let mut in_topic: Vec<String> = kafka
        .consume_all(&topic)
        .into_iter()
        .map(|(_, _, _, v)| v)
        .collect();
    let mut sent: Vec<String> = input.iter().map(|(_, v)| v.clone()).collect();
    in_topic.sort();
    sent.sort();
    assert!(
        in_topic == sent,
        "the topic does not hold the orders produced"
    );

    pg.assert_exactly_once(
        &db,
        &got,
        &expected,
        &format!("after {} SIGKILLs at {:?}", st.kills, st.moments),
        &log,
    );
    assert!(
        st.kills >= 20 && st.mid_stream > 0,
        "too few kills mid-stream: {}",
        st.report("crash runs")
    );
    println!(
        "kafka → postgres exactly-once in {:.1}s: {}; {} rows committed before the final run; \
         equal to the failure-free run and the sequential reference ({} rows)",
        started.elapsed().as_secs_f64(),
        st.report("crash runs"),
        before_final.trim(),
        want.len()
    );
}
