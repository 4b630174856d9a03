//! Reading a checkpoint or savepoint for inspection, without running its pipeline: the read
//! half of Flink's State Processor API, behind `weir inspect`.
//!
//! [`open`] takes a savepoint directory (`savepoint-<pipeline>-<id>-<ms>/`) or a checkpoint
//! directory (`<storage>/<pipeline>/chk-<n>`, whose shared files live beside it), local or on
//! S3 (`s3://bucket/prefix/...`), and decodes its `_metadata`. [`Snapshot::inspect`] then reads every file the metadata references and
//! reports per operator its declared states, the entries and bytes of each keyed state and of
//! each key group, the files of each subtask, and each subtask's operator-local state (a
//! source's positions, a file sink's pending parts) with its fields named. Keyed state is read
//! in every format a checkpoint holds: canonical `.keyed` snapshots (memory and fs backends,
//! every savepoint) and RocksDB's native checkpoints (copied into a scratch directory and read
//! back). [`Snapshot::dump`] writes the keyed state of one operator (optionally one state) as
//! JSON lines.
//!
//! A missing or damaged file never panics and never hides the others: `inspect` reports each
//! by its path with the reason and goes on with the rest; `dump` stops at the first, naming
//! it. This module only reads: it never writes into the snapshot.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use weir_schema::StateKind;

use crate::base::error::CheckpointError;
use crate::base::error::RunError;
use crate::checkpoint::metadata::{
    METADATA_FILE, OperatorInfo, is_channel_file, is_keyed_file, is_local_file,
    parse_checkpoint_dir,
};
use crate::checkpoint::s3::{S3Location, S3Store};
use crate::checkpoint::storage::read_verified;
use crate::checkpoint::{CheckpointMetadata, CheckpointStore, FileRef, LocalStore};
use crate::state::CANONICAL_SUFFIX;
use crate::state::canonical::{SnapshotItem, decode_value, read_snapshot};
use crate::state::rocksdb::{NATIVE_SUFFIX, native_to_canonical};

/// Why a snapshot cannot be inspected or dumped.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The path is not a checkpoint or savepoint directory.
    #[error("`{path}` is not a checkpoint or savepoint: {reason}")]
    NotASnapshot {
        /// The path given.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// A file of the snapshot is missing or damaged.
    #[error("`{file}`: {reason}")]
    Damaged {
        /// The file, as a path on disk.
        file: PathBuf,
        /// Missing, truncated, wrong checksum, undecodable.
        reason: String,
    },
    /// The snapshot has no such operator.
    #[error("the snapshot has no operator `{operator}`; it has: {known}")]
    NoSuchOperator {
        /// The operator asked for.
        operator: String,
        /// The operators it has.
        known: String,
    },
    /// The operator has no keyed state of that name.
    #[error("operator `{operator}` has no keyed state `{state}` in this snapshot; it has: {known}")]
    NoSuchState {
        /// The operator.
        operator: String,
        /// The state asked for.
        state: String,
        /// The states it has.
        known: String,
    },
    /// Writing the dump failed.
    #[error("cannot write the dump: {0}")]
    Write(String),
}

/// An opened checkpoint or savepoint: its metadata and the store its files are read from.
pub struct Snapshot {
    path: PathBuf,
    metadata: CheckpointMetadata,
    store: Box<dyn CheckpointStore>,
    /// The store's root directory (or `s3://` location).
    root: PathBuf,
    /// Whether it is laid out as a savepoint (its own root) or a checkpoint (`chk-<n>` in a
    /// pipeline's storage).
    savepoint_layout: bool,
}

/// Opens the checkpoint or savepoint at `path` (its directory or its `_metadata` file) and
/// decodes its metadata.
///
/// # Errors
/// [`InspectError::NotASnapshot`] for a path without `_metadata`;
/// [`InspectError::Damaged`] for metadata that does not decode.
pub fn open(path: &Path) -> Result<Snapshot, InspectError> {
    if let Some(location) = S3Location::parse(&path.to_string_lossy()) {
        return open_s3(path, location);
    }
    let dir = if path.file_name().is_some_and(|n| n == METADATA_FILE) {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    if !dir.is_dir() {
        return Err(InspectError::NotASnapshot {
            path: path.to_path_buf(),
            reason: "no such directory".into(),
        });
    }
    let meta_path = dir.join(METADATA_FILE);
    let bytes = match fs::read(&meta_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(InspectError::NotASnapshot {
                path: path.to_path_buf(),
                reason: format!(
                    "it has no `{METADATA_FILE}` (expected a savepoint directory or a checkpoint \
                     directory `<storage>/<pipeline>/chk-<n>`)"
                ),
            });
        }
        Err(e) => {
            return Err(InspectError::Damaged {
                file: meta_path,
                reason: e.to_string(),
            });
        }
    };
    let metadata =
        CheckpointMetadata::decode(METADATA_FILE, &bytes).map_err(|e| InspectError::Damaged {
            file: meta_path.clone(),
            reason: e.to_string(),
        })?;
    let checkpoint_dir = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_checkpoint_dir)
        .is_some_and(|n| n == metadata.checkpoint);
    // A checkpoint's paths are relative to its pipeline's storage (`chk-<n>/...`,
    // `shared/...`); a savepoint holds its own `chk-<n>/` beside its `_metadata`.
    let (root, savepoint_layout) = match dir.parent() {
        Some(parent) if checkpoint_dir => (parent.to_path_buf(), false),
        _ => (dir.to_path_buf(), true),
    };
    Ok(Snapshot {
        path: dir.to_path_buf(),
        metadata,
        store: Box::new(LocalStore::at(&root)),
        root,
        savepoint_layout,
    })
}

/// [`open`] for a checkpoint or savepoint on S3 (`s3://bucket/prefix/...`).
fn open_s3(path: &Path, location: Result<S3Location, String>) -> Result<Snapshot, InspectError> {
    let not_a_snapshot = |reason: String| InspectError::NotASnapshot {
        path: path.to_path_buf(),
        reason,
    };
    let mut dir = location.map_err(not_a_snapshot)?;
    if let Some(d) = dir.prefix.strip_suffix(METADATA_FILE) {
        dir.prefix = d.trim_end_matches('/').to_owned();
    }
    let meta_url = PathBuf::from(format!("{dir}/{METADATA_FILE}"));
    let damaged = |reason: String| InspectError::Damaged {
        file: meta_url.clone(),
        reason,
    };
    let store = S3Store::at(dir.clone()).map_err(|e| damaged(e.to_string()))?;
    let bytes = match store.get(METADATA_FILE) {
        Ok(b) => b,
        Err(CheckpointError::NotFound { .. }) => {
            return Err(not_a_snapshot(format!(
                "it has no `{METADATA_FILE}` (expected a savepoint directory or a checkpoint \
                 directory `<storage>/<pipeline>/chk-<n>`)"
            )));
        }
        Err(e) => return Err(damaged(e.to_string())),
    };
    let metadata =
        CheckpointMetadata::decode(METADATA_FILE, &bytes).map_err(|e| damaged(e.to_string()))?;
    let (parent, name) = dir.prefix.rsplit_once('/').unwrap_or(("", &dir.prefix));
    let checkpoint_dir = parse_checkpoint_dir(name) == Some(metadata.checkpoint);
    let root = if checkpoint_dir {
        S3Location {
            bucket: dir.bucket.clone(),
            prefix: parent.to_owned(),
        }
    } else {
        dir.clone()
    };
    let store = S3Store::at(root.clone()).map_err(|e| damaged(e.to_string()))?;
    Ok(Snapshot {
        path: PathBuf::from(dir.to_string()),
        metadata,
        store: Box::new(store),
        root: PathBuf::from(root.to_string()),
        savepoint_layout: !checkpoint_dir,
    })
}

/// What `weir inspect` shows of a snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// The directory inspected.
    pub path: PathBuf,
    /// `checkpoint` or `savepoint` (how it was taken).
    pub kind: String,
    /// `savepoint` (a directory of its own) or `checkpoint` (`chk-<n>` in checkpoint storage).
    pub layout: String,
    /// The pipeline it was taken of.
    pub pipeline: String,
    /// Its checkpoint id.
    pub checkpoint: u64,
    /// The state backend the pipeline ran on (`None`: not recorded, an older Weir).
    pub backend: Option<String>,
    /// Key groups of the pipeline.
    pub max_parallelism: u32,
    /// Files referenced and their bytes on disk.
    pub files: u64,
    /// Bytes of every file referenced.
    pub file_bytes: u64,
    /// Every operator, source and sink, in the metadata's order.
    pub operators: Vec<OperatorInspection>,
    /// Files that are missing or damaged, each with the reason (their state is left out of
    /// the figures above).
    pub problems: Vec<FileProblem>,
}

/// One operator (or source, or sink) of a snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorInspection {
    /// Its id.
    pub id: String,
    /// `source`, `operator` or `sink` (`None`: not recorded).
    pub section: Option<String>,
    /// Its `type:` (`None`: not recorded).
    #[serde(rename = "type")]
    pub type_name: Option<String>,
    /// Its parallelism when the snapshot was taken.
    pub parallelism: u32,
    /// The keyed states it declared, name → kind (`None`: not recorded).
    pub declared_states: Option<BTreeMap<String, String>>,
    /// Keyed state entries (a key with a value, per state) over all its states.
    pub entries: u64,
    /// Encoded bytes of those values.
    pub bytes: u64,
    /// Bytes of its files on disk (keyed and local state).
    pub file_bytes: u64,
    /// Its keyed states as found in the snapshot.
    pub states: Vec<StateInspection>,
    /// The key groups that hold entries, in order.
    pub key_groups: Vec<KeyGroupInspection>,
    /// Each subtask's key groups, files and local state.
    pub subtasks: Vec<SubtaskInspection>,
}

/// One keyed state of an operator.
#[derive(Clone, Debug, Serialize)]
pub struct StateInspection {
    /// Its name.
    pub name: String,
    /// `value`, `list` or `map`.
    pub kind: String,
    /// Keys holding a value.
    pub keys: u64,
    /// Encoded bytes of the values.
    pub bytes: u64,
}

/// One key group of an operator, over all its states.
#[derive(Clone, Debug, Serialize)]
pub struct KeyGroupInspection {
    /// The key group.
    pub key_group: u32,
    /// Entries in it.
    pub entries: u64,
    /// Encoded bytes of their values.
    pub bytes: u64,
}

/// One subtask of an operator.
#[derive(Clone, Debug, Serialize)]
pub struct SubtaskInspection {
    /// Its index.
    pub subtask: u32,
    /// Its key groups, `start..end`.
    pub key_groups: (u32, u32),
    /// Its files (store-relative paths).
    pub files: Vec<String>,
    /// Its operator-local state (a source's positions, a file sink's pending parts), fields
    /// named when the type is known, else as decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local: Option<serde_json::Value>,
}

/// A missing or damaged file.
#[derive(Clone, Debug, Serialize)]
pub struct FileProblem {
    /// The file, as a path on disk.
    pub file: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl Snapshot {
    /// Its metadata.
    pub fn metadata(&self) -> &CheckpointMetadata {
        &self.metadata
    }

    /// A store-relative path as a path on disk.
    fn on_disk(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    fn damaged(&self, file: &FileRef, e: &dyn std::fmt::Display) -> InspectError {
        InspectError::Damaged {
            file: self.on_disk(&file.path),
            reason: e.to_string(),
        }
    }

    /// Reads every file and reports what the snapshot holds; damaged files are listed in
    /// [`Inspection::problems`] and left out of the figures.
    pub fn inspect(&self) -> Inspection {
        let meta = &self.metadata;
        let mut problems = Vec::new();
        let operators = meta
            .operators
            .iter()
            .map(|op| self.inspect_operator(op, &mut problems))
            .collect();
        Inspection {
            path: self.path.clone(),
            kind: meta.kind.name().replace(" then stop", ""),
            layout: if self.savepoint_layout {
                "savepoint"
            } else {
                "checkpoint"
            }
            .into(),
            pipeline: meta.pipeline.clone(),
            checkpoint: meta.checkpoint,
            backend: meta.backend.map(|b| b.as_str().to_owned()),
            max_parallelism: meta.max_parallelism,
            files: meta.files().count() as u64,
            file_bytes: meta.files().map(|f| f.size).sum(),
            operators,
            problems,
        }
    }

    fn inspect_operator(
        &self,
        op: &OperatorInfo,
        problems: &mut Vec<FileProblem>,
    ) -> OperatorInspection {
        let mut states: Vec<StateInspection> = Vec::new();
        let mut groups: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        let mut subtasks = Vec::new();
        let mut file_bytes = 0;
        let mut parts: Vec<_> = self
            .metadata
            .subtasks
            .iter()
            .filter(|s| s.operator == op.id)
            .collect();
        parts.sort_by_key(|s| s.subtask);
        for st in parts {
            file_bytes += st.files.iter().map(|f| f.size).sum::<u64>();
            let mut local = None;
            for f in &st.files {
                if is_local_file(&f.path) {
                    match read_verified(&*self.store, f) {
                        Ok(bytes) => local = Some(describe_local(op, &bytes)),
                        Err(e) => problems.push(self.problem(f, &e)),
                    }
                    continue;
                }
                if is_channel_file(&f.path) {
                    // In-flight records of an unaligned checkpoint: counted in the
                    // subtask's bytes, not keyed state.
                    continue;
                }
                let mut current = None;
                let result = self.read_keyed(f, |item| {
                    match item {
                        SnapshotItem::State { name, kind, .. } => {
                            let i = match states.iter().position(|s| s.name == name) {
                                Some(i) => i,
                                None => {
                                    states.push(StateInspection {
                                        name: name.to_owned(),
                                        kind: kind_name(kind).into(),
                                        keys: 0,
                                        bytes: 0,
                                    });
                                    states.len() - 1
                                }
                            };
                            current = Some(i);
                        }
                        SnapshotItem::Entry { kg, value, .. } => {
                            if let Some(s) = current.and_then(|i| states.get_mut(i)) {
                                s.keys += 1;
                                s.bytes += value.len() as u64;
                            }
                            let g = groups.entry(kg).or_default();
                            g.0 += 1;
                            g.1 += value.len() as u64;
                        }
                    }
                    Ok(())
                });
                if let Err(e) = result {
                    problems.push(self.problem(f, &e));
                }
            }
            subtasks.push(SubtaskInspection {
                subtask: st.subtask,
                key_groups: (st.key_groups.start, st.key_groups.end),
                files: st.files.iter().map(|f| f.path.clone()).collect(),
                local,
            });
        }
        OperatorInspection {
            id: op.id.clone(),
            section: op.node.as_ref().map(|n| n.section.as_str().to_owned()),
            type_name: op.node.as_ref().map(|n| n.type_name.clone()),
            parallelism: op.parallelism,
            declared_states: op.keyed_state.as_ref().map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), kind_name(*v).to_owned()))
                    .collect()
            }),
            entries: states.iter().map(|s| s.keys).sum(),
            bytes: states.iter().map(|s| s.bytes).sum(),
            file_bytes,
            states,
            key_groups: groups
                .into_iter()
                .map(|(key_group, (entries, bytes))| KeyGroupInspection {
                    key_group,
                    entries,
                    bytes,
                })
                .collect(),
            subtasks,
        }
    }

    fn problem(&self, f: &FileRef, e: &dyn std::fmt::Display) -> FileProblem {
        FileProblem {
            file: self.on_disk(&f.path),
            reason: e.to_string(),
        }
    }

    /// Reads one keyed-state file (canonical or a RocksDB manifest; other files, such as the
    /// database files a manifest lists, are read through their manifest) and hands its states
    /// and entries to `f`.
    fn read_keyed(
        &self,
        file: &FileRef,
        f: impl FnMut(SnapshotItem<'_>) -> crate::base::error::Result<()>,
    ) -> crate::base::error::Result<()> {
        let bytes = if file.path.ends_with(CANONICAL_SUFFIX) {
            read_verified(&*self.store, file)?
        } else if file.path.ends_with(NATIVE_SUFFIX) {
            let scratch = scratch_dir();
            let result =
                native_to_canonical(&*self.store, file, self.metadata.max_parallelism, &scratch);
            let _ = fs::remove_dir_all(&scratch);
            result?
        } else {
            return Ok(());
        };
        read_snapshot(&bytes, self.metadata.max_parallelism, f)
    }

    /// Writes the keyed state of `operator` (only state `state`, if given) to `out` as JSON
    /// lines `{"key": ..., "state": ..., "key_group": ..., "value": ...}`, subtask by subtask;
    /// returns the number of lines.
    ///
    /// # Errors
    /// An unknown operator or state, the first missing or damaged file (named), or `out`
    /// failing.
    pub fn dump(
        &self,
        operator: &str,
        state: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<u64, InspectError> {
        let meta = &self.metadata;
        if !meta.operators.iter().any(|o| o.id == operator) {
            return Err(InspectError::NoSuchOperator {
                operator: operator.to_owned(),
                known: meta
                    .operators
                    .iter()
                    .map(|o| o.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let mut parts: Vec<_> = meta
            .subtasks
            .iter()
            .filter(|s| s.operator == operator)
            .collect();
        parts.sort_by_key(|s| s.subtask);
        let mut lines = 0u64;
        let mut seen_states: Vec<String> = Vec::new();
        let mut write_error = None;
        for st in parts {
            for file in st.files.iter().filter(|f| is_keyed_file(&f.path)) {
                let mut current: Option<String> = None;
                self.read_keyed(file, |item| {
                    match item {
                        SnapshotItem::State { name, .. } => {
                            if !seen_states.iter().any(|s| s == name) {
                                seen_states.push(name.to_owned());
                            }
                            current = state
                                .is_none_or(|wanted| wanted == name)
                                .then(|| name.to_owned());
                        }
                        SnapshotItem::Entry { kg, key, value } => {
                            let Some(name) = &current else {
                                return Ok(());
                            };
                            let value = decode_value(value)?;
                            let line = serde_json::json!({
                                "key": to_json(&key.to_dynamic()),
                                "state": name,
                                "key_group": kg,
                                "value": to_json(&value),
                            });
                            if let Err(e) = writeln!(out, "{line}") {
                                write_error = Some(e.to_string());
                                return Err(RunError::Internal("write failed".into()));
                            }
                            lines += 1;
                        }
                    }
                    Ok(())
                })
                .map_err(|e| match write_error.take() {
                    Some(w) => InspectError::Write(w),
                    None => self.damaged(file, &e),
                })?;
            }
        }
        if let Some(wanted) = state
            && !seen_states.iter().any(|s| s == wanted)
        {
            let declared: Vec<String> = meta
                .operators
                .iter()
                .find(|o| o.id == operator)
                .and_then(|o| o.keyed_state.as_ref())
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            let mut known = seen_states;
            for d in declared {
                if !known.contains(&d) {
                    known.push(d);
                }
            }
            return Err(InspectError::NoSuchState {
                operator: operator.to_owned(),
                state: wanted.to_owned(),
                known: if known.is_empty() {
                    "no keyed state".into()
                } else {
                    known.join(", ")
                },
            });
        }
        Ok(lines)
    }
}

/// A value as JSON (a value JSON cannot hold is shown as its text).
fn to_json(value: &rhai::Dynamic) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_else(|_| serde_json::Value::String(value.to_string()))
}

fn kind_name(kind: StateKind) -> &'static str {
    match kind {
        StateKind::Value => "value",
        StateKind::List => "list",
        StateKind::Map => "map",
    }
}

/// The local state of `op` as JSON: named fields for the known types, else decoded as it is
/// (MessagePack arrays), else its size.
fn describe_local(op: &OperatorInfo, bytes: &[u8]) -> serde_json::Value {
    if let Some(node) = &op.node
        && let Some(described) =
            crate::registry::describe_local_state(node.section, &node.type_name, bytes)
    {
        match described {
            Ok(v) => return v,
            Err(e) => return serde_json::json!({ "undecodable": e.to_string() }),
        }
    }
    crate::record::decode::<serde_json::Value>(bytes)
        .unwrap_or_else(|_| serde_json::json!({ "bytes": bytes.len() }))
}

/// A fresh scratch directory path for reading a RocksDB checkpoint (not created yet).
fn scratch_dir() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "weir-inspect-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}
