//! The memory backend: one hash map per key group, from a key to its *row*, the key's value
//! in each state (by [`StateId`]). Reads and updates touch the maps directly; a snapshot
//! streams the requested key groups into the canonical format, state by state.
//!
//! **Rows.** A record usually reads and writes several states of its key: with one row per
//! key, the first access of a record brings the key's entry and values into the cache and the
//! others find them there, instead of one table entry per state, each a cache miss in a large
//! key set. A row holds up to four values inline, in the table entry itself (a row on the
//! heap would be one more dependent cache miss per record), and is sized to the states
//! registered when the key was first written; it grows when a later state is written (onto
//! the heap past four), and leaves its map when its last value is cleared. Each key group's
//! table remembers the bucket of the last key it found, so a record's later calls for its
//! key go straight to the entry.
//!
//! **Prefetch.** A keyed record's first touch of its row and of its maps and lists waits on
//! memory, one load after the other, when the key set outgrows the processor's caches.
//! [`StateBackend::prefetch`], called a few records ahead, finds the row then and asks the
//! processor for the first line of each map, list and packed value it holds, so that those
//! loads overlap the records in between.
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
use std::cell::Cell;

use hashbrown::HashTable;
use rhai::Dynamic;
use smallvec::SmallVec;
use weir_schema::StateKind;

use super::canonical::{SnapshotItem, SnapshotWriter, decode_value, read_snapshot};
use super::prefetch;
use super::{CanonicalSnapshot, PendingSnapshot, Reach, StateBackend, StateId};
use crate::base::error::{Result, RunError};
use crate::checkpoint::CheckpointId;
use crate::record::{Key, KeyBuildHasher, KeyGroupRange};

/// Maps and lists made live between two sweeps (see the module docs): the least number that
/// starts one.
pub const SWEEP_EVERY: usize = 1 << 15;

/// A stored value: live or packed (see the module docs).
enum Slot {
    /// Decoded, as reads and updates see it. Never `None` between calls: an update that
    /// leaves none removes the slot. The option lets [`StateBackend::update`] hand the value to
    /// its closure in place: moving a `Dynamic` out and back (its tag byte apart from the other
    /// fifteen) made stores that later loads straddle, a stall of each move.
    Live {
        value: Option<Dynamic>,
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
    fn value(&self) -> Result<Option<Cow<'_, Dynamic>>> {
        match self {
            Self::Live { value, .. } => Ok(value.as_ref().map(Cow::Borrowed)),
            Self::Packed(bytes) => decode_value(bytes).map(|v| Some(Cow::Owned(v))),
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

/// A key's value in each state, by [`StateId`]; `None`: none (also past the end). Up to
/// four states inline, so that a key's values are found where its entry is (a row spilled
/// to the heap is one more cache miss per record).
type Row = SmallVec<[Option<Slot>; 4]>;

/// One key group's rows: a hash table from key to row that remembers where it found the
/// last key. A record reads and writes several states of its key one call at a time; the
/// first call finds the key's bucket and the others only check that it still holds the key
/// (a stale bucket, after an insert moved entries or a removal emptied it, is simply looked
/// up again).
#[derive(Default)]
struct Group {
    table: HashTable<(Key, Row)>,
    /// The bucket index of the last key found; anything out of range when none.
    last: Cell<usize>,
}

/// The hash a [`Group`]'s table files a key under: that of [`KeyBuildHasher`] maps.
fn table_hash(key: &Key) -> u64 {
    use std::hash::BuildHasher;
    KeyBuildHasher::default().hash_one(key)
}

impl Group {
    /// The bucket index of `key`'s row.
    fn find(&self, key: &Key) -> Option<usize> {
        let last = self.last.get();
        if self.table.get_bucket(last).is_some_and(|(k, _)| k == key) {
            return Some(last);
        }
        let found = self
            .table
            .find_bucket_index(table_hash(key), |(k, _)| k == key)?;
        self.last.set(found);
        Some(found)
    }

    /// The row of `key`, found without remembering its bucket (the record running now
    /// keeps its own).
    fn peek(&self, key: &Key) -> Option<&Row> {
        self.table
            .find(table_hash(key), |(k, _)| k == key)
            .map(|(_, row)| row)
    }

    /// Starts loading the entry `key` is most likely in: the first whose tag (seven bits of
    /// the hash, in the table's control bytes) matches. No stored key is read, so this waits
    /// on nothing but the control bytes; another key with the same tag only wastes the hint.
    fn hint(&self, key: &Key) {
        if let Some(entry) = self.table.find(table_hash(key), |_| true) {
            prefetch::object(entry);
        }
    }

    fn get(&self, key: &Key) -> Option<&Row> {
        let i = self.find(key)?;
        self.table.get_bucket(i).map(|(_, row)| row)
    }

    fn get_mut(&mut self, key: &Key) -> Option<&mut Row> {
        let i = self.find(key)?;
        self.table.get_bucket_mut(i).map(|(_, row)| row)
    }

    #[cfg(test)]
    fn contains_key(&self, key: &Key) -> bool {
        self.find(key).is_some()
    }

    /// Adds the row of a key the group does not hold.
    fn insert_new(&mut self, key: Key, row: Row) {
        let hash = table_hash(&key);
        let entry = self
            .table
            .insert_unique(hash, (key, row), |(k, _)| table_hash(k));
        self.last.set(entry.bucket_index());
    }

    /// The row of `key`, added by `make` when the group does not hold it.
    fn get_or_insert_with(&mut self, key: Key, make: impl FnOnce() -> Row) -> &mut Row {
        let hash = table_hash(&key);
        let entry = self
            .table
            .entry(hash, |(k, _)| *k == key, |(k, _)| table_hash(k))
            .or_insert_with(|| (key, make()));
        &mut entry.into_mut().1
    }

    fn remove(&mut self, key: &Key) {
        if let Ok(entry) = self
            .table
            .find_entry(table_hash(key), |(k, _)| k == key)
        {
            entry.remove();
        }
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn reserve(&mut self, additional: usize) {
        self.table.reserve(additional, |(k, _)| table_hash(k));
    }

    fn iter(&self) -> impl Iterator<Item = (&Key, &Row)> {
        self.table.iter().map(|(k, row)| (k, row))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&Key, &mut Row)> {
        self.table.iter_mut().map(|(k, row)| (&*k, row))
    }

    fn values(&self) -> impl Iterator<Item = &Row> {
        self.table.iter().map(|(_, row)| row)
    }
}

/// The value of state `state` in `row`.
fn cell(row: &Row, state: StateId) -> Option<&Slot> {
    row.get(state.0 as usize)?.as_ref()
}

/// The value of state `state` in `row`, to write it; the row grows to hold it.
fn cell_mut(row: &mut Row, state: StateId) -> &mut Option<Slot> {
    let i = state.0 as usize;
    if row.len() <= i {
        row.resize_with(i + 1, || None);
    }
    &mut row[i]
}

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
}

/// Heap state for one subtask's key-group range.
pub struct MemoryBackend {
    max_parallelism: u32,
    range: KeyGroupRange,
    tables: Vec<Table>,
    /// One map per key group of the backend's range, indexed by `kg - range.start`.
    groups: Vec<Group>,
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
            groups: (0..range.len()).map(|_| Group::default()).collect(),
            generation: 0,
            period: 0,
            recent: Vec::new(),
            sweep_at: SWEEP_EVERY,
        }
    }

    /// The index of `key`'s group, once `state` is known to be registered.
    fn group_index(&self, state: StateId, key: &Key) -> Result<usize> {
        if state.0 as usize >= self.tables.len() {
            return Err(RunError::State(format!("unknown state handle {}", state.0)));
        }
        let kg = key.key_group(self.max_parallelism);
        if !self.range.contains(kg) {
            return Err(RunError::State(format!(
                "key group {kg} is outside this backend's range {:?}",
                self.range
            )));
        }
        Ok((kg - self.range.start) as usize)
    }

    /// The stored value of `state` for `key`.
    fn slot(&self, state: StateId, key: &Key) -> Result<Option<&Slot>> {
        let g = self.group_index(state, key)?;
        Ok(self.groups[g].get(key).and_then(|row| cell(row, state)))
    }
}

impl MemoryBackend {
    /// Packs the maps and lists of `recent` not written since the previous sweep and keeps
    /// the others live (see the module docs). Values that are not plain data stay live and
    /// leave `recent`, as do values that could not be encoded (packing is only a saving).
    fn sweep(&mut self) {
        let period = self.period;
        let (max_parallelism, start) = (self.max_parallelism, self.range.start);
        let groups = &mut self.groups;
        let mut buf = Vec::new();
        self.recent.retain(|(t, key)| {
            let kg = key.key_group(max_parallelism);
            let Some(slot) = groups[(kg - start) as usize]
                .get_mut(key)
                .and_then(|row| row.get_mut(*t as usize)?.as_mut())
            else {
                return false;
            };
            let Slot::Live {
                value: Some(value),
                written,
                ..
            } = slot
            else {
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

    /// Entries (values) over every state and key group.
    fn entries(&self) -> usize {
        self.groups
            .iter()
            .flat_map(Group::values)
            .map(|row| row.iter().flatten().count())
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
        self.tables.push(Table {
            name: name.to_owned(),
            kind,
        });
        Ok(StateId((self.tables.len() - 1) as u32))
    }

    fn get(&self, state: StateId, key: &Key) -> Result<Option<Dynamic>> {
        match self.slot(state, key)? {
            Some(Slot::Live { value, .. }) => Ok(value.clone()),
            Some(Slot::Packed(bytes)) => decode_value(bytes).map(Some),
            None => Ok(None),
        }
    }

    fn read(&self, state: StateId, key: &Key, f: &mut dyn FnMut(Option<&Dynamic>)) -> Result<()> {
        match self.slot(state, key)? {
            Some(slot) => f(slot.value()?.as_deref()),
            None => f(None),
        }
        Ok(())
    }

    fn lend(&self, state: StateId, key: &Key) -> Option<Result<Option<Cow<'_, Dynamic>>>> {
        Some(
            self.slot(state, key)
                .and_then(|slot| slot.map_or(Ok(None), Slot::value)),
        )
    }

    fn update(
        &mut self,
        state: StateId,
        key: &Key,
        f: &mut dyn FnMut(&mut Option<Dynamic>),
    ) -> Result<()> {
        let g = self.group_index(state, key)?;
        self.generation += 1;
        let written = self.period;
        let states = self.tables.len();
        let group = &mut self.groups[g];
        // Whether the value becomes a live map or list from packed or absent: a sweep looks
        // at it.
        let fresh = if let Some(row) = group.get_mut(key) {
            let v = cell_mut(row, state);
            // A live value is handed to `f` where it is; a packed one is decoded first.
            let unpacked = !matches!(v, Some(Slot::Live { .. }));
            if unpacked {
                let value = match v {
                    Some(Slot::Packed(bytes)) => Some(decode_value(bytes)?),
                    _ => None,
                };
                *v = Some(Slot::Live {
                    value,
                    written,
                    hot: true,
                });
            }
            let Some(Slot::Live {
                value,
                written: w,
                hot,
            }) = v
            else {
                return Err(RunError::State(
                    "a state slot was not live after it was made live".into(),
                ));
            };
            f(value);
            match value {
                Some(new) => {
                    *w = written;
                    *hot = true;
                    unpacked && container(new)
                }
                None => {
                    *v = None;
                    if row.iter().all(Option::is_none) {
                        group.remove(key);
                    }
                    false
                }
            }
        } else {
            let mut slot = None;
            f(&mut slot);
            match slot {
                Some(new) => {
                    let fresh = container(&new);
                    let mut row = Row::new();
                    row.resize_with(states.max(state.0 as usize + 1), || None);
                    row[state.0 as usize] = Some(Slot::Live {
                        value: Some(new),
                        written,
                        hot: true,
                    });
                    group.insert_new(key.clone(), row);
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

    fn prefetch(&self, key: &Key, reach: Reach) {
        let Some(group) = key
            .key_group(self.max_parallelism)
            .checked_sub(self.range.start)
            .and_then(|g| self.groups.get(g as usize))
        else {
            return;
        };
        if reach == Reach::Row {
            group.hint(key);
            return;
        }
        let Some(row) = group.peek(key) else {
            return;
        };
        for slot in row.iter().flatten() {
            match slot {
                Slot::Live { value, .. } => {
                    if let Some(value) = value {
                        prefetch::reach(value, reach);
                    }
                }
                Slot::Packed(bytes) => prefetch::line(bytes.as_ptr()),
            }
        }
    }

    fn keys_in(&self, state: StateId, range: KeyGroupRange) -> Result<Vec<Key>> {
        if state.0 as usize >= self.tables.len() {
            return Err(RunError::State(format!("unknown state handle {}", state.0)));
        }
        let start = range.start.max(self.range.start);
        let end = range.end.min(self.range.end).max(start);
        let groups = &self.groups[(start - self.range.start) as usize..(end - self.range.start) as usize];
        Ok(groups
            .iter()
            .flat_map(|g| g.iter())
            .filter(|(_, row)| cell(row, state).is_some())
            .map(|(k, _)| k.clone())
            .collect())
    }

    fn snapshot(&self, range: KeyGroupRange) -> Result<Vec<u8>> {
        let mut w = SnapshotWriter::new(self.max_parallelism, self.tables.len() as u32);
        let in_range = |i: usize| range.contains(self.range.start + i as u32);
        let keys: usize = self
            .groups
            .iter()
            .enumerate()
            .filter(|(i, _)| in_range(*i))
            .map(|(_, g)| g.len())
            .sum();
        // A rough guess (key group, short key, small value) that saves most regrowth.
        w.reserve(keys * self.tables.len() * 24);
        for (t, table) in self.tables.iter().enumerate() {
            let state = StateId(t as u32);
            w.begin_state(&table.name, table.kind)?;
            for (i, g) in self.groups.iter().enumerate() {
                if !in_range(i) {
                    continue;
                }
                let kg = self.range.start + i as u32;
                for (k, row) in g.iter() {
                    let Some(v) = cell(row, state) else { continue };
                    match v {
                        Slot::Live { value: Some(value), .. } => w.entry(kg, k, value)?,
                        Slot::Live { value: None, .. } => {}
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
        for (t, table) in self.tables.iter().enumerate() {
            w.begin_state(&table.name, table.kind)?;
            for (i, g) in self.groups.iter_mut().enumerate() {
                let kg = self.range.start + i as u32;
                for (k, row) in g.iter_mut() {
                    let Some(Some(v)) = row.get_mut(t) else { continue };
                    match v {
                        // Written since the last checkpoint: likely written again soon.
                        Slot::Live { value: None, .. } => {}
                        Slot::Live {
                            value: Some(value),
                            hot,
                            ..
                        } if *hot => {
                            w.entry(kg, k, value)?;
                            *hot = false;
                        }
                        Slot::Live {
                            value: Some(value), ..
                        } if packable(value) => {
                            encode(&mut buf, value)?;
                            w.entry_encoded(kg, k.value(), &buf)?;
                            *v = Slot::Packed(buf.as_slice().into());
                        }
                        Slot::Live {
                            value: Some(value), ..
                        } => w.entry(kg, k, value)?,
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
                        let t = self.register(name, kind)?;
                        // Room for an even share of the entries in each of our key groups,
                        // so that a large restore does not rehash every map repeatedly (the
                        // keys of later states are mostly those of the first).
                        let share = entries as usize / self.max_parallelism.max(1) as usize;
                        for g in &mut self.groups {
                            g.reserve(share.saturating_sub(g.len()));
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
                        let states = self.tables.len();
                        let group = &mut self.groups[(own - self.range.start) as usize];
                        // Checked now, so that a damaged snapshot fails the restore and not
                        // a later read.
                        let live = decode_value(value)?;
                        let slot = if packable(&live) {
                            Slot::Packed(value.into())
                        } else {
                            Slot::Live {
                                value: Some(live),
                                written: self.period,
                                hot: false,
                            }
                        };
                        let row = group.get_or_insert_with(key, || {
                            let mut row = Row::new();
                            row.resize_with(states, || None);
                            row
                        });
                        *cell_mut(row, t) = Some(slot);
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

    use super::{Group, MemoryBackend, Row, SWEEP_EVERY, Slot};
    use crate::record::{Key, KeyGroupRange, map_of};
    use crate::state::StateBackend;

    /// Whether `state`'s value of `k` is held packed.
    fn is_packed(b: &MemoryBackend, state: usize, k: &Key) -> bool {
        let kg = (k.key_group(b.max_parallelism) - b.range.start) as usize;
        matches!(
            b.groups[kg].get(k).and_then(|row| row[state].as_ref()),
            Some(Slot::Packed(_))
        )
    }

    fn key(i: usize) -> Key {
        Key::from_str_value(format!("k{i}").into())
    }

    /// A key's row holds each state's value apart: a state registered after the row was made
    /// grows it when written, clearing one state leaves the others, a snapshot keeps them
    /// apart, and the row leaves its map with its last value.
    #[test]
    fn rows_hold_each_state_apart_and_leave_with_their_last_value() {
        let m = 8;
        let all = KeyGroupRange::all(m);
        let mut b = MemoryBackend::new(m, all);
        let a = b.register("a", StateKind::Value).unwrap();
        let k = Key::from_str_value("k".into());
        let other = Key::from_str_value("other".into());
        b.put(a, &k, Dynamic::from_int(1)).unwrap();
        let c = b.register("c", StateKind::List).unwrap();
        assert!(b.get(c, &k).unwrap().is_none());
        b.list_push(c, &k, Dynamic::from_int(2)).unwrap();
        b.list_push(c, &other, Dynamic::from_int(3)).unwrap();
        assert_eq!(b.keys_in(a, all).unwrap(), vec![k.clone()]);
        assert_eq!(b.keys_in(c, all).unwrap().len(), 2);
        b.clear(a, &k).unwrap();
        assert!(b.keys_in(a, all).unwrap().is_empty());
        assert!(b.get(a, &k).unwrap().is_none());
        assert_eq!(b.get(c, &k).unwrap().unwrap().to_string(), "[2]");
        b.put(a, &other, Dynamic::from_int(4)).unwrap();
        let snapshot = b.snapshot(all).unwrap();
        let mut r = MemoryBackend::new(m, all);
        r.restore(&[&snapshot]).unwrap();
        let (ra, rc) = (
            r.register("a", StateKind::Value).unwrap(),
            r.register("c", StateKind::List).unwrap(),
        );
        assert!(r.get(ra, &k).unwrap().is_none());
        assert_eq!(r.get(ra, &other).unwrap().unwrap().as_int(), Ok(4));
        assert_eq!(r.get(rc, &k).unwrap().unwrap().to_string(), "[2]");
        assert_eq!(r.entries(), 3);
        assert_eq!(r.snapshot(all).unwrap().len(), snapshot.len());
        b.clear(c, &k).unwrap();
        assert!(b.groups.iter().all(|g| !g.contains_key(&k)));
        assert_eq!(b.entries(), 2);
        assert!(b.get(c, &k).is_ok_and(|v| v.is_none()));
    }

    #[test]
    fn a_group_finds_each_key_after_its_remembered_bucket_went_stale() {
        let row = |v: i64| -> Row {
            let mut row = Row::new();
            row.push(Some(Slot::Live {
                value: Some(Dynamic::from(v)),
                written: 0,
                hot: false,
            }));
            row
        };
        let value = |g: &Group, k: &Key| match g.get(k)?.first()? {
            Some(Slot::Live { value, .. }) => value.as_ref()?.as_int().ok(),
            _ => None,
        };
        let mut g = Group::default();
        g.insert_new(key(0), row(0));
        assert_eq!(value(&g, &key(0)), Some(0));
        // The remembered bucket emptied, then refilled by another key.
        g.remove(&key(0));
        assert_eq!(value(&g, &key(0)), None);
        g.insert_new(key(1), row(1));
        assert_eq!(value(&g, &key(0)), None);
        assert_eq!(value(&g, &key(1)), Some(1));
        // Growing moves the entries: each key is found again after another was found last.
        for i in 2..2000 {
            g.insert_new(key(i), row(i as i64));
            assert_eq!(value(&g, &key(i / 2)), Some((i / 2) as i64));
        }
        *g.get_mut(&key(7)).unwrap() = row(70);
        *g.get_or_insert_with(key(2000), || row(0)) = row(2000);
        // Held already: kept as it is.
        g.get_or_insert_with(key(5), || row(0));
        assert_eq!(g.len(), 2000);
        for i in 1..=2000 {
            let want = if i == 7 { 70 } else { i as i64 };
            assert_eq!(value(&g, &key(i)), Some(want), "key {i}");
        }
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
            b.groups
                .iter()
                .flat_map(|g| g.values())
                .all(|row| matches!(row[0], Some(Slot::Live { .. })))
        };
        assert!(live(&b));
        drop(b.checkpoint(2).unwrap());
        let packed = |b: &MemoryBackend, i: i64| {
            let k = key(i);
            matches!(
                b.groups[k.key_group(m) as usize].get(&k).map(|row| &row[0]),
                Some(Some(Slot::Packed(_)))
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
