//! Pacing of striped file readers (see [`super::file`]): the readers of one source, reading
//! interleaved blocks of one file, keep within one round of blocks of each other, so that
//! their event times stay close and the source's watermark (their minimum) keeps up with
//! all of them. Without it, a reader that gets more CPU runs ahead, and every window it
//! opens stays open until the slowest reader catches up, which made state, checkpoints and
//! memory grow with the gap. Flink offers the same as opt-in watermark alignment; here it
//! only paces readers of one file, by bytes, and needs no setting.
//!
//! Each reader publishes the start of the block it last started in each file
//! ([`Pacing::started`]), or that it has no more blocks there ([`Pacing::finished`]). A
//! reader may start its next block while the block it last started is at most one round
//! (`parallelism` blocks) past the slowest other reader's. The slowest reader is never held,
//! so the readers cannot all wait on each other. A reader that has not published yet holds
//! no one back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The shared positions of one source's readers, per file.
#[derive(Clone, Debug, Default)]
pub struct Pacing(Arc<Mutex<HashMap<PathBuf, Vec<u64>>>>);

impl Pacing {
    fn with<R>(&self, path: &Path, parallelism: u32, f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
        let mut files = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let slots = files.entry(path.to_path_buf()).or_default();
        let p = parallelism.max(1) as usize;
        if slots.len() != p {
            // Sized for the current parallelism (a restart at another one starts afresh).
            *slots = vec![u64::MAX; p];
        }
        f(slots)
    }

    /// Reader `subtask` started the block of `path` at byte `start`.
    pub fn started(&self, path: &Path, subtask: u32, parallelism: u32, start: u64) {
        self.with(path, parallelism, |s| {
            let at = subtask as usize % s.len();
            s[at] = start;
        });
    }

    /// Reader `subtask` has no more blocks of `path`: it holds no one back.
    pub fn finished(&self, path: &Path, subtask: u32, parallelism: u32) {
        self.with(path, parallelism, |s| {
            let at = subtask as usize % s.len();
            s[at] = u64::MAX;
        });
    }

    /// Whether reader `subtask`, whose last block of `path` started at byte `last`, may start
    /// another: `last` is at most `round` bytes past every other reader's last block.
    pub fn may_start(&self, path: &Path, subtask: u32, parallelism: u32, last: u64, round: u64) -> bool {
        self.with(path, parallelism, |s| {
            let me = subtask as usize % s.len();
            let slowest = s
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != me)
                .map(|(_, &v)| v)
                .min()
                .unwrap_or(u64::MAX);
            last <= slowest.saturating_add(round)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_a_round_ahead_waits_and_the_slowest_never_does() {
        let p = Pacing::default();
        let f = Path::new("/in.jsonl");
        let block = 10;
        // Nobody has published: nothing holds reader 1 back.
        assert!(p.may_start(f, 1, 2, 10, 2 * block));
        p.started(f, 0, 2, 0);
        p.started(f, 1, 2, 30);
        // Reader 1 finished its block at 30; reader 0 is still on block 0: 30 > 0 + 20.
        assert!(!p.may_start(f, 1, 2, 30, 2 * block));
        assert!(p.may_start(f, 0, 2, 0, 2 * block), "the slowest reader goes on");
        p.started(f, 0, 2, 20);
        assert!(p.may_start(f, 1, 2, 30, 2 * block));
        // A reader done with the file holds no one back.
        p.finished(f, 0, 2);
        assert!(p.may_start(f, 1, 2, 1_000, 2 * block));
        // Other files are paced apart.
        assert!(p.may_start(Path::new("/other"), 1, 2, 1_000, 2 * block));
    }
}
