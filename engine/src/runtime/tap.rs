//! Taps: live samples of the records an operator receives or emits, for `weir tap`.
//!
//! A [`TapRegistry`] belongs to a pipeline, not to one run of its tasks: the job keeps one per
//! pipeline id and hands it to every generation (restarts, hot reloads), so a tap opened
//! before a reload keeps receiving from the new version's tasks. Tasks look at it once per
//! batch: while no tap is open that is one relaxed atomic load ([`TapRegistry::is_active`]),
//! and while one is open, one more load per node ([`TapRegistry::offer_cached`]: each task
//! keeps the list of taps on its own nodes in a [`TapCursor`] and looks at the shared list
//! only when a tap opens or closes).
//! An open tap samples records (every record, or a deterministic fraction by a counter) and
//! offers copies with `try_send` into its bounded channel: a task never waits for a tap. When
//! the channel is full the record is dropped and counted ([`TapReceiver::dropped`]), so a
//! slow reader costs the pipeline at most the copies that fit. A tap also delivers at most
//! [`MAX_RECORDS_PER_SECOND`] records a second (the rest count as dropped): copying and
//! encoding every record of a fast operator would cost as much as the pipeline itself.
//!
//! This module owns the sampling and the channel; what a tap's reader shows, when a tap ends
//! and why (a limit, a reload that removed the operator, the pipeline's end) is the job's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::mpsc;

use crate::record::Record;

/// Which records of an operator a tap sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapSide {
    /// The records it receives (a sink's: what it writes).
    Input,
    /// The records it emits (a source's: what it produces).
    Output,
}

/// The most records one tap takes per second, whatever its sample rate: the bound on what a
/// tap costs the pipeline (copies, and their encoding for the reader).
pub const MAX_RECORDS_PER_SECOND: u64 = 1_000;

/// One sampled record.
#[derive(Debug)]
pub struct TapRecord {
    /// The subtask that saw it.
    pub subtask: u32,
    /// A copy of the record.
    pub record: Record,
}

/// One open tap, as tasks see it.
#[derive(Debug)]
struct Tap {
    id: u64,
    operator: String,
    side: TapSide,
    /// Fraction of records taken, in `(0, 1]`.
    rate: f64,
    /// Records seen so far (taken or not), over every subtask: the sampling counter.
    seen: AtomicU64,
    /// Records taken that did not fit in the channel, or beyond the rate bound.
    dropped: Arc<AtomicU64>,
    sender: mpsc::Sender<TapRecord>,
    /// When it was opened: the rate bound counts per whole second since.
    opened: Instant,
    /// The second (since `opened`) `in_second` counts for.
    second: AtomicU64,
    /// Records taken in that second.
    in_second: AtomicU64,
}

impl Tap {
    /// Samples `records` and offers the copies; never waits.
    fn offer(&self, subtask: u32, records: &[Record]) {
        let start = self
            .seen
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        // One clock read per batch: a new second restarts the count (a race between subtasks
        // at the turn of a second lets a few records more through, never fewer).
        let now = self.opened.elapsed().as_secs();
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.in_second.store(0, Ordering::Relaxed);
        }
        if self.in_second.load(Ordering::Relaxed) >= MAX_RECORDS_PER_SECOND {
            // Over the bound for this second: the whole batch is dropped, counted without
            // looking at a record.
            let left = sampled_count(start, records.len() as u64, self.rate);
            self.dropped.fetch_add(left, Ordering::Relaxed);
            return;
        }
        for (i, record) in records.iter().enumerate() {
            if !sampled(start + i as u64, self.rate) {
                continue;
            }
            if self.in_second.fetch_add(1, Ordering::Relaxed) >= MAX_RECORDS_PER_SECOND {
                let at = start + i as u64;
                let left = sampled_count(at, records.len() as u64 - i as u64, self.rate);
                self.dropped.fetch_add(left, Ordering::Relaxed);
                return;
            }
            match self.sender.try_reserve() {
                Ok(permit) => permit.send(TapRecord {
                    subtask,
                    record: record.clone(),
                }),
                Err(mpsc::error::TrySendError::Full(())) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(mpsc::error::TrySendError::Closed(())) => return,
            }
        }
    }
}

/// Whether the `n`-th record (from 0) is taken at `rate`: exactly `floor(n * rate)` of the
/// first `n` records are, evenly spread (every record at 1, every tenth at 0.1).
pub fn sampled(n: u64, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    ((n + 1) as f64 * rate).floor() > (n as f64 * rate).floor()
}

/// How many of the records `from..from + len` are [`sampled`] at `rate` (the count telescopes:
/// `floor((from + len) * rate) - floor(from * rate)`).
fn sampled_count(from: u64, len: u64, rate: f64) -> u64 {
    if rate >= 1.0 {
        return len;
    }
    ((from + len) as f64 * rate).floor() as u64 - (from as f64 * rate).floor() as u64
}

/// One task's view of the taps open on one side of one of its nodes, refreshed from the
/// registry only when a tap opens or closes ([`TapRegistry::offer_cached`]).
#[derive(Debug, Default)]
pub struct TapCursor {
    /// The registry's version the list was taken at (`0`, like a registry no tap ever opened
    /// on: both lists empty).
    version: u64,
    taps: Vec<Arc<Tap>>,
}

/// The open taps of one pipeline, shared by all its generations' tasks.
#[derive(Debug, Default)]
pub struct TapRegistry {
    /// How many taps are open (the tasks' fast check).
    active: AtomicUsize,
    taps: Mutex<Vec<Arc<Tap>>>,
    next_id: AtomicU64,
    /// Bumped (under the lock) whenever a tap opens or closes: the tasks' [`TapCursor`]s
    /// compare it with theirs.
    version: AtomicU64,
}

impl TapRegistry {
    /// Whether any tap is open: one relaxed load, checked by tasks once per batch.
    #[inline]
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed) != 0
    }

    /// Opens a tap on `side` of `operator`, taking the fraction `rate` (clamped to `(0, 1]`)
    /// of its records into a channel of `capacity` records. The tap stays open until the
    /// receiver is dropped.
    pub fn open(
        self: &Arc<Self>,
        operator: &str,
        side: TapSide,
        rate: f64,
        capacity: usize,
    ) -> TapReceiver {
        let (sender, records) = mpsc::channel(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rate = if rate.is_finite() && rate > 0.0 {
            rate.min(1.0)
        } else {
            1.0
        };
        let tap = Arc::new(Tap {
            id,
            operator: operator.to_owned(),
            side,
            rate,
            seen: AtomicU64::new(0),
            dropped: Arc::clone(&dropped),
            sender,
            opened: Instant::now(),
            second: AtomicU64::new(0),
            in_second: AtomicU64::new(0),
        });
        let mut taps = self.taps.lock().unwrap_or_else(PoisonError::into_inner);
        taps.push(tap);
        self.active.store(taps.len(), Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Release);
        TapReceiver {
            records,
            dropped,
            registry: Arc::clone(self),
            id,
        }
    }

    /// Offers what `operator`'s `subtask` received or emitted to the taps open on it. Call
    /// only when [`is_active`](Self::is_active) said so.
    pub fn offer(&self, operator: &str, side: TapSide, subtask: u32, records: &[Record]) {
        if records.is_empty() {
            return;
        }
        for tap in self.taps_on(operator, side) {
            tap.offer(subtask, records);
        }
    }

    /// [`offer`](Self::offer) for a task that calls it for every batch: the taps on
    /// `operator`'s `side` are taken from `cursor`, which is refreshed from the shared list
    /// only when a tap opened or closed since. A task whose nodes nobody taps thus pays one
    /// atomic load, no lock and no allocation, while another operator is tapped.
    pub fn offer_cached(
        &self,
        cursor: &mut TapCursor,
        operator: &str,
        side: TapSide,
        subtask: u32,
        records: &[Record],
    ) {
        // Read before the list: a change after this load is seen at the next batch.
        let version = self.version.load(Ordering::Acquire);
        if version != cursor.version {
            cursor.taps = self.taps_on(operator, side);
            cursor.version = version;
        }
        if records.is_empty() {
            return;
        }
        for tap in &cursor.taps {
            tap.offer(subtask, records);
        }
    }

    fn taps_on(&self, operator: &str, side: TapSide) -> Vec<Arc<Tap>> {
        self.taps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|t| t.side == side && t.operator == operator)
            .cloned()
            .collect()
    }

    fn close(&self, id: u64) {
        let mut taps = self.taps.lock().unwrap_or_else(PoisonError::into_inner);
        taps.retain(|t| t.id != id);
        self.active.store(taps.len(), Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Release);
    }
}

/// The reading end of a tap; dropping it closes the tap.
#[derive(Debug)]
pub struct TapReceiver {
    records: mpsc::Receiver<TapRecord>,
    dropped: Arc<AtomicU64>,
    registry: Arc<TapRegistry>,
    id: u64,
}

impl TapReceiver {
    /// The next sampled record (waits for one).
    pub async fn recv(&mut self) -> Option<TapRecord> {
        self.records.recv().await
    }

    /// A record already waiting, if any.
    pub fn try_recv(&mut self) -> Option<TapRecord> {
        self.records.try_recv().ok()
    }

    /// Sampled records dropped so far because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for TapReceiver {
    fn drop(&mut self) {
        self.registry.close(self.id);
    }
}

#[cfg(test)]
mod tests {
    use rhai::Dynamic;

    use super::*;

    fn records(range: std::ops::Range<i64>) -> Vec<Record> {
        range.map(Dynamic::from).collect()
    }

    #[test]
    fn sampling_takes_an_even_fraction() {
        let taken = |rate: f64| (0..1000).filter(|&n| sampled(n, rate)).count();
        assert_eq!(taken(1.0), 1000);
        assert_eq!(taken(0.5), 500);
        assert_eq!(taken(0.1), 100);
        assert_eq!(taken(0.001), 1);
        let tenth: Vec<u64> = (0..30).filter(|&n| sampled(n, 0.1)).collect();
        assert_eq!(tenth, [9, 19, 29]);
    }

    #[tokio::test]
    async fn a_tap_sees_its_operator_and_side_only_and_closes_when_dropped() {
        let registry = Arc::new(TapRegistry::default());
        assert!(!registry.is_active());
        let mut rx = registry.open("map", TapSide::Output, 1.0, 16);
        assert!(registry.is_active());
        registry.offer("other", TapSide::Output, 0, &records(0..3));
        registry.offer("map", TapSide::Input, 0, &records(0..3));
        registry.offer("map", TapSide::Output, 1, &records(7..9));
        let first = rx.recv().await.expect("a record");
        assert_eq!(first.subtask, 1);
        assert_eq!(first.record.as_int().ok(), Some(7));
        assert_eq!(rx.try_recv().map(|r| r.record.as_int().ok()), Some(Some(8)));
        assert!(rx.try_recv().is_none());
        drop(rx);
        assert!(!registry.is_active());
    }

    #[test]
    fn a_full_tap_drops_and_counts_instead_of_waiting() {
        let registry = Arc::new(TapRegistry::default());
        let mut rx = registry.open("map", TapSide::Input, 1.0, 4);
        registry.offer("map", TapSide::Input, 0, &records(0..10));
        assert_eq!(rx.dropped(), 6);
        let kept: Vec<i64> = std::iter::from_fn(|| rx.try_recv())
            .filter_map(|r| r.record.as_int().ok())
            .collect();
        assert_eq!(kept, [0, 1, 2, 3]);
        // Sampled at a half, over batches: the counter runs on across calls.
        let mut half = registry.open("map", TapSide::Output, 0.5, 100);
        registry.offer("map", TapSide::Output, 0, &records(0..3));
        registry.offer("map", TapSide::Output, 0, &records(3..6));
        let taken: Vec<i64> = std::iter::from_fn(|| half.try_recv())
            .filter_map(|r| r.record.as_int().ok())
            .collect();
        assert_eq!(taken, [1, 3, 5]);
        assert_eq!(half.dropped(), 0);
    }

    #[test]
    fn the_sampled_count_of_a_range_is_what_sampled_takes() {
        for rate in [1.0, 0.5, 0.3, 0.1, 0.01, 0.001] {
            for from in [0, 1, 7, 99, 1000, 123_456] {
                for len in [0, 1, 2, 10, 333, 1024] {
                    let counted = (from..from + len).filter(|&n| sampled(n, rate)).count();
                    assert_eq!(
                        sampled_count(from, len, rate),
                        counted as u64,
                        "rate {rate}, from {from}, len {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_cursor_follows_taps_opening_and_closing_and_ignores_other_operators() {
        let registry = Arc::new(TapRegistry::default());
        let mut map_out = TapCursor::default();
        let mut sink_in = TapCursor::default();
        registry.offer_cached(&mut map_out, "map", TapSide::Output, 0, &records(0..2));
        assert!(map_out.taps.is_empty());
        let mut rx = registry.open("map", TapSide::Output, 1.0, 16);
        registry.offer_cached(&mut map_out, "map", TapSide::Output, 0, &records(0..2));
        registry.offer_cached(&mut sink_in, "sink", TapSide::Input, 0, &records(5..9));
        assert_eq!(map_out.taps.len(), 1);
        assert!(sink_in.taps.is_empty());
        let got: Vec<i64> = std::iter::from_fn(|| rx.try_recv())
            .filter_map(|r| r.record.as_int().ok())
            .collect();
        assert_eq!(got, [0, 1]);
        // A second tap on the same operator reaches the cursor at its next batch.
        let mut second = registry.open("map", TapSide::Output, 1.0, 16);
        registry.offer_cached(&mut map_out, "map", TapSide::Output, 1, &records(2..3));
        assert_eq!(rx.try_recv().map(|r| r.subtask), Some(1));
        assert_eq!(second.try_recv().map(|r| r.subtask), Some(1));
        // Closing both leaves the cursor empty again.
        drop(rx);
        drop(second);
        registry.offer_cached(&mut map_out, "map", TapSide::Output, 0, &records(3..4));
        assert!(map_out.taps.is_empty());
    }

    #[test]
    fn over_the_bound_a_whole_batch_is_counted_as_dropped() {
        let registry = Arc::new(TapRegistry::default());
        let mut rx = registry.open("map", TapSide::Input, 0.5, 10_000);
        let n = (2 * MAX_RECORDS_PER_SECOND) as i64;
        registry.offer("map", TapSide::Input, 0, &records(0..n));
        let first = std::iter::from_fn(|| rx.try_recv()).count() as u64;
        // Another batch in the same second: nothing more gets through, all of it counted.
        registry.offer("map", TapSide::Input, 0, &records(n..n + 101));
        let second = std::iter::from_fn(|| rx.try_recv()).count() as u64;
        let sampled_in_all = sampled_count(0, n as u64 + 101, 0.5);
        assert_eq!(first + second + rx.dropped(), sampled_in_all);
        // Unless the second turned between the batches, only the first delivered.
        assert!(second == 0 || first + second <= 2 * MAX_RECORDS_PER_SECOND);
    }

    #[test]
    fn a_tap_takes_at_most_its_rate_bound_per_second() {
        let registry = Arc::new(TapRegistry::default());
        let mut rx = registry.open("map", TapSide::Input, 1.0, 10_000);
        let n = (MAX_RECORDS_PER_SECOND + 500) as i64;
        // Two batches within the first second (the test does not wait a second).
        registry.offer("map", TapSide::Input, 0, &records(0..n / 2));
        registry.offer("map", TapSide::Input, 1, &records(n / 2..n));
        let kept = std::iter::from_fn(|| rx.try_recv()).count() as u64;
        // Unless the second turned between the two batches, exactly the bound got through.
        assert!(
            kept == MAX_RECORDS_PER_SECOND || kept == n as u64,
            "{kept} records delivered"
        );
        assert_eq!(kept + rx.dropped(), n as u64);
    }
}
