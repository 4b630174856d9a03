//! The `file` source and sink.
//!
//! Source: a file, a directory (its non-hidden files in name order) or a glob, read as jsonl,
//! csv or lines. With several readers, files are dealt out by index; when there are fewer
//! files than readers, large files are cut into byte ranges aligned to line starts, so one big
//! file is still read in parallel. With `follow`, every assigned file stays open, growth is
//! picked up, and new matching files join.
//!
//! Replayable: a snapshot is the exact position of every split (the byte offset of the next
//! unread line, its line number, the CSV header, which splits are done) and, in follow mode,
//! the files known so far. A restore seeks every split back to its offset, so the polls that
//! follow yield exactly the records that followed the snapshot, in the same order; the split
//! plan is the checkpoint's, not recomputed from today's file sizes.
//!
//! The sink (two-phase commit) lives in [`super::file_sink`] and is re-exported here. This
//! module reads files and never writes them.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rhai::Dynamic;
use serde::{Deserialize, Serialize};
use weir_schema::SourceOnError;

use super::{LineParser, Poll, Source, SourceContext};
use crate::runtime::BATCH_SIZE;
use crate::runtime::error::{Result, RunError};

pub use super::file_sink::{FileSink, prepare_sink_dir};

/// Files smaller than this are never cut into ranges.
const MIN_SPLIT_BYTES: u64 = 1 << 20;

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

/// A byte range of one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The file.
    pub path: PathBuf,
    /// First byte (a line starting at or after it is ours).
    pub start: u64,
    /// Lines starting at or after this byte belong to the next split; `None` reads to the end.
    pub end: Option<u64>,
}

/// The splits of reader `subtask` out of `parallelism` for bounded reading.
pub fn plan_splits(files: &[(PathBuf, u64)], parallelism: u32, subtask: u32) -> Vec<Split> {
    let p = u64::from(parallelism.max(1));
    let s = u64::from(subtask);
    let mut out = Vec::new();
    let cut = (files.len() as u64) < p;
    for (i, (path, len)) in files.iter().enumerate() {
        if cut && *len >= MIN_SPLIT_BYTES {
            let start = s * len / p;
            let end = (s + 1) * len / p;
            out.push(Split {
                path: path.clone(),
                start,
                end: if s + 1 == p { None } else { Some(end) },
            });
        } else if i as u64 % p == s {
            out.push(Split {
                path: path.clone(),
                start: 0,
                end: None,
            });
        }
    }
    out
}

/// Where to pick a split up again: the next unread line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Resume {
    /// Byte offset of the first byte of the next unread line.
    offset: u64,
    /// Number of the last line read (so the next line is `line + 1`), when known: only when
    /// the split was read from the start of its file.
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

/// One split and its progress, in a [`FileSourceState`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SplitState {
    split: Split,
    progress: Progress,
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
}

impl FileSourceState {
    const VERSION: u32 = 1;
}

/// A split waiting to be opened, fresh or resumed.
struct Queued {
    split: Split,
    resume: Option<Resume>,
}

struct Reader {
    split: Split,
    reader: BufReader<File>,
    /// Offset of the next unread byte (in follow mode, past a partial line kept in `buf`).
    pos: u64,
    /// Line number of the last line read, when known (reading from the file start).
    line: Option<u64>,
    /// A partial line (follow mode) or the line being parsed.
    buf: Vec<u8>,
    parser: LineParser,
    /// The CSV header line, when the format has one.
    header: Option<Vec<u8>>,
    done: bool,
}

impl Reader {
    /// The position to resume from: the start of the next unread (or partial) line.
    fn resume(&self) -> Resume {
        Resume {
            offset: self.pos - self.buf.len() as u64,
            line: self.line,
            header: self.header.clone(),
        }
    }
}

/// The `file` source, one reader subtask.
pub struct FileSource {
    pattern: PathBuf,
    parser: LineParser,
    on_error: SourceOnError,
    follow: bool,
    subtask: u32,
    parallelism: u32,
    pending: VecDeque<Queued>,
    active: Vec<Reader>,
    /// Splits read to their end (bounded mode).
    finished: Vec<Split>,
    known: Vec<PathBuf>,
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

impl FileSource {
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
            on_error,
            follow,
            subtask,
            parallelism: parallelism.max(1),
            pending: VecDeque::new(),
            active: Vec::new(),
            finished: Vec::new(),
            known: Vec::new(),
            ids: (String::new(), String::new()),
        }
    }

    fn owns_in_follow(&self, path: &Path) -> bool {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in path.to_string_lossy().bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h % u64::from(self.parallelism.max(1)) == u64::from(self.subtask)
    }

    fn rescan(&mut self, ctx: &SourceContext) -> Result<()> {
        let files =
            list_files(&self.pattern).map_err(|e| io_err(ctx, "cannot list", &self.pattern, e))?;
        for f in files {
            if !self.known.contains(&f) && self.owns_in_follow(&f) && f.exists() {
                self.known.push(f.clone());
                self.pending.push_back(Queued {
                    split: Split {
                        path: f,
                        start: 0,
                        end: None,
                    },
                    resume: None,
                });
            }
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
        let Queued { split, resume } = queued;
        let path = split.path.clone();
        let file = File::open(&path).map_err(|e| io_err(ctx, "cannot read", &path, e))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut parser = self.parser.clone();
        let mut buf = Vec::with_capacity(256);
        if let Some(resume) = resume {
            if let Some(h) = &resume.header {
                parser
                    .set_header(h)
                    .map_err(|m| Self::header_error(ctx, &path, m))?;
            }
            reader
                .seek(SeekFrom::Start(resume.offset))
                .map_err(|e| io_err(ctx, "cannot read", &path, e))?;
            return Ok(Reader {
                split,
                reader,
                pos: resume.offset,
                line: resume.line,
                buf,
                parser,
                header: resume.header,
                done: false,
            });
        }
        let mut pos = split.start;
        let mut line = None;
        let mut header = None;
        if parser.expects_header() {
            if split.start == 0 {
                let n = reader
                    .read_until(b'\n', &mut buf)
                    .map_err(|e| io_err(ctx, "cannot read", &path, e))?;
                pos = n as u64;
                line = Some(1);
            } else {
                let mut head = BufReader::new(
                    File::open(&path).map_err(|e| io_err(ctx, "cannot read", &path, e))?,
                );
                head.read_until(b'\n', &mut buf)
                    .map_err(|e| io_err(ctx, "cannot read", &path, e))?;
            }
            parser
                .set_header(&buf)
                .map_err(|m| Self::header_error(ctx, &path, m))?;
            header = Some(std::mem::take(&mut buf));
        } else if split.start == 0 {
            line = Some(0);
        }
        if split.start > 0 {
            // Skip the line that started in the previous split (it belongs there).
            reader
                .seek(SeekFrom::Start(split.start - 1))
                .map_err(|e| io_err(ctx, "cannot read", &path, e))?;
            let n = reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| io_err(ctx, "cannot read", &path, e))?;
            pos = split.start - 1 + n as u64;
            buf.clear();
        }
        Ok(Reader {
            split,
            reader,
            pos,
            line,
            buf,
            parser,
            header,
            done: false,
        })
    }

    /// Reads lines from one reader into `out`; returns whether it produced anything.
    fn drain(
        &mut self,
        idx: usize,
        out: &mut Vec<Dynamic>,
        ctx: &mut SourceContext,
    ) -> Result<bool> {
        let follow = self.follow;
        let on_error = self.on_error;
        let r = &mut self.active[idx];
        let mut produced = false;
        while out.len() < BATCH_SIZE {
            if r.split.end.is_some_and(|e| r.pos >= e) {
                r.done = true;
                break;
            }
            let had = r.buf.len();
            let n = r
                .reader
                .read_until(b'\n', &mut r.buf)
                .map_err(|e| io_err(ctx, "cannot read", &r.split.path, e))?;
            if n == 0 {
                if !follow {
                    r.done = true;
                }
                break;
            }
            if follow && r.buf.last() != Some(&b'\n') {
                // A partial line being written: wait for its end.
                r.pos += n as u64;
                break;
            }
            let line_start = r.pos - had as u64;
            r.pos += n as u64;
            if let Some(l) = r.line.as_mut() {
                *l += 1;
            }
            match r.parser.parse(&r.buf) {
                Ok(Some(rec)) => {
                    out.push(rec);
                    produced = true;
                }
                Ok(None) => {}
                Err(message) => match on_error {
                    SourceOnError::Skip => ctx.skipped += 1,
                    SourceOnError::Fail => {
                        let line = r.line.or_else(|| line_number_at(&r.split.path, line_start));
                        let location = match line {
                            Some(l) => format!("{}:{l}", r.split.path.display()),
                            None => format!("{}@{line_start}", r.split.path.display()),
                        };
                        return Err(RunError::Parse {
                            pipeline: ctx.pipeline.clone(),
                            source_id: ctx.source.clone(),
                            location,
                            message,
                        });
                    }
                },
            }
            r.buf.clear();
        }
        Ok(produced)
    }

    /// The current position of every split, in reading order.
    fn state(&self) -> FileSourceState {
        let mut splits =
            Vec::with_capacity(self.finished.len() + self.active.len() + self.pending.len());
        splits.extend(self.finished.iter().map(|s| SplitState {
            split: s.clone(),
            progress: Progress::Done,
        }));
        splits.extend(self.active.iter().map(|r| SplitState {
            split: r.split.clone(),
            progress: if r.done {
                Progress::Done
            } else {
                Progress::Reading(r.resume())
            },
        }));
        splits.extend(self.pending.iter().map(|q| SplitState {
            split: q.split.clone(),
            progress: match &q.resume {
                Some(r) => Progress::Reading(r.clone()),
                None => Progress::Unread,
            },
        }));
        FileSourceState {
            version: FileSourceState::VERSION,
            subtask: self.subtask,
            parallelism: self.parallelism,
            follow: self.follow,
            splits,
            known: self.known.clone(),
        }
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

    /// Checks that `path` still reaches byte `offset`.
    fn check_resumable(&self, path: &Path, offset: u64) -> Result<()> {
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
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
        let mut sized = Vec::with_capacity(files.len());
        for f in files {
            let len = std::fs::metadata(&f)
                .map_err(|e| io_err(ctx, "cannot read", &f, e))?
                .len();
            sized.push((f, len));
        }
        self.pending = plan_splits(&sized, self.parallelism, self.subtask)
            .into_iter()
            .map(|split| Queued {
                split,
                resume: None,
            })
            .collect();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll> {
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
                return Ok(Poll::Idle(Duration::from_millis(100)));
            }
            return Ok(Poll::Ready);
        }
        loop {
            if self.active.is_empty() {
                let Some(q) = self.pending.pop_front() else {
                    return Ok(Poll::Done);
                };
                let r = self.open_split(q, ctx)?;
                self.active.push(r);
            }
            self.drain(0, out, ctx)?;
            if self.active[0].done {
                let r = self.active.remove(0);
                self.finished.push(r.split);
            }
            if out.len() >= BATCH_SIZE {
                return Ok(Poll::Ready);
            }
        }
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
    /// is missing or shorter than its recorded offset (the input changed under the
    /// checkpoint).
    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let (pipeline, source) = self.ids.clone();
        let state: FileSourceState = crate::record::decode(snapshot).map_err(|e| {
            RunError::State(format!(
                "source `{source}`: malformed file source snapshot: {e}"
            ))
        })?;
        if state.version != FileSourceState::VERSION {
            return Err(RunError::State(format!(
                "source `{source}`: file source snapshot version {} is not supported (this \
                 build reads version {})",
                state.version,
                FileSourceState::VERSION
            )));
        }
        if state.parallelism != self.parallelism || state.subtask != self.subtask {
            return Err(RunError::Build {
                pipeline,
                element: source,
                message: format!(
                    "cannot restore file reader {} of {} from a snapshot of reader {} of {}: a \
                     file source cannot change its parallelism across a restore",
                    self.subtask, self.parallelism, state.subtask, state.parallelism
                ),
            });
        }
        if state.follow != self.follow {
            return Err(RunError::Build {
                pipeline,
                element: source,
                message: format!(
                    "cannot restore: the checkpoint was taken with `follow: {}`, the pipeline \
                     now says `follow: {}`",
                    state.follow, self.follow
                ),
            });
        }
        let mut finished = Vec::new();
        let mut pending = VecDeque::new();
        for s in state.splits {
            match s.progress {
                Progress::Done => finished.push(s.split),
                Progress::Unread => {
                    self.check_resumable(&s.split.path, s.split.start)?;
                    pending.push_back(Queued {
                        split: s.split,
                        resume: None,
                    });
                }
                Progress::Reading(resume) => {
                    self.check_resumable(&s.split.path, resume.offset)?;
                    pending.push_back(Queued {
                        split: s.split,
                        resume: Some(resume),
                    });
                }
            }
        }
        self.finished = finished;
        self.pending = pending;
        self.active.clear();
        self.known = state.known;
        Ok(())
    }
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
                let mut ctx = SourceContext {
                    pipeline: "p".into(),
                    source: "s".into(),
                    subtask: s,
                    parallelism: p,
                    skipped: 0,
                    restored_from: None,
                };
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
    fn malformed_line_reports_file_and_line_or_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.jsonl");
        std::fs::write(&path, "{\"a\":1}\n{\"a\":2}\n{oops\n{\"a\":4}\n").expect("write");
        let mut ctx = SourceContext {
            pipeline: "p".into(),
            source: "s".into(),
            subtask: 0,
            parallelism: 1,
            skipped: 0,
            restored_from: None,
        };
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

    fn ctx(s: u32, p: u32, restored_from: Option<u64>) -> SourceContext {
        SourceContext {
            pipeline: "p".into(),
            source: "s".into(),
            subtask: s,
            parallelism: p,
            skipped: 0,
            restored_from,
        }
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
            assert!(snaps.len() > 2, "the input must take several polls");
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
}
