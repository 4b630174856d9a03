//! The `file` source and sink.
//!
//! Source: a file, a directory (its non-hidden files in name order) or a glob, read as jsonl,
//! csv or lines. With several readers, files are dealt out by index; when there are fewer
//! files than readers, large files are cut into byte ranges aligned to record starts, so one
//! big file is still read in parallel (a CSV record may span lines, since a quoted field may
//! hold newlines, so a CSV reader finds its first record by framing the file from its start,
//! without parsing; a jsonl or lines reader starts at the next line).
//!
//! How a file is cut depends on `event_time`. Without it, reader `s` of `p` takes the `s`-th
//! of `p` contiguous ranges. With it, the file is *striped*: cut into blocks of at least
//! [`STRIPE_BLOCK_BYTES`] (at most [`MAX_STRIPE_BLOCKS`] per reader), reader `s` reading
//! blocks `s, s + p, s + 2p, ...` in file order. A source's watermark is the minimum over its
//! readers, so with contiguous ranges a time-ordered file held every window the later ranges
//! opened until the first reader reached their times (half of the file's windows at once
//! with two readers); striped readers stay about a block apart in event time. A reader's
//! blocks of one file share one watermark clock ([`Split::clock`]): they are one split read
//! in order with gaps, so a block waiting in the reader's queue does not hold the watermark
//! at its minimum the way a queued file does. Readers of one file are paced to stay within a
//! round of blocks of each other ([`super::pacing`]). With `follow`, every
//! assigned file stays open, growth is picked up, and new matching files join. A byte-order
//! mark at the start of a file is skipped.
//!
//! Records that cannot be read go through the source's `on_error` ([`BadRecords`]) with the
//! file, the line the record starts on (counted from the file start, also in a cut split) and
//! its text.
//!
//! Replayable: a snapshot is the exact position of every split (the byte offset of the next
//! unread record, the number of the line before it, the CSV header, which splits are done;
//! a CSV record whose end is not written yet is read again from its start) and, in follow mode,
//! the files known so far. A restore seeks every split back to its offset, so the polls that
//! follow yield exactly the records that followed the snapshot, in the same order; the split
//! plan is the checkpoint's, not recomputed from today's file sizes.
//!
//! Identity: every file is known by its canonical path (absolute, symlinks resolved), never by
//! how `path:` spelled it or the working directory it was resolved in, so a reload that
//! resolves the pattern against an absolute directory, a run from another directory and a
//! symlink to the file all name the same split. A listing that reaches one file twice (a
//! symlink next to its target) reads it once. Each split also records the device and inode it
//! was read from: a restore that finds another file at the path (same device, other inode)
//! refuses, since the recorded offset belongs to the file that was replaced. A snapshot that
//! holds two positions for one split (written by builds before format version 3, which told
//! spellings of a path apart) restores when both positions agree, and is refused otherwise,
//! naming the file: which of the two is right cannot be known.
//!
//! Rescaling (a savepoint restored at another parallelism): the positions are list state.
//! Old reader `j`'s snapshot goes to new reader `j % p_new`, so the old readers' splits are
//! partitioned over the new readers and every new reader simply takes over, at their recorded
//! positions, the splits of the old readers it received. A reader that receives no snapshot
//! (one added by a scale-up) owns no split of the old run; without `follow` it finishes at
//! once. Files that appear after the restore are not read without `follow` (as on a plain
//! restore, the split plan is the checkpoint's).
//!
//! Follow-mode ownership, the rule that keeps discovery exactly-once across rescales: a file
//! belongs to reader `fnv1a(path) mod l_1 mod l_2 ... mod l_k mod p`, where `path` is the
//! canonical path (a run restored from a snapshot of format version 2 or older hashes the path
//! as listed, as the run that wrote it did, until the next fresh start), `p` is the current
//! parallelism and `l_1 > l_2 > ... > l_k` the *lineage*, the parallelisms of the
//! earlier runs this run descends from (empty on a fresh start: plain `hash mod p`). A
//! rescaled restore appends the old parallelism to the lineage (unless it cannot change the
//! result: `x mod l mod p_old = x mod l` when `l <= p_old`). Why this rule: only old reader
//! `j` knew which of its files it had already discovered (its snapshot's `known`), and that
//! snapshot goes to new reader `j % p_new` alone; so a file old reader `j` would own must go
//! to `j % p_new`, whether `j` had seen it or not, and no other reader may take it. Every
//! snapshot records its lineage; a reader added by a scale-up has none to inherit and owns no
//! file at all (lineage "none") until the next fresh start, which is correct because the rule
//! never maps a file to a reader at or beyond the smallest earlier parallelism. The price:
//! after a scale-up, new files keep going to the old readers only.
//!
//! The sink (two-phase commit) lives in [`super::file_sink`] and is re-exported here. This
//! module reads files and never writes them.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rhai::Dynamic;
use serde::{Deserialize, Serialize};
use weir_schema::SourceOnError;

use super::pacing::Pacing;
use super::{BadRecord, BadRecords, CsvFramer, Frame, LineParser, Poll, Source, SourceContext};
use crate::base::error::{Result, RunError};
use crate::base::message::BATCH_SIZE;

pub use super::file_sink::{FileSink, prepare_sink_dir};

/// Files smaller than this are never cut into ranges.
const MIN_SPLIT_BYTES: u64 = 1 << 20;

/// The smallest block of a striped file (see the module docs).
pub const STRIPE_BLOCK_BYTES: u64 = 1 << 18;

/// How long a striped reader a round ahead of the others waits before it looks again.
const PACING_WAIT: Duration = Duration::from_millis(1);

/// The most blocks one reader reads of a striped file; larger files get larger blocks, so a
/// snapshot lists a bounded number of splits.
pub const MAX_STRIPE_BLOCKS: u64 = 256;

/// Lists the files a `path:` names, sorted. A glob or directory with no match is empty.
///
/// # Errors
/// A glob that does not parse, or an unreadable directory.
pub fn list_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let text = path.to_string_lossy();
    if text.contains(['*', '?', '[']) {
        let paths = glob::glob(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut files: Vec<PathBuf> = paths
            .filter_map(std::result::Result::ok)
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        return Ok(files);
    }
    if path.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if !hidden && entry.file_type()?.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        return Ok(files);
    }
    Ok(vec![path.to_path_buf()])
}

/// The identity of a file (see the module docs): its canonical path; a path that does not
/// resolve (the file is gone) is only made absolute.
pub fn file_identity(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Where a file lives on its filesystem: device and inode (Unix only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The device and inode of `meta`, where the platform has them.
    fn of(meta: &std::fs::Metadata) -> Option<Self> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Some(Self {
                dev: meta.dev(),
                ino: meta.ino(),
            })
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            None
        }
    }

    /// Whether `now` is certainly another file than `self`: same device, other inode. On
    /// another device (the data moved with its savepoint) nothing can be told.
    fn replaced_by(self, now: Self) -> bool {
        self.dev == now.dev && self.ino != now.ino
    }
}

/// A byte range of one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The file.
    pub path: PathBuf,
    /// First byte (a line starting at or after it is ours).
    pub start: u64,
    /// Lines starting at or after this byte belong to the next split; `None` reads to the end.
    pub end: Option<u64>,
    /// The watermark clock this split shares with the reader's other blocks of a striped
    /// file (see the module docs); `None`: its own ([`Split::id`]). Absent from snapshots
    /// written before striping, which never striped.
    #[serde(default)]
    pub clock: Option<u64>,
}

impl Split {
    /// A stable number for the split (its path and first byte), as event-time watermarks
    /// per split know it across restores.
    pub fn id(&self) -> u64 {
        let mut h = crc32fast::Hasher::new();
        h.update(self.path.as_os_str().as_encoded_bytes());
        (u64::from(h.finalize()) << 32) ^ self.start
    }

    /// The watermark clock of the split: shared by a reader's blocks of a striped file,
    /// otherwise the split's own id.
    pub fn watermark_clock(&self) -> u64 {
        self.clock.unwrap_or_else(|| self.id())
    }

    /// A whole file.
    fn whole(path: PathBuf) -> Self {
        Self {
            path,
            start: 0,
            end: None,
            clock: None,
        }
    }
}

/// The splits of reader `subtask` out of `parallelism` for bounded reading; `striped` cuts
/// files in blocks dealt out in turn instead of contiguous ranges (see the module docs).
pub fn plan_splits(
    files: &[(PathBuf, u64)],
    parallelism: u32,
    subtask: u32,
    striped: bool,
) -> Vec<Split> {
    let p = u64::from(parallelism.max(1));
    let s = u64::from(subtask);
    let mut out = Vec::new();
    let cut = (files.len() as u64) < p;
    for (i, (path, len)) in files.iter().enumerate() {
        let len = *len;
        if cut && len >= MIN_SPLIT_BYTES && striped {
            let block = STRIPE_BLOCK_BYTES.max(len.div_ceil(p * MAX_STRIPE_BLOCKS));
            let blocks = len.div_ceil(block);
            let clock = Split {
                path: path.clone(),
                start: s * block,
                end: None,
                clock: None,
            }
            .id();
            let mut j = s;
            while j < blocks {
                let end = (j + 1) * block;
                out.push(Split {
                    path: path.clone(),
                    start: j * block,
                    end: (end < len).then_some(end),
                    clock: Some(clock),
                });
                j += p;
            }
        } else if cut && len >= MIN_SPLIT_BYTES {
            let start = s * len / p;
            let end = (s + 1) * len / p;
            out.push(Split {
                path: path.clone(),
                start,
                end: if s + 1 == p { None } else { Some(end) },
                clock: None,
            });
        } else if i as u64 % p == s {
            out.push(Split::whole(path.clone()));
        }
    }
    out
}

/// Where to pick a split up again: the next unread record (always a record's first byte, also
/// when a CSV record spanning lines was half read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Resume {
    /// Byte offset of the first byte of the next unread record.
    offset: u64,
    /// Number of the line before that record (so it starts on `line + 1`), when known: the
    /// split was read from the start of its file, or an error needed the number.
    line: Option<u64>,
    /// The file's CSV header line as read (with its newline), when the format has one.
    header: Option<Vec<u8>>,
}

/// How far one split has been read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Progress {
    /// Not opened yet.
    Unread,
    /// Opened; resume at this position.
    Reading(Resume),
    /// Read to its end (bounded mode only).
    Done,
}

impl Progress {
    /// Whether two entries for one split agree on where it stands (offset and CSV header; a
    /// line number only counts lines).
    fn same_position(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Unread, Self::Unread) | (Self::Done, Self::Done) => true,
            (Self::Reading(a), Self::Reading(b)) => a.offset == b.offset && a.header == b.header,
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Unread => "not started".into(),
            Self::Reading(r) => format!("at byte {}", r.offset),
            Self::Done => "read to its end".into(),
        }
    }
}

/// One split and its progress, in a [`FileSourceState`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SplitState {
    split: Split,
    progress: Progress,
    /// The device and inode the split was read from, once opened (absent before version 3).
    #[serde(default)]
    file: Option<FileId>,
}

/// What follow-mode ownership hashes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OwnerKey {
    /// The canonical path (runs that started with format version 3 or later).
    Canonical,
    /// The path as listed from the pattern (runs descending from older snapshots).
    Listed,
}

/// Snapshots before version 3 hashed the path as listed.
fn listed_owner_key() -> OwnerKey {
    OwnerKey::Listed
}

/// The file source's snapshot, format version [`FileSourceState::VERSION`] (MessagePack).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileSourceState {
    /// Format version.
    version: u32,
    /// The subtask and parallelism the snapshot was taken at.
    subtask: u32,
    parallelism: u32,
    /// Whether the source was following files.
    follow: bool,
    /// Every split assigned to this subtask, in reading order: done ones, the open ones, then
    /// the ones not started.
    splits: Vec<SplitState>,
    /// Follow mode: the files discovered so far (each has a split above).
    known: Vec<PathBuf>,
    /// The ownership lineage of follow mode (see the module docs); `None`: this reader owns
    /// no file it was not handed. Absent from version 1 snapshots, whose runs always used
    /// the plain rule (an empty lineage).
    #[serde(default = "fresh_lineage")]
    lineage: Option<Vec<u32>>,
    /// What follow-mode ownership hashes; absent before version 3 (the listed path).
    #[serde(default = "listed_owner_key")]
    owner_key: OwnerKey,
}

impl FileSourceState {
    /// Written by this build; versions 1 (no lineage) and 2 (paths as spelled, no file ids)
    /// are still read.
    const VERSION: u32 = 3;
}

/// The lineage of a run that started fresh: no earlier parallelism.
fn fresh_lineage() -> Option<Vec<u32>> {
    Some(Vec::new())
}

/// The lineage after a rescale from `old_parallelism`: `lineage` plus the old parallelism,
/// unless that cannot change any owner (it is not smaller than the last entry).
fn extend_lineage(mut lineage: Vec<u32>, old_parallelism: u32) -> Vec<u32> {
    let old = old_parallelism.max(1);
    if lineage.last().is_none_or(|&last| old < last) {
        lineage.push(old);
    }
    lineage
}

/// The follow-mode owner of `path` under `lineage` at `parallelism` (see the module docs).
fn follow_owner(path: &Path, lineage: &[u32], parallelism: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.to_string_lossy().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    for &l in lineage {
        h %= u64::from(l.max(1));
    }
    // The remainder is below `parallelism`, a `u32`.
    u32::try_from(h % u64::from(parallelism.max(1))).unwrap_or(u32::MAX)
}

/// A split waiting to be opened, fresh or resumed.
struct Queued {
    split: Split,
    resume: Option<Resume>,
    /// The file it was read from before (a restored split), to check it is still the same.
    file: Option<FileId>,
}

struct Reader {
    split: Split,
    reader: BufReader<File>,
    /// Offset of the next unread byte (past the part of a record kept in `buf`).
    pos: u64,
    /// Line number of the last whole line read, when known (reading from the file start).
    line: Option<u64>,
    /// The record being read: its whole lines so far, then a partial line (follow mode).
    buf: Vec<u8>,
    /// How many whole lines `buf` holds.
    lines_in_buf: u64,
    /// Where a CSV record ends (`None`: every line is a record).
    framer: Option<CsvFramer>,
    parser: LineParser,
    /// The CSV header line, when the format has one.
    header: Option<Vec<u8>>,
    /// The device and inode of the open file.
    file: Option<FileId>,
    done: bool,
}

impl Reader {
    /// The position to resume from: the start of the next unread (or partly read) record.
    fn resume(&self) -> Resume {
        Resume {
            offset: self.pos - self.buf.len() as u64,
            line: self.line.map(|l| l - self.lines_in_buf),
            header: self.header.clone(),
        }
    }

    /// The line the record in `buf` starts on, counted from the file start when this split
    /// did not (once; counting goes on from there).
    fn record_line(&mut self) -> u64 {
        let start = self.pos - self.buf.len() as u64;
        let before = match self.line {
            Some(l) => l - self.lines_in_buf,
            None => {
                let before = line_number_at(&self.split.path, start).map_or(0, |n| n - 1);
                self.line = Some(before + self.lines_in_buf);
                before
            }
        };
        before + 1
    }
}

/// The byte-order mark some writers (spreadsheets) put at the start of a text file.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Steps over a byte-order mark at the start of the file; returns the bytes skipped.
fn skip_bom(reader: &mut BufReader<File>) -> std::io::Result<u64> {
    if reader.fill_buf()?.starts_with(BOM) {
        reader.consume(BOM.len());
        return Ok(BOM.len() as u64);
    }
    Ok(0)
}

/// Reads one CSV record (the header) into `buf` with `framer`, stepping over blank lines
/// before it; returns the bytes and lines it took (blank lines included). A record left open by
/// a quote at the end of the file is taken as it is.
fn read_csv_record(
    reader: &mut BufReader<File>,
    framer: &mut CsvFramer,
    buf: &mut Vec<u8>,
) -> std::io::Result<(u64, u64)> {
    let (mut bytes, mut lines) = (0, 0);
    loop {
        let from = buf.len();
        let n = reader.read_until(b'\n', buf)?;
        if n == 0 {
            framer.reset();
            return Ok((bytes, lines));
        }
        bytes += n as u64;
        lines += 1;
        match framer.feed(&buf[from..]) {
            Frame::Open => {}
            Frame::Complete => return Ok((bytes, lines)),
            Frame::Blank => buf.truncate(from),
        }
    }
}

/// The `file` source, one reader subtask.
pub struct FileSource {
    pattern: PathBuf,
    parser: LineParser,
    bad: BadRecords,
    follow: bool,
    /// Follow mode: how long to wait after a poll that found nothing new.
    poll_interval: Duration,
    /// Whether a file cut among readers is striped (see the module docs).
    striped: bool,
    /// Keeps striped readers of one file together ([`Pacing`]); `None`: unpaced.
    pacing: Option<Pacing>,
    /// The file and first byte of the striped block this reader started last.
    last_block: Option<(PathBuf, u64)>,
    subtask: u32,
    parallelism: u32,
    pending: VecDeque<Queued>,
    active: Vec<Reader>,
    /// Splits read to their end (bounded mode), with the file they were read from.
    finished: Vec<(Split, Option<FileId>)>,
    /// Follow mode: the identities of the files discovered so far.
    known: BTreeSet<PathBuf>,
    /// Follow-mode ownership lineage (see the module docs); `None` owns no new file.
    lineage: Option<Vec<u32>>,
    /// What follow-mode ownership hashes.
    owner_key: OwnerKey,
    /// `(pipeline, source)` for errors raised outside a poll, from `open`.
    ids: (String, String),
}

fn io_err(
    ctx: &SourceContext,
    what: &'static str,
    path: &Path,
    source: std::io::Error,
) -> RunError {
    RunError::Io {
        pipeline: ctx.pipeline.clone(),
        element: ctx.source.clone(),
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The error for a split whose path now holds another file than the one it was read from.
fn replaced_error(was: FileId, now: FileId) -> std::io::Error {
    std::io::Error::other(format!(
        "another file is at this path now (inode {} on device {}, the checkpoint read inode {}): \
         the file was replaced (rotated or rewritten by rename) after the checkpoint, so its \
         recorded position is meaningless; put the original file back, or start over with \
         `--fresh`",
        now.ino, now.dev, was.ino
    ))
}

fn line_number_at(path: &Path, offset: u64) -> Option<u64> {
    let f = File::open(path).ok()?;
    let mut count = 1;
    let mut r = BufReader::with_capacity(1 << 16, f.take(offset));
    loop {
        let chunk = r.fill_buf().ok()?;
        if chunk.is_empty() {
            return Some(count);
        }
        count += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
        let n = chunk.len();
        r.consume(n);
    }
}

/// How long a following reader waits after a poll that found nothing new, unless the source
/// sets `poll_interval`.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

impl FileSource {
    /// Follow mode waits `interval` (at least 1ms) after a poll that found nothing new
    /// instead of [`DEFAULT_POLL_INTERVAL`].
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Cuts files striped instead of in contiguous ranges (see the module docs): set for
    /// sources that declare `event_time`.
    #[must_use]
    pub fn with_striping(mut self, striped: bool) -> Self {
        self.striped = striped;
        self
    }

    /// Paces this reader with the source's other readers (striped files only).
    #[must_use]
    pub fn with_pacing(mut self, pacing: Pacing) -> Self {
        self.pacing = Some(pacing);
        self
    }

    /// Whether the next queued split may start now: always, unless it is a striped block
    /// and this reader is a round ahead of another reader of that file ([`Pacing`]).
    fn may_start(&self, q: &Queued) -> bool {
        let (Some(pacing), Some(_), Some((path, last))) =
            (&self.pacing, q.split.clock, &self.last_block)
        else {
            return true;
        };
        if *path != q.split.path {
            return true;
        }
        let block = q
            .split
            .end
            .map_or(STRIPE_BLOCK_BYTES, |e| e.saturating_sub(q.split.start));
        let round = block.saturating_mul(u64::from(self.parallelism));
        pacing.may_start(path, self.subtask, self.parallelism, *last, round)
    }

    /// Tells the pacing that this reader starts striped block `split`.
    fn block_started(&mut self, split: &Split) {
        if let (Some(pacing), Some(_)) = (&self.pacing, split.clock) {
            pacing.started(&split.path, self.subtask, self.parallelism, split.start);
            self.last_block = Some((split.path.clone(), split.start));
        }
    }

    /// Tells the pacing when a finished striped block was this reader's last of its file.
    fn block_finished(&mut self, split: &Split) {
        if let (Some(pacing), Some(_)) = (&self.pacing, split.clock)
            && !self.pending.iter().any(|q| q.split.path == split.path)
        {
            pacing.finished(&split.path, self.subtask, self.parallelism);
        }
    }

    /// A reader subtask over `pattern` (already resolved against the pipeline directory).
    pub fn new(
        pattern: PathBuf,
        parser: LineParser,
        on_error: SourceOnError,
        follow: bool,
        subtask: u32,
        parallelism: u32,
    ) -> Self {
        Self {
            pattern,
            parser,
            bad: BadRecords::new(&on_error),
            follow,
            poll_interval: DEFAULT_POLL_INTERVAL,
            striped: false,
            pacing: None,
            last_block: None,
            subtask,
            parallelism: parallelism.max(1),
            pending: VecDeque::new(),
            active: Vec::new(),
            finished: Vec::new(),
            known: BTreeSet::new(),
            lineage: fresh_lineage(),
            owner_key: OwnerKey::Canonical,
            ids: (String::new(), String::new()),
        }
    }

    /// Whether this reader owns a newly discovered file in follow mode (see the module docs).
    fn owns_in_follow(&self, path: &Path) -> bool {
        self.lineage
            .as_deref()
            .is_some_and(|l| follow_owner(path, l, self.parallelism) == self.subtask)
    }

    /// Follow mode: queues every file of the pattern this reader owns and does not know yet.
    fn rescan(&mut self, ctx: &SourceContext) -> Result<()> {
        let files =
            list_files(&self.pattern).map_err(|e| io_err(ctx, "cannot list", &self.pattern, e))?;
        for listed in files {
            // A file that vanished (or a dangling symlink) is not there to read.
            let Ok(id) = std::fs::canonicalize(&listed) else {
                continue;
            };
            if self.known.contains(&id) || !id.is_file() {
                continue;
            }
            let key = match self.owner_key {
                OwnerKey::Canonical => &id,
                OwnerKey::Listed => &listed,
            };
            if !self.owns_in_follow(key) {
                continue;
            }
            self.known.insert(id.clone());
            self.pending.push_back(Queued {
                split: Split::whole(id),
                resume: None,
                file: None,
            });
        }
        Ok(())
    }

    fn header_error(ctx: &SourceContext, path: &Path, message: String) -> RunError {
        RunError::Parse {
            pipeline: ctx.pipeline.clone(),
            source_id: ctx.source.clone(),
            location: format!("{}:1", path.display()),
            message,
        }
    }

    /// Opens a split at its start, or at a restored position.
    fn open_split(&self, queued: Queued, ctx: &SourceContext) -> Result<Reader> {
        let Queued {
            split,
            resume,
            file: recorded,
        } = queued;
        let path = split.path.clone();
        let file = File::open(&path).map_err(|e| io_err(ctx, "cannot read", &path, e))?;
        let id = file.metadata().ok().as_ref().and_then(FileId::of);
        if let (Some(was), Some(now)) = (recorded, id)
            && was.replaced_by(now)
        {
            return Err(io_err(
                ctx,
                "cannot resume reading",
                &path,
                replaced_error(was, now),
            ));
        }
        // A buffer no larger than the split (plus a line past its end): striped blocks are
        // small, and reading far past one is wasted.
        let capacity = split
            .end
            .map_or(1 << 20, |e| e.saturating_sub(split.start).saturating_add(64 << 10))
            .min(1 << 20) as usize;
        let mut reader = BufReader::with_capacity(capacity, file);
        let mut parser = self.parser.clone();
        let mut framer = parser.framer();
        let mut buf = Vec::with_capacity(256);
        let read_err = |e: std::io::Error| io_err(ctx, "cannot read", &path, e);
        if let Some(resume) = resume {
            if let Some(h) = &resume.header {
                parser
                    .set_header(h)
                    .map_err(|m| Self::header_error(ctx, &path, m))?;
            }
            reader
                .seek(SeekFrom::Start(resume.offset))
                .map_err(read_err)?;
            let mut pos = resume.offset;
            if pos == 0 {
                pos = skip_bom(&mut reader).map_err(read_err)?;
            }
            return Ok(Reader {
                split,
                reader,
                pos,
                line: resume.line,
                buf,
                lines_in_buf: 0,
                framer,
                parser,
                header: resume.header,
                file: id,
                done: false,
            });
        }
        if let Some(mut framer) = framer.take() {
            // CSV: from the file start, since a record may span lines and where one starts
            // cannot be told from the middle of the file. A split owns the records that start
            // at or after its `start` (and before its `end`).
            let mut pos = skip_bom(&mut reader).map_err(read_err)?;
            let mut line = 0;
            let mut header = None;
            if parser.expects_header() {
                let (bytes, lines) =
                    read_csv_record(&mut reader, &mut framer, &mut buf).map_err(read_err)?;
                parser
                    .set_header(&buf)
                    .map_err(|m| Self::header_error(ctx, &path, m))?;
                header = Some(std::mem::take(&mut buf));
                pos += bytes;
                line += lines;
            }
            // Line by line, as `drain` stops: at the first line start outside a record.
            while framer.is_open() || pos < split.start {
                let n = reader.read_until(b'\n', &mut buf).map_err(read_err)?;
                if n == 0 {
                    framer.reset();
                    break;
                }
                framer.feed(&buf);
                buf.clear();
                pos += n as u64;
                line += 1;
            }
            return Ok(Reader {
                split,
                reader,
                pos,
                line: Some(line),
                buf,
                lines_in_buf: 0,
                framer: Some(framer),
                parser,
                header,
                file: id,
                done: false,
            });
        }
        let (pos, line) = if split.start == 0 {
            (skip_bom(&mut reader).map_err(read_err)?, Some(0))
        } else {
            // Skip the line that started in the previous split (it belongs there).
            reader
                .seek(SeekFrom::Start(split.start - 1))
                .map_err(read_err)?;
            let n = reader.read_until(b'\n', &mut buf).map_err(read_err)?;
            buf.clear();
            (split.start - 1 + n as u64, None)
        };
        let header = None;
        Ok(Reader {
            split,
            reader,
            pos,
            line,
            buf,
            lines_in_buf: 0,
            framer,
            parser,
            header,
            file: id,
            done: false,
        })
    }

    /// Reads records from one reader into `out`; returns whether it produced anything.
    ///
    /// A record is a line, or for CSV as many lines as its quoted fields span. `buf` holds the
    /// record being read, so the position a snapshot records (`pos - buf.len()`) is always a
    /// record's first byte: a CSV record whose end has not been written yet (follow mode) is
    /// read again from its start after a restore.
    fn drain(
        &mut self,
        idx: usize,
        out: &mut Vec<Dynamic>,
        ctx: &mut SourceContext,
    ) -> Result<bool> {
        let follow = self.follow;
        let r = &mut self.active[idx];
        let mut produced = false;
        if ctx.track_splits {
            ctx.mark_split(r.split.watermark_clock(), out.len());
        }
        while out.len() < BATCH_SIZE {
            if r.buf.is_empty() && r.split.end.is_some_and(|e| r.pos >= e) {
                r.done = true;
                break;
            }
            if r.buf.is_empty() && r.framer.is_none() {
                // The common case: a whole line in the reader's buffer, parsed where it is (the
                // loop below copies it into `buf` first); same positions and counts.
                if let Ok(avail) = r.reader.fill_buf()
                    && let Some(end) = memchr::memchr(b'\n', avail)
                {
                    let n = end + 1;
                    r.pos += n as u64;
                    ctx.bytes_read += n as u64;
                    if let Some(l) = r.line.as_mut() {
                        *l += 1;
                    }
                    match r.parser.parse(&avail[..n]) {
                        Ok(Some(rec)) => {
                            out.push(rec);
                            produced = true;
                        }
                        Ok(None) => {}
                        Err(message) => {
                            r.buf.extend_from_slice(&avail[..n]);
                            r.reader.consume(n);
                            r.lines_in_buf = 1;
                            let line = r.record_line();
                            Self::bad_record(&mut self.bad, ctx, r, line, message)?;
                            continue;
                        }
                    }
                    r.reader.consume(n);
                    continue;
                }
            }
            let had = r.buf.len();
            let n = r
                .reader
                .read_until(b'\n', &mut r.buf)
                .map_err(|e| io_err(ctx, "cannot read", &r.split.path, e))?;
            if n == 0 {
                if !follow {
                    r.done = true;
                    if r.framer.as_ref().is_some_and(CsvFramer::is_open) {
                        // The file ends inside a quoted field.
                        let line = r.record_line();
                        let message = format!(
                            "unterminated quoted field: the record starting on line {line} \
                             opens a quote that the file never closes"
                        );
                        Self::bad_record(&mut self.bad, ctx, r, line, message)?;
                    }
                }
                break;
            }
            if follow && r.buf.last() != Some(&b'\n') {
                // A partial line being written: wait for its end.
                r.pos += n as u64;
                ctx.bytes_read += n as u64;
                break;
            }
            r.pos += n as u64;
            ctx.bytes_read += n as u64;
            r.lines_in_buf += 1;
            if let Some(l) = r.line.as_mut() {
                *l += 1;
            }
            if let Some(framer) = r.framer.as_mut() {
                match framer.feed(&r.buf[had..]) {
                    Frame::Complete => {}
                    Frame::Open => continue,
                    Frame::Blank => {
                        r.buf.clear();
                        r.lines_in_buf = 0;
                        continue;
                    }
                }
            }
            match r.parser.parse(&r.buf) {
                Ok(Some(rec)) => {
                    out.push(rec);
                    produced = true;
                }
                Ok(None) => {}
                Err(message) => {
                    let line = r.record_line();
                    Self::bad_record(&mut self.bad, ctx, r, line, message)?;
                }
            }
            r.buf.clear();
            r.lines_in_buf = 0;
        }
        // A striped block ends its clock only when the reader has no further block on it.
        if r.done
            && ctx.track_splits
            && !self
                .pending
                .iter()
                .any(|q| q.split.watermark_clock() == r.split.watermark_clock())
        {
            ctx.end_split(r.split.watermark_clock());
        }
        Ok(produced)
    }

    /// Applies `on_error` to the record in `r.buf`, which starts on `line`, and empties `buf`.
    fn bad_record(
        bad: &mut BadRecords,
        ctx: &mut SourceContext,
        r: &mut Reader,
        line: u64,
        message: String,
    ) -> Result<()> {
        let file = r.split.path.display().to_string();
        let result = bad.failed(
            ctx,
            BadRecord {
                file: &file,
                line,
                raw: &r.buf,
                message,
            },
        );
        r.buf.clear();
        r.lines_in_buf = 0;
        result
    }

    /// The current position of every split, in reading order.
    fn state(&self) -> FileSourceState {
        let mut splits =
            Vec::with_capacity(self.finished.len() + self.active.len() + self.pending.len());
        splits.extend(self.finished.iter().map(|(s, file)| SplitState {
            split: s.clone(),
            progress: Progress::Done,
            file: *file,
        }));
        splits.extend(self.active.iter().map(|r| SplitState {
            split: r.split.clone(),
            progress: if r.done {
                Progress::Done
            } else {
                Progress::Reading(r.resume())
            },
            file: r.file,
        }));
        splits.extend(self.pending.iter().map(|q| SplitState {
            split: q.split.clone(),
            progress: match &q.resume {
                Some(r) => Progress::Reading(r.clone()),
                None => Progress::Unread,
            },
            file: q.file,
        }));
        FileSourceState {
            version: FileSourceState::VERSION,
            subtask: self.subtask,
            parallelism: self.parallelism,
            follow: self.follow,
            splits,
            known: self.known.iter().cloned().collect(),
            lineage: self.lineage.clone(),
            owner_key: self.owner_key,
        }
    }

    /// A `Build` error about this source.
    fn build_error(&self, message: String) -> RunError {
        RunError::Build {
            pipeline: self.ids.0.clone(),
            element: self.ids.1.clone(),
            message,
        }
    }

    /// Decodes and version-checks a snapshot.
    fn decode_state(&self, bytes: &[u8]) -> Result<FileSourceState> {
        let source = &self.ids.1;
        let state: FileSourceState = crate::record::decode(bytes).map_err(|e| {
            RunError::StateCorrupt(format!(
                "source `{source}`: malformed file source snapshot: {e}"
            ))
        })?;
        if state.version == 0 || state.version > FileSourceState::VERSION {
            return Err(RunError::StateMismatch(format!(
                "source `{source}`: file source snapshot version {} is not supported (this \
                 build reads versions 1 to {})",
                state.version,
                FileSourceState::VERSION
            )));
        }
        Ok(state)
    }

    /// Refuses a snapshot taken with another `follow` setting.
    fn check_follow(&self, state: &FileSourceState) -> Result<()> {
        if state.follow == self.follow {
            return Ok(());
        }
        Err(self.build_error(format!(
            "cannot restore: the checkpoint was taken with `follow: {}`, the pipeline now says \
             `follow: {}`",
            state.follow, self.follow
        )))
    }

    /// Replaces the split plan with the splits of `states`, in order, each at its position,
    /// every path turned into its identity (older snapshots hold paths as spelled). Two entries
    /// for one split (one file and byte range) are merged when they agree on the position and
    /// refused otherwise (see the module docs).
    fn load(&mut self, states: Vec<FileSourceState>) -> Result<()> {
        let mut finished = Vec::new();
        let mut pending = VecDeque::new();
        let mut known = BTreeSet::new();
        let mut seen: HashMap<(PathBuf, u64, Option<u64>), (PathBuf, Progress)> = HashMap::new();
        for state in states {
            for mut s in state.splits {
                let spelled = std::mem::take(&mut s.split.path);
                s.split.path = file_identity(&spelled);
                let key = (s.split.path.clone(), s.split.start, s.split.end);
                if let Some((first_spelled, first)) = seen.get(&key) {
                    if first.same_position(&s.progress) {
                        tracing::warn!(
                            pipeline = %self.ids.0,
                            source = %self.ids.1,
                            file = %s.split.path.display(),
                            spellings = ?[first_spelled, &spelled],
                            "The checkpoint holds one file twice under two spellings (written by an older Weir), at the same position; reading it once from there."
                        );
                        continue;
                    }
                    return Err(self.build_error(format!(
                        "the checkpoint holds two positions for file `{}` (as `{}`: {}; as `{}`: \
                         {}), written by an older Weir that read one file under two spellings of \
                         its path, so the output after it may hold records twice and which \
                         position is right cannot be known; restore an older checkpoint or \
                         savepoint (`--from-checkpoint`, `--from-savepoint`) taken before the \
                         file was read twice, or start over with `--fresh`",
                        s.split.path.display(),
                        first_spelled.display(),
                        first.describe(),
                        spelled.display(),
                        s.progress.describe()
                    )));
                }
                seen.insert(key, (spelled, s.progress.clone()));
                match s.progress {
                    Progress::Done => finished.push((s.split, s.file)),
                    Progress::Unread => {
                        self.check_resumable(&s.split.path, s.split.start, s.file)?;
                        pending.push_back(Queued {
                            split: s.split,
                            resume: None,
                            file: s.file,
                        });
                    }
                    Progress::Reading(resume) => {
                        self.check_resumable(&s.split.path, resume.offset, s.file)?;
                        pending.push_back(Queued {
                            split: s.split,
                            resume: Some(resume),
                            file: s.file,
                        });
                    }
                }
            }
            known.extend(state.known.iter().map(|p| file_identity(p)));
        }
        self.finished = finished;
        self.pending = pending;
        self.active.clear();
        self.known = known;
        Ok(())
    }

    /// The error for an input that no longer holds what the checkpoint read from it.
    fn changed(&self, path: &Path, source: std::io::Error) -> RunError {
        RunError::Io {
            pipeline: self.ids.0.clone(),
            element: self.ids.1.clone(),
            what: "cannot resume reading",
            path: path.to_path_buf(),
            source,
        }
    }

    /// Checks that `path` is still the file the checkpoint read (when it recorded which) and
    /// still reaches byte `offset`.
    fn check_resumable(&self, path: &Path, offset: u64, recorded: Option<FileId>) -> Result<()> {
        let len = match std::fs::metadata(path) {
            Ok(m) => {
                if let (Some(was), Some(now)) = (recorded, FileId::of(&m))
                    && was.replaced_by(now)
                {
                    return Err(self.changed(path, replaced_error(was, now)));
                }
                m.len()
            }
            Err(e) => {
                return Err(self.changed(
                    path,
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "{e}; the checkpoint's position in it is byte {offset} (the input \
                             changed under the checkpoint)"
                        ),
                    ),
                ));
            }
        };
        if len < offset {
            return Err(self.changed(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file has {len} bytes, fewer than the checkpoint's position, byte \
                         {offset} (the input changed under the checkpoint)"
                    ),
                ),
            ));
        }
        Ok(())
    }
}

impl Source for FileSource {
    fn open(&mut self, ctx: &mut SourceContext) -> Result<()> {
        self.ids = (ctx.pipeline.clone(), ctx.source.clone());
        if self.follow {
            return self.rescan(ctx);
        }
        let files =
            list_files(&self.pattern).map_err(|e| io_err(ctx, "cannot list", &self.pattern, e))?;
        let mut sized: Vec<(PathBuf, u64)> = Vec::with_capacity(files.len());
        let mut ids = BTreeSet::new();
        for f in files {
            let id = std::fs::canonicalize(&f).map_err(|e| io_err(ctx, "cannot read", &f, e))?;
            let len = std::fs::metadata(&id)
                .map_err(|e| io_err(ctx, "cannot read", &f, e))?
                .len();
            // One file reached twice (a symlink next to its target) is read once.
            if ids.insert(id.clone()) {
                sized.push((id, len));
            }
        }
        self.pending = plan_splits(&sized, self.parallelism, self.subtask, self.striped)
            .into_iter()
            .map(|split| Queued {
                split,
                resume: None,
                file: None,
            })
            .collect();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll> {
        if ctx.track_splits {
            // Queued splits hold the watermark back until they are read (event time).
            ctx.assign_splits(self.pending.iter().map(|q| q.split.watermark_clock()));
        }
        if self.follow {
            while let Some(q) = self.pending.pop_front() {
                let r = self.open_split(q, ctx)?;
                self.active.push(r);
            }
            let mut any = false;
            for i in 0..self.active.len() {
                any |= self.drain(i, out, ctx)?;
                if out.len() >= BATCH_SIZE {
                    return Ok(Poll::Ready);
                }
            }
            if !any {
                self.rescan(ctx)?;
                return Ok(Poll::Idle(self.poll_interval));
            }
            return Ok(Poll::Ready);
        }
        loop {
            if self.active.is_empty() {
                let Some(q) = self.pending.front() else {
                    return Ok(Poll::Done);
                };
                if !self.may_start(q) {
                    // A round ahead of another reader of this file: wait for it.
                    return Ok(if out.is_empty() {
                        Poll::Idle(PACING_WAIT)
                    } else {
                        Poll::Ready
                    });
                }
                let Some(q) = self.pending.pop_front() else {
                    return Ok(Poll::Done);
                };
                self.block_started(&q.split);
                let r = self.open_split(q, ctx)?;
                self.active.push(r);
            }
            self.drain(0, out, ctx)?;
            if self.active[0].done {
                let r = self.active.remove(0);
                self.block_finished(&r.split);
                self.finished.push((r.split, r.file));
            }
            if out.len() >= BATCH_SIZE {
                return Ok(Poll::Ready);
            }
        }
    }

    /// Bytes between each split's position and its end (or the file's current end), over
    /// the open and the pending splits.
    fn lag(&mut self) -> Option<u64> {
        let file_len = |path: &Path| std::fs::metadata(path).map(|m| m.len()).ok();
        let mut behind = 0u64;
        for r in &self.active {
            let end = match r.split.end {
                Some(e) => Some(e),
                None => r.reader.get_ref().metadata().map(|m| m.len()).ok(),
            };
            behind += end.map_or(0, |e| e.saturating_sub(r.pos));
        }
        for q in &self.pending {
            let start = q.resume.as_ref().map_or(q.split.start, |r| r.offset);
            let end = q.split.end.or_else(|| file_len(&q.split.path));
            behind += end.map_or(0, |e| e.saturating_sub(start));
        }
        Some(behind)
    }

    /// Encodes [`FileSourceState`].
    fn snapshot(&mut self) -> Result<Vec<u8>> {
        crate::record::encode(&self.state()).map_err(|e| {
            RunError::State(format!(
                "source `{}`: cannot encode the file positions: {e}",
                self.ids.1
            ))
        })
    }

    /// Replaces the split plan `open` made with the snapshot's, each split at its position.
    ///
    /// # Errors
    /// A malformed snapshot; one taken at another parallelism or follow setting; a file that
    /// is missing, shorter than its recorded offset or replaced by another file (the input
    /// changed under the checkpoint); two different positions for one split.
    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let (pipeline, source) = self.ids.clone();
        let state = self.decode_state(snapshot)?;
        if state.parallelism != self.parallelism || state.subtask != self.subtask {
            return Err(RunError::Build {
                pipeline,
                element: source,
                message: format!(
                    "cannot restore file reader {} of {} from a snapshot of reader {} of {}: a \
                     plain restore keeps the parallelism (a savepoint can change it)",
                    self.subtask, self.parallelism, state.subtask, state.parallelism
                ),
            });
        }
        self.check_follow(&state)?;
        self.lineage = state.lineage.clone();
        self.owner_key = state.owner_key;
        self.load(vec![state])
    }

    /// Takes over the splits of the old readers whose snapshots this reader received (see
    /// the module docs): each at its recorded position, in old-reader order. With no
    /// snapshot (a reader added by a scale-up) it owns nothing from the old run, and in
    /// follow mode no new file either.
    ///
    /// # Errors
    /// A malformed snapshot; one of an old reader that does not map to this reader, or of
    /// another follow setting; snapshots of different runs; a file missing, shorter than its
    /// recorded offset or replaced; two different positions for one split.
    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &SourceContext) -> Result<()> {
        if self.ids.1.is_empty() {
            self.ids = (ctx.pipeline.clone(), ctx.source.clone());
        }
        let mut states = Vec::with_capacity(snapshots.len());
        for bytes in snapshots {
            let state = self.decode_state(bytes)?;
            self.check_follow(&state)?;
            states.push(state);
        }
        states.sort_by_key(|s| s.subtask);
        let mut lineage: Option<Vec<u32>> = None;
        let mut owner_key: Option<OwnerKey> = None;
        let mut previous: Option<&FileSourceState> = None;
        for st in &states {
            if st.subtask >= st.parallelism || st.subtask % self.parallelism != self.subtask {
                return Err(self.build_error(format!(
                    "the snapshot of file reader {} of {} does not belong to reader {} of {} \
                     (old reader j goes to new reader j % {}); the savepoint is inconsistent, \
                     restore from another one",
                    st.subtask, st.parallelism, self.subtask, self.parallelism, self.parallelism
                )));
            }
            if let Some(prev) = previous
                && (prev.subtask == st.subtask || prev.parallelism != st.parallelism)
            {
                return Err(self.build_error(format!(
                    "the snapshots of file reader {} of {} and reader {} of {} do not come \
                     from one run; the savepoint is inconsistent, restore from another one",
                    prev.subtask, prev.parallelism, st.subtask, st.parallelism
                )));
            }
            // A reader without lineage owns no new file: its ownership key does not count.
            if let Some(l) = &st.lineage {
                if lineage.as_ref().is_some_and(|known| known != l)
                    || owner_key.is_some_and(|k| k != st.owner_key)
                {
                    return Err(self.build_error(format!(
                        "the snapshot of file reader {} of {} records another follow-mode file \
                         assignment than its siblings; the savepoint is inconsistent, restore \
                         from another one",
                        st.subtask, st.parallelism
                    )));
                }
                lineage = Some(l.clone());
                owner_key = Some(st.owner_key);
            }
            previous = Some(st);
        }
        let old_parallelism = states.first().map(|s| s.parallelism);
        self.lineage = match (lineage, old_parallelism) {
            (Some(l), Some(old)) => Some(extend_lineage(l, old)),
            _ => None,
        };
        self.owner_key = owner_key.unwrap_or(OwnerKey::Canonical);
        tracing::info!(
            pipeline = %self.ids.0,
            source = %self.ids.1,
            subtask = self.subtask,
            parallelism = self.parallelism,
            old_parallelism = %crate::base::human::Maybe::or(old_parallelism, "unknown"),
            old_readers = ?states.iter().map(|s| s.subtask).collect::<Vec<_>>(),
            "File reader takes over the splits of earlier readers after a rescale."
        );
        self.load(states)
    }
}

/// A file source snapshot with its fields named (for `weir inspect`): each split's file,
/// byte range and progress (`Unread`, `Reading` at a byte offset and line, `Done`).
///
/// # Errors
/// A malformed snapshot.
pub fn describe_snapshot(bytes: &[u8]) -> Result<serde_json::Value> {
    let state: FileSourceState = crate::record::decode(bytes).map_err(|e| {
        RunError::StateCorrupt(format!("malformed file source snapshot: {e}"))
    })?;
    serde_json::to_value(&state)
        .map_err(|e| RunError::State(format!("cannot describe a file source snapshot: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_every_line_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.jsonl");
        let mut text = String::new();
        for i in 0..60_000 {
            text.push_str(&format!(
                "{{\"i\":{i},\"pad\":\"{}\"}}\n",
                "x".repeat(i % 13)
            ));
        }
        std::fs::write(&path, &text).expect("write");
        let len = text.len() as u64;
        assert!(len >= MIN_SPLIT_BYTES);
        for p in [1u32, 2, 3, 4] {
            let mut seen = Vec::new();
            for s in 0..p {
                let mut src = FileSource::new(
                    path.clone(),
                    LineParser::new(Default::default(), None),
                    SourceOnError::Fail,
                    false,
                    s,
                    p,
                );
                let mut ctx = SourceContext::new("p", "s", s, p, None);
                src.open(&mut ctx).expect("open");
                loop {
                    let mut out = Vec::new();
                    let poll = src.poll(&mut out, &mut ctx).expect("poll");
                    seen.extend(
                        out.iter()
                            .map(|r| r.as_map_ref().expect("map")["i"].as_int().expect("int")),
                    );
                    if poll == Poll::Done {
                        break;
                    }
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..60_000).collect::<Vec<_>>(), "parallelism {p}");
        }
    }

    #[test]
    fn lag_and_bytes_read_follow_the_reading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.jsonl");
        let text: String = (0..3000).map(|i| format!("{{\"i\":{i}}}\n")).collect();
        std::fs::write(&path, &text).expect("write");
        let len = text.len() as u64;
        let mut src = FileSource::new(
            path,
            LineParser::new(Default::default(), None),
            SourceOnError::Fail,
            false,
            0,
            1,
        );
        let mut ctx = ctx(0, 1, None);
        src.open(&mut ctx).expect("open");
        assert_eq!(src.lag(), Some(len), "nothing read yet");
        let mut out = Vec::new();
        assert_eq!(src.poll(&mut out, &mut ctx).expect("poll"), Poll::Ready);
        let behind = src.lag().expect("a file source knows its lag");
        assert!(behind > 0 && behind < len, "{behind} of {len}");
        assert_eq!(ctx.bytes_read + behind, len);
        loop {
            out.clear();
            if src.poll(&mut out, &mut ctx).expect("poll") == Poll::Done {
                break;
            }
        }
        assert_eq!(src.lag(), Some(0));
        assert_eq!(ctx.bytes_read, len);
    }

    #[test]
    fn malformed_line_reports_file_and_line_or_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.jsonl");
        std::fs::write(&path, "{\"a\":1}\n{\"a\":2}\n{oops\n{\"a\":4}\n").expect("write");
        let mut ctx = SourceContext::new("p", "s", 0, 1, None);
        let mut src = FileSource::new(
            path.clone(),
            LineParser::new(Default::default(), None),
            SourceOnError::Fail,
            false,
            0,
            1,
        );
        src.open(&mut ctx).expect("open");
        let err = src.poll(&mut Vec::new(), &mut ctx).expect_err("must fail");
        assert!(err.to_string().contains("bad.jsonl:3"), "{err}");
        let mut src = FileSource::new(
            path,
            LineParser::new(Default::default(), None),
            SourceOnError::Skip,
            false,
            0,
            1,
        );
        src.open(&mut ctx).expect("open");
        let mut out = Vec::new();
        while src.poll(&mut out, &mut ctx).expect("poll") != Poll::Done {}
        assert_eq!(out.len(), 3);
        assert_eq!(ctx.skipped, 1);
    }

    #[test]
    fn cut_csv_splits_keep_multi_line_records_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.csv");
        let mut text = String::from("\u{feff}i,note\n");
        let mut want = Vec::new();
        for i in 0..150_000_i64 {
            match i % 5 {
                0 => text.push_str(&format!("{i},\"a\n\n{i}\"\"b\n\"\n")),
                1 => text.push_str(&format!("\n{i},plain\n")),
                _ => text.push_str(&format!("{i},x{}\n", "y".repeat((i % 7) as usize))),
            }
            want.push(i);
        }
        std::fs::write(&path, &text).expect("write");
        assert!(text.len() as u64 >= MIN_SPLIT_BYTES);
        for p in [1u32, 2, 3, 4] {
            let make = |s, p| {
                FileSource::new(
                    path.clone(),
                    LineParser::new(weir_schema::RecordFormat::Csv, None),
                    SourceOnError::Fail,
                    false,
                    s,
                    p,
                )
            };
            let mut seen = Vec::new();
            for s in 0..p {
                let mut src = make(s, p);
                let mut c = ctx(s, p, None);
                src.open(&mut c).expect("open");
                for r in drain_all(&mut src, &mut c) {
                    let v: serde_json::Value = serde_json::from_str(&r).expect("json");
                    let i = v["i"].as_i64().expect("i");
                    if i % 5 == 0 {
                        assert_eq!(v["note"], format!("a\n\n{i}\"b\n"), "{r}");
                    }
                    seen.push(i);
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, want, "parallelism {p}");
        }
    }

    #[test]
    fn a_dead_letter_far_into_a_cut_split_names_its_line_in_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.jsonl");
        let mut text = String::new();
        for i in 0..60_000 {
            if i == 50_000 {
                text.push_str("{broken\n");
            } else {
                text.push_str(&format!("{{\"i\":{i}}}\n"));
            }
        }
        std::fs::write(&path, &text).expect("write");
        let mut letters = Vec::new();
        for s in 0..2 {
            let mut src = FileSource::new(
                path.clone(),
                LineParser::new(Default::default(), None),
                SourceOnError::DeadLetter("bad".into()),
                false,
                s,
                2,
            );
            let mut c = ctx(s, 2, None);
            src.open(&mut c).expect("open");
            drain_all(&mut src, &mut c);
            letters.append(&mut c.dead_letters);
        }
        assert_eq!(letters.len(), 1);
        let m = letters[0].as_map_ref().expect("map");
        assert_eq!(m["line"].as_int(), Ok(50_001));
        assert_eq!(m["raw"].to_string(), "{broken");
        assert!(m["file"].to_string().ends_with("big.jsonl"));
    }

    #[test]
    fn a_restore_in_the_middle_of_a_csv_record_reads_it_once_when_its_end_arrives() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.csv");
        append(&path, &["id,note", "1,\"first", "half\"", "2,\"open"]);
        let make = |s, p| {
            FileSource::new(
                path.clone(),
                LineParser::new(weir_schema::RecordFormat::Csv, None),
                SourceOnError::Fail,
                true,
                s,
                p,
            )
        };
        let mut a = make(0, 1);
        let mut c = ctx(0, 1, None);
        a.open(&mut c).expect("open");
        assert_eq!(
            poll_until_quiet(&mut a, &mut c),
            ["{\"id\":1,\"note\":\"first\\nhalf\"}"]
        );
        let snap = a.snapshot().expect("snapshot");
        append(&path, &["still open\"", "3,x"]);
        let tail = poll_until_quiet(&mut a, &mut c);
        assert_eq!(
            tail,
            [
                "{\"id\":2,\"note\":\"open\\nstill open\"}",
                "{\"id\":3,\"note\":\"x\"}",
            ]
        );
        // A restore from the snapshot taken mid-record reads it again, whole, from its start.
        let mut b = make(0, 1);
        let mut c = ctx(0, 1, Some(1));
        b.open(&mut c).expect("open");
        b.restore(&snap).expect("restore");
        assert_eq!(poll_until_quiet(&mut b, &mut c), tail);
    }

    fn ctx(s: u32, p: u32, restored_from: Option<u64>) -> SourceContext {
        SourceContext::new("p", "s", s, p, restored_from)
    }

    fn text(records: &[Dynamic]) -> Vec<String> {
        records
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect()
    }

    /// Polls to the end, as record texts.
    fn drain_all(src: &mut FileSource, c: &mut SourceContext) -> Vec<String> {
        let mut all = Vec::new();
        loop {
            let mut out = Vec::new();
            let poll = src.poll(&mut out, c).expect("poll");
            all.extend(text(&out));
            if poll == Poll::Done {
                return all;
            }
        }
    }

    /// For every reader of `p`: reads to the end snapshotting between polls (sequence A);
    /// then, for every `step`-th snapshot, a fresh reader restored from it must yield exactly
    /// the tail of A. Returns all records read, sorted.
    fn check_replay(make: &dyn Fn(u32, u32) -> FileSource, p: u32, step: usize) -> Vec<String> {
        let mut everything = Vec::new();
        for s in 0..p {
            let mut a = make(s, p);
            let mut c = ctx(s, p, None);
            a.open(&mut c).expect("open");
            let mut seq = Vec::new();
            let mut snaps = vec![(0, a.snapshot().expect("snapshot"))];
            loop {
                let mut out = Vec::new();
                let poll = a.poll(&mut out, &mut c).expect("poll");
                seq.extend(text(&out));
                snaps.push((seq.len(), a.snapshot().expect("snapshot")));
                if poll == Poll::Done {
                    break;
                }
            }
            assert!(snaps.len() > 2, "the input must take several polls (reader {s} of {p}: {} records)", seq.len());
            let last = snaps.len() - 1;
            for (k, (at, snap)) in snaps.iter().enumerate() {
                if k % step != 0 && k != last {
                    continue;
                }
                let mut b = make(s, p);
                let mut c = ctx(s, p, Some(1));
                b.open(&mut c).expect("open");
                b.restore(snap).expect("restore");
                let tail = drain_all(&mut b, &mut c);
                assert_eq!(
                    tail.len(),
                    seq.len() - at,
                    "reader {s} of {p}, snapshot {k} at record {at}"
                );
                assert!(
                    tail == seq[*at..],
                    "reader {s} of {p}, snapshot {k} at record {at}: tail differs"
                );
            }
            everything.extend(seq);
        }
        everything.sort();
        everything
    }

    fn source(
        path: &Path,
        format: weir_schema::RecordFormat,
        follow: bool,
    ) -> impl Fn(u32, u32) -> FileSource {
        let path = path.to_path_buf();
        move |s, p| {
            FileSource::new(
                path.clone(),
                LineParser::new(format, None),
                SourceOnError::Fail,
                follow,
                s,
                p,
            )
        }
    }

    #[test]
    fn csv_with_header_over_several_files_replays_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in 0..3 {
            let mut text = String::from("file,n,word\n");
            for i in 0..1500 {
                text.push_str(&format!("{f},{i},\"w,{}\"\n", i % 7));
            }
            std::fs::write(dir.path().join(format!("in-{f}.csv")), text).expect("write");
        }
        let make = source(dir.path(), weir_schema::RecordFormat::Csv, false);
        let one = check_replay(&make, 1, 1);
        assert_eq!(one.len(), 4500);
        assert!(one[0].contains("\"word\""), "{}", one[0]);
        assert_eq!(check_replay(&make, 2, 1), one);
    }

    #[test]
    fn split_big_jsonl_file_replays_exactly_at_parallelism_2() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.jsonl");
        let mut text = String::new();
        let mut i = 0;
        while text.len() < MIN_SPLIT_BYTES as usize + 4096 {
            text.push_str(&format!(
                "{{\"i\":{i},\"pad\":\"{}\"}}\n",
                "x".repeat(i % 17)
            ));
            i += 1;
        }
        std::fs::write(&path, &text).expect("write");
        let make = source(&path, weir_schema::RecordFormat::Jsonl, false);
        let all = check_replay(&make, 2, 4);
        assert_eq!(all.len(), i);
    }

    #[test]
    fn split_big_csv_file_keeps_its_header_across_restore() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.csv");
        let mut text = String::from("i,name\n");
        let mut i = 0;
        while text.len() < MIN_SPLIT_BYTES as usize + 4096 {
            text.push_str(&format!("{i},name-{}\n", i % 11));
            i += 1;
        }
        std::fs::write(&path, &text).expect("write");
        let make = source(&path, weir_schema::RecordFormat::Csv, false);
        let all = check_replay(&make, 2, 8);
        assert_eq!(all.len(), i);
        assert!(all.iter().all(|r| r.contains("\"name\":")));
    }

    #[test]
    fn lines_without_final_newline_replay_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.txt");
        let text: Vec<String> = (0..2500).map(|i| format!("line {i}")).collect();
        std::fs::write(&path, text.join("\n")).expect("write");
        let make = source(&path, weir_schema::RecordFormat::Lines, false);
        assert_eq!(check_replay(&make, 1, 1).len(), 2500);
    }

    #[test]
    fn restore_fails_on_a_shorter_or_missing_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.jsonl");
        let text: String = (0..3000).map(|i| format!("{{\"i\":{i}}}\n")).collect();
        std::fs::write(&path, &text).expect("write");
        let make = source(&path, weir_schema::RecordFormat::Jsonl, false);
        let mut a = make(0, 1);
        let mut c = ctx(0, 1, None);
        a.open(&mut c).expect("open");
        a.poll(&mut Vec::new(), &mut c).expect("poll");
        let snap = a.snapshot().expect("snapshot");

        std::fs::write(&path, &text[..100]).expect("truncate");
        let mut b = make(0, 1);
        let mut c = ctx(0, 1, Some(3));
        b.open(&mut c).expect("open");
        let err = b.restore(&snap).expect_err("shorter file");
        let msg = err.to_string();
        assert!(
            msg.contains("in.jsonl") && msg.contains("100 bytes"),
            "{msg}"
        );
        assert!(msg.contains("input changed"), "{msg}");

        std::fs::remove_file(&path).expect("remove");
        let mut b = make(0, 1);
        let err = b.restore(&snap).expect_err("missing file");
        assert!(err.to_string().contains("in.jsonl"), "{err}");

        let mut b = make(0, 2);
        assert!(b.restore(&snap).is_err(), "another parallelism");
        assert!(b.restore(b"junk").is_err(), "garbage");
    }

    #[test]
    fn a_following_reader_with_nothing_new_waits_its_poll_interval() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.log"), "one\n").expect("write");
        let make = source(dir.path(), weir_schema::RecordFormat::Lines, true);
        let mut c = ctx(0, 1, None);
        for (poll_interval, waits) in [
            (None, DEFAULT_POLL_INTERVAL),
            (Some(Duration::from_millis(5)), Duration::from_millis(5)),
            // Never a busy loop.
            (Some(Duration::ZERO), Duration::from_millis(1)),
        ] {
            let mut a = make(0, 1);
            if let Some(d) = poll_interval {
                a = a.with_poll_interval(d);
            }
            a.open(&mut c).expect("open");
            let mut out = Vec::new();
            assert_eq!(a.poll(&mut out, &mut c).expect("poll"), Poll::Ready);
            assert_eq!(a.poll(&mut out, &mut c).expect("poll"), Poll::Idle(waits));
        }
    }

    #[test]
    fn follow_mode_resumes_files_and_partial_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a_path = dir.path().join("a.log");
        std::fs::write(&a_path, "one\ntwo\nthr").expect("write");
        let make = source(dir.path(), weir_schema::RecordFormat::Lines, true);
        let mut a = make(0, 1);
        let mut c = ctx(0, 1, None);
        a.open(&mut c).expect("open");
        let mut out = Vec::new();
        assert_eq!(a.poll(&mut out, &mut c).expect("poll"), Poll::Ready);
        assert_eq!(out.len(), 2);
        let snap = a.snapshot().expect("snapshot");

        // The partial line completes and a new file appears after the snapshot.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&a_path)
            .expect("append");
        std::io::Write::write_all(&mut f, b"ee\nfour\n").expect("append");
        std::fs::write(dir.path().join("b.log"), "bee\n").expect("write");
        let poll_until_idle = |src: &mut FileSource, c: &mut SourceContext| {
            let mut all = Vec::new();
            for _ in 0..4 {
                let mut out = Vec::new();
                src.poll(&mut out, c).expect("poll");
                all.extend(text(&out));
            }
            all
        };
        let tail = poll_until_idle(&mut a, &mut c);
        assert_eq!(
            tail,
            [
                r#"{"line":"three"}"#,
                r#"{"line":"four"}"#,
                r#"{"line":"bee"}"#
            ]
        );
        let mut b = make(0, 1);
        let mut c = ctx(0, 1, Some(1));
        b.open(&mut c).expect("open");
        b.restore(&snap).expect("restore");
        assert_eq!(poll_until_idle(&mut b, &mut c), tail);
    }

    /// Writes `files` jsonl files of `n` records `{"f":f,"i":i}` into `dir`; returns the
    /// records as texts, sorted.
    fn write_files(dir: &Path, files: usize, n: usize) -> Vec<String> {
        let mut all = Vec::new();
        for f in 0..files {
            let mut body = String::new();
            for i in 0..n {
                let line = format!("{{\"f\":{f},\"i\":{i}}}");
                body.push_str(&line);
                body.push('\n');
                all.push(line);
            }
            std::fs::write(dir.join(format!("in-{f}.jsonl")), body).expect("write");
        }
        all.sort();
        all
    }

    /// The snapshots of old readers `j` with `j % p == s`, in old-reader order (what the
    /// runtime hands new reader `s` of `p`).
    fn share(snaps: &[Vec<u8>], s: u32, p: u32) -> Vec<&[u8]> {
        snaps
            .iter()
            .enumerate()
            .filter(|(j, _)| *j as u32 % p == s)
            .map(|(_, b)| b.as_slice())
            .collect()
    }

    /// A reader `s` of `p` restored (rescaled) from the old readers' snapshots.
    fn rescaled(
        make: &dyn Fn(u32, u32) -> FileSource,
        snaps: &[Vec<u8>],
        s: u32,
        p: u32,
    ) -> (FileSource, SourceContext) {
        let mut src = make(s, p);
        let mut c = ctx(s, p, Some(1));
        src.open(&mut c).expect("open");
        src.restore_rescaled(&share(snaps, s, p), &c)
            .expect("rescaled restore");
        (src, c)
    }

    /// Runs a chain of parallelisms: at each but the last, every reader polls `polls` times
    /// and snapshots; the next parallelism restores from those snapshots; the last reads to
    /// the end. Returns every record read, sorted.
    fn run_chain(
        make: &dyn Fn(u32, u32) -> FileSource,
        chain: &[u32],
        polls: usize,
    ) -> Vec<String> {
        let mut snaps: Option<Vec<Vec<u8>>> = None;
        let mut all = Vec::new();
        for (i, &p) in chain.iter().enumerate() {
            let mut next = Vec::new();
            for s in 0..p {
                let (mut src, mut c) = match &snaps {
                    Some(old) => rescaled(make, old, s, p),
                    None => {
                        let mut src = make(s, p);
                        let mut c = ctx(s, p, None);
                        src.open(&mut c).expect("open");
                        (src, c)
                    }
                };
                if i + 1 == chain.len() {
                    all.extend(drain_all(&mut src, &mut c));
                    continue;
                }
                for _ in 0..polls {
                    let mut out = Vec::new();
                    src.poll(&mut out, &mut c).expect("poll");
                    all.extend(text(&out));
                }
                next.push(src.snapshot().expect("snapshot"));
            }
            snaps = Some(next);
        }
        all.sort();
        all
    }

    #[test]
    fn rescaled_restore_reads_exactly_the_remaining_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let everything = write_files(dir.path(), 2, 3000);
        let make = source(dir.path(), weir_schema::RecordFormat::Jsonl, false);
        // Two readers, each one file partly read.
        let mut snaps = Vec::new();
        let mut head = Vec::new();
        for s in 0..2 {
            let mut a = make(s, 2);
            let mut c = ctx(s, 2, None);
            a.open(&mut c).expect("open");
            let mut out = Vec::new();
            assert_eq!(a.poll(&mut out, &mut c).expect("poll"), Poll::Ready);
            assert!(!out.is_empty() && out.len() < 3000, "mid-file");
            head.extend(text(&out));
            snaps.push(a.snapshot().expect("snapshot"));
        }
        let mut remaining: Vec<String> = everything
            .iter()
            .filter(|r| !head.contains(r))
            .cloned()
            .collect();
        remaining.sort();
        assert_eq!(remaining.len(), everything.len() - head.len());
        for p in [1u32, 3] {
            let mut tail = Vec::new();
            for s in 0..p {
                let (mut b, mut c) = rescaled(&make, &snaps, s, p);
                let got = drain_all(&mut b, &mut c);
                if s >= 2 {
                    assert!(
                        got.is_empty(),
                        "reader {s} of {p} was added: it owns nothing"
                    );
                }
                tail.extend(got);
            }
            tail.sort();
            assert!(tail == remaining, "restored into {p} readers");
        }
    }

    #[test]
    fn striped_plans_deal_out_every_byte_once_in_blocks_with_one_clock_per_reader() {
        let path = PathBuf::from("/data/in.jsonl");
        for len in [
            MIN_SPLIT_BYTES,
            5 * STRIPE_BLOCK_BYTES + 17,
            2 * MAX_STRIPE_BLOCKS * STRIPE_BLOCK_BYTES * 3 + 5,
        ] {
            for p in 1..=4u32 {
                let mut ranges = Vec::new();
                let mut clocks = BTreeSet::new();
                for s in 0..p {
                    let splits = plan_splits(&[(path.clone(), len)], p, s, true);
                    assert!(splits.len() as u64 <= MAX_STRIPE_BLOCKS + 1);
                    let mine: BTreeSet<u64> = splits.iter().map(Split::watermark_clock).collect();
                    if p > 1 {
                        assert!(mine.len() <= 1, "one clock per reader: {mine:?}");
                        assert!(mine.is_disjoint(&clocks), "readers share no clock");
                    }
                    clocks.extend(mine);
                    // In file order, so a reader's times only go forward in a sorted file.
                    assert!(splits.windows(2).all(|w| w[0].start < w[1].start));
                    ranges.extend(splits.iter().map(|sp| (sp.start, sp.end.unwrap_or(len))));
                }
                ranges.sort_unstable();
                let mut at = 0;
                for (start, end) in ranges {
                    assert_eq!(start, at, "len {len}, p {p}: a gap or an overlap");
                    at = end;
                }
                assert_eq!(at, len, "len {len}, p {p}: the end is not covered");
            }
        }
        // Blocks are dealt in turn: reader 1 of 2 starts one block in.
        let two = plan_splits(&[(path.clone(), 5 * STRIPE_BLOCK_BYTES)], 2, 1, true);
        let starts: Vec<u64> = two.iter().map(|sp| sp.start / STRIPE_BLOCK_BYTES).collect();
        assert_eq!(starts, [1, 3]);
        // Without striping: one contiguous range per reader, as before.
        let plain = plan_splits(&[(path, 5 * STRIPE_BLOCK_BYTES)], 2, 1, false);
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].clock, None);
    }

    #[test]
    fn striped_reading_replays_and_rescales_exactly_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.jsonl");
        let mut body = String::new();
        let mut big = Vec::new();
        let mut i = 0;
        while body.len() < (MIN_SPLIT_BYTES.max(3 * STRIPE_BLOCK_BYTES) + 4096) as usize {
            let line = format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(i % 29));
            body.push_str(&line);
            body.push('\n');
            big.push(line);
            i += 1;
        }
        std::fs::write(&path, &body).expect("write");
        big.sort();
        let plain = source(&path, weir_schema::RecordFormat::Jsonl, false);
        let make = move |s, p| plain(s, p).with_striping(true);
        for p in [1u32, 2, 3] {
            assert!(check_replay(&make, p, 7) == big, "{p} striped readers");
        }
        for chain in [&[2u32, 3, 1][..], &[3, 2], &[1, 3, 2]] {
            assert!(run_chain(&make, chain, 40) == big, "chain {chain:?}");
        }
    }

    #[test]
    fn chains_of_rescales_read_everything_exactly_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let everything = write_files(dir.path(), 3, 2500);
        let make = source(dir.path(), weir_schema::RecordFormat::Jsonl, false);
        for chain in [&[1u32, 3, 2][..], &[3, 1, 2], &[2, 4, 3, 1]] {
            assert!(run_chain(&make, chain, 1) == everything, "chain {chain:?}");
        }

        // One big file cut into byte ranges, the ranges moving between readers.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.jsonl");
        let mut body = String::new();
        let mut big = Vec::new();
        let mut i = 0;
        while body.len() < MIN_SPLIT_BYTES as usize + 4096 {
            let line = format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(i % 17));
            body.push_str(&line);
            body.push('\n');
            big.push(line);
            i += 1;
        }
        std::fs::write(&path, &body).expect("write");
        big.sort();
        let make = source(&path, weir_schema::RecordFormat::Jsonl, false);
        for chain in [&[2u32, 3, 1][..], &[3, 2], &[1, 3, 2]] {
            assert!(run_chain(&make, chain, 3) == big, "chain {chain:?}");
        }
    }

    #[test]
    fn rescaled_restore_refuses_foreign_snapshots() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_files(dir.path(), 2, 10);
        let make = source(dir.path(), weir_schema::RecordFormat::Jsonl, false);
        let mut a = make(1, 2);
        let mut c = ctx(1, 2, None);
        a.open(&mut c).expect("open");
        let snap = a.snapshot().expect("snapshot");
        // Old reader 1 goes to new reader 1 of 3, not to reader 0.
        let mut b = make(0, 3);
        let c = ctx(0, 3, Some(1));
        let err = b
            .restore_rescaled(&[snap.as_slice()], &c)
            .expect_err("wrong reader");
        assert!(err.to_string().contains("does not belong"), "{err}");
        let follow = source(dir.path(), weir_schema::RecordFormat::Jsonl, true);
        let mut b = follow(1, 3);
        let c = ctx(1, 3, Some(1));
        let err = b
            .restore_rescaled(&[snap.as_slice()], &c)
            .expect_err("follow changed");
        assert!(err.to_string().contains("follow"), "{err}");
        assert!(b.restore_rescaled(&[b"junk".as_slice()], &c).is_err());
    }

    #[test]
    fn version_one_snapshots_restore_with_the_plain_follow_rule() {
        #[derive(Serialize)]
        struct V1 {
            version: u32,
            subtask: u32,
            parallelism: u32,
            follow: bool,
            splits: Vec<SplitState>,
            known: Vec<PathBuf>,
        }
        let bytes = crate::record::encode(&V1 {
            version: 1,
            subtask: 0,
            parallelism: 2,
            follow: true,
            splits: Vec::new(),
            known: Vec::new(),
        })
        .expect("encode");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = source(dir.path(), weir_schema::RecordFormat::Lines, true)(0, 2);
        b.restore(&bytes).expect("restore version 1");
        assert_eq!(b.lineage, Some(Vec::new()));
        let mut b = source(dir.path(), weir_schema::RecordFormat::Lines, true)(0, 3);
        b.restore_rescaled(&[bytes.as_slice()], &ctx(0, 3, Some(1)))
            .expect("rescale version 1");
        assert_eq!(b.lineage, Some(vec![2]));
    }

    /// Appends `lines` (each with a newline) to `path`, creating it.
    fn append(path: &Path, lines: &[&str]) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open for append");
        for l in lines {
            std::io::Write::write_all(&mut f, format!("{l}\n").as_bytes()).expect("append");
        }
    }

    /// The `{"line": ...}` records of `lines`.
    fn as_records(lines: &[&str]) -> Vec<String> {
        lines
            .iter()
            .map(|l| format!("{{\"line\":\"{l}\"}}"))
            .collect()
    }

    /// A directory `real/` holding `a.log` (two lines), and `link -> real`.
    #[cfg(unix)]
    fn spelled_twice() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        append(&real.join("a.log"), &["one", "two"]);
        std::os::unix::fs::symlink(&real, dir.path().join("link")).expect("symlink");
        (dir, real)
    }

    #[cfg(unix)]
    #[test]
    fn a_file_is_one_split_however_its_path_is_spelled() {
        let (dir, real) = spelled_twice();
        let root = dir.path();
        // Each pair: the pattern of the run that snapshots, the pattern of the run that
        // restores (a reload that resolves against another directory, a symlink, a glob).
        let pairs = [
            (root.join("link/a.log"), real.join("a.log")),
            (root.join("real/../link/a.log"), root.join("link/a.log")),
            (root.join("link/*.log"), real.join("*.log")),
            (real.join("*.log"), root.join("link/../real/*.log")),
        ];
        for (i, (before, after)) in pairs.iter().enumerate() {
            let tag = format!("p{i}");
            let mut a = source(before, weir_schema::RecordFormat::Lines, true)(0, 1);
            let mut c = ctx(0, 1, None);
            a.open(&mut c).expect("open");
            let head = poll_until_quiet(&mut a, &mut c);
            assert_eq!(
                head.len(),
                2 * (i + 1),
                "pattern {before:?} reads every line once"
            );
            let snap = a.snapshot().expect("snapshot");
            let new = [format!("{tag}-x"), format!("{tag}-y")];
            let new: Vec<&str> = new.iter().map(String::as_str).collect();
            append(&real.join("a.log"), &new);

            let mut b = source(after, weir_schema::RecordFormat::Lines, true)(0, 1);
            let mut c = ctx(0, 1, Some(1));
            b.open(&mut c).expect("open");
            b.restore(&snap).expect("restore");
            assert_eq!(
                poll_until_quiet(&mut b, &mut c),
                as_records(&new),
                "snapshot under {before:?}, restored under {after:?}: only the new lines, once"
            );
            let state = b.state();
            assert_eq!(state.splits.len(), 1, "{:?}", state.splits);
            assert_eq!(state.known.len(), 1, "{:?}", state.known);
            let canonical = std::fs::canonicalize(real.join("a.log")).expect("canonical");
            assert_eq!(state.splits[0].split.path, canonical);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_listing_that_reaches_one_file_twice_reads_it_once() {
        let (dir, real) = spelled_twice();
        std::os::unix::fs::symlink(real.join("a.log"), real.join("b.log")).expect("symlink");
        for follow in [false, true] {
            let mut a = source(
                &real.join("*.log"),
                weir_schema::RecordFormat::Lines,
                follow,
            )(0, 1);
            let mut c = ctx(0, 1, None);
            a.open(&mut c).expect("open");
            let got = if follow {
                poll_until_quiet(&mut a, &mut c)
            } else {
                drain_all(&mut a, &mut c)
            };
            assert_eq!(got, as_records(&["one", "two"]), "follow: {follow}");
        }
        drop(dir);
    }

    /// A version 2 snapshot (paths as spelled, no file ids) of one follow reader holding
    /// `splits`.
    fn version_two(splits: Vec<(PathBuf, Progress)>, known: Vec<PathBuf>) -> Vec<u8> {
        #[derive(Serialize)]
        struct V2Split {
            split: Split,
            progress: Progress,
        }
        #[derive(Serialize)]
        struct V2 {
            version: u32,
            subtask: u32,
            parallelism: u32,
            follow: bool,
            splits: Vec<V2Split>,
            known: Vec<PathBuf>,
            lineage: Option<Vec<u32>>,
        }
        crate::record::encode(&V2 {
            version: 2,
            subtask: 0,
            parallelism: 1,
            follow: true,
            splits: splits
                .into_iter()
                .map(|(path, progress)| V2Split {
                    split: Split::whole(path),
                    progress,
                })
                .collect(),
            known,
            lineage: Some(Vec::new()),
        })
        .expect("encode")
    }

    fn at(offset: u64) -> Progress {
        Progress::Reading(Resume {
            offset,
            line: None,
            header: None,
        })
    }

    #[cfg(unix)]
    #[test]
    fn two_entries_for_one_file_merge_when_they_agree_and_are_refused_otherwise() {
        let (dir, real) = spelled_twice();
        let spelled = [dir.path().join("link/a.log"), real.join("a.log")];
        let end = std::fs::metadata(real.join("a.log")).expect("stat").len();
        let pattern = real.join("*.log");
        let make = source(&pattern, weir_schema::RecordFormat::Lines, true);

        // Both spellings at the end of the file (what the old double read left behind): one
        // split, and the lines that follow are read once.
        let agreeing = version_two(
            vec![(spelled[0].clone(), at(end)), (spelled[1].clone(), at(end))],
            spelled.to_vec(),
        );
        let mut b = make(0, 1);
        let mut c = ctx(0, 1, Some(1));
        b.open(&mut c).expect("open");
        b.restore(&agreeing).expect("agreeing entries restore");
        append(&real.join("a.log"), &["three"]);
        assert_eq!(poll_until_quiet(&mut b, &mut c), as_records(&["three"]));
        assert_eq!(b.state().splits.len(), 1);
        assert_eq!(
            b.state().owner_key,
            OwnerKey::Listed,
            "hashing stays as it was"
        );

        // Two different positions: refused, naming the file and both positions.
        let disagreeing = version_two(
            vec![(spelled[0].clone(), at(4)), (spelled[1].clone(), at(end))],
            spelled.to_vec(),
        );
        let mut b = make(0, 1);
        let mut c = ctx(0, 1, Some(1));
        b.open(&mut c).expect("open");
        let err = b
            .restore(&disagreeing)
            .expect_err("which position is right?");
        let msg = err.to_string();
        let canonical = std::fs::canonicalize(real.join("a.log")).expect("canonical");
        assert!(msg.contains(&canonical.display().to_string()), "{msg}");
        assert!(
            msg.contains("byte 4") && msg.contains(&format!("byte {end}")),
            "{msg}"
        );
        assert!(
            msg.contains("--fresh") && msg.contains("--from-checkpoint"),
            "{msg}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_restore_refuses_a_file_replaced_after_the_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.log");
        append(&path, &["one", "two"]);
        let make = source(&path, weir_schema::RecordFormat::Lines, true);
        let mut a = make(0, 1);
        let mut c = ctx(0, 1, None);
        a.open(&mut c).expect("open");
        assert_eq!(poll_until_quiet(&mut a, &mut c).len(), 2);
        let snap = a.snapshot().expect("snapshot");

        // Rotated: a longer file takes the name, by rename (another inode).
        let new = dir.path().join("a.log.new");
        append(&new, &["other", "lines", "entirely"]);
        let _keep_inode_alive = std::fs::File::open(&path).expect("old file");
        std::fs::rename(&new, &path).expect("rename over");
        let mut b = make(0, 1);
        let mut c = ctx(0, 1, Some(1));
        b.open(&mut c).expect("open");
        let err = b.restore(&snap).expect_err("another file at the path");
        let msg = err.to_string();
        assert!(msg.contains("a.log") && msg.contains("replaced"), "{msg}");
        assert!(msg.contains("--fresh"), "{msg}");
    }

    #[test]
    fn lineage_keeps_only_entries_that_change_owners() {
        assert_eq!(extend_lineage(Vec::new(), 3), [3]);
        assert_eq!(extend_lineage(vec![3], 5), [3], "mod 3 mod 5 = mod 3");
        assert_eq!(extend_lineage(vec![3], 2), [3, 2]);
        assert_eq!(extend_lineage(vec![3, 2], 2), [3, 2]);
        for n in 0..200 {
            let path = PathBuf::from(format!("/in/file-{n}.log"));
            assert!(follow_owner(&path, &[], 4) < 4);
            assert!(follow_owner(&path, &[3, 2], 5) < 2);
        }
    }

    /// Polls a follow-mode reader until it has been idle twice in a row.
    fn poll_until_quiet(src: &mut FileSource, c: &mut SourceContext) -> Vec<String> {
        let mut all = Vec::new();
        let mut idle = 0;
        for _ in 0..100 {
            let mut out = Vec::new();
            match src.poll(&mut out, c).expect("poll") {
                Poll::Idle(_) => idle += 1,
                _ => idle = 0,
            }
            all.extend(text(&out));
            if idle == 2 {
                break;
            }
        }
        all
    }

    #[test]
    fn follow_mode_rescales_discover_every_file_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let make = source(dir.path(), weir_schema::RecordFormat::Lines, true);
        let mut written = Vec::new();
        let add = |name: &str, lines: std::ops::Range<usize>, written: &mut Vec<String>| {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.path().join(name))
                .expect("open");
            for i in lines {
                let line = format!("{name}-{i}");
                std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()).expect("write");
                written.push(format!("{{\"line\":\"{line}\"}}"));
            }
        };
        for f in 0..6 {
            add(&format!("a{f}.log"), 0..3, &mut written);
        }
        let mut read = Vec::new();
        let mut snaps: Option<Vec<Vec<u8>>> = None;
        let mut old_p = u32::MAX;
        for (stage, p) in [2u32, 3, 1, 2, 4].into_iter().enumerate() {
            let mut readers = Vec::new();
            for s in 0..p {
                let (mut src, mut c) = match &snaps {
                    Some(old) => rescaled(&make, old, s, p),
                    None => {
                        let mut src = make(s, p);
                        let mut c = ctx(s, p, None);
                        src.open(&mut c).expect("open");
                        (src, c)
                    }
                };
                let got = poll_until_quiet(&mut src, &mut c);
                if s >= old_p {
                    assert!(
                        got.is_empty(),
                        "reader {s} of {p} was added: it owns nothing"
                    );
                }
                read.extend(got);
                readers.push((src, c));
            }
            old_p = p;
            // More lines in old files and new files, some read before the snapshot and
            // some discovered only after the restore.
            for f in 0..6 {
                add(
                    &format!("a{f}.log"),
                    3 + stage * 2..5 + stage * 2,
                    &mut written,
                );
            }
            for f in 0..3 {
                add(&format!("b{stage}-{f}.log"), 0..2, &mut written);
            }
            for (src, c) in readers.iter_mut().take(1) {
                read.extend(poll_until_quiet(src, c));
            }
            for f in 0..3 {
                add(&format!("c{stage}-{f}.log"), 0..2, &mut written);
            }
            snaps = Some(
                readers
                    .iter_mut()
                    .map(|(src, _)| src.snapshot().expect("snapshot"))
                    .collect(),
            );
        }
        // The last stage's snapshots, restored once more, pick up what is left.
        if let Some(old) = &snaps {
            for s in 0..3 {
                let (mut src, mut c) = rescaled(&make, old, s, 3);
                read.extend(poll_until_quiet(&mut src, &mut c));
            }
        }
        read.sort();
        written.sort();
        assert!(
            read == written,
            "read {} of {} lines",
            read.len(),
            written.len()
        );
    }
}
