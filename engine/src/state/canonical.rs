//! The canonical keyed-state snapshot format: what [`StateBackend::snapshot`] writes and
//! [`StateBackend::restore`] reads on every backend, so that a snapshot taken by one backend
//! restores into any other (memory ⇄ rocksdb) and at any parallelism. It is a MessagePack
//! [`SnapshotFile`]: a version, the number of key groups, and per named state its kind and
//! `(key group, key, value)` entries.
//!
//! This module owns only the format (its types, its version check and its encoding); it
//! holds no state and does no I/O.
//!
//! [`StateBackend::snapshot`]: super::StateBackend::snapshot
//! [`StateBackend::restore`]: super::StateBackend::restore

use rhai::Dynamic;
use serde::{Deserialize, Serialize};
use weir_schema::StateKind;

use super::SNAPSHOT_VERSION;
use crate::record::{decode, encode};
use crate::runtime::error::{Result, RunError};

/// A canonical snapshot: every state of some key groups.
#[derive(Serialize, Deserialize)]
pub struct SnapshotFile {
    /// [`SNAPSHOT_VERSION`] when written.
    pub version: u32,
    /// Number of key groups of the pipeline (fixed for its life).
    pub max_parallelism: u32,
    /// Every registered state, with its entries in the snapshot's key groups.
    pub states: Vec<StateSnapshot>,
}

/// One named state of a [`SnapshotFile`].
#[derive(Serialize, Deserialize)]
pub struct StateSnapshot {
    /// The state's name.
    pub name: String,
    /// Its kind, as [`kind_code`] encodes it.
    pub kind: u8,
    /// `(key group, key, value)`, the key as [`Key::to_dynamic`](crate::record::Key::to_dynamic)
    /// gives it.
    pub entries: Vec<(u32, Dynamic, Dynamic)>,
}

/// The code of a state kind in snapshots.
pub fn kind_code(kind: StateKind) -> u8 {
    match kind {
        StateKind::Value => 0,
        StateKind::List => 1,
        StateKind::Map => 2,
    }
}

/// The state kind of a snapshot code, if known.
pub fn kind_of(code: u8) -> Option<StateKind> {
    match code {
        0 => Some(StateKind::Value),
        1 => Some(StateKind::List),
        2 => Some(StateKind::Map),
        _ => None,
    }
}

/// Encodes a snapshot.
///
/// # Errors
/// When a key or value cannot be encoded.
pub fn encode_snapshot(file: &SnapshotFile) -> Result<Vec<u8>> {
    encode(file).map_err(|e| RunError::State(format!("cannot encode snapshot: {e}")))
}

/// Decodes a snapshot and checks that this build reads its version and that it has
/// `max_parallelism` key groups.
///
/// # Errors
/// A malformed snapshot, an unknown version or another number of key groups.
pub fn decode_snapshot(bytes: &[u8], max_parallelism: u32) -> Result<SnapshotFile> {
    let file: SnapshotFile =
        decode(bytes).map_err(|e| RunError::State(format!("malformed snapshot: {e}")))?;
    if file.version != SNAPSHOT_VERSION {
        return Err(RunError::State(format!(
            "snapshot version {} is not supported (expected {SNAPSHOT_VERSION})",
            file.version
        )));
    }
    if file.max_parallelism != max_parallelism {
        return Err(RunError::State(format!(
            "snapshot has {} key groups but the pipeline has {max_parallelism}; max_parallelism cannot change",
            file.max_parallelism
        )));
    }
    Ok(file)
}

/// The kind of a decoded [`StateSnapshot`].
///
/// # Errors
/// An unknown kind code.
pub fn state_kind(state: &StateSnapshot) -> Result<StateKind> {
    kind_of(state.kind).ok_or_else(|| RunError::State(format!("unknown state kind {}", state.kind)))
}
