//! The limit for the Kafka benchmark (`bench/kafka/run.sh`): a bare rdkafka consumer, with the
//! fetch settings Weir's `kafka` source uses, reads every partition of a topic from its start
//! to the end it had when the reader started, and prints messages, bytes and messages/s. It
//! parses nothing and keeps nothing: whatever Weir adds (records, operators, checkpoints) is
//! measured against it.
//!
//!     cargo run --release -p weir-engine --example kafka_bare -- BROKERS TOPIC

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, topic] = args.as_slice() else {
        eprintln!("usage: kafka_bare BROKERS TOPIC");
        return ExitCode::FAILURE;
    };
    match read(brokers, topic) {
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
        messages += 1;
        bytes += m.payload().map_or(0, <[u8]>::len) as u64;
        if ends.get(&m.partition()) == Some(&(m.offset() + 1)) {
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
