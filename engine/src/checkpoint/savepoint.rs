//! Savepoints on disk: a self-contained directory holding a copy of one completed
//! savepoint-kind checkpoint, movable anywhere and restorable into any state backend.
//!
//! Layout: `<parent>/savepoint-<pipeline>-<id>-<unix ms>/` with `_metadata` (the checkpoint's
//! metadata, file paths relative to the directory) and under `chk-<id>/` one file per
//! operator subtask (`<operator>-<subtask>.op` for operator-local state,
//! `<operator>-<subtask>.keyed` for keyed state in the canonical, backend-independent
//! format). Nothing in it points into
//! checkpoint storage: savepoint barriers make every backend write the canonical format, so
//! no `shared/` file is ever referenced. The directory is assembled under a temporary name
//! and renamed into place, so a savepoint directory that exists is complete.
//!
//! The parent may also be an S3 location (`savepoints.dir: s3://bucket/prefix`, or a request
//! naming one): the same layout is written as objects under
//! `s3://bucket/prefix/savepoint-...`, through the checkpoint store on S3
//! ([`super::s3::S3Store`]). Object storage has no rename, so there `_metadata` is written
//! last, with a conditional put: a savepoint whose `_metadata` exists is complete, and a
//! failed write removes the files it wrote. A savepoint on S3 (written there, or a local one
//! copied there as it is) is read in place ([`open_savepoint`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Result;
use super::metadata::{CheckpointMetadata, FileRef, is_shared_path};
use super::s3::{S3Location, S3Store};
use super::storage::{CheckpointStore, LocalStore, read_verified, sync_dir};
use crate::base::error::CheckpointError;

/// The metadata file of a savepoint directory.
pub const SAVEPOINT_METADATA: &str = "_metadata";

/// A savepoint written to disk or to S3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenSavepoint {
    /// Its directory (for S3, its `s3://bucket/prefix/savepoint-...` URL).
    pub path: PathBuf,
    /// Bytes of its state files.
    pub size: u64,
}

/// The directory name of savepoint `id` of `pipeline` taken at `unix_ms`.
pub fn savepoint_dir_name(pipeline: &str, id: u64, unix_ms: u128) -> String {
    format!("savepoint-{pipeline}-{id}-{unix_ms}")
}

fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Copies completed checkpoint `meta` out of `store` into a new savepoint directory
/// `parent/name` (files on the same local disk are hard-linked, others copied), verifying
/// every copied file's size and checksum against the metadata. `parent` may be an `s3://`
/// location: the savepoint is then written there as objects (see the module docs).
///
/// # Errors
/// A file referencing shared storage (the checkpoint was not taken as a savepoint), a
/// directory that already exists, storage failures, a file whose content does not match,
/// an invalid `s3://` location, [`CheckpointError::Unavailable`] when S3 does not answer.
pub fn write_savepoint(
    store: &dyn CheckpointStore,
    meta: &CheckpointMetadata,
    parent: &Path,
    name: &str,
) -> Result<WrittenSavepoint> {
    if let Some(location) = S3Location::parse(&parent.to_string_lossy()) {
        let location = location.map_err(|reason| CheckpointError::Io {
            what: "invalid savepoint location",
            path: parent.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
        })?;
        return write_savepoint_s3(store, meta, &location, name);
    }
    check_self_contained(meta)?;
    let target = parent.join(name);
    if target.exists() {
        return Err(CheckpointError::Io {
            what: "savepoint directory already exists",
            path: target,
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        });
    }
    fs::create_dir_all(parent).map_err(io("cannot create directory", parent))?;
    let staging = parent.join(format!(".{name}.inprogress-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(io("cannot create directory", &staging))?;
    let result = (|| {
        let mut out = meta.clone();
        let mut size = 0;
        for st in &mut out.subtasks {
            for f in &mut st.files {
                let dest = LocalStore::at(&staging).resolve(&f.path)?;
                if let Some(d) = dest.parent() {
                    fs::create_dir_all(d).map_err(io("cannot create directory", d))?;
                }
                copy_file(store, f, &dest)?;
                size += f.size;
            }
        }
        let meta_path = staging.join(SAVEPOINT_METADATA);
        let bytes = out.encode()?;
        fs::write(&meta_path, &bytes).map_err(io("cannot write", &meta_path))?;
        fs::File::open(&meta_path)
            .and_then(|f| f.sync_all())
            .map_err(io("cannot write", &meta_path))?;
        sync_dir(&staging)?;
        fs::rename(&staging, &target).map_err(io("cannot rename into place", &target))?;
        sync_dir(parent)?;
        Ok(size)
    })();
    match result {
        Ok(size) => Ok(WrittenSavepoint { path: target, size }),
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// Refuses a checkpoint that references shared files: only savepoint-kind checkpoints
/// (canonical snapshots) are self-contained.
fn check_self_contained(meta: &CheckpointMetadata) -> Result<()> {
    match meta.files().find(|f| is_shared_path(&f.path)) {
        Some(f) => Err(CheckpointError::Protocol(format!(
            "checkpoint {} references shared file `{}`: only savepoint-kind checkpoints \
             (canonical snapshots) can become savepoints",
            meta.checkpoint, f.path
        ))),
        None => Ok(()),
    }
}

/// [`write_savepoint`] into `parent/name` on S3: every state file (read back from `store`
/// and verified), then `_metadata` with a conditional put. On failure the state files
/// written are deleted again (best effort; without `_metadata` they are never read).
fn write_savepoint_s3(
    store: &dyn CheckpointStore,
    meta: &CheckpointMetadata,
    parent: &S3Location,
    name: &str,
) -> Result<WrittenSavepoint> {
    check_self_contained(meta)?;
    let location = parent.join(name);
    let url = PathBuf::from(location.to_string());
    let target = S3Store::at(location)?;
    match target.size(SAVEPOINT_METADATA) {
        Ok(_) => {
            return Err(CheckpointError::Io {
                what: "savepoint directory already exists",
                path: url,
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        Err(CheckpointError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let mut written = Vec::new();
    let result = (|| {
        let mut size = 0;
        for f in meta.files() {
            let bytes = read_verified(store, f)?;
            written.push(f.path.clone());
            target.put(&f.path, &bytes)?;
            size += f.size;
        }
        target.put_new(SAVEPOINT_METADATA, &meta.encode()?)?;
        Ok(size)
    })();
    match result {
        Ok(size) => Ok(WrittenSavepoint { path: url, size }),
        Err(e) => {
            for path in written {
                let _ = target.delete(&path);
            }
            Err(e)
        }
    }
}

/// Deletes savepoint `path` (a local directory or an `s3://` location); one that does not
/// exist is no error. `_metadata` goes first, so a half-deleted savepoint is never read.
///
/// # Errors
/// Storage failures.
pub fn delete_savepoint(path: &Path) -> Result<()> {
    let Some(location) = S3Location::parse(&path.to_string_lossy()) else {
        return match fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io("cannot delete", path)(e))
            }
            _ => Ok(()),
        };
    };
    let location = location.map_err(|reason| CheckpointError::NotFound { path: reason })?;
    let store = S3Store::at(location)?;
    store.delete(SAVEPOINT_METADATA)?;
    store.delete_all()
}

fn copy_file(store: &dyn CheckpointStore, f: &FileRef, dest: &Path) -> Result<()> {
    if let Some(src) = store.local_path(&f.path)
        && fs::hard_link(&src, dest).is_ok()
    {
        // Checkpoint files are immutable once written: a link is a copy. Check the size
        // (cheap); checksums are verified when the savepoint is restored.
        let len = fs::metadata(dest).map_err(io("cannot read", dest))?.len();
        if len != f.size {
            return Err(CheckpointError::Corrupt {
                path: f.path.clone(),
                reason: format!("{len} bytes, the metadata records {}", f.size),
            });
        }
        return Ok(());
    }
    let got = store.get_to_file(&f.path, dest)?;
    if got.size != f.size || got.crc32 != f.crc32 {
        return Err(CheckpointError::Corrupt {
            path: f.path.clone(),
            reason: format!(
                "{} bytes with checksum {:08x}, the metadata records {} bytes with {:08x}",
                got.size, got.crc32, f.size, f.crc32
            ),
        });
    }
    Ok(())
}

/// Opens a savepoint directory (or its `_metadata` file): decodes the metadata and checks
/// every file's size and checksum. Returns the metadata and a store rooted at the directory.
///
/// # Errors
/// A path that is not a savepoint, truncated or damaged metadata, a missing or corrupt file.
pub fn read_savepoint(path: &Path) -> Result<(CheckpointMetadata, LocalStore)> {
    let dir = if path.file_name().is_some_and(|n| n == SAVEPOINT_METADATA) {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    let meta_path = dir.join(SAVEPOINT_METADATA);
    let bytes = fs::read(&meta_path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CheckpointError::NotFound {
                path: format!(
                    "{} (not a savepoint directory: it has no `{SAVEPOINT_METADATA}`)",
                    meta_path.display()
                ),
            }
        } else {
            io("cannot read", &meta_path)(e)
        }
    })?;
    let meta = CheckpointMetadata::decode(&meta_path.to_string_lossy(), &bytes)?;
    let store = LocalStore::at(dir);
    for f in meta.files() {
        read_verified(&store, f)?;
    }
    Ok((meta, store))
}

/// Opens a savepoint as [`read_savepoint`] does, a local directory or one on S3
/// (`s3://bucket/prefix/savepoint-...`, for example copied there with `aws s3 cp`): returns
/// the metadata and a store rooted at the directory.
///
/// # Errors
/// As [`read_savepoint`]; [`CheckpointError::Unavailable`] when S3 does not answer.
pub fn open_savepoint(path: &Path) -> Result<(CheckpointMetadata, Arc<dyn CheckpointStore>)> {
    let text = path.to_string_lossy();
    let Some(location) = S3Location::parse(&text) else {
        let (meta, store) = read_savepoint(path)?;
        return Ok((meta, Arc::new(store)));
    };
    let mut location = location.map_err(|reason| CheckpointError::NotFound { path: reason })?;
    if let Some(dir) = location
        .prefix
        .strip_suffix(SAVEPOINT_METADATA)
        .map(|d| d.trim_end_matches('/').to_owned())
    {
        location.prefix = dir;
    }
    let store = S3Store::at(location)?;
    let bytes = store.get(SAVEPOINT_METADATA).map_err(|e| match e {
        CheckpointError::NotFound { .. } => CheckpointError::NotFound {
            path: format!(
                "{text} (not a savepoint directory: it has no `{SAVEPOINT_METADATA}`)"
            ),
        },
        e => e,
    })?;
    let meta = CheckpointMetadata::decode(&text, &bytes)?;
    for f in meta.files() {
        read_verified(&store, f)?;
    }
    Ok((meta, Arc::new(store)))
}

/// The id of the pipeline a savepoint was taken of, read from its metadata (`None` when the
/// path is not a readable, intact savepoint).
pub fn savepoint_pipeline(path: &Path) -> Option<String> {
    open_savepoint(path).ok().map(|(meta, _)| meta.pipeline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::message::BarrierKind;
    use crate::checkpoint::metadata::{KeyGroups, OperatorInfo, SubtaskState};
    use crate::checkpoint::storage::{MemoryStore, write_file};

    fn meta_with(store: &dyn CheckpointStore) -> CheckpointMetadata {
        let a = write_file(store, "chk-4/sum-0.keyed", b"keyed state").expect("write");
        let b = write_file(store, "chk-4/src-0.op", b"position").expect("write");
        CheckpointMetadata {
            format_version: crate::checkpoint::metadata::METADATA_FORMAT_VERSION,
            pipeline: "p".into(),
            checkpoint: 4,
            kind: BarrierKind::Savepoint,
            config_hash: "h".into(),
            max_parallelism: 128,
            backend: None,
            operators: vec![OperatorInfo {
                id: "sum".into(),
                parallelism: 1,
                script_hash: None,
                node: None,
                keyed_state: None,
                local_state: None,
            }],
            subtasks: vec![
                SubtaskState {
                    operator: "sum".into(),
                    subtask: 0,
                    key_groups: KeyGroups { start: 0, end: 128 },
                    files: vec![a],
                    watermark: None,
                },
                SubtaskState {
                    operator: "src".into(),
                    subtask: 0,
                    key_groups: KeyGroups { start: 0, end: 128 },
                    files: vec![b],
                    watermark: None,
                },
            ],
            finished_tasks: Vec::new(),
            finished_operators: Vec::new(),
        }
    }

    #[test]
    fn a_savepoint_is_self_contained_and_movable() {
        let dir = tempfile::tempdir().expect("tempdir");
        for local in [false, true] {
            let store: Box<dyn CheckpointStore> = if local {
                Box::new(LocalStore::at(dir.path().join("ck")))
            } else {
                Box::new(MemoryStore::new())
            };
            let meta = meta_with(&*store);
            let name = savepoint_dir_name("p", 4, u128::from(local));
            let sp =
                write_savepoint(&*store, &meta, &dir.path().join("sp"), &name).expect("savepoint");
            assert_eq!(sp.size, 19);
            // Move it elsewhere and drop the checkpoint storage: it still restores.
            let moved = dir.path().join(format!("moved-{local}"));
            fs::rename(&sp.path, &moved).expect("move");
            let _ = fs::remove_dir_all(dir.path().join("ck"));
            let (read, store) = read_savepoint(&moved).expect("read");
            assert_eq!(read.checkpoint, 4);
            assert_eq!(read.subtasks[0].files[0].path, "chk-4/sum-0.keyed");
            assert_eq!(
                read_verified(&store, &read.subtasks[0].files[0]).expect("file"),
                b"keyed state"
            );
            // Also through the `_metadata` path.
            assert!(read_savepoint(&moved.join("_metadata")).is_ok());
        }
    }

    #[test]
    fn damaged_or_foreign_savepoints_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MemoryStore::new();
        let meta = meta_with(&store);
        let sp = write_savepoint(&store, &meta, dir.path(), "sp").expect("savepoint");
        fs::write(sp.path.join("chk-4/sum-0.keyed"), b"keyed stat!").expect("damage");
        let e = read_savepoint(&sp.path).expect_err("corrupt");
        assert!(e.to_string().contains("sum-0.keyed"), "{e}");
        let e = read_savepoint(dir.path()).expect_err("not a savepoint");
        assert!(e.to_string().contains("not a savepoint directory"), "{e}");
        // An existing target is never overwritten.
        let e = write_savepoint(&store, &meta, dir.path(), "sp").expect_err("exists");
        assert!(e.to_string().contains("already exists"), "{e}");
        // A native (shared-file) checkpoint cannot become a savepoint.
        let mut native = meta.clone();
        native.subtasks[0].files[0].path = "shared/abc.sst".into();
        let e = write_savepoint(&store, &native, dir.path(), "sp2").expect_err("shared");
        assert!(e.to_string().contains("shared"), "{e}");
        assert!(!dir.path().join("sp2").exists());
    }
}
