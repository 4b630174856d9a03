//! A pipeline's checkpoint storage and local state: opening checkpoint storage (memory, a
//! local directory or S3), clearing what a killed process left in RocksDB's local working
//! directories, and checking that a savepoint directory is writable. The paths themselves
//! are the plan's (`PipelinePaths`, resolved at compile time). Nothing here decides what to
//! restore (`restore`) or when to write (`completion`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use weir_schema::StateSpec;

use crate::base::error::{Result, RunError};
use crate::checkpoint::retention::CheckpointFiles;
use crate::checkpoint::s3::S3Store;
use crate::checkpoint::{
    AlignmentMode, CheckpointId, CheckpointMetadata, CheckpointStore, LocalStore, MemoryStore,
};
use crate::plan::{CheckpointRoot, PipelinePlan};
use crate::runtime::task::TaskRestore;

/// Marker written when a pipeline with durable checkpoints ran to the end: the next run
/// starts fresh instead of resuming.
pub(super) const FINISHED_MARKER: &str = "_finished";

/// A pipeline's checkpoint storage and what the supervisor tracks of it.
pub(super) struct CheckpointSetup {
    pub store: Arc<dyn CheckpointStore>,
    /// Whether checkpoints outlive the process (a directory, not memory).
    pub durable: bool,
    pub mode: AlignmentMode,
    pub retain: u32,
    /// Completed checkpoints still retained, oldest first.
    pub completed: Vec<CheckpointFiles>,
    /// Metadata of checkpoints whose write is in flight or done, until retention.
    pub metadata: BTreeMap<CheckpointId, CheckpointMetadata>,
    /// The latest completed checkpoint (restored or taken) and the store holding it.
    pub latest: Option<TaskRestore>,
}

/// A failure to set up `plan`'s checkpoints or restore.
pub(super) fn build_error(plan: &PipelinePlan, message: impl Into<String>) -> RunError {
    RunError::Build {
        pipeline: plan.id.clone(),
        element: "checkpoints".into(),
        message: message.into(),
    }
}

/// Opens `plan`'s checkpoint storage, or `None` when it takes no checkpoints.
pub(super) fn setup_checkpoints(plan: &PipelinePlan) -> Result<Option<CheckpointSetup>> {
    let spec = &plan.spec.checkpoints;
    if !spec.enabled {
        return Ok(None);
    }
    let (store, durable): (Arc<dyn CheckpointStore>, bool) = match plan.spec.state {
        StateSpec::Memory => (Arc::new(MemoryStore::new()), false),
        StateSpec::Fs | StateSpec::Rocksdb(_) => match &plan.paths.checkpoint_root {
            CheckpointRoot::Local(dir) => {
                let store =
                    LocalStore::new(dir, &plan.id).map_err(|e| build_error(plan, e.to_string()))?;
                (Arc::new(store), true)
            }
            CheckpointRoot::S3(location) => {
                let store = S3Store::new(location, &plan.id)
                    .map_err(|e| build_error(plan, e.to_string()))?;
                (Arc::new(store), true)
            }
        },
    };
    Ok(Some(CheckpointSetup {
        store,
        durable,
        mode: spec.mode.into(),
        retain: spec.retain.max(1),
        completed: Vec::new(),
        metadata: BTreeMap::new(),
        latest: None,
    }))
}

/// Removes RocksDB instances left behind by a killed process: local state is only a working
/// copy (every restore downloads it again from checkpoint storage). Only directories the
/// backend itself creates (`db-<hex>` under `<operator>-<subtask>/`) are touched, never
/// anything else the directory may hold, and never those of instances open in this process:
/// during a hot reload the new version takes over the old version's open instances
/// (`state::handover`), and removing their directories made its first checkpoint fail.
pub(super) fn clear_local_state(plan: &PipelinePlan) {
    let Some(dir) = &plan.paths.rocksdb else {
        return;
    };
    let Ok(subtasks) = std::fs::read_dir(dir) else {
        return;
    };
    for sub in subtasks.flatten() {
        let Ok(instances) = std::fs::read_dir(sub.path()) else {
            continue;
        };
        for inst in instances.flatten() {
            let name = inst.file_name().to_string_lossy().into_owned();
            let ours = name
                .strip_prefix("db-")
                .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
            if ours
                && inst.path().is_dir()
                && !crate::state::rocksdb::is_open_instance(&inst.path())
                && let Err(e) = std::fs::remove_dir_all(inst.path())
            {
                tracing::warn!(pipeline = %plan.id, dir = %inst.path().display(), error = %e, "Cannot remove a stale RocksDB instance.");
            }
        }
    }
}

/// Whether savepoints can be written into `dir`: creates it, then a probe file in it.
pub(super) fn check_writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".weir-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(&probe)
}
