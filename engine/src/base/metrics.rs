//! Per-subtask counters ([`SubtaskMetrics`]), grouped per plan node ([`NodeMetrics`]), and the
//! identity a report names them by ([`NodeReport`]). Each subtask owns its counters (no
//! contention between cores); tasks add to them once per batch; the job reads them for status
//! and the final summary.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one subtask of one plan node, updated once per batch by the task that runs it.
///
/// Aligned to two cache lines so that subtasks running on different cores never share one.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct SubtaskMetrics {
    /// Records that entered (for a source: produced).
    pub records_in: AtomicU64,
    /// Records that left.
    pub records_out: AtomicU64,
    /// Records that failed and were skipped or dead-lettered (for a source: skipped lines).
    pub errors: AtomicU64,
}

impl SubtaskMetrics {
    /// Adds to the counters.
    pub fn add(&self, records_in: u64, records_out: u64, errors: u64) {
        if records_in > 0 {
            self.records_in.fetch_add(records_in, Ordering::Relaxed);
        }
        if records_out > 0 {
            self.records_out.fetch_add(records_out, Ordering::Relaxed);
        }
        if errors > 0 {
            self.errors.fetch_add(errors, Ordering::Relaxed);
        }
    }

    /// A snapshot of the counters `(in, out, errors)`.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.records_in.load(Ordering::Relaxed),
            self.records_out.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// The counters of one plan node: one [`SubtaskMetrics`] per subtask.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// Per subtask, by index.
    pub subtasks: Vec<Arc<SubtaskMetrics>>,
}

impl NodeMetrics {
    /// Fresh counters for `parallelism` subtasks.
    pub fn new(parallelism: u32) -> Self {
        Self {
            subtasks: (0..parallelism.max(1))
                .map(|_| Arc::new(SubtaskMetrics::default()))
                .collect(),
        }
    }

    /// The counters of subtask `s` (a fresh, unshared set when `s` is out of range).
    pub fn subtask(&self, s: u32) -> Arc<SubtaskMetrics> {
        self.subtasks
            .get(s as usize)
            .map(Arc::clone)
            .unwrap_or_default()
    }

    /// The counters `(in, out, errors)` summed over the subtasks.
    pub fn read(&self) -> (u64, u64, u64) {
        self.subtasks.iter().fold((0, 0, 0), |(i, o, e), m| {
            let (mi, mo, me) = m.read();
            (i + mi, o + mo, e + me)
        })
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
