//! Scenarios for the rocksdb state backend against real RocksDB instances and a real local
//! checkpoint store: native checkpoint and restore, rescaling, canonical interchange with the
//! memory backend, incremental uploads, retention of shared files, and corrupt files.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rhai::Dynamic;
use weir_engine::base::error::CheckpointError;
use weir_engine::checkpoint::metadata::{FileRef, is_shared_path};
use weir_engine::checkpoint::retention::CheckpointFiles;
use weir_engine::checkpoint::{CheckpointId, CheckpointStore, LocalStore};
use weir_engine::checkpoint::{Result as StoreResult, plan_retention};
use weir_engine::record::{Key, KeyGroupRange};
use weir_engine::state::{
    MemoryBackend, RocksdbBackend, SnapshotTarget, StateBackend, StateId, canonical,
};
use weir_schema::RocksdbSpec;
use weir_schema::StateKind;
use weir_schema::units::SizeSpec;

fn spec(incremental: bool) -> RocksdbSpec {
    RocksdbSpec {
        path: None,
        incremental,
        block_cache_size: SizeSpec::mib(8),
        write_buffer_size: SizeSpec::mib(8),
    }
}

fn key(i: i64) -> Key {
    Key::from_str_value(format!("user-{i}").into())
}

fn target(id: CheckpointId, sub: u32) -> SnapshotTarget {
    SnapshotTarget {
        checkpoint: id,
        private_prefix: format!("chk-{id}/agg-{sub}"),
        shared_prefix: format!("shared/agg-{sub}"),
    }
}

/// A local store that counts the bytes written through it.
struct CountingStore {
    inner: LocalStore,
    written: AtomicU64,
}

impl CountingStore {
    fn new(root: &Path) -> Self {
        Self {
            inner: LocalStore::at(root),
            written: AtomicU64::new(0),
        }
    }

    /// Bytes written since the last call.
    fn take_written(&self) -> u64 {
        self.written.swap(0, Ordering::Relaxed)
    }
}

impl CheckpointStore for CountingStore {
    fn put(&self, path: &str, bytes: &[u8]) -> StoreResult<()> {
        self.written
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.inner.put(path, bytes)
    }
    fn put_file(&self, path: &str, src: &Path) -> StoreResult<FileRef> {
        let f = self.inner.put_file(path, src)?;
        self.written.fetch_add(f.size, Ordering::Relaxed);
        Ok(f)
    }
    fn get(&self, path: &str) -> StoreResult<Vec<u8>> {
        self.inner.get(path)
    }
    fn get_to_file(&self, path: &str, dest: &Path) -> StoreResult<FileRef> {
        self.inner.get_to_file(path, dest)
    }
    fn size(&self, path: &str) -> StoreResult<u64> {
        self.inner.size(path)
    }
    fn list_checkpoints(&self) -> StoreResult<Vec<CheckpointId>> {
        self.inner.list_checkpoints()
    }
    fn list_shared(&self) -> StoreResult<Vec<String>> {
        self.inner.list_shared()
    }
    fn delete(&self, path: &str) -> StoreResult<()> {
        self.inner.delete(path)
    }
    fn delete_dir(&self, path: &str) -> StoreResult<()> {
        self.inner.delete_dir(path)
    }
}

/// Every entry of three states, as text, for comparing backends.
fn contents(b: &mut dyn StateBackend) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (name, kind) in [
        ("sum", StateKind::Value),
        ("seen", StateKind::List),
        ("by_day", StateKind::Map),
    ] {
        let s = b.register(name, kind).unwrap();
        for k in b.keys(s).unwrap() {
            let v = b.get(s, &k).unwrap().unwrap();
            out.insert((name.to_owned(), k.to_dynamic().to_string()), v.to_string());
        }
    }
    out
}

struct Handles {
    sum: StateId,
    seen: StateId,
    by_day: StateId,
}

fn handles(b: &mut dyn StateBackend) -> Handles {
    Handles {
        sum: b.register("sum", StateKind::Value).unwrap(),
        seen: b.register("seen", StateKind::List).unwrap(),
        by_day: b.register("by_day", StateKind::Map).unwrap(),
    }
}

/// Fills the keys `0..n` that fall into the backend's key groups.
fn fill(b: &mut dyn StateBackend, m: u32, n: i64) {
    let h = handles(b);
    let range = b.key_groups();
    for i in (0..n).filter(|&i| range.contains(key(i).key_group(m))) {
        let k = key(i);
        b.put(h.sum, &k, Dynamic::from_int(i)).unwrap();
        b.list_push(h.seen, &k, Dynamic::from(format!("e{i}")))
            .unwrap();
        if i % 3 == 0 {
            b.list_push(h.seen, &k, Dynamic::from_float(i as f64 / 2.0))
                .unwrap();
            b.map_put(h.by_day, &k, "mon", Dynamic::from_int(i * 2))
                .unwrap();
        }
    }
}

/// A canonical snapshot's states by name, each as the bytes of its kind and entries (in the
/// order written: key group, key, encoded value).
fn by_state(snapshot: &[u8], m: u32) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut current = String::new();
    canonical::read_snapshot(snapshot, m, |item| {
        match item {
            canonical::SnapshotItem::State { name, kind, .. } => {
                current = name.to_owned();
                out.insert(current.clone(), format!("{kind:?};").into_bytes());
            }
            canonical::SnapshotItem::Entry { kg, key, value } => {
                let bytes = out.get_mut(&current).unwrap();
                bytes.extend_from_slice(format!("{kg}|{:?}|", key.value()).as_bytes());
                bytes.extend_from_slice(value);
            }
        }
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn native_checkpoint_restores_identically_at_the_same_range() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = CountingStore::new(root.path());
    let m = 128;
    let range = KeyGroupRange::for_subtask(m, 2, 1);
    let mut a = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
    fill(&mut a, m, 4000);
    let before = a.snapshot(range).unwrap();
    let expected = contents(&mut a);
    let pending = a.checkpoint(1).unwrap();
    // Writes after the barrier are not part of the checkpoint.
    let h = handles(&mut a);
    a.put(h.sum, &key(1), Dynamic::from_int(-1)).unwrap();
    let files = pending.write(&store, &target(1, 1)).unwrap();
    a.checkpoint_complete(1);
    assert!(files.iter().any(|f| f.path == "chk-1/agg-1.rocksdb"));
    assert!(
        files
            .iter()
            .any(|f| f.is_shared() && f.path.ends_with(".sst"))
    );
    assert!(
        files
            .iter()
            .all(|f| f.is_shared() || f.path.starts_with("chk-1/agg-1")),
        "{files:?}"
    );
    // The local checkpoint directory is gone once uploaded.
    let leftovers: Vec<_> = std::fs::read_dir(a.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("chk-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let mut b = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
    b.register("by_day", StateKind::Map).unwrap(); // another registration order
    let fresh = b.register("fresh", StateKind::Value).unwrap(); // not in the checkpoint
    b.restore_files(&store, &files).unwrap();
    assert!(b.keys(fresh).unwrap().is_empty());
    let mut restored = by_state(&b.snapshot(range).unwrap(), m);
    assert!(
        restored.remove("fresh").is_some(),
        "registered states are listed"
    );
    assert!(
        restored == by_state(&before, m),
        "canonical snapshots hold byte-identical states"
    );
    assert_eq!(contents(&mut b), expected);

    // The restored SSTs count as uploaded: checkpointing the restored state again uploads
    // no SST and references the same shared files.
    store.take_written();
    let files2 = b
        .checkpoint(2)
        .unwrap()
        .write(&store, &target(2, 1))
        .unwrap();
    let shared1: BTreeSet<_> = files.iter().filter(|f| f.is_shared()).collect();
    let shared2: BTreeSet<_> = files2.iter().filter(|f| f.is_shared()).collect();
    assert_eq!(shared1, shared2);
    let private: u64 = files2
        .iter()
        .filter(|f| !f.is_shared())
        .map(|f| f.size)
        .sum();
    assert_eq!(store.take_written(), private, "only private files uploaded");

    // A state registered before the restore but unknown to the checkpoint got an id of its
    // own: writing it leaves the restored states alone.
    let k = (0..4000)
        .map(key)
        .find(|k| range.contains(k.key_group(m)))
        .unwrap();
    b.put(fresh, &k, Dynamic::from("new")).unwrap();
    assert_eq!(b.keys(fresh).unwrap().len(), 1);
    assert_eq!(contents(&mut b), expected);
}

#[test]
fn native_checkpoint_of_all_key_groups_restores_into_two_halves() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = LocalStore::at(root.path());
    let m = 128;
    let n = 6000;
    let mut full =
        RocksdbBackend::open(work.path(), m, KeyGroupRange::all(m), &spec(true)).unwrap();
    fill(&mut full, m, n);
    let expected = contents(&mut full);
    let files = full
        .checkpoint(3)
        .unwrap()
        .write(&store, &target(3, 0))
        .unwrap();
    drop(full);

    let mut union = BTreeMap::new();
    for sub in 0..2 {
        let range = KeyGroupRange::for_subtask(m, 2, sub);
        let mut half = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
        half.restore_files(&store, &files).unwrap();
        let got = contents(&mut half);
        assert!(!got.is_empty());
        for ((state, k), v) in got {
            let key = Key::from_dynamic(&Dynamic::from(k.clone()));
            assert!(range.contains(key.key_group(m)), "{k} in {range:?}");
            assert!(union.insert((state, k), v).is_none(), "in one half only");
        }
        // A restored half checkpoints and restores again (at its own range).
        let again = half
            .checkpoint(4)
            .unwrap()
            .write(&store, &target(4, sub))
            .unwrap();
        let mut back = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
        back.restore_files(&store, &again).unwrap();
        assert_eq!(contents(&mut back), contents(&mut half));
    }
    assert_eq!(union, expected);
}

#[test]
fn canonical_snapshots_interchange_with_the_memory_backend() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = LocalStore::at(root.path());
    let m = 64;
    let all = KeyGroupRange::all(m);

    // rocksdb -> memory
    let mut rocks = RocksdbBackend::open(work.path(), m, all, &spec(true)).unwrap();
    fill(&mut rocks, m, 1500);
    let expected = contents(&mut rocks);
    let mut mem = MemoryBackend::new(m, all);
    mem.restore(&[&rocks.snapshot(all).unwrap()]).unwrap();
    assert_eq!(contents(&mut mem), expected);

    // memory -> rocksdb, through the bytes and through a memory checkpoint's `.keyed` file,
    // into two halves
    let mut mem = MemoryBackend::new(m, all);
    fill(&mut mem, m, 1500);
    assert_eq!(contents(&mut mem), expected);
    let mut r2 = RocksdbBackend::open(work.path(), m, all, &spec(true)).unwrap();
    r2.restore(&[&mem.snapshot(all).unwrap()]).unwrap();
    assert_eq!(contents(&mut r2), expected);

    let files = mem
        .checkpoint(1)
        .unwrap()
        .write(&store, &target(1, 0))
        .unwrap();
    assert!(files[0].path.ends_with(".keyed"));
    let mut union = BTreeMap::new();
    for sub in 0..2 {
        let range = KeyGroupRange::for_subtask(m, 2, sub);
        let mut half = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
        half.restore_files(&store, &files).unwrap();
        union.extend(contents(&mut half));
    }
    assert_eq!(union, expected);

    // A native rocksdb checkpoint cannot be restored by the memory backend: a clear error.
    let native = rocks
        .checkpoint(2)
        .unwrap()
        .write(&store, &target(2, 0))
        .unwrap();
    let err = MemoryBackend::new(m, all)
        .restore_files(&store, &native)
        .unwrap_err();
    assert!(err.to_string().contains("rocksdb"), "{err}");
}

/// Writes ~50k keys, checkpoints (and completes) them, changes a handful of keys and
/// checkpoints again: the second checkpoint uploads only a small fraction of the first.
#[test]
fn incremental_checkpoints_upload_only_new_sst_files() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = CountingStore::new(root.path());
    let m = 128;
    let range = KeyGroupRange::all(m);
    let mut b = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
    let s = b.register("profile", StateKind::Value).unwrap();
    for i in 0..50_000 {
        let v = weir_engine::record::map_of([
            ("id", Dynamic::from_int(i)),
            ("name", Dynamic::from(format!("customer number {i}"))),
            ("total", Dynamic::from_float(i as f64 * 1.25)),
        ]);
        b.put(s, &key(i), v).unwrap();
    }
    store.take_written();
    let files1 = b
        .checkpoint(1)
        .unwrap()
        .write(&store, &target(1, 0))
        .unwrap();
    let first = store.take_written();
    b.checkpoint_complete(1);

    for i in [3, 333, 4_444, 12_345, 49_999] {
        b.put(s, &key(i), Dynamic::from_int(-i)).unwrap();
    }
    let files2 = b
        .checkpoint(2)
        .unwrap()
        .write(&store, &target(2, 0))
        .unwrap();
    let second = store.take_written();
    b.checkpoint_complete(2);
    println!(
        "incremental: checkpoint 1 uploaded {first} bytes ({} files), checkpoint 2 uploaded \
         {second} bytes ({} files referenced, {:.2}% of checkpoint 1)",
        files1.len(),
        files2.len(),
        second as f64 * 100.0 / first as f64
    );
    assert!(
        first > 500_000,
        "50k keys make a sizeable SST ({first} bytes)"
    );
    assert!(
        second * 5 < first,
        "checkpoint 2 uploaded {second} bytes, checkpoint 1 {first}"
    );
    // Every SST of checkpoint 1 is still referenced (no compaction ran) under the same
    // path, size and checksum: the listing is complete for retention.
    for f in files1.iter().filter(|f| f.is_shared()) {
        assert!(files2.contains(f), "{f:?} is referenced again");
    }
    let new_bytes: u64 = files2
        .iter()
        .filter(|f| !files1.contains(f))
        .map(|f| f.size)
        .sum();
    assert_eq!(new_bytes, second, "what was uploaded is what is new");

    // Checkpoint 2 alone restores the latest values.
    let mut back = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
    back.restore_files(&store, &files2).unwrap();
    let s2 = back.register("profile", StateKind::Value).unwrap();
    assert_eq!(back.keys(s2).unwrap().len(), 50_000);
    assert_eq!(back.get(s2, &key(333)).unwrap().unwrap().as_int(), Ok(-333));
    let v = back.get(s2, &key(7)).unwrap().unwrap();
    assert_eq!(
        v.as_map_ref().unwrap().get("name").unwrap().to_string(),
        "customer number 7"
    );

    // Without incremental checkpoints, every checkpoint is a full private copy.
    let mut full = RocksdbBackend::open(work.path(), m, range, &spec(false)).unwrap();
    full.restore_files(&store, &files2).unwrap();
    store.take_written();
    let f3 = full
        .checkpoint(3)
        .unwrap()
        .write(&store, &target(3, 0))
        .unwrap();
    full.checkpoint_complete(3);
    let f4 = full
        .checkpoint(4)
        .unwrap()
        .write(&store, &target(4, 0))
        .unwrap();
    let full_bytes = store.take_written();
    println!("non-incremental: checkpoints 3 and 4 uploaded {full_bytes} bytes together");
    assert!(f3.iter().chain(&f4).all(|f| !f.is_shared()));
    assert!(full_bytes > first, "two full copies");
}

/// Incremental checkpoints with compactions in between, retention over their file lists:
/// a shared SST is deleted only when no retained checkpoint references it, and the
/// retained checkpoints stay restorable.
#[test]
fn retention_never_deletes_a_shared_sst_still_referenced() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = LocalStore::at(root.path());
    let m = 32;
    let range = KeyGroupRange::all(m);
    let mut b = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
    let s = b.register("n", StateKind::Value).unwrap();
    let mut completed: Vec<CheckpointFiles> = Vec::new();
    let mut lists: BTreeMap<CheckpointId, Vec<FileRef>> = BTreeMap::new();
    let mut deleted_shared = 0;
    for id in 1..=8 {
        for i in 0..2000 {
            b.put(s, &key(i + id as i64 * 500), Dynamic::from_int(id as i64))
                .unwrap();
        }
        if id % 3 == 0 {
            b.compact().unwrap(); // old SSTs disappear from the live database
        }
        let files = b
            .checkpoint(id)
            .unwrap()
            .write(&store, &target(id, 0))
            .unwrap();
        b.checkpoint_complete(id);
        completed.push(CheckpointFiles {
            checkpoint: id,
            files: files.iter().map(|f| f.path.clone()).collect(),
        });
        lists.insert(id, files);

        let plan = plan_retention(&completed, 2);
        let retained: BTreeSet<&str> = completed
            .iter()
            .filter(|c| plan.retained.contains(&c.checkpoint))
            .flat_map(|c| c.files.iter().map(String::as_str))
            .collect();
        for f in &plan.delete_files {
            assert!(!retained.contains(f.as_str()), "{f} is still referenced");
            deleted_shared += usize::from(is_shared_path(f));
        }
        plan.execute(&store).unwrap();
        completed.retain(|c| plan.retained.contains(&c.checkpoint));
        // Every file of every retained checkpoint is still there, intact.
        for c in &completed {
            for f in &lists[&c.checkpoint] {
                assert_eq!(store.size(&f.path).unwrap(), f.size, "{}", f.path);
            }
        }
    }
    assert!(
        deleted_shared > 0,
        "compactions made some shared SSTs unused"
    );
    let shared_on_disk = store.list_shared().unwrap();
    let referenced: BTreeSet<&String> = completed.iter().flat_map(|c| &c.files).collect();
    for p in &shared_on_disk {
        assert!(
            referenced.contains(p),
            "{p} is neither referenced nor deleted"
        );
    }

    // Both retained checkpoints restore.
    for c in &completed {
        let mut back = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
        back.restore_files(&store, &lists[&c.checkpoint]).unwrap();
        let s = back.register("n", StateKind::Value).unwrap();
        let last = c.checkpoint as i64;
        assert_eq!(
            back.get(s, &key(last * 500)).unwrap().unwrap().as_int(),
            Ok(last)
        );
    }
}

#[test]
fn corrupt_or_missing_files_fail_the_restore_without_panicking() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = LocalStore::at(root.path());
    let m = 16;
    let range = KeyGroupRange::all(m);
    let mut a = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
    fill(&mut a, m, 500);
    let files = a
        .checkpoint(1)
        .unwrap()
        .write(&store, &target(1, 0))
        .unwrap();
    let sst = files
        .iter()
        .find(|f| f.is_shared() && f.path.ends_with(".sst"))
        .unwrap()
        .clone();
    let manifest = files
        .iter()
        .find(|f| f.path.ends_with(".rocksdb"))
        .unwrap()
        .clone();

    let restore = |files: &[FileRef], range: KeyGroupRange| {
        let mut b = RocksdbBackend::open(work.path(), m, range, &spec(true)).unwrap();
        b.restore_files(&store, files)
    };
    restore(&files, range).unwrap();

    // Same size, one byte flipped: a checksum error, at the same range and when rescaling.
    let good = store.get(&sst.path).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    store.put(&sst.path, &bad).unwrap();
    for r in [range, KeyGroupRange { start: 0, end: 8 }] {
        let err = restore(&files, r).unwrap_err();
        assert!(
            matches!(
                err,
                weir_engine::base::error::RunError::Checkpoint(CheckpointError::Corrupt { .. })
            ),
            "{err}"
        );
        assert!(err.to_string().contains(&sst.path), "{err}");
    }

    // Missing.
    store.delete(&sst.path).unwrap();
    let err = restore(&files, range).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    store.put(&sst.path, &good).unwrap();
    restore(&files, range).unwrap();

    // A damaged manifest.
    let text = store.get(&manifest.path).unwrap();
    let mut bad = text.clone();
    bad[10] ^= 0x01;
    store.put(&manifest.path, &bad).unwrap();
    assert!(restore(&files, range).is_err());
    // Valid bytes, recorded anew, but not a manifest.
    let fake = FileRef::of(manifest.path.clone(), b"{\"format\":\"x\"}");
    store.put(&manifest.path, b"{\"format\":\"x\"}").unwrap();
    let mut forged = files.clone();
    for f in &mut forged {
        if f.path == manifest.path {
            *f = fake.clone();
        }
    }
    assert!(restore(&forged, range).is_err());

    // Another number of key groups.
    store.put(&manifest.path, &text).unwrap();
    let mut other =
        RocksdbBackend::open(work.path(), 32, KeyGroupRange::all(32), &spec(true)).unwrap();
    let err = other.restore_files(&store, &files).unwrap_err();
    assert!(err.to_string().contains("max_parallelism"), "{err}");
}
