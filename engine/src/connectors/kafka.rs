//! The `kafka` source and sink, on librdkafka (through `rdkafka`'s synchronous clients, so the
//! task loop calls them without blocking on a runtime: a poll never waits, only opening,
//! partition discovery and the sink's flush at a barrier make bounded round trips).
//!
//! Source: Weir assigns partitions to subtasks itself (never consumer-group rebalancing), and a
//! subtask's **partition offsets are its checkpointed state**: the next offset to read of every
//! partition it owns and, with `stop_at: latest`, the offset to stop at (captured once, when
//! the partition was first seen, so a restored run stops where the first one would have). A
//! restore assigns every partition at its recorded offset, so the polls that follow yield
//! exactly the messages that followed the snapshot. A partition enters the state the moment its
//! start offset is resolved (at open, or when discovered), before any of its messages is read:
//! so a partition that no snapshot holds was never read before that checkpoint, and reading it
//! from its start after a restore repeats nothing. Partitions found after the first start (by
//! discovery, or new since the checkpoint) are read from their earliest offset, as Flink does.
//!
//! Ownership (the rule that keeps assignment exactly-once across rescales, as for the file
//! source's follow mode): partition `n` of topic `t` belongs to subtask
//! `(fnv1a(t) + n) mod l_1 mod l_2 ... mod l_k mod p`, where `p` is the parallelism and
//! `l_1 > ... > l_k` the *lineage*, the parallelisms of the earlier runs this one was rescaled
//! from (empty on a fresh start: partitions of a topic are dealt round-robin). A savepoint
//! restored at another parallelism hands old subtask `j`'s snapshot to new subtask
//! `j % p_new`; appending the old parallelism to the lineage makes the rule name exactly that
//! subtask for every partition old subtask `j` owned, whether it had seen it or not. A subtask
//! added by a scale-up receives no snapshot, cannot know the lineage and owns no partition until
//! the next fresh start (the price of having no coordinator).
//!
//! Records: the message value as `json` (one object), `lines` (`{"line": ...}` per line) or
//! `raw` (`{"value": ...}`), plus, with `metadata_field`, `{topic, partition, offset,
//! timestamp, key, headers}`. A value that does not parse goes through `on_error`, a dead
//! letter carrying topic, partition, offset, the raw text and the error.
//!
//! Reading: each subtask has one consumer. Before a partition is assigned, its messages are
//! routed to a queue of the subtask's own, which a poll empties up to a batch at a time
//! (`connectors/kafka_batch.rs`); the consumer's own queue keeps librdkafka's events (statistics,
//! errors), served by one `BaseConsumer::poll` per poll. A value is parsed straight from
//! librdkafka's buffer, with the parser the file source uses. A poll never waits: with nothing
//! queued it returns idle and the task sleeps a few milliseconds.
//!
//! Offsets are committed to the consumer group when a checkpoint completes, for lag tools only;
//! Weir never reads them back except for `start: committed` on a fresh start.
//!
//! Sink: the idempotent producer (`enable.idempotence`), JSON values, the topic fixed or from a
//! field, the key and headers from fields. At every barrier it flushes: the snapshot returns
//! only when the broker acknowledged every message sent before the barrier, so a completed
//! checkpoint means nothing before it can be lost (at-least-once; exactly-once would need
//! broker transactions, which validation explains). A message the producer gave up on fails
//! the task, and the restart strategy replays from the last completed checkpoint.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};
use rhai::{Dynamic, Map};
use serde::{Deserialize, Serialize};
use weir_schema::registry::{
    KafkaFormat, KafkaSinkSpec, KafkaSourceSpec, KafkaStartSpec, KafkaStopSpec,
};
use weir_schema::SourceOnError;

use super::kafka_batch::{Incoming, MessageQueue};
use super::{BadRecords, Poll, Source, SourceContext};
use crate::base::error::{Result, RunError};
use crate::base::metrics::PartitionProgress;
use crate::base::message::{BATCH_SIZE, Batch};
use crate::element::{Operator, OperatorContext};
use crate::record::FieldPath;

/// The longest a metadata or offset lookup may wait for the broker.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle source waits before it polls again.
const IDLE_WAIT: Duration = Duration::from_millis(5);
/// The default of `discovery_interval`.
const DEFAULT_DISCOVERY: Duration = Duration::from_secs(30);
/// The default of the sink's `flush_timeout`.
const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(30);
/// How many messages before its recorded offset a restored partition is fetched from (and
/// dropped up to the offset). Some brokers (tansu 0.6) fetch only from the first offset of a
/// stored batch at or after the one asked for: asked for an offset inside a batch, they skip
/// the rest of that batch. Starting earlier than any batch can be long (librdkafka's producer
/// puts at most 10 000 messages in one) costs a little reading per restore and loses nothing.
/// An offset below the partition's start is reset to its start (`auto.offset.reset`).
const RESTORE_REWIND: i64 = 100_000;
/// At most one log line this often repeats a poll error.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Ownership

/// 64-bit FNV-1a of a topic name: stable across processes and builds.
fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The subtask that owns partition `partition` of `topic` (see the module docs); `None` when
/// this subtask cannot know (`lineage` unknown: it owns nothing).
pub fn owner(topic: &str, partition: i32, lineage: &[u32], parallelism: u32) -> u32 {
    let mut x = fnv1a(topic).wrapping_add(u64::from(partition.unsigned_abs()));
    for l in lineage {
        x %= u64::from((*l).max(1));
    }
    (x % u64::from(parallelism.max(1))) as u32
}

/// The lineage after restoring snapshots of a run at `old` parallelism whose own lineage was
/// `lineage`: `old` appended unless it cannot change any owner.
fn extend_lineage(mut lineage: Vec<u32>, old: u32) -> Vec<u32> {
    if lineage.last().is_none_or(|l| *l > old) {
        lineage.push(old);
    }
    lineage
}

/// A stable split id for a partition (event-time watermarks are kept per split).
fn split_id(topic: &str, partition: i32) -> u64 {
    fnv1a(topic) ^ u64::from(partition.unsigned_abs()).rotate_left(48)
}

// ---------------------------------------------------------------------------------------------
// Snapshot

/// Where one partition is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Position {
    topic: String,
    partition: i32,
    /// The offset of the next message to read.
    next: i64,
    /// With `stop_at`: the first offset not to read.
    stop: Option<i64>,
}

/// A source subtask's checkpointed state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct KafkaState {
    version: u32,
    /// The parallelism of the run that wrote it.
    parallelism: u32,
    /// Its lineage; `None` for a subtask that owned nothing (added by a scale-up).
    lineage: Option<Vec<u32>>,
    /// Whether it had listed the partitions of a fresh start (a snapshot taken before its
    /// first poll had not: a restore then starts as a fresh start would).
    listed: bool,
    positions: Vec<Position>,
}

impl KafkaState {
    const VERSION: u32 = 1;
}

/// A Kafka source snapshot as JSON, for `weir inspect`.
///
/// # Errors
/// A malformed snapshot.
pub fn describe_snapshot(bytes: &[u8]) -> Result<serde_json::Value> {
    let state: KafkaState = crate::record::decode(bytes)
        .map_err(|e| RunError::StateCorrupt(format!("malformed kafka source snapshot: {e}")))?;
    serde_json::to_value(&state)
        .map_err(|e| RunError::State(format!("cannot describe a kafka source snapshot: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Clients

/// librdkafka's callbacks: its log lines and errors go to `tracing`; the consumer keeps the
/// latest statistics (high watermarks, for the lag).
#[derive(Default)]
struct Client {
    /// `(topic, partition)` → high watermark, from the last statistics.
    high: Mutex<HashMap<(String, i32), i64>>,
    /// Message delivery failures of a producer, the first kept.
    failed: Mutex<Option<String>>,
}

impl ClientContext for Client {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::warn!(facility = fac, "librdkafka: {log_message}"),
            _ => tracing::debug!(facility = fac, "librdkafka: {log_message}"),
        }
    }

    fn stats(&self, statistics: Statistics) {
        let mut high = self.high.lock().unwrap_or_else(|e| e.into_inner());
        for (name, topic) in statistics.topics {
            for (id, p) in topic.partitions {
                if id >= 0 && p.hi_offset >= 0 {
                    high.insert((name.clone(), id), p.hi_offset);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(error = %error, "librdkafka: {reason}");
    }
}

impl ConsumerContext for Client {}

impl ProducerContext for Client {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            if failed.is_none() {
                *failed = Some(format!(
                    "the broker did not take a message for topic `{}`: {e}",
                    Message::topic(m)
                ));
            }
        }
    }
}

fn external(pipeline: &str, element: &str, message: String) -> RunError {
    RunError::External {
        pipeline: pipeline.to_owned(),
        element: element.to_owned(),
        system: "Kafka",
        message,
    }
}

// ---------------------------------------------------------------------------------------------
// Source

/// How a topic is chosen.
#[derive(Clone, Debug)]
enum Topics {
    Named(Vec<String>),
    Pattern(regex::Regex),
}

impl Topics {
    fn matches(&self, topic: &str) -> bool {
        match self {
            Self::Named(names) => names.iter().any(|n| n == topic),
            Self::Pattern(re) => re.is_match(topic),
        }
    }
}

/// A `kafka` source's settings, shared by its subtasks.
#[derive(Clone, Debug)]
pub struct KafkaSourceConfig {
    brokers: String,
    topics: Topics,
    format: KafkaFormat,
    start: KafkaStartSpec,
    stop: Option<KafkaStopSpec>,
    group: String,
    discovery: Duration,
    metadata_field: Option<String>,
    properties: BTreeMap<String, String>,
    on_error: SourceOnError,
}

impl KafkaSourceConfig {
    /// The settings of `spec` in pipeline `pipeline`.
    ///
    /// # Errors
    /// A `topic_pattern` that is not a regular expression.
    pub fn from_spec(
        spec: &KafkaSourceSpec,
        pipeline: &str,
    ) -> std::result::Result<Self, String> {
        let topics = match &spec.topic_pattern {
            Some(p) => Topics::Pattern(
                regex::Regex::new(&format!("^(?:{p})$"))
                    .map_err(|e| format!("`topic_pattern` is not a regular expression: {e}"))?,
            ),
            None => Topics::Named(spec.topics.clone()),
        };
        Ok(Self {
            brokers: spec.brokers.clone(),
            topics,
            format: spec.format,
            start: spec.start.clone(),
            stop: spec.stop_at,
            group: spec
                .group
                .clone()
                .unwrap_or_else(|| format!("weir-{pipeline}-{}", spec.id)),
            discovery: spec.discovery_interval.map_or(DEFAULT_DISCOVERY, |d| d.0),
            metadata_field: spec.metadata_field.clone(),
            properties: spec.properties.clone(),
            on_error: spec.on_error.clone(),
        })
    }
}

/// `(topic, partition, next offset)` to commit to the consumer group.
type Committable = (String, i32, i64);

/// What this subtask knows of one owned partition.
#[derive(Clone, Debug)]
struct Owned {
    next: i64,
    stop: Option<i64>,
    /// The offset the group was last told.
    committed: i64,
}

impl Owned {
    fn done(&self) -> bool {
        self.stop.is_some_and(|s| self.next >= s)
    }
}

/// One subtask of a `kafka` source.
pub struct KafkaSource {
    config: Arc<KafkaSourceConfig>,
    subtask: u32,
    parallelism: u32,
    /// `None`: this subtask cannot know the lineage and owns nothing.
    lineage: Option<Vec<u32>>,
    /// topic → partition → position: the partitions this subtask owns and has resolved.
    owned: HashMap<String, BTreeMap<i32, Owned>>,
    /// Whether the partitions of the first start were listed (by this run, or by the run
    /// whose snapshot it restored): partitions found later start at their earliest offset.
    listed: bool,
    /// The consumer, with the queue its partitions' messages are routed to.
    reader: Option<MessageQueue<Client>>,
    next_discovery: Option<Instant>,
    bad: BadRecords,
    ids: (String, String),
    /// Snapshots taken for checkpoints not completed yet: `(checkpoint, offsets)`, in order.
    pending_commits: Vec<(u64, Vec<Committable>)>,
    /// When a poll error was last logged.
    error_logged: Option<Instant>,
}

impl KafkaSource {
    /// Subtask `subtask` of `parallelism` of a source with `config`.
    pub fn new(config: Arc<KafkaSourceConfig>, subtask: u32, parallelism: u32) -> Self {
        let bad = BadRecords::new(&config.on_error);
        Self {
            config,
            subtask,
            parallelism,
            lineage: Some(Vec::new()),
            owned: HashMap::new(),
            listed: false,
            reader: None,
            next_discovery: None,
            bad,
            ids: (String::new(), String::new()),
            pending_commits: Vec::new(),
            error_logged: None,
        }
    }

    fn err(&self, message: String) -> RunError {
        external(&self.ids.0, &self.ids.1, message)
    }

    fn consumer(&self) -> Result<&BaseConsumer<Client>> {
        self.reader
            .as_ref()
            .map(MessageQueue::consumer)
            .ok_or_else(|| RunError::Internal("the kafka source was not opened".into()))
    }

    /// Adds `tpl` to the consumer's assignment, its partitions' messages routed to the batch
    /// queue first (librdkafka keeps that routing when it starts fetching them).
    fn assign(&mut self, tpl: &TopicPartitionList) -> Result<()> {
        let reader = self
            .reader
            .as_mut()
            .ok_or_else(|| RunError::Internal("the kafka source was not opened".into()))?;
        for e in tpl.elements() {
            if !reader.route(e.topic(), e.partition()) {
                tracing::debug!(topic = e.topic(), partition = e.partition(), "No partition queue; its messages arrive through the consumer's poll.");
            }
        }
        reader
            .consumer()
            .incremental_assign(tpl)
            .map_err(|e| self.err(format!("cannot assign partitions: {e}")))
    }

    fn owns(&self, topic: &str, partition: i32) -> bool {
        self.lineage
            .as_deref()
            .is_some_and(|l| owner(topic, partition, l, self.parallelism) == self.subtask)
    }

    /// The partitions of the matching topics, from the broker's metadata.
    fn list_partitions(&self) -> Result<Vec<(String, i32)>> {
        let meta = self
            .consumer()?
            .fetch_metadata(None, LOOKUP_TIMEOUT)
            .map_err(|e| {
                self.err(format!(
                    "cannot read the topics of brokers `{}`: {e}; is the broker running and \
                     reachable?",
                    self.config.brokers
                ))
            })?;
        let mut out = Vec::new();
        let mut found = Vec::new();
        for t in meta.topics() {
            if t.error().is_some() || !self.config.topics.matches(t.name()) {
                continue;
            }
            found.push(t.name().to_owned());
            for p in t.partitions() {
                out.push((t.name().to_owned(), p.id()));
            }
        }
        if let Topics::Named(names) = &self.config.topics
            && let Some(missing) = names.iter().find(|n| !found.contains(n))
        {
            return Err(self.err(format!(
                "topic `{missing}` does not exist on brokers `{}`; create it, or fix `topics`",
                self.config.brokers
            )));
        }
        out.sort();
        Ok(out)
    }

    /// Resolves the start (and stop) offsets of partitions this subtask owns and does not
    /// know yet, adds them to its state and to the consumer's assignment.
    fn take_new_partitions(&mut self, listed: &[(String, i32)], fresh: bool) -> Result<()> {
        let new: Vec<(String, i32)> = listed
            .iter()
            .filter(|(t, p)| {
                self.owns(t, *p) && !self.owned.get(t).is_some_and(|m| m.contains_key(p))
            })
            .cloned()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let start = if fresh {
            self.config.start.clone()
        } else {
            KafkaStartSpec::Earliest
        };
        let consumer = self.consumer()?;
        let mut resolved = Vec::with_capacity(new.len());
        let mut by_time = TopicPartitionList::new();
        let mut committed_query = TopicPartitionList::new();
        for (t, p) in &new {
            let (low, high) = consumer
                .fetch_watermarks(t, *p, LOOKUP_TIMEOUT)
                .map_err(|e| {
                    self.err(format!("cannot read the offsets of `{t}` partition {p}: {e}"))
                })?;
            resolved.push((t.clone(), *p, low, high));
            match &start {
                KafkaStartSpec::Timestamp(ms) => {
                    by_time
                        .add_partition_offset(t, *p, Offset::Offset(*ms))
                        .map_err(|e| self.err(format!("`{t}` partition {p}: {e}")))?;
                }
                KafkaStartSpec::Committed => {
                    committed_query.add_partition(t, *p);
                }
                _ => {}
            }
        }
        let looked_up = match &start {
            KafkaStartSpec::Timestamp(_) => Some(
                consumer
                    .offsets_for_times(by_time, LOOKUP_TIMEOUT)
                    .map_err(|e| self.err(format!("cannot find offsets by timestamp: {e}")))?,
            ),
            KafkaStartSpec::Committed => Some(
                consumer
                    .committed_offsets(committed_query, LOOKUP_TIMEOUT)
                    .map_err(|e| {
                        self.err(format!(
                            "cannot read the offsets group `{}` committed: {e}",
                            self.config.group
                        ))
                    })?,
            ),
            _ => None,
        };
        let mut assign = TopicPartitionList::new();
        for (t, p, low, high) in resolved {
            let looked = looked_up
                .as_ref()
                .and_then(|l| l.find_partition(&t, p))
                .map(|e| e.offset());
            let next = match (&start, looked) {
                (KafkaStartSpec::Latest, _) => high,
                (_, Some(Offset::Offset(o))) => o.clamp(low, high),
                // No message at or after the timestamp: the end.
                (KafkaStartSpec::Timestamp(_), _) => high,
                _ => low,
            };
            let stop = self.config.stop.map(|KafkaStopSpec::Latest| high);
            let owned = Owned {
                next,
                stop,
                committed: next,
            };
            if !owned.done() {
                assign
                    .add_partition_offset(&t, p, Offset::Offset(next))
                    .map_err(|e| self.err(format!("`{t}` partition {p}: {e}")))?;
            }
            tracing::debug!(pipeline = %self.ids.0, source = %self.ids.1, subtask = self.subtask, topic = %t, partition = p, next, ?stop, "Reading a partition.");
            self.owned.entry(t).or_default().insert(p, owned);
        }
        if assign.count() > 0 {
            self.assign(&assign)?;
        }
        Ok(())
    }

    /// Assigns every restored partition that is not done, [`RESTORE_REWIND`] messages before
    /// its recorded offset (the poll drops what comes before it).
    fn assign_restored(&mut self) -> Result<()> {
        let mut assign = TopicPartitionList::new();
        for (t, parts) in &self.owned {
            for (p, o) in parts {
                if !o.done() {
                    let from = o.next.saturating_sub(RESTORE_REWIND).max(0);
                    assign
                        .add_partition_offset(t, *p, Offset::Offset(from))
                        .map_err(|e| self.err(format!("`{t}` partition {p}: {e}")))?;
                }
            }
        }
        if assign.count() > 0 {
            self.assign(&assign)?;
        }
        Ok(())
    }

    fn all_done(&self) -> bool {
        self.config.stop.is_some() && self.owned.values().flat_map(BTreeMap::values).all(Owned::done)
    }

    fn state(&self) -> KafkaState {
        let mut positions: Vec<Position> = self
            .owned
            .iter()
            .flat_map(|(t, parts)| {
                parts.iter().map(|(p, o)| Position {
                    topic: t.clone(),
                    partition: *p,
                    next: o.next,
                    stop: o.stop,
                })
            })
            .collect();
        positions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        KafkaState {
            version: KafkaState::VERSION,
            parallelism: self.parallelism,
            lineage: self.lineage.clone(),
            listed: self.listed,
            positions,
        }
    }

    fn load(&mut self, positions: impl IntoIterator<Item = Position>) {
        for pos in positions {
            self.owned.entry(pos.topic).or_default().insert(
                pos.partition,
                Owned {
                    next: pos.next,
                    stop: pos.stop,
                    committed: pos.next,
                },
            );
        }
    }

}

impl Incoming for rdkafka::message::BorrowedMessage<'_> {
    fn topic(&self) -> &str {
        Message::topic(self)
    }
    fn partition(&self) -> i32 {
        Message::partition(self)
    }
    fn offset(&self) -> i64 {
        Message::offset(self)
    }
    fn payload(&self) -> Option<&[u8]> {
        Message::payload(self)
    }
    fn key(&self) -> Option<&[u8]> {
        Message::key(self)
    }
    fn timestamp_ms(&self) -> Option<i64> {
        Message::timestamp(self).to_millis()
    }
    fn headers(&self) -> Vec<(&str, Option<&[u8]>)> {
        Message::headers(self).map_or_else(Vec::new, |h| {
            h.iter().map(|header| (header.key, header.value)).collect()
        })
    }
}

/// Takes one message of a partition this subtask reads (see [`accept_at`]), or drops it if
/// this subtask does not own its partition.
fn accept<M: Incoming>(
    config: &KafkaSourceConfig,
    owned: &mut HashMap<String, BTreeMap<i32, Owned>>,
    bad: &mut BadRecords,
    m: &M,
    out: &mut Vec<Dynamic>,
    ctx: &mut SourceContext,
    last_split: &mut Option<u64>,
) -> Result<()> {
    match owned
        .get_mut(m.topic())
        .and_then(|parts| parts.get_mut(&m.partition()))
    {
        Some(pos) => accept_at(config, pos, bad, m, out, ctx, last_split),
        None => Ok(()),
    }
}

/// Takes one message of the partition at `pos`: advances the position and emits its records,
/// or drops it (an offset before the position — fetched before a seek, or rewound on
/// restore — or at or past the stop).
fn accept_at<M: Incoming>(
    config: &KafkaSourceConfig,
    pos: &mut Owned,
    bad: &mut BadRecords,
    m: &M,
    out: &mut Vec<Dynamic>,
    ctx: &mut SourceContext,
    last_split: &mut Option<u64>,
) -> Result<()> {
    if m.offset() < pos.next || pos.stop.is_some_and(|s| m.offset() >= s) {
        return Ok(());
    }
    pos.next = m.offset() + 1;
    let done = pos.done();
    if ctx.track_splits {
        let id = split_id(m.topic(), m.partition());
        if *last_split != Some(id) {
            ctx.mark_split(id, out.len());
            *last_split = Some(id);
        }
    }
    ctx.bytes_read += m.payload().map_or(0, <[u8]>::len) as u64;
    emit(config, bad, m, out, ctx)?;
    if done && ctx.track_splits {
        ctx.end_split(split_id(m.topic(), m.partition()));
    }
    Ok(())
}

/// Turns one message into records appended to `out`; a value that does not parse goes
/// through `on_error`.
fn emit<M: Incoming>(
    config: &KafkaSourceConfig,
    bad: &mut BadRecords,
    m: &M,
    out: &mut Vec<Dynamic>,
    ctx: &mut SourceContext,
) -> Result<()> {
        let payload = m.payload();
        let before = out.len();
        let parsed: std::result::Result<(), String> = match config.format {
            KafkaFormat::Json => match payload {
                None => Err("the message has no value (a tombstone)".to_owned()),
                Some(bytes) => match crate::record::parse_json(bytes) {
                    Ok(v) if v.is_map() => {
                        out.push(v);
                        Ok(())
                    }
                    Ok(_) => Err("the value is JSON but not an object".to_owned()),
                    Err(e) => Err(e.to_string()),
                },
            },
            KafkaFormat::Lines => {
                let bytes = payload.unwrap_or_default();
                let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
                if !bytes.is_empty() {
                    for line in body.split(|b| *b == b'\n') {
                        let line = line.strip_suffix(b"\r").unwrap_or(line);
                        let mut r = Map::new();
                        r.insert(
                            "line".into(),
                            Dynamic::from(String::from_utf8_lossy(line).into_owned()),
                        );
                        out.push(Dynamic::from_map(r));
                    }
                }
                Ok(())
            }
            KafkaFormat::Raw => {
                let mut r = Map::new();
                let value = payload.map_or(Dynamic::UNIT, |b| {
                    Dynamic::from(String::from_utf8_lossy(b).into_owned())
                });
                r.insert("value".into(), value);
                out.push(Dynamic::from_map(r));
                Ok(())
            }
        };
        if let Err(message) = parsed {
            out.truncate(before);
            let fields = vec![
                ("topic", Dynamic::from(m.topic().to_owned())),
                ("partition", Dynamic::from(i64::from(m.partition()))),
                ("offset", Dynamic::from(m.offset())),
            ];
            let location = format!("topic `{}` partition {} offset {}", m.topic(), m.partition(), m.offset());
            return bad.failed_with(ctx, &location, fields, payload.unwrap_or_default(), message);
        }
        if let Some(field) = &config.metadata_field
            && out.len() > before
        {
            let meta = Dynamic::from_map(metadata_of(m));
            for r in &mut out[before..] {
                if let Some(mut map) = r.write_lock::<Map>() {
                    map.insert(field.as_str().into(), meta.clone());
                }
            }
        }
        Ok(())
}

/// Logs an error a poll returned (librdkafka retries by itself), at most every
/// [`ERROR_LOG_EVERY`].
fn log_poll_error(
    logged: &mut Option<Instant>,
    ids: &(String, String),
    subtask: u32,
    e: &KafkaError,
) {
    let now = Instant::now();
    if logged.is_none_or(|at| now.duration_since(at) >= ERROR_LOG_EVERY) {
        tracing::warn!(pipeline = %ids.0, source = %ids.1, subtask, error = %e, "Kafka reported an error while reading; librdkafka retries (at most one such line every 5 s).");
        *logged = Some(now);
    }
}

/// `{topic, partition, offset, timestamp, key, headers}` of a message.
fn metadata_of<M: Incoming>(m: &M) -> Map {
    let mut meta = Map::new();
    meta.insert("topic".into(), Dynamic::from(m.topic().to_owned()));
    meta.insert("partition".into(), Dynamic::from(i64::from(m.partition())));
    meta.insert("offset".into(), Dynamic::from(m.offset()));
    meta.insert(
        "timestamp".into(),
        m.timestamp_ms().map_or(Dynamic::UNIT, Dynamic::from),
    );
    meta.insert(
        "key".into(),
        m.key().map_or(Dynamic::UNIT, |k| {
            Dynamic::from(String::from_utf8_lossy(k).into_owned())
        }),
    );
    let mut headers = Map::new();
    for (key, value) in m.headers() {
        headers.insert(
            key.into(),
            value.map_or(Dynamic::UNIT, |v| {
                Dynamic::from(String::from_utf8_lossy(v).into_owned())
            }),
        );
    }
    meta.insert("headers".into(), Dynamic::from_map(headers));
    meta
}

impl Source for KafkaSource {
    fn open(&mut self, ctx: &mut SourceContext) -> Result<()> {
        self.ids = (ctx.pipeline.clone(), ctx.source.clone());
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.config.brokers)
            .set("group.id", &self.config.group)
            .set(
                "client.id",
                format!("weir-{}-{}-{}", ctx.pipeline, ctx.source, ctx.subtask),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .set("statistics.interval.ms", "1000")
            // librdkafka's defaults fetch in small steps and wait long for them (measured 15x
            // slower against tansu); these keep a deep local queue.
            .set("max.partition.fetch.bytes", "10485760")
            .set("fetch.wait.max.ms", "10")
            .set("queued.min.messages", "1000000");
        for (k, v) in &self.config.properties {
            cfg.set(k, v);
        }
        let consumer = cfg
            .create_with_context::<_, BaseConsumer<Client>>(Client::default())
            .map_err(|e| self.err(format!("cannot create the Kafka consumer: {e}")))?;
        self.reader = Some(MessageQueue::new(Arc::new(consumer)).ok_or_else(|| {
            self.err("cannot create a queue for the Kafka consumer".to_owned())
        })?);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll> {
        // The first poll (after any restore) finds this subtask's partitions; discovery then
        // repeats it at its interval, except for a bounded source.
        let now = Instant::now();
        let due = match self.next_discovery {
            None => true,
            Some(at) => self.config.stop.is_none() && now >= at,
        };
        if due {
            let fresh = !self.listed;
            let first = self.next_discovery.is_none();
            self.next_discovery = Some(now + self.config.discovery);
            match self.list_partitions() {
                Ok(listed) => {
                    self.take_new_partitions(&listed, fresh)?;
                    self.listed = true;
                }
                // The first listing must work (a wrong broker or topic is an error now); a
                // later one is retried at the next interval.
                Err(e) if first => return Err(e),
                Err(e) => tracing::warn!(pipeline = %self.ids.0, source = %self.ids.1, error = %e, "Partition discovery failed; retrying at the next interval."),
            }
        }
        if self.all_done() {
            return Ok(Poll::Done);
        }
        let Self {
            reader,
            owned,
            config,
            bad,
            error_logged,
            ids,
            subtask,
            ..
        } = self;
        let reader = reader
            .as_mut()
            .ok_or_else(|| RunError::Internal("the kafka source was not opened".into()))?;
        let mut last_split = None;
        // librdkafka's events (statistics, errors) come through the consumer's own poll, and
        // so would the messages of a partition that could not be routed to the batch queue.
        while out.len() < BATCH_SIZE {
            match reader.consumer().poll(Duration::ZERO) {
                None => break,
                Some(Ok(m)) => accept(config, owned, bad, &m, out, ctx, &mut last_split)?,
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => {
                    log_poll_error(error_logged, ids, *subtask, &e);
                    break;
                }
            }
        }
        // The messages, a batch at a time.
        while out.len() < BATCH_SIZE {
            let taken = reader.take(BATCH_SIZE - out.len());
            if taken.is_empty() {
                break;
            }
            // Consecutive messages mostly come from one partition: look it up once per run.
            let mut run: Option<(usize, i32)> = None;
            let mut pos: Option<&mut Owned> = None;
            for m in taken.iter() {
                match m.error() {
                    None => {
                        let at = (m.topic_id(), m.partition());
                        if run != Some(at) {
                            run = Some(at);
                            pos = owned
                                .get_mut(m.topic())
                                .and_then(|parts| parts.get_mut(&at.1));
                        }
                        if let Some(pos) = pos.as_deref_mut() {
                            accept_at(config, pos, bad, &m, out, ctx, &mut last_split)?;
                        }
                    }
                    Some(KafkaError::MessageConsumption(RDKafkaErrorCode::PartitionEOF)) => {}
                    Some(e) => log_poll_error(error_logged, ids, *subtask, &e),
                }
            }
        }
        if self.all_done() {
            return Ok(Poll::Done);
        }
        Ok(if out.is_empty() {
            Poll::Idle(IDLE_WAIT)
        } else {
            Poll::Ready
        })
    }

    fn snapshot(&mut self) -> Result<Vec<u8>> {
        crate::record::encode(&self.state()).map_err(|e| {
            RunError::State(format!(
                "source `{}`: cannot encode the partition offsets: {e}",
                self.ids.1
            ))
        })
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let state: KafkaState = crate::record::decode(snapshot).map_err(|e| {
            RunError::StateCorrupt(format!(
                "source `{}`: malformed partition offsets: {e}",
                self.ids.1
            ))
        })?;
        self.listed = state.listed;
        self.lineage = state.lineage;
        self.load(state.positions);
        self.assign_restored()
    }

    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &SourceContext) -> Result<()> {
        self.lineage = None;
        // A partition no snapshot holds starts as on a fresh start only if no old subtask
        // had listed them yet.
        self.listed = false;
        for bytes in snapshots {
            let state: KafkaState = crate::record::decode(bytes).map_err(|e| {
                RunError::StateCorrupt(format!(
                    "source `{}`: malformed partition offsets: {e}",
                    ctx.source
                ))
            })?;
            if let Some(l) = state.lineage {
                self.lineage = Some(extend_lineage(l, state.parallelism));
            }
            self.listed |= state.listed;
            self.load(state.positions);
        }
        tracing::info!(pipeline = %ctx.pipeline, source = %ctx.source, subtask = ctx.subtask, parallelism = ctx.parallelism, partitions = self.owned.values().map(BTreeMap::len).sum::<usize>(), lineage = ?self.lineage, "Took over the partitions of rescaled snapshots.");
        self.assign_restored()
    }

    fn snapshot_for(&mut self, checkpoint: u64) -> Result<Vec<u8>> {
        let state = self.state();
        let offsets = state
            .positions
            .iter()
            .map(|p| (p.topic.clone(), p.partition, p.next))
            .collect();
        self.pending_commits.push((checkpoint, offsets));
        crate::record::encode(&state).map_err(|e| {
            RunError::State(format!(
                "source `{}`: cannot encode the partition offsets: {e}",
                self.ids.1
            ))
        })
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<()> {
        // A completed checkpoint subsumes the earlier ones: commit the latest covered.
        let covered = self
            .pending_commits
            .iter()
            .rposition(|(id, _)| *id <= checkpoint);
        let Some(i) = covered else {
            return Ok(());
        };
        let (_, offsets) = self.pending_commits.drain(..=i).next_back().unwrap_or_default();
        let mut tpl = TopicPartitionList::new();
        for (t, p, next) in offsets {
            let Some(o) = self.owned.get_mut(&t).and_then(|m| m.get_mut(&p)) else {
                continue;
            };
            if o.committed != next {
                o.committed = next;
                let _ = tpl.add_partition_offset(&t, p, Offset::Offset(next));
            }
        }
        if tpl.count() > 0 {
            // For lag tools only: a failure is logged, never fatal.
            if let Err(e) = self.consumer()?.commit(&tpl, CommitMode::Async) {
                tracing::debug!(pipeline = %self.ids.0, source = %self.ids.1, error = %e, "Could not commit offsets to the consumer group.");
            }
        }
        Ok(())
    }

    fn lag(&mut self) -> Option<u64> {
        self.reader.as_ref()?;
        Some(self.partitions().iter().filter_map(|p| p.lag).sum())
    }

    fn partitions(&mut self) -> Vec<PartitionProgress> {
        let Some(consumer) = self.reader.as_ref().map(MessageQueue::consumer) else {
            return Vec::new();
        };
        let high = consumer
            .context()
            .high
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<PartitionProgress> = self
            .owned
            .iter()
            .flat_map(|(t, parts)| {
                let high = &high;
                parts.iter().map(move |(p, o)| {
                    // The end: the stop of a bounded source, else the partition's high
                    // watermark from librdkafka's last statistics.
                    let end = o.stop.or_else(|| high.get(&(t.clone(), *p)).copied());
                    PartitionProgress {
                        partition: format!("{t}/{p}"),
                        offset: o.next,
                        lag: end.map(|e| u64::try_from(e - o.next).unwrap_or(0)),
                    }
                })
            })
            .collect();
        out.sort_by(|a, b| a.partition.cmp(&b.partition));
        out
    }

    fn close(&mut self) -> Result<()> {
        self.reader = None;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Sink

/// Where a record's topic comes from.
#[derive(Clone, Debug)]
enum TopicOf {
    Fixed(String),
    Field(FieldPath),
}

/// A `kafka` sink's settings, shared by its subtasks.
#[derive(Clone, Debug)]
pub struct KafkaSinkConfig {
    brokers: String,
    topic: TopicOf,
    key: Option<FieldPath>,
    headers: Vec<(String, FieldPath)>,
    flush_timeout: Duration,
    properties: BTreeMap<String, String>,
}

impl KafkaSinkConfig {
    /// The settings of `spec`.
    pub fn from_spec(spec: &KafkaSinkSpec) -> Self {
        Self {
            brokers: spec.brokers.clone(),
            topic: match (&spec.topic, &spec.topic_field) {
                (_, Some(f)) => TopicOf::Field(FieldPath::new(f)),
                (Some(t), None) => TopicOf::Fixed(t.clone()),
                (None, None) => TopicOf::Fixed(String::new()),
            },
            key: spec.key_field.as_deref().map(FieldPath::new),
            headers: spec
                .headers
                .iter()
                .map(|(name, field)| (name.clone(), FieldPath::new(field)))
                .collect(),
            flush_timeout: spec.flush_timeout.map_or(DEFAULT_FLUSH_TIMEOUT, |d| d.0),
            properties: spec.properties.clone(),
        }
    }
}

/// The text of a key or header value: a string as is, anything else as JSON.
fn text_of(v: &Dynamic) -> Vec<u8> {
    if let Ok(s) = v.as_immutable_string_ref() {
        return s.as_bytes().to_vec();
    }
    let mut out = Vec::new();
    if crate::record::write_json(&mut out, v).is_err() {
        out = v.to_string().into_bytes();
    }
    out
}

/// One subtask of a `kafka` sink.
pub struct KafkaSink {
    config: Arc<KafkaSinkConfig>,
    producer: Option<BaseProducer<Client>>,
    value: Vec<u8>,
}

impl KafkaSink {
    /// A sink subtask with `config`; it connects in `open`.
    pub fn new(config: Arc<KafkaSinkConfig>) -> Self {
        Self {
            config,
            producer: None,
            value: Vec::new(),
        }
    }

    fn producer(&self, ctx: &OperatorContext) -> Result<&BaseProducer<Client>> {
        self.producer.as_ref().ok_or_else(|| {
            RunError::Internal(format!("sink `{}`: the producer was not opened", ctx.operator))
        })
    }

    /// Fails when the producer gave up on a message: the restart strategy replays it.
    fn check_delivered(&self, ctx: &OperatorContext) -> Result<()> {
        let failed = self
            .producer(ctx)?
            .context()
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match failed {
            Some(message) => Err(external(&ctx.pipeline, &ctx.operator, message)),
            None => Ok(()),
        }
    }

    /// Waits until the broker acknowledged every message sent so far.
    fn flush(&self, ctx: &OperatorContext) -> Result<()> {
        let producer = self.producer(ctx)?;
        producer.flush(self.config.flush_timeout).map_err(|e| {
            external(
                &ctx.pipeline,
                &ctx.operator,
                format!(
                    "brokers `{}` did not acknowledge every message within the flush timeout of                      {:?} ({} still in flight): {e}; is the broker up? (`flush_timeout` sets                      the wait)",
                    self.config.brokers,
                    self.config.flush_timeout,
                    producer.in_flight_count()
                ),
            )
        })?;
        self.check_delivered(ctx)
    }
}

impl Operator for KafkaSink {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.config.brokers)
            .set(
                "client.id",
                format!("weir-{}-{}-{}", ctx.pipeline, ctx.operator, ctx.subtask),
            )
            .set("linger.ms", "5")
            .set("statistics.interval.ms", "0");
        for (k, v) in &self.config.properties {
            cfg.set(k, v);
        }
        // Retries never duplicate or reorder a partition's messages.
        cfg.set("enable.idempotence", "true");
        let producer = cfg
            .create_with_context::<_, BaseProducer<Client>>(Client::default())
            .map_err(|e| {
                external(
                    &ctx.pipeline,
                    &ctx.operator,
                    format!("cannot create the Kafka producer: {e}"),
                )
            })?;
        self.producer = Some(producer);
        Ok(())
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        self.check_delivered(ctx)?;
        let producer = self
            .producer
            .as_ref()
            .ok_or_else(|| RunError::Internal("the kafka producer was not opened".into()))?;
        for r in batch.records.drain(..) {
            self.value.clear();
            crate::record::write_json(&mut self.value, &r).map_err(|e| RunError::Operator {
                pipeline: ctx.pipeline.to_string(),
                operator: ctx.operator.to_string(),
                subtask: ctx.subtask,
                message: format!("cannot write the record as JSON: {e}"),
                record: crate::record::excerpt(&r),
            })?;
            let topic = match &self.config.topic {
                TopicOf::Fixed(t) => t.clone(),
                TopicOf::Field(f) => match f.get(&r) {
                    Some(v) if v.is_string() => v.to_string(),
                    _ => {
                        return Err(RunError::Operator {
                            pipeline: ctx.pipeline.to_string(),
                            operator: ctx.operator.to_string(),
                            subtask: ctx.subtask,
                            message: format!(
                                "the record has no text field `{}` to name its topic",
                                f.as_str()
                            ),
                            record: crate::record::excerpt(&r),
                        });
                    }
                },
            };
            let key = self.config.key.as_ref().and_then(|f| f.get(&r)).map(|v| text_of(&v));
            let mut headers = OwnedHeaders::new_with_capacity(self.config.headers.len());
            for (name, f) in &self.config.headers {
                if let Some(v) = f.get(&r) {
                    let bytes = text_of(&v);
                    headers = headers.insert(Header {
                        key: name,
                        value: Some(&bytes),
                    });
                }
            }
            let mut record = BaseRecord::to(&topic)
                .payload(&self.value)
                .headers(headers);
            if let Some(k) = &key {
                record = record.key(k);
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        // The local queue is full: serve acknowledgements, then try again.
                        record = back;
                        producer.poll(Duration::from_millis(10));
                        self.check_delivered(ctx)?;
                    }
                    Err((e, _)) => {
                        return Err(external(
                            &ctx.pipeline,
                            &ctx.operator,
                            format!("cannot send a message to topic `{topic}`: {e}"),
                        ));
                    }
                }
            }
        }
        batch.keys.clear();
        producer.poll(Duration::ZERO);
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint: u64, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        // The barrier passes only when everything before it is acknowledged.
        self.flush(ctx)?;
        Ok(None)
    }

    fn on_end(&mut self, _out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        self.flush(ctx)
    }

    fn close(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        // A failed task does not wait for the broker: what was not acknowledged is replayed.
        self.producer = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> KafkaSourceSpec {
        serde_json::from_value(json).expect("a kafka source spec")
    }

    #[test]
    fn a_topic_pattern_matches_whole_topic_names() {
        let s = spec(serde_json::json!({"id": "k", "brokers": "b:1", "topic_pattern": "orders-[0-9]+"}));
        let config = KafkaSourceConfig::from_spec(&s, "p").expect("a pattern");
        assert!(config.topics.matches("orders-12"));
        assert!(!config.topics.matches("orders-12-old"), "the whole name must match");
        assert!(!config.topics.matches("old-orders-12"));
        assert_eq!(config.group, "weir-p-k", "the default group");
        let bad = spec(serde_json::json!({"id": "k", "brokers": "b:1", "topic_pattern": "("}));
        let e = KafkaSourceConfig::from_spec(&bad, "p").expect_err("not a regex");
        assert!(e.contains("`topic_pattern` is not a regular expression"), "{e}");
        let named = spec(serde_json::json!({"id": "k", "brokers": "b:1", "topics": ["a", "b"], "group": "g"}));
        let config = KafkaSourceConfig::from_spec(&named, "p").expect("named");
        assert!(config.topics.matches("a") && !config.topics.matches("c"));
        assert_eq!(config.group, "g");
    }

    #[test]
    fn a_snapshot_round_trips_and_describes_itself() {
        let mut source = KafkaSource::new(
            Arc::new(
                KafkaSourceConfig::from_spec(&spec(serde_json::json!({"id": "k", "brokers": "b:1", "topics": ["t"]})), "p")
                    .expect("config"),
            ),
            1,
            2,
        );
        source.lineage = Some(vec![4]);
        source.load([
            Position { topic: "t".into(), partition: 3, next: 17, stop: Some(20) },
            Position { topic: "t".into(), partition: 1, next: 5, stop: None },
        ]);
        let bytes = source.snapshot_for(7).expect("snapshot");
        let described = describe_snapshot(&bytes).expect("describe");
        assert_eq!(described["lineage"], serde_json::json!([4]));
        assert_eq!(described["parallelism"], 2);
        assert_eq!(described["positions"][0]["partition"], 1, "sorted");
        assert_eq!(described["positions"][1]["next"], 17);
        assert_eq!(source.pending_commits.len(), 1);
        assert!(describe_snapshot(b"junk").is_err());
    }

    #[test]
    fn ownership_deals_partitions_round_robin_and_follows_rescaled_snapshots() {
        // Fresh start: the partitions of one topic go round-robin.
        let owners: Vec<u32> = (0..6).map(|p| owner("orders", p, &[], 3)).collect();
        let mut seen = owners.clone();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 0, 1, 1, 2, 2], "{owners:?}");
        // Rescale 2 -> 3 -> 1: a partition always belongs to the subtask that received the
        // snapshot of its old owner (old j -> new j % p).
        for p in 0..16 {
            let o2 = owner("t", p, &[], 2);
            let l = extend_lineage(Vec::new(), 2);
            let o3 = owner("t", p, &l, 3);
            assert_eq!(o3, o2 % 3, "partition {p}");
            let l = extend_lineage(l, 3);
            assert_eq!(l, vec![2], "3 cannot change an owner below 2");
            assert_eq!(owner("t", p, &l, 1), 0);
        }
        // Scale-down 4 -> 3: old 3's partitions go to new 0, with old 0's.
        let l = extend_lineage(Vec::new(), 4);
        for p in 0..16 {
            assert_eq!(owner("t", p, &l, 3), owner("t", p, &[], 4) % 3);
        }
    }
}
