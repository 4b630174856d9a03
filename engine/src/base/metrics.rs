//! The metrics of a run: per-subtask counters ([`SubtaskMetrics`]) grouped per plan node
//! ([`NodeMetrics`]), the identity a report names them by ([`NodeReport`]), and the store
//! that keeps a pipeline's figures for the whole run ([`PipelineMetrics`]): every generation
//! of a pipeline (hot reloads) and every restart of its tasks gets its counters from the same
//! store, so counters keep counting.
//!
//! Each subtask owns its counters (aligned to their own cache lines: no contention between
//! cores); tasks add to them once per batch, never per record. The job reads them for its
//! status, `/metrics` and the final summary. Nothing here knows tasks, plans or the control
//! surface.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The instant every `*_at` figure of this process counts from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`], plus one (0 means "never").
fn stamp_now() -> u64 {
    epoch().elapsed().as_nanos() as u64 + 1
}

/// The instant a stamp of [`stamp_now`] stands for, or `None` for 0.
fn stamp_instant(stamp: u64) -> Option<Instant> {
    (stamp > 0).then(|| epoch() + Duration::from_nanos(stamp - 1))
}

/// A lag gauge that was never set.
const NO_LAG: u64 = u64::MAX;

/// Counters of one subtask of one plan node, updated once per batch by the task that runs it.
///
/// Aligned to two cache lines so that subtasks running on different cores never share one.
#[derive(Debug)]
#[repr(align(128))]
pub struct SubtaskMetrics {
    /// Whether the optional per-batch figures (busy and backpressured time, queue fill, lag)
    /// are measured; record counters always are.
    pub detailed: bool,
    /// Records that entered (for a source: produced).
    pub records_in: AtomicU64,
    /// Records that left.
    pub records_out: AtomicU64,
    /// Records that failed and were skipped or dead-lettered (for a source: skipped lines).
    pub errors: AtomicU64,
    /// Of `errors`, the ones sent to a dead-letter output.
    pub dead_lettered: AtomicU64,
    /// Late records (a `window`'s) dropped and counted.
    pub late_dropped: AtomicU64,
    /// Late records sent to a `late` output.
    pub late_sent: AtomicU64,
    /// Bytes read from outside (file sources).
    pub bytes_read: AtomicU64,
    /// Nanoseconds spent processing.
    pub busy_ns: AtomicU64,
    /// Nanoseconds spent waiting for room downstream.
    pub backpressured_ns: AtomicU64,
    /// How full the input queue was at the last batch taken, in thousandths.
    pub queue_fill_milli: AtomicU64,
    /// Bytes (or records) behind the end of the input; `u64::MAX` when unknown.
    pub lag: AtomicU64,
    /// When the first record entered (a stamp; 0: none yet).
    first_in: AtomicU64,
    /// Sources with partitions (Kafka): where each one is, as last asked.
    partitions: Mutex<Vec<PartitionProgress>>,
}

/// Where a source subtask is in one partition of its input (a Kafka topic partition), for
/// `weir status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionProgress {
    /// The partition, `topic/number`.
    pub partition: String,
    /// The offset of the next message to read.
    pub offset: i64,
    /// Messages between it and the end of the partition, when known.
    pub lag: Option<u64>,
}

impl Default for SubtaskMetrics {
    fn default() -> Self {
        Self::new(true)
    }
}

impl SubtaskMetrics {
    /// Fresh counters; `detailed` turns the optional per-batch figures on.
    pub fn new(detailed: bool) -> Self {
        Self {
            detailed,
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            late_dropped: AtomicU64::new(0),
            late_sent: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            queue_fill_milli: AtomicU64::new(0),
            lag: AtomicU64::new(NO_LAG),
            first_in: AtomicU64::new(0),
            partitions: Mutex::new(Vec::new()),
        }
    }

    /// Adds to the record counters (and notes when the first record entered).
    pub fn add(&self, records_in: u64, records_out: u64, errors: u64) {
        if records_in > 0 && self.records_in.fetch_add(records_in, Ordering::Relaxed) == 0 {
            let _ = self.first_in.compare_exchange(
                0,
                stamp_now(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        if records_out > 0 {
            self.records_out.fetch_add(records_out, Ordering::Relaxed);
        }
        if errors > 0 {
            self.errors.fetch_add(errors, Ordering::Relaxed);
        }
    }

    /// Adds `n` dead-lettered records (already counted in `errors`).
    pub fn add_dead_lettered(&self, n: u64) {
        if n > 0 {
            self.dead_lettered.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Adds late records: `dropped` ones, and `sent` ones to a `late` output.
    pub fn add_late(&self, dropped: u64, sent: u64) {
        if dropped > 0 {
            self.late_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        if sent > 0 {
            self.late_sent.fetch_add(sent, Ordering::Relaxed);
        }
    }

    /// Adds `n` bytes read.
    pub fn add_bytes_read(&self, n: u64) {
        if n > 0 {
            self.bytes_read.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Adds processing time and time spent waiting for room downstream.
    pub fn add_time(&self, busy: Duration, backpressured: Duration) {
        let busy = busy.as_nanos() as u64;
        let bp = backpressured.as_nanos() as u64;
        if busy > 0 {
            self.busy_ns.fetch_add(busy, Ordering::Relaxed);
        }
        if bp > 0 {
            self.backpressured_ns.fetch_add(bp, Ordering::Relaxed);
        }
    }

    /// Sets the input queue fill (0.0 to 1.0).
    pub fn set_queue_fill(&self, fill: f64) {
        let milli = (fill.clamp(0.0, 1.0) * 1000.0).round() as u64;
        self.queue_fill_milli.store(milli, Ordering::Relaxed);
    }

    /// Sets the lag (bytes or records behind the end of the input), or forgets it.
    pub fn set_lag(&self, lag: Option<u64>) {
        self.lag
            .store(lag.unwrap_or(NO_LAG), Ordering::Relaxed);
    }

    /// Sets where the source is in each of its partitions (empty: it has none).
    pub fn set_partitions(&self, partitions: Vec<PartitionProgress>) {
        *self.partitions.lock().unwrap_or_else(|e| e.into_inner()) = partitions;
    }

    /// A snapshot of the record counters `(in, out, errors)`.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.records_in.load(Ordering::Relaxed),
            self.records_out.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }

    /// A snapshot of every figure.
    pub fn figures(&self) -> SubtaskFigures {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let errors = load(&self.errors);
        let dead_lettered = load(&self.dead_lettered).min(errors);
        let lag = load(&self.lag);
        SubtaskFigures {
            records_in: load(&self.records_in),
            records_out: load(&self.records_out),
            errors,
            skipped: errors - dead_lettered,
            dead_lettered,
            late_dropped: load(&self.late_dropped),
            late_sent: load(&self.late_sent),
            bytes_read: load(&self.bytes_read),
            busy: Duration::from_nanos(load(&self.busy_ns)),
            backpressured: Duration::from_nanos(load(&self.backpressured_ns)),
            queue_fill: load(&self.queue_fill_milli) as f64 / 1000.0,
            lag: (lag != NO_LAG).then_some(lag),
            partitions: self
                .partitions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// When the first record entered, if one did.
    pub fn first_in(&self) -> Option<Instant> {
        stamp_instant(self.first_in.load(Ordering::Relaxed))
    }
}

/// A snapshot of one subtask's figures ([`SubtaskMetrics::figures`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SubtaskFigures {
    /// Records that entered (a source: produced).
    pub records_in: u64,
    /// Records that left.
    pub records_out: u64,
    /// Records that failed (skipped or dead-lettered).
    pub errors: u64,
    /// Failed records dropped.
    pub skipped: u64,
    /// Failed records sent to a dead-letter output.
    pub dead_lettered: u64,
    /// Late records (a `window`'s) dropped.
    pub late_dropped: u64,
    /// Late records sent to a `late` output.
    pub late_sent: u64,
    /// Bytes read (file sources).
    pub bytes_read: u64,
    /// Time spent processing.
    pub busy: Duration,
    /// Time spent waiting for room downstream.
    pub backpressured: Duration,
    /// Input queue fill at the last batch, 0.0 to 1.0.
    pub queue_fill: f64,
    /// Bytes or records behind the end of the input, when known.
    pub lag: Option<u64>,
    /// Sources with partitions: where each one is.
    pub partitions: Vec<PartitionProgress>,
}

/// The counters of one plan node in the current generation: one [`SubtaskMetrics`] per
/// subtask, taken from the pipeline's [`PipelineMetrics`].
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// Per subtask, by index.
    pub subtasks: Vec<Arc<SubtaskMetrics>>,
}

impl NodeMetrics {
    /// The counters of subtask `s` (a fresh, unshared set when `s` is out of range).
    pub fn subtask(&self, s: u32) -> Arc<SubtaskMetrics> {
        self.subtasks
            .get(s as usize)
            .map(Arc::clone)
            .unwrap_or_default()
    }
}

/// Checkpoint figures of a pipeline over the whole run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointFigures {
    /// Checkpoints (and savepoints) completed.
    pub completed: u64,
    /// Checkpoints aborted (declined, timed out, failed to write).
    pub failed: u64,
    /// Checkpoints triggered and not completed or aborted yet.
    pub in_progress: u64,
    /// The last completed one: `(id, trigger-to-completion, size, new bytes)`.
    pub last: Option<LastCheckpoint>,
    /// The last completed one's alignment per `(task head, subtask)`.
    pub alignment: Vec<(String, u32, Duration)>,
}

/// Figures of the last completed checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastCheckpoint {
    /// Its id.
    pub id: u64,
    /// Trigger to completion.
    pub duration: Duration,
    /// Bytes of every file it references.
    pub size: u64,
    /// Bytes the previous one did not reference.
    pub new_bytes: u64,
    /// Bytes of channel state (unaligned checkpoints), over every subtask.
    pub channel_state_bytes: u64,
}

/// Keyed and local state held by one operator, as of the last completed checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateSize {
    /// The operator (source, sink) id.
    pub operator: String,
    /// The state backend (`memory`, `fs`, `rocksdb`).
    pub backend: String,
    /// Bytes of its files in the checkpoint, summed over subtasks.
    pub bytes: u64,
}

/// Everything the job keeps of one pipeline's figures across generations and restarts.
#[derive(Debug)]
pub struct PipelineMetrics {
    /// Whether the optional per-batch figures are measured (see [`SubtaskMetrics::detailed`]).
    detailed: bool,
    /// Per element id, every subtask that ever ran (a rescale adds subtasks; the ones it
    /// drops keep their counts).
    elements: Mutex<BTreeMap<String, Vec<Arc<SubtaskMetrics>>>>,
    /// Task restarts after failures.
    pub restarts: AtomicU64,
    checkpoints: Mutex<CheckpointFigures>,
    state: Mutex<Vec<StateSize>>,
}

impl Default for PipelineMetrics {
    fn default() -> Self {
        Self::new(true)
    }
}

impl PipelineMetrics {
    /// An empty store; `detailed` turns the optional per-batch figures on.
    pub fn new(detailed: bool) -> Self {
        Self {
            detailed,
            elements: Mutex::default(),
            restarts: AtomicU64::new(0),
            checkpoints: Mutex::default(),
            state: Mutex::default(),
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The counters of `element`'s subtasks `0..parallelism`, created on first use and the
    /// same ones every later generation gets.
    pub fn node(&self, element: &str, parallelism: u32) -> Arc<NodeMetrics> {
        let mut elements = Self::lock(&self.elements);
        let subtasks = elements.entry(element.to_owned()).or_default();
        while subtasks.len() < parallelism.max(1) as usize {
            subtasks.push(Arc::new(SubtaskMetrics::new(self.detailed)));
        }
        Arc::new(NodeMetrics {
            subtasks: subtasks[..parallelism.max(1) as usize].to_vec(),
        })
    }

    /// Every subtask of `element` that ever ran, by index (empty when unknown).
    pub fn subtasks(&self, element: &str) -> Vec<Arc<SubtaskMetrics>> {
        Self::lock(&self.elements)
            .get(element)
            .cloned()
            .unwrap_or_default()
    }

    /// `element`'s record counters `(in, out, errors)` over every subtask that ever ran.
    pub fn totals(&self, element: &str) -> (u64, u64, u64) {
        self.subtasks(element)
            .iter()
            .fold((0, 0, 0), |(i, o, e), m| {
                let (mi, mo, me) = m.read();
                (i + mi, o + mo, e + me)
            })
    }

    /// When the first record entered any subtask of `element`, if one did.
    pub fn first_in(&self, element: &str) -> Option<Instant> {
        self.subtasks(element)
            .iter()
            .filter_map(|m| m.first_in())
            .min()
    }

    /// Sets the number of checkpoints in flight.
    pub fn set_checkpoints_in_progress(&self, n: u64) {
        Self::lock(&self.checkpoints).in_progress = n;
    }

    /// Notes a checkpoint completed with these figures and per-subtask alignments. Only the
    /// `newest` (the restore point it became) replaces the "last checkpoint" figures: a
    /// savepoint completing after a newer checkpoint is counted but does not move them back.
    pub fn checkpoint_completed(
        &self,
        last: LastCheckpoint,
        alignment: Vec<(String, u32, Duration)>,
        newest: bool,
    ) {
        let mut c = Self::lock(&self.checkpoints);
        c.completed += 1;
        if newest {
            c.last = Some(last);
            c.alignment = alignment;
        }
    }

    /// Notes a checkpoint aborted.
    pub fn checkpoint_failed(&self) {
        Self::lock(&self.checkpoints).failed += 1;
    }

    /// A generation ended: nothing of it is in progress any more.
    pub fn generation_ended(&self) {
        Self::lock(&self.checkpoints).in_progress = 0;
    }

    /// The checkpoint figures.
    pub fn checkpoints(&self) -> CheckpointFigures {
        Self::lock(&self.checkpoints).clone()
    }

    /// Replaces the state sizes (from the last completed checkpoint).
    pub fn set_state_sizes(&self, sizes: Vec<StateSize>) {
        *Self::lock(&self.state) = sizes;
    }

    /// The state sizes of the last completed checkpoint.
    pub fn state_sizes(&self) -> Vec<StateSize> {
        Self::lock(&self.state).clone()
    }
}

/// Shared metrics of one node, with its identity for reports.
#[derive(Debug)]
pub struct NodeReport {
    /// The element id.
    pub id: String,
    /// Source, operator or sink.
    pub role: Role,
    /// The `type:`.
    pub type_name: &'static str,
    /// Its parallelism.
    pub parallelism: u32,
    /// The counters.
    pub metrics: Arc<NodeMetrics>,
}

/// The part a node plays in its pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Reads records from outside.
    Source,
    /// Transforms records.
    Operator,
    /// Writes records out.
    Sink,
}

impl Role {
    /// `source`, `operator` or `sink`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Operator => "operator",
            Role::Sink => "sink",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_generation_gets_the_same_counters_and_a_rescale_keeps_the_dropped_ones() {
        let store = PipelineMetrics::new(true);
        let first = store.node("map", 2);
        first.subtask(0).add(10, 9, 1);
        first.subtask(1).add(5, 5, 0);
        first.subtask(0).add_dead_lettered(1);
        // A reload at parallelism 3, then one at 1: the counters go on.
        let second = store.node("map", 3);
        assert!(Arc::ptr_eq(&second.subtasks[0], &first.subtasks[0]));
        second.subtask(2).add(1, 1, 0);
        let third = store.node("map", 1);
        third.subtask(0).add(4, 4, 0);
        assert_eq!(third.subtasks[0].read(), (14, 13, 1));
        assert_eq!(store.totals("map"), (20, 19, 1));
        assert_eq!(store.subtasks("map").len(), 3);
        let f = store.subtasks("map")[0].figures();
        assert_eq!((f.skipped, f.dead_lettered), (0, 1));
        assert_eq!(store.totals("gone"), (0, 0, 0));
    }

    #[test]
    fn the_first_record_is_stamped_once() {
        let m = SubtaskMetrics::new(false);
        assert!(m.first_in().is_none());
        m.add(0, 0, 0);
        assert!(m.first_in().is_none());
        m.add(3, 0, 0);
        let first = m.first_in();
        assert!(first.is_some());
        m.add(3, 0, 0);
        assert_eq!(m.first_in(), first);
    }

    #[test]
    fn gauges_clamp_and_forget() {
        let m = SubtaskMetrics::default();
        assert_eq!(m.figures().lag, None);
        m.set_lag(Some(42));
        m.set_queue_fill(1.7);
        let f = m.figures();
        assert_eq!((f.lag, f.queue_fill), (Some(42), 1.0));
        m.set_lag(None);
        assert_eq!(m.figures().lag, None);
        m.add_time(Duration::from_millis(3), Duration::from_millis(2));
        let f = m.figures();
        assert_eq!(
            (f.busy, f.backpressured),
            (Duration::from_millis(3), Duration::from_millis(2))
        );
    }

    #[test]
    fn checkpoints_count_across_generations() {
        let store = PipelineMetrics::default();
        store.set_checkpoints_in_progress(2);
        store.checkpoint_failed();
        store.checkpoint_completed(
            LastCheckpoint {
                id: 2,
                duration: Duration::from_millis(5),
                size: 100,
                new_bytes: 40,
                channel_state_bytes: 0,
            },
            vec![("map".into(), 0, Duration::from_millis(1))],
            true,
        );
        store.set_checkpoints_in_progress(1);
        store.generation_ended();
        let c = store.checkpoints();
        assert_eq!((c.completed, c.failed, c.in_progress), (1, 1, 0));
        assert_eq!(c.last.map(|l| l.size), Some(100));
    }

    #[test]
    fn a_late_savepoint_is_counted_but_does_not_replace_the_last_checkpoint() {
        let store = PipelineMetrics::default();
        let figures = |id, size| LastCheckpoint {
            id,
            duration: Duration::from_millis(5),
            size,
            new_bytes: 0,
            channel_state_bytes: 0,
        };
        store.checkpoint_completed(figures(3, 300), vec![("map".into(), 0, Duration::ZERO)], true);
        store.checkpoint_completed(
            figures(2, 200),
            vec![("map".into(), 0, Duration::from_millis(9))],
            false,
        );
        let c = store.checkpoints();
        assert_eq!(c.completed, 2);
        assert_eq!(c.last.map(|l| (l.id, l.size)), Some((3, 300)));
        assert_eq!(c.alignment, vec![("map".to_owned(), 0, Duration::ZERO)]);
    }
}
