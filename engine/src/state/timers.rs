//! Keyed timers: the event-time and processing-time timers of one operator subtask, as Flink's
//! timer service keeps them. A timer is `(time, key)`: at most one per key and time per
//! domain. Timers are keyed state: each lives in a map state of the subtask's backend (one per
//! domain, field = the time in decimal, under the timer's key), so checkpoints, savepoints,
//! every backend's canonical format, rescaling by key group and the conformance suite cover
//! them with no extra code. An in-memory queue ordered by time mirrors the backend for firing;
//! [`Timers::rebuild`] refills it from the backend after a restore.
//!
//! Firing is one timer at a time ([`Timers::pop_due`]), earliest first and, at equal times,
//! in the order of the keys' stable hashes, so that a run and its restored replay fire in the
//! same order, and a timer registered while another fires is seen if it is already due.

use std::collections::{BTreeMap, HashSet};

use rhai::Dynamic;
use weir_schema::StateKind;

use crate::base::error::{Result, RunError};
use crate::record::{Key, KeyBuildHasher};
use crate::state::{StateBackend, StateId};

/// Which clock a timer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// The watermark (event time).
    Event,
    /// The wall clock (`OperatorContext::clock`).
    Processing,
}

impl TimeDomain {
    /// `event` or `processing`, as scripts see it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Event => "event",
            Self::Processing => "processing",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Event => 0,
            Self::Processing => 1,
        }
    }
}

/// Name of the map state holding a domain's timers. Names with a `.` cannot be declared by a
/// pipeline, so these never clash with a script's state.
pub fn state_name(domain: TimeDomain) -> &'static str {
    match domain {
        TimeDomain::Event => "__timers.event",
        TimeDomain::Processing => "__timers.processing",
    }
}

/// The timers of one operator subtask. Every method that changes timers takes the backend they
/// are stored in (the operator's `ctx.state`).
#[derive(Debug)]
pub struct Timers {
    states: [StateId; 2],
    /// By domain: time → the keys with a timer then.
    queues: [BTreeMap<i64, Bucket>; 2],
    counts: [usize; 2],
}

/// The keys with a timer at one time. Setting is a hash insert whatever the number of keys;
/// when the time comes due, the keys are sorted once into `firing` (popped from its end), so
/// the firing order is the keys' stable order, whatever order they were set in.
#[derive(Debug, Default)]
struct Bucket {
    set: HashSet<Key, KeyBuildHasher>,
    /// Keys being fired, in reverse firing order (empty until the time is due).
    firing: Vec<Key>,
}

impl Bucket {
    fn contains(&self, key: &Key) -> bool {
        self.set.contains(key) || (!self.firing.is_empty() && self.firing.contains(key))
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.firing.is_empty()
    }

    fn remove(&mut self, key: &Key) -> bool {
        if self.set.remove(key) {
            return true;
        }
        match self.firing.iter().position(|k| k == key) {
            Some(at) => {
                self.firing.remove(at);
                true
            }
            None => false,
        }
    }

    /// The next key to fire.
    fn pop(&mut self) -> Option<Key> {
        if self.firing.is_empty() && !self.set.is_empty() {
            self.firing = self.set.drain().collect();
            // Reverse order: the first to fire is popped from the end.
            self.firing.sort_unstable_by(|a, b| key_order(b, a));
        }
        self.firing.pop()
    }
}

impl Timers {
    /// Registers the timer states in `state` (call in `open`, before a restore) and returns an
    /// empty timer service.
    ///
    /// # Errors
    /// A state of the same name registered with another kind.
    pub fn register(state: &mut dyn StateBackend) -> Result<Self> {
        let event = state.register(state_name(TimeDomain::Event), StateKind::Map)?;
        let processing = state.register(state_name(TimeDomain::Processing), StateKind::Map)?;
        Ok(Self {
            states: [event, processing],
            queues: [BTreeMap::new(), BTreeMap::new()],
            counts: [0, 0],
        })
    }

    /// Sets a timer for `key` at `time`; `false` when it was already set.
    ///
    /// # Errors
    /// Backend failures.
    pub fn set(
        &mut self,
        state: &mut dyn StateBackend,
        domain: TimeDomain,
        key: &Key,
        time: i64,
    ) -> Result<bool> {
        if !self.insert(domain, key, time) {
            return Ok(false);
        }
        state.map_put(
            self.states[domain.index()],
            key,
            &time.to_string(),
            Dynamic::TRUE,
        )?;
        Ok(true)
    }

    /// Deletes `key`'s timer at `time`; `false` when there was none.
    ///
    /// # Errors
    /// Backend failures.
    pub fn delete(
        &mut self,
        state: &mut dyn StateBackend,
        domain: TimeDomain,
        key: &Key,
        time: i64,
    ) -> Result<bool> {
        let d = domain.index();
        let Some(bucket) = self.queues[d].get_mut(&time) else {
            return Ok(false);
        };
        if !bucket.remove(key) {
            return Ok(false);
        }
        if bucket.is_empty() {
            self.queues[d].remove(&time);
        }
        self.counts[d] -= 1;
        state.map_remove(self.states[d], key, &time.to_string())?;
        Ok(true)
    }

    /// The earliest pending timer's time in `domain`.
    pub fn next(&self, domain: TimeDomain) -> Option<i64> {
        self.queues[domain.index()].keys().next().copied()
    }

    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    /// Number of pending timers in `domain`.
    pub fn len(&self, domain: TimeDomain) -> usize {
        self.counts[domain.index()]
    }

    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    /// Whether no timer is pending in either domain.
    pub fn is_empty(&self) -> bool {
        self.counts == [0, 0]
    }

    /// Removes and returns the earliest timer of `domain` due at `upto` (its time `<= upto`),
    /// deleting it from the backend too. Call in a loop: the timer's handler may set new
    /// timers, which the next call sees.
    ///
    /// # Errors
    /// Backend failures.
    pub fn pop_due(
        &mut self,
        state: &mut dyn StateBackend,
        domain: TimeDomain,
        upto: i64,
    ) -> Result<Option<(i64, Key)>> {
        let d = domain.index();
        let Some(mut entry) = self.queues[d].first_entry() else {
            return Ok(None);
        };
        let time = *entry.key();
        if time > upto {
            return Ok(None);
        }
        let bucket = entry.get_mut();
        let Some(key) = bucket.pop() else {
            entry.remove();
            return Ok(None);
        };
        if bucket.is_empty() {
            entry.remove();
        }
        self.counts[d] -= 1;
        state.map_remove(self.states[d], &key, &time.to_string())?;
        Ok(Some((time, key)))
    }

    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    /// Every timer of `key` in `domain`, earliest first (from the in-memory queue; a scan of
    /// every pending time).
    pub fn of_key(&self, domain: TimeDomain, key: &Key) -> Vec<i64> {
        self.queues[domain.index()]
            .iter()
            .filter(|(_, bucket)| bucket.contains(key))
            .map(|(t, _)| *t)
            .collect()
    }

    /// Deletes every timer stored in the backend (and queued): for an operator whose timers
    /// follow from other state, after restoring a checkpoint that stored them.
    ///
    /// # Errors
    /// Backend failures.
    pub fn clear_stored(&mut self, state: &mut dyn StateBackend) -> Result<()> {
        self.queues = [BTreeMap::new(), BTreeMap::new()];
        self.counts = [0, 0];
        for id in self.states {
            for key in state.keys(id)? {
                state.clear(id, &key)?;
            }
        }
        Ok(())
    }

    /// Refills the queues from the backend (after a restore or a hand-over): every timer
    /// stored under the backend's key groups.
    ///
    /// # Errors
    /// Backend failures, or a stored timer whose time is not an integer.
    pub fn rebuild(&mut self, state: &dyn StateBackend) -> Result<()> {
        self.queues = [BTreeMap::new(), BTreeMap::new()];
        self.counts = [0, 0];
        for domain in [TimeDomain::Event, TimeDomain::Processing] {
            let id = self.states[domain.index()];
            for key in state.keys(id)? {
                for field in state.map_keys(id, &key)? {
                    let time: i64 = field.parse().map_err(|_| {
                        RunError::StateMismatch(format!(
                            "a stored {} timer has the time `{field}`, which is not an \
                             integer; the checkpoint is damaged",
                            domain.name()
                        ))
                    })?;
                    self.insert(domain, &key, time);
                }
            }
        }
        Ok(())
    }

    fn insert(&mut self, domain: TimeDomain, key: &Key, time: i64) -> bool {
        let d = domain.index();
        let bucket = self.queues[d].entry(time).or_default();
        if bucket.contains(key) {
            return false;
        }
        bucket.set.insert(key.clone());
        self.counts[d] += 1;
        true
    }
}

/// The order of keys sharing a timer time: stable hash, then value (equal only when equal).
/// The stable order of keys that fire at one time: by stable hash, then by value, the same on
/// every run (so a run and its restored replay emit alike).
pub fn key_order(a: &Key, b: &Key) -> std::cmp::Ordering {
    a.hash_code().cmp(&b.hash_code()).then_with(|| {
        if a == b {
            std::cmp::Ordering::Equal
        } else {
            format!("{:?}", a.value()).cmp(&format!("{:?}", b.value()))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::KeyGroupRange;
    use crate::state::MemoryBackend;

    const MAX: u32 = 128;

    fn key(k: &str) -> Key {
        Key::from_dynamic(&Dynamic::from(k.to_owned()))
    }

    fn backend() -> MemoryBackend {
        MemoryBackend::new(MAX, KeyGroupRange::all(MAX))
    }

    #[test]
    fn timers_fire_in_time_order_once_each_and_deleted_ones_never() -> Result<()> {
        let mut b = backend();
        let mut t = Timers::register(&mut b)?;
        assert!(t.set(&mut b, TimeDomain::Event, &key("a"), 30)?);
        assert!(t.set(&mut b, TimeDomain::Event, &key("b"), 10)?);
        assert!(!t.set(&mut b, TimeDomain::Event, &key("b"), 10)?, "set twice");
        assert!(t.set(&mut b, TimeDomain::Event, &key("c"), 20)?);
        assert!(t.set(&mut b, TimeDomain::Processing, &key("a"), 5)?);
        assert!(t.delete(&mut b, TimeDomain::Event, &key("c"), 20)?);
        assert!(!t.delete(&mut b, TimeDomain::Event, &key("c"), 20)?);
        assert_eq!(t.len(TimeDomain::Event), 2);
        assert_eq!(t.next(TimeDomain::Event), Some(10));
        assert_eq!(t.pop_due(&mut b, TimeDomain::Event, 9)?, None);
        assert_eq!(t.pop_due(&mut b, TimeDomain::Event, 40)?, Some((10, key("b"))));
        assert_eq!(t.pop_due(&mut b, TimeDomain::Event, 40)?, Some((30, key("a"))));
        assert_eq!(t.pop_due(&mut b, TimeDomain::Event, 40)?, None);
        assert_eq!(t.of_key(TimeDomain::Processing, &key("a")), vec![5]);
        Ok(())
    }

    #[test]
    fn timers_survive_a_snapshot_and_split_by_key_group() -> Result<()> {
        let mut b = backend();
        let mut t = Timers::register(&mut b)?;
        let keys: Vec<Key> = (0..50).map(|i| key(&format!("k{i}"))).collect();
        for (i, k) in keys.iter().enumerate() {
            t.set(&mut b, TimeDomain::Event, k, i as i64)?;
            t.set(&mut b, TimeDomain::Processing, k, 1_000 + i as i64)?;
        }
        // Fire the first ten before the snapshot: they must not come back.
        for _ in 0..10 {
            t.pop_due(&mut b, TimeDomain::Event, i64::MAX)?;
        }
        let snap = b.snapshot(KeyGroupRange::all(MAX))?;
        // Restore into two halves, as a rescale to parallelism 2 does.
        let mut total = [0, 0];
        for s in 0..2 {
            let mut half = MemoryBackend::new(MAX, KeyGroupRange::for_subtask(MAX, 2, s));
            let mut restored = Timers::register(&mut half)?;
            half.restore(&[&snap])?;
            restored.rebuild(&half)?;
            total[0] += restored.len(TimeDomain::Event);
            total[1] += restored.len(TimeDomain::Processing);
            while let Some((time, k)) = restored.pop_due(&mut half, TimeDomain::Event, i64::MAX)? {
                assert!(time >= 10, "fired timer {time} came back");
                assert!(half.key_groups().contains(k.key_group(MAX)));
            }
        }
        assert_eq!(total, [40, 50]);
        Ok(())
    }

    #[test]
    fn a_timer_set_or_deleted_while_its_time_fires_is_seen() -> Result<()> {
        let mut b = backend();
        let mut t = Timers::register(&mut b)?;
        for n in ["a", "b", "c"] {
            t.set(&mut b, TimeDomain::Event, &key(n), 5)?;
        }
        let (_, first) = t.pop_due(&mut b, TimeDomain::Event, 5)?.expect("due");
        // While `first` fires: another key at the same time, and one of the others deleted.
        assert!(t.set(&mut b, TimeDomain::Event, &key("d"), 5)?);
        let other = ["a", "b", "c"]
            .into_iter()
            .map(key)
            .find(|k| *k != first)
            .expect("another key");
        assert!(t.delete(&mut b, TimeDomain::Event, &other, 5)?);
        assert!(t.set(&mut b, TimeDomain::Event, &first, 4)?);
        let mut rest = Vec::new();
        while let Some((time, k)) = t.pop_due(&mut b, TimeDomain::Event, 5)? {
            rest.push((time, k));
        }
        assert_eq!(rest.len(), 3, "{rest:?}");
        assert_eq!(rest[0], (4, first), "an earlier time set while firing comes first");
        assert!(rest.iter().any(|(_, k)| *k == key("d")));
        assert!(!rest.iter().any(|(_, k)| *k == other));
        assert!(t.is_empty());
        Ok(())
    }

    #[test]
    fn equal_times_fire_in_the_same_order_whatever_the_insertion_order() -> Result<()> {
        let names = ["x", "y", "z", "w", "v"];
        let mut orders = Vec::new();
        for rev in [false, true] {
            let mut b = backend();
            let mut t = Timers::register(&mut b)?;
            let mut it: Vec<&str> = names.to_vec();
            if rev {
                it.reverse();
            }
            for n in it {
                t.set(&mut b, TimeDomain::Event, &key(n), 7)?;
            }
            let mut fired = Vec::new();
            while let Some((_, k)) = t.pop_due(&mut b, TimeDomain::Event, 7)? {
                fired.push(k);
            }
            orders.push(fired);
        }
        assert_eq!(orders[0], orders[1]);
        Ok(())
    }
}
