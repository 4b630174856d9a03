//! The memory backend: one hash map per (state, key group). Reads and updates touch the maps
//! directly; a snapshot streams the requested key groups into the canonical format.
//!
//! **Memory model.** A value is held *live* (a decoded [`Dynamic`], what reads and updates
//! work on) or *packed* (its canonical encoding, the bytes a snapshot holds). A decoded map
//! or list costs far more than its encoding: a Rhai map of a few fields is a B-tree node of
//! about 500 bytes, its encoding a dozen bytes. So every periodic checkpoint
//! ([`StateBackend::checkpoint`]), which encodes every value anyway, keeps the encoding of
//! each live map and list of plain data (unit, booleans, numbers, strings, lists and maps of
//! them) *not written since the previous checkpoint* and drops the decoded value; a restore
//! keeps the snapshot's bytes packed. The next update of a packed value decodes it and keeps
//! it live; a read of a packed value decodes a copy and leaves it packed. Hence live values
//! are those written during the last one or two checkpoint intervals: a large key set that is
//! touched a little at a time stays mostly packed, while a small hot one is never packed (no
//! decoding on the hot path). Scalars and values of other types (functions, blobs,
//! characters, custom types) are always live.
//! Packed values are copied into later snapshots as they are, so that a checkpoint of mostly
//! cold state costs a copy, not an encoding.
//!
//! **Sweeps.** Checkpoints alone would bound live values by what one or two checkpoint
//! intervals touch, which depends on the machine's speed (a fast run over a million keys
//! touches most of them between two checkpoints). So the backend also remembers which maps
//! and lists were made live (inserted, or unpacked by an update), and once
//! [`SWEEP_EVERY`] more were made live since the last sweep, it sweeps them: those written
//! since the previous sweep stay live, the others are packed as a checkpoint packs them. A
//! sweep visits only the values made live since the one before and those it kept, each kept
//! one written since, so its cost stays a step per write. A small or hot key set is never
//! swept (its values stay live, nothing is made live again); a large one touched a little at
//! a time keeps about [`SWEEP_EVERY`] to twice that many values live, however fast the input
//! comes. (A scalar that becomes a map or list while live is left to checkpoints.) Without
//! checkpoints, sweeps alone pack.

use std::borrow::Cow;
use std::collections::HashMap;

use rhai::Dynamic;
use weir_schema::StateKind;

use super::canonical::{SnapshotItem, SnapshotWriter, decode_value, read_snapshot};
use super::{CanonicalSnapshot, PendingSnapshot, StateBackend, StateId};
use crate::base::error::{Result, RunError};
use crate::checkpoint::CheckpointId;
use crate::record::{Key, KeyBuildHasher, KeyGroupRange};

/// Maps and lists made live between two sweeps (see the module docs): the least number that
/// starts one.
pub const SWEEP_EVERY: usize = 1 << 15;

/// A stored value: live or packed (see the module docs).
enum Slot {
    /// Decoded, as reads and updates see it.
    Live {
        value: Dynamic,
        /// The sweep period of its last write ([`MemoryBackend::period`]), or that period
        /// plus one once the sweep ending it kept the value live.
        written: u32,
        /// Written since the last checkpoint.
        hot: bool,
    },
    /// Its canonical encoding (one MessagePack value, as [`decode_value`] reads it).
    Packed(Box<[u8]>),
}

impl Slot {
    /// The value, decoded if packed.
    fn value(&self) -> Result<Cow<'_, Dynamic>> {
        match self {
            Self::Live { value, .. } => Ok(Cow::Borrowed(value)),
            Self::Packed(bytes) => decode_value(bytes).map(Cow::Owned),
        }
    }
}

/// Whether `v` is a map or a list, the values a sweep looks at.
fn container(v: &Dynamic) -> bool {
    v.is_map() || v.is_array()
}

/// The canonical encoding of a live value (what [`SnapshotWriter::entry`] writes for it).
fn encode(buf: &mut Vec<u8>, v: &Dynamic) -> Result<()> {
    buf.clear();
    rmp_serde::encode::write(buf, v)
        .map_err(|e| RunError::State(format!("cannot encode state value: {e}")))
}

type Group = HashMap<Key, Slot, KeyBuildHasher>;

/// Whether `v` is a map or list of plain data (unit, booleans, numbers, strings, maps and
/// lists of them), whose encoding decodes back to an equal value; such values are packed at
/// checkpoints.
fn packable(v: &Dynamic) -> bool {
    fn plain(v: &Dynamic, depth: u32) -> bool {
        if depth > 32 {
            return false;
        }
        if v.is_unit() || v.is_bool() || v.is_int() || v.is_float() || v.is_string() {
            return true;
        }
        if let Ok(m) = v.as_map_ref() {
            return m.values().all(|x| plain(x, depth + 1));
        }
        if let Ok(a) = v.as_array_ref() {
            return a.iter().all(|x| plain(x, depth + 1));
        }
        false
    }
    (v.is_map() || v.is_array()) && plain(v, 0)
}

struct Table {
    name: String,
    kind: StateKind,
    /// One map per key group of the backend's range, indexed by `kg - range.start`.
    groups: Vec<Group>,
}

/// Heap state for one subtask's key-group range.
pub struct MemoryBackend {
    max_parallelism: u32,
    range: KeyGroupRange,
    tables: Vec<Table>,
    /// Bumped by every write and restore (see [`StateBackend::generation`]).
    generation: u64,
    /// The current sweep period, even; each sweep adds two (see [`Slot::Live`]'s `written`).
    period: u32,
    /// Maps and lists made live since the last sweep, and those it kept live, as (state, key);
    /// a key may appear twice.
    recent: Vec<(u32, Key)>,
    /// The length of `recent` that starts the next sweep.
    sweep_at: usize,
}

impl MemoryBackend {
    /// An empty backend for `range` out of `max_parallelism` key groups.
    pub fn new(max_parallelism: u32, range: KeyGroupRange) -> Self {
        Self {
            max_parallelism,
            range,
            tables: Vec::new(),
            generation: 0,
            period: 0,
            recent: Vec::new(),
            sweep_at: SWEEP_EVERY,
        }
    }

    fn group(&self, state: StateId, key: &Key) -> Result<&Group> {
        let kg = key.key_group(self.max_parallelism);
        let table = self
            .tables
            .get(state.0 as usize)
            .ok_or_else(|| RunError::State(format!("unknown state handle {}", state.0)))?;
        if !self.range.contains(kg) {
            return Err(RunError::State(format!(
                "key group {kg} is outside this backend's range {:?}",
                self.range
            )));
        }
        Ok(&table.groups[(kg - self.range.start) as usize])
    }

    fn group_mut(&mut self, state: StateId, key: &Key) -> Result<&mut Group> {
        let kg = key.key_group(self.max_parallelism);
        let range = self.range;
        let table = self
            .tables
            .get_mut(state.0 as usize)
            .ok_or_else(|| RunError::State(format!("unknown state handle {}", state.0)))?;
        if !range.contains(kg) {
            return Err(RunError::State(format!(
                "key group {kg} is outside this backend's range {range:?}"
            )));
        }
        Ok(&mut table.groups[(kg - range.start) as usize])
    }
}

impl MemoryBackend {
    /// Packs the maps and lists of `recent` not written since the previous sweep and keeps
    /// the others live (see the module docs). Values that are not plain data stay live and
    /// leave `recent`, as do values that could not be encoded (packing is only a saving).
    fn sweep(&mut self) {
        let period = self.period;
        let (max_parallelism, start) = (self.max_parallelism, self.range.start);
        let tables = &mut self.tables;
        let mut buf = Vec::new();
        self.recent.retain(|(t, key)| {
            let kg = key.key_group(max_parallelism);
            let Some(slot) = tables[*t as usize].groups[(kg - start) as usize].get_mut(key)
            else {
                return false;
            };
            let Slot::Live { value, written, .. } = slot else {
                return false;
            };
            if *written == period {
                *written = period.wrapping_add(1);
                return true;
            }
            // Kept by an earlier entry of this sweep (the key appears twice), or not written
            // since the previous sweep.
            if *written != period.wrapping_add(1) && packable(value) && encode(&mut buf, value).is_ok() {
                *slot = Slot::Packed(buf.as_slice().into());
            }
            false
        });
        self.period = period.wrapping_add(2);
        self.sweep_at = self.recent.len() + SWEEP_EVERY;
    }

    /// Notes a map or list made live, for the next sweep, and sweeps when it is due.
    #[cold]
    fn made_live(&mut self, state: StateId, key: &Key) {
        self.recent.push((state.0, key.clone()));
        if self.recent.len() >= self.sweep_at {
            self.sweep();
        }
    }

    /// Entries over every state and key group.
    fn entries(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|t| &t.groups)
            .map(HashMap::len)
            .sum()
    }
}

impl StateBackend for MemoryBackend {
    fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    fn register(&mut self, name: &str, kind: StateKind) -> Result<StateId> {
        if let Some(i) = self.tables.iter().position(|t| t.name == name) {
            if self.tables[i].kind != kind {
                return Err(RunError::State(format!(
                    "state `{name}` is registered as {:?}, not {kind:?}",
                    self.tables[i].kind
                )));
            }
            return Ok(StateId(i as u32));
        }
        let groups = (0..self.range.len()).map(|_| Group::default()).collect();
        self.tables.push(Table {
            name: name.to_owned(),
            kind,
            groups,
        });
        Ok(StateId((self.tables.len() - 1) as u32))
    }

    fn get(&self, state: StateId, key: &Key) -> Result<Option<Dynamic>> {
        match self.group(state, key)?.get(key) {
            Some(Slot::Live { value, .. }) => Ok(Some(value.clone())),
            Some(Slot::Packed(bytes)) => decode_value(bytes).map(Some),
            None => Ok(None),
        }
    }

    fn read(&self, state: StateId, key: &Key, f: &mut dyn FnMut(Option<&Dynamic>)) -> Result<()> {
        match self.group(state, key)?.get(key) {
            Some(slot) => f(Some(slot.value()?.as_ref())),
            None => f(None),
        }
        Ok(())
    }

    fn lend(&self, state: StateId, key: &Key) -> Option<Result<Option<Cow<'_, Dynamic>>>> {
        Some(self.group(state, key).and_then(|g| g.get(key).map(Slot::value).transpose()))
    }

    fn update(
        &mut self,
        state: StateId,
        key: &Key,
        f: &mut dyn FnMut(&mut Option<Dynamic>),
    ) -> Result<()> {
        self.generation += 1;
        let written = self.period;
        let group = self.group_mut(state, key)?;
        let live = |value| Slot::Live {
            value,
            written,
            hot: true,
        };
        // Whether the value becomes a live map or list from packed or absent: a sweep looks
        // at it.
        let fresh = if let Some(v) = group.get_mut(key) {
            let (old, unpacked) = match v {
                Slot::Live { value, .. } => (std::mem::take(value), false),
                Slot::Packed(bytes) => (decode_value(bytes)?, true),
            };
            let mut slot = Some(old);
            f(&mut slot);
            match slot {
                Some(new) => {
                    let fresh = unpacked && container(&new);
                    *v = live(new);
                    fresh
                }
                None => {
                    group.remove(key);
                    false
                }
            }
        } else {
            let mut slot = None;
            f(&mut slot);
            match slot {
                Some(new) => {
                    let fresh = container(&new);
                    group.insert(key.clone(), live(new));
                    fresh
                }
                None => false,
            }
        };
        if fresh {
            self.made_live(state, key);
        }
        Ok(())
    }

    fn keys_in(&self, state: StateId, range: KeyGroupRange) -> Result<Vec<Key>> {
        let table = self
            .tables
            .get(state.0 as usize)
            .ok_or_else(|| RunError::State(format!("unknown state handle {}", state.0)))?;
        let start = range.start.max(self.range.start);
        let end = range.end.min(self.range.end).max(start);
        let groups = &table.groups[(start - self.range.start) as usize..(end - self.range.start) as usize];
        Ok(groups.iter().flat_map(|g| g.keys().cloned()).collect())
    }

    fn snapshot(&self, range: KeyGroupRange) -> Result<Vec<u8>> {
        let mut w = SnapshotWriter::new(self.max_parallelism, self.tables.len() as u32);
        let in_range = |i: usize| range.contains(self.range.start + i as u32);
        let entries: usize = self
            .tables
            .iter()
            .flat_map(|t| t.groups.iter().enumerate())
            .filter(|(i, _)| in_range(*i))
            .map(|(_, g)| g.len())
            .sum();
        // A rough guess (key group, short key, small value) that saves most regrowth.
        w.reserve(entries * 24);
        for t in &self.tables {
            w.begin_state(&t.name, t.kind)?;
            for (i, g) in t.groups.iter().enumerate() {
                if !in_range(i) {
                    continue;
                }
                let kg = self.range.start + i as u32;
                for (k, v) in g {
                    match v {
                        Slot::Live { value, .. } => w.entry(kg, k, value)?,
                        Slot::Packed(bytes) => w.entry_encoded(kg, k.value(), bytes)?,
                    }
                }
            }
        }
        w.finish()
    }

    /// A full canonical snapshot, like [`snapshot`](StateBackend::snapshot) of every key
    /// group, that also packs the live maps and lists not written since the previous
    /// checkpoint (see the module docs).
    fn checkpoint(&mut self, _checkpoint: CheckpointId) -> Result<Box<dyn PendingSnapshot>> {
        let mut w = SnapshotWriter::new(self.max_parallelism, self.tables.len() as u32);
        w.reserve(self.entries() * 24);
        let mut buf = Vec::new();
        for t in &mut self.tables {
            w.begin_state(&t.name, t.kind)?;
            for (i, g) in t.groups.iter_mut().enumerate() {
                let kg = self.range.start + i as u32;
                for (k, v) in g.iter_mut() {
                    match v {
                        // Written since the last checkpoint: likely written again soon.
                        Slot::Live { value, hot, .. } if *hot => {
                            w.entry(kg, k, value)?;
                            *hot = false;
                        }
                        Slot::Live { value, .. } if packable(value) => {
                            encode(&mut buf, value)?;
                            w.entry_encoded(kg, k.value(), &buf)?;
                            *v = Slot::Packed(buf.as_slice().into());
                        }
                        Slot::Live { value, .. } => w.entry(kg, k, value)?,
                        Slot::Packed(bytes) => w.entry_encoded(kg, k.value(), bytes)?,
                    }
                }
            }
        }
        Ok(Box::new(CanonicalSnapshot(w.finish()?)))
    }

    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }

    fn restore(&mut self, snapshots: &[&[u8]]) -> Result<()> {
        self.generation += 1;
        for bytes in snapshots {
            let mut table = None;
            read_snapshot(bytes, self.max_parallelism, |item| {
                match item {
                    SnapshotItem::State {
                        name,
                        kind,
                        entries,
                    } => {
                        let t = self.register(name, kind)?.0 as usize;
                        // Room for an even share of the entries in each of our key groups,
                        // so that a large restore does not rehash every table repeatedly.
                        let share = entries as usize / self.max_parallelism.max(1) as usize;
                        for g in &mut self.tables[t].groups {
                            g.reserve(share);
                        }
                        table = Some(t);
                    }
                    SnapshotItem::Entry { kg, key, value } => {
                        if !self.range.contains(kg) {
                            return Ok(());
                        }
                        // Filed by the key's own group (as `put` would), which a
                        // well-formed snapshot always agrees with.
                        let own = key.key_group(self.max_parallelism);
                        if !self.range.contains(own) {
                            return Err(RunError::StateCorrupt(format!(
                                "malformed snapshot: an entry filed under key group {kg} \
                                 belongs to key group {own}, outside this backend's range {:?}",
                                self.range
                            )));
                        }
                        let t = table.ok_or_else(|| {
                            RunError::StateCorrupt("malformed snapshot: entry before state".into())
                        })?;
                        let group = &mut self.tables[t].groups[(own - self.range.start) as usize];
                        // Checked now, so that a damaged snapshot fails the restore and not
                        // a later read.
                        let live = decode_value(value)?;
                        let slot = if packable(&live) {
                            Slot::Packed(value.into())
                        } else {
                            Slot::Live {
                                value: live,
                                written: self.period,
                                hot: false,
                            }
                        };
                        group.insert(key, slot);
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rhai::Dynamic;
    use weir_schema::StateKind;

    use super::{MemoryBackend, SWEEP_EVERY, Slot};
    use crate::record::{Key, KeyGroupRange, map_of};
    use crate::state::StateBackend;

    /// Whether `state`'s value of `k` is held packed.
    fn is_packed(b: &MemoryBackend, state: usize, k: &Key) -> bool {
        let kg = (k.key_group(b.max_parallelism) - b.range.start) as usize;
        matches!(b.tables[state].groups[kg].get(k), Some(Slot::Packed(_)))
    }

    fn key(i: usize) -> Key {
        Key::from_str_value(format!("k{i}").into())
    }

    #[test]
    fn sweeps_pack_maps_and_lists_not_written_since_the_previous_sweep() {
        let m = 8;
        let all = KeyGroupRange::all(m);
        let mut b = MemoryBackend::new(m, all);
        let s = b.register("m", StateKind::Map).unwrap();
        let l = b.register("l", StateKind::List).unwrap();
        let v = b.register("v", StateKind::Value).unwrap();
        let hot = Key::from_str_value("hot".into());
        let n = SWEEP_EVERY;
        // New maps for about one sweep period, then new lists for about another and a half:
        // the second sweep packs the maps; one map and the scalars are written throughout.
        for i in 0..n * 5 / 2 {
            if i < n {
                b.map_put(s, &key(i), "n", Dynamic::from_int(i as i64)).unwrap();
            } else {
                b.list_push(l, &key(i), Dynamic::from_int(i as i64)).unwrap();
            }
            b.map_put(s, &hot, "n", Dynamic::from_int(i as i64)).unwrap();
            b.put(v, &key(i % 10), Dynamic::from_int(i as i64)).unwrap();
        }
        assert!((0..n).step_by(97).all(|i| is_packed(&b, 0, &key(i))));
        assert!(!is_packed(&b, 0, &hot));
        assert!(!is_packed(&b, 1, &key(n * 5 / 2 - 1)));
        assert!((0..10).all(|i| !is_packed(&b, 2, &key(i))));
        for i in 0..n {
            let got = b.map_get(s, &key(i), "n").unwrap().unwrap();
            assert_eq!(got.as_int(), Ok(i as i64));
        }
        assert_eq!(b.map_get(s, &hot, "n").unwrap().unwrap().as_int(), Ok((n * 5 / 2 - 1) as i64));
        // Packing changes no snapshot byte, and what a snapshot restores reads the same.
        let before = b.snapshot(all).unwrap();
        b.sweep();
        b.sweep();
        assert!(is_packed(&b, 0, &hot) && is_packed(&b, 1, &key(n * 5 / 2 - 1)));
        assert_eq!(b.snapshot(all).unwrap(), before);
        let mut r = MemoryBackend::new(m, all);
        r.restore(&[&before]).unwrap();
        for (state, i) in [(s, 0), (s, n - 1), (l, n), (l, n * 2), (v, 3)] {
            let k = key(i);
            assert_eq!(
                r.get(state, &k).unwrap().unwrap().to_string(),
                b.get(state, &k).unwrap().unwrap().to_string()
            );
        }
        // An update decodes a packed value and keeps it live.
        b.map_put(s, &key(0), "x", Dynamic::from_int(1)).unwrap();
        assert!(!is_packed(&b, 0, &key(0)));
        assert_eq!(b.map_len(s, &key(0)).unwrap(), 2);
    }

    #[test]
    fn a_value_made_live_twice_before_a_sweep_stays_live_through_it() {
        let m = 8;
        let mut b = MemoryBackend::new(m, KeyGroupRange::all(m));
        let s = b.register("m", StateKind::Map).unwrap();
        let k = key(0);
        b.map_put(s, &k, "n", Dynamic::from_int(1)).unwrap();
        // The second checkpoint packs it (not written since the first), the update after
        // makes it live again: the sweep meets the key twice.
        drop(b.checkpoint(1).unwrap());
        drop(b.checkpoint(2).unwrap());
        assert!(is_packed(&b, 0, &k));
        b.map_put(s, &k, "n", Dynamic::from_int(2)).unwrap();
        assert_eq!(b.recent.len(), 2);
        b.sweep();
        assert!(!is_packed(&b, 0, &k));
        assert_eq!(b.recent.len(), 1);
        b.sweep();
        assert!(is_packed(&b, 0, &k));
        assert!(b.recent.is_empty());
        assert_eq!(b.map_get(s, &k, "n").unwrap().unwrap().as_int(), Ok(2));
    }

    #[test]
    fn values_that_are_not_plain_data_stay_live_through_sweeps() {
        let m = 8;
        let mut b = MemoryBackend::new(m, KeyGroupRange::all(m));
        let s = b.register("l", StateKind::List).unwrap();
        let k = key(0);
        b.list_push(s, &k, Dynamic::from_char('c')).unwrap();
        b.sweep();
        b.sweep();
        assert!(!is_packed(&b, 0, &k));
        assert!(b.recent.is_empty());
        assert_eq!(b.list_pop(s, &k).unwrap().unwrap().as_char(), Ok('c'));
    }

    #[test]
    fn checkpoints_pack_plain_maps_and_lists_and_values_read_the_same_after() {
        let m = 8;
        let mut b = MemoryBackend::new(m, KeyGroupRange::all(m));
        let s = b.register("s", StateKind::Value).unwrap();
        let key = |i: i64| Key::from_str_value(format!("k{i}").into());
        let nested = map_of([
            ("n", Dynamic::from_int(1)),
            ("f", Dynamic::from_float(0.5)),
            ("t", Dynamic::from("text")),
            ("l", Dynamic::from_array(vec![Dynamic::UNIT, Dynamic::TRUE])),
        ]);
        let values = [
            nested,
            Dynamic::from_array(vec![Dynamic::from_int(3), Dynamic::from_int(2)]),
            Dynamic::from_int(7),
            // Not plain data: a character would come back as a string, so it stays live.
            Dynamic::from_array(vec![Dynamic::from_char('c')]),
        ];
        for (i, v) in values.iter().enumerate() {
            b.put(s, &key(i as i64), v.clone()).unwrap();
        }
        let before = b.snapshot(KeyGroupRange::all(m)).unwrap();
        // Written since the last checkpoint: the first checkpoint leaves them live.
        drop(b.checkpoint(1).unwrap());
        let live = |b: &MemoryBackend| {
            b.tables[0]
                .groups
                .iter()
                .flat_map(|g| g.values())
                .all(|v| matches!(v, Slot::Live { .. }))
        };
        assert!(live(&b));
        drop(b.checkpoint(2).unwrap());
        let packed = |b: &MemoryBackend, i: i64| {
            let k = key(i);
            matches!(
                b.tables[0].groups[k.key_group(m) as usize].get(&k),
                Some(Slot::Packed(_))
            )
        };
        assert_eq!(
            (0..4).map(|i| packed(&b, i)).collect::<Vec<_>>(),
            [true, true, false, false]
        );
        assert_eq!(b.snapshot(KeyGroupRange::all(m)).unwrap(), before);
        for (i, v) in values.iter().enumerate() {
            let k = key(i as i64);
            assert_eq!(b.get(s, &k).unwrap().unwrap().to_string(), v.to_string());
            let mut seen = String::new();
            b.read(s, &k, &mut |d| seen = d.unwrap().to_string()).unwrap();
            assert_eq!(seen, v.to_string());
            let lent = b.lend(s, &k).unwrap().unwrap().unwrap();
            assert_eq!(lent.to_string(), v.to_string());
        }
        // An update decodes the value and keeps it live; a map entry changes in place.
        b.map_put(s, &key(0), "n", Dynamic::from_int(2)).unwrap();
        assert!(!packed(&b, 0));
        assert_eq!(b.map_get(s, &key(0), "n").unwrap().unwrap().as_int(), Ok(2));
        assert_eq!(b.map_len(s, &key(0)).unwrap(), 4);
        assert_eq!(b.list_pop(s, &key(1)).unwrap().unwrap().as_int(), Ok(2));
        b.clear(s, &key(1)).unwrap();
        assert!(b.get(s, &key(1)).unwrap().is_none());
        // A restore keeps plain values packed, and they read the same.
        let mut r = MemoryBackend::new(m, KeyGroupRange::all(m));
        r.restore(&[&before]).unwrap();
        // (The character came back from the snapshot as a string, as on every restore.)
        assert!(packed(&r, 0) && packed(&r, 1) && !packed(&r, 2));
        for (i, v) in values.iter().enumerate().take(3) {
            let got = r.get(s, &key(i as i64)).unwrap().unwrap();
            assert_eq!(got.to_string(), v.to_string());
        }
    }

    /// The conformance suite on the memory backend (the `fs` backend is this backend with its
    /// checkpoints in files).
    mod suite {
        use crate::record::KeyGroupRange;
        use crate::state::conformance::{Factory, conformance_suite};
        use crate::state::{MemoryBackend, StateBackend};

        conformance_suite!(|case: fn(Factory<'_>)| {
            case(&|m: u32, range: KeyGroupRange| -> Box<dyn StateBackend> {
                Box::new(MemoryBackend::new(m, range))
            });
        });
    }
}
