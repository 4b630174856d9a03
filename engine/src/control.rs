//! The control surface of a running job: what the HTTP API (`api`) and the CLI verbs can ask
//! of it (status, checkpoint history, trigger a checkpoint or a savepoint, stop, reload), as
//! one object-safe trait with serde types for requests and answers. The job implements it;
//! the API only translates HTTP to these calls and back, so the same types travel as JSON
//! between `weir run` and `weir status`/`savepoint`/`stop`/`reload`.
//!
//! Mutating calls resolve when the work is done (the checkpoint completed, the savepoint is
//! on disk, the pipeline stopped, the reload applied or rolled back), with its result.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

/// A boxed, sendable future (keeps [`JobControl`] object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a running job answers to.
pub trait JobControl: Send + Sync + 'static {
    /// Every pipeline's status, plus reload counters.
    fn status(&self) -> JobStatus;

    /// The checkpoints and savepoints of `pipeline` still in memory, completed and failed
    /// (the last [`CHECKPOINT_HISTORY`], most recent last).
    ///
    /// # Errors
    /// [`ControlError::NoSuchPipeline`].
    fn checkpoints(&self, pipeline: &str) -> Result<Vec<CheckpointInfo>, ControlError>;

    /// Triggers a checkpoint now and resolves when it completed (or failed).
    fn trigger_checkpoint(
        &self,
        pipeline: &str,
    ) -> BoxFuture<'_, Result<CheckpointInfo, ControlError>>;

    /// Takes a savepoint and resolves when it is on disk.
    fn savepoint(
        &self,
        pipeline: &str,
        request: SavepointRequest,
    ) -> BoxFuture<'_, Result<SavepointInfo, ControlError>>;

    /// Stops one pipeline (the others go on): with `savepoint`, sources stop at a savepoint
    /// barrier and sinks commit; with `drain`, the input is ended and everything flushed.
    fn stop(
        &self,
        pipeline: &str,
        request: StopRequest,
    ) -> BoxFuture<'_, Result<StopOutcome, ControlError>>;

    /// Re-reads the pipeline file (or, with `plan_only`, compares `file` or the running file
    /// with the running version and applies nothing).
    fn reload(&self, request: ReloadRequest) -> BoxFuture<'_, Result<ReloadOutcome, ControlError>>;

    /// Opens a tap on one operator of `pipeline`: a live sample of the records it emits (or
    /// receives), which never slows the pipeline (records the reader cannot keep up with are
    /// dropped and counted). The tap keeps streaming across restarts and hot reloads and ends
    /// at its limit, when the operator is gone from a new version, when the pipeline ends, or
    /// when the stream is dropped.
    ///
    /// # Errors
    /// [`ControlError::NoSuchPipeline`]; [`ControlError::Invalid`] for an unknown operator, a
    /// side it does not have (a source's input, a sink's output), a sample rate outside
    /// `(0, 1]` or a pipeline that is not running. The default refuses every tap.
    fn tap(&self, pipeline: &str, request: TapRequest) -> Result<TapStream, ControlError> {
        let _ = request;
        Err(ControlError::Invalid(format!(
            "pipeline `{pipeline}`: this job does not serve taps"
        )))
    }
}

/// Which records of an operator a tap shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TapSide {
    /// What it receives.
    Input,
    /// What it emits (the default).
    #[default]
    Output,
}

impl TapSide {
    /// `input` or `output`.
    pub fn as_str(self) -> &'static str {
        match self {
            TapSide::Input => "input",
            TapSide::Output => "output",
        }
    }
}

/// Asks for a tap on one operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TapRequest {
    /// The operator (source, operator or sink) id.
    pub operator: String,
    /// Its input or its output.
    #[serde(default)]
    pub side: TapSide,
    /// The fraction of records shown, in `(0, 1]` (1: every record); taken evenly by a
    /// counter, not at random.
    pub sample: f64,
    /// End after this many records.
    pub limit: Option<u64>,
}

impl Default for TapRequest {
    fn default() -> Self {
        Self {
            operator: String::new(),
            side: TapSide::Output,
            sample: 1.0,
            limit: None,
        }
    }
}

/// One line of a tap's stream (newline-delimited JSON on the wire).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TapEvent {
    /// The tap is open (always the first line).
    Started {
        /// The pipeline.
        pipeline: String,
        /// The operator.
        operator: String,
        /// Its input or its output.
        side: TapSide,
        /// The fraction of records shown.
        sample: f64,
    },
    /// A sampled record.
    Record {
        /// The subtask that saw it.
        subtask: u32,
        /// The record.
        value: serde_json::Value,
    },
    /// Sampled records were dropped, beyond the tap's rate bound or because the reader fell
    /// behind (the pipeline did not wait for it): the total so far.
    Dropped {
        /// Records dropped since the tap opened.
        total: u64,
    },
    /// The tap ended (always the last line).
    End {
        /// Why: the limit, the pipeline's end, the operator gone after a reload.
        reason: String,
        /// Records shown.
        records: u64,
        /// Records dropped.
        dropped: u64,
        /// Whether it ended as asked or by the pipeline's normal end (`false`: the operator
        /// or the pipeline is gone, or failed).
        ok: bool,
    },
}

/// The events of one open tap, in order; a [`TapEvent::End`] is the last. Dropping it closes
/// the tap.
pub struct TapStream {
    source: Box<dyn TapSource>,
}

impl TapStream {
    /// A stream over `source`.
    pub fn new(source: Box<dyn TapSource>) -> Self {
        Self { source }
    }

    /// The next event; `None` after the end.
    pub async fn next(&mut self) -> Option<TapEvent> {
        self.source.next().await
    }
}

impl std::fmt::Debug for TapStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TapStream")
    }
}

/// What a [`TapStream`] reads from (the job's tap, or a test's canned events).
pub trait TapSource: Send {
    /// The next event; `None` after the end.
    fn next(&mut self) -> BoxFuture<'_, Option<TapEvent>>;
}

/// Why a control call failed. Each variant maps to one HTTP status in `api`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "code", content = "message", rename_all = "snake_case")]
pub enum ControlError {
    /// No pipeline has this id (404).
    #[error("no pipeline `{0}` is running")]
    NoSuchPipeline(String),
    /// Another savepoint, stop or reload of the same target is in progress (409).
    #[error("{0}")]
    Busy(String),
    /// The request cannot be honoured as asked (400), e.g. a savepoint of a pipeline that
    /// already finished.
    #[error("{0}")]
    Invalid(String),
    /// The work was attempted and failed (500): the message says what and why.
    #[error("{0}")]
    Failed(String),
    /// Missing or wrong bearer token (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The request is refused whatever the token: a cross-site `Origin`, a `Host` that is not
    /// a loopback name, or a path outside what the API may touch (a reload file outside the
    /// running file's directory, a savepoint directory outside the savepoint root) (403).
    #[error("{0}")]
    Forbidden(String),
}

/// The whole job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// The pipeline file.
    pub file: PathBuf,
    /// Every pipeline, in file order.
    pub pipelines: Vec<PipelineStatus>,
    /// Reloads applied since start (successful ones).
    pub reloads: u64,
    /// The last reload attempt, if any.
    pub last_reload: Option<ReloadOutcome>,
    /// Reloads refused (invalid file or plan, a savepoint that failed): nothing changed.
    #[serde(default)]
    pub reloads_rejected: u64,
    /// Reloads whose new version failed to start; the old one runs again.
    #[serde(default)]
    pub reloads_rolled_back: u64,
    /// Reloads whose rollback failed too.
    #[serde(default)]
    pub reloads_failed: u64,
    /// The pause of the last reload that paused a pipeline, milliseconds.
    #[serde(default)]
    pub last_reload_pause_ms: Option<u64>,
    /// The latest reload attempts (applied, unchanged, rejected, rolled back or failed; not
    /// `plan_only` comparisons), oldest first, at most [`RELOAD_HISTORY_KEPT`]: when, the
    /// result, what changed per pipeline, the pause and the messages.
    #[serde(default)]
    pub reload_history: Vec<ReloadOutcome>,
}

/// How many reload attempts [`JobStatus::reload_history`] keeps (the oldest go first).
pub const RELOAD_HISTORY_KEPT: usize = 20;

/// One pipeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineStatus {
    /// Its id.
    pub id: String,
    /// `running`, `restarting`, `stopping`, `reloading`, `finished`, `stopped`, `failed` or
    /// `degraded`.
    pub state: String,
    /// Records produced by its sources so far (this run, every version across reloads).
    pub source_records: u64,
    /// Records written by its sinks so far.
    pub sink_records: u64,
    /// Restarts after failures (this run, every version).
    pub restarts: u32,
    /// Checkpoints completed (this run, every version).
    pub checkpoints: u64,
    /// The latest completed checkpoint's id.
    pub latest_checkpoint: Option<u64>,
    /// The checkpoint or savepoint this run restored from.
    pub restored_from: Option<String>,
    /// Why it failed, when `state` is `failed`.
    pub error: Option<String>,
    /// Failures in a row: reset once two checkpoints completed after the last failure. A count
    /// that keeps growing while `state` is `restarting` means no progress.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// The operator (or source, sink, task) that failed last.
    #[serde(default)]
    pub failing: Option<String>,
    /// The last failure, also after the pipeline recovered from it.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Every source, operator and sink, in plan order (figures count across reloads/restarts).
    #[serde(default)]
    pub operators: Vec<OperatorStatus>,
    /// Checkpoints aborted (declined, timed out, failed to write) over the whole run.
    #[serde(default)]
    pub checkpoints_failed: u64,
    /// Checkpoints triggered and neither completed nor aborted yet.
    #[serde(default)]
    pub checkpoints_in_progress: u64,
    /// The last completed checkpoint or savepoint of the run.
    #[serde(default)]
    pub last_checkpoint: Option<LastCheckpointStatus>,
    /// Bytes of state per operator in the last completed checkpoint.
    #[serde(default)]
    pub state_sizes: Vec<StateSizeStatus>,
}

/// The figures of a pipeline's last completed checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LastCheckpointStatus {
    /// Its id.
    pub id: u64,
    /// Trigger to completion, milliseconds.
    pub duration_ms: u64,
    /// Bytes of every file it references.
    pub size: u64,
    /// Bytes the checkpoint before it did not reference.
    pub new_bytes: u64,
    /// Barrier alignment per task (named by the head operator of its chain) and subtask.
    pub alignment: Vec<SubtaskAlignment>,
    /// Bytes of channel state it persisted over every subtask (unaligned checkpoints; 0
    /// otherwise).
    #[serde(default)]
    pub channel_state_bytes: u64,
}

/// How long one subtask aligned barriers for a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SubtaskAlignment {
    /// The head operator of the task's chain.
    pub task: String,
    /// Subtask index.
    pub subtask: u32,
    /// From the first barrier to the last on its inputs, milliseconds (0 for sources).
    pub alignment_ms: u64,
}

/// The state one operator holds, as of the last completed checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StateSizeStatus {
    /// The operator (or source, sink) id.
    pub operator: String,
    /// `memory`, `fs` or `rocksdb`.
    pub backend: String,
    /// Bytes of its files in the checkpoint, over every subtask.
    pub bytes: u64,
}

/// One source, operator or sink of a pipeline, with its figures per subtask.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OperatorStatus {
    /// The element id.
    pub id: String,
    /// `source`, `operator` or `sink`.
    pub role: String,
    /// The `type:`.
    pub type_name: String,
    /// Its parallelism.
    pub parallelism: u32,
    /// The ids of the elements feeding it (data and dead-letter edges), in plan order.
    pub inputs: Vec<String>,
    /// Per subtask, by index: every subtask that ran in this run, so after a reload that
    /// lowered the parallelism the subtasks it dropped are still listed with their counts.
    pub subtasks: Vec<SubtaskStatus>,
}

/// The figures of one subtask. Counters are cumulative over the whole run (every generation
/// across reloads and restarts); clients compute rates from differences.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SubtaskStatus {
    /// Subtask index.
    pub subtask: u32,
    /// Records that entered (a source: produced).
    pub records_in: u64,
    /// Records that left (a sink: 0).
    pub records_out: u64,
    /// Records that failed (skipped or dead-lettered; a source: unreadable input).
    pub errors: u64,
    /// Failed records dropped (`on_error: skip`, a source's unreadable lines).
    pub skipped: u64,
    /// Failed records sent to a dead-letter output.
    pub dead_lettered: u64,
    /// Late records (a `window`'s) dropped and counted.
    #[serde(default)]
    pub late_dropped: u64,
    /// Late records (a `window`'s) sent to its `late` output.
    #[serde(default)]
    pub late_sent: u64,
    /// Bytes read (file sources).
    pub bytes_read: u64,
    /// Time spent processing, milliseconds (0 with `weir run --no-metrics`).
    pub busy_ms: u64,
    /// Time spent waiting for room downstream (backpressure), milliseconds (0 with
    /// `--no-metrics`).
    pub backpressured_ms: u64,
    /// How full its input queue was when it last took a batch, 0.0 to 1.0 (the head of a
    /// chain: the element whose task reads the channels; 0 for the others).
    pub queue_fill: f64,
    /// Sources only: how far behind the end of its input it is (bytes for files), when known.
    pub lag: Option<u64>,
    /// Sources with partitions (Kafka) only: the next offset and the lag of each partition
    /// this subtask reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<crate::base::metrics::PartitionProgress>,
}

/// How many checkpoints and savepoints (completed and failed) a pipeline's history keeps.
pub const CHECKPOINT_HISTORY: usize = 100;

/// One checkpoint or savepoint, completed or failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// Its id.
    pub id: u64,
    /// `checkpoint` or `savepoint`.
    pub kind: String,
    /// `completed`; `failed` (it timed out, a task declined it, its metadata could not be
    /// written: it counts against `tolerable_failures`); or `aborted` (a newer checkpoint
    /// completed first, or a restart cancelled it). Answers of an older `weir run` have no
    /// status: completed.
    #[serde(default = "completed")]
    pub status: String,
    /// Why it failed or was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// When it was triggered (Unix milliseconds).
    pub trigger_time_ms: u64,
    /// Trigger to completion (or to the failure).
    pub duration_ms: u64,
    /// Bytes of every file it references (0 when it failed).
    pub size: u64,
    /// Bytes the previous completed checkpoint did not reference (0 when it failed).
    pub new_bytes: u64,
    /// Longest alignment over its subtasks.
    pub alignment_ms: u64,
    /// Bytes of channel state over its subtasks (unaligned checkpoints; 0 otherwise).
    #[serde(default)]
    pub channel_state_bytes: u64,
    /// Per subtask (of a failed one: the subtasks that acknowledged it before the failure).
    pub subtasks: Vec<SubtaskCheckpointInfo>,
}

fn completed() -> String {
    "completed".to_owned()
}

impl CheckpointInfo {
    /// Whether it did not complete (failed or aborted).
    pub fn failed(&self) -> bool {
        matches!(self.status.as_str(), "failed" | "aborted")
    }

    /// When it completed or failed (Unix milliseconds).
    pub fn end_time_ms(&self) -> u64 {
        self.trigger_time_ms.saturating_add(self.duration_ms)
    }

    /// The subtask that acknowledged last (the one the checkpoint waited for), if any.
    pub fn slowest(&self) -> Option<&SubtaskCheckpointInfo> {
        self.subtasks.iter().max_by_key(|s| s.ack_ms)
    }
}

/// One subtask's part of a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SubtaskCheckpointInfo {
    /// The head operator of the task's chain.
    pub task: String,
    /// Subtask index.
    pub subtask: u32,
    /// Bytes written for it.
    pub size: u64,
    /// Trigger to acknowledgement.
    pub ack_ms: u64,
    /// From the first barrier to the last on its inputs (0 for sources).
    pub alignment_ms: u64,
    /// Bytes of channel state it persisted: the in-flight records its unaligned barrier
    /// overtook (0 for aligned checkpoints, and in answers of an older `weir run`).
    #[serde(default)]
    pub channel_state_bytes: u64,
}

/// Asks for a savepoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavepointRequest {
    /// The directory to create the savepoint in (default: the pipeline's `savepoints.dir`,
    /// `.weir/savepoints` next to the file). A relative path is relative to that savepoint
    /// root; unless `weir run` was started with `--allow-any-savepoint-dir`, the directory
    /// must lie inside the root (no `..`, symlinks resolved). A root on S3 takes `s3://`
    /// URLs under it, and a relative path goes below it.
    pub dir: Option<PathBuf>,
}

/// A savepoint on disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavepointInfo {
    /// The pipeline.
    pub pipeline: String,
    /// The savepoint directory (pass it to `weir run --from-savepoint`).
    pub path: PathBuf,
    /// The checkpoint id it was taken as.
    pub checkpoint: u64,
    /// Bytes of its files.
    pub size: u64,
    /// Trigger to on-disk.
    pub duration_ms: u64,
}

/// Asks to stop one pipeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StopRequest {
    /// Take a savepoint at the stop (sources stop at its barrier, sinks commit).
    pub savepoint: bool,
    /// Drain first: sources end, everything in flight and every `emit: final` result is
    /// flushed to the sinks, then the savepoint is taken.
    pub drain: bool,
    /// Where the savepoint goes (as [`SavepointRequest::dir`], confined the same way).
    pub dir: Option<PathBuf>,
}

/// A stopped pipeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StopOutcome {
    /// The pipeline.
    pub pipeline: String,
    /// The savepoint taken at the stop, if one was asked for.
    pub savepoint: Option<SavepointInfo>,
}

/// Asks for a reload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadRequest {
    /// Compare this file instead of re-reading the running one (with `plan_only`). Only the
    /// running file or a `.yaml`/`.yml` file under its directory is accepted (a relative path
    /// is relative to that directory); anything else is refused unread.
    pub file: Option<PathBuf>,
    /// Print the plan only; change nothing.
    pub plan_only: bool,
    /// Let the reload drop state the new version does not declare (a removed operator, a
    /// removed or renamed state), as `weir run --allow-non-restored-state` does for every
    /// reload of that run.
    #[serde(default)]
    pub allow_non_restored_state: bool,
    /// How long a new version on probation waits for its sources' first records before it
    /// takes its probation checkpoint anyway; `None`: one second. Not part of the API:
    /// `weir test` shortens it, as its inputs come in steps after the reload.
    #[serde(skip)]
    pub probation_idle_wait: Option<std::time::Duration>,
}

/// What a reload did (or, with `plan_only`, would do).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    /// `applied`, `unchanged`, `rejected` (invalid file or plan: nothing changed),
    /// `rolled_back` (the new version failed to start; the old one runs again), `failed`
    /// (even the rollback failed) or `planned` (`plan_only`).
    pub result: String,
    /// Per pipeline of the new file (and removed ones).
    pub pipelines: Vec<PipelineReloadPlan>,
    /// Diagnostics or the error that rejected or rolled back the reload, rendered.
    pub messages: Vec<String>,
    /// The longest pause of a reloaded pipeline (stop of the old version to the new one
    /// running), milliseconds.
    pub pause_ms: Option<u64>,
    /// When the reload finished (Unix milliseconds).
    pub at_ms: u64,
}

/// The reload plan of one pipeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineReloadPlan {
    /// The pipeline.
    pub pipeline: String,
    /// `unchanged` (keeps running, no pause), `changed` (savepoint → new graph → restore),
    /// `added` (starts empty), `removed` (stopped with a savepoint).
    pub change: String,
    /// Per operator, for `changed` pipelines.
    pub operators: Vec<OperatorReloadPlan>,
    /// Reasons the plan cannot be applied (e.g. state of a removed operator would be lost
    /// and `--allow-non-restored-state` is not given; max_parallelism changed).
    pub problems: Vec<String>,
    /// `(old, new)` state backend when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<(String, String)>,
    /// State dropped on purpose: what `--allow-non-restored-state` let through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waived: Vec<String>,
}

/// What happens to one operator's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OperatorReloadPlan {
    /// Operator (or source, or sink) id.
    pub id: String,
    /// `kept` (restored as is), `migrated` (restored through its `migrate(old)`), `dropped`
    /// (the operator is gone; its state is not restored), `new` (starts empty) or
    /// `stateless`.
    pub state: String,
    /// Whether its script changed.
    pub script_changed: bool,
    /// `(old, new)` when the parallelism changed.
    pub parallelism: Option<(u32, u32)>,
    /// Its keyed state moves between subtasks by key-group range (it has keyed state and its
    /// parallelism changed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub key_groups_redistributed: bool,
    /// What happens to each of its named keyed states.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<NamedStateReloadPlan>,
    /// The restored side does not record its declared states (a savepoint of an older Weir):
    /// names and kinds were not compared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unrecorded: bool,
}

/// What happens to one named keyed state of an operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedStateReloadPlan {
    /// The state's name.
    pub name: String,
    /// `kept`, `migrated`, `new` (declared for the first time: starts empty), `dropped`
    /// (not declared any more), `retyped` (its kind changed; `migrate` converts the values)
    /// or `incompatible` (its kind changed and nothing converts the values).
    pub change: String,
    /// Its kind (`value`, `list`, `map`): the declared one, or the recorded one if dropped.
    pub kind: String,
    /// The recorded kind, when it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_kind: Option<String>,
}
