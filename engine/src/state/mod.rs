//! Keyed state: the [`StateBackend`] trait every backend implements (`memory`, which the
//! `fs` backend also uses with its checkpoints on disk, and `rocksdb`), partitioned by key
//! group, with named value, list and map states per key, and snapshot/restore by key-group
//! range. Operators reach state only through this trait; the backend decides when values are
//! encoded (the memory backend keeps recently written values decoded and packs cold maps and
//! lists into their snapshot encoding, see [`memory`]).
//!
//! `conformance` holds the test suite every backend must pass (tests only); `snapshot_files`
//! owns the on-disk layout of a subtask's snapshot files in a checkpoint and their
//! redistribution on rescale, which the task loop calls; `timers` keeps an operator's keyed
//! event- and processing-time timers in a backend's map states; `ttl` keeps the expiry times
//! of states with a time-to-live, also in a map state.

use std::borrow::Cow;

use rhai::{Dynamic, Map};
use weir_schema::StateKind;

use crate::base::error::{Result, RunError};
use crate::checkpoint::storage::{read_verified, write_file};
use crate::checkpoint::{CheckpointId, CheckpointStore, FileRef};
use crate::record::{Key, KeyGroupRange};

pub mod canonical;
#[cfg(test)]
pub(crate) mod conformance;
pub mod handover;
pub mod memory;
mod prefetch;
pub use prefetch::{Reach, RecordPrefetch, prefetch_ahead};
pub mod rocksdb;
pub mod snapshot_files;
pub mod timers;
pub mod ttl;

#[cfg(any(test, feature = "testkit"))]
pub use self::rocksdb::RocksdbBackend;
pub use memory::MemoryBackend;

/// The version written at the head of every snapshot.
pub const SNAPSHOT_VERSION: u32 = 1;

/// File-name suffix of a canonical keyed-state snapshot (the [`StateBackend::snapshot`]
/// format, which every backend can restore).
pub const CANONICAL_SUFFIX: &str = ".keyed";

/// Where one backend writes one checkpoint, as store-relative path prefixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotTarget {
    /// The checkpoint being written.
    pub checkpoint: CheckpointId,
    /// Prefix of files owned by this checkpoint alone, e.g. `chk-7/count-1`; a backend
    /// appends a suffix (`.keyed`, `.rocksdb`, ...).
    pub private_prefix: String,
    /// Prefix of files several checkpoints may share, e.g. `shared/count-1`; a backend
    /// appends a unique suffix. Backends with full snapshots do not use it.
    pub shared_prefix: String,
}

/// The asynchronous half of a checkpoint: state frozen at the barrier, written to the store
/// off the task while processing goes on.
pub trait PendingSnapshot: Send {
    /// Writes the frozen state and returns every file the checkpoint references (shared files
    /// included, also those written by earlier checkpoints).
    ///
    /// # Errors
    /// Storage failures; the checkpoint is declined.
    fn write(
        self: Box<Self>,
        store: &dyn CheckpointStore,
        target: &SnapshotTarget,
    ) -> Result<Vec<FileRef>>;
}

/// A canonical snapshot already encoded at the barrier: one private `.keyed` file.
pub struct CanonicalSnapshot(pub Vec<u8>);

impl PendingSnapshot for CanonicalSnapshot {
    fn write(
        self: Box<Self>,
        store: &dyn CheckpointStore,
        target: &SnapshotTarget,
    ) -> Result<Vec<FileRef>> {
        let path = format!("{}{CANONICAL_SUFFIX}", target.private_prefix);
        Ok(vec![write_file(store, &path, &self.0)?])
    }
}

/// Reads the canonical `.keyed` files among `files` (checksum-verified); a file of another
/// backend's native format is refused with an error naming the backend that wrote it.
///
/// # Errors
/// Unreadable or corrupt files, or files of another backend's native format.
pub fn read_canonical(store: &dyn CheckpointStore, files: &[FileRef]) -> Result<Vec<Vec<u8>>> {
    let mut blobs = Vec::new();
    for f in files {
        if f.path.ends_with(CANONICAL_SUFFIX) {
            blobs.push(read_verified(store, f)?);
        } else if f.path.ends_with(".rocksdb") {
            return Err(RunError::StateMismatch(format!(
                "checkpoint file `{}` was written by the rocksdb state backend, which this \
                 pipeline no longer uses; restore with `state: {{backend: rocksdb}}`, or start \
                 over with `--fresh` (a savepoint can move state between backends)",
                f.path
            )));
        }
    }
    Ok(blobs)
}

/// Where an end-of-input pass over the keys of some states stands: operators that emit one
/// result per key at the end of a bounded input visit the keys one key group at a time and
/// return after about [`END_CHUNK`] results (see [`crate::element::Operator::end_pending`]),
/// so that neither every key nor every result is held at once.
#[derive(Debug, Default)]
pub struct EndCursor {
    /// The next key group to visit and the end of the backend's range; `None` before the
    /// first visit.
    at: Option<(u32, u32)>,
}

/// Results an end-of-input pass emits per call, about (it stops after the key group that
/// reaches it).
pub const END_CHUNK: usize = 4096;

impl EndCursor {
    /// The keys of the next key group of `state`'s backend holding a value of any of
    /// `states` that `keep(backend, state, key)` accepts, each once; `None` when every key
    /// group was visited.
    ///
    /// # Errors
    /// Backend failures, and `keep`'s.
    pub fn next_keys(
        &mut self,
        state: &dyn StateBackend,
        states: &[StateId],
        mut keep: impl FnMut(&dyn StateBackend, StateId, &Key) -> Result<bool>,
    ) -> Result<Option<Vec<Key>>> {
        let range = state.key_groups();
        let (kg, end) = self.at.unwrap_or((range.start, range.end));
        if kg >= end {
            self.at = Some((end, end));
            return Ok(None);
        }
        self.at = Some((kg + 1, end));
        let one = KeyGroupRange {
            start: kg,
            end: kg + 1,
        };
        let mut keys = Vec::new();
        let mut seen: std::collections::HashSet<Key, crate::record::KeyBuildHasher> =
            std::collections::HashSet::default();
        for &id in states {
            for k in state.keys_in(id, one)? {
                if !seen.contains(&k) && keep(state, id, &k)? {
                    if states.len() > 1 {
                        seen.insert(k.clone());
                    }
                    keys.push(k);
                }
            }
        }
        Ok(Some(keys))
    }

    /// Whether a pass started and has key groups left to visit.
    pub fn pending(&self) -> bool {
        self.at.is_some_and(|(kg, end)| kg < end)
    }
}

/// Handle of a registered named state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateId(pub u32);

/// Keyed state storage for one operator subtask, covering one key-group range.
///
/// Call order: [`register`](Self::register) every named state (in `open`), then optionally
/// [`restore`](Self::restore) before the first record, then reads and writes, with
/// [`snapshot`](Self::snapshot) at any point between records. Keys outside the backend's key
/// groups are a caller bug and may be rejected.
pub trait StateBackend: Send {
    /// The key groups this backend holds.
    fn key_groups(&self) -> KeyGroupRange;

    /// Declares a named state of a kind and returns its handle; registering the same name
    /// again returns the same handle.
    ///
    /// # Errors
    /// When the name is already registered with another kind.
    fn register(&mut self, name: &str, kind: StateKind) -> Result<StateId>;

    /// A copy of the key's value of a state, if present.
    ///
    /// # Errors
    /// Backend failures (I/O, decoding).
    fn get(&self, state: StateId, key: &Key) -> Result<Option<Dynamic>>;

    /// Updates the key's value in place: `f` sees the current value (`None` when absent) and
    /// may change it; leaving `None` removes it. The hot path of keyed operators.
    ///
    /// # Errors
    /// Backend failures (I/O, encoding).
    fn update(
        &mut self,
        state: StateId,
        key: &Key,
        f: &mut dyn FnMut(&mut Option<Dynamic>),
    ) -> Result<()>;

    /// Lets `f` read the key's value of a state in place (`None` when absent), without the
    /// copy [`get`](Self::get) makes. The default copies; backends that hold decoded values
    /// lend them.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn read(&self, state: StateId, key: &Key, f: &mut dyn FnMut(Option<&Dynamic>)) -> Result<()> {
        let value = self.get(state, key)?;
        f(value.as_ref());
        Ok(())
    }

    /// Lends the key's value of a state for as long as the backend is not written, when the
    /// backend holds values decoded: `Some(Ok(None))` when absent; a value the backend keeps
    /// encoded comes as a decoded copy. `None`: this backend does not lend (the default); use
    /// [`read`](Self::read), which does not hold the backend borrowed. A caller that reads one
    /// key's value several times between writes asks once.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn lend(&self, _state: StateId, _key: &Key) -> Option<Result<Option<Cow<'_, Dynamic>>>> {
        None
    }

    /// A hint that `key`'s values are about to be read and written (a few records from now):
    /// a backend may start bringing them into the processor's caches, so that the accesses,
    /// when they come, do not wait on memory one after the other. `reach` says how far into
    /// the key's state this hint goes (see [`Reach`]). Nothing it does can be observed; the
    /// default does nothing.
    fn prefetch(&self, _key: &Key, _reach: Reach) {}

    /// Every key holding a value of `state`, in no particular order.
    ///
    /// # Errors
    /// Backend failures.
    fn keys(&self, state: StateId) -> Result<Vec<Key>> {
        self.keys_in(state, self.key_groups())
    }

    /// The keys holding a value of `state` in the key groups `range` (intersected with the
    /// backend's), in no particular order: a pass over many keys visits them a few key groups
    /// at a time (see [`EndCursor`]) instead of holding every key at once.
    ///
    /// # Errors
    /// Backend failures.
    fn keys_in(&self, state: StateId, range: KeyGroupRange) -> Result<Vec<Key>>;

    /// Writes every state of the key groups in `range` (intersected with the backend's) into a
    /// self-describing, versioned byte string.
    ///
    /// # Errors
    /// When a value cannot be encoded.
    fn snapshot(&self, range: KeyGroupRange) -> Result<Vec<u8>>;

    /// Loads snapshots (possibly taken by other subtasks at another parallelism), keeping only
    /// the entries whose key group this backend holds. Call before the first record.
    ///
    /// # Errors
    /// A malformed or unknown-version snapshot.
    fn restore(&mut self, snapshots: &[&[u8]]) -> Result<()>;

    /// The synchronous half of a checkpoint, at the barrier: freezes the state so that later
    /// writes do not show in it. The default encodes a canonical snapshot of every key group
    /// now (a full snapshot); RocksDB takes a native checkpoint instead.
    ///
    /// # Errors
    /// When the state cannot be frozen or encoded.
    fn checkpoint(&mut self, _checkpoint: CheckpointId) -> Result<Box<dyn PendingSnapshot>> {
        Ok(Box::new(CanonicalSnapshot(
            self.snapshot(self.key_groups())?,
        )))
    }

    /// A number that changes whenever the stored state may have changed (any write or
    /// restore), so that a caller can tell that nothing changed between two points; `None`
    /// when the backend does not track it (then [`handover`] never moves it).
    fn generation(&self) -> Option<u64> {
        None
    }

    /// The backend was handed to a new version of its pipeline ([`handover`]), whose
    /// checkpoints do not know the old version's: forget which stored files earlier
    /// checkpoints hold (an incremental backend uploads everything on its next checkpoint,
    /// as after a restore).
    fn detach_checkpoints(&mut self) {}

    /// Checkpoint `checkpoint` completed everywhere: incremental backends may now reuse the
    /// shared files it references.
    fn checkpoint_complete(&mut self, _checkpoint: CheckpointId) {}

    /// Restores from the checkpoint files of this operator: those of every old subtask whose
    /// key groups overlap this backend's (so a rescale works). Call after registering states
    /// and before the first record. The default accepts canonical `.keyed` files.
    ///
    /// # Errors
    /// Unreadable, corrupt or foreign files.
    fn restore_files(&mut self, store: &dyn CheckpointStore, files: &[FileRef]) -> Result<()> {
        let blobs = read_canonical(store, files)?;
        let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
        self.restore(&refs)
    }

    /// Sets the key's value.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    fn put(&mut self, state: StateId, key: &Key, value: Dynamic) -> Result<()> {
        let mut value = Some(value);
        self.update(state, key, &mut |slot| *slot = value.take())
    }

    /// Removes the key's value.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    fn clear(&mut self, state: StateId, key: &Key) -> Result<()> {
        self.update(state, key, &mut |slot| *slot = None)
    }

    /// Appends to a list state.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    fn list_push(&mut self, state: StateId, key: &Key, value: Dynamic) -> Result<()> {
        let mut value = Some(value);
        self.update(state, key, &mut |slot| {
            let v = value.take().unwrap_or(Dynamic::UNIT);
            if let Some(mut list) = slot.as_mut().and_then(|d| d.as_array_mut().ok()) {
                list.push(v);
                return;
            }
            *slot = Some(Dynamic::from_array(vec![v]));
        })
    }

    /// The number of items of a list state (`0` when absent).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    fn list_len(&self, state: StateId, key: &Key) -> Result<usize> {
        let mut len = 0;
        self.read(state, key, &mut |v| {
            len = v
                .and_then(|d| d.as_array_ref().ok().map(|l| l.len()))
                .unwrap_or(0);
        })?;
        Ok(len)
    }

    /// Removes and returns the last (newest) item of a list state; `None` when it is empty.
    /// A list left empty is removed.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    fn list_pop(&mut self, state: StateId, key: &Key) -> Result<Option<Dynamic>> {
        let mut popped = None;
        self.update(state, key, &mut |slot| {
            let Some(mut list) = slot.as_mut().and_then(|d| d.as_array_mut().ok()) else {
                return;
            };
            popped = list.pop();
            let empty = list.is_empty();
            drop(list);
            if empty {
                *slot = None;
            }
        })?;
        Ok(popped)
    }

    /// Keeps only the last (newest) `keep` items of a list state and returns how many were
    /// removed. A list left empty is removed.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    fn list_trim(&mut self, state: StateId, key: &Key, keep: usize) -> Result<usize> {
        let mut removed = 0;
        self.update(state, key, &mut |slot| {
            let Some(mut list) = slot.as_mut().and_then(|d| d.as_array_mut().ok()) else {
                return;
            };
            removed = list.len().saturating_sub(keep);
            list.drain(..removed);
            let empty = list.is_empty();
            drop(list);
            if empty {
                *slot = None;
            }
        })?;
        Ok(removed)
    }

    /// Sets an entry of a map state.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    fn map_put(&mut self, state: StateId, key: &Key, field: &str, value: Dynamic) -> Result<()> {
        let mut value = Some(value);
        self.update(state, key, &mut |slot| {
            let v = value.take().unwrap_or(Dynamic::UNIT);
            if let Some(mut map) = slot.as_mut().and_then(|d| d.as_map_mut().ok()) {
                map.insert(field.into(), v);
                return;
            }
            let mut map = Map::new();
            map.insert(field.into(), v);
            *slot = Some(Dynamic::from_map(map));
        })
    }

    /// Reads an entry of a map state.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn map_get(&self, state: StateId, key: &Key, field: &str) -> Result<Option<Dynamic>> {
        let mut entry = None;
        self.read(state, key, &mut |v| {
            entry = v.and_then(|d| d.as_map_ref().ok().and_then(|m| m.get(field).cloned()));
        })?;
        Ok(entry)
    }

    /// Removes an entry of a map state. A map left empty is removed.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    fn map_remove(&mut self, state: StateId, key: &Key, field: &str) -> Result<()> {
        self.update(state, key, &mut |slot| {
            let Some(mut map) = slot.as_mut().and_then(|d| d.as_map_mut().ok()) else {
                return;
            };
            map.remove(field);
            let empty = map.is_empty();
            drop(map);
            if empty {
                *slot = None;
            }
        })
    }

    /// The number of entries of a map state (`0` when absent).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    fn map_len(&self, state: StateId, key: &Key) -> Result<usize> {
        let mut len = 0;
        self.read(state, key, &mut |v| {
            len = v
                .and_then(|d| d.as_map_ref().ok().map(|m| m.len()))
                .unwrap_or(0);
        })?;
        Ok(len)
    }

    /// The entry names of a map state, in order (empty when absent).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    fn map_keys(&self, state: StateId, key: &Key) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        self.read(state, key, &mut |v| {
            if let Some(m) = v.and_then(|d| d.as_map_ref().ok()) {
                keys.extend(m.keys().map(|k| k.to_string()));
            }
        })?;
        Ok(keys)
    }
}
