//! Checkpoint storage: the [`CheckpointStore`] trait, an in-memory fake ([`MemoryStore`]) and
//! the local filesystem store ([`LocalStore`]); checksum-verified reads; and
//! [`latest_valid`], which picks the checkpoint to restore.
//!
//! Layout, relative to a pipeline's root `<storage>/<pipeline-id>/`:
//!
//! ```text
//! chk-<n>/_metadata        the metadata record; its presence makes checkpoint n complete
//! chk-<n>/<files>          files owned by checkpoint n (per-subtask snapshots)
//! shared/<files>           files several checkpoints may reference (RocksDB SSTs)
//! ```
//!
//! This module owns the bytes on disk and their integrity checks; which checkpoints to keep
//! is `retention`'s decision, when to write is the coordinator's.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::metadata::{
    self, CheckpointMetadata, FileRef, METADATA_FILE, SHARED_DIR, checkpoint_dir, metadata_path,
    parse_checkpoint_dir,
};
use super::{CheckpointId, Result};
use crate::base::error::CheckpointError;

/// Where one pipeline's checkpoints live. Paths are relative to the pipeline's root and
/// `/`-separated (see the module docs for the layout).
///
/// Consistency required of an implementation (local disks and today's object stores give it):
/// - [`put`](Self::put) is atomic and durable: once it returns, every later call sees the
///   whole new content, also after a crash; a crash during `put` leaves the old content (or
///   nothing), never a prefix.
/// - Reads, [`size`](Self::size) and listings after a `put` or `delete` returned see its
///   effect (read-after-write and list-after-write consistency).
/// - [`delete`](Self::delete) and [`delete_dir`](Self::delete_dir) are idempotent: deleting
///   what is absent succeeds.
///
/// Callers write a checkpoint's files before its `_metadata`, and delete its `_metadata`
/// before its files, so a listed `_metadata` never points at files not yet written or
/// already deleted.
pub trait CheckpointStore: Send + Sync {
    /// Writes `bytes` at `path`, replacing any previous content, atomically and durably.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidPath`] for a bad path; [`CheckpointError::Io`] when the
    /// storage fails.
    fn put(&self, path: &str, bytes: &[u8]) -> Result<()>;

    /// Writes `bytes` at `path` only when nothing is there yet, with the guarantees of
    /// [`put`](Self::put): checkpoint metadata is written this way. A store shared between
    /// processes (object storage) MUST make the check and the write one atomic step (a
    /// conditional put) and fail when `path` exists, so that two writers can never both
    /// complete the same checkpoint. The default, for stores owned by one process (memory,
    /// a local directory), is [`put`](Self::put).
    ///
    /// # Errors
    /// As [`put`](Self::put); [`CheckpointError::Io`] when `path` exists (shared stores).
    fn put_new(&self, path: &str, bytes: &[u8]) -> Result<()> {
        self.put(path, bytes)
    }

    /// Reads the whole file at `path`.
    ///
    /// # Errors
    /// [`CheckpointError::NotFound`] when absent; [`CheckpointError::InvalidPath`],
    /// [`CheckpointError::Io`] otherwise.
    fn get(&self, path: &str) -> Result<Vec<u8>>;

    /// The size of the file at `path`, without reading it.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn size(&self, path: &str) -> Result<u64>;

    /// The ids of every `chk-<n>` directory, ascending, complete or not.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the storage cannot be listed.
    fn list_checkpoints(&self) -> Result<Vec<CheckpointId>>;

    /// Every file under `shared/`, as store-relative paths, sorted.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the storage cannot be listed.
    fn list_shared(&self) -> Result<Vec<String>>;

    /// Deletes the file at `path`; succeeds when it is absent.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidPath`], [`CheckpointError::Io`].
    fn delete(&self, path: &str) -> Result<()>;

    /// Deletes the directory `path` and everything under it; succeeds when it is absent.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidPath`], [`CheckpointError::Io`].
    fn delete_dir(&self, path: &str) -> Result<()>;

    /// Writes the content of the local file `src` at `path`, with the guarantees of
    /// [`put`](Self::put), and returns its [`FileRef`] (size and checksum of what was
    /// written). The default reads the whole file and calls `put`; stores that can stream
    /// (such as [`LocalStore`]) override it so that large files (RocksDB SSTs) are never held
    /// in memory.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when `src` cannot be read; otherwise as [`put`](Self::put).
    fn put_file(&self, path: &str, src: &Path) -> Result<FileRef> {
        let bytes = fs::read(src).map_err(|source| CheckpointError::Io {
            what: "cannot read",
            path: src.to_path_buf(),
            source,
        })?;
        self.put(path, &bytes)?;
        Ok(FileRef::of(path, &bytes))
    }

    /// The local filesystem path of a store-relative path, when the store keeps its files
    /// on the local disk (savepoints hard-link them instead of copying). `None` by default.
    fn local_path(&self, _path: &str) -> Option<PathBuf> {
        None
    }

    /// Copies the file at `path` into the local file `dest` (created or truncated) and returns
    /// its [`FileRef`] as read (size and checksum of the bytes copied), for the caller to
    /// compare with the recorded one (see [`read_verified_to_file`]). The default reads the
    /// whole file with [`get`](Self::get); [`LocalStore`] streams.
    ///
    /// # Errors
    /// As [`get`](Self::get); [`CheckpointError::Io`] when `dest` cannot be written.
    fn get_to_file(&self, path: &str, dest: &Path) -> Result<FileRef> {
        let bytes = self.get(path)?;
        fs::write(dest, &bytes).map_err(|source| CheckpointError::Io {
            what: "cannot write",
            path: dest.to_path_buf(),
            source,
        })?;
        Ok(FileRef::of(path, &bytes))
    }
}

/// Checks a store-relative path: not empty, relative, `/`-separated, without empty, `.` or
/// `..` components.
///
/// # Errors
/// [`CheckpointError::InvalidPath`] naming the rule broken.
pub fn validate_path(path: &str) -> Result<()> {
    let invalid = |reason| {
        Err(CheckpointError::InvalidPath {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() {
        return invalid("empty");
    }
    if path.starts_with('/') {
        return invalid("absolute");
    }
    if path.contains('\\') || path.contains('\0') {
        return invalid("contains `\\` or NUL");
    }
    for part in path.split('/') {
        match part {
            "" => return invalid("empty component"),
            "." | ".." => return invalid("`.` or `..` component"),
            _ => {}
        }
    }
    Ok(())
}

/// Stores `bytes` at `path` and returns its [`FileRef`] (size and checksum) for the
/// acknowledgement.
///
/// # Errors
/// As [`CheckpointStore::put`].
pub fn write_file(store: &dyn CheckpointStore, path: &str, bytes: &[u8]) -> Result<FileRef> {
    store.put(path, bytes)?;
    Ok(FileRef::of(path, bytes))
}

/// Reads a checkpoint file and checks its size and checksum against `file`.
///
/// # Errors
/// [`CheckpointError::Corrupt`] on a mismatch; the store's errors otherwise.
pub fn read_verified(store: &dyn CheckpointStore, file: &FileRef) -> Result<Vec<u8>> {
    let bytes = store.get(&file.path)?;
    verify(file, &bytes)?;
    Ok(bytes)
}

/// Copies a checkpoint file into the local file `dest` (see [`CheckpointStore::get_to_file`])
/// and checks its size and checksum against `file`; on a mismatch `dest` is removed.
///
/// # Errors
/// [`CheckpointError::Corrupt`] on a mismatch; the store's errors otherwise.
pub fn read_verified_to_file(
    store: &dyn CheckpointStore,
    file: &FileRef,
    dest: &Path,
) -> Result<()> {
    let actual = store.get_to_file(&file.path, dest)?;
    let corrupt = |reason| CheckpointError::Corrupt {
        path: file.path.clone(),
        reason,
    };
    let mismatch = if actual.size != file.size {
        Some(corrupt(format!(
            "size {} bytes, the metadata records {}",
            actual.size, file.size
        )))
    } else if actual.crc32 != file.crc32 {
        Some(corrupt(format!(
            "checksum {:08x}, the metadata records {:08x}",
            actual.crc32, file.crc32
        )))
    } else {
        None
    };
    match mismatch {
        Some(e) => {
            let _ = fs::remove_file(dest);
            Err(e)
        }
        None => Ok(()),
    }
}

fn verify(file: &FileRef, bytes: &[u8]) -> Result<()> {
    let corrupt = |reason| CheckpointError::Corrupt {
        path: file.path.clone(),
        reason,
    };
    if bytes.len() as u64 != file.size {
        return Err(corrupt(format!(
            "size {} bytes, the metadata records {}",
            bytes.len(),
            file.size
        )));
    }
    let actual = metadata::checksum(bytes);
    if actual != file.crc32 {
        return Err(corrupt(format!(
            "checksum {actual:08x}, the metadata records {:08x}",
            file.crc32
        )));
    }
    Ok(())
}

/// Writes checkpoint metadata to `chk-<n>/_metadata` (after every file it references), with
/// [`CheckpointStore::put_new`].
///
/// # Errors
/// As [`CheckpointStore::put`] and [`CheckpointMetadata::encode`].
pub fn write_metadata(store: &dyn CheckpointStore, meta: &CheckpointMetadata) -> Result<()> {
    store.put_new(&metadata_path(meta.checkpoint), &meta.encode()?)
}

/// Reads and decodes checkpoint `id`'s metadata.
///
/// # Errors
/// [`CheckpointError::NotFound`] when the checkpoint has no metadata (it never completed);
/// [`CheckpointError::Corrupt`] when the record is truncated or damaged, or records another id.
pub fn read_metadata(store: &dyn CheckpointStore, id: CheckpointId) -> Result<CheckpointMetadata> {
    let path = metadata_path(id);
    let meta = CheckpointMetadata::decode(&path, &store.get(&path)?)?;
    if meta.checkpoint != id {
        return Err(CheckpointError::Corrupt {
            path,
            reason: format!("records checkpoint {}", meta.checkpoint),
        });
    }
    Ok(meta)
}

/// How thoroughly [`latest_valid`] checks a checkpoint's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Read every file and compare size and checksum (the default; reads all state once).
    Checksums,
    /// Compare sizes only (cheap; catches missing and truncated files).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    Sizes,
}

/// A checkpoint [`latest_valid`] passed over, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedCheckpoint {
    /// Its id.
    pub checkpoint: CheckpointId,
    /// Why it cannot be restored, for the warning.
    pub reason: String,
}

/// The outcome of [`latest_valid`].
#[derive(Clone, Debug)]
pub struct RestoreChoice {
    /// The newest checkpoint that passed every check, if any.
    pub checkpoint: Option<CheckpointMetadata>,
    /// Newer checkpoints that failed a check, newest first; the caller warns about each.
    pub skipped: Vec<SkippedCheckpoint>,
}

/// Finds the newest complete checkpoint whose metadata decodes and whose files all match
/// their recorded sizes (and, with [`Verification::Checksums`], checksums), falling back to
/// older retained ones. A `chk-<n>` directory without `_metadata` (a checkpoint that never
/// completed) is skipped as well. Each skip is logged as a warning and returned with its
/// reason.
///
/// # Errors
/// When the store cannot be listed, or remote storage is unavailable
/// ([`CheckpointError::Unavailable`]); a damaged checkpoint is skipped, not an error.
pub fn latest_valid(
    store: &dyn CheckpointStore,
    verification: Verification,
) -> Result<RestoreChoice> {
    let mut skipped = Vec::new();
    for id in store.list_checkpoints()?.into_iter().rev() {
        match check_checkpoint(store, id, verification) {
            Ok(meta) => {
                return Ok(RestoreChoice {
                    checkpoint: Some(meta),
                    skipped,
                });
            }
            // Remote storage that does not answer says nothing about the checkpoint: falling
            // back to an older one would replay output a newer one already committed.
            Err(e @ CheckpointError::Unavailable { .. }) => return Err(e),
            Err(e) => {
                let reason = e.to_string();
                tracing::warn!(checkpoint = id, %reason, "Skipping checkpoint that cannot be restored.");
                skipped.push(SkippedCheckpoint {
                    checkpoint: id,
                    reason,
                });
            }
        }
    }
    Ok(RestoreChoice {
        checkpoint: None,
        skipped,
    })
}

fn check_checkpoint(
    store: &dyn CheckpointStore,
    id: CheckpointId,
    verification: Verification,
) -> Result<CheckpointMetadata> {
    let meta = read_metadata(store, id)?;
    for file in meta.files() {
        match verification {
            Verification::Checksums => {
                read_verified(store, file)?;
            }
            Verification::Sizes => {
                let size = store.size(&file.path)?;
                if size != file.size {
                    return Err(CheckpointError::Corrupt {
                        path: file.path.clone(),
                        reason: format!("size {size} bytes, the metadata records {}", file.size),
                    });
                }
            }
        }
    }
    Ok(meta)
}

/// An in-memory store for tests (and the `memory` backend's in-process checkpoints): a map
/// from path to bytes behind a mutex. Trivially atomic and consistent; not durable.
#[derive(Debug, Default)]
pub struct MemoryStore {
    files: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn files(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        // A panic while holding the lock cannot leave the map half-updated: recover it.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every stored path, sorted (for tests).
    #[cfg(any(test, feature = "testkit"))]
    pub fn paths(&self) -> Vec<String> {
        self.files().keys().cloned().collect()
    }
}

impl CheckpointStore for MemoryStore {
    fn put(&self, path: &str, bytes: &[u8]) -> Result<()> {
        validate_path(path)?;
        self.files().insert(path.to_owned(), bytes.to_vec());
        Ok(())
    }

    fn get(&self, path: &str) -> Result<Vec<u8>> {
        validate_path(path)?;
        self.files()
            .get(path)
            .cloned()
            .ok_or_else(|| CheckpointError::NotFound {
                path: path.to_owned(),
            })
    }

    fn size(&self, path: &str) -> Result<u64> {
        validate_path(path)?;
        self.files()
            .get(path)
            .map(|b| b.len() as u64)
            .ok_or_else(|| CheckpointError::NotFound {
                path: path.to_owned(),
            })
    }

    fn list_checkpoints(&self) -> Result<Vec<CheckpointId>> {
        let mut ids: Vec<CheckpointId> = self
            .files()
            .keys()
            .filter_map(|p| p.split('/').next().and_then(parse_checkpoint_dir))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    fn list_shared(&self) -> Result<Vec<String>> {
        Ok(self
            .files()
            .keys()
            .filter(|p| metadata::is_shared_path(p))
            .cloned()
            .collect())
    }

    fn delete(&self, path: &str) -> Result<()> {
        validate_path(path)?;
        self.files().remove(path);
        Ok(())
    }

    fn delete_dir(&self, path: &str) -> Result<()> {
        validate_path(path)?;
        let prefix = format!("{path}/");
        self.files().retain(|p, _| !p.starts_with(&prefix));
        Ok(())
    }
}

/// The local filesystem store, rooted at `<storage>/<pipeline-id>/`.
///
/// `put` writes a temporary file in the target directory, fsyncs it, renames it over the
/// target (atomic on POSIX filesystems) and fsyncs the directory, so a crash leaves either
/// the old file or the new one. Parent directories are created as needed (and fsynced).
#[derive(Clone, Debug)]
pub struct LocalStore {
    root: PathBuf,
}

/// Distinguishes temporary files of concurrent writers in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl LocalStore {
    /// The store of pipeline `pipeline` under `storage`: `<storage>/<pipeline>/`. Nothing is
    /// created until the first write.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidPath`] when `pipeline` is not a single path component.
    pub fn new(storage: impl AsRef<Path>, pipeline: &str) -> Result<Self> {
        validate_path(pipeline)?;
        if pipeline.contains('/') {
            return Err(CheckpointError::InvalidPath {
                path: pipeline.to_owned(),
                reason: "a pipeline id must be one path component",
            });
        }
        Ok(Self {
            root: storage.as_ref().join(pipeline),
        })
    }

    /// A store rooted at `root` itself (for example `--from-checkpoint`'s parent directory).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The pipeline's root directory.
    #[cfg(any(test, feature = "testkit"))]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The absolute path of a store-relative path.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidPath`] for a bad path.
    pub fn resolve(&self, path: &str) -> Result<PathBuf> {
        validate_path(path)?;
        Ok(path.split('/').fold(self.root.clone(), |p, c| p.join(c)))
    }

    fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { what, path, source }
    }

    fn not_found_or(
        path: &str,
        what: &'static str,
        full: &Path,
    ) -> impl FnOnce(std::io::Error) -> CheckpointError {
        let rel = path.to_owned();
        let full = full.to_path_buf();
        move |source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                CheckpointError::NotFound { path: rel }
            } else {
                CheckpointError::Io {
                    what,
                    path: full,
                    source,
                }
            }
        }
    }

    /// Creates `dir` and its missing parents, fsyncing each parent whose entries changed.
    fn create_dirs(&self, dir: &Path) -> Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        if let Some(parent) = dir.parent() {
            self.create_dirs(parent)?;
        }
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => return Err(Self::io("cannot create directory", dir)(e)),
        }
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    }
}

/// Fsyncs a directory so that a rename or creation in it survives a crash (Unix only; other
/// platforms cannot open directories and make renames durable by other means).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(LocalStore::io("cannot sync directory", dir))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

impl LocalStore {
    /// Writes `path` atomically and durably: `fill` writes the content into a new temporary
    /// file in the target directory, which is then fsynced and renamed over the target, and
    /// the directory fsynced. The temporary file is removed when anything fails.
    fn write_atomically<R>(
        &self,
        path: &str,
        fill: impl FnOnce(&mut File, &Path) -> Result<R>,
    ) -> Result<R> {
        let target = self.resolve(path)?;
        let dir = target
            .parent()
            .ok_or_else(|| CheckpointError::InvalidPath {
                path: path.to_owned(),
                reason: "no parent directory",
            })?
            .to_path_buf();
        self.create_dirs(&dir)?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temp = dir.join(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)
                .map_err(Self::io("cannot write", &temp))?;
            let out = fill(&mut file, &temp)?;
            file.sync_all().map_err(Self::io("cannot write", &temp))?;
            Ok(out)
        })();
        let out = match written {
            Ok(out) => out,
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        };
        if let Err(e) = fs::rename(&temp, &target) {
            let _ = fs::remove_file(&temp);
            return Err(Self::io("cannot rename into place", &target)(e));
        }
        sync_dir(&dir)?;
        Ok(out)
    }
}

/// Copies `src` to `dst` in chunks, returning the number of bytes and their CRC-32 (the
/// same value as [`metadata::checksum`] over the whole content). `src_path` and `dst_path`
/// name the two ends in errors.
fn copy_with_checksum(
    src: &mut impl Read,
    src_path: &Path,
    dst: &mut impl Write,
    dst_path: &Path,
) -> Result<(u64, u32)> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut size = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(LocalStore::io("cannot read", src_path)(e)),
        };
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n])
            .map_err(LocalStore::io("cannot write", dst_path))?;
        size += n as u64;
    }
    Ok((size, hasher.finalize()))
}

/// Chunk size of streaming copies.
const COPY_CHUNK: usize = 256 * 1024;

impl CheckpointStore for LocalStore {
    fn put(&self, path: &str, bytes: &[u8]) -> Result<()> {
        self.write_atomically(path, |file, temp| {
            file.write_all(bytes)
                .map_err(Self::io("cannot write", temp))
        })
    }

    /// Streams `src` into place (temporary file, fsync, rename), computing size and
    /// checksum while copying.
    fn put_file(&self, path: &str, src: &Path) -> Result<FileRef> {
        let mut input = File::open(src).map_err(Self::io("cannot read", src))?;
        let (size, crc32) = self.write_atomically(path, |file, temp| {
            copy_with_checksum(&mut input, src, file, temp)
        })?;
        Ok(FileRef {
            path: path.to_owned(),
            size,
            crc32,
        })
    }

    fn local_path(&self, path: &str) -> Option<PathBuf> {
        self.resolve(path).ok()
    }

    /// Streams the file into `dest`, computing size and checksum while copying.
    fn get_to_file(&self, path: &str, dest: &Path) -> Result<FileRef> {
        let full = self.resolve(path)?;
        let mut input =
            File::open(&full).map_err(Self::not_found_or(path, "cannot read", &full))?;
        let mut output = File::create(dest).map_err(Self::io("cannot write", dest))?;
        let (size, crc32) = copy_with_checksum(&mut input, &full, &mut output, dest)?;
        Ok(FileRef {
            path: path.to_owned(),
            size,
            crc32,
        })
    }

    fn get(&self, path: &str) -> Result<Vec<u8>> {
        let full = self.resolve(path)?;
        fs::read(&full).map_err(Self::not_found_or(path, "cannot read", &full))
    }

    fn size(&self, path: &str) -> Result<u64> {
        let full = self.resolve(path)?;
        fs::metadata(&full)
            .map(|m| m.len())
            .map_err(Self::not_found_or(path, "cannot stat", &full))
    }

    fn list_checkpoints(&self) -> Result<Vec<CheckpointId>> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Self::io("cannot list", &self.root)(e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(Self::io("cannot list", &self.root))?;
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if let Some(id) = entry.file_name().to_str().and_then(parse_checkpoint_dir)
                && is_dir
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    fn list_shared(&self) -> Result<Vec<String>> {
        let shared = self.root.join(SHARED_DIR);
        let mut out = Vec::new();
        let mut stack = vec![(shared, SHARED_DIR.to_owned())];
        while let Some((dir, rel)) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Self::io("cannot list", &dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(Self::io("cannot list", &dir))?;
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if name.starts_with('.') {
                    continue; // temporary files of writes in progress
                }
                let child = format!("{rel}/{name}");
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((entry.path(), child));
                } else {
                    out.push(child);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn delete(&self, path: &str) -> Result<()> {
        let full = self.resolve(path)?;
        match fs::remove_file(&full) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Self::io("cannot delete", &full)(e)),
        }
    }

    fn delete_dir(&self, path: &str) -> Result<()> {
        let full = self.resolve(path)?;
        match fs::remove_dir_all(&full) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Self::io("cannot delete", &full)(e)),
        }
    }
}

/// Deletes a checkpoint: its `_metadata` first (so it stops being restorable), then its
/// directory.
///
/// # Errors
/// As [`CheckpointStore::delete`].
pub fn delete_checkpoint(store: &dyn CheckpointStore, id: CheckpointId) -> Result<()> {
    store.delete(&format!("{}/{METADATA_FILE}", checkpoint_dir(id)))?;
    store.delete_dir(&checkpoint_dir(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::metadata::tests::sample;

    /// Writes checkpoint `id` as [`sample`] describes it: its files, then its metadata.
    fn write_sample(store: &dyn CheckpointStore, id: CheckpointId) -> CheckpointMetadata {
        let meta = sample(id);
        for s in &meta.subtasks {
            store
                .put(&format!("chk-{id}/count-{}.snap", s.subtask), b"state")
                .expect("put");
        }
        store.put("shared/base.sst", b"shared").expect("put");
        write_metadata(store, &meta).expect("metadata");
        meta
    }

    /// The conformance suite every store passes.
    fn conformance(store: &dyn CheckpointStore) {
        assert_eq!(store.list_checkpoints().expect("list"), Vec::<u64>::new());
        assert!(matches!(
            store.get("chk-1/x"),
            Err(CheckpointError::NotFound { .. })
        ));
        assert!(store.put("../escape", b"x").is_err());
        assert!(store.put("/abs", b"x").is_err());
        assert!(store.put("a//b", b"x").is_err());

        let f = write_file(store, "chk-1/a", b"hello").expect("write");
        assert_eq!(f.size, 5);
        store.put("chk-1/a", b"hello, world").expect("overwrite");
        assert_eq!(store.get("chk-1/a").expect("get"), b"hello, world");
        assert_eq!(store.size("chk-1/a").expect("size"), 12);
        assert!(read_verified(store, &f).is_err(), "stale ref must fail");
        let f = FileRef::of("chk-1/a", b"hello, world");
        assert_eq!(read_verified(store, &f).expect("verified"), b"hello, world");

        store.put("chk-10/b", b"").expect("put");
        store.put("shared/x/y.sst", b"1").expect("put");
        store.put("shared/z.sst", b"2").expect("put");
        assert_eq!(store.list_checkpoints().expect("list"), vec![1, 10]);
        assert_eq!(
            store.list_shared().expect("shared"),
            vec!["shared/x/y.sst".to_owned(), "shared/z.sst".to_owned()]
        );

        store.delete("shared/z.sst").expect("delete");
        store.delete("shared/z.sst").expect("idempotent delete");
        delete_checkpoint(store, 1).expect("delete checkpoint");
        delete_checkpoint(store, 1).expect("idempotent");
        assert_eq!(store.list_checkpoints().expect("list"), vec![10]);
        assert_eq!(store.list_shared().expect("shared"), vec!["shared/x/y.sst"]);
    }

    /// The recovery rules every store passes.
    fn recovery_skips_damaged_checkpoints(store: &dyn CheckpointStore) {
        assert!(
            latest_valid(store, Verification::Checksums)
                .expect("list")
                .checkpoint
                .is_none()
        );
        write_sample(store, 1);
        write_sample(store, 2);
        let m3 = write_sample(store, 3);
        // Checkpoint 4 never completed: files, no metadata.
        store.put("chk-4/count-0.snap", b"state").expect("put");

        let choice = latest_valid(store, Verification::Checksums).expect("list");
        assert_eq!(choice.checkpoint.as_ref(), Some(&m3));
        assert_eq!(choice.skipped.len(), 1);
        assert_eq!(choice.skipped[0].checkpoint, 4);

        // Truncate 3's metadata; corrupt one of 2's files (same size, other bytes).
        let bytes = store.get("chk-3/_metadata").expect("get");
        store
            .put("chk-3/_metadata", &bytes[..bytes.len() / 2])
            .expect("truncate");
        store.put("chk-2/count-1.snap", b"stAte").expect("corrupt");

        let choice = latest_valid(store, Verification::Checksums).expect("list");
        assert_eq!(choice.checkpoint.map(|m| m.checkpoint), Some(1));
        let skipped: Vec<_> = choice.skipped.iter().map(|s| s.checkpoint).collect();
        assert_eq!(skipped, vec![4, 3, 2]);
        assert!(
            choice.skipped[1].reason.contains("truncated"),
            "{:?}",
            choice.skipped
        );
        assert!(
            choice.skipped[2].reason.contains("checksum")
                && choice.skipped[2].reason.contains("chk-2/count-1.snap"),
            "{:?}",
            choice.skipped
        );

        // Sizes-only verification does not read content, so it accepts 2.
        let choice = latest_valid(store, Verification::Sizes).expect("list");
        assert_eq!(choice.checkpoint.map(|m| m.checkpoint), Some(2));

        // A missing shared file disqualifies every checkpoint that references it.
        store.delete("shared/base.sst").expect("delete");
        let choice = latest_valid(store, Verification::Sizes).expect("list");
        assert!(choice.checkpoint.is_none());
        assert_eq!(choice.skipped.len(), 4);
    }

    /// Streaming uploads and downloads give the same [`FileRef`] as the whole-buffer path.
    fn streaming_files(store: &dyn CheckpointStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        // Larger than one copy chunk, not a multiple of it.
        let content: Vec<u8> = (0..(COPY_CHUNK * 3 + 12_345))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let src = dir.path().join("src.sst");
        fs::write(&src, &content).expect("write");
        let f = store
            .put_file("shared/op-x-000012.sst", &src)
            .expect("put_file");
        assert_eq!(f, FileRef::of("shared/op-x-000012.sst", &content));
        assert_eq!(store.get(&f.path).expect("get"), content);

        let dest = dir.path().join("back.sst");
        assert_eq!(store.get_to_file(&f.path, &dest).expect("get_to_file"), f);
        assert_eq!(fs::read(&dest).expect("read"), content);
        read_verified_to_file(store, &f, &dest).expect("verified");

        let stale = FileRef::of(f.path.clone(), b"other");
        let err = read_verified_to_file(store, &stale, &dest).expect_err("mismatch");
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        assert!(!dest.exists(), "a mismatching download is removed");
        assert!(matches!(
            store.get_to_file("shared/missing.sst", &dest),
            Err(CheckpointError::NotFound { .. })
        ));
        assert!(
            store
                .put_file("shared/y.sst", &dir.path().join("absent"))
                .is_err()
        );
        assert!(store.put_file("../escape", &src).is_err());
    }

    #[test]
    fn s3_store_conformance() {
        conformance(&crate::checkpoint::s3::testing::fresh_store());
    }

    #[test]
    fn s3_store_recovery_skips_truncated_and_corrupt_checkpoints() {
        recovery_skips_damaged_checkpoints(&crate::checkpoint::s3::testing::fresh_store());
    }

    #[test]
    fn s3_store_streams_files() {
        streaming_files(&crate::checkpoint::s3::testing::fresh_store());
    }

    #[test]
    fn memory_store_streams_files_through_the_defaults() {
        streaming_files(&MemoryStore::new());
    }

    #[test]
    fn local_store_streams_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::new(dir.path(), "p").expect("store");
        streaming_files(&store);
        let leftovers: Vec<_> = fs::read_dir(store.root().join("shared"))
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "no temporary files are left behind");
    }

    #[test]
    fn memory_store_conformance() {
        conformance(&MemoryStore::new());
    }

    #[test]
    fn local_store_conformance() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::new(dir.path(), "p").expect("store");
        conformance(&store);
        // No temporary files are left behind.
        let leftovers: Vec<_> = fs::read_dir(store.root().join("chk-10"))
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn memory_store_recovery_skips_truncated_and_corrupt_checkpoints() {
        recovery_skips_damaged_checkpoints(&MemoryStore::new());
    }

    #[test]
    fn local_store_recovery_skips_truncated_and_corrupt_checkpoints() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::new(dir.path(), "p").expect("store");
        recovery_skips_damaged_checkpoints(&store);
    }

    #[test]
    fn local_store_layout_is_documented_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::new(dir.path(), "shop").expect("store");
        write_sample(&store, 7);
        let root = dir.path().join("shop");
        assert!(root.join("chk-7").join("_metadata").is_file());
        assert!(root.join("chk-7").join("count-0.snap").is_file());
        assert!(root.join("shared").join("base.sst").is_file());
        // A file truncated on disk behind the store's back is caught.
        fs::write(
            root.join("chk-7").join("_metadata"),
            b"weir-checkpoint-metadata v1",
        )
        .expect("truncate");
        let choice = latest_valid(&store, Verification::Checksums).expect("list");
        assert!(choice.checkpoint.is_none());
        assert!(LocalStore::new(dir.path(), "a/b").is_err());
        assert!(LocalStore::new(dir.path(), "..").is_err());
    }
}
