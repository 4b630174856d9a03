//! A Kafka-API broker for the connector tests (tansu, from `scripts/services/kafka.sh`): the
//! shared one, or a private one a test stops and starts again (its topics kept on the S3
//! service); topics of their own, messages produced with each partition sealed, every message
//! of a topic read back, and the test orders `{user, amount, seq}` keyed by user.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

/// A broker: its address and its binary (which also creates topics).
#[derive(Clone, Debug)]
pub struct Broker {
    /// `host:port`.
    pub brokers: String,
    tansu: PathBuf,
}

/// The shared broker's address, starting it (and installing it, the first time) when needed.
pub fn brokers() -> String {
    Broker::shared().brokers
}

impl Broker {
    /// The shared broker (in-memory storage).
    pub fn shared() -> Self {
        Self::from_settings(&crate::common::services::ensure("kafka"))
    }

    fn from_settings(s: &BTreeMap<String, String>) -> Self {
        Self {
            brokers: s["WEIR_TEST_KAFKA_BROKERS"].clone(),
            tansu: PathBuf::from(&s["WEIR_TEST_KAFKA_TANSU"]),
        }
    }

    /// Creates `topic` with `partitions` partitions through the broker's own CLI.
    pub fn create_topic(&self, topic: &str, partitions: u32) {
        let out = Command::new(&self.tansu)
            .args(["topic", "create", topic, "--partitions"])
            .arg(partitions.to_string())
            .arg("--broker")
            .arg(format!("tcp://{}", self.brokers))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cannot create topic {topic}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Produces `(key, value)` messages to `topic` (with `partitions` partitions) and waits
    /// until the broker has them all. Each partition's last message goes alone in a batch of
    /// its own, after the others are acknowledged: tansu 0.6 answers a "latest offset" request
    /// with the first offset of the partition's last batch plus one (not its last offset plus
    /// one), so a single-message last batch makes that answer, which `stop_at: latest` and
    /// `start: latest` read, the true end.
    pub fn produce(&self, topic: &str, partitions: i32, messages: &[(String, String)]) {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
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

    /// Every message of `topic`, as `(partition, offset, key, value)`, read from the start
    /// until every partition reported its end (from the fetch responses' high watermark, which
    /// tansu gets right, unlike its answer to a "latest offset" request).
    pub fn consume_all(&self, topic: &str) -> Vec<(i32, i64, String, String)> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", format!("{topic}-reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .create()
            .unwrap();
        let meta = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        let mut open = BTreeSet::new();
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
}

/// A broker of a test's own (`WEIR_KAFKA_INSTANCE` of `kafka.sh`) on a free port, keeping its
/// topics on the S3 service so that they survive [`PrivateBroker::stop`] and the next
/// [`PrivateBroker::start`]. Dropping it stops it and forgets its files.
pub struct PrivateBroker {
    name: String,
    port: u16,
}

impl PrivateBroker {
    /// Starts a new one; `what` names it (with the process id and port).
    pub fn start_new(what: &str) -> (Self, Broker) {
        // The shared broker first: it installs the binary the private one uses.
        Broker::shared();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let me = Self {
            name: format!("{what}-{}-{port}", std::process::id()),
            port,
        };
        let broker = me.start();
        (me, broker)
    }

    fn command(&self, cmd: &str) -> std::io::Result<std::process::Output> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services/kafka.sh");
        Command::new("bash")
            .arg(&script)
            .arg(cmd)
            .env("WEIR_KAFKA_INSTANCE", &self.name)
            .env("WEIR_KAFKA_PORT", self.port.to_string())
            .env("WEIR_KAFKA_STORAGE", "s3")
            .output()
    }

    fn script(&self, cmd: &str) -> BTreeMap<String, String> {
        let out = self.command(cmd).unwrap();
        assert!(
            out.status.success(),
            "kafka.sh {cmd} ({}): {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Starts it (again); returns its address.
    pub fn start(&self) -> Broker {
        Broker::from_settings(&self.script("ensure"))
    }

    /// Stops it (SIGTERM to the broker process; its topics stay in its bucket).
    pub fn stop(&self) {
        self.script("stop");
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        // Best effort, and never a panic here (this may run while a failed test unwinds).
        let _ = self.command("stop");
        let root = std::env::var_os("WEIR_SERVICES_DIR")
            .map_or_else(|| PathBuf::from("/var/tmp/weir-services"), PathBuf::from);
        let _ = std::fs::remove_dir_all(root.join("kafka/instances").join(&self.name));
    }
}

/// A topic name no other test (or run of this one) uses.
pub fn unique_topic(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("weir-{what}-{}-{nanos}", std::process::id())
}

/// The partition of a key: every message of a key goes to one partition, chosen here rather
/// than by the producer so that [`Broker::produce`] can seal each partition.
pub fn partition_of(key: &str, partitions: i32) -> i32 {
    let sum: u32 = key.bytes().map(u32::from).sum();
    (sum % partitions.unsigned_abs()) as i32
}

/// `n` orders `{user, amount, seq}` from `seq = from`, keyed by user (a user's orders share a
/// partition).
pub fn orders(from: usize, n: usize) -> Vec<(String, String)> {
    (from..from + n)
        .map(|i| {
            let user = format!("u{}", (i * 7919) % 53);
            let value = json!({"user": user, "amount": (i * 31) % 100, "seq": i});
            (user, value.to_string())
        })
        .collect()
}
