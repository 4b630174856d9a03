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
//! Without exactly-once (no checkpoints, or `at_least_once`), final parts are written directly;
//! the snapshot only fsyncs the current part and records `next_seq`, and a restore only goes on
//! numbering after every existing part: committed output is never deleted.
//!
//! This module writes only inside its sink directory and only files of its own prefix and
//! subtask (subtask 0 also clears subtasks beyond the parallelism on a fresh start).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rhai::Dynamic;
use serde::{Deserialize, Serialize};
use weir_schema::{CheckpointMode, CheckpointSpec};

use super::RecordWriter;
use crate::operators::{Operator, OperatorContext};
use crate::runtime::Batch;
use crate::runtime::error::{Result, RunError};

/// Whether a file sink in a pipeline with these checkpoint settings commits in two phases:
/// checkpoints enabled and `mode: exactly_once`.
pub fn uses_two_phase_commit(checkpoints: &CheckpointSpec) -> bool {
    checkpoints.enabled && checkpoints.mode == CheckpointMode::ExactlyOnce
}

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

/// A closed part awaiting the completion of `checkpoint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PendingPart {
    /// The checkpoint whose barrier closed the part (or the first after its roll).
    checkpoint: u64,
    /// The part's sequence number.
    seq: u64,
}

/// The sink's snapshot, format version [`FileSinkState::VERSION`] (MessagePack).
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
}

impl FileSinkState {
    const VERSION: u32 = 1;
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
    /// Two-phase commit (exactly-once checkpoints).
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
    /// A writer subtask into `dir` that writes final parts directly (no two-phase commit);
    /// see [`two_phase_commit`](Self::two_phase_commit).
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
        let name = format!("{}-{}-{seq}.{}", self.prefix, self.subtask, self.ext);
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
            let kind = if self.two_phase {
                PartKind::InProgress
            } else {
                PartKind::Final
            };
            let path = self.path(kind, seq);
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
            if self.max_part_size.is_some_and(|m| part.written >= m) {
                self.close_part(ctx)?;
            }
        }
        Ok(())
    }

    /// Closes the current part. Two-phase: flush, fsync and rename it to pending (untagged,
    /// in `rolled`). Otherwise: flush the final part.
    fn close_part(&mut self, ctx: &OperatorContext) -> Result<()> {
        let Some(mut part) = self.current.take() else {
            return Ok(());
        };
        self.writer = RecordWriter::new(self.csv);
        part.file
            .flush()
            .map_err(|e| Self::io(ctx, "cannot write", part.path.clone(), e))?;
        if !self.two_phase {
            return Ok(());
        }
        part.file
            .get_ref()
            .sync_all()
            .map_err(|e| Self::io(ctx, "cannot sync", part.path.clone(), e))?;
        drop(part.file);
        let pending = self.path(PartKind::Pending, part.seq);
        std::fs::rename(&part.path, &pending)
            .map_err(|e| Self::io(ctx, "cannot close", part.path.clone(), e))?;
        self.rolled.push(part.seq);
        Ok(())
    }

    /// Commits pending part `seq` (of `checkpoint`), idempotently: a part already committed is
    /// fine; a part that is neither pending nor committed is lost output, an error.
    fn commit(&self, seq: u64, checkpoint: Option<u64>, ctx: &OperatorContext) -> Result<()> {
        let pending = self.path(PartKind::Pending, seq);
        let committed = self.path(PartKind::Final, seq);
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

    /// Two-phase: closes the current part to pending, tags the parts closed since the last
    /// barrier with `checkpoint`, and returns `{version, next_seq, pending}`. Otherwise:
    /// fsyncs the current part (records before the barrier are durable) and returns
    /// `{version, next_seq}`.
    fn snapshot(&mut self, checkpoint: u64, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        self.flush_buf(ctx)?;
        if self.two_phase {
            self.close_part(ctx)?;
            if !self.rolled.is_empty() {
                self.sync_dir(ctx)?;
            }
            self.pending.extend(
                self.rolled
                    .drain(..)
                    .map(|seq| PendingPart { checkpoint, seq }),
            );
        } else if let Some(part) = self.current.as_mut() {
            part.file
                .flush()
                .and_then(|()| part.file.get_ref().sync_data())
                .map_err(|e| Self::io(ctx, "cannot sync", part.path.clone(), e))?;
        }
        let state = FileSinkState {
            version: FileSinkState::VERSION,
            two_phase: self.two_phase,
            next_seq: self.next_seq,
            pending: self.pending.clone(),
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
        let state: FileSinkState = crate::record::decode(bytes).map_err(|e| {
            RunError::State(format!(
                "sink `{}`: malformed file sink state: {e}",
                ctx.operator
            ))
        })?;
        if state.version != FileSinkState::VERSION {
            return Err(RunError::State(format!(
                "sink `{}`: file sink state version {} is not supported (this build reads \
                 version {})",
                ctx.operator,
                state.version,
                FileSinkState::VERSION
            )));
        }
        if state.two_phase != self.two_phase {
            tracing::warn!(
                pipeline = %ctx.pipeline,
                sink = %ctx.operator,
                checkpoint = ?ctx.restored_from,
                "The checkpoint mode changed since the checkpoint; output around it may be duplicated."
            );
        }
        let mut pending = state.pending.clone();
        pending.sort_by_key(|p| p.seq);
        for p in &pending {
            self.commit(p.seq, Some(p.checkpoint), ctx)?;
        }
        let mut next_seq = state.next_seq;
        for (kind, subtask, seq, path) in self.list_parts(ctx)? {
            if subtask != self.subtask {
                continue;
            }
            match kind {
                PartKind::InProgress | PartKind::Pending => Self::remove(ctx, &path)?,
                PartKind::Final if self.two_phase && seq >= state.next_seq => {
                    Self::remove(ctx, &path)?;
                }
                // At-least-once keeps committed output and numbers on after it.
                PartKind::Final => next_seq = next_seq.max(seq + 1),
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

    /// The input ended: two-phase, closes the current part and commits every pending part
    /// (the whole input is in them); otherwise flushes the final part.
    fn on_end(&mut self, _out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        self.flush_buf(ctx)?;
        self.close_part(ctx)?;
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
    /// in-progress part is flushed but stays uncommitted.
    fn close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        if self.two_phase && self.ended {
            return Ok(());
        }
        self.flush_buf(ctx)?;
        if self.two_phase {
            if let Some(part) = self.current.as_mut() {
                part.file
                    .flush()
                    .map_err(|e| Self::io(ctx, "cannot write", part.path.clone(), e))?;
            }
            Ok(())
        } else {
            self.close_part(ctx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::Harness;

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

    #[test]
    fn at_least_once_writes_directly_and_restore_keeps_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut h = Harness::new(sink(&out, false, None), ctx(None)).expect("open");
        h.push(records(0..5)).expect("push");
        let s1 = h
            .operator
            .snapshot(1, &mut h.ctx)
            .expect("snapshot")
            .expect("state");
        assert_eq!(
            visible(&out),
            (0..5).collect::<Vec<_>>(),
            "synced at the barrier"
        );
        h.push(records(5..8)).expect("push");
        h.operator.snapshot(2, &mut h.ctx).expect("snapshot");
        drop(h); // Crash; checkpoint 2 never completed.
        assert!(hidden(&out).is_empty());

        let mut h = Harness::new(sink(&out, false, None), ctx(Some(1))).expect("open");
        h.operator.restore(Some(&s1), &mut h.ctx).expect("restore");
        assert_eq!(visible(&out), (0..8).collect::<Vec<_>>(), "nothing deleted");
        h.push(records(5..8)).expect("push");
        h.finish().expect("finish");
        // Replayed records may appear twice; none is lost and nothing was overwritten.
        assert_eq!(visible(&out), [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7]);
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
}
