//! What travels between tasks: [`Batch`]es of records (and the [`Pending`] view a task hands
//! to an operator in steps) and the [`Message`]s of a channel, where data and control share one
//! stream: records, checkpoint [`Barrier`]s, [`Watermark`]s and end-of-stream. Also the two sizes
//! the runtime is tuned by ([`BATCH_SIZE`], [`CHANNEL_CAPACITY`]).
//!
//! Plain data: nothing here sends, receives or interprets a record.

use rhai::Dynamic;

use crate::record::Key;

/// Records per batch that sources and exchanges aim for.
///
/// Small enough that a batch's records (a few hundred bytes each, parsed on one core and
/// usually read on another) stay in the processor's caches between the task that makes them
/// and the one that takes them: at 1024, W4 ran 20-30 % slower whenever the machine's shared
/// caches were busy, with the same instructions (BENCHMARKS.md, stop 40). Large enough that
/// the per-batch work (a channel send, a wake-up, the metrics) stays far below the per-record.
pub const BATCH_SIZE: usize = 512;

/// Batches a channel holds before its sender waits (the backpressure bound).
pub const CHANNEL_CAPACITY: usize = 16;

/// A batch of records. After a `key_by`, `keys[i]` is the key of `records[i]`; otherwise
/// `keys` is empty. `times[i]`, when present, is the event time of `records[i]` as its source
/// read it (Flink's record timestamp): a source with `event_time` sets them, operators that
/// leave records as they are keep them (the task clears them after any other operator), and a
/// window reads them instead of the record's field. Both vectors are either empty or as long as
/// `records`.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The records.
    pub records: Vec<Dynamic>,
    /// Their keys, when keyed.
    pub keys: Vec<Key>,
    /// Their event times (epoch milliseconds), when carried.
    pub times: Vec<i64>,
}

impl Batch {
    /// An unkeyed batch.
    pub fn new(records: Vec<Dynamic>) -> Self {
        Self {
            records,
            keys: Vec::new(),
            times: Vec::new(),
        }
    }

    /// Whether the records carry their event times.
    pub fn has_times(&self) -> bool {
        !self.times.is_empty() && self.times.len() == self.records.len()
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

    /// Appends `other`'s records (and keys; times only when both carry them) to this batch.
    pub fn append(&mut self, other: &mut Batch) {
        if self.has_times() && other.has_times() {
            self.times.append(&mut other.times);
        } else {
            self.times.clear();
            other.times.clear();
        }
        self.records.append(&mut other.records);
        self.keys.append(&mut other.keys);
    }
}

/// The records of a batch still to be processed, taken from the front: how the task hands
/// its input to an operator in steps (see `Operator::process_some`), and
/// how an oversized batch is cut into [`BATCH_SIZE`] pieces. Taking costs nothing per record
/// beyond the move.
#[derive(Debug, Default)]
pub struct Pending {
    records: std::vec::IntoIter<Dynamic>,
    /// Empty when the batch is not keyed.
    keys: std::vec::IntoIter<Key>,
    /// Empty when the batch carries no event times.
    times: std::vec::IntoIter<i64>,
}

impl Pending {
    /// Every record of `batch`, front first.
    pub fn new(batch: Batch) -> Self {
        let (keyed, timed) = (batch.is_keyed(), batch.has_times());
        let keys = if keyed {
            batch.keys
        } else {
            Vec::new()
        };
        let times = if timed {
            batch.times
        } else {
            Vec::new()
        };
        Self {
            records: batch.records.into_iter(),
            keys: keys.into_iter(),
            times: times.into_iter(),
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
    #[cfg(any(test, feature = "testkit"))]
    pub fn records(&self) -> &[Dynamic] {
        self.records.as_slice()
    }

    /// Takes the next record and its key (`None` when the batch is not keyed).
    pub fn next_record(&mut self) -> Option<(Dynamic, Option<Key>)> {
        let r = self.records.next()?;
        self.times.next();
        Some((r, self.keys.next()))
    }

    /// The record `n` places after the next one (`0`: the next), if there is one.
    pub fn record_ahead(&self, n: usize) -> Option<&Dynamic> {
        self.records.as_slice().get(n)
    }

    /// The key of the record `n` places after the next one (`0`: the next), if the batch is
    /// keyed and has that many records.
    pub fn key_ahead(&self, n: usize) -> Option<&Key> {
        self.keys.as_slice().get(n)
    }

    /// Takes up to `n` records from the front as a batch. Taking all that is left of an
    /// untouched batch gives its vectors back without copying.
    pub fn take(&mut self, n: usize) -> Batch {
        if n >= self.records.len() {
            return Batch {
                records: std::mem::take(&mut self.records).collect(),
                keys: std::mem::take(&mut self.keys).collect(),
                times: std::mem::take(&mut self.times).collect(),
            };
        }
        let keyed = self.keys.len() > 0;
        let timed = self.times.len() > 0;
        Batch {
            records: self.records.by_ref().take(n).collect(),
            keys: if keyed {
                self.keys.by_ref().take(n).collect()
            } else {
                Vec::new()
            },
            times: if timed {
                self.times.by_ref().take(n).collect()
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

impl BarrierKind {
    /// `checkpoint`, `savepoint` or `savepoint then stop`, as the log names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Checkpoint => "checkpoint",
            Self::Savepoint => "savepoint",
            Self::SavepointThenStop => "savepoint then stop",
        }
    }
}

/// A checkpoint barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Barrier {
    /// The checkpoint id.
    pub checkpoint: u64,
    /// What it is for.
    pub kind: BarrierKind,
}

/// The smallest watermark: no event-time progress yet.
pub const WATERMARK_MIN: i64 = i64::MIN;

/// The watermark of an ended input: every event-time timer and window is due.
pub const WATERMARK_END: i64 = i64::MAX;

/// Event-time progress on a channel (Flink's watermark and watermark status in one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watermark {
    /// No record with an event time (epoch milliseconds) at or below this follows on the
    /// channel; [`WATERMARK_END`] when the input ended.
    At(i64),
    /// The sender has nothing to say for now (its splits are idle): the receiver leaves the
    /// channel out of its minimum until the next [`Watermark::At`].
    Idle,
}

/// What travels on a channel: data and control, in order.
#[derive(Debug)]
pub enum Message {
    /// Records.
    Records(Batch),
    /// A checkpoint barrier (aligned by the task loop, not by operators).
    Barrier(Barrier),
    /// Event-time progress of the sender: no record with an earlier event time follows (or
    /// the sender is idle). Travels in order with records and barriers, so it never overtakes
    /// either.
    Watermark(Watermark),
    /// The sender will send nothing more.
    EndOfStream,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(n: i64) -> Batch {
        let mut b = Batch::new((0..n).map(Dynamic::from).collect());
        b.times = (0..n).map(|i| 1000 + i).collect();
        b
    }

    #[test]
    fn event_times_stay_with_their_records_through_steps_and_appends() {
        let mut p = Pending::new(timed(5));
        let (first, _) = p.next_record().expect("a record");
        assert_eq!(first.as_int(), Ok(0));
        let two = p.take(2);
        assert_eq!(two.times, vec![1001, 1002]);
        assert!(two.has_times());
        let rest = p.take(10);
        assert_eq!(rest.times, vec![1003, 1004]);
        // Both carry times: they are kept; one does not: none are.
        let mut a = timed(2);
        a.append(&mut timed(3));
        assert_eq!(a.times, vec![1000, 1001, 1000, 1001, 1002]);
        a.append(&mut Batch::new(vec![Dynamic::from(9_i64)]));
        assert!(!a.has_times() && a.times.is_empty() && a.len() == 6);
        // Times that do not line up with the records are not handed on.
        let mut odd = timed(3);
        odd.times.pop();
        assert!(!odd.has_times());
        assert!(Pending::new(odd).take(3).times.is_empty());
    }
}

