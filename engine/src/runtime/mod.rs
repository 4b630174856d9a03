//! The runtime: tasks, channels, exchanges and metrics.
//!
//! A pipeline runs as one tokio task per (chain, subtask). Records travel in [`Batch`]es on
//! bounded channels; data and control share one channel ([`Message`]), so barriers,
//! watermarks and end-of-stream stay in order with the records. A full channel suspends the
//! sender, which is how a slow sink backpressures the sources. Forward-connected operators of
//! equal parallelism run chained in one task and pass batches by value, with no channel.
//!
//! This module owns the task loop and the exchanges; it never interprets records (operators
//! do) and never reads YAML (the plan and `operators::registry` did).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rhai::Dynamic;

use crate::record::Key;

pub mod dispose;
pub mod error;
pub mod exchange;
pub mod input;
pub mod task;

/// Records per batch that sources and exchanges aim for.
pub const BATCH_SIZE: usize = 1024;

/// Batches a channel holds before its sender waits (the backpressure bound).
pub const CHANNEL_CAPACITY: usize = 16;

/// A batch of records. After a `key_by`, `keys[i]` is the key of `records[i]`; otherwise
/// `keys` is empty.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The records.
    pub records: Vec<Dynamic>,
    /// Their keys, when keyed.
    pub keys: Vec<Key>,
}

impl Batch {
    /// An unkeyed batch.
    pub fn new(records: Vec<Dynamic>) -> Self {
        Self {
            records,
            keys: Vec::new(),
        }
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Whether the records carry keys.
    pub fn is_keyed(&self) -> bool {
        !self.keys.is_empty() && self.keys.len() == self.records.len()
    }

    /// Appends `other`'s records (and keys) to this batch.
    pub fn append(&mut self, other: &mut Batch) {
        self.records.append(&mut other.records);
        self.keys.append(&mut other.keys);
    }
}

/// The records of a batch still to be processed, taken from the front: how the task hands
/// its input to an operator in steps (see [`crate::operators::Operator::process_some`]), and
/// how an oversized batch is cut into [`BATCH_SIZE`] pieces. Taking costs nothing per record
/// beyond the move.
#[derive(Debug, Default)]
pub struct Pending {
    records: std::vec::IntoIter<Dynamic>,
    /// Empty when the batch is not keyed.
    keys: std::vec::IntoIter<Key>,
}

impl Pending {
    /// Every record of `batch`, front first.
    pub fn new(batch: Batch) -> Self {
        let keys = if batch.is_keyed() {
            batch.keys
        } else {
            Vec::new()
        };
        Self {
            records: batch.records.into_iter(),
            keys: keys.into_iter(),
        }
    }

    /// Records left.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether every record was taken.
    pub fn is_empty(&self) -> bool {
        self.records.len() == 0
    }

    /// Whether the records left carry keys.
    pub fn is_keyed(&self) -> bool {
        self.keys.len() > 0 && self.keys.len() == self.records.len()
    }

    /// The records left, front first.
    pub fn records(&self) -> &[Dynamic] {
        self.records.as_slice()
    }

    /// Takes the next record and its key (`None` when the batch is not keyed).
    pub fn next_record(&mut self) -> Option<(Dynamic, Option<Key>)> {
        let r = self.records.next()?;
        Some((r, self.keys.next()))
    }

    /// Takes up to `n` records from the front as a batch. Taking all that is left of an
    /// untouched batch gives its vectors back without copying.
    pub fn take(&mut self, n: usize) -> Batch {
        if n >= self.records.len() {
            return Batch {
                records: std::mem::take(&mut self.records).collect(),
                keys: std::mem::take(&mut self.keys).collect(),
            };
        }
        let keyed = self.keys.len() > 0;
        Batch {
            records: self.records.by_ref().take(n).collect(),
            keys: if keyed {
                self.keys.by_ref().take(n).collect()
            } else {
                Vec::new()
            },
        }
    }
}

/// The kind of a checkpoint barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierKind {
    /// A periodic checkpoint.
    Checkpoint,
    /// A savepoint; the pipeline goes on.
    Savepoint,
    /// A savepoint, then stop.
    SavepointThenStop,
}

/// A checkpoint barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Barrier {
    /// The checkpoint id.
    pub checkpoint: u64,
    /// What it is for.
    pub kind: BarrierKind,
}

/// What travels on a channel: data and control, in order.
#[derive(Debug)]
pub enum Message {
    /// Records.
    Records(Batch),
    /// A checkpoint barrier (aligned by the task loop, not by operators).
    Barrier(Barrier),
    /// Event-time progress in ms.
    Watermark(i64),
    /// The sender will send nothing more.
    EndOfStream,
}

/// Counters of one plan node summed over its subtasks, updated once per batch.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// Records that entered (for a source: produced).
    pub records_in: AtomicU64,
    /// Records that left.
    pub records_out: AtomicU64,
    /// Records that failed and were skipped or dead-lettered (for a source: skipped lines).
    pub errors: AtomicU64,
}

impl NodeMetrics {
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

/// Shared metrics of one node, with its identity for reports.
#[derive(Debug)]
pub struct NodeReport {
    /// The element id.
    pub id: String,
    /// `source`, `operator` or `sink`.
    pub role: &'static str,
    /// The `type:`.
    pub type_name: &'static str,
    /// Its parallelism.
    pub parallelism: u32,
    /// The counters.
    pub metrics: Arc<NodeMetrics>,
}
