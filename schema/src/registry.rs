//! The registry of every built-in `type:`: sources, operators and sinks.
//!
//! This is the one file to touch to add a connector or operator kind (Kafka-API, NATS,
//! Postgres, ...): add a variant and its `*Spec` struct here, then its builder in the engine's
//! registry. Validation and the planner work through the accessor methods at the bottom
//! (`id`, `inputs`, `script`, capabilities), never by matching on every variant themselves.

use std::collections::BTreeMap;
use std::path::PathBuf;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{DurationSpec, SizeSpec};

// ---------------------------------------------------------------------------------------------
// Sources

/// A source of records. `type` selects the connector.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SourceSpec {
    /// Reads files: one file, a directory (every file in it, in name order) or a glob.
    /// Replayable: checkpoints record the byte offset per file.
    File(FileSourceSpec),
    /// Generates deterministic synthetic records from a seed. Replayable: checkpoints record
    /// the sequence number.
    Generator(GeneratorSourceSpec),
    /// Reads standard input. Not replayable, so not allowed with `exactly_once`.
    Stdin(StdinSourceSpec),
    /// Reads topics of a Kafka-API broker. Replayable: checkpoints record the next offset of
    /// every partition, and Weir (not the consumer group) assigns partitions to subtasks.
    Kafka(KafkaSourceSpec),
}

/// What a source does with an input record it cannot read: a malformed JSON line, a jsonl line
/// that is not an object, a CSV row with the wrong number of fields, text that is not UTF-8.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SourceOnError {
    /// Fail the pipeline with the file, line and parse error.
    #[default]
    Fail,
    /// Skip the record, count it in the run summary and log (at most once a second) which
    /// file and line were skipped.
    Skip,
    /// Send `{file, line, raw, error, source}` to the named sink (a sink with no `input`) and
    /// go on: the file, the line the record starts on (1-based), its text as read, and why it
    /// could not be read.
    DeadLetter(String),
}

/// How input bytes become records.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RecordFormat {
    /// One JSON object per line.
    #[default]
    Jsonl,
    /// Comma-separated values; see `csv` for the header and delimiter.
    Csv,
    /// Each line becomes the record `{"line": "<text>"}`.
    Lines,
}

/// CSV options.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CsvOptions {
    /// The first line names the columns (record fields). Without a header, fields are named
    /// `c0`, `c1`, ... Default: `true`.
    #[serde(default = "crate::model::default_true")]
    pub header: bool,
    /// The field delimiter, one ASCII character. Default: `,`.
    #[serde(default = "default_delimiter")]
    pub delimiter: String,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self {
            header: true,
            delimiter: default_delimiter(),
        }
    }
}

/// Options of the `file` source.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileSourceSpec {
    /// Stable identifier, unique in the pipeline; its offsets are checkpointed under it.
    pub id: String,
    /// A file, a directory or a glob (`data/*.jsonl`). Relative paths are relative to the
    /// pipeline file.
    pub path: String,
    /// Record format. Default: `jsonl`.
    #[serde(default)]
    pub format: RecordFormat,
    /// CSV options, for `format: csv` (rejected with another format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv: Option<CsvOptions>,
    /// Keep reading as files grow and new files match (like `tail -F`); the source then never
    /// ends. Default: `false`.
    #[serde(default)]
    pub follow: bool,
    /// With `follow`: how long a reader that found nothing new waits before it looks again
    /// (at least `1ms`). Shorter picks new lines up sooner, for a little more work while
    /// idle. Default: `100ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<DurationSpec>,
    /// Parallel readers (files are split among them). Default: the pipeline's parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// What to do with a line that does not parse. Default: `fail`.
    #[serde(default)]
    pub on_error: SourceOnError,
    /// Event time: which field holds each record's time, and how watermarks are made from
    /// it. Absent: the source produces no watermarks (processing time only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTimeSpec>,
}

/// Options of the `generator` source.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GeneratorSourceSpec {
    /// Stable identifier, unique in the pipeline; its sequence number is checkpointed under it.
    pub id: String,
    /// Seed of the pseudo-random sequence: the same seed gives the same records. Default: `0`.
    #[serde(default)]
    pub seed: u64,
    /// Number of records to produce, then end. Absent: never end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Upper bound on records per second over all subtasks. Absent: as fast as possible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rate: Option<u64>,
    /// The fields of each record, in output order.
    #[schemars(length(min = 1))]
    pub fields: IndexMap<String, GeneratorFieldSpec>,
    /// Parallel generators (the sequence is split among them). Default: the pipeline's
    /// parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// Event time: which field holds each record's time, and how watermarks are made from
    /// it. Absent: the source produces no watermarks (processing time only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTimeSpec>,
}

/// How a generated field gets its value.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GeneratorFieldSpec {
    /// The record's sequence number plus `start`.
    Sequence {
        /// First value. Default: `0`.
        #[serde(default)]
        start: i64,
    },
    /// A uniform integer in `[min, max]`.
    Int {
        /// Smallest value (inclusive).
        min: i64,
        /// Largest value (inclusive).
        max: i64,
    },
    /// A uniform float in `[min, max)`.
    Float {
        /// Smallest value (inclusive).
        min: f64,
        /// Upper bound (exclusive).
        max: f64,
    },
    /// A string `<prefix><n>` with `n` uniform in `[0, cardinality)`: a key with a known
    /// number of distinct values.
    Key {
        /// Text before the number. Default: empty.
        #[serde(default)]
        prefix: String,
        /// Number of distinct keys.
        #[schemars(range(min = 1))]
        cardinality: u64,
    },
    /// One of `values`, uniformly.
    Choice {
        /// The candidates.
        #[schemars(length(min = 1))]
        values: Vec<serde_json::Value>,
    },
    /// Milliseconds since the epoch: `start + sequence * step`.
    Timestamp {
        /// First timestamp in ms. Default: `1700000000000`.
        #[serde(default = "default_ts_start")]
        start: i64,
        /// Increment per record in ms. Default: `1`.
        #[serde(default = "default_ts_step")]
        step: i64,
    },
    /// Always the same value.
    Const {
        /// The value.
        value: serde_json::Value,
    },
}

/// Options of the `stdin` source.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StdinSourceSpec {
    /// Stable identifier, unique in the pipeline.
    pub id: String,
    /// Record format. Default: `jsonl`.
    #[serde(default)]
    pub format: RecordFormat,
    /// CSV options, for `format: csv` (rejected with another format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv: Option<CsvOptions>,
    /// What to do with a line that does not parse. Default: `fail`.
    #[serde(default)]
    pub on_error: SourceOnError,
    /// Event time: which field holds each record's time, and how watermarks are made from
    /// it. Absent: the source produces no watermarks (processing time only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTimeSpec>,
}

/// How a Kafka message's value becomes records.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum KafkaFormat {
    /// The value is one JSON object: the record.
    #[default]
    Json,
    /// Each line of the value becomes the record `{"line": "<text>"}`.
    Lines,
    /// The whole value, as text (invalid UTF-8 replaced), becomes `{"value": "<text>"}`.
    Raw,
}

/// Where a Kafka source starts reading a partition that its checkpoint does not know (every
/// partition on a fresh start). Partitions discovered while running are read from their
/// earliest offset, as are partitions new since a restored checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum KafkaStartSpec {
    /// The oldest message still in the partition.
    #[default]
    Earliest,
    /// Only messages produced after the source started.
    Latest,
    /// The offsets the consumer `group` committed (earliest where it committed none).
    Committed,
    /// The first message whose timestamp is at or after this time (epoch milliseconds).
    Timestamp(i64),
}

/// Where a Kafka source stops.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KafkaStopSpec {
    /// At the end each partition had when the source first started reading it (the offsets
    /// are kept in checkpoints, so a restored run stops at the same place): the source is
    /// bounded, as for a backfill.
    Latest,
}

/// Options of the `kafka` source.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceSpec {
    /// Stable identifier, unique in the pipeline; its partition offsets are checkpointed under
    /// it.
    pub id: String,
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topics to read. Exclusive with `topic_pattern`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    /// Read every topic whose whole name matches this regular expression (topics created
    /// later join at the next partition discovery). Exclusive with `topics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_pattern: Option<String>,
    /// How a message's value becomes records. Default: `json`.
    #[serde(default)]
    pub format: KafkaFormat,
    /// Where to start in partitions the checkpoint does not know. Default: `earliest`.
    #[serde(default)]
    pub start: KafkaStartSpec,
    /// Where to stop. Absent: never (the source is unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at: Option<KafkaStopSpec>,
    /// The consumer group offsets are committed to when a checkpoint completes (for lag
    /// tools only: Weir restores from its checkpoints, never from the group), and read from
    /// with `start: committed`. Default: `weir-<pipeline>-<source id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// How often to look for new partitions and, with `topic_pattern`, new topics (at least
    /// `1ms`; not with `stop_at`). Default: `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_interval: Option<DurationSpec>,
    /// Add the message's metadata to each record under this field: `{topic, partition,
    /// offset, timestamp, key, headers}` (key and header values as text; timestamp in epoch
    /// milliseconds, or `()` when the message has none). Absent: records carry no metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_field: Option<String>,
    /// librdkafka consumer properties (`security.protocol`, `sasl.*`, fetch tuning, ...),
    /// applied over Weir's defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// Parallel readers (partitions are dealt out among them). Default: the pipeline's
    /// parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// What to do with a message that does not parse. A dead letter carries the topic,
    /// partition and offset. Default: `fail`.
    #[serde(default)]
    pub on_error: SourceOnError,
    /// Event time: which field holds each record's time, and how watermarks are made from
    /// it. Absent: the source produces no watermarks (processing time only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<EventTimeSpec>,
}

/// A source's event time: where each record's time is, and how far out of order records may
/// come. Each source subtask makes watermarks from it, per split (file, part of a file,
/// generator sequence): the largest event time seen minus `max_out_of_orderness` minus 1 ms,
/// the minimum over its splits, never going back.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EventTimeSpec {
    /// The field holding the event time, a dotted path such as `ts` or `meta.time`. A record
    /// without it, or with a value that is not a time, is treated like a record that does
    /// not parse (the source's `on_error`).
    pub field: String,
    /// For numbers: epoch milliseconds (`ms`) or seconds (`s`). Default: `ms`. Exclusive
    /// with `format`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<TimeUnit>,
    /// For strings: their format (`rfc3339`, such as `2026-12-02T05:00:00.250Z`). Exclusive
    /// with `unit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TimeFormat>,
    /// How late (in event time) a record may arrive after a later one without being late:
    /// the watermark trails the largest event time seen by this much. Default: `0s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_out_of_orderness: Option<DurationSpec>,
    /// A split that produced nothing for this long (processing time) stops holding the
    /// watermark back until it produces again. Absent: never idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<DurationSpec>,
}

impl EventTimeSpec {
    /// `max_out_of_orderness` in milliseconds (0 when absent).
    pub fn out_of_orderness_ms(&self) -> i64 {
        self.max_out_of_orderness.map_or(0, |d| {
            i64::try_from(d.get().as_millis()).unwrap_or(i64::MAX)
        })
    }
}

/// The unit of a numeric event time.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimeUnit {
    /// Milliseconds since the Unix epoch.
    #[default]
    Ms,
    /// Seconds since the Unix epoch (fractions allowed).
    S,
}

/// The format of a textual event time.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TimeFormat {
    /// RFC 3339, such as `2026-12-02T05:00:00Z` or `2026-12-02T06:00:00.5+01:00`.
    Rfc3339,
}

// ---------------------------------------------------------------------------------------------
// Operators

/// What an operator does with a record whose script fails (throws, breaks a sandbox limit or
/// returns the wrong type).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnErrorSpec {
    /// Fail the task; the restart strategy decides what happens next. The error shows an excerpt
    /// of the record as the script left it when it failed.
    #[default]
    Fail,
    /// Drop the record and count it in the run summary.
    Skip,
    /// Send `{record, error, operator}` to the named sink (a sink with no `input`) and go on.
    /// The record is the one the operator received, unchanged by the script.
    DeadLetter(String),
}

/// An explicit exchange between an element and its inputs.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PartitioningSpec {
    /// Subtask i of the input feeds subtask i (needs equal parallelism; lets the two chain into
    /// one task).
    Forward,
    /// Round-robin over all subtasks, to even out load.
    Rebalance,
    /// Every subtask receives every record.
    Broadcast,
}

/// When a keyed reduce or aggregate emits.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum EmitMode {
    /// After every record, the key's updated result (a changelog, as Flink's reduce).
    #[default]
    Updates,
    /// Once per key at the end of a bounded input: the key's final result.
    Final,
}

/// The kind of a named keyed state.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// One value per key.
    Value,
    /// An append-friendly list per key.
    List,
    /// A map from string to value per key.
    Map,
}

/// A named keyed state of a `process`: its kind alone (`seen: list`), or its kind with a
/// time-to-live (`seen: {kind: map, ttl: 1h}`).
#[derive(Clone, Debug, Serialize, JsonSchema, PartialEq)]
#[serde(untagged)]
pub enum StateDeclSpec {
    /// `value` | `list` | `map`, without a time-to-live.
    Kind(StateKind),
    /// The kind with options.
    Options(StateOptionsSpec),
}

/// A keyed state's kind and time-to-live.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StateOptionsSpec {
    /// `value` | `list` | `map`.
    pub kind: StateKind,
    /// Time-to-live of a key's value (a whole list or map counts as one value): it reads as
    /// absent once this much processing time passed since it was last written (or read, with
    /// `ttl_update: on_read_and_write`), and is removed from the state soon after, so that
    /// the state stays bounded. Counted on the processing-time clock, across restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<DurationSpec>,
    /// What renews the time-to-live. Default: `on_write`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_update: Option<TtlUpdate>,
}

/// What renews a state's time-to-live.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum TtlUpdate {
    /// Every write of the key's value.
    #[default]
    OnWrite,
    /// Every write, and every read that finds the value.
    OnReadAndWrite,
}

impl StateDeclSpec {
    /// The state's kind.
    pub fn kind(&self) -> StateKind {
        match self {
            Self::Kind(k) => *k,
            Self::Options(o) => o.kind,
        }
    }

    /// The time-to-live, if any.
    pub fn ttl(&self) -> Option<DurationSpec> {
        match self {
            Self::Kind(_) => None,
            Self::Options(o) => o.ttl,
        }
    }

    /// What renews the time-to-live.
    pub fn ttl_update(&self) -> TtlUpdate {
        match self {
            Self::Kind(_) => TtlUpdate::OnWrite,
            Self::Options(o) => o.ttl_update.unwrap_or_default(),
        }
    }
}

impl From<StateKind> for StateDeclSpec {
    fn from(kind: StateKind) -> Self {
        Self::Kind(kind)
    }
}

impl<'de> Deserialize<'de> for StateDeclSpec {
    /// The short form is a string, the long form a mapping; each is read as its own type, so
    /// that errors name the field or value that is wrong.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = StateDeclSpec;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`value`, `list`, `map`, or `{kind: ..., ttl: ...}`")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                StateKind::deserialize(serde::de::value::StrDeserializer::new(v))
                    .map(StateDeclSpec::Kind)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                StateOptionsSpec::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(StateDeclSpec::Options)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A built-in aggregate function.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AggregateFunction {
    /// Sum of a numeric field.
    Sum,
    /// Number of records (no field needed).
    Count,
    /// Smallest value of a field.
    Min,
    /// Largest value of a field.
    Max,
    /// Arithmetic mean of a numeric field.
    Avg,
}

impl AggregateFunction {
    /// Whether the function reads a field.
    pub fn needs_field(self) -> bool {
        !matches!(self, Self::Count)
    }
}

/// One built-in aggregation: `{fn: sum, field: amount, as: total}`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AggregationSpec {
    /// The aggregate function.
    #[serde(rename = "fn")]
    pub function: AggregateFunction,
    /// The field to aggregate (a dotted path such as `order.amount`). `count` takes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Output field name. Default: the function name (`sum`, `count`, ...).
    #[serde(default, rename = "as", skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl AggregationSpec {
    /// The output field name, defaulted.
    pub fn output_name(&self) -> String {
        self.output.clone().unwrap_or_else(|| {
            serde_json::to_value(self.function)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        })
    }
}

/// Declares a scripted or built-in operator's spec struct with the fields every operator has
/// (`id`, `input`/`inputs`, `parallelism`, `on_error`), so they stay identical across kinds.
macro_rules! operator_spec {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Stable identifier, unique in the pipeline. State is saved under it, so keep it
            /// when you edit the operator and its state carries over.
            pub id: String,
            /// The one upstream source or operator (by id). Use `inputs` for several.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub input: Option<String>,
            /// Several upstream sources or operators (by id).
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub inputs: Vec<String>,
            /// Parallel subtasks. Default: the pipeline's parallelism.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(range(min = 1))]
            pub parallelism: Option<u32>,
            /// What to do when processing a record fails. Default: `fail`. (A `union` never
            /// fails a record: anything else is rejected there.)
            #[serde(default)]
            pub on_error: OnErrorSpec,
            /// How records travel from the inputs to this operator's subtasks. Default:
            /// `forward` when the parallelism matches the input's, `rebalance` otherwise. After a
            /// `key_by` records always go by key hash, so setting it there is rejected.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub partitioning: Option<PartitioningSpec>,
            $($(#[$fmeta])* pub $field: $ty,)*
        }
    };
}

operator_spec! {
    /// `map`: the script defines `fn map(r)` returning the new record.
    MapSpec {
        /// Inline Rhai script. The functions it defines and may call: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
    }
}

operator_spec! {
    /// `filter`: the script defines `fn filter(r)` returning `true` to keep the record.
    FilterSpec {
        /// Inline Rhai script. The functions it defines and may call: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
    }
}

operator_spec! {
    /// `flat_map`: the script defines `fn flat_map(r)` returning an array of records (possibly
    /// empty).
    FlatMapSpec {
        /// Inline Rhai script. The functions it defines and may call: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
    }
}

operator_spec! {
    /// `key_by`: partitions the stream by a key so that the keyed operator after it sees every
    /// record of a key in one subtask. Give either `field` (built in, fast) or a script that
    /// defines `fn key(r)`.
    KeyBySpec {
        /// A field path such as `user` or `customer.id`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field: Option<String>,
        /// Inline Rhai script defining `fn key(r)`. The script API: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file defining `fn key(r)`, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
    }
}

operator_spec! {
    /// `reduce` (keyed, after a `key_by`): the script defines `fn reduce(acc, r)` returning the
    /// new accumulator; a key's first record is its initial accumulator. Emits
    /// `{key, ...accumulator}` per `emit`. An optional `fn migrate(old)` (or
    /// `fn migrate(name, old)`) rewrites each accumulator restored from a savepoint taken
    /// with another version of the script (returning `()` drops it).
    ReduceSpec {
        /// Inline Rhai script. The functions it defines and may call: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
        /// When to emit. Default: `updates`.
        #[serde(default)]
        emit: EmitMode,
        /// Name of the key field in emitted records. Default: `key`.
        #[serde(default = "default_key_field")]
        key_field: String,
    }
}

operator_spec! {
    /// `aggregate` (keyed, after a `key_by`): built-in `aggregations` (native speed), or a
    /// script defining `fn init()`, `fn add(acc, r)` and optionally `fn finish(acc)`.
    /// Emits `{key, <as>: value, ...}` per `emit`.
    AggregateSpec {
        /// Built-in aggregations, each `{fn, field, as}`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        aggregations: Vec<AggregationSpec>,
        /// Inline Rhai script. The functions it defines and may call: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
        /// When to emit. Default: `updates`.
        #[serde(default)]
        emit: EmitMode,
        /// Name of the key field in emitted records. Default: `key`.
        #[serde(default = "default_key_field")]
        key_field: String,
    }
}

operator_spec! {
    /// `process` (keyed, after a `key_by`): the script defines `fn process(r)` and reads and
    /// writes the named keyed `state` declared here through `state_get`, `state_set`,
    /// `list_push`, `map_put` and friends; it emits with `emit(record)`. An optional
    /// `fn migrate(old)` (or `fn migrate(name, old)`, `name` being the state's) rewrites each
    /// state value restored from a savepoint taken with another version of the script, and an
    /// optional `fn on_end(key)` runs per key at the end of a bounded input. A script that
    /// defines `fn on_timer(ts, kind)` may set keyed event- and processing-time timers
    /// (`register_event_timer(t)`, `register_processing_timer(t)`), which call it with their
    /// key current; `now()` and `watermark()` read the two clocks.
    ProcessSpec {
        /// Inline Rhai script. The functions it defines and may call: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
        /// Named keyed state: name → `value` | `list` | `map`, or
        /// `{kind, ttl, ttl_update}` for a state whose values expire.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        state: BTreeMap<String, StateDeclSpec>,
    }
}

operator_spec! {
    /// `union`: merges several inputs (of any parallelism) into one stream.
    UnionSpec {}
}

/// How a `window` groups a key's records in time. Windows are `[start, end)` in epoch
/// milliseconds, aligned to the epoch (a `1m` tumbling window starts on whole minutes).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WindowKindSpec {
    /// Fixed, non-overlapping windows of `size`: each record is in exactly one.
    Tumbling {
        /// The window length, such as `1m`.
        size: DurationSpec,
    },
    /// Windows of `size` starting every `slide` (`slide` at most `size`): each record is in
    /// `size / slide` windows, and updates each of them.
    Sliding {
        /// The window length, such as `10s`.
        size: DurationSpec,
        /// How often a window starts, such as `5s`; at most `size`.
        slide: DurationSpec,
    },
    /// Sessions: a record opens the window `[time, time + gap)`, and windows of a key that
    /// overlap or touch merge, so a session ends after `gap` without records of its key.
    /// A scripted accumulator needs `fn merge(a, b)` for this.
    Session {
        /// The inactivity that closes a session, such as `30s`.
        gap: DurationSpec,
    },
}

/// Which time a `window` follows.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum WindowTimeSpec {
    /// The record's event time (`time_field`); windows close when the watermark passes
    /// their end. Needs `event_time` on the sources upstream.
    #[default]
    Event,
    /// The wall clock when the record arrives; windows close when the clock passes their
    /// end. Records are never late.
    Processing,
}

/// When a `window` emits a window's result.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum WindowEmitSpec {
    /// Once when the window closes (the watermark, or the clock, passes its end), and again
    /// for each late record accepted within `allowed_lateness`.
    #[default]
    OnClose,
    /// After every record, the updated result of each window it changed; nothing more at
    /// close.
    OnUpdate,
}

operator_spec! {
    /// `window` (keyed, after a `key_by`): groups each key's records into `tumbling`,
    /// `sliding` or `session` windows of event or processing time, aggregates each window
    /// with built-in `aggregations` (as `aggregate`) or a script defining `fn init()`,
    /// `fn add(acc, r)`, optional `fn finish(acc)` and, for sessions, `fn merge(a, b)`, and
    /// emits `{key, window_start, window_end, <as>: value, ...}` per `emit`. Event-time
    /// windows close when the watermark passes their end; a record that arrives after its
    /// window closed and `allowed_lateness` passed is late: sent to `late`, or dropped and
    /// counted.
    WindowSpec {
        /// The window kind: `{tumbling: {size}}`, `{sliding: {size, slide}}` or
        /// `{session: {gap}}`.
        window: WindowKindSpec,
        /// `event` (default) or `processing` time.
        #[serde(default)]
        time: WindowTimeSpec,
        /// The field holding a record's event time (a dotted path; epoch milliseconds).
        /// Default: the `event_time.field` of the sources upstream.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        time_field: Option<String>,
        /// Built-in aggregations, each `{fn, field, as}`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        aggregations: Vec<AggregationSpec>,
        /// Inline Rhai script. The functions it defines and may call: docs/SCRIPT_API.md.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Rhai script file, relative to the pipeline file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_file: Option<PathBuf>,
        /// How long after a window closed records for it are still accepted: each updates
        /// the window and emits its result again. Default: `0s`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allowed_lateness: Option<DurationSpec>,
        /// A sink (by id) that receives late records unchanged. Default: late records are
        /// dropped and counted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        late: Option<String>,
        /// When to emit. Default: `on_close`.
        #[serde(default)]
        emit: WindowEmitSpec,
        /// Name of the key field in emitted records. Default: `key`.
        #[serde(default = "default_key_field")]
        key_field: String,
    }
}

impl WindowSpec {
    /// `allowed_lateness`, defaulted to zero.
    pub fn lateness(&self) -> std::time::Duration {
        self.allowed_lateness.map(|d| d.0).unwrap_or_default()
    }
}

/// An operator. `type` selects the kind.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OperatorSpec {
    /// One record in, one record out (Rhai `fn map(r)`).
    Map(MapSpec),
    /// Keeps the records for which Rhai `fn filter(r)` is true.
    Filter(FilterSpec),
    /// One record in, zero or more out (Rhai `fn flat_map(r)` returns an array).
    FlatMap(FlatMapSpec),
    /// Partitions by key (a field path or Rhai `fn key(r)`).
    KeyBy(KeyBySpec),
    /// Keyed reduce (Rhai `fn reduce(acc, r)`).
    Reduce(ReduceSpec),
    /// Keyed aggregate (built-in `sum`/`count`/`min`/`max`/`avg`, or Rhai).
    Aggregate(AggregateSpec),
    /// Keyed process function with named state (Rhai `fn process(r)`).
    Process(ProcessSpec),
    /// Keyed event- or processing-time windows (tumbling, sliding, session).
    Window(WindowSpec),
    /// Merges several inputs.
    Union(UnionSpec),
}

// ---------------------------------------------------------------------------------------------
// Sinks

/// Output format of a sink.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SinkFormat {
    /// One JSON object per line.
    #[default]
    Jsonl,
    /// Comma-separated values with a header line of field names.
    Csv,
}

/// Options of the `file` sink.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileSinkSpec {
    /// Stable identifier, unique in the pipeline.
    pub id: String,
    /// The one upstream operator or source. A sink without input can only be a dead-letter
    /// target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Several upstream operators or sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Output directory; each subtask writes part files `<prefix>-<subtask>-<n>.<ext>` in it.
    /// With `exactly_once` checkpoints, parts are written in progress (hidden) and become
    /// visible only when the checkpoint that covers them completes (two-phase commit).
    pub path: String,
    /// Output format. Default: `jsonl`.
    #[serde(default)]
    pub format: SinkFormat,
    /// File-name prefix of part files. Default: `part`.
    #[serde(default = "default_part_prefix")]
    pub prefix: String,
    /// Roll to a new part file once the current one reaches this size. Default: never (one
    /// part per checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_part_size: Option<SizeSpec>,
    /// Parallel writers. Default: the pipeline's parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// How records travel from the inputs to the writers. Default: `forward` when the
    /// parallelism matches the input's, `rebalance` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<PartitioningSpec>,
}

/// Options of the `stdout` sink.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StdoutSinkSpec {
    /// Stable identifier, unique in the pipeline.
    pub id: String,
    /// The one upstream operator or source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Several upstream operators or sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Output format. Default: `jsonl`.
    #[serde(default)]
    pub format: SinkFormat,
}

/// How the `postgres` sink writes a record.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PostgresWriteMode {
    /// `INSERT` every record as a new row.
    #[default]
    Insert,
    /// `INSERT ... ON CONFLICT (key) DO UPDATE`: a record whose key columns match a row
    /// replaces that row's other columns. Idempotent, so `at_least_once` repeats are harmless.
    /// The table needs a unique index or primary key on exactly the `key` columns.
    Upsert,
}

/// Options of the `postgres` sink.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkSpec {
    /// Stable identifier, unique in the pipeline.
    pub id: String,
    /// The one upstream operator or source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Several upstream operators or sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// The name of the environment variable that holds the connection string (a URL such as
    /// `postgres://user:password@host:5432/db`, or `host=... user=... dbname=...`), never the
    /// string itself, so that no password sits in the file. TLS is not supported.
    pub connection_env: String,
    /// The table to write, as `name` or `schema.name`, spelled as in the database (names are
    /// quoted, so case matters). Weir does not create it.
    pub table: String,
    /// Column name -> the record field it is taken from (a path such as `user.id`). A missing
    /// field or `()` writes `NULL`; strings, numbers and booleans are written as text that
    /// PostgreSQL converts to the column's type; maps and arrays as JSON text.
    #[schemars(length(min = 1))]
    pub columns: IndexMap<String, String>,
    /// `insert` (default) or `upsert` (needs `key`).
    #[serde(default)]
    pub mode: PostgresWriteMode,
    /// The key columns of `upsert` (a subset of `columns`, backed by a unique index).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<String>,
    /// Rows sent in one statement. Default: 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub batch_size: Option<u32>,
    /// Parallel writers (one connection each). Default: the pipeline's parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// How records travel from the inputs to the writers. Default: `forward` when the
    /// parallelism matches the input's, `rebalance` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<PartitioningSpec>,
}

/// A sink. `type` selects the connector.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SinkSpec {
    /// Writes part files to a directory; transactional (two-phase commit) under `exactly_once`.
    File(FileSinkSpec),
    /// Writes to standard output. Not transactional, so not allowed with `exactly_once`.
    Stdout(StdoutSinkSpec),
    /// Writes rows into a PostgreSQL table; transactional (two-phase commit with prepared
    /// transactions, which the server must allow) under `exactly_once`.
    Postgres(PostgresSinkSpec),
    /// Writes JSON messages to a Kafka-API broker with the idempotent producer, flushed at
    /// every checkpoint barrier: at-least-once. Not transactional (the broker here has no
    /// transactions), so not allowed with `exactly_once`.
    Kafka(KafkaSinkSpec),
}

/// Options of the `kafka` sink.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkSpec {
    /// Stable identifier, unique in the pipeline.
    pub id: String,
    /// The one upstream operator or source. A sink without input can only be a dead-letter
    /// target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Several upstream operators or sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic every record goes to. Exclusive with `topic_field`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The field (a dotted path) naming each record's topic. Exclusive with `topic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_field: Option<String>,
    /// The field (a dotted path) whose value is the message key (text as is, other values as
    /// JSON); the broker's partitioner picks the partition from it. Absent: no key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_field: Option<String>,
    /// Message headers: header name to the field (a dotted path) holding its value. A record
    /// without the field gets no such header.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
    /// How long a checkpoint barrier may wait for the broker to acknowledge every message
    /// sent before it; past it the checkpoint fails. Default: `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_timeout: Option<DurationSpec>,
    /// librdkafka producer properties (`security.protocol`, `compression.type`, ...), applied
    /// over Weir's defaults (the idempotent producer cannot be switched off).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// Parallel writers. Default: the pipeline's parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// How records travel from the inputs to the writers. Default: `forward` when the
    /// parallelism matches the input's, `rebalance` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<PartitioningSpec>,
}

fn default_delimiter() -> String {
    ",".to_owned()
}
fn default_ts_start() -> i64 {
    1_700_000_000_000
}
fn default_ts_step() -> i64 {
    1
}
fn default_key_field() -> String {
    "key".to_owned()
}
fn default_part_prefix() -> String {
    "part".to_owned()
}

// ---------------------------------------------------------------------------------------------
// Accessors: the only place that matches on every variant.

/// Where an element's script text comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptRef<'a> {
    /// `script:` in the YAML.
    Inline(&'a str),
    /// `script_file:` relative to the YAML.
    File(&'a std::path::Path),
}

/// The element kinds of a pipeline, for diagnostics and paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Section {
    /// `sources:`
    Sources,
    /// `operators:`
    Operators,
    /// `sinks:`
    Sinks,
}

impl Section {
    /// The YAML key of the section.
    pub fn key(self) -> &'static str {
        match self {
            Self::Sources => "sources",
            Self::Operators => "operators",
            Self::Sinks => "sinks",
        }
    }
}

impl SourceSpec {
    /// The source's id.
    pub fn id(&self) -> &str {
        match self {
            Self::File(s) => &s.id,
            Self::Generator(s) => &s.id,
            Self::Stdin(s) => &s.id,
            Self::Kafka(s) => &s.id,
        }
    }

    /// The `type:` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
            Self::Generator(_) => "generator",
            Self::Stdin(_) => "stdin",
            Self::Kafka(_) => "kafka",
        }
    }

    /// Whether the source can rewind to a checkpointed position (needed for exactly-once).
    pub fn is_replayable(&self) -> bool {
        !matches!(self, Self::Stdin(_))
    }

    /// Whether the source can end by itself.
    pub fn is_bounded(&self) -> bool {
        match self {
            Self::File(f) => !f.follow,
            Self::Generator(g) => g.count.is_some(),
            Self::Stdin(_) => true,
            Self::Kafka(k) => k.stop_at.is_some(),
        }
    }

    /// The declared parallelism override. `stdin` is always 1.
    pub fn parallelism(&self) -> Option<u32> {
        match self {
            Self::File(s) => s.parallelism,
            Self::Generator(s) => s.parallelism,
            Self::Stdin(_) => Some(1),
            Self::Kafka(s) => s.parallelism,
        }
    }

    /// What the source does with a record it cannot read; `None` for a source that reads no
    /// input (`generator`).
    pub fn on_error(&self) -> Option<&SourceOnError> {
        match self {
            Self::File(s) => Some(&s.on_error),
            Self::Stdin(s) => Some(&s.on_error),
            Self::Kafka(s) => Some(&s.on_error),
            Self::Generator(_) => None,
        }
    }

    /// The source's event time, when declared.
    pub fn event_time(&self) -> Option<&EventTimeSpec> {
        match self {
            Self::File(s) => s.event_time.as_ref(),
            Self::Generator(s) => s.event_time.as_ref(),
            Self::Stdin(s) => s.event_time.as_ref(),
            Self::Kafka(s) => s.event_time.as_ref(),
        }
    }

    /// The field of the source's `event_time`, if it declares one: where an event-time
    /// `window` downstream reads a record's event time by default.
    pub fn event_time_field(&self) -> Option<&str> {
        self.event_time().map(|e| e.field.as_str())
    }

    /// The sink named by `on_error: {dead_letter: ...}`, if any.
    pub fn dead_letter(&self) -> Option<&str> {
        match self.on_error() {
            Some(SourceOnError::DeadLetter(sink)) => Some(sink),
            _ => None,
        }
    }
}

/// The fields every operator kind has (see `operator_spec!`).
struct Common<'a> {
    id: &'a str,
    input: Option<&'a str>,
    inputs: &'a [String],
    parallelism: Option<u32>,
    on_error: &'a OnErrorSpec,
    partitioning: Option<PartitioningSpec>,
}

impl OperatorSpec {
    /// The operator's id.
    pub fn id(&self) -> &str {
        self.common().id
    }

    /// The `type:` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Map(_) => "map",
            Self::Filter(_) => "filter",
            Self::FlatMap(_) => "flat_map",
            Self::KeyBy(_) => "key_by",
            Self::Reduce(_) => "reduce",
            Self::Aggregate(_) => "aggregate",
            Self::Process(_) => "process",
            Self::Window(_) => "window",
            Self::Union(_) => "union",
        }
    }

    fn common(&self) -> Common<'_> {
        macro_rules! c {
            ($s:expr) => {
                Common {
                    id: &$s.id,
                    input: $s.input.as_deref(),
                    inputs: &$s.inputs,
                    parallelism: $s.parallelism,
                    on_error: &$s.on_error,
                    partitioning: $s.partitioning,
                }
            };
        }
        match self {
            Self::Map(s) => c!(s),
            Self::Filter(s) => c!(s),
            Self::FlatMap(s) => c!(s),
            Self::KeyBy(s) => c!(s),
            Self::Reduce(s) => c!(s),
            Self::Aggregate(s) => c!(s),
            Self::Process(s) => c!(s),
            Self::Window(s) => c!(s),
            Self::Union(s) => c!(s),
        }
    }

    /// `input:` and `inputs:`, each with its YAML key and index for diagnostics.
    pub fn wiring(&self) -> Wiring<'_> {
        let c = self.common();
        Wiring {
            input: c.input,
            inputs: c.inputs,
        }
    }

    /// The declared parallelism override.
    pub fn parallelism(&self) -> Option<u32> {
        self.common().parallelism
    }

    /// The error policy.
    pub fn on_error(&self) -> &OnErrorSpec {
        self.common().on_error
    }

    /// The declared exchange from the inputs, if any.
    pub fn partitioning(&self) -> Option<PartitioningSpec> {
        self.common().partitioning
    }

    /// The sink late records go to (`late:` of a `window`), if any.
    pub fn late_target(&self) -> Option<&str> {
        match self {
            Self::Window(w) => w.late.as_deref(),
            _ => None,
        }
    }

    /// Whether the operator reads keyed state and so must follow a `key_by`.
    pub fn is_keyed(&self) -> bool {
        matches!(
            self,
            Self::Reduce(_) | Self::Aggregate(_) | Self::Process(_) | Self::Window(_)
        )
    }

    /// The script, if the operator has one (`script:` wins over `script_file:` here; having
    /// both is a validation error).
    pub fn script(&self) -> Option<ScriptRef<'_>> {
        let (script, file) = match self {
            Self::Map(s) => (&s.script, &s.script_file),
            Self::Filter(s) => (&s.script, &s.script_file),
            Self::FlatMap(s) => (&s.script, &s.script_file),
            Self::KeyBy(s) => (&s.script, &s.script_file),
            Self::Reduce(s) => (&s.script, &s.script_file),
            Self::Aggregate(s) => (&s.script, &s.script_file),
            Self::Process(s) => (&s.script, &s.script_file),
            Self::Window(s) => (&s.script, &s.script_file),
            Self::Union(_) => return None,
        };
        match (script, file) {
            (Some(s), _) => Some(ScriptRef::Inline(s)),
            (None, Some(f)) => Some(ScriptRef::File(f)),
            (None, None) => None,
        }
    }

    /// Whether both `script` and `script_file` are set.
    pub fn has_both_script_forms(&self) -> bool {
        match self {
            Self::Map(s) => s.script.is_some() && s.script_file.is_some(),
            Self::Filter(s) => s.script.is_some() && s.script_file.is_some(),
            Self::FlatMap(s) => s.script.is_some() && s.script_file.is_some(),
            Self::KeyBy(s) => s.script.is_some() && s.script_file.is_some(),
            Self::Reduce(s) => s.script.is_some() && s.script_file.is_some(),
            Self::Aggregate(s) => s.script.is_some() && s.script_file.is_some(),
            Self::Process(s) => s.script.is_some() && s.script_file.is_some(),
            Self::Window(s) => s.script.is_some() && s.script_file.is_some(),
            Self::Union(_) => false,
        }
    }

    /// The Rhai functions the script must define, as `(name, parameter count)`, and the
    /// optional ones. Empty when the operator runs without a script.
    pub fn required_functions(&self) -> &'static [(&'static str, usize)] {
        match self {
            Self::Map(_) => &[("map", 1)],
            Self::Filter(_) => &[("filter", 1)],
            Self::FlatMap(_) => &[("flat_map", 1)],
            Self::KeyBy(k) if k.field.is_none() => &[("key", 1)],
            Self::KeyBy(_) => &[],
            Self::Reduce(_) => &[("reduce", 2)],
            Self::Aggregate(a) if a.aggregations.is_empty() => &[("init", 0), ("add", 2)],
            Self::Aggregate(_) => &[],
            Self::Process(_) => &[("process", 1)],
            Self::Window(w) if w.aggregations.is_empty() => match w.window {
                WindowKindSpec::Session { .. } => &[("init", 0), ("add", 2), ("merge", 2)],
                _ => &[("init", 0), ("add", 2)],
            },
            Self::Window(_) => &[],
            Self::Union(_) => &[],
        }
    }

    /// Whether this kind needs a script unless a built-in alternative is configured.
    pub fn needs_script(&self) -> bool {
        !self.required_functions().is_empty()
    }
}

impl SinkSpec {
    /// The sink's id.
    pub fn id(&self) -> &str {
        match self {
            Self::File(s) => &s.id,
            Self::Stdout(s) => &s.id,
            Self::Postgres(s) => &s.id,
            Self::Kafka(s) => &s.id,
        }
    }

    /// The `type:` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
            Self::Stdout(_) => "stdout",
            Self::Postgres(_) => "postgres",
            Self::Kafka(_) => "kafka",
        }
    }

    /// `input:` and `inputs:`.
    pub fn wiring(&self) -> Wiring<'_> {
        match self {
            Self::File(s) => Wiring {
                input: s.input.as_deref(),
                inputs: &s.inputs,
            },
            Self::Stdout(s) => Wiring {
                input: s.input.as_deref(),
                inputs: &s.inputs,
            },
            Self::Postgres(s) => Wiring {
                input: s.input.as_deref(),
                inputs: &s.inputs,
            },
            Self::Kafka(s) => Wiring {
                input: s.input.as_deref(),
                inputs: &s.inputs,
            },
        }
    }

    /// The declared exchange from the inputs, if any (`stdout` has one writer).
    pub fn partitioning(&self) -> Option<PartitioningSpec> {
        match self {
            Self::File(s) => s.partitioning,
            Self::Postgres(s) => s.partitioning,
            Self::Kafka(s) => s.partitioning,
            Self::Stdout(_) => None,
        }
    }

    /// Whether the sink can commit output transactionally (needed for exactly-once).
    pub fn is_transactional(&self) -> bool {
        matches!(self, Self::File(_) | Self::Postgres(_))
    }

    /// The declared parallelism override. `stdout` is always 1.
    pub fn parallelism(&self) -> Option<u32> {
        match self {
            Self::File(s) => s.parallelism,
            Self::Postgres(s) => s.parallelism,
            Self::Kafka(s) => s.parallelism,
            Self::Stdout(_) => Some(1),
        }
    }
}

/// An element's declared inputs: `input: x` and/or `inputs: [y, z]`.
#[derive(Clone, Copy, Debug)]
pub struct Wiring<'a> {
    /// `input:`
    pub input: Option<&'a str>,
    /// `inputs:`
    pub inputs: &'a [String],
}

impl<'a> Wiring<'a> {
    /// Every input name with the YAML path suffix that locates it (`["input"]` or
    /// `["inputs", i]`).
    pub fn names(&self) -> Vec<(&'a str, crate::span::PathSuffix)> {
        let mut out = Vec::new();
        if let Some(i) = self.input {
            out.push((i, crate::span::PathSuffix::Key("input")));
        }
        for (n, i) in self.inputs.iter().enumerate() {
            out.push((i.as_str(), crate::span::PathSuffix::Index("inputs", n)));
        }
        out
    }
}
