//! The metadata record of a completed checkpoint (ARCHITECTURE.md 5.5) and its on-disk
//! encoding, plus the checksum every checkpoint file carries.
//!
//! A `_metadata` file is a one-line header followed by JSON:
//!
//! ```text
//! weir-checkpoint-metadata v1 len=<bytes of JSON> crc32=<8 hex digits>\n
//! {"format_version":1,"pipeline":"shop","checkpoint":7,...}
//! ```
//!
//! The header's length and CRC-32 make a truncated or torn file detectable before the JSON is
//! parsed. This module owns the record's shape and the checks on decoding; it never does I/O
//! (see `storage`).

use serde::{Deserialize, Serialize};
use weir_schema::{PipelineSpec, StateKind};

use super::{CheckpointId, Result, TaskId};
use crate::base::error::CheckpointError;
use crate::base::message::BarrierKind;
use crate::record::KeyGroupRange;

/// The version of the metadata format written by this build. Decoding accepts only this one.
pub const METADATA_FORMAT_VERSION: u32 = 1;

/// Name of the metadata file inside `chk-<n>/`.
pub const METADATA_FILE: &str = "_metadata";

/// Directory (relative to the pipeline's storage root) of files that several checkpoints may
/// reference, such as RocksDB SST files of incremental checkpoints.
pub const SHARED_DIR: &str = "shared";

const MAGIC: &str = "weir-checkpoint-metadata";

/// The CRC-32 (IEEE) of some bytes: the checksum recorded for every checkpoint file.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The directory of checkpoint `id`, relative to the pipeline's storage root: `chk-<id>`.
pub fn checkpoint_dir(id: CheckpointId) -> String {
    format!("chk-{id}")
}

/// The path of checkpoint `id`'s metadata, relative to the pipeline's storage root.
pub fn metadata_path(id: CheckpointId) -> String {
    format!("chk-{id}/{METADATA_FILE}")
}

/// Parses a `chk-<n>` directory name.
pub fn parse_checkpoint_dir(name: &str) -> Option<CheckpointId> {
    let digits = name.strip_prefix("chk-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A stable hash of a pipeline's configuration (FNV-1a 64 over its JSON form), as 16 hex
/// digits. Restoring from a checkpoint with another hash means the pipeline changed.
pub fn config_hash(spec: &PipelineSpec) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_else(|_| format!("{spec:?}").into_bytes());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileRef {
    /// Path relative to the pipeline's storage root, `/`-separated: `chk-<n>/...` for a file
    /// owned by checkpoint *n*, `shared/...` for a file several checkpoints may reference.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32 of the content (see [`checksum`]).
    pub crc32: u32,
}

impl FileRef {
    /// Describes `bytes` stored at `path`.
    pub fn of(path: impl Into<String>, bytes: &[u8]) -> Self {
        Self {
            path: path.into(),
            size: bytes.len() as u64,
            crc32: checksum(bytes),
        }
    }

    /// Whether the file lives in `shared/` (and may be referenced by several checkpoints).
    pub fn is_shared(&self) -> bool {
        is_shared_path(&self.path)
    }
}

/// File-name suffix of a subtask's operator-local state (`chk-<n>/<op>-<subtask>.op`; see
/// `state::snapshot_files`, which writes and reads these files).
pub const LOCAL_SUFFIX: &str = ".op";

/// Whether a store-relative path is a subtask's operator-local state file.
pub fn is_local_file(path: &str) -> bool {
    path.ends_with(LOCAL_SUFFIX)
}

/// File-name suffix of a subtask's channel state (`chk-<n>/<op>-<subtask>.channel`, `op` the
/// head of the task's chain): the in-flight records an unaligned barrier overtook
/// ([`super::channel_state`]).
pub const CHANNEL_SUFFIX: &str = ".channel";

/// Whether a store-relative path is a subtask's channel-state file.
pub fn is_channel_file(path: &str) -> bool {
    path.ends_with(CHANNEL_SUFFIX)
}

/// Whether a store-relative path belongs to a subtask's keyed state (neither local state
/// nor channel state).
pub fn is_keyed_file(path: &str) -> bool {
    !is_local_file(path) && !is_channel_file(path)
}

/// Whether a store-relative path is in `shared/`.
pub fn is_shared_path(path: &str) -> bool {
    path.strip_prefix(SHARED_DIR)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// A key-group range as recorded in metadata (`start..end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroups {
    /// First key group.
    pub start: u32,
    /// One past the last key group.
    pub end: u32,
}

impl From<KeyGroupRange> for KeyGroups {
    fn from(r: KeyGroupRange) -> Self {
        Self {
            start: r.start,
            end: r.end,
        }
    }
}

impl From<KeyGroups> for KeyGroupRange {
    fn from(r: KeyGroups) -> Self {
        Self {
            start: r.start,
            end: r.end,
        }
    }
}

/// The snapshot of one operator subtask, as acknowledged by its task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskState {
    /// The operator's (source's, sink's) id from the YAML.
    pub operator: String,
    /// Subtask index.
    pub subtask: u32,
    /// The key groups this subtask's state covers.
    pub key_groups: KeyGroups,
    /// The files holding its state (none for a stateless operator).
    pub files: Vec<FileRef>,
    /// The event-time watermark of its input when it snapshotted (absent before any, and in
    /// metadata written before watermarks): a restore starts the operator from it, so that
    /// it judges lateness as it did before, even before its inputs said their watermarks
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<i64>,
}

/// An operator of the pipeline, as recorded in metadata.
///
/// The fields after `script_hash` were added later: metadata written before them reads
/// with `None`, which the restore plan ([`super::restore_plan`]) treats as "not recorded"
/// (it then compares what it can and says what it could not).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorInfo {
    /// Its id from the YAML.
    pub id: String,
    /// Its parallelism when the checkpoint was taken.
    pub parallelism: u32,
    /// [`script_hash`] of its Rhai script, if it has one: a restore runs the operator's
    /// `migrate` hook only when the script changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script_hash: Option<String>,
    /// Its section and `type:` (a restore refuses to carry state across a type change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeType>,
    /// The named keyed states it declared: name → kind (`acc: value` for `reduce` and
    /// `aggregate`, the `state:` map of a `process`, nothing for the others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyed_state: Option<std::collections::BTreeMap<String, StateKind>>,
    /// Whether it keeps operator-local state: a source's positions, a two-phase-commit
    /// sink's pending parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_state: Option<bool>,
}

/// Where a node sits in a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    /// Under `sources:`.
    Source,
    /// Under `operators:`.
    Operator,
    /// Under `sinks:`.
    Sink,
}

impl Section {
    /// `source`, `operator` or `sink`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Source => "source",
            Self::Operator => "operator",
            Self::Sink => "sink",
        }
    }
}

/// A node's section and `type:` (`operator` `reduce`, `source` `file`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeType {
    /// Its section.
    pub section: Section,
    /// Its YAML `type:`.
    #[serde(rename = "type")]
    pub type_name: String,
}

impl std::fmt::Display for NodeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.type_name, self.section.as_str())
    }
}

/// A state backend, as recorded in metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// `memory`.
    Memory,
    /// `fs`.
    Fs,
    /// `rocksdb`.
    Rocksdb,
}

impl BackendKind {
    /// The backend a pipeline's `state:` section selects.
    pub fn of(spec: &weir_schema::StateSpec) -> Self {
        match spec {
            weir_schema::StateSpec::Memory => Self::Memory,
            weir_schema::StateSpec::Fs => Self::Fs,
            weir_schema::StateSpec::Rocksdb(_) => Self::Rocksdb,
        }
    }

    /// Its YAML name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Fs => "fs",
            Self::Rocksdb => "rocksdb",
        }
    }
}

/// A short stable hash of a script's text (FNV-1a, 64 bits, hex).
pub fn script_hash(script: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in script.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Everything needed to restore a pipeline from one completed checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// [`METADATA_FORMAT_VERSION`] when written.
    pub format_version: u32,
    /// The pipeline's id.
    pub pipeline: String,
    /// The checkpoint's id.
    pub checkpoint: CheckpointId,
    /// Checkpoint, savepoint or savepoint-then-stop.
    #[serde(with = "kind_serde")]
    pub kind: BarrierKind,
    /// [`config_hash`] of the pipeline spec it was taken with.
    pub config_hash: String,
    /// Number of key groups (fixed for the pipeline's life).
    pub max_parallelism: u32,
    /// The state backend the pipeline ran on (`None` in metadata of an older Weir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// Every operator, source and sink, with its parallelism.
    pub operators: Vec<OperatorInfo>,
    /// Every operator subtask's snapshot: key groups and files.
    pub subtasks: Vec<SubtaskState>,
    /// Tasks that had finished (end of input) before this checkpoint: on restore they must
    /// not run again, since their whole output is already reflected downstream.
    #[serde(default)]
    pub finished_tasks: Vec<TaskId>,
    /// The same tasks as `(operator id, subtask)` of every node of their chains, so that a
    /// savepoint restored into a pipeline whose chains changed can tell which of its new
    /// tasks had finished.
    #[serde(default)]
    pub finished_operators: Vec<(String, u32)>,
}

impl CheckpointMetadata {
    /// Every file the checkpoint references, in recorded order.
    pub fn files(&self) -> impl Iterator<Item = &FileRef> {
        self.subtasks.iter().flat_map(|s| s.files.iter())
    }

    /// The snapshot of `operator`'s subtask `subtask`, if recorded.
    pub fn subtask(&self, operator: &str, subtask: u32) -> Option<&SubtaskState> {
        self.subtasks
            .iter()
            .find(|s| s.operator == operator && s.subtask == subtask)
    }

    /// Encodes the record: the header line, then JSON.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Protocol`] if serialization fails (it cannot for this type).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let json = serde_json::to_vec(self)
            .map_err(|e| CheckpointError::Protocol(format!("cannot encode metadata: {e}")))?;
        let mut out = format!(
            "{MAGIC} v{} len={} crc32={:08x}\n",
            self.format_version,
            json.len(),
            checksum(&json)
        )
        .into_bytes();
        out.extend_from_slice(&json);
        Ok(out)
    }

    /// Decodes and checks a record read from `path`: header, length, checksum, format
    /// version, JSON, and that every file path stays inside the store and belongs to this
    /// checkpoint or to `shared/`.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Corrupt`] with the reason when any check fails.
    pub fn decode(path: &str, bytes: &[u8]) -> Result<Self> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.to_owned(),
            reason,
        };
        let newline = bytes
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| corrupt("truncated: no header line".into()))?;
        let header = std::str::from_utf8(&bytes[..newline])
            .map_err(|_| corrupt("header is not UTF-8".into()))?;
        let body = &bytes[newline + 1..];
        let (version, len, crc) =
            parse_header(header).ok_or_else(|| corrupt(format!("bad header `{header}`")))?;
        if version != METADATA_FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {version}, this build reads {METADATA_FORMAT_VERSION}"
            )));
        }
        if body.len() as u64 != len {
            return Err(corrupt(format!(
                "truncated: header says {len} bytes, found {}",
                body.len()
            )));
        }
        let actual = checksum(body);
        if actual != crc {
            return Err(corrupt(format!(
                "checksum mismatch: header says {crc:08x}, content is {actual:08x}"
            )));
        }
        let meta: Self =
            serde_json::from_slice(body).map_err(|e| corrupt(format!("invalid JSON: {e}")))?;
        if meta.format_version != version {
            return Err(corrupt(format!(
                "header version {version} differs from record version {}",
                meta.format_version
            )));
        }
        let own_dir = checkpoint_dir(meta.checkpoint);
        for file in meta.files() {
            super::storage::validate_path(&file.path).map_err(|e| corrupt(e.to_string()))?;
            let own = file
                .path
                .strip_prefix(&own_dir)
                .is_some_and(|rest| rest.starts_with('/'));
            if !own && !file.is_shared() {
                return Err(corrupt(format!(
                    "file `{}` is neither in `{own_dir}/` nor in `{SHARED_DIR}/`",
                    file.path
                )));
            }
        }
        Ok(meta)
    }
}

fn parse_header(header: &str) -> Option<(u32, u64, u32)> {
    let mut parts = header.split(' ');
    if parts.next()? != MAGIC {
        return None;
    }
    let version = parts.next()?.strip_prefix('v')?.parse().ok()?;
    let len = parts.next()?.strip_prefix("len=")?.parse().ok()?;
    let crc = u32::from_str_radix(parts.next()?.strip_prefix("crc32=")?, 16).ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((version, len, crc))
}

/// Serializes [`BarrierKind`] as `checkpoint`, `savepoint` or `savepoint_then_stop`.
mod kind_serde {
    use serde::{Deserialize, Deserializer, Serializer, de};

    use crate::base::message::BarrierKind;

    pub fn serialize<S: Serializer>(kind: &BarrierKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match kind {
            BarrierKind::Checkpoint => "checkpoint",
            BarrierKind::Savepoint => "savepoint",
            BarrierKind::SavepointThenStop => "savepoint_then_stop",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BarrierKind, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "checkpoint" => Ok(BarrierKind::Checkpoint),
            "savepoint" => Ok(BarrierKind::Savepoint),
            "savepoint_then_stop" => Ok(BarrierKind::SavepointThenStop),
            other => Err(de::Error::unknown_variant(
                other,
                &["checkpoint", "savepoint", "savepoint_then_stop"],
            )),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small metadata record for tests: one operator with two subtasks, one own file each
    /// and one shared file.
    pub(crate) fn sample(id: CheckpointId) -> CheckpointMetadata {
        CheckpointMetadata {
            format_version: METADATA_FORMAT_VERSION,
            pipeline: "p".into(),
            checkpoint: id,
            kind: BarrierKind::Checkpoint,
            config_hash: "0123456789abcdef".into(),
            max_parallelism: 128,
            backend: None,
            operators: vec![OperatorInfo {
                id: "count".into(),
                parallelism: 2,
                script_hash: None,
                node: None,
                keyed_state: None,
                local_state: None,
            }],
            subtasks: (0..2)
                .map(|s| SubtaskState {
                    operator: "count".into(),
                    subtask: s,
                    key_groups: KeyGroupRange::for_subtask(128, 2, s).into(),
                    files: vec![
                        FileRef::of(format!("chk-{id}/count-{s}.snap"), b"state"),
                        FileRef::of("shared/base.sst", b"shared"),
                    ],
                    watermark: None,
                })
                .collect(),
            finished_tasks: vec![],
            finished_operators: Vec::new(),
        }
    }

    #[test]
    fn metadata_round_trips() {
        let meta = sample(3);
        let bytes = meta.encode().expect("encodes");
        assert!(bytes.starts_with(b"weir-checkpoint-metadata v1 len="));
        let back = CheckpointMetadata::decode("chk-3/_metadata", &bytes).expect("decodes");
        assert_eq!(back, meta);
        assert_eq!(
            back.subtask("count", 1).map(|s| s.key_groups.start),
            Some(64)
        );
        assert_eq!(back.files().filter(|f| f.is_shared()).count(), 2);
    }

    /// Metadata written before the backend, node types and declared states were recorded
    /// still decodes; the new fields read as "not recorded".
    #[test]
    fn metadata_of_an_older_weir_still_reads() {
        let json = r#"{"format_version":1,"pipeline":"p","checkpoint":3,"kind":"savepoint","config_hash":"0123456789abcdef","max_parallelism":128,"operators":[{"id":"count","parallelism":2,"script_hash":"00000000000000aa"}],"subtasks":[],"finished_tasks":[]}"#;
        let mut bytes = format!(
            "{MAGIC} v1 len={} crc32={:08x}\n",
            json.len(),
            checksum(json.as_bytes())
        )
        .into_bytes();
        bytes.extend_from_slice(json.as_bytes());
        let meta = CheckpointMetadata::decode("chk-3/_metadata", &bytes).expect("decodes");
        assert_eq!(meta.backend, None);
        let op = &meta.operators[0];
        assert_eq!(op.script_hash.as_deref(), Some("00000000000000aa"));
        assert_eq!(
            (&op.node, &op.keyed_state, op.local_state),
            (&None, &None, None)
        );

        // And what this build writes round-trips with them.
        let mut meta = sample(3);
        meta.backend = Some(BackendKind::Rocksdb);
        meta.operators[0].node = Some(NodeType {
            section: Section::Operator,
            type_name: "process".into(),
        });
        meta.operators[0].keyed_state =
            Some([("cnt".to_owned(), StateKind::List)].into_iter().collect());
        meta.operators[0].local_state = Some(false);
        let bytes = meta.encode().expect("encodes");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains(r#""node":{"section":"operator","type":"process"}"#)
                && text.contains(r#""keyed_state":{"cnt":"list"}"#)
                && text.contains(r#""backend":"rocksdb""#),
            "{text}"
        );
        assert_eq!(
            CheckpointMetadata::decode("m", &bytes).expect("decodes"),
            meta
        );
    }

    #[test]
    fn truncated_or_altered_metadata_is_rejected() {
        let bytes = sample(3).encode().expect("encodes");
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            let err = CheckpointMetadata::decode("m", &bytes[..cut]).expect_err("truncated");
            assert!(err.to_string().contains("truncated") || err.to_string().contains("header"));
        }
        let mut flipped = bytes.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x01;
        let err = CheckpointMetadata::decode("m", &flipped).expect_err("altered");
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn metadata_paths_must_stay_in_the_checkpoint_or_shared() {
        let mut meta = sample(3);
        meta.subtasks[0]
            .files
            .push(FileRef::of("../etc/passwd", b""));
        let bytes = meta.encode().expect("encodes");
        assert!(CheckpointMetadata::decode("m", &bytes).is_err());

        let mut meta = sample(3);
        meta.subtasks[0]
            .files
            .push(FileRef::of("chk-2/old.snap", b""));
        let bytes = meta.encode().expect("encodes");
        assert!(CheckpointMetadata::decode("m", &bytes).is_err());
    }

    #[test]
    fn checkpoint_dirs_parse_strictly() {
        assert_eq!(parse_checkpoint_dir("chk-12"), Some(12));
        assert_eq!(parse_checkpoint_dir(&checkpoint_dir(5)), Some(5));
        for bad in ["chk-", "chk-1a", "chk--1", "shared", "chk-+1"] {
            assert_eq!(parse_checkpoint_dir(bad), None, "{bad}");
        }
        assert!(is_shared_path("shared/a.sst"));
        assert!(!is_shared_path("shared_x/a.sst"));
        assert!(!is_shared_path("chk-1/a"));
    }
}
