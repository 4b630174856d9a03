//! The `kafka` source and sink against a real Kafka-API broker (tansu, started by
//! `scripts/services/kafka.sh`; nothing is mocked): Kafka → file exactly-once under repeated
//! SIGKILLs equals the failure-free run; file → Kafka at-least-once loses nothing under
//! SIGKILLs; a source rescaled 2 → 3 → 1 through savepoints reads every message exactly once;
//! messages that do not parse become dead letters with their topic, partition and offset.
//!
//! Every test works on topics of its own (named after the test, the process and the time), so
//! test binaries running at once share one broker safely.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use common::kill::{
    KillPlan, Recovery, Rng, Runner, Scratch, assert_exactly, file_sinks, kill_loop, log_excerpt,
    read_log, restores_in, with_recovery,
};
use common::output::{OutputDiff, committed, committed_marking_torn, describe_counted};
use common::run::{Run, beside, pipeline_of, run_to_end};

/// The broker's address, starting it (and installing it, the first time) when needed.
fn brokers() -> String {
    common::services::ensure("kafka")["WEIR_TEST_KAFKA_BROKERS"].clone()
}

/// A topic name no other test (or run of this one) uses.
fn unique_topic(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("weir-{what}-{}-{nanos}", std::process::id())
}

/// Creates `topic` with `partitions` partitions through the broker's own CLI.
fn create_topic(topic: &str, partitions: u32) {
    let settings = common::services::ensure("kafka");
    let out = Command::new(&settings["WEIR_TEST_KAFKA_TANSU"])
        .args(["topic", "create", topic, "--partitions"])
        .arg(partitions.to_string())
        .arg("--broker")
        .arg(format!("tcp://{}", settings["WEIR_TEST_KAFKA_BROKERS"]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cannot create topic {topic}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The partition of a key: every message of a key goes to one partition, chosen here rather
/// than by the producer so that [`produce`] can seal each partition.
fn partition_of(key: &str, partitions: i32) -> i32 {
    let sum: u32 = key.bytes().map(u32::from).sum();
    (sum % partitions.unsigned_abs()) as i32
}

/// Produces `(key, value)` messages to `topic` (with `partitions` partitions) and waits until
/// the broker has them all. Each partition's last message goes alone in a batch of its own,
/// after the others are acknowledged: tansu 0.6 answers a "latest offset" request with the
/// first offset of the partition's last batch plus one (not its last offset plus one), so a
/// single-message last batch makes that answer, which `stop_at: latest` reads, the true end.
fn produce(topic: &str, partitions: i32, messages: &[(String, String)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let send = |p: i32, key: &str, value: &str| {
        let mut record = BaseRecord::to(topic).partition(p).key(key).payload(value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    };
    let mut last: BTreeMap<i32, usize> = BTreeMap::new();
    for (i, (key, _)) in messages.iter().enumerate() {
        last.insert(partition_of(key, partitions), i);
    }
    for (i, (key, value)) in messages.iter().enumerate() {
        let p = partition_of(key, partitions);
        if last[&p] != i {
            send(p, key, value);
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    for (p, i) in last {
        send(p, &messages[i].0, &messages[i].1);
        producer.flush(Duration::from_secs(60)).unwrap();
    }
}

/// Every message of `topic`, as `(partition, offset, key, value)`, read from the start until
/// every partition reported its end (from the fetch responses' high watermark, which tansu
/// gets right, unlike its answer to a "latest offset" request).
fn consume_all(topic: &str) -> Vec<(i32, i64, String, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let meta = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    let mut open = std::collections::BTreeSet::new();
    for p in meta.topics()[0].partitions() {
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
            .unwrap();
        open.insert(p.id());
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !open.is_empty() {
        assert!(Instant::now() < deadline, "reading {topic} back timed out");
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            Some(Ok(m)) => out.push((
                m.partition(),
                m.offset(),
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            )),
        }
    }
    out
}

/// `n` orders `{user, amount, seq}` keyed by user (a user's orders share a partition).
fn orders(from: usize, n: usize) -> Vec<(String, String)> {
    (from..from + n)
        .map(|i| {
            let user = format!("u{}", (i * 7919) % 53);
            let value = json!({"user": user, "amount": (i * 31) % 100, "seq": i});
            (user, value.to_string())
        })
        .collect()
}

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
    let started = Instant::now();
    let topic = unique_topic("eo");
    create_topic(&topic, 3);
    let input = orders(0, 150_000);
    produce(&topic, 3, &input);
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
    let topic = unique_topic("alo");
    create_topic(&topic, 2);
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
    let got = consume_all(&topic);
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
    let topic = unique_topic("rescale");
    create_topic(&topic, 5);
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
        produce(&topic, 5, &batch);
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
    let topic = unique_topic("dlq");
    create_topic(&topic, 1);
    let mut messages = orders(0, 10);
    messages.insert(3, ("bad".into(), "{not json".into()));
    messages.insert(7, ("bad".into(), "[1, 2]".into()));
    produce(&topic, 1, &messages);
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
