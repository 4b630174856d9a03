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
//! Without checkpoints nothing is packed. Packed values are copied into later snapshots as
//! they are, so that a checkpoint of mostly cold state costs a copy, not an encoding.

use std::borrow::Cow;
use std::collections::HashMap;

use rhai::Dynamic;
use weir_schema::StateKind;

use super::canonical::{SnapshotItem, SnapshotWriter, decode_value, read_snapshot};
use super::{CanonicalSnapshot, PendingSnapshot, StateBackend, StateId};
use crate::base::error::{Result, RunError};
use crate::checkpoint::CheckpointId;
use crate::record::{Key, KeyBuildHasher, KeyGroupRange};

/// A stored value: live or packed (see the module docs).
enum Slot {
    /// Decoded, as reads and updates see it; `hot` when written since the last checkpoint.
    Live(Dynamic, bool),
    /// Its canonical encoding (one MessagePack value, as [`decode_value`] reads it).
    Packed(Box<[u8]>),
}

impl Slot {
    /// The value, decoded if packed.
    fn value(&self) -> Result<Cow<'_, Dynamic>> {
        match self {
            Self::Live(v, _) => Ok(Cow::Borrowed(v)),
            Self::Packed(bytes) => decode_value(bytes).map(Cow::Owned),
        }
    }

    /// The value, taken out if live (leaving unit) or decoded if packed (leaving the bytes):
    /// the caller stores the new value.
    fn take(&mut self) -> Result<Dynamic> {
        match self {
            Self::Live(v, _) => Ok(std::mem::take(v)),
            Self::Packed(bytes) => decode_value(bytes),
        }
    }
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
}

impl MemoryBackend {
    /// An empty backend for `range` out of `max_parallelism` key groups.
    pub fn new(max_parallelism: u32, range: KeyGroupRange) -> Self {
        Self {
            max_parallelism,
            range,
            tables: Vec::new(),
            generation: 0,
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
            Some(Slot::Live(v, _)) => Ok(Some(v.clone())),
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
        let group = self.group_mut(state, key)?;
        if let Some(v) = group.get_mut(key) {
            let mut slot = Some(v.take()?);
            f(&mut slot);
            match slot {
                Some(new) => *v = Slot::Live(new, true),
                None => {
                    group.remove(key);
                }
            }
        } else {
            let mut slot = None;
            f(&mut slot);
            if let Some(new) = slot {
                group.insert(key.clone(), Slot::Live(new, true));
            }
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
                        Slot::Live(v, _) => w.entry(kg, k, v)?,
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
                        Slot::Live(live, hot) if *hot => {
                            w.entry(kg, k, live)?;
                            *hot = false;
                        }
                        Slot::Live(live, _) if packable(live) => {
                            buf.clear();
                            rmp_serde::encode::write(&mut buf, &*live).map_err(|e| {
                                RunError::State(format!("cannot encode state value: {e}"))
                            })?;
                            w.entry_encoded(kg, k.value(), &buf)?;
                            *v = Slot::Packed(buf.as_slice().into());
                        }
                        Slot::Live(live, _) => w.entry(kg, k, live)?,
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
                            Slot::Live(live, false)
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

    use super::{MemoryBackend, Slot};
    use crate::record::{Key, KeyGroupRange, map_of};
    use crate::state::StateBackend;

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
                .all(|v| matches!(v, Slot::Live(..)))
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
