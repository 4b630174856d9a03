//! The `file` source and sink.
//!
//! Source: a file, a directory (its non-hidden files in name order) or a glob, read as jsonl,
//! csv or lines. With several readers, files are dealt out by index; when there are fewer
//! files than readers, large files are cut into byte ranges aligned to line starts, so one big
//! file is still read in parallel. With `follow`, every assigned file stays open, growth is
//! picked up, and new matching files join.
//!
//! Sink: each subtask writes part files `<prefix>-<subtask>-<n>.<ext>` into the directory,
//! rolling at `max_part_size`.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rhai::Dynamic;
use weir_schema::SourceOnError;

use super::{LineParser, Poll, RecordWriter, Source, SourceContext};
use crate::operators::{Operator, OperatorContext};
use crate::runtime::error::{Result, RunError};
use crate::runtime::{BATCH_SIZE, Batch};

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
#[derive(Clone, Debug, PartialEq, Eq)]
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

struct Reader {
    split: Split,
    reader: BufReader<File>,
    /// Offset of the next unread byte.
    pos: u64,
    /// Line number of the last line read, when known (reading from the file start).
    line: Option<u64>,
    buf: Vec<u8>,
    parser: LineParser,
    done: bool,
}

/// The `file` source, one reader subtask.
pub struct FileSource {
    pattern: PathBuf,
    parser: LineParser,
    on_error: SourceOnError,
    follow: bool,
    subtask: u32,
    parallelism: u32,
    pending: VecDeque<Split>,
    active: Vec<Reader>,
    known: Vec<PathBuf>,
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
            parallelism,
            pending: VecDeque::new(),
            active: Vec::new(),
            known: Vec::new(),
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
                self.pending.push_back(Split {
                    path: f,
                    start: 0,
                    end: None,
                });
            }
        }
        Ok(())
    }

    fn open_split(&self, split: Split, ctx: &SourceContext) -> Result<Reader> {
        let path = split.path.clone();
        let file = File::open(&path).map_err(|e| io_err(ctx, "cannot read", &path, e))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut parser = self.parser.clone();
        let mut pos = split.start;
        let mut line = None;
        let mut buf = Vec::with_capacity(256);
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
            parser.set_header(&buf).map_err(|message| RunError::Parse {
                pipeline: ctx.pipeline.clone(),
                source_id: ctx.source.clone(),
                location: format!("{}:1", path.display()),
                message,
            })?;
            buf.clear();
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
}

impl Source for FileSource {
    fn open(&mut self, ctx: &mut SourceContext) -> Result<()> {
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
        self.pending = plan_splits(&sized, self.parallelism, self.subtask).into();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll> {
        if self.follow {
            while let Some(split) = self.pending.pop_front() {
                let r = self.open_split(split, ctx)?;
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
                let Some(split) = self.pending.pop_front() else {
                    return Ok(Poll::Done);
                };
                let r = self.open_split(split, ctx)?;
                self.active.push(r);
            }
            self.drain(0, out, ctx)?;
            if self.active[0].done {
                self.active.clear();
            }
            if out.len() >= BATCH_SIZE {
                return Ok(Poll::Ready);
            }
        }
    }
}

/// The `file` sink, one writer subtask.
pub struct FileSink {
    dir: PathBuf,
    prefix: String,
    ext: &'static str,
    csv: bool,
    max_part_size: Option<u64>,
    subtask: u32,
    part: u32,
    file: Option<BufWriter<File>>,
    written: u64,
    buf: Vec<u8>,
    writer: RecordWriter,
}

impl FileSink {
    /// A writer subtask into `dir`.
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
            part: 0,
            file: None,
            written: 0,
            buf: Vec::with_capacity(1 << 16),
            writer: RecordWriter::new(csv),
        }
    }

    fn part_path(&self) -> PathBuf {
        self.dir.join(format!(
            "{}-{}-{}.{}",
            self.prefix, self.subtask, self.part, self.ext
        ))
    }

    fn io(&self, ctx: &OperatorContext, path: PathBuf, source: std::io::Error) -> RunError {
        RunError::Io {
            pipeline: ctx.pipeline.to_string(),
            element: ctx.operator.to_string(),
            what: "cannot write",
            path,
            source,
        }
    }

    fn flush_buf(&mut self, ctx: &OperatorContext) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            let path = self.part_path();
            let f = File::create(&path).map_err(|e| self.io(ctx, path, e))?;
            self.file = Some(BufWriter::with_capacity(1 << 18, f));
        }
        let path = self.part_path();
        if let Some(f) = self.file.as_mut() {
            f.write_all(&self.buf).map_err(|e| RunError::Io {
                pipeline: ctx.pipeline.to_string(),
                element: ctx.operator.to_string(),
                what: "cannot write",
                path,
                source: e,
            })?;
        }
        self.written += self.buf.len() as u64;
        self.buf.clear();
        if self.max_part_size.is_some_and(|m| self.written >= m) {
            self.finish_part(ctx)?;
            self.part += 1;
            self.written = 0;
            self.writer = RecordWriter::new(self.csv);
        }
        Ok(())
    }

    fn finish_part(&mut self, ctx: &OperatorContext) -> Result<()> {
        if let Some(mut f) = self.file.take() {
            let path = self.part_path();
            f.flush().map_err(|e| self.io(ctx, path, e))?;
        }
        Ok(())
    }
}

/// Removes part files an earlier run left in a sink directory (`<prefix>-<n>-<n>.<ext>`), and
/// creates the directory.
///
/// # Errors
/// When the directory cannot be created or read.
pub fn prepare_sink_dir(dir: &Path, prefix: &str, ext: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        let Some(stem) = rest.strip_suffix(ext).and_then(|r| r.strip_suffix('.')) else {
            continue;
        };
        let mut parts = stem.split('-');
        let ok = matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None)
            if !a.is_empty() && !b.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit()));
        if ok {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

impl Operator for FileSink {
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

    fn close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.flush_buf(ctx)?;
        self.finish_part(ctx)
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
}
