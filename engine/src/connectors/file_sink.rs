//! The `file` sink: each writer subtask writes part files `<prefix>-<subtask>-<seq>.<ext>` into
//! one directory, rolling at `max_part_size`; `seq` is a per-subtask counter.
//!
//! With exactly-once checkpoints the sink is a two-phase-commit participant:
//!
//! - records go to a hidden in-progress part `.<prefix>-<subtask>-<seq>.<ext>.inprogress`;
//! - a roll, or the barrier of checkpoint `n`, closes it (flush, fsync) and renames it to the
//!   hidden pending part `.<prefix>-<subtask>-<seq>.<ext>.pending`, tagged with `n` (the
//!   checkpoint whose barrier closed it, or the next one for a roll); the snapshot lists every
//!   pending part not committed yet and the next `seq`;
//! - when checkpoint `n` completes, every pending part tagged `<= n` is committed: renamed to
//!   its final name, then the directory is fsynced;
//! - a restore commits the snapshot's pending parts idempotently, then removes this subtask's
//!   hidden parts and every final part with `seq >= next_seq` (written after the checkpoint),
//!   and numbers on from `next_seq`;
//! - at the end of a bounded input everything is committed at once.
//!
//! Rescaling (a savepoint restored at another parallelism `p`): snapshots are list state, old
//! subtask `j`'s going to new subtask `j % p`. Part names keep the number of the subtask that
//! wrote them, so new subtask `s` reconciles every part *name* `n` with `n % p == s` (and no
//! other subtask touches those names, nor writes them: `s` writes under its own number `s`
//! only):
//!
//! - a name with a snapshot (old subtask `n` received): as a plain restore of that snapshot:
//!   commit its pending parts, remove the name's hidden parts and, two-phase, its final parts
//!   numbered at or after the snapshot's `next_seq`;
//! - a name without a snapshot (an old subtask that had finished, so its output is all
//!   committed; or a subtask of an earlier run at a higher parallelism, whose committed output
//!   is part of the result): its final parts are kept, always; its hidden parts are removed
//!   (no snapshot of the restored checkpoint claims them, so nobody would ever commit them).
//!
//! Then `s` numbers on from its own snapshot's `next_seq` (when it received old subtask `s`'s)
//! and after every part already named `s`, so it never overwrites a committed part. A
//! subtask added by a scale-up thus deletes no committed output (unlike a fresh start). The
//! snapshot records its subtask (format version 2); a version 1 snapshot restores only at its
//! own parallelism.
//!
//! Without exactly-once (`at_least_once`, or no checkpoints) records also go to a hidden
//! in-progress part, which is *finished* (flushed, fsynced, renamed to its final name) at
//! every barrier (the snapshot, without waiting for the checkpoint to complete), when it
//! rolls, when the input ends and when the sink closes. So in every mode a part is visible
//! only once it is whole: a crash (SIGKILL, a full disk) can tear the last line of a hidden
//! in-progress part only, and a restore, like a fresh start, removes that part. The snapshot
//! records `next_seq` and no pending part; a restore removes this subtask's hidden parts and
//! the final parts numbered at or after `next_seq` (finished after the checkpoint: the sources
//! replay their records), and numbers on from there. Duplicates left in `at_least_once` come
//! from its unaligned barriers only. Without checkpoints a part becomes visible when it rolls
//! (`max_part_size`), at the end of the input or when the run stops; a crash loses the part in
//! progress (at-most-once), and the next start clears the subtask's parts anyway.
//!
//! Snapshots of format version 2 or older taken without two phases come from builds that wrote
//! final parts directly: their last part may end in a torn line, so a restore cuts a trailing
//! partial line off the part before `next_seq` (its records after the checkpoint are replayed).
//!
//! This module writes only inside its sink directory and only files of its own prefix and
//! subtask (subtask 0 also clears subtasks beyond the parallelism on a fresh start).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rhai::Dynamic;
use serde::{Deserialize, Serialize};

use super::RecordWriter;
use crate::base::error::{Result, RunError};
use crate::base::message::Batch;
use crate::element::{Operator, OperatorContext};

/// Whether a file sink in a pipeline with these checkpoint settings commits in two phases
/// (decided by the plan, which the restore reads too).
pub use crate::plan::guarantee::file_sink_commits_in_two_phases as uses_two_phase_commit;

/// Creates a sink directory.
///
/// Part files left by an earlier run are not removed here (this runs at build time, before
/// anyone knows whether the run resumes from a checkpoint): each subtask clears its own parts
/// in [`FileSink`]'s `open` on a fresh start, or reconciles them in `restore`.
///
/// # Errors
/// When the directory cannot be created.
pub fn prepare_sink_dir(dir: &Path, _prefix: &str, _ext: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

/// What stage a part file is in, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PartKind {
    /// `<prefix>-<subtask>-<seq>.<ext>`: committed output.
    Final,
    /// `.<prefix>-<subtask>-<seq>.<ext>.inprogress`: being written.
    InProgress,
    /// `.<prefix>-<subtask>-<seq>.<ext>.pending`: closed, awaiting its checkpoint.
    Pending,
}

impl PartKind {
    fn suffix(self) -> &'static str {
        match self {
            Self::Final => "",
            Self::InProgress => "inprogress",
            Self::Pending => "pending",
        }
    }
}

/// Parses a part file name of this prefix and extension into `(kind, subtask, seq)`.
fn parse_part_name(name: &str, prefix: &str, ext: &str) -> Option<(PartKind, u32, u64)> {
    let (kind, visible) = match name.strip_prefix('.') {
        Some(hidden) => {
            if let Some(v) = hidden.strip_suffix(".inprogress") {
                (PartKind::InProgress, v)
            } else {
                (PartKind::Pending, hidden.strip_suffix(".pending")?)
            }
        }
        None => (PartKind::Final, name),
    };
    let stem = visible
        .strip_prefix(prefix)?
        .strip_prefix('-')?
        .strip_suffix(ext)?
        .strip_suffix('.')?;
    let (subtask, seq) = stem.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    if !digits(subtask) || !digits(seq) {
        return None;
    }
    Some((kind, subtask.parse().ok()?, seq.parse().ok()?))
}

/// Cuts a trailing partial line (bytes after the last newline, left by a crash in the middle
/// of a write) off a part written by an older build (see the module docs).
fn cut_torn_tail(path: &Path, ctx: &OperatorContext) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |what, e| FileSink::io(ctx, what, path.to_path_buf(), e);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| io("cannot open", e))?;
    let len = f.metadata().map_err(|e| io("cannot read", e))?.len();
    // Look back in chunks for the last newline.
    let mut end = len;
    let mut chunk = vec![0u8; 1 << 16];
    let keep = loop {
        if end == 0 {
            break 0;
        }
        let start = end.saturating_sub(chunk.len() as u64);
        let n = usize::try_from(end - start).unwrap_or(chunk.len());
        f.seek(SeekFrom::Start(start))
            .and_then(|_| f.read_exact(&mut chunk[..n]))
            .map_err(|e| io("cannot read", e))?;
        if let Some(i) = chunk[..n].iter().rposition(|&b| b == b'\n') {
            break start + i as u64 + 1;
        }
        end = start;
    };
    if keep < len {
        f.set_len(keep)
            .and_then(|()| f.sync_all())
            .map_err(|e| io("cannot truncate", e))?;
        tracing::warn!(
            pipeline = %ctx.pipeline,
            sink = %ctx.operator,
            part = %path.display(),
            cut_bytes = len - keep,
            "Cut a torn last line off a part written before a crash; its record is written again from the replay."
        );
    }
    Ok(())
}

/// A closed part awaiting the completion of `checkpoint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PendingPart {
    /// The checkpoint whose barrier closed the part (or the first after its roll).
    checkpoint: u64,
    /// The part's sequence number.
    seq: u64,
}

/// The sink's snapshot, format version [`FileSinkState::VERSION`] (MessagePack). Version 3
/// changed no field, only what `two_phase: false` means (parts finished at barriers; see the
/// module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileSinkState {
    /// Format version.
    version: u32,
    /// Whether the sink committed in two phases when the snapshot was taken.
    two_phase: bool,
    /// Parts `seq < next_seq` existed at the checkpoint; later ones came after it.
    next_seq: u64,
    /// Closed parts not committed at the snapshot, oldest first (empty without two phases).
    pending: Vec<PendingPart>,
    /// The subtask that took the snapshot, whose number its parts carry (absent in version 1).
    #[serde(default)]
    subtask: Option<u32>,
    /// The sink's parallelism at the snapshot (absent in version 1).
    #[serde(default)]
    parallelism: Option<u32>,
}

impl FileSinkState {
    /// Written by this build; versions 1 (no subtask recorded) and 2 (final parts written
    /// directly without two phases) are still read.
    const VERSION: u32 = 3;

    /// Taken by a build that wrote final parts directly (no two phases, before version 3):
    /// its last part may end in a torn line.
    fn wrote_final_parts_directly(&self) -> bool {
        !self.two_phase && self.version < 3
    }
}

/// The part being written.
struct Part {
    seq: u64,
    path: PathBuf,
    file: BufWriter<File>,
    written: u64,
}

/// The `file` sink, one writer subtask.
pub struct FileSink {
    dir: PathBuf,
    prefix: String,
    ext: &'static str,
    csv: bool,
    max_part_size: Option<u64>,
    subtask: u32,
    /// Two-phase commit (exactly-once checkpoints); otherwise parts are finished at barriers,
    /// rolls, the end and close.
    two_phase: bool,
    /// The sequence number the next new part gets.
    next_seq: u64,
    current: Option<Part>,
    /// Parts rolled since the last barrier: pending, not yet tagged with a checkpoint.
    rolled: Vec<u64>,
    /// Pending parts tagged with a checkpoint, oldest first.
    pending: Vec<PendingPart>,
    buf: Vec<u8>,
    writer: RecordWriter,
    /// `on_end` ran: the whole input is committed.
    ended: bool,
}

impl FileSink {
    /// A writer subtask into `dir` that finishes each part at barriers, rolls, the end and
    /// close (no two-phase commit); see [`two_phase_commit`](Self::two_phase_commit).
    pub fn new(
        dir: PathBuf,
        prefix: String,
        csv: bool,
        max_part_size: Option<u64>,
        subtask: u32,
    ) -> Self {
        Self {
            dir,
            prefix,
            ext: if csv { "csv" } else { "jsonl" },
            csv,
            max_part_size,
            subtask,
            two_phase: false,
            next_seq: 0,
            current: None,
            rolled: Vec::new(),
            pending: Vec::new(),
            buf: Vec::with_capacity(1 << 16),
            writer: RecordWriter::new(csv),
            ended: false,
        }
    }

    /// Turns two-phase commit on or off; on for pipelines with exactly-once checkpoints
    /// ([`uses_two_phase_commit`]).
    #[must_use]
    pub fn two_phase_commit(mut self, on: bool) -> Self {
        self.two_phase = on;
        self
    }

    fn path(&self, kind: PartKind, seq: u64) -> PathBuf {
        self.path_of(self.subtask, kind, seq)
    }

    /// The path of part `seq` written under subtask number `subtask`.
    fn path_of(&self, subtask: u32, kind: PartKind, seq: u64) -> PathBuf {
        let name = format!("{}-{subtask}-{seq}.{}", self.prefix, self.ext);
        match kind {
            PartKind::Final => self.dir.join(name),
            _ => self.dir.join(format!(".{name}.{}", kind.suffix())),
        }
    }

    fn io(
        ctx: &OperatorContext,
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    ) -> RunError {
        RunError::Io {
            pipeline: ctx.pipeline.to_string(),
            element: ctx.operator.to_string(),
            what,
            path,
            source,
        }
    }

    /// Writes the buffered records into the current part (opening one if needed) and rolls
    /// it at `max_part_size`.
    fn flush_buf(&mut self, ctx: &OperatorContext) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.current.is_none() {
            let seq = self.next_seq;
            let path = self.path(PartKind::InProgress, seq);
            let f =
                File::create(&path).map_err(|e| Self::io(ctx, "cannot create", path.clone(), e))?;
            self.next_seq += 1;
            self.current = Some(Part {
                seq,
                path,
                file: BufWriter::with_capacity(1 << 18, f),
                written: 0,
            });
        }
        if let Some(part) = self.current.as_mut() {
            part.file
                .write_all(&self.buf)
                .map_err(|e| Self::io(ctx, "cannot write", part.path.clone(), e))?;
            part.written += self.buf.len() as u64;
            self.buf.clear();
            if self.max_part_size.is_some_and(|m| part.written >= m)
                && self.close_part(ctx)?
                && !self.two_phase
            {
                self.sync_dir(ctx)?;
            }
        }
        Ok(())
    }

    /// Closes the current part: flush, fsync, then rename it. Two-phase: to pending
    /// (untagged, in `rolled`). Otherwise to its final name: the part is finished. Returns
    /// whether a part was closed (the directory then needs a sync).
    fn close_part(&mut self, ctx: &OperatorContext) -> Result<bool> {
        let Some(mut part) = self.current.take() else {
            return Ok(false);
        };
        self.writer = RecordWriter::new(self.csv);
        part.file
            .flush()
            .map_err(|e| Self::io(ctx, "cannot write", part.path.clone(), e))?;
        part.file
            .get_ref()
            .sync_all()
            .map_err(|e| Self::io(ctx, "cannot sync", part.path.clone(), e))?;
        drop(part.file);
        let kind = if self.two_phase {
            PartKind::Pending
        } else {
            PartKind::Final
        };
        let closed = self.path(kind, part.seq);
        std::fs::rename(&part.path, &closed)
            .map_err(|e| Self::io(ctx, "cannot close", part.path.clone(), e))?;
        if self.two_phase {
            self.rolled.push(part.seq);
        }
        Ok(true)
    }

    /// Commits pending part `seq` (of `checkpoint`), idempotently: a part already committed is
    /// fine; a part that is neither pending nor committed is lost output, an error.
    fn commit(&self, seq: u64, checkpoint: Option<u64>, ctx: &OperatorContext) -> Result<()> {
        self.commit_of(self.subtask, seq, checkpoint, ctx)
    }

    /// [`commit`](Self::commit) for a part written under subtask number `subtask`.
    fn commit_of(
        &self,
        subtask: u32,
        seq: u64,
        checkpoint: Option<u64>,
        ctx: &OperatorContext,
    ) -> Result<()> {
        let pending = self.path_of(subtask, PartKind::Pending, seq);
        let committed = self.path_of(subtask, PartKind::Final, seq);
        match std::fs::rename(&pending, &committed) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if committed.is_file() {
                    return Ok(());
                }
                let of = checkpoint.map_or_else(String::new, |c| format!(" of checkpoint {c}"));
                Err(Self::io(
                    ctx,
                    "cannot commit",
                    pending,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!(
                            "neither this pending part nor the committed part `{}` exists: the \
                             output{of} would be lost",
                            committed.display()
                        ),
                    ),
                ))
            }
            Err(e) => Err(Self::io(ctx, "cannot commit", pending, e)),
        }
    }

    /// Makes renames in the directory durable.
    fn sync_dir(&self, ctx: &OperatorContext) -> Result<()> {
        #[cfg(unix)]
        {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Self::io(ctx, "cannot sync", self.dir.clone(), e))?;
        }
        #[cfg(not(unix))]
        let _ = ctx;
        Ok(())
    }

    /// This sink's part files in the directory, as `(kind, subtask, seq, path)`.
    fn list_parts(&self, ctx: &OperatorContext) -> Result<Vec<(PartKind, u32, u64, PathBuf)>> {
        let read = |e| Self::io(ctx, "cannot list", self.dir.clone(), e);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(read)? {
            let entry = entry.map_err(read)?;
            if !entry.file_type().map_err(read)?.is_file() {
                continue;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if let Some((kind, subtask, seq)) = parse_part_name(name, &self.prefix, self.ext) {
                out.push((kind, subtask, seq, entry.path()));
            }
        }
        out.sort_by_key(|p| (p.1, p.2));
        Ok(out)
    }

    fn remove(ctx: &OperatorContext, path: &Path) -> Result<()> {
        match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Self::io(ctx, "cannot remove", path.to_path_buf(), e)),
        }
    }

    /// Decodes and version-checks a snapshot.
    fn decode_state(bytes: &[u8], ctx: &OperatorContext) -> Result<FileSinkState> {
        let state: FileSinkState = crate::record::decode(bytes).map_err(|e| {
            RunError::StateCorrupt(format!(
                "sink `{}`: malformed file sink state: {e}",
                ctx.operator
            ))
        })?;
        if state.version == 0 || state.version > FileSinkState::VERSION {
            return Err(RunError::StateMismatch(format!(
                "sink `{}`: file sink state version {} is not supported (this build reads \
                 versions 1 to {})",
                ctx.operator,
                state.version,
                FileSinkState::VERSION
            )));
        }
        Ok(state)
    }

    /// Warns when the checkpoint mode changed since the snapshot.
    fn warn_mode_change(&self, state: &FileSinkState, ctx: &OperatorContext) {
        if state.two_phase != self.two_phase {
            tracing::warn!(
                pipeline = %ctx.pipeline,
                sink = %ctx.operator,
                checkpoint = %crate::base::human::Maybe::or(ctx.restored_from, "none"),
                "The checkpoint mode changed since the checkpoint; output around it may be duplicated."
            );
        }
    }

    /// Reconciles the directory with `states` (each the snapshot of the subtask number its
    /// parts carry) for every part name `n` that `owns(n)` (see the module docs): commits the
    /// snapshots' pending parts, removes hidden parts, and (two-phase) removes final parts a
    /// snapshot says were written after it. Names without a snapshot keep their final parts.
    /// Then numbers on after every part of this subtask and resets the writer.
    fn reconcile(
        &mut self,
        states: &[(u32, FileSinkState)],
        owns: impl Fn(u32) -> bool,
        ctx: &OperatorContext,
    ) -> Result<()> {
        for (name, state) in states {
            self.warn_mode_change(state, ctx);
            let mut pending = state.pending.clone();
            pending.sort_by_key(|p| p.seq);
            for p in &pending {
                self.commit_of(*name, p.seq, Some(p.checkpoint), ctx)?;
            }
        }
        let snapshot_of = |n: u32| states.iter().find(|(name, _)| *name == n).map(|(_, s)| s);
        let mut next_seq = snapshot_of(self.subtask).map_or(0, |s| s.next_seq);
        for (kind, subtask, seq, path) in self.list_parts(ctx)? {
            if !owns(subtask) {
                continue;
            }
            let state = snapshot_of(subtask);
            match kind {
                PartKind::InProgress | PartKind::Pending => Self::remove(ctx, &path)?,
                // Finished after the checkpoint: the sources replay its records.
                PartKind::Final if state.is_some_and(|s| seq >= s.next_seq) => {
                    Self::remove(ctx, &path)?;
                }
                PartKind::Final => {
                    if state
                        .is_some_and(|s| s.wrote_final_parts_directly() && seq + 1 == s.next_seq)
                    {
                        cut_torn_tail(&path, ctx)?;
                    }
                    // Committed output: kept, and this subtask numbers on after its own.
                    if subtask == self.subtask {
                        next_seq = next_seq.max(seq + 1);
                    }
                }
            }
        }
        self.sync_dir(ctx)?;
        self.next_seq = next_seq;
        self.current = None;
        self.rolled.clear();
        self.pending.clear();
        self.ended = false;
        self.buf.clear();
        self.writer = RecordWriter::new(self.csv);
        Ok(())
    }

    /// A fresh start: removes this subtask's parts (final and hidden) left by an earlier run;
    /// subtask 0 also removes those of subtasks at or beyond the parallelism.
    fn clear_for_fresh_start(&mut self, ctx: &OperatorContext) -> Result<()> {
        let parallelism = ctx.parallelism.max(1);
        for (_, subtask, _, path) in self.list_parts(ctx)? {
            if subtask == self.subtask || (self.subtask == 0 && subtask >= parallelism) {
                Self::remove(ctx, &path)?;
            }
        }
        self.next_seq = 0;
        self.rolled.clear();
        self.pending.clear();
        Ok(())
    }
}

impl Operator for FileSink {
    /// Creates the directory; on a fresh start (`ctx.restored_from` is `None`) clears this
    /// subtask's old parts. When restoring, nothing is deleted here: `restore` reconciles.
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Self::io(ctx, "cannot create", self.dir.clone(), e))?;
        if ctx.restored_from.is_none() {
            self.clear_for_fresh_start(ctx)?;
        }
        Ok(())
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        for r in batch.records.drain(..) {
            self.writer.write(&mut self.buf, &r);
        }
        batch.keys.clear();
        if self.buf.len() >= 1 << 16 || self.max_part_size.is_some() {
            self.flush_buf(ctx)?;
        }
        Ok(())
    }

    /// Closes the current part. Two-phase: to pending, tagging the parts closed since the last
    /// barrier with `checkpoint`, and returns `{version, next_seq, pending}`. Otherwise: the
    /// part is finished (records before the barrier are durable and visible, whole) and it
    /// returns `{version, next_seq}`.
    fn snapshot(&mut self, checkpoint: u64, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        self.flush_buf(ctx)?;
        let closed = self.close_part(ctx)?;
        if self.two_phase {
            if !self.rolled.is_empty() {
                self.sync_dir(ctx)?;
            }
            self.pending.extend(
                self.rolled
                    .drain(..)
                    .map(|seq| PendingPart { checkpoint, seq }),
            );
        } else if closed {
            self.sync_dir(ctx)?;
        }
        let state = FileSinkState {
            version: FileSinkState::VERSION,
            two_phase: self.two_phase,
            next_seq: self.next_seq,
            pending: self.pending.clone(),
            subtask: Some(self.subtask),
            parallelism: Some(ctx.parallelism),
        };
        crate::record::encode(&state).map(Some).map_err(|e| {
            RunError::State(format!(
                "sink `{}`: cannot encode its state: {e}",
                ctx.operator
            ))
        })
    }

    /// Two-phase: commits every pending part tagged `<= checkpoint`.
    fn notify_checkpoint_complete(
        &mut self,
        checkpoint: u64,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if !self.two_phase {
            return Ok(());
        }
        let mut committed = false;
        while let Some(i) = self.pending.iter().position(|p| p.checkpoint <= checkpoint) {
            let p = self.pending[i];
            self.commit(p.seq, Some(p.checkpoint), ctx)?;
            self.pending.remove(i);
            committed = true;
        }
        if committed {
            self.sync_dir(ctx)?;
        }
        Ok(())
    }

    /// Reconciles the directory with the checkpoint (see the module docs). `None` (the sink
    /// is new since the checkpoint): a fresh start for this subtask.
    fn restore(&mut self, snapshot: Option<&[u8]>, ctx: &mut OperatorContext) -> Result<()> {
        let Some(bytes) = snapshot else {
            return self.clear_for_fresh_start(ctx);
        };
        let state = Self::decode_state(bytes, ctx)?;
        if let Some(taken_by) = state.subtask
            && taken_by != self.subtask
        {
            return Err(RunError::StateCorrupt(format!(
                "pipeline `{}`, sink `{}`: subtask {} was handed the snapshot of subtask \
                 {taken_by}; the checkpoint is inconsistent, restore from another one",
                ctx.pipeline, ctx.operator, self.subtask
            )));
        }
        let me = self.subtask;
        self.reconcile(&[(me, state)], |n| n == me, ctx)
    }

    /// Reconciles after a change of parallelism (see the module docs): settles the parts of
    /// every old subtask whose snapshot this one received, clears uncommitted leftovers of
    /// the part names it is responsible for, keeps every committed part without a snapshot,
    /// and writes on under its own number.
    ///
    /// # Errors
    /// A malformed or version 1 snapshot, one of an old subtask that does not map to this
    /// one, a pending part that is gone, or an I/O failure.
    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &mut OperatorContext) -> Result<()> {
        let parallelism = ctx.parallelism.max(1);
        let mut states: Vec<(u32, FileSinkState)> = Vec::with_capacity(snapshots.len());
        for bytes in snapshots {
            let state = Self::decode_state(bytes, ctx)?;
            let Some(old) = state.subtask else {
                return Err(RunError::StateMismatch(format!(
                    "pipeline `{}`, sink `{}`: the checkpoint's file sink state predates \
                     rescaling (format version {}, which does not record its subtask), so it \
                     cannot be restored at parallelism {parallelism}; restore it at its old \
                     parallelism, take a savepoint, and rescale from that",
                    ctx.pipeline, ctx.operator, state.version
                )));
            };
            if old % parallelism != self.subtask || states.iter().any(|(j, _)| *j == old) {
                return Err(RunError::State(format!(
                    "pipeline `{}`, sink `{}`: subtask {} of {parallelism} was handed the \
                     snapshot of old subtask {old} (old subtask j goes to j % {parallelism}, \
                     once); the savepoint is inconsistent, restore from another one",
                    ctx.pipeline, ctx.operator, self.subtask
                )));
            }
            states.push((old, state));
        }
        states.sort_by_key(|(j, _)| *j);
        let me = self.subtask;
        self.reconcile(&states, |n| n % parallelism == me, ctx)?;
        tracing::info!(
            pipeline = %ctx.pipeline,
            sink = %ctx.operator,
            subtask = me,
            parallelism,
            old_subtasks = ?states.iter().map(|(j, _)| *j).collect::<Vec<_>>(),
            next_seq = self.next_seq,
            "File sink reconciled the parts of earlier subtasks after a rescale."
        );
        Ok(())
    }

    /// The input ended: closes the current part; two-phase, also commits every pending part
    /// (the whole input is in them).
    fn on_end(&mut self, _out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        self.flush_buf(ctx)?;
        if self.close_part(ctx)? && !self.two_phase {
            self.sync_dir(ctx)?;
        }
        if self.two_phase {
            let mut seqs: Vec<(u64, Option<u64>)> = self
                .pending
                .iter()
                .map(|p| (p.seq, Some(p.checkpoint)))
                .chain(self.rolled.iter().map(|&s| (s, None)))
                .collect();
            seqs.sort_unstable();
            for (seq, checkpoint) in seqs {
                self.commit(seq, checkpoint, ctx)?;
            }
            self.pending.clear();
            self.rolled.clear();
            self.sync_dir(ctx)?;
        }
        self.ended = true;
        Ok(())
    }

    /// Flushes what is buffered. Two-phase without `on_end` (cancelled or failed): the
    /// in-progress part is flushed but stays uncommitted. Otherwise the part is finished.
    fn close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        self.flush_buf(ctx)?;
        if self.two_phase {
            if let Some(part) = self.current.as_mut() {
                part.file
                    .flush()
                    .map_err(|e| Self::io(ctx, "cannot write", part.path.clone(), e))?;
            }
        } else if self.close_part(ctx)? {
            self.sync_dir(ctx)?;
        }
        Ok(())
    }
}

/// A file sink snapshot with its fields named (for `weir inspect`): whether it committed in
/// two phases, the next part number, the parts pending a commit.
///
/// # Errors
/// A malformed snapshot.
pub fn describe_snapshot(bytes: &[u8]) -> Result<serde_json::Value> {
    let state: FileSinkState = crate::record::decode(bytes)
        .map_err(|e| RunError::StateCorrupt(format!("malformed file sink snapshot: {e}")))?;
    serde_json::to_value(&state)
        .map_err(|e| RunError::State(format!("cannot describe a file sink snapshot: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::Harness;

    fn records(range: std::ops::Range<i64>) -> Batch {
        Batch::new(
            range
                .map(|i| {
                    crate::record::parse_json(format!("{{\"i\":{i}}}").as_bytes()).expect("json")
                })
                .collect(),
        )
    }

    fn sink(dir: &Path, two_phase: bool, max: Option<u64>) -> Box<dyn Operator> {
        Box::new(
            FileSink::new(dir.to_path_buf(), "part".into(), false, max, 0)
                .two_phase_commit(two_phase),
        )
    }

    fn ctx(restored_from: Option<u64>) -> OperatorContext {
        let mut c = OperatorContext::standalone("p", "out", 128);
        c.restored_from = restored_from;
        c
    }

    /// The committed records, parts in `(subtask, seq)` order.
    fn visible(dir: &Path) -> Vec<i64> {
        let mut parts: Vec<(u32, u64, PathBuf)> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry"))
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                match parse_part_name(&name, "part", "jsonl") {
                    Some((PartKind::Final, s, q)) => Some((s, q, e.path())),
                    _ => None,
                }
            })
            .collect();
        parts.sort();
        let mut out = Vec::new();
        for (_, _, p) in parts {
            let text = std::fs::read_to_string(p).expect("read");
            for line in text.lines() {
                let r = crate::record::parse_json(line.as_bytes()).expect("json");
                out.push(r.as_map_ref().expect("map")["i"].as_int().expect("int"));
            }
        }
        out
    }

    fn hidden(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn part_names_parse() {
        assert_eq!(
            parse_part_name("my-out-3-12.jsonl", "my-out", "jsonl"),
            Some((PartKind::Final, 3, 12))
        );
        assert_eq!(
            parse_part_name(".part-0-1.csv.pending", "part", "csv"),
            Some((PartKind::Pending, 0, 1))
        );
        assert_eq!(
            parse_part_name(".part-2-0.csv.inprogress", "part", "csv"),
            Some((PartKind::InProgress, 2, 0))
        );
        assert_eq!(parse_part_name("part-0-1.csv", "part", "jsonl"), None);
        assert_eq!(parse_part_name("part-0-1-2.jsonl", "part", "jsonl"), None);
        assert_eq!(parse_part_name(".part-0-1.jsonl", "part", "jsonl"), None);
        assert_eq!(parse_part_name("part-x-1.jsonl", "part", "jsonl"), None);
    }

    #[test]
    fn nothing_is_visible_before_the_checkpoint_completes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut h = Harness::new(sink(&out, true, None), ctx(None)).expect("open");
        h.push(records(0..10)).expect("push");
        assert!(visible(&out).is_empty());
        h.operator.snapshot(1, &mut h.ctx).expect("snapshot");
        assert!(visible(&out).is_empty());
        assert_eq!(hidden(&out), [".part-0-0.jsonl.pending"]);
        h.push(records(10..15)).expect("push");
        h.operator
            .notify_checkpoint_complete(1, &mut h.ctx)
            .expect("commit");
        assert_eq!(visible(&out), (0..10).collect::<Vec<_>>());
        // Completing an older or the same checkpoint again changes nothing.
        h.operator
            .notify_checkpoint_complete(1, &mut h.ctx)
            .expect("commit");
        h.finish().expect("finish");
        assert_eq!(visible(&out), (0..15).collect::<Vec<_>>());
        assert!(hidden(&out).is_empty());
    }

    #[test]
    fn rolled_parts_wait_for_the_next_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut h = Harness::new(sink(&out, true, Some(30)), ctx(None)).expect("open");
        for i in 0..6 {
            h.push(records(i * 4..i * 4 + 4)).expect("push");
        }
        assert!(hidden(&out).len() > 2, "{:?}", hidden(&out));
        assert!(visible(&out).is_empty());
        h.operator.snapshot(7, &mut h.ctx).expect("snapshot");
        h.operator
            .notify_checkpoint_complete(6, &mut h.ctx)
            .expect("commit");
        assert!(visible(&out).is_empty(), "tagged 7, not committed by 6");
        h.operator
            .notify_checkpoint_complete(7, &mut h.ctx)
            .expect("commit");
        assert_eq!(visible(&out), (0..24).collect::<Vec<_>>());
        assert!(hidden(&out).is_empty());
    }

    /// Runs to a crash: checkpoint 1 (completed) over 0..10, checkpoint 2 (snapshotted, not
    /// completed) over 10..20, then 20..30 in progress. Returns the two snapshots.
    fn run_until_crash(out: &Path) -> (Vec<u8>, Vec<u8>) {
        let mut h = Harness::new(sink(out, true, None), ctx(None)).expect("open");
        h.push(records(0..10)).expect("push");
        let s1 = h
            .operator
            .snapshot(1, &mut h.ctx)
            .expect("snapshot")
            .expect("state");
        h.operator
            .notify_checkpoint_complete(1, &mut h.ctx)
            .expect("commit");
        h.push(records(10..20)).expect("push");
        let s2 = h
            .operator
            .snapshot(2, &mut h.ctx)
            .expect("snapshot")
            .expect("state");
        h.push(records(20..30)).expect("push");
        h.operator
            .snapshot(3, &mut h.ctx)
            .expect("snapshot never acknowledged");
        h.push(records(30..35)).expect("push");
        drop(h); // Crash: no close.
        (s1, s2)
    }

    #[test]
    fn crash_then_restore_keeps_exactly_the_checkpointed_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let (_, s2) = run_until_crash(&out);
        assert_eq!(visible(&out), (0..10).collect::<Vec<_>>());

        let mut h = Harness::new(sink(&out, true, None), ctx(Some(2))).expect("open");
        assert_eq!(
            visible(&out),
            (0..10).collect::<Vec<_>>(),
            "open deletes nothing"
        );
        h.operator.restore(Some(&s2), &mut h.ctx).expect("restore");
        assert_eq!(visible(&out), (0..20).collect::<Vec<_>>());
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));

        // A second crash right away and the same restore again: idempotent.
        drop(h);
        let mut h = Harness::new(sink(&out, true, None), ctx(Some(2))).expect("open");
        h.operator
            .restore(Some(&s2), &mut h.ctx)
            .expect("restore again");
        assert_eq!(visible(&out), (0..20).collect::<Vec<_>>());

        // The replayed input goes on after the checkpoint and the run ends.
        h.push(records(20..35)).expect("push");
        h.finish().expect("finish");
        assert_eq!(visible(&out), (0..35).collect::<Vec<_>>());
        assert!(hidden(&out).is_empty());
    }

    #[test]
    fn restore_removes_parts_written_after_the_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let (s1, s2) = run_until_crash(&out);
        // Restore from 2 and run to the end (commits part 2 at the end of input).
        let mut h = Harness::new(sink(&out, true, None), ctx(Some(2))).expect("open");
        h.operator.restore(Some(&s2), &mut h.ctx).expect("restore");
        h.push(records(20..35)).expect("push");
        h.finish().expect("finish");
        assert_eq!(visible(&out), (0..35).collect::<Vec<_>>());

        // A later restore from 2 again (say the run crashed after its end-of-input commit):
        // the final part numbered >= next_seq goes.
        let mut h = Harness::new(sink(&out, true, None), ctx(Some(2))).expect("open");
        h.operator.restore(Some(&s2), &mut h.ctx).expect("restore");
        assert_eq!(visible(&out), (0..20).collect::<Vec<_>>());
        drop(h);

        // An older checkpoint: everything after it goes.
        let mut h = Harness::new(sink(&out, true, None), ctx(Some(1))).expect("open");
        h.operator.restore(Some(&s1), &mut h.ctx).expect("restore");
        assert_eq!(visible(&out), (0..10).collect::<Vec<_>>());
        h.push(records(10..12)).expect("push");
        h.finish().expect("finish");
        assert_eq!(visible(&out), (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn restore_fails_when_a_pending_part_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let (_, s2) = run_until_crash(&out);
        std::fs::remove_file(out.join(".part-0-1.jsonl.pending")).expect("remove");
        let mut h = Harness::new(sink(&out, true, None), ctx(Some(2))).expect("open");
        let err = h
            .operator
            .restore(Some(&s2), &mut h.ctx)
            .expect_err("lost output");
        let msg = err.to_string();
        assert!(msg.contains(".part-0-1.jsonl.pending"), "{msg}");
        assert!(msg.contains("checkpoint 2"), "{msg}");
        assert!(h.operator.restore(Some(b"junk"), &mut h.ctx).is_err());
    }

    #[test]
    fn close_without_end_leaves_the_part_uncommitted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut h = Harness::new(sink(&out, true, None), ctx(None)).expect("open");
        h.push(records(0..3)).expect("push");
        h.operator.close(&mut h.ctx).expect("close");
        assert!(visible(&out).is_empty());
        assert_eq!(hidden(&out), [".part-0-0.jsonl.inprogress"]);
        let text = std::fs::read_to_string(out.join(".part-0-0.jsonl.inprogress")).expect("read");
        assert_eq!(text.lines().count(), 3, "flushed");
    }

    #[test]
    fn fresh_start_clears_old_parts_and_restore_none_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).expect("mkdir");
        for name in [
            "part-0-0.jsonl",
            ".part-0-1.jsonl.pending",
            ".part-0-2.jsonl.inprogress",
            "part-1-0.jsonl",
            "part-5-0.jsonl",
            "other.txt",
        ] {
            std::fs::write(out.join(name), "{\"i\":99}\n").expect("write");
        }
        let mut c = ctx(None);
        c.parallelism = 2;
        let h = Harness::new(sink(&out, true, None), c).expect("open");
        drop(h);
        let mut left: Vec<String> = std::fs::read_dir(&out)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["other.txt", "part-1-0.jsonl"]);

        std::fs::write(out.join("part-0-0.jsonl"), "{\"i\":99}\n").expect("write");
        let mut c = ctx(Some(4));
        c.parallelism = 2;
        let mut h = Harness::new(sink(&out, true, None), c).expect("open");
        assert_eq!(visible(&out), [99, 99]);
        h.operator.restore(None, &mut h.ctx).expect("restore none");
        assert_eq!(visible(&out), [99], "only subtask 1's part is left");
    }

    /// Every line of every visible part parses as a record.
    fn assert_whole_lines(dir: &Path) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let text = std::fs::read_to_string(e.path()).expect("read");
            assert!(text.is_empty() || text.ends_with('\n'), "{name}: {text:?}");
            for line in text.lines() {
                assert!(
                    crate::record::parse_json(line.as_bytes()).is_ok(),
                    "{name}: torn line {line:?}"
                );
            }
        }
    }

    /// Appends half a record to the hidden in-progress part `seq` (creating it, as the first
    /// write of a part would): a write cut off by a crash.
    fn tear(dir: &Path, seq: u64) {
        let path = dir.join(format!(".part-0-{seq}.jsonl.inprogress"));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open the part in progress");
        f.write_all(b"{\"count\":58,\"k").expect("append");
    }

    #[test]
    fn at_least_once_finishes_parts_at_barriers_and_a_restore_cuts_back_to_the_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut h = Harness::new(sink(&out, false, None), ctx(None)).expect("open");
        h.push(records(0..5)).expect("push");
        assert!(visible(&out).is_empty(), "in progress until the barrier");
        let s1 = h
            .operator
            .snapshot(1, &mut h.ctx)
            .expect("snapshot")
            .expect("state");
        assert_eq!(
            visible(&out),
            (0..5).collect::<Vec<_>>(),
            "finished at the barrier"
        );
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));
        h.push(records(5..8)).expect("push");
        h.operator.snapshot(2, &mut h.ctx).expect("snapshot");
        h.push(records(8..10)).expect("push");
        tear(&out, 2);
        drop(h); // Crash in the middle of a write; checkpoint 2 never completed.
        assert_eq!(visible(&out), (0..8).collect::<Vec<_>>());
        assert_whole_lines(&out);

        let mut h = Harness::new(sink(&out, false, None), ctx(Some(1))).expect("open");
        h.operator.restore(Some(&s1), &mut h.ctx).expect("restore");
        assert_eq!(
            visible(&out),
            (0..5).collect::<Vec<_>>(),
            "parts finished after checkpoint 1 go: their records are replayed"
        );
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));
        h.push(records(5..10)).expect("push");
        h.finish().expect("finish");
        assert_eq!(visible(&out), (0..10).collect::<Vec<_>>());
        assert_whole_lines(&out);
    }

    #[test]
    fn without_checkpoints_a_part_is_visible_once_finished_and_a_crash_shows_no_torn_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        // Rolling at 30 bytes: each part holds four or so records.
        let mut h = Harness::new(sink(&out, false, Some(30)), ctx(None)).expect("open");
        for i in 0..5 {
            h.push(records(i * 2..i * 2 + 2)).expect("push");
        }
        h.push(records(10..11)).expect("push");
        let rolled = visible(&out);
        assert!(!rolled.is_empty(), "rolled parts are finished");
        assert!(rolled.len() < 11, "the last part is in progress");
        assert_eq!(rolled, (0..rolled.len() as i64).collect::<Vec<_>>());
        let current = hidden(&out);
        assert_eq!(current.len(), 1, "{current:?}");
        let seq: u64 = current[0]
            .trim_start_matches(".part-0-")
            .trim_end_matches(".jsonl.inprogress")
            .parse()
            .expect("seq");
        tear(&out, seq);
        drop(h); // SIGKILL: no close.
        assert_whole_lines(&out);
        assert_eq!(visible(&out), rolled, "the torn part stays hidden");

        // The next start (always fresh without checkpoints) clears the subtask's parts.
        let mut h = Harness::new(sink(&out, false, None), ctx(None)).expect("open");
        assert!(visible(&out).is_empty() && hidden(&out).is_empty());
        h.push(records(0..3)).expect("push");
        h.operator
            .close(&mut h.ctx)
            .expect("a stop finishes the part");
        assert_eq!(visible(&out), [0, 1, 2]);
        assert!(hidden(&out).is_empty());
    }

    #[test]
    fn an_old_direct_snapshot_has_the_torn_tail_of_its_last_part_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).expect("mkdir");
        // What an older build left: part 0 written directly, torn by a kill; part 1 after
        // the checkpoint.
        std::fs::write(
            out.join("part-0-0.jsonl"),
            "{\"i\":0}\n{\"i\":1}\n{\"count\":58,\"k",
        )
        .expect("write");
        std::fs::write(out.join("part-0-1.jsonl"), "{\"i\":2}\n").expect("write");
        let v2 = crate::record::encode(&FileSinkState {
            version: 2,
            two_phase: false,
            next_seq: 1,
            pending: Vec::new(),
            subtask: Some(0),
            parallelism: Some(1),
        })
        .expect("encode");
        let mut h = Harness::new(sink(&out, false, None), ctx(Some(7))).expect("open");
        h.operator.restore(Some(&v2), &mut h.ctx).expect("restore");
        assert_eq!(visible(&out), [0, 1]);
        assert_whole_lines(&out);
        h.push(records(2..4)).expect("push");
        h.finish().expect("finish");
        assert_eq!(visible(&out), [0, 1, 2, 3]);

        // A part made of one torn line only is cut to nothing.
        let path = dir.path().join("torn");
        std::fs::write(&path, "{\"half").expect("write");
        cut_torn_tail(&path, &ctx(None)).expect("cut");
        assert_eq!(std::fs::read(&path).expect("read"), b"");
    }

    #[test]
    fn csv_parts_each_have_a_header() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let s = FileSink::new(out.clone(), "part".into(), true, None, 0).two_phase_commit(true);
        let mut h = Harness::new(Box::new(s), ctx(None)).expect("open");
        h.push(records(0..2)).expect("push");
        h.operator.snapshot(1, &mut h.ctx).expect("snapshot");
        h.push(records(2..3)).expect("push");
        h.finish().expect("finish");
        assert_eq!(
            std::fs::read_to_string(out.join("part-0-0.csv")).expect("read"),
            "i\n0\n1\n"
        );
        assert_eq!(
            std::fs::read_to_string(out.join("part-0-1.csv")).expect("read"),
            "i\n2\n"
        );
    }

    /// Subtask `s` of `p`, two-phase, restored from `restored_from` (or fresh).
    fn harness_at(out: &Path, s: u32, p: u32, restored_from: Option<u64>) -> Harness {
        let op =
            FileSink::new(out.to_path_buf(), "part".into(), false, None, s).two_phase_commit(true);
        let mut c = ctx(restored_from);
        c.subtask = s;
        c.parallelism = p;
        Harness::new(Box::new(op), c).expect("open")
    }

    /// `p` subtasks restored from the snapshots of the old subtasks (indexed by old subtask),
    /// each given its share as the runtime does (`j % p == s`, in old-subtask order).
    fn rescaled(out: &Path, snaps: &[Vec<u8>], p: u32, from: u64) -> Vec<Harness> {
        (0..p)
            .map(|s| {
                let mut h = harness_at(out, s, p, Some(from));
                let share: Vec<&[u8]> = snaps
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j as u32 % p == s)
                    .map(|(_, b)| b.as_slice())
                    .collect();
                h.operator
                    .restore_rescaled(&share, &mut h.ctx)
                    .expect("rescaled restore");
                h
            })
            .collect()
    }

    fn snapshot_all(hs: &mut [Harness], checkpoint: u64) -> Vec<Vec<u8>> {
        hs.iter_mut()
            .map(|h| {
                h.operator
                    .snapshot(checkpoint, &mut h.ctx)
                    .expect("snapshot")
                    .expect("state")
            })
            .collect()
    }

    fn complete_all(hs: &mut [Harness], checkpoint: u64) {
        for h in hs {
            h.operator
                .notify_checkpoint_complete(checkpoint, &mut h.ctx)
                .expect("commit");
        }
    }

    /// Pushes `range` dealt round-robin over the subtasks, in small batches.
    fn push_spread(hs: &mut [Harness], range: std::ops::Range<i64>) {
        let n = hs.len() as i64;
        for i in range {
            let h = &mut hs[usize::try_from(i % n).expect("index")];
            h.push(records(i..i + 1)).expect("push");
        }
    }

    fn sorted(mut v: Vec<i64>) -> Vec<i64> {
        v.sort_unstable();
        v
    }

    #[test]
    fn rescale_from_3_to_2_keeps_the_savepoint_and_goes_on_exactly_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut hs: Vec<Harness> = (0..3).map(|s| harness_at(&out, s, 3, None)).collect();
        push_spread(&mut hs, 0..30);
        snapshot_all(&mut hs, 1);
        complete_all(&mut hs, 1);
        push_spread(&mut hs, 30..60);
        let savepoint = snapshot_all(&mut hs, 2); // Pending, never completed.
        push_spread(&mut hs, 60..90);
        // Subtask 2 even committed a part after the savepoint (a later checkpoint).
        let late = &mut hs[2];
        late.operator.snapshot(3, &mut late.ctx).expect("snapshot");
        late.operator
            .notify_checkpoint_complete(3, &mut late.ctx)
            .expect("commit");
        push_spread(&mut hs, 90..99);
        drop(hs); // Crash.
        assert!(
            visible(&out).len() > 30,
            "a part was committed after the savepoint"
        );

        let mut hs = rescaled(&out, &savepoint, 2, 2);
        assert_eq!(sorted(visible(&out)), (0..60).collect::<Vec<_>>());
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));
        // The replayed input after the savepoint, then more.
        push_spread(&mut hs, 60..120);
        snapshot_all(&mut hs, 4);
        complete_all(&mut hs, 4);
        push_spread(&mut hs, 120..130);
        for h in &mut hs {
            h.finish().expect("finish");
        }
        assert_eq!(sorted(visible(&out)), (0..130).collect::<Vec<_>>());
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));
    }

    #[test]
    fn rescale_from_1_to_3_to_2_is_exactly_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut hs = vec![harness_at(&out, 0, 1, None)];
        push_spread(&mut hs, 0..10);
        snapshot_all(&mut hs, 1);
        complete_all(&mut hs, 1);
        push_spread(&mut hs, 10..20);
        let first = snapshot_all(&mut hs, 2);
        push_spread(&mut hs, 20..25);
        drop(hs);

        let mut hs = rescaled(&out, &first, 3, 2);
        assert_eq!(sorted(visible(&out)), (0..20).collect::<Vec<_>>());
        push_spread(&mut hs, 20..40);
        snapshot_all(&mut hs, 3);
        complete_all(&mut hs, 3);
        assert_eq!(sorted(visible(&out)), (0..40).collect::<Vec<_>>());
        push_spread(&mut hs, 40..50);
        let second = snapshot_all(&mut hs, 4);
        push_spread(&mut hs, 50..55);
        drop(hs);

        let mut hs = rescaled(&out, &second, 2, 4);
        assert_eq!(sorted(visible(&out)), (0..50).collect::<Vec<_>>());
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));
        push_spread(&mut hs, 50..60);
        for h in &mut hs {
            h.finish().expect("finish");
        }
        assert_eq!(sorted(visible(&out)), (0..60).collect::<Vec<_>>());
    }

    #[test]
    fn scale_up_never_deletes_committed_parts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut hs: Vec<Harness> = (0..3).map(|s| harness_at(&out, s, 3, None)).collect();
        push_spread(&mut hs, 0..30);
        let at3 = snapshot_all(&mut hs, 1);
        complete_all(&mut hs, 1);
        drop(hs);
        // Committed output of a long-gone run at parallelism 6, and an uncommitted leftover.
        std::fs::write(out.join("part-5-0.jsonl"), "{\"i\":1000}\n").expect("write");
        std::fs::write(out.join(".part-2-7.jsonl.inprogress"), "{\"i\":-1}\n").expect("write");

        // 3 -> 2: subtask 0 settles names 0 and 2, subtask 1 names 1 (and 5's final stays).
        let mut hs = rescaled(&out, &at3, 2, 1);
        let mut expected: Vec<i64> = (0..30).chain([1000]).collect();
        assert_eq!(sorted(visible(&out)), expected);
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));
        push_spread(&mut hs, 30..40);
        let at2 = snapshot_all(&mut hs, 2);
        complete_all(&mut hs, 2);
        drop(hs);
        expected.extend(30..40);
        std::fs::write(out.join(".part-2-9.jsonl.pending"), "{\"i\":-2}\n").expect("write");

        // 2 -> 3: subtask 2 gets no snapshot; the parts named 2 (and 5) are committed output.
        let mut hs = rescaled(&out, &at2, 3, 2);
        assert_eq!(sorted(visible(&out)), sorted(expected.clone()));
        assert!(hidden(&out).is_empty(), "{:?}", hidden(&out));
        push_spread(&mut hs, 40..61);
        for h in &mut hs {
            h.finish().expect("finish");
        }
        expected.extend(40..61);
        assert_eq!(sorted(visible(&out)), sorted(expected));
        assert!(out.join("part-2-0.jsonl").is_file(), "kept");
    }

    #[test]
    fn rescaled_restore_refuses_foreign_and_old_snapshots() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut hs: Vec<Harness> = (0..2).map(|s| harness_at(&out, s, 2, None)).collect();
        push_spread(&mut hs, 0..4);
        let snaps = snapshot_all(&mut hs, 1);
        drop(hs);
        let mut h = harness_at(&out, 0, 3, Some(1));
        let err = h
            .operator
            .restore_rescaled(&[snaps[1].as_slice()], &mut h.ctx)
            .expect_err("old subtask 1 goes to new subtask 1");
        assert!(err.to_string().contains("old subtask 1"), "{err}");

        #[derive(Serialize)]
        struct V1 {
            version: u32,
            two_phase: bool,
            next_seq: u64,
            pending: Vec<PendingPart>,
        }
        let v1 = crate::record::encode(&V1 {
            version: 1,
            two_phase: true,
            next_seq: 0,
            pending: Vec::new(),
        })
        .expect("encode");
        let err = h
            .operator
            .restore_rescaled(&[v1.as_slice()], &mut h.ctx)
            .expect_err("version 1");
        assert!(err.to_string().contains("old parallelism"), "{err}");
        let mut h = harness_at(&out, 0, 1, Some(1));
        h.operator
            .restore(Some(&v1), &mut h.ctx)
            .expect("version 1 still restores at its parallelism");
    }
}
