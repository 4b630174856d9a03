//! The pipeline-file data model: what a user writes in YAML, as serde + schemars types.
//!
//! These are *spec* types: inputs are names, scripts are text, nothing is resolved. The engine's
//! planner turns a validated spec into an operator graph; nothing here knows about tasks,
//! channels or state. Every field carries a doc comment because the comments become the JSON
//! Schema's descriptions, which editors show as hover help.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::registry::{
    AggregateFunction, AggregateSpec, AggregationSpec, CsvOptions, EmitMode, EventTimeSpec,
    FileSinkSpec, FileSourceSpec, FilterSpec, FlatMapSpec, GeneratorFieldSpec, GeneratorSourceSpec,
    KeyBySpec, MapSpec, OnErrorSpec, OperatorSpec, PartitioningSpec, PostgresSinkSpec,
    PostgresWriteMode, ProcessSpec, RecordFormat, ReduceSpec, SinkFormat, SinkSpec, SourceOnError,
    SourceSpec, StateKind, StdinSourceSpec, StdoutSinkSpec, TimeFormat, TimeUnit, UnionSpec,
    WindowEmitSpec, WindowKindSpec, WindowSpec, WindowTimeSpec,
};
pub use crate::registry::{StateDeclSpec, StateOptionsSpec, TtlUpdate};
use crate::units::{DurationSpec, SizeSpec};

/// The only file-format version this build understands.
pub const CURRENT_VERSION: u32 = 1;

/// A Weir pipeline file: one or more independent pipelines run by one `weir run` process.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Weir pipeline file")]
pub struct FileSpec {
    /// Version of the file format. Only `1` exists today; a later format will bump it and
    /// `weir validate` will say how to migrate.
    #[schemars(range(min = 1, max = 1))]
    pub version: u32,
    /// The pipelines in this file. Each runs independently (its own checkpoints, restarts and
    /// reloads); a failure in one never restarts another.
    #[schemars(length(min = 1))]
    pub pipelines: Vec<PipelineSpec>,
    /// The local control API (status, checkpoints, savepoints, reload) served by `weir run`.
    #[serde(default)]
    pub api: ApiSpec,
}

/// The HTTP control API that `weir run` serves on the loopback interface. `weir run`'s flags
/// win over this section: `--no-api` switches it off, `--api-port` sets the port (and switches
/// it on), `--api-token` (or `WEIR_API_TOKEN`) sets the token. Read when `weir run` starts: a
/// reload that changes it is reported and takes effect at the next start.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiSpec {
    /// Serve the control API. `weir status`, `weir savepoint`, `weir stop` and `weir reload`
    /// need it. Default: `true`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// TCP port on 127.0.0.1. `0` picks a free port and prints it. `weir run` refuses to start
    /// when the port is taken. Default: `8642`.
    #[serde(default = "default_api_port")]
    pub port: u16,
    /// Name of an environment variable holding a bearer token. When set, mutating calls
    /// (checkpoint, savepoint, stop, reload) must send `Authorization: Bearer <token>`, and
    /// `weir run` refuses to start if the variable is unset or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
}

impl Default for ApiSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            port: default_api_port(),
            token_env: None,
        }
    }
}

/// One dataflow: sources feeding operators feeding sinks, with its own state backend,
/// checkpoints and recovery policy.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Stable identifier, unique in the file (letters, digits, `_` and `-`). It names the
    /// pipeline's checkpoint directory and its entry in the control API, so changing it starts
    /// the pipeline from scratch.
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_-]*$"))]
    pub id: String,
    /// Free text, shown by `weir graph`; it changes nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Default number of parallel subtasks for every source, operator and sink (each may
    /// override it). Default: 1.
    #[serde(default = "default_parallelism")]
    #[schemars(range(min = 1))]
    pub parallelism: u32,
    /// Number of key groups: the unit in which keyed state is partitioned and rescaled, and the
    /// upper bound for any parallelism. It cannot change once state exists (a savepoint taken
    /// with one value cannot be restored with another). Default, as Flink: the parallelism × 1.5
    /// rounded up to a power of two, at least 128 and at most 32768.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32768))]
    pub max_parallelism: Option<u32>,
    /// Where operators keep keyed state. Default: `{backend: memory}`.
    #[serde(default)]
    pub state: StateSpec,
    /// Periodic checkpoints: how often, and with which delivery guarantee. Absent means no
    /// checkpoints (and no delivery guarantee across failures).
    #[serde(default)]
    pub checkpoints: CheckpointSpec,
    /// Savepoints: where `weir savepoint` and hot reload write them by default.
    #[serde(default)]
    pub savepoints: SavepointSpec,
    /// Whether and when to restart after a failure. Default, as Flink 1.19+: `exponential_delay`
    /// when checkpoints are enabled, `none` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartSpec>,
    /// Which tasks restart after a failure. Default: `region`.
    #[serde(default)]
    pub failover: FailoverSpec,
    /// Sandbox limits applied to every Rhai script in this pipeline.
    #[serde(default)]
    pub limits: ScriptLimitsSpec,
    /// Where records come from. At least one.
    #[schemars(length(min = 1))]
    pub sources: Vec<SourceSpec>,
    /// Transformations between sources and sinks, wired by `input`/`inputs`. Order does not
    /// matter; the graph is built from the wiring.
    #[serde(default)]
    pub operators: Vec<OperatorSpec>,
    /// Where records go. At least one.
    #[schemars(length(min = 1))]
    pub sinks: Vec<SinkSpec>,
}

impl PipelineSpec {
    /// The sources (their indexes in `sources`, ascending) that the element named `id` reads
    /// from, directly or through operators. Dead-letter outputs and names that match nothing
    /// lead nowhere. The one walk that validation, the script checks and the runtime's window
    /// builder share.
    pub fn upstream_sources(&self, id: &str) -> Vec<usize> {
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![id];
        let mut out = Vec::new();
        while let Some(at) = todo.pop() {
            if !seen.insert(at) {
                continue;
            }
            if let Some(si) = self.sources.iter().position(|s| s.id() == at) {
                out.push(si);
            } else if let Some(o) = self.operators.iter().find(|o| o.id() == at) {
                todo.extend(o.wiring().names().into_iter().map(|(name, _)| name));
            }
        }
        out.sort_unstable();
        out
    }

    /// The number of key groups, with Flink's default rule applied when unset.
    pub fn effective_max_parallelism(&self) -> u32 {
        self.max_parallelism
            .unwrap_or_else(|| default_max_parallelism(self.parallelism))
    }

    /// The restart strategy in force: the declared one, or Flink 1.19+'s default.
    pub fn effective_restart(&self) -> RestartSpec {
        match &self.restart {
            Some(r) => r.clone(),
            None if self.checkpoints.enabled => {
                RestartSpec::ExponentialDelay(ExponentialDelaySpec::default())
            }
            None => RestartSpec::None,
        }
    }
}

/// Flink's default for `max_parallelism`: `parallelism * 1.5` rounded up to a power of two,
/// clamped to `[128, 32768]`.
pub fn default_max_parallelism(parallelism: u32) -> u32 {
    let scaled = u64::from(parallelism) + u64::from(parallelism) / 2;
    let pow2 = scaled.max(1).next_power_of_two();
    pow2.clamp(128, 32768) as u32
}

/// The state backend: where keyed operator state lives while the pipeline runs.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "backend", rename_all = "snake_case", deny_unknown_fields)]
#[derive(Default)]
pub enum StateSpec {
    /// State on the heap; checkpoints are kept in this process's memory. They survive a task
    /// failure but not a crash of the `weir` process: use `fs` or `rocksdb` to recover from
    /// crashes.
    #[default]
    Memory,
    /// State on the heap; every checkpoint writes a full snapshot into checkpoint storage.
    /// Fast, limited by memory, survives process crashes.
    Fs,
    /// State in embedded RocksDB on local disk: bounded memory, state larger than RAM,
    /// incremental checkpoints.
    Rocksdb(RocksdbSpec),
}

/// Options of the RocksDB state backend.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RocksdbSpec {
    /// Local working directory for the live databases: each subtask's database lives in
    /// `<path>/<pipeline-id>/<operator>-<subtask>/`. Relative paths are relative to the
    /// pipeline file. Default: `.weir/rocksdb` next to the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Incremental checkpoints: upload only SST files that earlier retained checkpoints do not
    /// already hold (shared, reference-counted). Default: `true`.
    #[serde(default = "default_true")]
    pub incremental: bool,
    /// Size of the block cache, shared by every subtask of the process (whose memtables are
    /// charged to it too, so that together they stay near this size). Default: `64MiB`.
    #[serde(default = "default_block_cache")]
    pub block_cache_size: SizeSpec,
    /// Size of one memtable before it is flushed to an SST file; all subtasks' memtables
    /// together are limited to twice this. Default: `32MiB`.
    #[serde(default = "default_write_buffer")]
    pub write_buffer_size: SizeSpec,
}

impl Default for RocksdbSpec {
    fn default() -> Self {
        Self {
            path: None,
            incremental: true,
            block_cache_size: default_block_cache(),
            write_buffer_size: default_write_buffer(),
        }
    }
}

/// The delivery guarantee. This is the *only* place it is declared: sinks do not have a
/// separate setting, because two knobs (one on the checkpoints, one on the sink) can disagree,
/// and a sink cannot be more exactly-once than the barriers that feed it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointMode {
    /// Aligned barriers; replayable sources rewind to the checkpoint and transactional sinks
    /// commit only checkpointed output: every record affects the output exactly once, even
    /// across crashes. Requires replayable sources (`file`, `generator`) and transactional sinks
    /// (`file`).
    #[default]
    ExactlyOnce,
    /// Barriers are not aligned, so no input is ever paused; after a failure some records are
    /// replayed and may appear twice in the output, but none is lost.
    AtLeastOnce,
}

/// Periodic checkpoints: consistent snapshots of source positions and operator state, taken
/// with barriers that flow with the data.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Take checkpoints. Writing a `checkpoints:` section turns them on; set `false` to keep
    /// the section but switch them off. With checkpoints off there is no delivery guarantee
    /// across failures.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Time between the start of two checkpoints. Default: `10s`.
    #[serde(default = "default_interval")]
    pub interval: DurationSpec,
    /// The pipeline's delivery guarantee (see the type's description). Default:
    /// `exactly_once`.
    #[serde(default)]
    pub mode: CheckpointMode,
    /// Where checkpoints are written: a directory (relative paths are relative to the pipeline
    /// file), or `s3://bucket/prefix` on S3-compatible object storage (credentials, region and
    /// endpoint from the `AWS_*` environment variables). Default: `.weir/checkpoints` next to
    /// the file.
    #[serde(default = "default_checkpoint_storage")]
    pub storage: String,
    /// A checkpoint that has not completed after this long is aborted. Default: `10m`.
    #[serde(default = "default_checkpoint_timeout")]
    pub timeout: DurationSpec,
    /// Minimum time between the end of one checkpoint and the start of the next. Default: `0ms`.
    #[serde(default = "default_zero")]
    pub min_pause: DurationSpec,
    /// How many checkpoints may be in progress at once. Default: `1`.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub max_concurrent: u32,
    /// Consecutive failed checkpoints tolerated before the pipeline fails over. Default: `0`.
    #[serde(default)]
    pub tolerable_failures: u32,
    /// Completed checkpoints to keep; older ones are deleted. Default: `1`.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub retain: u32,
    /// Unaligned checkpoints (`exactly_once` only): a checkpoint barrier overtakes the records
    /// queued in front of it, each subtask snapshots as soon as the first barrier reaches it,
    /// and the records overtaken are stored in the checkpoint as channel state and replayed
    /// on restore. Checkpoints then complete quickly under backpressure. Savepoints stay
    /// aligned. Requires `max_concurrent: 1`. Default: `false`.
    #[serde(default)]
    pub unaligned: bool,
    /// With `unaligned: true`, how long each checkpoint tries aligned first: a subtask whose
    /// alignment lasts longer goes unaligned. `0ms` (the default): unaligned from the start.
    #[serde(default = "default_zero")]
    pub aligned_timeout: DurationSpec,
}

impl Default for CheckpointSpec {
    /// No `checkpoints:` section means checkpoints are off.
    fn default() -> Self {
        Self {
            enabled: false,
            interval: default_interval(),
            mode: CheckpointMode::default(),
            storage: default_checkpoint_storage(),
            timeout: default_checkpoint_timeout(),
            min_pause: default_zero(),
            max_concurrent: 1,
            tolerable_failures: 0,
            retain: 1,
            unaligned: false,
            aligned_timeout: default_zero(),
        }
    }
}

/// Where savepoints go when a command does not name a directory.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SavepointSpec {
    /// Directory for savepoints (relative paths are relative to the pipeline file), or
    /// `s3://bucket/prefix` on S3-compatible object storage (configured as S3 checkpoint
    /// storage is). Default: `.weir/savepoints` next to the file.
    #[serde(default = "default_savepoint_dir")]
    pub dir: String,
}

impl Default for SavepointSpec {
    fn default() -> Self {
        Self {
            dir: default_savepoint_dir(),
        }
    }
}

/// Whether and when a failed pipeline restarts (Flink's restart strategies).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "strategy", rename_all = "snake_case", deny_unknown_fields)]
pub enum RestartSpec {
    /// Restart up to `attempts` times, waiting `delay` before each restart.
    FixedDelay(FixedDelaySpec),
    /// Restart at most `max_failures` times within any window of `interval`.
    FailureRate(FailureRateSpec),
    /// Restart with a delay that grows by `multiplier` after each failure, up to `max`, and
    /// resets after `reset_after` without failure.
    ExponentialDelay(ExponentialDelaySpec),
    /// Never restart: the first failure fails the pipeline.
    None,
}

/// Parameters of the `fixed_delay` restart strategy.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FixedDelaySpec {
    /// How many restarts before giving up. Default: `3`.
    #[serde(default = "default_attempts")]
    #[schemars(range(min = 1))]
    pub attempts: u32,
    /// Wait before each restart. Default: `1s`.
    #[serde(default = "default_restart_delay")]
    pub delay: DurationSpec,
}

/// Parameters of the `failure_rate` restart strategy.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FailureRateSpec {
    /// Restart at most this many times within `interval`; the next failure inside the window
    /// gives up (Flink's `max-failures-per-interval`). Default: `1`.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub max_failures: u32,
    /// The sliding window over which failures are counted. Default: `1m`.
    #[serde(default = "default_failure_interval")]
    pub interval: DurationSpec,
    /// Wait before each restart. Default: `1s`.
    #[serde(default = "default_restart_delay")]
    pub delay: DurationSpec,
}

/// Parameters of the `exponential_delay` restart strategy (Flink 1.19+ defaults).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExponentialDelaySpec {
    /// Delay before the first restart. Default: `1s`.
    #[serde(default = "default_restart_delay")]
    pub initial: DurationSpec,
    /// Upper bound of the delay. Default: `1m`.
    #[serde(default = "default_max_backoff")]
    pub max: DurationSpec,
    /// Factor applied to the delay after each consecutive failure (> 1). Default: `1.5`.
    #[serde(default = "default_multiplier")]
    pub multiplier: f64,
    /// After this long without a failure the delay goes back to `initial`. Default: `1h`.
    #[serde(default = "default_reset_after")]
    pub reset_after: DurationSpec,
    /// Random spread of each delay, as a fraction of it, in `[0, 1]`. Default: `0.1`.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// Give up after this many restarts without a reset. Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub attempts: Option<u32>,
}

impl Default for ExponentialDelaySpec {
    fn default() -> Self {
        Self {
            initial: default_restart_delay(),
            max: default_max_backoff(),
            multiplier: default_multiplier(),
            reset_after: default_reset_after(),
            jitter: default_jitter(),
            attempts: None,
        }
    }
}

/// Which tasks restart when one fails (Flink's failover strategies).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum FailoverSpec {
    /// Restart every task of the pipeline from the latest completed checkpoint.
    Full,
    /// Restart only the failed region (the connected part of the pipeline that holds the failed
    /// task) from the latest completed checkpoint; disconnected parts and other pipelines keep
    /// running.
    #[default]
    Region,
    /// Restart only the failed subtask from its latest state. Its in-flight records may be lost
    /// or duplicated (like Flink's approximate local recovery): no exactly-once.
    Individual,
    /// Restart nothing: the failed subtask stays down and the pipeline reports itself degraded.
    Noop,
}

/// Sandbox limits for Rhai scripts. A script that exceeds one fails the record with the
/// operator's `on_error` policy.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScriptLimitsSpec {
    /// Maximum Rhai operations per call (one record): a CPU budget that stops runaway loops.
    /// 1 to 10000000000. Default: `1000000`.
    #[serde(default = "default_max_operations")]
    #[schemars(range(min = 1, max = MAX_OPERATIONS_CEILING))]
    pub max_operations: u64,
    /// Maximum function-call nesting (recursion depth). 1 to 512, and `max_call_levels` ×
    /// (`max_expr_depth` + 8) at most 8192, so that the deepest script fits the stack of the
    /// threads that run scripts (32 MiB). Default: `32`.
    #[serde(default = "default_max_call_levels")]
    #[schemars(range(min = 1, max = MAX_CALL_LEVELS_CEILING))]
    pub max_call_levels: u32,
    /// Maximum expression nesting depth, checked when scripts compile (a level of
    /// parentheses, a nested call or block counts one or two). 1 to 1000, and
    /// `max_call_levels` × (`max_expr_depth` + 8) at most 8192. Default: `64`.
    #[serde(default = "default_max_expr_depth")]
    #[schemars(range(min = 1, max = MAX_EXPR_DEPTH_CEILING))]
    pub max_expr_depth: u32,
    /// Largest string a script may build; also the most string bytes one value may hold in
    /// total (the strings of a record, of a list or map state). Above `0B`, up to `256MiB`.
    /// Default: `1MiB`.
    #[serde(default = "default_max_string")]
    pub max_string_size: SizeSpec,
    /// Largest array a script may build, in items (nested arrays' items included); also
    /// the most items a `list` state may hold. 1 to 10000000. Default: `10000`.
    #[serde(default = "default_max_collection")]
    #[schemars(range(min = 1, max = MAX_COLLECTION_CEILING))]
    pub max_array_size: u32,
    /// Largest object map a script may build, in entries (nested maps' entries included);
    /// also the most entries a `map` state may hold. 1 to 10000000. Default: `10000`.
    #[serde(default = "default_max_collection")]
    #[schemars(range(min = 1, max = MAX_COLLECTION_CEILING))]
    pub max_map_size: u32,
    /// Most records one input record may become in one operator: the length of the array
    /// `fn flat_map` returns, or the number of `emit` calls of one `process` (or `on_end`)
    /// call. More is a record error, handled by the operator's `on_error`. 1 to 1000000
    /// (one call's output is held in memory at once). Default: `10000`.
    #[serde(default = "default_max_collection")]
    #[schemars(range(min = 1, max = MAX_OUTPUTS_PER_RECORD_CEILING))]
    pub max_outputs_per_record: u32,
}

/// Highest `limits.max_operations` (about a minute of one core per record).
pub const MAX_OPERATIONS_CEILING: u64 = 10_000_000_000;

/// Highest `limits.max_call_levels`.
pub const MAX_CALL_LEVELS_CEILING: u32 = 512;

/// Highest `limits.max_expr_depth`: parsing takes up to ~2 KiB of stack per level.
pub const MAX_EXPR_DEPTH_CEILING: u32 = 1000;

/// Highest `max_call_levels × (max_expr_depth + 8)`: a script evaluates with up to ~1.25 KiB
/// of stack per expression level per call level, plus ~7 KiB per call level (measured with
/// Rhai 1.27), so the deepest script allowed needs ~10 MiB of the 32 MiB its threads get.
pub const SCRIPT_DEPTH_BUDGET: u64 = 8192;

/// Highest `limits.max_array_size` and `limits.max_map_size`.
pub const MAX_COLLECTION_CEILING: u32 = 10_000_000;

/// Highest `limits.max_string_size` (checked by validation, since sizes are text).
pub const MAX_STRING_SIZE_CEILING: SizeSpec = SizeSpec::mib(256);

/// Highest `limits.max_outputs_per_record`: one call's output is held in memory at once.
pub const MAX_OUTPUTS_PER_RECORD_CEILING: u32 = 1_000_000;

impl Default for ScriptLimitsSpec {
    fn default() -> Self {
        Self {
            max_operations: default_max_operations(),
            max_call_levels: default_max_call_levels(),
            max_expr_depth: default_max_expr_depth(),
            max_string_size: default_max_string(),
            max_array_size: default_max_collection(),
            max_map_size: default_max_collection(),
            max_outputs_per_record: default_max_collection(),
        }
    }
}

pub(crate) fn default_true() -> bool {
    true
}
fn default_api_port() -> u16 {
    8642
}
fn default_parallelism() -> u32 {
    1
}
pub(crate) fn default_one() -> u32 {
    1
}
fn default_attempts() -> u32 {
    3
}
fn default_block_cache() -> SizeSpec {
    SizeSpec::mib(64)
}
fn default_write_buffer() -> SizeSpec {
    SizeSpec::mib(32)
}
fn default_interval() -> DurationSpec {
    DurationSpec::from_secs(10)
}
fn default_checkpoint_storage() -> String {
    ".weir/checkpoints".to_owned()
}
fn default_savepoint_dir() -> String {
    ".weir/savepoints".to_owned()
}
fn default_checkpoint_timeout() -> DurationSpec {
    DurationSpec::from_secs(600)
}
fn default_zero() -> DurationSpec {
    DurationSpec::from_millis(0)
}
fn default_restart_delay() -> DurationSpec {
    DurationSpec::from_secs(1)
}
fn default_failure_interval() -> DurationSpec {
    DurationSpec::from_secs(60)
}
fn default_max_backoff() -> DurationSpec {
    DurationSpec::from_secs(60)
}
fn default_reset_after() -> DurationSpec {
    DurationSpec::from_secs(3600)
}
fn default_multiplier() -> f64 {
    1.5
}
fn default_jitter() -> f64 {
    0.1
}
fn default_max_operations() -> u64 {
    1_000_000
}
fn default_max_call_levels() -> u32 {
    32
}
fn default_max_expr_depth() -> u32 {
    64
}
fn default_max_string() -> SizeSpec {
    SizeSpec::mib(1)
}
fn default_max_collection() -> u32 {
    10_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_parallelism_follows_flinks_rule() {
        assert_eq!(default_max_parallelism(1), 128);
        assert_eq!(default_max_parallelism(100), 256);
        assert_eq!(default_max_parallelism(30000), 32768);
    }
}
