//! Choosing what a run restores from: a savepoint or a checkpoint named on the command line,
//! the latest valid checkpoint in storage, or nothing (a fresh start, a finished previous
//! run); the restore marker that makes a restored run that died before its first checkpoint
//! restore the same point again; and the refusal to start when checkpoints exist but none
//! can be restored. It also cleans up what a fresh start or earlier crashes left in storage.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::RecoveryOptions;
use super::storage::{CheckpointSetup, FINISHED_MARKER, build_error};
use crate::base::error::Result;
use crate::checkpoint::metadata::checkpoint_dir;
use crate::checkpoint::restore_plan::{self, PipelineShape, RestoreKind, RestorePlan};
use crate::checkpoint::retention::{CheckpointFiles, orphaned_shared};
use crate::checkpoint::s3::{S3Location, S3Store};
use crate::checkpoint::savepoint::open_savepoint;
use crate::checkpoint::storage::{Verification, delete_checkpoint, latest_valid, read_metadata};
use crate::checkpoint::{CheckpointId, CheckpointMetadata, CheckpointStore, LocalStore, TaskId};
use crate::plan::PipelinePlan;
use crate::runtime::task::TaskRestore;

/// What a run restores, and the highest checkpoint id used so far (new ids follow it).
pub(super) type Restore = (Option<TaskRestore>, CheckpointId);

/// The tasks of `plan` that a savepoint says had finished: those whose chain's head had
/// finished as the same subtask at the same parallelism.
fn finished_in(plan: &PipelinePlan, meta: &CheckpointMetadata) -> Vec<TaskId> {
    let finished: BTreeSet<(&str, u32)> = meta
        .finished_operators
        .iter()
        .map(|(o, s)| (o.as_str(), *s))
        .collect();
    let mut out = Vec::new();
    for (c, chain) in plan.chains.iter().enumerate() {
        let head = &plan.nodes[chain.nodes[0].0];
        let same_parallelism = meta
            .operators
            .iter()
            .any(|o| o.id == head.id && o.parallelism == chain.parallelism);
        if !same_parallelism {
            continue;
        }
        for s in 0..chain.parallelism {
            if finished.contains(&(head.id.as_str(), s)) {
                out.push(TaskId::new(c as u32, s));
            }
        }
    }
    out
}

/// Decides what restoring `meta` does to every node's state (see
/// [`crate::checkpoint::restore_plan`]) and refuses the restore when the decision has a
/// problem, listing every one; state dropped on purpose (`--allow-non-restored-state`) is
/// logged. `what` names the restored point for the messages.
fn restore_decision(
    plan: &PipelinePlan,
    meta: &CheckpointMetadata,
    kind: RestoreKind,
    what: &str,
    allow_non_restored_state: bool,
) -> Result<Arc<RestorePlan>> {
    let decision = restore_plan::decide(
        &PipelineShape::of_metadata(meta),
        &PipelineShape::of_plan(plan),
        kind,
        allow_non_restored_state,
    );
    if !decision.problems.is_empty() {
        let list = decision
            .problems
            .iter()
            .map(|p| format!("\n  - {p}"))
            .collect::<String>();
        return Err(build_error(
            plan,
            format!("cannot restore {what} into this version of the pipeline:{list}"),
        ));
    }
    for w in &decision.waived {
        tracing::warn!(pipeline = %plan.id, restore = %what, "State not restored (--allow-non-restored-state): {w}");
    }
    if let Some((from, to)) = decision.backend {
        tracing::info!(pipeline = %plan.id, from = from.as_str(), to = to.as_str(), "Restoring into another state backend.");
    }
    for n in decision.nodes.iter().filter(|n| n.unrecorded) {
        tracing::warn!(pipeline = %plan.id, operator = %n.id, "The restored metadata does not record which states this operator declared (an older Weir): names and kinds are not compared; a state it no longer declares is refused unless --allow-non-restored-state.");
    }
    Ok(Arc::new(decision))
}

/// Written into durable checkpoint storage when a run starts from a savepoint or from a
/// checkpoint named on the command line. The restore rolls sinks back to that point, so the
/// storage's checkpoints up to `after` (taken before the restore, possibly later than the
/// restored point) no longer match the output: until the restored run completes a
/// checkpoint of its own, a plain restart restores the same point again.
const RESTORED_MARKER: &str = "_restored_from";

/// The content of [`RESTORED_MARKER`] (JSON).
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct RestoredFrom {
    /// The savepoint or checkpoint directory, absolute.
    path: PathBuf,
    /// A savepoint (restored under the savepoint rules) or a checkpoint.
    savepoint: bool,
    /// The highest checkpoint id in the storage when the restore started.
    after: CheckpointId,
    /// `--allow-non-restored-state` was given.
    allow_non_restored_state: bool,
}

fn write_restored_marker(plan: &PipelinePlan, store: &dyn CheckpointStore, marker: &RestoredFrom) {
    let written = serde_json::to_vec(marker)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            store
                .put(RESTORED_MARKER, &bytes)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        tracing::warn!(pipeline = %plan.id, error = %e, "Cannot record the restore in checkpoint storage; if this run dies before its first checkpoint, restore the same point again by hand.");
    }
}

/// Records, in durable checkpoint storage, that this run restored `path` (a savepoint when
/// `savepoint`) over checkpoints up to `after` (see [`RestoredFrom`]).
fn mark_restored(
    plan: &PipelinePlan,
    ck: &CheckpointSetup,
    path: &Path,
    savepoint: bool,
    after: CheckpointId,
    recovery: &RecoveryOptions,
) {
    if !ck.durable {
        return;
    }
    let remote = S3Location::parse(&path.to_string_lossy()).is_some();
    let marker = RestoredFrom {
        path: if remote {
            path.to_path_buf()
        } else {
            std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
        },
        savepoint,
        after,
        allow_non_restored_state: recovery.allow_non_restored_state,
    };
    write_restored_marker(plan, &*ck.store, &marker);
}

fn read_restored_marker(store: &dyn CheckpointStore) -> Option<RestoredFrom> {
    store
        .get(RESTORED_MARKER)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

/// Deletes every checkpoint and shared file of a store (a fresh start must never fall back
/// to an older run's checkpoint).
fn wipe(store: &dyn CheckpointStore) -> Result<()> {
    for id in store.list_checkpoints()? {
        delete_checkpoint(store, id)?;
    }
    for f in store.list_shared()? {
        store.delete(&f)?;
    }
    store.delete(FINISHED_MARKER)?;
    store.delete(RESTORED_MARKER)?;
    Ok(())
}

/// Picks the checkpoint to restore (if any) and the highest id used so far; cleans up
/// what a fresh start or earlier crashes left behind.
pub(super) fn choose_restore(
    plan: &PipelinePlan,
    ck: &mut CheckpointSetup,
    recovery: &RecoveryOptions,
) -> Result<Restore> {
    if let Some(path) = &recovery.from_savepoint {
        return from_savepoint(plan, ck, path, recovery);
    }
    if let Some(path) = &recovery.from_checkpoint {
        return from_checkpoint(plan, ck, path, recovery);
    }
    let store = &*ck.store;
    let finished = store.size(FINISHED_MARKER).is_ok();
    if recovery.fresh || finished {
        return start_fresh(plan, store, recovery.fresh, finished);
    }
    resume_latest(plan, ck, recovery)
}

/// `--from-savepoint`: state by operator id under the savepoint rules.
fn from_savepoint(
    plan: &PipelinePlan,
    ck: &CheckpointSetup,
    path: &Path,
    recovery: &RecoveryOptions,
) -> Result<Restore> {
    let (mut meta, at) = open_savepoint(path).map_err(|e| {
        build_error(
            plan,
            format!("cannot restore savepoint `{}`: {e}", path.display()),
        )
    })?;
    if meta.pipeline != plan.id {
        tracing::warn!(pipeline = %plan.id, savepoint = %path.display(), from = %meta.pipeline, "Restoring a savepoint taken by another pipeline; state maps by operator id.");
        meta.pipeline = plan.id.clone();
    }
    let decision = restore_decision(
        plan,
        &meta,
        RestoreKind::Savepoint,
        &format!("savepoint `{}`", path.display()),
        recovery.allow_non_restored_state,
    )?;
    meta.finished_tasks = finished_in(plan, &meta);
    let last = last_checkpoint(&*ck.store)?.max(meta.checkpoint);
    mark_restored(plan, ck, path, true, last, recovery);
    tracing::info!(pipeline = %plan.id, checkpoint = meta.checkpoint, path = %path.display(), "Restoring from a savepoint.");
    Ok((
        Some(TaskRestore {
            store: at,
            metadata: Arc::new(meta),
            savepoint: true,
            plan: Some(decision),
        }),
        last,
    ))
}

/// `--from-checkpoint`: a checkpoint directory named on the command line.
fn from_checkpoint(
    plan: &PipelinePlan,
    ck: &CheckpointSetup,
    path: &Path,
    recovery: &RecoveryOptions,
) -> Result<Restore> {
    let (mut meta, at) = read_checkpoint_at(plan, path)?;
    let last = last_checkpoint(&*ck.store)?;
    tracing::info!(pipeline = %plan.id, checkpoint = meta.checkpoint, path = %path.display(), "Restoring from the checkpoint given on the command line.");
    warn_if_changed(plan, &meta);
    let decision = restore_decision(
        plan,
        &meta,
        RestoreKind::Checkpoint,
        &format!("checkpoint `{}`", path.display()),
        recovery.allow_non_restored_state,
    )?;
    if meta.config_hash != crate::checkpoint::metadata::config_hash(&plan.spec) {
        meta.finished_tasks = finished_in(plan, &meta);
    }
    mark_restored(plan, ck, path, false, last, recovery);
    Ok((
        Some(TaskRestore {
            store: at,
            metadata: Arc::new(meta),
            savepoint: false,
            plan: Some(decision),
        }),
        last,
    ))
}

/// `--fresh`, or the previous run finished: deletes what storage holds and restores nothing.
fn start_fresh(
    plan: &PipelinePlan,
    store: &dyn CheckpointStore,
    fresh: bool,
    finished: bool,
) -> Result<Restore> {
    let last = last_checkpoint(store)?;
    if last > 0 || finished {
        if fresh {
            tracing::warn!(pipeline = %plan.id, "--fresh: deleting the existing checkpoints and starting from the beginning.");
        } else {
            tracing::info!(pipeline = %plan.id, "The previous run finished; starting from the beginning.");
        }
    }
    wipe(store)?;
    Ok((None, last))
}

/// The latest valid checkpoint in storage (or, when the last run was restored from a point
/// and died before its first checkpoint, that point again).
fn resume_latest(
    plan: &PipelinePlan,
    ck: &mut CheckpointSetup,
    recovery: &RecoveryOptions,
) -> Result<Restore> {
    let store = &*ck.store;
    let last = last_checkpoint(store)?;
    // Directories without metadata never completed (a crash while writing): debris.
    for id in store.list_checkpoints()? {
        if matches!(
            read_metadata(store, id),
            Err(crate::base::error::CheckpointError::NotFound { .. })
        ) {
            let _ = delete_checkpoint(store, id);
        }
    }
    let choice = latest_valid(store, Verification::Checksums)?;
    for s in &choice.skipped {
        tracing::warn!(pipeline = %plan.id, checkpoint = s.checkpoint, reason = %s.reason, "Skipping a checkpoint that cannot be restored.");
    }
    if let Some(marker) = read_restored_marker(store)
        && choice
            .checkpoint
            .as_ref()
            .is_none_or(|m| m.checkpoint <= marker.after)
    {
        return restore_again(plan, ck, &marker, recovery);
    }
    let Some(mut meta) = choice.checkpoint else {
        if !choice.skipped.is_empty() {
            return Err(build_error(plan, nothing_restorable(plan, &choice.skipped)));
        }
        return Ok((None, last));
    };
    if !recovery.latest_into_new_version {
        warn_if_changed(plan, &meta);
    }
    let decision = restore_decision(
        plan,
        &meta,
        RestoreKind::Checkpoint,
        &format!("checkpoint {}", meta.checkpoint),
        recovery.allow_non_restored_state,
    )?;
    if recovery.latest_into_new_version
        || meta.config_hash != crate::checkpoint::metadata::config_hash(&plan.spec)
    {
        // Another version (chains may differ): finished tasks map by operator id.
        meta.finished_tasks = finished_in(plan, &meta);
    }
    // Retention bookkeeping: every complete checkpoint still on disk.
    for id in store.list_checkpoints()? {
        if let Ok(m) = read_metadata(store, id) {
            ck.completed.push(CheckpointFiles::from_metadata(&m));
        }
    }
    let orphans = orphaned_shared(&store.list_shared()?, &ck.completed);
    for f in orphans {
        let _ = store.delete(&f);
    }
    tracing::info!(pipeline = %plan.id, checkpoint = meta.checkpoint, dir = %checkpoint_dir(meta.checkpoint), "Resuming from the latest completed checkpoint.");
    Ok((
        Some(TaskRestore {
            store: Arc::clone(&ck.store),
            metadata: Arc::new(meta),
            savepoint: recovery.latest_into_new_version,
            plan: Some(decision),
        }),
        last,
    ))
}

/// The last run started from `marker.path` and completed no checkpoint of its own: restores
/// that point again.
fn restore_again(
    plan: &PipelinePlan,
    ck: &mut CheckpointSetup,
    marker: &RestoredFrom,
    recovery: &RecoveryOptions,
) -> Result<Restore> {
    let what = if marker.savepoint {
        "savepoint"
    } else {
        "checkpoint"
    };
    tracing::warn!(pipeline = %plan.id, path = %marker.path.display(), "The last run started from this {what} and died before its first checkpoint; restoring it again (the checkpoints the storage holds from before that restore no longer match the output).");
    let again = RecoveryOptions {
        from_savepoint: marker.savepoint.then(|| marker.path.clone()),
        from_checkpoint: (!marker.savepoint).then(|| marker.path.clone()),
        allow_non_restored_state: marker.allow_non_restored_state
            || recovery.allow_non_restored_state,
        ..RecoveryOptions::default()
    };
    choose_restore(plan, ck, &again).map_err(|e| {
        build_error(
            plan,
            format!(
                "the last run started from {what} `{}` and died before its first \
                 checkpoint, so it must be restored again: {e}. Give it again with \
                 --from-{what}, or start over with --fresh",
                marker.path.display()
            ),
        )
    })
}

/// The highest checkpoint id in `store` (0 when none).
fn last_checkpoint(store: &dyn CheckpointStore) -> Result<CheckpointId> {
    Ok(store.list_checkpoints()?.into_iter().max().unwrap_or(0))
}

/// The refusal to start when checkpoints exist but none can be restored: each damaged
/// checkpoint with its reason (the file and what is wrong with it), then the ways on. A fresh
/// start would replace the sinks' committed output, so it is never taken silently.
fn nothing_restorable(
    plan: &PipelinePlan,
    skipped: &[crate::checkpoint::storage::SkippedCheckpoint],
) -> String {
    let root = plan.paths.checkpoint_root.display_for(&plan.id);
    let at = format!(" in `{root}`");
    let mut out = format!(
        "checkpoints exist{at}, but none of the {} can be restored:",
        skipped.len()
    );
    for s in skipped {
        out.push_str(&format!(
            "\n  {}: {}",
            checkpoint_dir(s.checkpoint),
            s.reason
        ));
    }
    let savepoints = savepoints_of(plan);
    out.push_str(
        "\nStarting from the beginning would read every source again and replace the committed \
         output of the file sinks, so Weir does not do it on its own. To go on:",
    );
    for sp in &savepoints {
        out.push_str(&format!(
            "\n  weir run --from-savepoint {sp} ...   (a savepoint of this pipeline)"
        ));
    }
    out.push_str(
        &format!("\n  weir run --from-checkpoint {root}/chk-<n> ...   (an older checkpoint you kept, or a repaired one)\n  weir run --fresh ...   (start over: deletes the checkpoints and the file sinks' committed output)"),
    );
    out
}

/// The savepoints of `plan`'s pipeline in its default savepoint directory (a local directory
/// or an `s3://` location), newest first (by name: the id, then the time); only those whose
/// `_metadata` exists. Nothing when the directory cannot be listed (this only feeds a hint).
fn savepoints_of(plan: &PipelinePlan) -> Vec<String> {
    let prefix = format!("savepoint-{}-", plan.id);
    let id_of =
        |name: &str| -> Option<u64> { name.strip_prefix(&prefix)?.split('-').next()?.parse().ok() };
    let mut found: Vec<(u64, String)> =
        match S3Location::parse(&plan.paths.savepoints.to_string_lossy()) {
            Some(Ok(location)) => {
                let Ok(store) = S3Store::at(location.clone()) else {
                    return Vec::new();
                };
                let Ok(names) = store.list_dirs() else {
                    return Vec::new();
                };
                names
                    .iter()
                    .filter_map(|name| {
                        let id = id_of(name)?;
                        store
                            .size(&format!("{name}/_metadata"))
                            .is_ok()
                            .then(|| (id, location.join(name).to_string()))
                    })
                    .collect()
            }
            Some(Err(_)) => return Vec::new(),
            None => {
                let Ok(entries) = std::fs::read_dir(&plan.paths.savepoints) else {
                    return Vec::new();
                };
                entries
                    .flatten()
                    .filter_map(|e| {
                        let id = id_of(&e.file_name().to_string_lossy())?;
                        e.path()
                            .join("_metadata")
                            .is_file()
                            .then(|| (id, e.path().display().to_string()))
                    })
                    .collect()
            }
        };
    found.sort();
    found.into_iter().rev().map(|(_, p)| p).collect()
}

/// Warns when the pipeline changed since checkpoint `meta` was taken (a resume or
/// `--from-checkpoint` into an edited file): the restore plan decides per node what happens.
fn warn_if_changed(plan: &PipelinePlan, meta: &CheckpointMetadata) {
    if meta.config_hash != crate::checkpoint::metadata::config_hash(&plan.spec) {
        tracing::warn!(pipeline = %plan.id, checkpoint = meta.checkpoint, "The pipeline changed since this checkpoint; state is restored by operator id and state name.");
    }
}

/// Reads the metadata of a checkpoint directory given on the command line: a local
/// directory or `s3://bucket/prefix/<pipeline>/chk-<n>`.
fn read_checkpoint_at(
    plan: &PipelinePlan,
    path: &std::path::Path,
) -> Result<(CheckpointMetadata, Arc<dyn CheckpointStore>)> {
    if let Some(location) = S3Location::parse(&path.to_string_lossy()) {
        let location = location.map_err(|e| build_error(plan, e))?;
        let prefix = location.prefix.trim_end_matches("/_metadata");
        let (root, name) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let id = crate::checkpoint::metadata::parse_checkpoint_dir(name).ok_or_else(|| {
            build_error(
                plan,
                format!(
                    "`{}` is not a checkpoint directory (expected `s3://bucket/prefix/<pipeline>/chk-<n>`)",
                    path.display()
                ),
            )
        })?;
        let store = S3Store::at(S3Location {
            bucket: location.bucket.clone(),
            prefix: root.to_owned(),
        })
        .map_err(|e| build_error(plan, e.to_string()))?;
        let meta = read_metadata(&store, id).map_err(|e| build_error(plan, e.to_string()))?;
        return Ok((meta, Arc::new(store)));
    }
    let dir = if path.file_name().is_some_and(|n| n == "_metadata") {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(crate::checkpoint::metadata::parse_checkpoint_dir)
        .ok_or_else(|| {
            build_error(
                plan,
                format!(
                    "`{}` is not a checkpoint directory (expected `.../<pipeline>/chk-<n>`)",
                    path.display()
                ),
            )
        })?;
    let root = dir.parent().unwrap_or(dir);
    let store = LocalStore::at(root);
    let meta = read_metadata(&store, name).map_err(|e| build_error(plan, e.to_string()))?;
    Ok((meta, Arc::new(store)))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::checkpoint::MemoryStore;

    fn plan(yaml: &str) -> PipelinePlan {
        crate::plan::plan_test_yaml(yaml, Path::new("/jobs"))
    }

    #[test]
    fn the_restore_marker_round_trips_and_a_fresh_start_removes_it() {
        let store = MemoryStore::new();
        let marker = RestoredFrom {
            path: "/sp/savepoint-p-4-1".into(),
            savepoint: true,
            after: 9,
            allow_non_restored_state: false,
        };
        write_restored_marker(&plan(crate::plan::TEST_JOB), &store, &marker);
        assert_eq!(read_restored_marker(&store), Some(marker));
        wipe(&store).expect("wipe");
        assert_eq!(read_restored_marker(&store), None);
    }
}
