//! The on-disk layout of one subtask's snapshot files inside a checkpoint, and their
//! redistribution when a restore changes the parallelism.
//!
//! A subtask `s` of node `op` writes, under `chk-<n>/`, `op-s.op` for its operator-local state
//! (a source's position, a sink's pending files; [`LOCAL_SUFFIX`]) and whatever its keyed
//! state backend writes under the prefix `chk-<n>/op-s` (or `shared/op-s` for files several
//! checkpoints share). On restore, local state is list state (old subtask `j` goes to new
//! subtask `j % parallelism`) and keyed state comes from every old subtask whose key groups
//! overlap the new subtask's.
//!
//! The task loop calls these functions; it never builds a checkpoint path itself. The names
//! of the checkpoint's directories and of local-state files are the checkpoint's own
//! (`checkpoint::metadata`, which the restore plan reads too); this module must not touch
//! tasks, channels or operators.

use std::sync::Arc;

use crate::base::error::{Result, RunError};
use crate::checkpoint::channel_state::{self, ChannelEntry};
use crate::checkpoint::metadata::{
    CHANNEL_SUFFIX, LOCAL_SUFFIX, checkpoint_dir, is_channel_file, is_keyed_file, is_local_file,
};
use crate::checkpoint::restore_plan::NodeDecision;
use crate::checkpoint::storage::{read_verified, write_file};
use crate::checkpoint::{CheckpointId, CheckpointMetadata, CheckpointStore, FileRef, SubtaskState};
use crate::record::KeyGroupRange;
use crate::state::canonical::{StateFilter, filter_snapshot};
use crate::state::rocksdb::NATIVE_SUFFIX;
use crate::state::{PendingSnapshot, SnapshotTarget, StateBackend, read_canonical};

/// One node's part of a checkpoint, frozen at the barrier.
pub struct NodeSnapshot {
    /// The operator (or source, or sink) id.
    pub operator: Arc<str>,
    /// Its subtask.
    pub subtask: u32,
    /// Its key groups.
    pub key_groups: KeyGroupRange,
    /// Operator-local state (a source's position, a sink's pending files).
    pub local: Option<Vec<u8>>,
    /// Keyed state, to be written.
    pub keyed: Option<Box<dyn PendingSnapshot>>,
    /// The event-time watermark of the node's input, when it has one.
    pub watermark: Option<i64>,
}

fn overlaps(a: KeyGroupRange, b: KeyGroupRange) -> bool {
    a.start < b.end && b.start < a.end
}

/// Writes one task's snapshots into `chk-<n>/`: `<op>-<subtask>.op` for local state, the
/// backend's files for keyed state. Returns one [`SubtaskState`] per node (also for nodes
/// without state, so that a restore knows the operator existed).
///
/// # Errors
/// Storage failures.
pub fn write_snapshots(
    store: &dyn CheckpointStore,
    checkpoint: CheckpointId,
    snapshots: Vec<NodeSnapshot>,
) -> Result<Vec<SubtaskState>> {
    let mut out = Vec::with_capacity(snapshots.len());
    for s in snapshots {
        let name = format!("{}-{}", s.operator, s.subtask);
        let prefix = format!("{}/{name}", checkpoint_dir(checkpoint));
        let mut files = Vec::new();
        if let Some(bytes) = s.local {
            files.push(write_file(
                store,
                &format!("{prefix}{LOCAL_SUFFIX}"),
                &bytes,
            )?);
        }
        if let Some(keyed) = s.keyed {
            let target = SnapshotTarget {
                checkpoint,
                private_prefix: prefix,
                shared_prefix: format!("shared/{name}"),
            };
            files.extend(keyed.write(store, &target)?);
        }
        out.push(SubtaskState {
            operator: s.operator.to_string(),
            subtask: s.subtask,
            key_groups: s.key_groups.into(),
            files,
            watermark: s.watermark,
        });
    }
    Ok(out)
}

/// Writes one subtask's channel state (the in-flight records an unaligned barrier overtook)
/// as `chk-<n>/<op>-<subtask>.channel`, `op` the head of its chain; nothing when it is empty.
///
/// # Errors
/// A record that cannot be encoded; storage failures.
pub fn write_channel_state(
    store: &dyn CheckpointStore,
    checkpoint: CheckpointId,
    operator: &str,
    subtask: u32,
    entries: &[ChannelEntry],
) -> Result<Option<FileRef>> {
    if entries.is_empty() {
        return Ok(None);
    }
    let bytes = channel_state::encode(entries)?;
    let path = format!(
        "{}/{operator}-{subtask}{CHANNEL_SUFFIX}",
        checkpoint_dir(checkpoint)
    );
    Ok(Some(write_file(store, &path, &bytes)?))
}

fn read_channel(
    store: &dyn CheckpointStore,
    metadata: &CheckpointMetadata,
    operator: &str,
    subtask: u32,
) -> Result<Vec<ChannelEntry>> {
    let Some(file) = metadata
        .subtask(operator, subtask)
        .and_then(|st| st.files.iter().find(|f| is_channel_file(&f.path)))
    else {
        return Ok(Vec::new());
    };
    channel_state::decode(&read_verified(store, file)?)
}

/// What subtask `subtask` of `parallelism` of the chain headed by `operator` replays before
/// its first new record: its own channel state at the same parallelism, or after a change its
/// share of every old subtask's ([`channel_state::share`]).
///
/// # Errors
/// A corrupt or unreadable file.
pub fn read_channel_state(
    store: &dyn CheckpointStore,
    metadata: &CheckpointMetadata,
    operator: &str,
    subtask: u32,
    parallelism: u32,
) -> Result<Vec<ChannelEntry>> {
    let old = metadata
        .operators
        .iter()
        .find(|o| o.id == operator)
        .map(|o| o.parallelism);
    match old {
        Some(old) if old != parallelism && parallelism > 0 => {
            let mut all = Vec::new();
            for j in 0..old {
                all.push((j, read_channel(store, metadata, operator, j)?));
            }
            Ok(channel_state::share(
                all,
                subtask,
                parallelism,
                metadata.max_parallelism,
            ))
        }
        _ => read_channel(store, metadata, operator, subtask),
    }
}

/// Reads one subtask's local-state file from a checkpoint, if it has one.
///
/// # Errors
/// A corrupt or unreadable file.
pub fn read_local(
    store: &dyn CheckpointStore,
    metadata: &CheckpointMetadata,
    operator: &str,
    subtask: u32,
) -> Result<Option<Vec<u8>>> {
    let Some(file) = metadata
        .subtask(operator, subtask)
        .and_then(|st| st.files.iter().find(|f| is_local_file(&f.path)))
    else {
        return Ok(None);
    };
    Ok(Some(read_verified(store, file)?))
}

/// Operator-local state of one subtask in a checkpoint.
pub enum LocalState {
    /// Same parallelism as at the snapshot: this subtask's own snapshot, if any.
    Same(Option<Vec<u8>>),
    /// The parallelism changed: the snapshots of the old subtasks `j` with
    /// `j % parallelism == subtask`, in old-subtask order.
    Rescaled(Vec<Vec<u8>>),
}

/// Reads what subtask `subtask` of `parallelism` restores of `operator`'s local state:
/// its own snapshot, or after a change of parallelism its share of the old subtasks'
/// snapshots (list state, split evenly, as Flink's operator list state).
///
/// # Errors
/// A corrupt or unreadable file.
pub fn read_local_state(
    store: &dyn CheckpointStore,
    metadata: &CheckpointMetadata,
    operator: &str,
    subtask: u32,
    parallelism: u32,
) -> Result<LocalState> {
    let old = metadata
        .operators
        .iter()
        .find(|o| o.id == operator)
        .map(|o| o.parallelism);
    match old {
        Some(old) if old != parallelism && parallelism > 0 => {
            let mut blobs = Vec::new();
            for j in (0..old).filter(|j| j % parallelism == subtask) {
                if let Some(b) = read_local(store, metadata, operator, j)? {
                    blobs.push(b);
                }
            }
            Ok(LocalState::Rescaled(blobs))
        }
        _ => Ok(LocalState::Same(read_local(
            store, metadata, operator, subtask,
        )?)),
    }
}

/// The event-time watermark operator `operator`'s subtask `subtask` (of `parallelism`)
/// starts from after a restore: its own from the checkpoint, or after a change of
/// parallelism the smallest of the old subtasks' (every old subtask's records may reach it);
/// [`WATERMARK_MIN`](crate::base::message::WATERMARK_MIN) when none was recorded.
pub fn restored_watermark(
    metadata: &CheckpointMetadata,
    operator: &str,
    subtask: u32,
    parallelism: u32,
) -> i64 {
    use crate::base::message::WATERMARK_MIN;
    let old = metadata
        .operators
        .iter()
        .find(|o| o.id == operator)
        .map(|o| o.parallelism);
    let mut states = metadata.subtasks.iter().filter(|s| s.operator == operator);
    match old {
        Some(old) if old != parallelism => {
            let recorded: Vec<Option<i64>> = states.map(|s| s.watermark).collect();
            if recorded.len() as u32 == old {
                recorded
                    .into_iter()
                    .map(|w| w.unwrap_or(WATERMARK_MIN))
                    .min()
                    .unwrap_or(WATERMARK_MIN)
            } else {
                WATERMARK_MIN
            }
        }
        _ => states
            .find(|s| s.subtask == subtask)
            .and_then(|s| s.watermark)
            .unwrap_or(WATERMARK_MIN),
    }
}

/// How a restore decision narrows a node's keyed state (see [`restore_keyed`]).
pub struct KeyedFilter<'a> {
    /// The pipeline, for errors.
    pub pipeline: &'a str,
    /// The pipeline's number of key groups.
    pub max_parallelism: u32,
    /// What the restore does to this node's state.
    pub decision: &'a NodeDecision,
    /// `--allow-non-restored-state`: an undeclared state may be dropped.
    pub allow_non_restored_state: bool,
}

/// Restores the keyed state of `operator`'s subtask that owns `range` from the keyed files of
/// every old subtask whose key groups overlap it (after a rescale, possibly several): all of
/// it as recorded, or with a `filter` only what the restore decision keeps.
///
/// # Errors
/// Unreadable or corrupt files; what [`KeyedFilter`] refuses.
pub fn restore_keyed(
    state: &mut dyn StateBackend,
    store: &dyn CheckpointStore,
    metadata: &CheckpointMetadata,
    operator: &str,
    range: KeyGroupRange,
    filter: Option<KeyedFilter<'_>>,
) -> Result<()> {
    let files: Vec<FileRef> = metadata
        .subtasks
        .iter()
        .filter(|st| st.operator == operator)
        .filter(|st| overlaps(KeyGroupRange::from(st.key_groups), range))
        .flat_map(|st| st.files.iter().filter(|f| is_keyed_file(&f.path)))
        .cloned()
        .collect();
    match filter {
        None => state.restore_files(store, &files),
        Some(f) => restore_filtered(
            state,
            f.pipeline,
            store,
            &files,
            f.max_parallelism,
            f.decision,
            f.allow_non_restored_state,
        ),
    }
}

/// Restores keyed state as its restore decision says: only the named states the node
/// declares, each under its declared kind (a retyped state's values are rewritten by
/// `migrate` afterwards); every other state of the snapshot is left out, so that it never
/// comes back under its old name. When the snapshot's metadata did not record the declared
/// states, a state the node does not declare is refused unless `allow_non_restored_state`.
///
/// # Errors
/// Unreadable or corrupt files; an undeclared state that may not be dropped; native RocksDB
/// files, which are restored whole (the restore plan refuses such a restore before this; for
/// unrecorded metadata they are restored whole, with a warning).
fn restore_filtered(
    state: &mut dyn StateBackend,
    pipeline: &str,
    store: &dyn CheckpointStore,
    files: &[FileRef],
    max_parallelism: u32,
    decision: &NodeDecision,
    allow_non_restored_state: bool,
) -> Result<()> {
    if files.iter().any(|f| f.path.ends_with(NATIVE_SUFFIX)) {
        if decision.unrecorded {
            tracing::warn!(operator = %decision.id, "The checkpoint does not record which states this operator declared and holds them in RocksDB's native format: restored as they are.");
            return state.restore_files(store, files);
        }
        return Err(RunError::Internal(format!(
            "operator `{}`: a native RocksDB checkpoint cannot restore only some of its states \
             (the restore plan should have refused this)",
            decision.id
        )));
    }
    let declared = decision.restored_states();
    let mut filtered = Vec::new();
    for blob in read_canonical(store, files)? {
        filtered.push(filter_snapshot(&blob, max_parallelism, |name, kind| {
            if let Some(kind) = declared.get(name) {
                return Ok(StateFilter::Keep(*kind));
            }
            // Internal states (a process's timers and TTL expiry: `__timers.*`, `__ttl.*`),
            // which no pipeline declares, follow their operator's restore.
            if name.starts_with("__") {
                return Ok(StateFilter::Keep(kind));
            }
            if decision.unrecorded && !allow_non_restored_state {
                return Err(RunError::Build {
                    pipeline: pipeline.to_owned(),
                    element: decision.id.clone(),
                    message: format!(
                        "the snapshot holds state `{name}`, which operator `{}` does not \
                         declare any more: its values would be lost. Declare it again, or \
                         drop it with `--allow-non-restored-state`",
                        decision.id
                    ),
                });
            }
            tracing::debug!(operator = %decision.id, state = name, "Not restoring a state the operator no longer declares.");
            Ok(StateFilter::Drop)
        })?);
    }
    let refs: Vec<&[u8]> = filtered.iter().map(Vec::as_slice).collect();
    state.restore(&refs)
}

#[cfg(test)]
mod watermark_tests {
    use super::*;
    use crate::base::message::WATERMARK_MIN;
    use crate::checkpoint::metadata::tests::sample;

    #[test]
    fn a_restore_starts_from_the_recorded_watermark_and_the_smallest_after_a_rescale() {
        // `sample` has operator `count` at parallelism 2.
        let mut m = sample(3);
        assert_eq!(restored_watermark(&m, "count", 0, 2), WATERMARK_MIN, "none recorded");
        m.subtasks[0].watermark = Some(500);
        m.subtasks[1].watermark = Some(300);
        assert_eq!(restored_watermark(&m, "count", 0, 2), 500);
        assert_eq!(restored_watermark(&m, "count", 1, 2), 300);
        for s in 0..3 {
            assert_eq!(restored_watermark(&m, "count", s, 3), 300, "rescaled: the minimum");
        }
        assert_eq!(restored_watermark(&m, "count", 0, 1), 300);
        m.subtasks[1].watermark = None;
        assert_eq!(restored_watermark(&m, "count", 0, 1), WATERMARK_MIN);
        assert_eq!(restored_watermark(&m, "other", 0, 1), WATERMARK_MIN);
        // Metadata written before watermarks reads without them.
        let json = serde_json::to_string(&m.subtasks[1]).expect("json");
        assert!(!json.contains("watermark"), "{json}");
    }
}
