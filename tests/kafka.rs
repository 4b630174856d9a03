//! The `kafka` source and sink against a real Kafka-API broker (tansu, started by
//! `scripts/services/kafka.sh`; nothing is mocked): Kafka → file exactly-once under repeated
//! SIGKILLs equals the failure-free run; file → Kafka at-least-once loses nothing under
//! SIGKILLs; a source rescaled 2 → 3 → 1 through savepoints reads every message exactly once;
//! messages that do not parse become dead letters with their topic, partition and offset; a
//! record's metadata carries its message's key, headers and position; the
//! start positions (earliest, latest, the group's committed offsets, a timestamp) read exactly
//! the expected messages; topics matching `topic_pattern` that appear mid-run are read from
//! their start; `weir status` shows each partition's offset and lag; the broker going down
//! mid-run (and a run starting while it is down) loses and repeats nothing.
//!
//! Every test works on topics of its own (named after the test, the process and the time), so
//! test binaries running at once share one broker safely; the broker-down test has a broker of
//! its own. Nothing here asserts on timing.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::kafka::{Broker, brokers, orders, unique_topic};
use common::kill::{
    KillPlan, Recovery, Rng, Runner, Scratch, assert_exactly, file_sinks, kill_loop, log_excerpt,
    read_log, restores_in, with_recovery,
};
use common::output::{OutputDiff, committed, committed_marking_torn, describe_counted};
use common::run::{Run, beside, pipeline_of, run_to_end};

fn write_job(dir: &Path, job: &Value) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("job.yaml");
    std::fs::write(&path, serde_json::to_string_pretty(job).unwrap()).unwrap();
    path
}

/// Kafka → key_by → reduce → file: the reduce's running total per user makes the output depend
/// on every message being read exactly once, in partition order.
fn totals_job(topic: &str, parallelism: u32, bounded: bool) -> Value {
    let mut source = json!({
        "id": "orders", "type": "kafka", "brokers": brokers(), "topics": [topic],
        "parallelism": parallelism,
    });
    if bounded {
        source["stop_at"] = json!("latest");
    }
    json!({
        "version": 1,
        "pipelines": [{
            "id": "totals",
            "parallelism": parallelism,
            "sources": [source],
            "operators": [
                {"id": "by_user", "type": "key_by", "input": "orders", "field": "user"},
                {"id": "total", "type": "reduce", "input": "by_user",
                 "script": "fn reduce(acc, r) { #{user: acc.user, amount: acc.amount + r.amount, seq: r.seq} }"},
            ],
            "sinks": [{"id": "out", "type": "file", "input": "total", "path": "out"}],
        }],
    })
}

/// The reduce's output for `orders`, computed sequentially: per user, the running total after
/// each of its orders (a user's orders are in one partition, so in production order).
fn totals_reference(orders: &[(String, String)]) -> Vec<String> {
    let mut totals: BTreeMap<String, i64> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, value) in orders {
        let v: Value = serde_json::from_str(value).unwrap();
        let user = v["user"].as_str().unwrap().to_owned();
        let total = totals.entry(user.clone()).or_insert(0);
        *total += v["amount"].as_i64().unwrap();
        // The reduce adds the key under `key` (its `key_field`).
        out.push(json!({"user": user, "amount": *total, "seq": v["seq"], "key": user}).to_string());
    }
    common::output::canonical_lines(&out.join("\n"))
}

#[test]
fn kafka_to_file_is_exactly_once_under_repeated_sigkill() {
    let kafka = Broker::shared();
    let started = Instant::now();
    let topic = unique_topic("eo");
    kafka.create_topic(&topic, 3);
    let input = orders(0, 150_000);
    kafka.produce(&topic, 3, &input);
    let reference = totals_reference(&input);
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let job = totals_job(&topic, 2, true);
    fn recovery(root: &Path) -> Recovery<'_> {
        Recovery {
            backend: common::kill::Backend::Fs,
            mode: "exactly_once",
            interval: "100ms",
            root,
        }
    }

    // Failure-free: equals the sequential reference.
    let clean = tmp.join("clean");
    let clean_file = with_recovery(&write_job(&clean, &job), &recovery(&clean));
    let mut runner = Runner::new(&clean_file, &tmp.join("logs"), "clean");
    let (wall, _) = runner.run_to_end();
    let mut expected = BTreeMap::new();
    for s in file_sinks(&clean_file) {
        let got = committed_marking_torn(&s.dir);
        let (missing, extra) = OutputDiff::of(&got, &reference).counted();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "failure-free run vs the sequential reference: {}",
            describe_counted(&missing, &extra)
        );
        expected.insert(s.label(), got);
    }

    // Killed again and again, then run to the end: the same output.
    let crash = tmp.join("crash");
    let file = with_recovery(&write_job(&crash, &job), &recovery(&crash));
    let sinks = file_sinks(&file);
    let mut runner = Runner::new(&file, &tmp.join("logs"), "crash");
    let lo = Duration::from_millis(50);
    let mut rng = Rng::new(16);
    let mut st = kill_loop(
        &mut runner,
        &mut rng,
        &KillPlan {
            random: 20,
            window: (lo, wall.mul_f64(0.9).max(lo)),
            targeted: 5,
        },
    );
    let (_, log) = runner.run_to_end();
    st.restored.extend(restores_in(&read_log(&log)));
    assert_exactly(
        "kafka → file",
        &expected,
        &sinks,
        &format!(
            "output after {} SIGKILLs at {:?} differs from the failure-free output\n{}",
            st.kills,
            st.moments,
            log_excerpt(&log)
        ),
    );
    assert!(
        st.mid_stream > 0,
        "no kill hit a run mid-stream: {}",
        st.report("crash runs")
    );
    println!(
        "kafka_to_file_is_exactly_once_under_repeated_sigkill in {:.1}s: failure-free {:.2}s; {}",
        started.elapsed().as_secs_f64(),
        wall.as_secs_f64(),
        st.report("crash runs")
    );
}

#[test]
fn file_to_kafka_at_least_once_loses_nothing_under_sigkill() {
    let kafka = Broker::shared();
    let topic = unique_topic("alo");
    kafka.create_topic(&topic, 2);
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let n = 200_000;
    let input: String = (0..n)
        .map(|i| format!("{{\"seq\":{i},\"user\":\"u{}\"}}\n", i % 17))
        .collect();
    let job = json!({
        "version": 1,
        "pipelines": [{
            "id": "publish",
            "parallelism": 2,
            "sources": [{"id": "in", "type": "file", "path": "in.jsonl"}],
            "operators": [{"id": "tag", "type": "map", "input": "in",
                           "script": "fn map(r) { r.tagged = true; r }"}],
            "sinks": [{"id": "out", "type": "kafka", "input": "tag", "brokers": brokers(),
                       "topic": topic, "key_field": "user",
                       "headers": {"seq": "seq"}}],
        }],
    });
    let dir = tmp.join("run");
    let yaml = write_job(&dir, &job);
    std::fs::write(dir.join("in.jsonl"), &input).unwrap();
    let file = with_recovery(
        &yaml,
        &Recovery {
            backend: common::kill::Backend::Fs,
            mode: "at_least_once",
            interval: "100ms",
            root: &dir,
        },
    );
    let mut runner = Runner::new(&file, &tmp.join("logs"), "alo");
    let mut rng = Rng::new(17);
    let st = kill_loop(
        &mut runner,
        &mut rng,
        &KillPlan {
            random: 8,
            window: (Duration::from_millis(50), Duration::from_millis(1500)),
            targeted: 3,
        },
    );
    let (_, log) = runner.run_to_end();
    let got = kafka.consume_all(&topic);
    let mut seen = vec![0u32; n];
    for (_, _, key, value) in &got {
        let v: Value = serde_json::from_str(value).unwrap();
        let seq = usize::try_from(v["seq"].as_u64().unwrap()).unwrap();
        assert_eq!(v["tagged"], json!(true), "{value}");
        assert_eq!(key, &format!("u{}", seq % 17), "the key comes from `user`");
        seen[seq] += 1;
    }
    let missing: Vec<usize> = (0..n).filter(|i| seen[*i] == 0).collect();
    assert!(
        missing.is_empty(),
        "{} of {n} records never reached the topic (first: {:?}) after {} SIGKILLs\n{}",
        missing.len(),
        &missing[..missing.len().min(10)],
        st.kills,
        log_excerpt(&log)
    );
    println!(
        "file_to_kafka_at_least_once: {} messages for {n} records ({} repeated); {}",
        got.len(),
        got.len() - n,
        st.report("runs")
    );
}

#[test]
fn a_kafka_source_rescaled_2_to_3_to_1_reads_every_message_exactly_once() {
    let kafka = Broker::shared();
    let topic = unique_topic("rescale");
    kafka.create_topic(&topic, 5);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let with_checkpoints = |mut job: Value| {
        job["pipelines"][0]["state"] = json!({"backend": "fs"});
        job["pipelines"][0]["checkpoints"] = json!({
            "interval": "200ms", "mode": "exactly_once",
            "storage": d.join("checkpoints").to_str().unwrap(),
        });
        job
    };
    let mut all = Vec::new();
    let mut savepoint: Option<std::path::PathBuf> = None;
    // Each step reads what was produced before it (and nothing twice), then stops with a
    // savepoint that the next step, at another parallelism, restores.
    for (step, parallelism) in [2u32, 3, 1].into_iter().enumerate() {
        let batch = orders(all.len(), 4_000);
        kafka.produce(&topic, 5, &batch);
        all.extend(batch);
        let yaml = write_job(d, &with_checkpoints(totals_job(&topic, parallelism, false)));
        let extra: Vec<&str> = match &savepoint {
            Some(sp) => vec!["--from-savepoint", sp.to_str().unwrap()],
            None => Vec::new(),
        };
        let mut run = Run::start(beside(&yaml), &yaml, &extra);
        // A run's counters start at zero: this one has the new batch to write.
        let fresh = 4_000;
        run.wait_for(&format!("step {step}: {fresh} new records"), |s| {
            pipeline_of(s, "totals")["sink_records"]
                .as_u64()
                .unwrap_or(0)
                >= fresh
        });
        if step == 0 {
            // `weir status` shows each subtask's partitions with offsets and lag.
            let status = run.pipeline("totals");
            let source = status["operators"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["id"] == "orders")
                .unwrap()
                .clone();
            let mut names: Vec<String> = source["subtasks"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|s| s["partitions"].as_array().cloned().unwrap_or_default())
                .map(|p| {
                    assert!(p["offset"].is_i64(), "{p}");
                    p["partition"].as_str().unwrap().to_owned()
                })
                .collect();
            names.sort();
            let want: Vec<String> = (0..5).map(|i| format!("{topic}/{i}")).collect();
            assert_eq!(names, want, "{source}");
        }
        savepoint = Some(run.stop_with_savepoint("totals"));
        let log = run.finish_ok();
        if step > 0 {
            assert!(
                log.contains("Took over the partitions of rescaled snapshots"),
                "{log}"
            );
        }
    }
    let got = committed(&d.join("out"));
    let want = totals_reference(&all);
    let diff = OutputDiff::of(&got, &want);
    assert!(diff.is_empty(), "after 2 → 3 → 1: {}", diff.describe());
}

#[test]
fn messages_that_do_not_parse_become_dead_letters_with_partition_and_offset() {
    let kafka = Broker::shared();
    let topic = unique_topic("dlq");
    kafka.create_topic(&topic, 1);
    let mut messages = orders(0, 10);
    messages.insert(3, ("bad".into(), "{not json".into()));
    messages.insert(7, ("bad".into(), "[1, 2]".into()));
    kafka.produce(&topic, 1, &messages);
    let dir = tempfile::tempdir().unwrap();
    let job = json!({
        "version": 1,
        "pipelines": [{
            "id": "dlq",
            "sources": [{"id": "orders", "type": "kafka", "brokers": brokers(),
                         "topics": [topic], "stop_at": "latest",
                         "metadata_field": "kafka",
                         "on_error": {"dead_letter": "bad"}}],
            "sinks": [
                {"id": "good", "type": "file", "input": "orders", "path": "good"},
                {"id": "bad", "type": "file", "path": "bad"},
            ],
        }],
    });
    let yaml = write_job(dir.path(), &job);
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    let good = committed(&dir.path().join("good"));
    assert_eq!(good.len(), 10, "{good:?}");
    for line in &good {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["kafka"]["topic"], json!(topic), "{line}");
        assert_eq!(v["kafka"]["partition"], json!(0), "{line}");
        assert_eq!(v["kafka"]["key"], v["user"], "{line}");
        assert!(
            v["kafka"]["offset"].is_i64() && v["kafka"]["timestamp"].is_i64(),
            "{line}"
        );
    }
    let bad: Vec<Value> = committed(&dir.path().join("bad"))
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut at: Vec<(i64, String)> = bad
        .iter()
        .map(|v| {
            assert_eq!(v["topic"], json!(topic), "{v}");
            assert_eq!(v["partition"], json!(0), "{v}");
            assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
            (
                v["offset"].as_i64().unwrap(),
                v["raw"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    at.sort();
    assert_eq!(
        at,
        vec![(3, "{not json".to_owned()), (7, "[1, 2]".to_owned())],
        "{bad:?}"
    );
}

/// The metadata a source gives every record (read through its batch queue): the key and the
/// headers Weir's own sink wrote, the topic, partition, offset and a timestamp.
#[test]
fn the_source_gives_each_record_the_key_headers_and_position_of_its_message() {
    let kafka = Broker::shared();
    let topic = unique_topic("meta");
    kafka.create_topic(&topic, 2);
    let dir = tempfile::tempdir().unwrap();
    let n = 500;
    let input: String = (0..n)
        .map(|i| format!("{{\"seq\":{i},\"user\":\"u{}\"}}\n", i % 7))
        .collect();
    let publish = json!({
        "version": 1,
        "pipelines": [{
            "id": "publish",
            "sources": [{"id": "in", "type": "file", "path": "in.jsonl"}],
            "sinks": [{"id": "out", "type": "kafka", "input": "in", "brokers": brokers(),
                       "topic": topic, "key_field": "user",
                       "headers": {"seq": "seq", "who": "user"}}],
        }],
    });
    let pdir = dir.path().join("publish");
    let yaml = write_job(&pdir, &publish);
    std::fs::write(pdir.join("in.jsonl"), &input).unwrap();
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    // One message alone at the end of each partition, so that the broker's "latest offset"
    // (which `stop_at: latest` reads) is the true end (see `Broker::produce`).
    let mut seals: BTreeMap<i32, (String, String)> = BTreeMap::new();
    for i in 0.. {
        let key = format!("seal-{i}");
        seals
            .entry(common::kafka::partition_of(&key, 2))
            .or_insert((key, r#"{"seal":true}"#.to_owned()));
        if seals.len() == 2 {
            break;
        }
    }
    kafka.produce(&topic, 2, &seals.into_values().collect::<Vec<_>>());
    let read = json!({
        "version": 1,
        "pipelines": [{
            "id": "read",
            "parallelism": 2,
            "sources": [{"id": "in", "type": "kafka", "brokers": brokers(),
                         "topics": [topic], "stop_at": "latest", "metadata_field": "kafka"}],
            "sinks": [{"id": "out", "type": "file", "input": "in", "path": "out"}],
        }],
    });
    let rdir = dir.path().join("read");
    let yaml = write_job(&rdir, &read);
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    let lines = committed(&rdir.join("out"));
    assert_eq!(lines.len(), n + 2, "every message read once");
    let mut positions = BTreeMap::new();
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap();
        let m = &v["kafka"];
        let at = (
            m["partition"].as_i64().unwrap(),
            m["offset"].as_i64().unwrap(),
        );
        if let Some(before) = positions.insert(at, line) {
            panic!("two records at {at:?}: {before} and {line}");
        }
        if v["seal"] == json!(true) {
            continue;
        }
        assert_eq!(m["topic"], json!(topic), "{line}");
        assert_eq!(m["key"], v["user"], "{line}");
        assert_eq!(m["headers"]["seq"], json!(v["seq"].to_string()), "{line}");
        assert_eq!(m["headers"]["who"], v["user"], "{line}");
        assert!(m["timestamp"].is_i64(), "{line}");
    }
}

// ---------------------------------------------------------------------------------------------
// Start positions, discovery, the broker going away.

/// A Kafka → file job (no operator) reading `source` (a `kafka` source spec without id and
/// type), checkpointing every 200 ms into `dir`, restarting for ever after 200 ms.
fn copy_job(dir: &Path, source: Value) -> std::path::PathBuf {
    let mut source = source;
    source["id"] = json!("in");
    source["type"] = json!("kafka");
    write_job(
        dir,
        &json!({
            "version": 1,
            "pipelines": [{
                "id": "copy",
                "parallelism": 2,
                "state": {"backend": "fs"},
                "checkpoints": {"interval": "200ms", "mode": "exactly_once",
                                "storage": dir.join("checkpoints").to_str().unwrap()},
                "restart": {"strategy": "fixed_delay", "attempts": 100000, "delay": "200ms"},
                "sources": [source],
                "sinks": [{"id": "out", "type": "file", "input": "in", "path": "out"}],
            }],
        }),
    )
}

/// The sorted `seq` of every committed output line of `dir` (a record read twice shows twice).
fn seqs_in(dir: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = committed(dir)
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

/// The sorted `seq` of `orders`.
fn seqs_of<'a>(orders: impl IntoIterator<Item = &'a (String, String)>) -> Vec<u64> {
    let mut seqs: Vec<u64> = orders
        .into_iter()
        .map(|(_, v)| {
            serde_json::from_str::<Value>(v).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

/// Each partition's end (last offset + 1) as the topic holds it, read back independently of
/// Weir.
fn ends_of(kafka: &Broker, topic: &str) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for (p, offset, _, _) in kafka.consume_all(topic) {
        let end = ends.entry(p).or_insert(0);
        *end = (*end).max(offset + 1);
    }
    ends
}

/// `partition → (offset, lag)` of source `source` in a `weir status --json` answer.
fn partitions_in(status: &Value, pipeline: &str, source: &str) -> BTreeMap<String, (i64, Value)> {
    pipeline_of(status, pipeline)["operators"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["id"] == source)
        .flat_map(|o| o["subtasks"].as_array().cloned().unwrap_or_default())
        .flat_map(|s| s["partitions"].as_array().cloned().unwrap_or_default())
        .map(|p| {
            (
                p["partition"].as_str().unwrap().to_owned(),
                (p["offset"].as_i64().unwrap(), p["lag"].clone()),
            )
        })
        .collect()
}

#[test]
fn start_earliest_reads_every_message_and_start_latest_only_those_produced_after_the_start() {
    let kafka = Broker::shared();
    // Earliest (bounded): every message already in the topic.
    let topic = unique_topic("earliest");
    kafka.create_topic(&topic, 2);
    let before = orders(0, 700);
    kafka.produce(&topic, 2, &before);
    let dir = tempfile::tempdir().unwrap();
    let yaml = copy_job(
        dir.path(),
        json!({"brokers": kafka.brokers, "topics": [topic], "start": "earliest",
               "stop_at": "latest"}),
    );
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    assert_eq!(seqs_in(&dir.path().join("out")), seqs_of(&before));

    // Latest (unbounded): the run starts at each partition's end (which `weir status` shows,
    // in JSON and as text) and reads exactly what is produced after.
    let topic = unique_topic("latest");
    kafka.create_topic(&topic, 2);
    kafka.produce(&topic, 2, &before);
    let ends_before = ends_of(&kafka, &topic);
    let dir = tempfile::tempdir().unwrap();
    let yaml = copy_job(
        dir.path(),
        json!({"brokers": kafka.brokers, "topics": [topic], "start": "latest"}),
    );
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    let at = |ends: &BTreeMap<i32, i64>| -> BTreeMap<String, i64> {
        ends.iter()
            .map(|(p, e)| (format!("{topic}/{p}"), *e))
            .collect()
    };
    let status = run.wait_for("both partitions resolved", |s| {
        partitions_in(s, "copy", "in").len() == 2
    });
    let started_at: BTreeMap<String, i64> = partitions_in(&status, "copy", "in")
        .into_iter()
        .map(|(p, (o, _))| (p, o))
        .collect();
    assert_eq!(
        started_at,
        at(&ends_before),
        "`start: latest` is each partition's end"
    );
    let after = orders(700, 500);
    kafka.produce(&topic, 2, &after);
    let ends_after = ends_of(&kafka, &topic);
    let want: BTreeMap<String, (i64, Value)> = at(&ends_after)
        .into_iter()
        .map(|(p, e)| (p, (e, json!(0))))
        .collect();
    // Read to the end, and librdkafka's statistics have caught up with it (lag 0).
    run.wait_for("every partition read to its end", |s| {
        partitions_in(s, "copy", "in") == want
    });
    let out = run.cli(&["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let table: Vec<String> = text
        .lines()
        .skip_while(|l| *l != "partitions of copy/in:")
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    // The rows: each partition with the subtask the JSON answer has it under, its end and lag
    // 0, in partition order.
    let json_status = run.status().unwrap();
    let mut rows: Vec<(i32, String)> = pipeline_of(&json_status, "copy")["operators"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["id"] == "in")
        .flat_map(|o| o["subtasks"].as_array().cloned().unwrap_or_default())
        .flat_map(|s| {
            let subtask = s["subtask"].as_u64().unwrap();
            s["partitions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |p| (subtask, p))
        })
        .map(|(subtask, p)| {
            let name = p["partition"].as_str().unwrap();
            let n: i32 = name.rsplit_once('/').unwrap().1.parse().unwrap();
            (n, format!("{name} {subtask} {} 0", ends_after[&n]))
        })
        .collect();
    rows.sort();
    let rows: Vec<String> = rows.into_iter().map(|(_, r)| r).collect();
    assert_eq!(rows.len(), 2, "{json_status}");
    assert_eq!(table, rows, "`weir status`:\n{text}");
    run.terminate();
    assert_eq!(seqs_in(&dir.path().join("out")), seqs_of(&after));
}

#[test]
fn start_committed_reads_from_the_groups_offsets_and_earliest_where_it_has_none() {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{Offset, TopicPartitionList};

    let kafka = Broker::shared();
    let topic = unique_topic("committed");
    kafka.create_topic(&topic, 3);
    let first = orders(0, 900);
    kafka.produce(&topic, 3, &first);
    let ends = ends_of(&kafka, &topic);
    // The group has offsets for partitions 0 and 1 (their ends: every batch after them starts
    // there) and none for partition 2.
    let group = format!("{topic}-group");
    let committer: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in [0, 1] {
        tpl.add_partition_offset(&topic, p, Offset::Offset(ends[&p]))
            .unwrap();
    }
    committer.commit(&tpl, CommitMode::Sync).unwrap();
    let then = orders(900, 600);
    kafka.produce(&topic, 3, &then);

    let dir = tempfile::tempdir().unwrap();
    let yaml = copy_job(
        dir.path(),
        json!({"brokers": kafka.brokers, "topics": [topic], "start": "committed",
               "group": group, "stop_at": "latest"}),
    );
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    let want = seqs_of(
        first
            .iter()
            .filter(|(key, _)| common::kafka::partition_of(key, 3) == 2)
            .chain(&then),
    );
    assert_eq!(seqs_in(&dir.path().join("out")), want);
}

#[test]
fn start_at_a_timestamp_reads_the_messages_from_that_time_on() {
    let kafka = Broker::shared();
    let topic = unique_topic("timestamp");
    kafka.create_topic(&topic, 2);
    let first = orders(0, 800);
    kafka.produce(&topic, 2, &first);
    // A moment strictly between the two batches: every message before it was stored (and
    // stamped) before, every message after it after.
    let now_ms = || {
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
    };
    let before = now_ms();
    let mut at = now_ms();
    while at <= before + 20 {
        std::thread::sleep(Duration::from_millis(5));
        at = now_ms();
    }
    while now_ms() <= at + 20 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let then = orders(800, 500);
    kafka.produce(&topic, 2, &then);
    let dir = tempfile::tempdir().unwrap();
    let yaml = copy_job(
        dir.path(),
        json!({"brokers": kafka.brokers, "topics": [topic], "start": {"timestamp": at},
               "stop_at": "latest"}),
    );
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    assert_eq!(seqs_in(&dir.path().join("out")), seqs_of(&then));
}

#[test]
fn topics_that_appear_mid_run_and_match_the_pattern_are_discovered_and_read_from_their_start() {
    let kafka = Broker::shared();
    let base = unique_topic("discover");
    let (old, new, other) = (
        format!("{base}-old"),
        format!("{base}-new"),
        format!("{base}x-other"),
    );
    kafka.create_topic(&old, 2);
    let first = orders(0, 600);
    kafka.produce(&old, 2, &first);
    let dir = tempfile::tempdir().unwrap();
    let yaml = copy_job(
        dir.path(),
        json!({"brokers": kafka.brokers, "topic_pattern": format!("{}-.*", regex_escape(&base)),
               "discovery_interval": "200ms"}),
    );
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_for("the first topic read", |s| {
        pipeline_of(s, "copy")["sink_records"].as_u64().unwrap_or(0) >= 600
    });
    // A matching topic appears with messages already in it (read from its start, as Flink
    // does), more come to both, and a topic that does not match is left alone.
    kafka.create_topic(&new, 3);
    let second = orders(600, 900);
    kafka.produce(&new, 3, &second);
    kafka.create_topic(&other, 1);
    kafka.produce(&other, 1, &orders(10_000, 50));
    let third = orders(1500, 300);
    kafka.produce(&old, 2, &third);
    let want: BTreeMap<String, (i64, Value)> = [(&old, 2), (&new, 3)]
        .into_iter()
        .flat_map(|(t, _)| {
            ends_of(&kafka, t)
                .into_iter()
                .map(move |(p, e)| (format!("{t}/{p}"), (e, json!(0))))
        })
        .collect();
    assert_eq!(want.len(), 5, "{want:?}");
    run.wait_for("every partition of both topics read to its end", |s| {
        partitions_in(s, "copy", "in") == want
    });
    run.terminate();
    assert_eq!(
        seqs_in(&dir.path().join("out")),
        seqs_of(first.iter().chain(&second).chain(&third))
    );
}

/// `text` with the regular-expression metacharacters escaped (topic names here only have
/// `-`, letters and digits, which need none; kept honest anyway).
fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

#[test]
fn the_broker_going_down_mid_run_loses_and_repeats_nothing() {
    // A broker of this test's own, keeping its topics on the S3 service across a restart.
    let (server, kafka) = common::kafka::PrivateBroker::start_new("down");
    let topic = unique_topic("down");
    kafka.create_topic(&topic, 2);
    let mut all = orders(0, 3000);
    kafka.produce(&topic, 2, &all);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut job = totals_job(&topic, 2, false);
    job["pipelines"][0]["sources"][0]["brokers"] = json!(kafka.brokers);
    job["pipelines"][0]["state"] = json!({"backend": "fs"});
    job["pipelines"][0]["checkpoints"] = json!({
        "interval": "200ms", "mode": "exactly_once",
        "storage": d.join("checkpoints").to_str().unwrap(),
    });
    job["pipelines"][0]["restart"] =
        json!({"strategy": "fixed_delay", "attempts": 100000, "delay": "300ms"});
    let yaml = write_job(d, &job);
    let read_to_end = |run: &mut Run, what: &str| {
        let want: BTreeMap<String, (i64, Value)> = ends_of(&kafka, &topic)
            .into_iter()
            .map(|(p, e)| (format!("{topic}/{p}"), (e, json!(0))))
            .collect();
        run.wait_for(what, |s| partitions_in(s, "totals", "orders") == want);
    };

    // 1. The broker goes away while a run reads, and comes back: librdkafka reconnects.
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    read_to_end(&mut run, "the first messages read");
    server.stop();
    let noticed = wait_log(&run, "the run noticing the broker is gone", |l| {
        l.lines().any(mentions_broker_failure)
    });
    assert!(
        run.try_wait().is_none(),
        "the run ended with the broker down:\n{}",
        run.log()
    );
    let kafka = server.start();
    let more = orders(3000, 2000);
    kafka.produce(&topic, 2, &more);
    all.extend(more);
    read_to_end(&mut run, "the messages produced after the broker came back");
    run.terminate();

    // 2. A run (restored from the last checkpoint) starts while the broker is down: its start
    // fails, the restart strategy retries until the broker is back.
    server.stop();
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    let failed = wait_log(&run, "a failed start", |l| {
        l.contains("cannot read the topics of brokers")
    });
    let kafka = server.start();
    let last = orders(5000, 1000);
    kafka.produce(&topic, 2, &last);
    all.extend(last);
    read_to_end(&mut run, "every message after the restarts");
    let log = run.terminate();
    assert!(
        log.contains("Resuming from the latest completed checkpoint"),
        "the second run did not restore:\n{log}"
    );

    let got = committed(&d.join("out"));
    let diff = OutputDiff::of(&got, &totals_reference(&all));
    assert!(
        diff.is_empty(),
        "after the broker went down twice: {}",
        diff.describe()
    );
    let first = |log: &str, pick: &dyn Fn(&str) -> bool| {
        log.lines().find(|l| pick(l)).unwrap_or_default().to_owned()
    };
    println!(
        "the broker went down twice; the reading run saw: {}\nthe run started while it was \
         down: {}",
        first(&noticed, &mentions_broker_failure),
        first(&failed, &|l| l
            .contains("cannot read the topics of brokers"))
    );
}

/// Whether a line of a run's log shows that it lost the broker (librdkafka's errors, logged
/// through `tracing`, or a failed poll).
fn mentions_broker_failure(l: &str) -> bool {
    (l.contains("librdkafka") || l.contains("Kafka reported an error"))
        && (l.contains("refused") || l.contains("Disconnected") || l.contains("down"))
}

/// Waits until the log of `run` satisfies `ready` (at most two minutes); returns that log.
fn wait_log(run: &Run, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let log = run.log();
        if ready(&log) {
            return log;
        }
        assert!(Instant::now() < until, "waited too long for {what}:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
