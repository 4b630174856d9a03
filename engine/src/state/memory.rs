//! The memory backend: one hash map per (state, key group) holding live values. Reads and
//! updates touch the maps directly (no encoding); a snapshot streams the requested key groups
//! into the canonical format, and a restore decodes straight into the maps.

use std::collections::HashMap;

use rhai::Dynamic;
use weir_schema::StateKind;

use super::canonical::{SnapshotItem, SnapshotWriter, decode_value, read_snapshot};
use super::{StateBackend, StateId};
use crate::base::error::{Result, RunError};
use crate::record::{Key, KeyBuildHasher, KeyGroupRange};

type Group = HashMap<Key, Dynamic, KeyBuildHasher>;

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
        Ok(self.group(state, key)?.get(key).cloned())
    }

    fn read(&self, state: StateId, key: &Key, f: &mut dyn FnMut(Option<&Dynamic>)) -> Result<()> {
        f(self.group(state, key)?.get(key));
        Ok(())
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
            let mut slot = Some(std::mem::take(v));
            f(&mut slot);
            match slot {
                Some(new) => *v = new,
                None => {
                    group.remove(key);
                }
            }
        } else {
            let mut slot = None;
            f(&mut slot);
            if let Some(new) = slot {
                group.insert(key.clone(), new);
            }
        }
        Ok(())
    }

    fn keys(&self, state: StateId) -> Result<Vec<Key>> {
        let table = self
            .tables
            .get(state.0 as usize)
            .ok_or_else(|| RunError::State(format!("unknown state handle {}", state.0)))?;
        Ok(table
            .groups
            .iter()
            .flat_map(|g| g.keys().cloned())
            .collect())
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
                    w.entry(kg, k, v)?;
                }
            }
        }
        w.finish()
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
                        group.insert(key, decode_value(value)?);
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
