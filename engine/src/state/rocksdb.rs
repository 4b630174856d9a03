//! The rocksdb state backend: keyed state of one operator subtask in an embedded RocksDB
//! instance on local disk, so that state may exceed memory, with native (and optionally
//! incremental) checkpoints. It owns its instance's working directory (created in
//! [`RocksdbBackend::open`], removed on drop), the key and value encoding, and the native
//! checkpoint format (a `.rocksdb` manifest plus the database files); it must not touch
//! files of the checkpoint store other than those it writes, nor decide retention (it only
//! reports every file a checkpoint references, and `checkpoint::retention` decides).
//!
//! **Layout.** One default column family. A key is `key group (big-endian, 2 bytes, or 4 when
//! max_parallelism > 65536) ‖ state id (big-endian u16) ‖ the key's bytes` (a type tag, then
//! the string, integer, boolean or JSON text), so that one key group is one contiguous range
//! and rescaling copies ranges. Values are MessagePack ([`crate::record::encode`]). Writes
//! skip the write-ahead log: checkpoints provide durability, as in Flink.
//!
//! **Value cache.** In front of the database sits a bounded write-back cache of decoded values
//! (per state, keyed by [`Key`], each an `Option<Dynamic>` plus a dirty flag), so that the hot
//! path ([`StateBackend::update`]) is a hash-table probe and a closure call rather than a
//! RocksDB read, a decode, an encode and a RocksDB write. A miss loads the value (or its
//! absence) from the database. Dirty entries are written back in one [`WriteBatch`] (WAL off;
//! an entry left `None` becomes a delete) before anything reads the database as a whole: the
//! synchronous half of a checkpoint (before the memtables are flushed, so the checkpoint holds
//! every update), [`StateBackend::snapshot`], [`StateBackend::keys`], [`RocksdbBackend::compact`]
//! and restores (which then empty the cache). The cache holds at most
//! [`DEFAULT_CACHE_ENTRIES`] entries (see [`RocksdbBackend::set_cache_capacity`]) and at
//! most [`DEFAULT_CACHE_BYTES`] estimated bytes ([`entry_bytes`]: a fixed share per entry plus
//! the decoded value's heap, estimated when the entry is cached and again whenever it is
//! written back); when a miss finds it full, every dirty entry is written back and the whole
//! cache is emptied (a simple, predictable policy: at most one write batch per `capacity`
//! distinct keys).
//!
//! **Memory model.** A process's RocksDB memory is bounded by configuration, not by the
//! number of keys: (1) one LRU block cache of `block_cache_size` shared by every instance of
//! the process opened with the same sizes (not one per subtask), holding data, index and
//! filter blocks; (2) memtables of `write_buffer_size` each, all instances' together limited
//! to twice that by one write-buffer manager whose memory is charged to the same block cache,
//! so that blocks and memtables together stay near `block_cache_size`; (3) per instance, the
//! value cache above, at most [`DEFAULT_CACHE_BYTES`]. Nothing holds every key: a restore
//! opens the downloaded database (or copies entries in batches of 4096), and an end-of-input
//! pass visits the keys one key group at a time ([`super::EndCursor`]).
//!
//! **Native checkpoints.** [`StateBackend::checkpoint`] flushes the memtables and takes a
//! RocksDB checkpoint (hard links) into a local directory; the [`PendingSnapshot`] it returns
//! uploads that directory and deletes it. With `incremental: true` the SST files go to the
//! shared paths `<shared_prefix>-<instance>-<sst name>` and an SST already referenced by a
//! completed checkpoint (see [`StateBackend::checkpoint_complete`]) is referenced again, not
//! uploaded again; only SSTs of the newest completed checkpoint are reused (when the newest is
//! a savepoint, written canonically, none are: retention may delete the older checkpoint's
//! files). With `incremental: false` every file, SSTs included, is uploaded privately
//! under `<private_prefix>.rocksdb-files/` on every checkpoint (a full copy, deleted with its
//! checkpoint). Either way the other database files (`CURRENT`, `MANIFEST-*`, `OPTIONS-*`)
//! are private and a small JSON manifest `<private_prefix>.rocksdb` maps each local file name
//! to its store path, size and CRC-32, and records the key groups, `max_parallelism` and the
//! registered states.
//!
//! **Restore.** One manifest of exactly this backend's key groups is downloaded (checksum
//! verified) and opened as the database; its shared SSTs count as uploaded and confirmed.
//! Otherwise (rescaling) each manifest is downloaded into a scratch directory, opened
//! read-only, and the entries of this backend's key groups are copied. Canonical `.keyed`
//! files (from another backend, or [`StateBackend::snapshot`]) are restored as well.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ::rocksdb::checkpoint::Checkpoint;
use ::rocksdb::{
    BlockBasedOptions, Cache, DB, DBCompressionType, FlushOptions, Options, WriteBatch,
    WriteBufferManager, WriteOptions,
};
use rhai::{Dynamic, ImmutableString};
use serde::{Deserialize, Serialize};
use weir_schema::{RocksdbSpec, StateKind};

use super::canonical::{
    SnapshotItem, SnapshotWriter, decode_value, kind_code, kind_of, read_snapshot,
};
use super::{CANONICAL_SUFFIX, PendingSnapshot, Reach, SnapshotTarget, StateBackend, StateId};
use crate::base::error::CheckpointError;
use crate::base::error::{Result, RunError};
use crate::checkpoint::metadata::{KeyGroups, is_shared_path};
use crate::checkpoint::storage::{read_verified, read_verified_to_file, write_file};
use crate::checkpoint::{CheckpointId, CheckpointStore, FileRef};
use crate::record::{Key, KeyBuildHasher, KeyGroupRange, KeyValue, encode};

/// File-name suffix of the manifest of a native rocksdb checkpoint.
pub const NATIVE_SUFFIX: &str = ".rocksdb";

/// Suffix (after the private prefix) of the directory holding a checkpoint's private
/// database files.
const PRIVATE_FILES_SUFFIX: &str = ".rocksdb-files";

/// The `format` field of a manifest.
const MANIFEST_FORMAT: &str = "weir-rocksdb";

/// The manifest version written by this build; restore reads only this one.
const MANIFEST_VERSION: u32 = 1;

/// Default bound of the value cache, in entries (decoded values of keys of any state).
pub const DEFAULT_CACHE_ENTRIES: usize = 100_000;

/// Default bound of the value cache, in estimated bytes ([`entry_bytes`]).
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;

/// Entries copied per write batch when restoring.
const BATCH_ENTRIES: usize = 4096;

/// Key type tags (the first byte after the state id).
const TAG_STR: u8 = 1;
const TAG_INT: u8 = 2;
const TAG_BOOL: u8 = 3;
const TAG_UNIT: u8 = 4;
const TAG_OTHER: u8 = 5;

/// Distinguishes instances opened by one process (with the clock and a random seed).
static INSTANCE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A registered state: its name, kind and the id its entries carry in the database.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StateInfo {
    name: String,
    kind: StateKind,
    db_id: u16,
}

/// How keys are laid out (depends on `max_parallelism` only).
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Bytes of the key-group prefix: 2, or 4 beyond 65536 key groups.
    group_width: usize,
}

impl Layout {
    fn new(max_parallelism: u32) -> Self {
        Self {
            group_width: if max_parallelism <= 1 << 16 { 2 } else { 4 },
        }
    }

    fn push_group(self, out: &mut Vec<u8>, kg: u32) {
        if self.group_width == 2 {
            // kg < max_parallelism <= 65536 here.
            out.extend_from_slice(&(kg as u16).to_be_bytes());
        } else {
            out.extend_from_slice(&kg.to_be_bytes());
        }
    }

    /// `key group ‖ state id`: the prefix of one state's entries in one key group.
    fn prefix(self, kg: u32, state: u16) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.group_width + 2 + 16);
        self.push_group(&mut out, kg);
        out.extend_from_slice(&state.to_be_bytes());
        out
    }

    /// The full database key of `key` in a state.
    fn key(self, kg: u32, state: u16, key: &Key) -> Vec<u8> {
        let mut out = self.prefix(kg, state);
        push_key(&mut out, key);
        out
    }

    /// Splits a database key into key group, state id and the key's bytes.
    fn split(self, raw: &[u8]) -> Option<(u32, u16, &[u8])> {
        let w = self.group_width;
        if raw.len() < w + 2 {
            return None;
        }
        let kg = if w == 2 {
            u32::from(u16::from_be_bytes([raw[0], raw[1]]))
        } else {
            u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]])
        };
        let state = u16::from_be_bytes([raw[w], raw[w + 1]]);
        Some((kg, state, &raw[w + 2..]))
    }
}

/// Appends the canonical bytes of a key: equal keys give equal bytes.
fn push_key(out: &mut Vec<u8>, key: &Key) {
    match key.value() {
        KeyValue::Str(s) => {
            out.push(TAG_STR);
            out.extend_from_slice(s.as_bytes());
        }
        KeyValue::Int(i) => {
            out.push(TAG_INT);
            out.extend_from_slice(&i.to_be_bytes());
        }
        KeyValue::Bool(b) => {
            out.push(TAG_BOOL);
            out.push(u8::from(*b));
        }
        KeyValue::Unit => out.push(TAG_UNIT),
        KeyValue::Other(text) => {
            out.push(TAG_OTHER);
            out.extend_from_slice(text.as_bytes());
        }
    }
}

/// Rebuilds a key from its bytes (see [`push_key`]).
fn parse_key(bytes: &[u8]) -> Option<Key> {
    let (&tag, rest) = bytes.split_first()?;
    match tag {
        TAG_STR => {
            let s = std::str::from_utf8(rest).ok()?;
            Some(Key::from_str_value(ImmutableString::from(s)))
        }
        TAG_INT => {
            let arr: [u8; 8] = rest.try_into().ok()?;
            Some(Key::from_dynamic(&Dynamic::from_int(i64::from_be_bytes(
                arr,
            ))))
        }
        TAG_BOOL => match rest {
            [b] => Some(Key::from_dynamic(&Dynamic::from_bool(*b != 0))),
            _ => None,
        },
        TAG_UNIT => rest.is_empty().then(|| Key::from_dynamic(&Dynamic::UNIT)),
        TAG_OTHER => {
            // Exactly as `Key::to_dynamic` turns such a key back into a value.
            let text = std::str::from_utf8(rest).ok()?;
            let value = serde_json::from_str::<Dynamic>(text)
                .unwrap_or_else(|_| Dynamic::from(ImmutableString::from(text)));
            Some(Key::from_dynamic(&value))
        }
        _ => None,
    }
}

fn encode_value(value: &Dynamic) -> Result<Vec<u8>> {
    encode(value).map_err(|e| RunError::State(format!("cannot encode state value: {e}")))
}

/// A RocksDB error, classed by its kind: I/O trouble (a full disk, a file gone missing, a
/// busy or timed-out file system) is the environment's, corruption is damaged data, anything
/// else (an invalid argument, an unsupported option) a bug in how Weir drives RocksDB.
fn db_err(what: &'static str, path: &Path) -> impl FnOnce(::rocksdb::Error) -> RunError {
    let path = path.to_path_buf();
    move |e| {
        let message = format!("rocksdb: {what} `{}`: {e}", path.display());
        match e.kind() {
            ::rocksdb::ErrorKind::IOError
            | ::rocksdb::ErrorKind::NotFound
            | ::rocksdb::ErrorKind::Busy
            | ::rocksdb::ErrorKind::TimedOut
            | ::rocksdb::ErrorKind::TryAgain => RunError::StateIo(message),
            ::rocksdb::ErrorKind::Corruption => RunError::StateCorrupt(message),
            _ => RunError::State(message),
        }
    }
}

/// A file-system error of the RocksDB backend (its working or checkpoint directories).
fn fs_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RunError {
    let path = path.to_path_buf();
    move |e| RunError::StateIo(format!("rocksdb: {what} `{}`: {e}", path.display()))
}

/// A practically unique id for a database instance: 64 random bits (std's per-process
/// random hash keys) mixed with the process id, a counter and the clock, as 16 hex digits.
/// It names the instance's shared files, so two instances (also of other runs writing to
/// the same store) never overwrite each other's SSTs.
fn unique_instance_id() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(INSTANCE_COUNTER.fetch_add(1, Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    format!("{:016x}", h.finish())
}

/// The intersection of two key-group ranges (empty when they do not overlap).
fn intersect(a: KeyGroupRange, b: KeyGroupRange) -> KeyGroupRange {
    let start = a.start.max(b.start);
    KeyGroupRange {
        start,
        end: a.end.min(b.end).max(start),
    }
}

/// A directory removed (recursively, best effort) when dropped.
#[derive(Debug)]
struct DirGuard(PathBuf);

/// The working directories (`db-<id>`) of the instances open in this process. A new run of a
/// pipeline removes the instance directories a killed process left behind
/// ([`is_open_instance`] tells them from live ones): during a hot reload, the new version
/// takes over the old version's open instances (`state::handover`), whose directories must
/// stay.
static OPEN_INSTANCES: std::sync::LazyLock<std::sync::Mutex<HashSet<PathBuf>>> =
    std::sync::LazyLock::new(Default::default);

fn open_instances() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    OPEN_INSTANCES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The key a directory is registered under: its canonical path, so that `./a/b` and
/// `/cwd/a/b` are one directory.
fn instance_key(dir: &Path) -> PathBuf {
    fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// Whether `dir` is the working directory of an instance open in this process.
pub fn is_open_instance(dir: &Path) -> bool {
    open_instances().contains(&instance_key(dir))
}

/// An instance's working directory (created already): registered as open while it lives,
/// then removed.
#[derive(Debug)]
struct InstanceDir {
    guard: DirGuard,
    key: PathBuf,
}

impl InstanceDir {
    fn new(path: PathBuf) -> Self {
        let key = instance_key(&path);
        open_instances().insert(key.clone());
        Self {
            guard: DirGuard(path),
            key,
        }
    }

    fn path(&self) -> &Path {
        &self.guard.0
    }
}

impl Drop for InstanceDir {
    fn drop(&mut self) {
        // Unregistered first; the guard then removes the directory.
        open_instances().remove(&self.key);
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "Cannot remove RocksDB working directory.");
        }
    }
}

/// Which SST files the store already holds, for incremental checkpoints. Shared between the
/// backend and its pending snapshots.
#[derive(Debug, Default)]
struct Uploads {
    /// SSTs referenced by the newest completed checkpoint (or restored from): local file
    /// name → the stored file. Only these are reused.
    confirmed: HashMap<String, FileRef>,
    /// The checkpoint `confirmed` belongs to (`None` after a restore or before any).
    confirmed_at: Option<CheckpointId>,
    /// Shared SSTs referenced by checkpoints written but not (yet) completed.
    pending: BTreeMap<CheckpointId, HashMap<String, FileRef>>,
}

fn lock(uploads: &Mutex<Uploads>) -> MutexGuard<'_, Uploads> {
    // The map is replaced whole under the lock: a panic elsewhere cannot tear it.
    uploads.lock().unwrap_or_else(|e| e.into_inner())
}

/// The manifest of a native checkpoint, stored as JSON at `<private_prefix>.rocksdb`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    format: String,
    /// [`MANIFEST_VERSION`] when written.
    version: u32,
    /// The checkpoint it belongs to.
    checkpoint: CheckpointId,
    /// The instance that wrote it.
    instance: String,
    /// Number of key groups of the pipeline.
    max_parallelism: u32,
    /// The key groups the database holds.
    key_groups: KeyGroups,
    /// Every registered state.
    states: Vec<ManifestState>,
    /// Every database file: local name → stored file.
    files: Vec<ManifestFile>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct ManifestState {
    name: String,
    kind: u8,
    id: u16,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct ManifestFile {
    name: String,
    file: FileRef,
}

impl Manifest {
    /// Reads, verifies and checks a manifest against the restoring backend.
    fn read(store: &dyn CheckpointStore, file: &FileRef, max_parallelism: u32) -> Result<Self> {
        let bytes = read_verified(store, file)?;
        let corrupt = |reason: String| {
            RunError::Checkpoint(CheckpointError::Corrupt {
                path: file.path.clone(),
                reason,
            })
        };
        let m: Self = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(format!("invalid rocksdb manifest: {e}")))?;
        if m.format != MANIFEST_FORMAT || m.version != MANIFEST_VERSION {
            return Err(corrupt(format!(
                "rocksdb manifest format `{}` v{}, this build reads `{MANIFEST_FORMAT}` v{MANIFEST_VERSION}",
                m.format, m.version
            )));
        }
        if m.max_parallelism != max_parallelism {
            return Err(RunError::StateMismatch(format!(
                "checkpoint `{}` has {} key groups but the pipeline has {max_parallelism}; \
                 max_parallelism cannot change",
                file.path, m.max_parallelism
            )));
        }
        if m.key_groups.start > m.key_groups.end || m.key_groups.end > max_parallelism {
            return Err(corrupt(format!(
                "key groups {}..{} out of 0..{max_parallelism}",
                m.key_groups.start, m.key_groups.end
            )));
        }
        let mut names = HashSet::new();
        for f in &m.files {
            let plain = !f.name.is_empty()
                && f.name != "."
                && f.name != ".."
                && !f.name.contains(['/', '\\', '\0']);
            if !plain || !names.insert(f.name.as_str()) {
                return Err(corrupt(format!("bad or repeated file name `{}`", f.name)));
            }
        }
        let mut ids = HashSet::new();
        let mut state_names = HashSet::new();
        for s in &m.states {
            if kind_of(s.kind).is_none()
                || !ids.insert(s.id)
                || !state_names.insert(s.name.as_str())
            {
                return Err(corrupt(format!("bad or repeated state `{}`", s.name)));
            }
        }
        Ok(m)
    }

    fn range(&self) -> KeyGroupRange {
        self.key_groups.into()
    }

    /// Downloads every file into `dir` (which exists), checksum-verified.
    fn download(&self, store: &dyn CheckpointStore, dir: &Path) -> Result<()> {
        for f in &self.files {
            read_verified_to_file(store, &f.file, &dir.join(&f.name))?;
        }
        Ok(())
    }
}

/// One cached value: the decoded value (`None`: absent), whether the database lags it, and
/// the bytes it was estimated to take ([`entry_bytes`]) when cached or last written back.
#[derive(Debug)]
struct Slot {
    value: Option<Dynamic>,
    dirty: bool,
    bytes: usize,
}

/// The write-back cache of decoded values (see the module docs).
#[derive(Debug, Default)]
struct ValueCache {
    /// Per [`StateId`] (index): key → cached value.
    maps: Vec<HashMap<Key, Slot, KeyBuildHasher>>,
    /// Entries over all maps.
    len: usize,
    /// Estimated bytes over all entries (the sum of their `bytes`).
    bytes: usize,
    /// The entries whose `dirty` flag is set, each once.
    dirty: Vec<(StateId, Key)>,
    /// Bound of `len`.
    capacity: usize,
    /// Bound of `bytes`.
    budget: usize,
}

impl ValueCache {
    fn new(capacity: usize, budget: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            budget,
            ..Self::default()
        }
    }

    /// Whether one more entry must first empty the cache.
    fn full(&self) -> bool {
        self.len >= self.capacity || self.bytes >= self.budget
    }

    /// The map of `state` (which the caller has validated), created on first use.
    fn map(&mut self, state: StateId) -> &mut HashMap<Key, Slot, KeyBuildHasher> {
        let i = state.0 as usize;
        if self.maps.len() <= i {
            self.maps.resize_with(i + 1, HashMap::default);
        }
        &mut self.maps[i]
    }

    /// Caches a value (dirty when the database lags it).
    fn insert(&mut self, state: StateId, key: &Key, value: Option<Dynamic>, dirty: bool) {
        let bytes = entry_bytes(value.as_ref());
        self.map(state).insert(
            key.clone(),
            Slot {
                value,
                dirty,
                bytes,
            },
        );
        self.len += 1;
        self.bytes += bytes;
        if dirty {
            self.dirty.push((state, key.clone()));
        }
    }

    /// Forgets every entry (dirty ones included: write them back first).
    fn clear(&mut self) {
        self.maps.clear();
        self.len = 0;
        self.bytes = 0;
        self.dirty.clear();
    }
}

/// About the memory one cached entry takes: its hash-table slot, key and dirty-list entry
/// (a fixed share) and the decoded value's heap (a Rhai map is a B-tree of 11-entry nodes of
/// about 500 bytes, a list 16 bytes per item, a long string its text). An estimate, so that
/// the cache is bounded in bytes without measuring allocations.
fn entry_bytes(value: Option<&Dynamic>) -> usize {
    fn heap(v: &Dynamic, depth: u32) -> usize {
        if depth > 16 {
            return 0;
        }
        if let Ok(m) = v.as_map_ref() {
            return 32
                + 512 * m.len().div_ceil(11).max(1)
                + m.values().map(|x| heap(x, depth + 1)).sum::<usize>();
        }
        if let Ok(a) = v.as_array_ref() {
            return 24
                + 16 * a.capacity()
                + a.iter().map(|x| heap(x, depth + 1)).sum::<usize>();
        }
        if let Ok(s) = v.as_immutable_string_ref() {
            return 48 + if s.len() > 23 { s.len() } else { 0 };
        }
        0
    }
    160 + value.map_or(0, |v| heap(v, 0))
}

/// Keyed state in an embedded RocksDB instance, for one subtask's key-group range.
pub struct RocksdbBackend {
    // Field order matters: `db` is closed before `root` removes the directory.
    db: DB,
    db_path: PathBuf,
    opts: Options,
    write_opts: WriteOptions,
    layout: Layout,
    max_parallelism: u32,
    range: KeyGroupRange,
    incremental: bool,
    instance: String,
    /// Registered states, indexed by [`StateId`].
    states: Vec<StateInfo>,
    uploads: Arc<Mutex<Uploads>>,
    /// Numbers the instance's scratch directories (databases, checkpoints, restores).
    next_dir: u64,
    /// Write-back cache of decoded values; a `RefCell` because reads (`&self`) fill it and
    /// whole-database reads write it back.
    cache: RefCell<ValueCache>,
    /// Bumped by every write and restore (see [`StateBackend::generation`]).
    generation: u64,
    root: InstanceDir,
}

impl std::fmt::Debug for RocksdbBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksdbBackend")
            .field("db_path", &self.db_path)
            .field("range", &self.range)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// The block cache and the memtable budget that every instance of this process opened with
/// the same sizes shares (see the module docs), by (block cache, write buffer) size.
static SHARED_MEMORY: std::sync::LazyLock<Mutex<SharedMemory>> =
    std::sync::LazyLock::new(Default::default);

/// (block cache size, write buffer size) → the cache and memtable budget made for them.
type SharedMemory = HashMap<(usize, usize), (Cache, WriteBufferManager)>;

/// The shared block cache and memtable budget for these sizes, created on first use.
fn shared_memory(cache_size: usize, write_buffer: usize) -> (Cache, WriteBufferManager) {
    let mut shared = SHARED_MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    shared
        .entry((cache_size, write_buffer))
        .or_insert_with(|| {
            let cache = Cache::new_lru_cache(cache_size);
            // Memtables are charged to the block cache: together they stay near its size.
            let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
                write_buffer.saturating_mul(2),
                false,
                cache.clone(),
            );
            (cache, buffers)
        })
        .clone()
}

fn db_options(spec: &RocksdbSpec) -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.set_compression_type(DBCompressionType::Lz4);
    let write_buffer = usize::try_from(spec.write_buffer_size.bytes())
        .unwrap_or(usize::MAX)
        .max(64 * 1024);
    opts.set_write_buffer_size(write_buffer);
    let mut table = BlockBasedOptions::default();
    let cache_size = usize::try_from(spec.block_cache_size.bytes()).unwrap_or(usize::MAX);
    if cache_size == 0 {
        table.disable_cache();
        opts.set_write_buffer_manager(&WriteBufferManager::new_write_buffer_manager(
            write_buffer.saturating_mul(2),
            false,
        ));
    } else {
        let (cache, buffers) = shared_memory(cache_size, write_buffer);
        table.set_block_cache(&cache);
        // Index and filter blocks live in the cache too, so that they count against it.
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        opts.set_write_buffer_manager(&buffers);
    }
    opts.set_block_based_table_factory(&table);
    opts
}

impl RocksdbBackend {
    /// Opens a fresh, empty database for `range` out of `max_parallelism` key groups in a
    /// new directory `dir/db-<instance id>` (removed when the backend is dropped), with the
    /// block cache, memtable size and checkpoint mode of `spec` (its `path` is the caller's
    /// business: pass it, resolved, as `dir`).
    ///
    /// # Errors
    /// A range outside `0..max_parallelism`, or when the directory or database cannot be
    /// created.
    pub fn open(
        dir: &Path,
        max_parallelism: u32,
        range: KeyGroupRange,
        spec: &RocksdbSpec,
    ) -> Result<Self> {
        if max_parallelism == 0 || range.start > range.end || range.end > max_parallelism {
            return Err(RunError::State(format!(
                "key groups {}..{} are not a range of 0..{max_parallelism}",
                range.start, range.end
            )));
        }
        fs::create_dir_all(dir).map_err(fs_err("cannot create directory", dir))?;
        let instance = unique_instance_id();
        let root_path = dir.join(format!("db-{instance}"));
        fs::create_dir(&root_path).map_err(fs_err("cannot create directory", &root_path))?;
        let root = InstanceDir::new(root_path);
        let opts = db_options(spec);
        let db_path = root.path().join("db-0");
        let db = DB::open(&opts, &db_path).map_err(db_err("cannot open", &db_path))?;
        let mut write_opts = WriteOptions::default();
        write_opts.disable_wal(true);
        tracing::debug!(path = %db_path.display(), start = range.start, end = range.end, "Opened RocksDB state.");
        Ok(Self {
            db,
            db_path,
            opts,
            write_opts,
            layout: Layout::new(max_parallelism),
            max_parallelism,
            range,
            incremental: spec.incremental,
            instance,
            states: Vec::new(),
            uploads: Arc::default(),
            next_dir: 1,
            cache: RefCell::new(ValueCache::new(DEFAULT_CACHE_ENTRIES, DEFAULT_CACHE_BYTES)),
            generation: 0,
            root,
        })
    }

    /// Sets the bound of the value cache, in entries (at least 1); writes back and empties
    /// the cache if it holds more.
    ///
    /// # Errors
    /// When the write-back fails.
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_cache_capacity(&mut self, entries: usize) -> Result<()> {
        let entries = entries.max(1);
        if self.cache.get_mut().len > entries {
            self.flush_cache()?;
            self.cache.get_mut().clear();
        }
        self.cache.get_mut().capacity = entries;
        Ok(())
    }

    /// Writes every dirty cached entry to the database in one batch (WAL off); the entries
    /// stay cached, clean. A `None` entry is written as a delete.
    fn flush_cache(&self) -> Result<()> {
        let mut cache = self.cache.borrow_mut();
        if cache.dirty.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for (state, key) in &cache.dirty {
            let Some(slot) = cache.maps.get(state.0 as usize).and_then(|m| m.get(key)) else {
                continue;
            };
            let raw = self.layout.key(
                key.key_group(self.max_parallelism),
                self.state(*state)?.db_id,
                key,
            );
            match &slot.value {
                Some(v) => batch.put(raw, encode_value(v)?),
                None => batch.delete(raw),
            }
        }
        // Only once the batch is written are the entries clean (an error leaves them dirty).
        self.write(batch)?;
        let dirty = std::mem::take(&mut cache.dirty);
        let mut bytes = cache.bytes;
        for (state, key) in &dirty {
            if let Some(slot) = cache
                .maps
                .get_mut(state.0 as usize)
                .and_then(|m| m.get_mut(key))
            {
                slot.dirty = false;
                // The value may have grown since it was cached: estimate it again.
                let now = entry_bytes(slot.value.as_ref());
                bytes = bytes - slot.bytes + now;
                slot.bytes = now;
            }
        }
        cache.bytes = bytes;
        Ok(())
    }

    /// Writes back and empties the cache (before the database is replaced or the states'
    /// ids change).
    fn reset_cache(&mut self) -> Result<()> {
        self.flush_cache()?;
        self.cache.get_mut().clear();
        Ok(())
    }

    /// Reads `key` of `state` from the database (decoded), validating the handle and range.
    fn load(&self, state: StateId, key: &Key) -> Result<Option<Dynamic>> {
        let k = self.db_key(state, key)?;
        match self
            .db
            .get_pinned(&k)
            .map_err(db_err("cannot read", &self.db_path))?
        {
            Some(bytes) => decode_value(&bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Makes room for one more cache entry: when the cache is full, writes back every dirty
    /// entry and empties it.
    fn make_room(&self) -> Result<()> {
        let full = self.cache.borrow().full();
        if full {
            self.flush_cache()?;
            self.cache.borrow_mut().clear();
        }
        Ok(())
    }

    /// The instance's working directory (`dir/db-<instance id>`), removed on drop.
    #[cfg(any(test, feature = "testkit"))]
    pub fn path(&self) -> &Path {
        self.root.path()
    }

    /// The instance id that names this backend's shared files.
    #[cfg(any(test, feature = "testkit"))]
    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// Flushes the memtables and compacts the whole database into as few SST files as it
    /// can (maintenance and tests: later incremental checkpoints then upload new files).
    ///
    /// # Errors
    /// When the flush fails.
    #[cfg(any(test, feature = "testkit"))]
    pub fn compact(&self) -> Result<()> {
        self.flush_cache()?;
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        self.db
            .flush_opt(&flush)
            .map_err(db_err("cannot flush", &self.db_path))?;
        self.db.compact_range::<&[u8], &[u8]>(None, None);
        Ok(())
    }

    /// A new, not yet existing scratch path `<root>/<what>-<n>`.
    fn scratch(&mut self, what: &str) -> PathBuf {
        let n = self.next_dir;
        self.next_dir += 1;
        self.root.path().join(format!("{what}-{n}"))
    }

    fn state(&self, state: StateId) -> Result<&StateInfo> {
        self.states
            .get(state.0 as usize)
            .ok_or_else(|| RunError::State(format!("unknown state handle {}", state.0)))
    }

    /// The database key of `key` in `state`; rejects keys outside the backend's key groups.
    fn db_key(&self, state: StateId, key: &Key) -> Result<Vec<u8>> {
        let db_id = self.state(state)?.db_id;
        let kg = key.key_group(self.max_parallelism);
        if !self.range.contains(kg) {
            return Err(RunError::State(format!(
                "key group {kg} is outside this backend's range {:?}",
                self.range
            )));
        }
        Ok(self.layout.key(kg, db_id, key))
    }

    /// A database id no state uses yet.
    fn free_db_id(states: &[StateInfo]) -> Result<u16> {
        match states.iter().map(|s| s.db_id).max() {
            None => Ok(0),
            Some(max) => max
                .checked_add(1)
                .ok_or_else(|| RunError::State("too many named states (65536)".into())),
        }
    }

    fn write(&self, batch: WriteBatch) -> Result<()> {
        self.db
            .write_opt(batch, &self.write_opts)
            .map_err(db_err("cannot write", &self.db_path))
    }

    fn is_empty(&self) -> Result<bool> {
        let mut it = self.db.raw_iterator();
        it.seek_to_first();
        let empty = !it.valid();
        it.status().map_err(db_err("cannot read", &self.db_path))?;
        Ok(empty)
    }

    /// Calls `f(key group, raw key, raw value)` for every entry of `db` in the key groups
    /// `range`, in key order.
    fn scan(
        db: &DB,
        path: &Path,
        layout: Layout,
        range: KeyGroupRange,
        mut f: impl FnMut(u32, &[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        if range.is_empty() {
            return Ok(());
        }
        let mut start = Vec::with_capacity(4);
        layout.push_group(&mut start, range.start);
        let mut it = db.raw_iterator();
        it.seek(&start);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            let (kg, _, _) = layout.split(k).ok_or_else(|| {
                RunError::StateCorrupt(format!("malformed key in `{}`", path.display()))
            })?;
            if kg >= range.end {
                break;
            }
            f(kg, k, v)?;
            it.next();
        }
        it.status().map_err(db_err("cannot read", path))
    }

    /// The states of the manifest, with ids: the registered ones keep their handles and take
    /// the manifest's id; the others get a fresh id; unregistered ones of the manifest are
    /// appended.
    fn adopt_states(&self, manifest: &Manifest) -> Result<Vec<StateInfo>> {
        let mut out = Vec::with_capacity(self.states.len() + manifest.states.len());
        let mut unmatched = Vec::new();
        for s in &self.states {
            match manifest.states.iter().find(|m| m.name == s.name) {
                Some(m) => {
                    let kind = kind_of(m.kind).unwrap_or(s.kind);
                    if kind != s.kind {
                        return Err(RunError::StateMismatch(format!(
                            "state `{}` is registered as {:?}, the checkpoint holds {kind:?}",
                            s.name, s.kind
                        )));
                    }
                    out.push(StateInfo {
                        db_id: m.id,
                        ..s.clone()
                    });
                }
                None => {
                    unmatched.push(out.len());
                    out.push(s.clone());
                }
            }
        }
        for m in &manifest.states {
            if !self.states.iter().any(|s| s.name == m.name) {
                out.push(StateInfo {
                    name: m.name.clone(),
                    kind: kind_of(m.kind).unwrap_or(StateKind::Value),
                    db_id: m.id,
                });
            }
        }
        // Give the registered states the checkpoint does not know ids it does not use.
        let first = manifest
            .states
            .iter()
            .map(|m| u32::from(m.id) + 1)
            .max()
            .unwrap_or(0);
        for (next, i) in (first..).zip(unmatched) {
            out[i].db_id = u16::try_from(next)
                .map_err(|_| RunError::State("too many named states (65536)".into()))?;
        }
        Ok(out)
    }

    /// Case (a): the checkpoint holds exactly our key groups and the database is empty: the
    /// downloaded database becomes ours.
    fn restore_whole(&mut self, store: &dyn CheckpointStore, manifest: &Manifest) -> Result<()> {
        let states = self.adopt_states(manifest)?;
        let path = self.scratch("db");
        fs::create_dir(&path).map_err(fs_err("cannot create directory", &path))?;
        let opened = manifest
            .download(store, &path)
            .and_then(|()| DB::open(&self.opts, &path).map_err(db_err("cannot open", &path)));
        let db = match opened {
            Ok(db) => db,
            Err(e) => {
                drop(DirGuard(path));
                return Err(e);
            }
        };
        drop(std::mem::replace(&mut self.db, db));
        let old_path = std::mem::replace(&mut self.db_path, path);
        drop(DirGuard(old_path));
        self.states = states;
        let mut uploads = lock(&self.uploads);
        uploads.confirmed = manifest
            .files
            .iter()
            .filter(|f| f.name.ends_with(".sst") && is_shared_path(&f.file.path))
            .map(|f| (f.name.clone(), f.file.clone()))
            .collect();
        uploads.confirmed_at = None;
        uploads.pending.clear();
        tracing::info!(
            checkpoint = manifest.checkpoint,
            files = manifest.files.len(),
            "Restored RocksDB state from a native checkpoint."
        );
        Ok(())
    }

    /// Case (b): copies the entries of our key groups out of another instance's checkpoint
    /// (rescaling), through a read-only copy in a scratch directory.
    fn restore_rescaled(&mut self, store: &dyn CheckpointStore, manifest: &Manifest) -> Result<()> {
        let range = intersect(manifest.range(), self.range);
        if range.is_empty() {
            return Ok(());
        }
        // Map the checkpoint's state ids to ours, registering states we do not know yet.
        let mut ids: HashMap<u16, u16> = HashMap::new();
        for m in &manifest.states {
            let kind = kind_of(m.kind).unwrap_or(StateKind::Value);
            let handle = self.register(&m.name, kind)?;
            ids.insert(m.id, self.state(handle)?.db_id);
        }
        let scratch = DirGuard(self.scratch("restore"));
        fs::create_dir(&scratch.0).map_err(fs_err("cannot create directory", &scratch.0))?;
        manifest.download(store, &scratch.0)?;
        let mut opts = Options::default();
        opts.create_if_missing(false);
        let src = DB::open_for_read_only(&opts, &scratch.0, false)
            .map_err(db_err("cannot open", &scratch.0))?;
        let layout = self.layout;
        let mut batch = WriteBatch::default();
        let mut copied = 0usize;
        Self::scan(&src, &scratch.0, layout, range, |kg, raw, value| {
            let (_, state, key) = layout
                .split(raw)
                .ok_or_else(|| RunError::StateCorrupt("malformed key".into()))?;
            let id = ids.get(&state).ok_or_else(|| {
                RunError::StateCorrupt(format!(
                    "checkpoint `{}` holds entries of an unlisted state id {state}",
                    manifest.checkpoint
                ))
            })?;
            let mut out = layout.prefix(kg, *id);
            out.extend_from_slice(key);
            batch.put(out, value);
            copied += 1;
            if batch.len() >= BATCH_ENTRIES {
                self.write(std::mem::take(&mut batch))?;
            }
            Ok(())
        })?;
        self.write(batch)?;
        drop(src);
        drop(scratch);
        tracing::info!(
            checkpoint = manifest.checkpoint,
            from_start = manifest.key_groups.start,
            from_end = manifest.key_groups.end,
            entries = copied,
            "Restored RocksDB state from a rescaled checkpoint."
        );
        Ok(())
    }

    /// The manifest's view of the registered states.
    fn manifest_states(&self) -> Vec<ManifestState> {
        self.states
            .iter()
            .map(|s| ManifestState {
                name: s.name.clone(),
                kind: kind_code(s.kind),
                id: s.db_id,
            })
            .collect()
    }
}

/// Reads the native checkpoint whose manifest is `manifest` (a `.rocksdb` file) into a
/// canonical snapshot of its key groups, through a read-only copy of the database in a scratch
/// directory under `scratch` (removed afterwards): how `weir inspect` reads RocksDB
/// checkpoints without a running pipeline. Every file is checksum-verified.
///
/// # Errors
/// A damaged or missing manifest or database file (the error names it), another number of
/// key groups, or RocksDB failing to open the copy.
pub fn native_to_canonical(
    store: &dyn CheckpointStore,
    manifest: &FileRef,
    max_parallelism: u32,
    scratch: &Path,
) -> Result<Vec<u8>> {
    let m = Manifest::read(store, manifest, max_parallelism)?;
    let mut backend =
        RocksdbBackend::open(scratch, max_parallelism, m.range(), &RocksdbSpec::default())?;
    backend.restore_whole(store, &m)?;
    backend.snapshot(m.range())
}

impl StateBackend for RocksdbBackend {
    fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    fn register(&mut self, name: &str, kind: StateKind) -> Result<StateId> {
        if let Some(i) = self.states.iter().position(|s| s.name == name) {
            if self.states[i].kind != kind {
                return Err(RunError::State(format!(
                    "state `{name}` is registered as {:?}, not {kind:?}",
                    self.states[i].kind
                )));
            }
            return Ok(StateId(i as u32));
        }
        let db_id = Self::free_db_id(&self.states)?;
        self.states.push(StateInfo {
            name: name.to_owned(),
            kind,
            db_id,
        });
        Ok(StateId((self.states.len() - 1) as u32))
    }

    fn get(&self, state: StateId, key: &Key) -> Result<Option<Dynamic>> {
        if let Some(slot) = self
            .cache
            .borrow()
            .maps
            .get(state.0 as usize)
            .and_then(|m| m.get(key))
        {
            return Ok(slot.value.clone());
        }
        let value = self.load(state, key)?;
        self.make_room()?;
        self.cache
            .borrow_mut()
            .insert(state, key, value.clone(), false);
        Ok(value)
    }

    /// Lends the cached value; a miss loads it into the cache first (the next write of the
    /// same key, as in `if list_len(..) > n { list_trim(..) }`, then finds it there).
    fn read(&self, state: StateId, key: &Key, f: &mut dyn FnMut(Option<&Dynamic>)) -> Result<()> {
        if let Some(slot) = self
            .cache
            .borrow()
            .maps
            .get(state.0 as usize)
            .and_then(|m| m.get(key))
        {
            f(slot.value.as_ref());
            return Ok(());
        }
        let value = self.load(state, key)?;
        f(value.as_ref());
        self.make_room()?;
        self.cache.borrow_mut().insert(state, key, value, false);
        Ok(())
    }

    fn update(
        &mut self,
        state: StateId,
        key: &Key,
        f: &mut dyn FnMut(&mut Option<Dynamic>),
    ) -> Result<()> {
        self.generation += 1;
        let cache = self.cache.get_mut();
        if let Some(slot) = cache
            .maps
            .get_mut(state.0 as usize)
            .and_then(|m| m.get_mut(key))
        {
            let existed = slot.value.is_some();
            f(&mut slot.value);
            if !slot.dirty && (existed || slot.value.is_some()) {
                slot.dirty = true;
                cache.dirty.push((state, key.clone()));
            }
            return Ok(());
        }
        let mut value = self.load(state, key)?;
        let existed = value.is_some();
        f(&mut value);
        let dirty = existed || value.is_some();
        self.make_room()?;
        self.cache.get_mut().insert(state, key, value, dirty);
        Ok(())
    }

    /// Probes the value cache of every state for `key` (the probes overlap one another here,
    /// where a record's calls would make them one at a time) and prefetches the maps and lists
    /// found: their headers ([`Reach::Values`]), then their entries ([`Reach::Contents`]); a
    /// key not cached is left to the record (a database read is no hint).
    fn prefetch(&self, key: &Key, reach: Reach) {
        if reach == Reach::Row {
            return;
        }
        let Ok(cache) = self.cache.try_borrow() else {
            return;
        };
        for map in &cache.maps {
            if let Some(Slot { value: Some(v), .. }) = map.get(key) {
                super::prefetch::reach(v, reach);
            }
        }
    }

    fn keys_in(&self, state: StateId, range: KeyGroupRange) -> Result<Vec<Key>> {
        let db_id = self.state(state)?.db_id;
        self.flush_cache()?;
        let range = intersect(range, self.range);
        let mut out = Vec::new();
        let mut it = self.db.raw_iterator();
        for kg in range.start..range.end {
            let prefix = self.layout.prefix(kg, db_id);
            it.seek(&prefix);
            while let Some(k) = it.key() {
                let Some(rest) = k.strip_prefix(prefix.as_slice()) else {
                    break;
                };
                out.push(parse_key(rest).ok_or_else(|| {
                    RunError::StateCorrupt(format!("malformed key in `{}`", self.db_path.display()))
                })?);
                it.next();
            }
        }
        it.status().map_err(db_err("cannot read", &self.db_path))?;
        Ok(out)
    }

    /// Streams the stored entries into the canonical format: one seek per state and key
    /// group, the values copied as they are stored (they are already canonical MessagePack).
    fn snapshot(&self, range: KeyGroupRange) -> Result<Vec<u8>> {
        self.flush_cache()?;
        let range = intersect(range, self.range);
        let mut w = SnapshotWriter::new(self.max_parallelism, self.states.len() as u32);
        let path = &self.db_path;
        let malformed = || RunError::StateCorrupt(format!("malformed key in `{}`", path.display()));
        let mut it = self.db.raw_iterator();
        for s in &self.states {
            w.begin_state(&s.name, s.kind)?;
            for kg in range.start..range.end {
                let prefix = self.layout.prefix(kg, s.db_id);
                it.seek(&prefix);
                while let (Some(k), Some(v)) = (it.key(), it.value()) {
                    let Some(raw) = k.strip_prefix(prefix.as_slice()) else {
                        break;
                    };
                    let key = parse_key(raw).ok_or_else(malformed)?;
                    w.entry_encoded(kg, key.value(), v)?;
                    it.next();
                }
                it.status().map_err(db_err("cannot read", path))?;
            }
        }
        w.finish()
    }

    /// Writes the entries of this backend's key groups into the database, each value as the
    /// snapshot holds it (canonical MessagePack is the stored encoding).
    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }

    fn detach_checkpoints(&mut self) {
        *lock(&self.uploads) = Uploads::default();
    }

    fn restore(&mut self, snapshots: &[&[u8]]) -> Result<()> {
        self.generation += 1;
        self.reset_cache()?;
        for bytes in snapshots {
            let mut state = None;
            let mut batch = WriteBatch::default();
            read_snapshot(bytes, self.max_parallelism, |item| {
                match item {
                    SnapshotItem::State { name, kind, .. } => {
                        state = Some(self.register(name, kind)?);
                    }
                    SnapshotItem::Entry { kg, key, value } => {
                        if !self.range.contains(kg) {
                            return Ok(());
                        }
                        let id = state.ok_or_else(|| {
                            RunError::StateCorrupt("malformed snapshot: entry before state".into())
                        })?;
                        batch.put(self.db_key(id, &key)?, value);
                        if batch.len() >= BATCH_ENTRIES {
                            self.write(std::mem::take(&mut batch))?;
                        }
                    }
                }
                Ok(())
            })?;
            self.write(batch)?;
        }
        Ok(())
    }

    /// Writes back the value cache, flushes the memtables and takes a RocksDB checkpoint
    /// (hard links) into a scratch directory; the returned snapshot uploads and deletes it.
    fn checkpoint(&mut self, checkpoint: CheckpointId) -> Result<Box<dyn PendingSnapshot>> {
        self.flush_cache()?;
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        self.db
            .flush_opt(&flush)
            .map_err(db_err("cannot flush", &self.db_path))?;
        let dir = self.scratch(&format!("chk-{checkpoint}"));
        let guard = DirGuard(dir);
        Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(&guard.0))
            .map_err(db_err("cannot create checkpoint", &guard.0))?;
        Ok(Box::new(NativeSnapshot {
            dir: guard,
            checkpoint,
            instance: self.instance.clone(),
            incremental: self.incremental,
            max_parallelism: self.max_parallelism,
            range: self.range,
            states: self.manifest_states(),
            uploads: Arc::clone(&self.uploads),
        }))
    }

    fn checkpoint_complete(&mut self, checkpoint: CheckpointId) {
        let mut uploads = lock(&self.uploads);
        if uploads.confirmed_at.is_some_and(|c| c >= checkpoint) {
            return;
        }
        // A checkpoint this backend wrote no native snapshot for (a savepoint, which is
        // canonical) still becomes the newest completed one: retention may now delete the
        // older checkpoint whose shared SSTs `confirmed` names, so none of them may be reused.
        // The next incremental checkpoint uploads its SSTs afresh.
        uploads.confirmed = uploads.pending.remove(&checkpoint).unwrap_or_default();
        uploads.confirmed_at = Some(checkpoint);
        uploads.pending.retain(|&id, _| id > checkpoint);
    }

    /// Restores native checkpoints (`.rocksdb` manifests) and canonical `.keyed` files; see
    /// the module docs for the cases.
    fn restore_files(&mut self, store: &dyn CheckpointStore, files: &[FileRef]) -> Result<()> {
        self.generation += 1;
        self.reset_cache()?;
        let mut manifests = Vec::new();
        let mut canonical = Vec::new();
        for f in files {
            if f.path.ends_with(NATIVE_SUFFIX) {
                manifests.push(Manifest::read(store, f, self.max_parallelism)?);
            } else if f.path.ends_with(CANONICAL_SUFFIX) {
                canonical.push(read_verified(store, f)?);
            }
        }
        match manifests.as_slice() {
            [only] if canonical.is_empty() && only.range() == self.range && self.is_empty()? => {
                self.restore_whole(store, only)?;
            }
            _ => {
                for m in &manifests {
                    self.restore_rescaled(store, m)?;
                }
            }
        }
        let refs: Vec<&[u8]> = canonical.iter().map(Vec::as_slice).collect();
        self.restore(&refs)
    }
}

/// A native checkpoint taken at the barrier, waiting to be uploaded; its local directory is
/// removed when it is written or dropped.
struct NativeSnapshot {
    dir: DirGuard,
    checkpoint: CheckpointId,
    instance: String,
    incremental: bool,
    max_parallelism: u32,
    range: KeyGroupRange,
    states: Vec<ManifestState>,
    uploads: Arc<Mutex<Uploads>>,
}

impl PendingSnapshot for NativeSnapshot {
    fn write(
        self: Box<Self>,
        store: &dyn CheckpointStore,
        target: &SnapshotTarget,
    ) -> Result<Vec<FileRef>> {
        debug_assert_eq!(target.checkpoint, self.checkpoint, "checkpoint id mismatch");
        let dir = &self.dir.0;
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).map_err(fs_err("cannot list", dir))? {
            let entry = entry.map_err(fs_err("cannot list", dir))?;
            let name = entry.file_name().into_string().map_err(|n| {
                RunError::StateIo(format!("non-UTF-8 file name {n:?} in `{}`", dir.display()))
            })?;
            names.push(name);
        }
        names.sort();
        let reusable = if self.incremental {
            lock(&self.uploads).confirmed.clone()
        } else {
            HashMap::new()
        };
        let mut files = Vec::with_capacity(names.len() + 1);
        let mut listed = Vec::with_capacity(names.len());
        let mut shared = HashMap::new();
        let mut uploaded = 0u64;
        for name in names {
            let local = dir.join(&name);
            let file = if self.incremental && name.ends_with(".sst") {
                let size = fs::metadata(&local)
                    .map_err(fs_err("cannot stat", &local))?
                    .len();
                let file = match reusable.get(&name) {
                    Some(f) if f.size == size => f.clone(),
                    _ => {
                        let path = format!("{}-{}-{name}", target.shared_prefix, self.instance);
                        let f = store.put_file(&path, &local)?;
                        uploaded += f.size;
                        f
                    }
                };
                shared.insert(name.clone(), file.clone());
                file
            } else {
                let path = format!("{}{PRIVATE_FILES_SUFFIX}/{name}", target.private_prefix);
                let f = store.put_file(&path, &local)?;
                uploaded += f.size;
                f
            };
            files.push(file.clone());
            listed.push(ManifestFile { name, file });
        }
        let manifest = Manifest {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            checkpoint: self.checkpoint,
            instance: self.instance.clone(),
            max_parallelism: self.max_parallelism,
            key_groups: self.range.into(),
            states: self.states.clone(),
            files: listed,
        };
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| RunError::State(format!("cannot encode rocksdb manifest: {e}")))?;
        let path = format!("{}{NATIVE_SUFFIX}", target.private_prefix);
        files.push(write_file(store, &path, &bytes)?);
        if self.incremental {
            lock(&self.uploads).pending.insert(self.checkpoint, shared);
        }
        tracing::debug!(
            checkpoint = self.checkpoint,
            files = files.len(),
            uploaded_bytes = uploaded,
            "Wrote RocksDB checkpoint."
        );
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::state::conformance;

    fn spec() -> RocksdbSpec {
        RocksdbSpec {
            block_cache_size: weir_schema::units::SizeSpec::mib(8),
            write_buffer_size: weir_schema::units::SizeSpec::mib(4),
            ..RocksdbSpec::default()
        }
    }

    /// The conformance suite; every instance removes its working directory when dropped.
    mod suite {
        use super::*;
        use crate::state::conformance::{Factory, conformance_suite};

        conformance_suite!(|case: fn(Factory<'_>)| {
            let dir = tempfile::tempdir().unwrap();
            let spec = spec();
            case(&|m: u32, range: KeyGroupRange| -> Box<dyn StateBackend> {
                Box::new(RocksdbBackend::open(dir.path(), m, range, &spec).unwrap())
            });
            assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        });
    }

    #[test]
    fn rocksdb_with_a_one_entry_cache_passes_list_and_map_housekeeping_and_ttl() {
        // Every access misses the cache: reads and writes go through the database.
        let dir = tempfile::tempdir().unwrap();
        let spec = spec();
        let factory = |m: u32, range: KeyGroupRange| -> Box<dyn StateBackend> {
            let mut b = RocksdbBackend::open(dir.path(), m, range, &spec).unwrap();
            b.set_cache_capacity(1).unwrap();
            Box::new(b)
        };
        conformance::list_and_map_housekeeping(&factory);
        conformance::list_and_map_state(&factory);
        conformance::ttl_expiry(&factory);
    }

    #[test]
    fn incremental_false_passes_checkpoint_files_restore_rescale() {
        let dir = tempfile::tempdir().unwrap();
        let spec = RocksdbSpec {
            incremental: false,
            ..spec()
        };
        let factory = |m: u32, range: KeyGroupRange| -> Box<dyn StateBackend> {
            Box::new(RocksdbBackend::open(dir.path(), m, range, &spec).unwrap())
        };
        conformance::checkpoint_files_restore_rescale(&factory);
    }

    #[test]
    fn keys_round_trip_and_group_contiguously() {
        let keys = [
            Key::from_str_value("".into()),
            Key::from_str_value("a-key-longer-than-fifteen-bytes".into()),
            Key::from_dynamic(&Dynamic::from_int(-7)),
            Key::from_dynamic(&Dynamic::from_bool(true)),
            Key::from_dynamic(&Dynamic::UNIT),
            Key::from_dynamic(&Dynamic::from_float(1.5)),
            Key::from_dynamic(&crate::record::map_of([("a", Dynamic::from_int(1))])),
        ];
        for layout in [Layout::new(128), Layout::new(1 << 20)] {
            for k in &keys {
                let raw = layout.key(77, 3, k);
                let (kg, state, rest) = layout.split(&raw).unwrap();
                assert_eq!((kg, state), (77, 3));
                let back = parse_key(rest).unwrap();
                assert_eq!(&back, k, "{:?}", k.value());
                assert_eq!(back.hash_code(), k.hash_code());
            }
            // Key group first: every key of group 5 sorts before any key of group 6.
            let last_of_5 = layout.key(5, u16::MAX, &keys[1]);
            let first_of_6 = layout.prefix(6, 0);
            assert!(last_of_5 < first_of_6);
        }
        assert_eq!(Layout::new(128).group_width, 2);
        assert_eq!(Layout::new(65536).group_width, 2);
        assert_eq!(Layout::new(65537).group_width, 4);
        assert!(parse_key(&[9]).is_none());
        assert!(parse_key(&[TAG_INT, 1]).is_none());
    }

    #[test]
    fn instances_get_their_own_directories_and_reject_bad_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let a = RocksdbBackend::open(dir.path(), 8, KeyGroupRange::all(8), &spec()).unwrap();
        let b = RocksdbBackend::open(dir.path(), 8, KeyGroupRange::all(8), &spec()).unwrap();
        assert_ne!(a.path(), b.path());
        assert_ne!(a.instance_id(), b.instance_id());
        assert!(a.path().is_dir() && b.path().is_dir());
        let a_path = a.path().to_path_buf();
        drop(a);
        assert!(!a_path.exists());
        assert!(b.path().is_dir());
        let bad = KeyGroupRange { start: 4, end: 9 };
        assert!(RocksdbBackend::open(dir.path(), 8, bad, &spec()).is_err());
    }

    #[test]
    fn keys_outside_the_range_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let range = KeyGroupRange { start: 0, end: 4 };
        let mut b = RocksdbBackend::open(dir.path(), 8, range, &spec()).unwrap();
        let s = b.register("v", StateKind::Value).unwrap();
        let outside = (0..100)
            .map(|i| Key::from_str_value(format!("k{i}").into()))
            .find(|k| !range.contains(k.key_group(8)))
            .unwrap();
        assert!(b.put(s, &outside, Dynamic::from_int(1)).is_err());
        assert!(b.get(s, &outside).is_err());
        assert!(b.get(StateId(9), &outside).is_err());
    }

    /// Every (state, key) → value of a backend, via `keys` and `get`.
    fn contents(b: &dyn StateBackend, states: &[StateId]) -> BTreeMap<(u32, String), String> {
        let mut out = BTreeMap::new();
        for &s in states {
            for k in b.keys(s).unwrap() {
                let v = b.get(s, &k).unwrap().unwrap();
                out.insert((s.0, k.to_dynamic().to_string()), v.to_string());
            }
        }
        out
    }

    #[test]
    fn value_cache_writes_back_before_checkpoints_and_on_eviction() {
        use crate::checkpoint::MemoryStore;
        let dir = tempfile::tempdir().unwrap();
        let store = MemoryStore::new();
        let m = 16;
        let mut b = RocksdbBackend::open(dir.path(), m, KeyGroupRange::all(m), &spec()).unwrap();
        // Far fewer entries than keys: misses evict (write back and empty) the cache.
        b.set_cache_capacity(50).unwrap();
        let sum = b.register("sum", StateKind::Value).unwrap();
        let items = b.register("items", StateKind::List).unwrap();
        let key = |i: i64| Key::from_str_value(format!("k{i}").into());
        let mut model: BTreeMap<(u32, String), String> = BTreeMap::new();
        let mut expected = Vec::new();
        let mut pendings = Vec::new();
        for round in 0..6_i64 {
            for i in 0..400_i64 {
                let k = key((i * 7 + round * 13) % 300);
                let name = k.to_dynamic().to_string();
                let mut seen = None;
                b.update(sum, &k, &mut |slot| {
                    let v = slot.as_ref().map_or(0, |d| d.as_int().unwrap()) + i;
                    seen = Some(v);
                    *slot = Some(Dynamic::from_int(v));
                })
                .unwrap();
                model.insert((sum.0, name.clone()), seen.unwrap().to_string());
                if round % 2 == 1 && i % 5 == 0 {
                    // Removal of a value the database holds (written back at the previous
                    // checkpoint) must reach the database as a delete.
                    b.clear(sum, &k).unwrap();
                    model.remove(&(sum.0, name.clone()));
                }
                if i % 3 == 0 {
                    b.list_push(items, &k, Dynamic::from_int(round)).unwrap();
                    let l = b.get(items, &k).unwrap().unwrap();
                    model.insert((items.0, name), l.to_string());
                }
                // Reading and clearing an absent key leaves it absent.
                b.clear(sum, &key(10_000 + i)).unwrap();
                assert!(b.get(sum, &key(10_000 + i)).unwrap().is_none());
            }
            // A checkpoint mid-stream (the cache holding dirty entries) holds exactly the
            // live contents at the barrier.
            assert!(!b.cache.get_mut().dirty.is_empty());
            let id = (round + 1) as CheckpointId;
            pendings.push((id, b.checkpoint(id).unwrap()));
            assert_eq!(contents(&b, &[sum, items]), model, "round {round}");
            expected.push(model.clone());
            // Writes after the barrier must not show in it.
            b.put(sum, &key(1), Dynamic::from_int(-1)).unwrap();
            model.insert((sum.0, key(1).to_dynamic().to_string()), "-1".into());
        }
        assert_eq!(contents(&b, &[sum, items]), model);
        for ((id, pending), want) in pendings.into_iter().zip(expected) {
            let target = SnapshotTarget {
                checkpoint: id,
                private_prefix: format!("chk-{id}/op-0"),
                shared_prefix: "shared/op-0".into(),
            };
            let files = pending.write(&store, &target).unwrap();
            b.checkpoint_complete(id);
            let mut r =
                RocksdbBackend::open(dir.path(), m, KeyGroupRange::all(m), &spec()).unwrap();
            r.set_cache_capacity(50).unwrap();
            let rs = r.register("sum", StateKind::Value).unwrap();
            let ri = r.register("items", StateKind::List).unwrap();
            // Cached before the restore: the restore must not serve it.
            assert!(r.get(rs, &key(3)).unwrap().is_none());
            r.restore_files(&store, &files).unwrap();
            assert_eq!((rs, ri), (sum, items));
            assert_eq!(contents(&r, &[rs, ri]), want, "checkpoint {id}");
            // The canonical snapshot agrees too.
            let mut c =
                RocksdbBackend::open(dir.path(), m, KeyGroupRange::all(m), &spec()).unwrap();
            c.restore(&[&r.snapshot(KeyGroupRange::all(m)).unwrap()])
                .unwrap();
            let cs = c.register("sum", StateKind::Value).unwrap();
            let ci = c.register("items", StateKind::List).unwrap();
            assert_eq!(contents(&c, &[cs, ci]), want);
        }
    }

    #[test]
    fn checkpoint_completion_promotes_only_that_checkpoints_files() {
        let mut u = Uploads::default();
        let f = |p: &str| FileRef::of(p, b"x");
        u.pending.insert(
            1,
            HashMap::from([("1.sst".to_owned(), f("shared/a-1.sst"))]),
        );
        u.pending.insert(
            2,
            HashMap::from([("2.sst".to_owned(), f("shared/a-2.sst"))]),
        );
        u.pending.insert(
            3,
            HashMap::from([("3.sst".to_owned(), f("shared/a-3.sst"))]),
        );
        let uploads = Arc::new(Mutex::new(u));
        let dir = tempfile::tempdir().unwrap();
        let mut b = RocksdbBackend::open(dir.path(), 8, KeyGroupRange::all(8), &spec()).unwrap();
        b.uploads = Arc::clone(&uploads);
        b.checkpoint_complete(2);
        {
            let u = lock(&uploads);
            assert_eq!(u.confirmed_at, Some(2));
            assert!(u.confirmed.contains_key("2.sst") && u.confirmed.len() == 1);
            assert_eq!(u.pending.keys().copied().collect::<Vec<_>>(), vec![3]);
        }
        b.checkpoint_complete(1); // late and subsumed: ignored
        assert_eq!(lock(&uploads).confirmed_at, Some(2));
        // Nothing pending for 7 (a savepoint, written canonically): 2's files may be deleted
        // by retention now, so none is reused.
        b.checkpoint_complete(7);
        let u = lock(&uploads);
        assert_eq!(u.confirmed_at, Some(7));
        assert!(u.confirmed.is_empty() && u.pending.is_empty());
    }
}
