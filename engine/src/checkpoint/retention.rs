//! Retention (ARCHITECTURE.md 5.7): which completed checkpoints to delete and which of their
//! files, as a pure function of the completed checkpoints' file sets; and a thin executor
//! that carries the decision out through a [`CheckpointStore`].
//!
//! The rule: keep the newest `retain` completed checkpoints; delete every older one and every
//! file it references that no retained checkpoint references. Shared files (`shared/`, such
//! as RocksDB SSTs reused by incremental checkpoints) are thereby reference-counted. Savepoints
//! are not subject to retention: pass only periodic checkpoints.

use std::collections::{BTreeMap, BTreeSet};

use super::metadata::{CheckpointMetadata, checkpoint_dir, metadata_path};
use super::storage::CheckpointStore;
use super::{CheckpointId, Result};

/// A completed checkpoint as retention sees it: its id and every file it references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointFiles {
    /// The checkpoint's id.
    pub checkpoint: CheckpointId,
    /// Every store-relative path it references (own files and shared ones).
    pub files: BTreeSet<String>,
}

impl CheckpointFiles {
    /// The file set recorded in a checkpoint's metadata.
    pub fn from_metadata(meta: &CheckpointMetadata) -> Self {
        Self {
            checkpoint: meta.checkpoint,
            files: meta.files().map(|f| f.path.clone()).collect(),
        }
    }
}

/// What to delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionPlan {
    /// Checkpoints kept, ascending.
    pub retained: Vec<CheckpointId>,
    /// Checkpoints to delete, ascending. Delete each one's `_metadata` before anything else,
    /// so that a crash during collection never leaves a restorable checkpoint with missing
    /// files.
    pub expired: Vec<CheckpointId>,
    /// Files referenced by expired checkpoints and by no retained one, sorted: their own
    /// files and the shared files no longer used.
    pub delete_files: Vec<String>,
    /// Directories `chk-<n>` of expired checkpoints that hold no file a retained checkpoint
    /// references, so that they can go as a whole (stray files of aborted writes included).
    pub delete_dirs: Vec<String>,
}

impl RetentionPlan {
    /// Whether there is nothing to delete.
    pub fn is_empty(&self) -> bool {
        self.expired.is_empty()
    }

    /// Carries the plan out: every expired `_metadata`, then the files, then the directories.
    /// Safe to repeat after a crash (deletes are idempotent).
    ///
    /// # Errors
    /// The first storage error; what was deleted before stays deleted.
    pub fn execute(&self, store: &dyn CheckpointStore) -> Result<()> {
        for &id in &self.expired {
            store.delete(&metadata_path(id))?;
        }
        for path in &self.delete_files {
            store.delete(path)?;
        }
        for dir in &self.delete_dirs {
            store.delete_dir(dir)?;
        }
        Ok(())
    }
}

/// Decides what to delete so that only the newest `retain` completed checkpoints remain,
/// never deleting a file that a retained checkpoint references. `retain` is at least 1 (0
/// is treated as 1: the latest completed checkpoint is never deleted). The input need not be
/// sorted; duplicate ids are merged.
pub fn plan_retention(completed: &[CheckpointFiles], retain: u32) -> RetentionPlan {
    let mut by_id: BTreeMap<CheckpointId, BTreeSet<&str>> = BTreeMap::new();
    for c in completed {
        by_id
            .entry(c.checkpoint)
            .or_default()
            .extend(c.files.iter().map(String::as_str));
    }
    let all: Vec<(CheckpointId, BTreeSet<&str>)> = by_id.into_iter().collect();
    let keep = (retain.max(1) as usize).min(all.len());
    let (expired, retained) = all.split_at(all.len() - keep);

    let referenced: BTreeSet<&str> = retained
        .iter()
        .flat_map(|(_, files)| files.iter().copied())
        .collect();
    let mut delete_files = BTreeSet::new();
    let mut delete_dirs = Vec::new();
    for (id, files) in expired {
        delete_files.extend(
            files
                .iter()
                .filter(|f| !referenced.contains(*f))
                .map(|f| (*f).to_owned()),
        );
        let dir = checkpoint_dir(*id);
        let prefix = format!("{dir}/");
        if !referenced.iter().any(|f| f.starts_with(&prefix)) {
            delete_dirs.push(dir);
        }
    }

    RetentionPlan {
        retained: retained.iter().map(|(id, _)| *id).collect(),
        expired: expired.iter().map(|(id, _)| *id).collect(),
        delete_files: delete_files.into_iter().collect(),
        delete_dirs,
    }
}

/// Shared files that no retained checkpoint references (left by aborted checkpoints or a
/// crash during collection), sorted.
///
/// Call this only while no checkpoint is in flight (for example at startup, before the first
/// trigger): a shared file uploaded for a pending checkpoint is not referenced yet and would
/// be listed.
pub fn orphaned_shared(existing_shared: &[String], retained: &[CheckpointFiles]) -> Vec<String> {
    let referenced: BTreeSet<&str> = retained
        .iter()
        .flat_map(|c| c.files.iter().map(String::as_str))
        .collect();
    let mut out: Vec<String> = existing_shared
        .iter()
        .filter(|f| !referenced.contains(f.as_str()))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::storage::{MemoryStore, latest_valid};

    fn chk(id: CheckpointId, files: &[&str]) -> CheckpointFiles {
        CheckpointFiles {
            checkpoint: id,
            files: files.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    #[test]
    fn retention_deletes_old_checkpoints_and_only_unreferenced_shared_files() {
        // Incremental checkpoints: each adds an SST and keeps some older ones.
        let completed = [
            chk(1, &["chk-1/src-0", "shared/a.sst", "shared/b.sst"]),
            chk(2, &["chk-2/src-0", "shared/a.sst", "shared/c.sst"]),
            chk(
                3,
                &[
                    "chk-3/src-0",
                    "shared/a.sst",
                    "shared/c.sst",
                    "shared/d.sst",
                ],
            ),
            chk(4, &["chk-4/src-0", "shared/c.sst", "shared/e.sst"]),
        ];
        let plan = plan_retention(&completed, 2);
        assert_eq!(plan.retained, vec![3, 4]);
        assert_eq!(plan.expired, vec![1, 2]);
        assert_eq!(
            plan.delete_files,
            vec!["chk-1/src-0", "chk-2/src-0", "shared/b.sst"],
            "a.sst and c.sst are still referenced by checkpoint 3 or 4"
        );
        assert_eq!(plan.delete_dirs, vec!["chk-1", "chk-2"]);

        let plan = plan_retention(&completed, 1);
        assert_eq!(plan.retained, vec![4]);
        assert_eq!(
            plan.delete_files,
            vec![
                "chk-1/src-0",
                "chk-2/src-0",
                "chk-3/src-0",
                "shared/a.sst",
                "shared/b.sst",
                "shared/d.sst"
            ]
        );
    }

    #[test]
    fn retention_keeps_everything_within_the_limit() {
        let completed = [chk(2, &["chk-2/x"]), chk(1, &["chk-1/x"])];
        let plan = plan_retention(&completed, 5);
        assert!(plan.is_empty());
        assert_eq!(plan.retained, vec![1, 2]);
        assert!(plan.delete_files.is_empty());
        assert_eq!(plan_retention(&[], 3), RetentionPlan::default());
    }

    #[test]
    fn retain_zero_still_keeps_the_latest() {
        let completed = [chk(1, &["chk-1/x"]), chk(2, &["chk-2/x"])];
        let plan = plan_retention(&completed, 0);
        assert_eq!(plan.retained, vec![2]);
        assert_eq!(plan.expired, vec![1]);
    }

    #[test]
    fn a_directory_with_a_still_referenced_file_is_not_removed_whole() {
        let completed = [
            chk(1, &["chk-1/x", "chk-1/y"]),
            chk(2, &["chk-2/z", "chk-1/y"]),
        ];
        let plan = plan_retention(&completed, 1);
        assert_eq!(plan.delete_files, vec!["chk-1/x"]);
        assert!(plan.delete_dirs.is_empty());
    }

    #[test]
    fn orphaned_shared_files_are_those_no_retained_checkpoint_uses() {
        let existing = ["shared/a.sst", "shared/z.sst", "shared/c.sst"].map(String::from);
        let retained = [chk(3, &["shared/a.sst"]), chk(4, &["shared/c.sst"])];
        assert_eq!(orphaned_shared(&existing, &retained), vec!["shared/z.sst"]);
    }

    #[test]
    fn executing_a_plan_leaves_the_retained_checkpoints_restorable() {
        use crate::checkpoint::metadata::tests::sample;
        use crate::checkpoint::storage::{Verification, write_metadata};

        let store = MemoryStore::new();
        let mut completed = Vec::new();
        for id in 1..=3 {
            let meta = sample(id);
            for f in meta.files() {
                let content: &[u8] = if f.is_shared() { b"shared" } else { b"state" };
                store.put(&f.path, content).expect("put");
            }
            write_metadata(&store, &meta).expect("metadata");
            completed.push(CheckpointFiles::from_metadata(&meta));
        }
        store.put("chk-1/.stray.tmp", b"x").expect("put");
        let plan = plan_retention(&completed, 2);
        plan.execute(&store).expect("execute");
        plan.execute(&store).expect("idempotent");
        assert_eq!(store.list_checkpoints().expect("list"), vec![2, 3]);
        assert!(store.paths().contains(&"shared/base.sst".to_owned()));
        assert!(!store.paths().iter().any(|p| p.starts_with("chk-1/")));
        let choice = latest_valid(&store, Verification::Checksums).expect("list");
        assert_eq!(choice.checkpoint.map(|m| m.checkpoint), Some(3));
    }
}
