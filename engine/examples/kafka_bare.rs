//! The limit for the Kafka benchmark (`bench/kafka/run.sh`), and its loader.
//!
//! `kafka_bare read BROKERS TOPIC`: a bare rdkafka consumer, with the fetch settings Weir's
//! `kafka` source uses, reads every partition of a topic from its start to the end it had when
//! the reader started, and prints messages, bytes and messages/s. It parses nothing and keeps
//! nothing: whatever Weir adds (records, operators, checkpoints) is measured against it.
//!
//! `kafka_bare produce BROKERS TOPIC PARTITIONS FILE`: loads a JSON-lines file into the topic,
//! one message per line keyed by its `user` field, the partition chosen from the key. Each
//! partition's last message is sent alone, after every other message is acknowledged: tansu
//! 0.6 answers a "latest offset" request (what `stop_at: latest` and the reader above take as
//! the end) with the first offset of the partition's last batch plus one, so a last batch of
//! one message makes that answer the true end. Prints the messages per partition.
//!
//!     cargo run --release -p weir-engine --example kafka_bare -- read BROKERS TOPIC

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [cmd, brokers, topic] if cmd == "read" => read(brokers, topic),
        [cmd, brokers, topic, partitions, file] if cmd == "produce" => partitions
            .parse()
            .map_err(|e| format!("PARTITIONS `{partitions}`: {e}").into())
            .and_then(|p| produce(brokers, topic, p, file)),
        _ => {
            eprintln!(
                "usage: kafka_bare read BROKERS TOPIC\n       kafka_bare produce BROKERS TOPIC PARTITIONS FILE"
            );
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kafka_bare: {e}");
            ExitCode::FAILURE
        }
    }
}

fn read(brokers: &str, topic: &str) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "weir-bench-bare")
        .set("enable.auto.commit", "false")
        .set("max.partition.fetch.bytes", "10485760")
        .set("fetch.wait.max.ms", "10")
        .set("queued.min.messages", "1000000")
        .create()?;
    let timeout = Duration::from_secs(10);
    let meta = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for t in meta.topics() {
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), timeout)?;
            if high > low {
                ends.insert(p.id(), high);
                tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
            }
        }
    }
    consumer.assign(&tpl)?;
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut open = ends.len();
    while open > 0 {
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m?;
        // Messages past a partition's end (appended since the start) are not counted.
        let Some(&end) = ends.get(&m.partition()) else {
            continue;
        };
        if m.offset() >= end {
            continue;
        }
        messages += 1;
        bytes += m.payload().map_or(0, <[u8]>::len) as u64;
        if m.offset() + 1 == end {
            open -= 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "bare consumer: {messages} messages, {bytes} bytes in {secs:.3} s: {:.0} messages/s",
        messages as f64 / secs
    );
    Ok(())
}

/// The partition of `key`: the sum of its bytes modulo `partitions` (any stable choice does;
/// keeping a key in one partition keeps its records in order).
fn partition_of(key: &[u8], partitions: i32) -> i32 {
    let sum: u64 = key.iter().map(|&b| u64::from(b)).sum();
    (sum % u64::from(partitions.unsigned_abs())) as i32
}

fn produce(
    brokers: &str,
    topic: &str,
    partitions: i32,
    file: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    if partitions < 1 {
        return Err("PARTITIONS must be at least 1".into());
    }
    let started = Instant::now();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let send = |p: i32, key: &[u8], value: &[u8]| {
        let mut record = BaseRecord::to(topic).partition(p).key(key).payload(value);
        loop {
            match producer.send(record) {
                Ok(()) => return,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    };
    // Every partition's latest line is held back until the next one of the partition comes,
    // so that its last line is known at the end without reading the file twice.
    let mut held: Vec<Option<(Vec<u8>, Vec<u8>)>> = vec![None; partitions as usize];
    let mut counts = vec![0u64; partitions as usize];
    let input = std::io::BufReader::new(std::fs::File::open(file)?);
    for line in input.split(b'\n') {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_slice(&line)?;
        let key = match &value["user"] {
            serde_json::Value::String(s) => s.as_bytes().to_vec(),
            other => other.to_string().into_bytes(),
        };
        let p = partition_of(&key, partitions);
        counts[p as usize] += 1;
        if let Some((k, v)) = held[p as usize].replace((key, line)) {
            send(p, &k, &v);
        }
    }
    producer.flush(Duration::from_secs(300))?;
    for (p, last) in held.iter().enumerate() {
        if let Some((k, v)) = last {
            send(p as i32, k, v);
            producer.flush(Duration::from_secs(60))?;
        }
    }
    let total: u64 = counts.iter().sum();
    println!(
        "produced {total} messages to {topic} in {:.3} s; per partition: {counts:?}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
