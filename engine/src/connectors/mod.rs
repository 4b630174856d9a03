//! Connectors: sources ([`Source`], a sibling of the operator trait) and sinks (operators that
//! write and pass nothing on). File (jsonl/csv/lines over a file, directory or glob, optional
//! follow), generator (seeded, count, rate), stdin; file and stdout sinks. Connectors turn
//! bytes into records and back; they never see channels. Shared here: parsing a record of a
//! format ([`LineParser`]), finding where a CSV record ends ([`CsvFramer`]), and a source's
//! `on_error` for records it cannot read ([`BadRecords`]: fail naming `file:line`, skip with a
//! rate-limited log line, or a dead letter carrying the file, line and raw text).

use std::time::{Duration, Instant};

use rhai::{Dynamic, Map};
use weir_schema::{CsvOptions, RecordFormat, SourceOnError};

use crate::base::clock::Clock;
use crate::base::error::{Result, RunError};
use crate::base::message::Watermark;

pub mod event_time;
pub mod file;
pub mod file_sink;
pub mod generator;
pub mod kafka;
mod kafka_batch;
pub mod pacing;
pub mod postgres;
pub mod stdin;
pub mod stdout;

/// What a poll produced besides the records it appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// More may be ready now.
    Ready,
    /// Nothing now; poll again after the delay (follow mode, rate limit).
    Idle(Duration),
    /// The source is exhausted.
    Done,
}

/// The world of one source subtask.
#[derive(Clone, Debug)]
pub struct SourceContext {
    /// Pipeline id.
    pub pipeline: String,
    /// The source's id.
    pub source: String,
    /// This subtask.
    pub subtask: u32,
    /// The source's parallelism.
    pub parallelism: u32,
    /// Malformed inputs skipped under `on_error: skip`.
    pub skipped: u64,
    /// Dead letters for malformed inputs under `on_error: {dead_letter: ...}`, since the task
    /// last collected them.
    pub dead_letters: Vec<Dynamic>,
    /// Bytes read so far (sources that read bytes add to it; the task turns it into a metric).
    pub bytes_read: u64,
    /// The checkpoint this run restored from (`None` on a fresh start).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub restored_from: Option<u64>,
    /// Processing time (a manual clock under `weir test`).
    pub clock: Clock,
    /// Whether the source should say which split its records come from
    /// ([`mark_split`](Self::mark_split), [`end_split`](Self::end_split)): set when the
    /// source declares `event_time`, whose watermarks are made per split.
    pub track_splits: bool,
    /// `(index in the poll's output, split id)`: the records from that index on come from
    /// that split (see [`crate::connectors::event_time`]).
    pub split_marks: Vec<(usize, u64)>,
    /// Splits finished during the poll.
    pub ended_splits: Vec<u64>,
    /// The event times of the poll's records, in order, when the source declares
    /// `event_time` (its wrapper reads them for the watermarks); the task hands them on with
    /// the records ([`Batch::times`](crate::base::message::Batch::times)).
    pub times: Vec<i64>,
    /// Splits assigned to this subtask and not read yet, as the source last listed them
    /// ([`assign_splits`](Self::assign_splits)): they hold the watermark back until their
    /// first record, so that reading them later never makes their records late.
    pub assigned_splits: Vec<u64>,
}

impl SourceContext {
    /// The context of subtask `subtask` of `parallelism` of `source`, nothing read yet.
    pub fn new(
        pipeline: &str,
        source: &str,
        subtask: u32,
        parallelism: u32,
        restored_from: Option<u64>,
    ) -> Self {
        Self {
            pipeline: pipeline.to_owned(),
            source: source.to_owned(),
            subtask,
            parallelism,
            skipped: 0,
            dead_letters: Vec::new(),
            bytes_read: 0,
            restored_from,
            clock: Clock::System,
            track_splits: false,
            split_marks: Vec::new(),
            ended_splits: Vec::new(),
            times: Vec::new(),
            assigned_splits: Vec::new(),
        }
    }

    /// The records the source appends to its output from index `at` on come from split `id`
    /// (a stable number: the same split has the same id after a restore). Only needed from a
    /// source that reads several splits in one poll; a no-op unless splits are tracked.
    pub fn mark_split(&mut self, id: u64, at: usize) {
        if self.track_splits {
            self.split_marks.push((at, id));
        }
    }

    /// The splits this subtask will read but has not started (a source that queues splits
    /// lists them at every poll); a no-op unless splits are tracked.
    pub fn assign_splits(&mut self, ids: impl Iterator<Item = u64>) {
        if self.track_splits {
            self.assigned_splits.clear();
            self.assigned_splits.extend(ids);
        }
    }

    /// Split `id` is read to its end: it no longer holds the watermark back.
    pub fn end_split(&mut self, id: u64) {
        if self.track_splits {
            self.ended_splits.push(id);
        }
    }
}

/// One source subtask.
///
/// Call order: `open` → (`restore`, when starting from a checkpoint) → `poll`* (with
/// `snapshot` between polls, at barriers) → `close`. A replayable source's snapshot is its
/// exact position: restoring it and polling again yields exactly the records that followed
/// the snapshot in the first run, in the same order.
pub trait Source: Send {
    /// Opens files or connections.
    ///
    /// # Errors
    /// When the input cannot be opened.
    fn open(&mut self, _ctx: &mut SourceContext) -> Result<()> {
        Ok(())
    }

    /// Appends up to about [`crate::base::message::BATCH_SIZE`] records to `out`.
    ///
    /// # Errors
    /// A read failure, or a malformed input under `on_error: fail`.
    fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll>;

    /// The position to resume from (offsets), versioned bytes.
    ///
    /// # Errors
    /// When the position cannot be encoded.
    fn snapshot(&mut self) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }

    /// [`snapshot`](Self::snapshot) at the barrier of checkpoint `checkpoint`: what the task
    /// calls. A source that acts when a checkpoint completes
    /// ([`notify_checkpoint_complete`](Self::notify_checkpoint_complete)) overrides it to
    /// learn which checkpoint a position belongs to; the default forgets the id.
    ///
    /// # Errors
    /// As [`snapshot`](Self::snapshot).
    fn snapshot_for(&mut self, checkpoint: u64) -> Result<Vec<u8>> {
        let _ = checkpoint;
        self.snapshot()
    }

    /// Checkpoint `checkpoint` completed everywhere (and with it every earlier one this
    /// subtask took a snapshot for). For side effects outside Weir's state only, such as
    /// committing offsets to a consumer group for lag tools; the default does nothing.
    ///
    /// # Errors
    /// A failure the task should fail on (most sources only log).
    fn notify_checkpoint_complete(&mut self, _checkpoint: u64) -> Result<()> {
        Ok(())
    }

    /// Resumes from a snapshot; called after `open`, before the first poll.
    ///
    /// # Errors
    /// A malformed snapshot.
    fn restore(&mut self, _snapshot: &[u8]) -> Result<()> {
        Ok(())
    }

    /// Resumes after a change of parallelism (a savepoint restored into a rescaled
    /// pipeline): `snapshots` are the positions of the old subtasks assigned to this one
    /// (old subtask `j` goes to new subtask `j % parallelism`, in old-subtask order; possibly
    /// none), and `ctx` has the new subtask and parallelism. Called instead of
    /// [`restore`](Self::restore). The default refuses with an error naming the source.
    ///
    /// # Errors
    /// A source whose position cannot be redistributed.
    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &SourceContext) -> Result<()> {
        Err(crate::base::error::RunError::Build {
            pipeline: ctx.pipeline.clone(),
            element: ctx.source.clone(),
            message: format!(
                "this source cannot change its parallelism across a restore ({} positions \
                 for subtask {} of {}); restore with the old parallelism",
                snapshots.len(),
                ctx.subtask,
                ctx.parallelism
            ),
        })
    }

    /// The watermark made since the last call, if any (only a source with `event_time`
    /// makes them, see [`event_time::EventTimeSource`]); the task asks after each poll and
    /// after a restore, and sends it downstream after the poll's records.
    fn take_watermark(&mut self) -> Option<Watermark> {
        None
    }

    /// How far behind the end of its input the source is (bytes for files), when it can
    /// tell; `None` by default. Called about once a second, between polls, only when detailed
    /// metrics are on: it may ask the file system.
    fn lag(&mut self) -> Option<u64> {
        None
    }

    /// Where the source is in each partition of its input (Kafka), asked with
    /// [`lag`](Self::lag); empty (the default) for a source without partitions.
    fn partitions(&mut self) -> Vec<crate::base::metrics::PartitionProgress> {
        Vec::new()
    }

    /// Releases resources.
    ///
    /// # Errors
    /// A failure to close.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A record a source could not read: where it starts, its text and why.
#[derive(Debug)]
pub struct BadRecord<'a> {
    /// The file it was read from (`stdin` for standard input).
    pub file: &'a str,
    /// The 1-based line the record starts on.
    pub line: u64,
    /// The record's bytes as read (its last newline is dropped).
    pub raw: &'a [u8],
    /// What is wrong with it.
    pub message: String,
}

/// A source's `on_error` for records it cannot read, with the rate limit of its skip log.
#[derive(Debug)]
pub struct BadRecords {
    on_error: SourceOnError,
    /// When a skipped record was last logged.
    logged_at: Option<Instant>,
    /// Records skipped since then without a log line of their own.
    unlogged: u64,
}

/// At most one log line a second says which record a source skipped.
const SKIP_LOG_EVERY: Duration = Duration::from_secs(1);

impl BadRecords {
    /// The policy `on_error` says.
    pub fn new(on_error: &SourceOnError) -> Self {
        Self {
            on_error: on_error.clone(),
            logged_at: None,
            unlogged: 0,
        }
    }

    /// Applies the policy to `bad`: an error naming `file:line` under `fail`; otherwise the
    /// record is counted (`ctx.skipped`) and logged at most once a second, or its dead letter
    /// `{pipeline, source, subtask, file, line, raw, error}` queued on `ctx`.
    ///
    /// # Errors
    /// [`RunError::Parse`] under `on_error: fail`.
    pub fn failed(&mut self, ctx: &mut SourceContext, bad: BadRecord<'_>) -> Result<()> {
        let line = i64::try_from(bad.line).unwrap_or(i64::MAX);
        self.failed_with(
            ctx,
            &format!("{}:{}", bad.file, bad.line),
            vec![
                ("file", Dynamic::from(bad.file.to_owned())),
                ("line", Dynamic::from(line)),
            ],
            bad.raw,
            bad.message,
        )
    }

    /// [`failed`](Self::failed) for a record located otherwise than by file and line (a Kafka
    /// message: topic, partition, offset): `location` names it in errors and logs, and
    /// `fields` say where it is in its dead letter, between `subtask` and `raw`.
    ///
    /// # Errors
    /// [`RunError::Parse`] under `on_error: fail`.
    pub fn failed_with(
        &mut self,
        ctx: &mut SourceContext,
        location: &str,
        fields: Vec<(&'static str, Dynamic)>,
        raw: &[u8],
        message: String,
    ) -> Result<()> {
        match &self.on_error {
            SourceOnError::Fail => Err(RunError::Parse {
                pipeline: ctx.pipeline.clone(),
                source_id: ctx.source.clone(),
                location: location.to_owned(),
                message,
            }),
            SourceOnError::Skip => {
                ctx.skipped += 1;
                let now = Instant::now();
                if self
                    .logged_at
                    .is_some_and(|at| now.duration_since(at) < SKIP_LOG_EVERY)
                {
                    self.unlogged += 1;
                    return Ok(());
                }
                tracing::warn!(
                    pipeline = %ctx.pipeline,
                    source = %ctx.source,
                    at = %location,
                    error = %message,
                    skipped_unlogged = std::mem::take(&mut self.unlogged),
                    "Skipped a record that cannot be read (on_error: skip; at most one such line a second)."
                );
                self.logged_at = Some(now);
                Ok(())
            }
            SourceOnError::DeadLetter(_) => {
                let mut m = Map::new();
                m.insert("pipeline".into(), Dynamic::from(ctx.pipeline.clone()));
                m.insert("source".into(), Dynamic::from(ctx.source.clone()));
                m.insert("subtask".into(), Dynamic::from(i64::from(ctx.subtask)));
                for (k, v) in fields {
                    m.insert(k.into(), v);
                }
                let raw = String::from_utf8_lossy(trim_eol(raw)).into_owned();
                m.insert("raw".into(), Dynamic::from(raw));
                m.insert("error".into(), Dynamic::from(message));
                ctx.dead_letters.push(Dynamic::from_map(m));
                Ok(())
            }
        }
    }
}

/// Where a CSV record ends, found by the `csv` crate's own state machine (`csv-core`), so a
/// quoted field may hold newlines, delimiters and doubled quotes exactly as the parser reads
/// them. Fed one line at a time; its state carries over from one line to the next.
#[derive(Debug)]
pub struct CsvFramer {
    reader: csv_core::Reader,
    /// Field bytes `csv-core` copies out; only the record's end matters here.
    scratch: Vec<u8>,
    ends: Vec<usize>,
    /// Whether a record has begun (its first line was fed).
    started: bool,
}

/// What the line just fed to a [`CsvFramer`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A blank line between records: no record.
    Blank,
    /// The record goes on past this line (a quoted field holds a newline).
    Open,
    /// The line ends the record.
    Complete,
}

impl CsvFramer {
    /// A framer for records with `delimiter`.
    pub fn new(delimiter: u8) -> Self {
        Self {
            reader: csv_core::ReaderBuilder::new()
                .delimiter(delimiter)
                .terminator(csv_core::Terminator::Any(b'\n'))
                .build(),
            scratch: vec![0; 4096],
            ends: vec![0; 64],
            started: false,
        }
    }

    /// Whether the lines fed so far began a record that has not ended.
    pub fn is_open(&self) -> bool {
        self.started
    }

    /// Feeds the next line (with its newline, or the input's last line without one).
    pub fn feed(&mut self, line: &[u8]) -> Frame {
        let body = trim_eol(line);
        if !self.started && body.is_empty() {
            return Frame::Blank;
        }
        self.started = true;
        // An empty chunk would tell `csv-core` that the input ended.
        for chunk in [body, b"\n".as_slice()] {
            let mut input = chunk;
            while !input.is_empty() {
                let (result, consumed, _, _) =
                    self.reader
                        .read_record(input, &mut self.scratch, &mut self.ends);
                input = &input[consumed..];
                if result == csv_core::ReadRecordResult::Record {
                    self.reset();
                    return Frame::Complete;
                }
            }
        }
        Frame::Open
    }

    /// Forgets a record begun (the input ended inside it, or it was given up).
    pub fn reset(&mut self) {
        self.reader.reset();
        self.started = false;
    }
}

/// Turns lines of one format into records.
#[derive(Clone, Debug)]
pub struct LineParser {
    format: RecordFormat,
    delimiter: u8,
    header: bool,
    columns: Vec<String>,
}

impl LineParser {
    /// A parser for a format and its CSV options.
    pub fn new(format: RecordFormat, csv: Option<&CsvOptions>) -> Self {
        let csv = csv.cloned().unwrap_or_default();
        Self {
            format,
            delimiter: csv.delimiter.bytes().next().unwrap_or(b','),
            header: csv.header,
            columns: Vec::new(),
        }
    }

    /// Whether the first line of each file is a CSV header.
    pub fn expects_header(&self) -> bool {
        self.format == RecordFormat::Csv && self.header
    }

    /// A framer for this format's records when one may span lines (CSV), `None` when every
    /// line is a record.
    pub fn framer(&self) -> Option<CsvFramer> {
        (self.format == RecordFormat::Csv).then(|| CsvFramer::new(self.delimiter))
    }

    /// Takes the CSV header line.
    ///
    /// # Errors
    /// When the header is not valid UTF-8.
    pub fn set_header(&mut self, line: &[u8]) -> std::result::Result<(), String> {
        let line = trim_eol(line);
        // A byte-order mark (spreadsheets write one) is not part of the first column's name.
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        let text = std::str::from_utf8(line).map_err(|e| format!("header is not UTF-8: {e}"))?;
        self.columns = split_csv(text, self.delimiter)?.into_iter().collect();
        Ok(())
    }

    /// Parses one record: a line (with or without its newline), or for CSV the lines a
    /// [`CsvFramer`] found to make one record; `Ok(None)` for a blank line.
    ///
    /// # Errors
    /// The parse error's text.
    pub fn parse(&self, line: &[u8]) -> std::result::Result<Option<Dynamic>, String> {
        let line = trim_eol(line);
        match self.format {
            RecordFormat::Jsonl => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                let value = crate::record::parse_json(line).map_err(|e| e.to_string())?;
                if !value.is_map() {
                    return Err(format!(
                        "the line is a JSON {}, not an object: every jsonl line must be one \
                         object (`{{\"field\": value, ...}}`)",
                        json_kind(&value)
                    ));
                }
                Ok(Some(value))
            }
            RecordFormat::Lines => {
                let text = String::from_utf8_lossy(line);
                let mut m = Map::new();
                m.insert("line".into(), Dynamic::from(text.into_owned()));
                Ok(Some(Dynamic::from_map(m)))
            }
            RecordFormat::Csv => {
                if line.is_empty() {
                    return Ok(None);
                }
                let text = std::str::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
                let fields = split_csv(text, self.delimiter)?;
                if self.header && fields.len() != self.columns.len() {
                    return Err(format!(
                        "{} field(s), but the header names {}: {}",
                        fields.len(),
                        self.columns.len(),
                        self.columns.join(", ")
                    ));
                }
                let mut m = Map::new();
                for (i, f) in fields.into_iter().enumerate() {
                    let name = match self.columns.get(i) {
                        Some(c) => c.clone(),
                        None if self.header => {
                            return Err(format!(
                                "{} fields, but the header names {}",
                                i + 1,
                                self.columns.len()
                            ));
                        }
                        None => format!("c{i}"),
                    };
                    m.insert(name.as_str().into(), csv_value(f));
                }
                Ok(Some(Dynamic::from_map(m)))
            }
        }
    }
}

/// What a JSON value that is not an object is, for error messages.
fn json_kind(v: &Dynamic) -> &'static str {
    if v.is_array() {
        "array"
    } else if v.is_string() {
        "string"
    } else if v.is_unit() {
        "null"
    } else if v.is_bool() {
        "boolean"
    } else {
        "number"
    }
}

fn trim_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A CSV field becomes an integer, a float or a string.
fn csv_value(f: String) -> Dynamic {
    if let Ok(i) = f.parse::<i64>() {
        return Dynamic::from(i);
    }
    if !f.is_empty()
        && f.bytes().any(|b| b.is_ascii_digit())
        && let Ok(x) = f.parse::<f64>()
    {
        return Dynamic::from(x);
    }
    Dynamic::from(f)
}

/// Splits one CSV record with the `csv` crate (RFC 4180: quoted fields, doubled quotes,
/// delimiters and newlines inside quotes); [`CsvFramer`] found where it ends.
fn split_csv(line: &str, delimiter: u8) -> std::result::Result<Vec<String>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(line.as_bytes());
    let mut record = csv::StringRecord::new();
    match reader.read_record(&mut record) {
        Ok(true) => Ok(record.iter().map(str::to_owned).collect()),
        Ok(false) => Ok(vec![String::new()]),
        Err(e) => Err(e.to_string()),
    }
}

/// Appends one CSV field, quoted when needed.
pub fn write_csv_field(out: &mut Vec<u8>, text: &str, delimiter: u8) {
    if text
        .bytes()
        .any(|b| b == delimiter || b == b'"' || b == b'\n' || b == b'\r')
    {
        out.push(b'"');
        for b in text.bytes() {
            if b == b'"' {
                out.push(b'"');
            }
            out.push(b);
        }
        out.push(b'"');
    } else {
        out.extend_from_slice(text.as_bytes());
    }
}

/// The text of a value in a CSV cell (strings bare, others as JSON).
pub fn csv_cell(v: &Dynamic) -> String {
    if let Ok(s) = v.as_immutable_string_ref() {
        return s.to_string();
    }
    if v.is_unit() {
        return String::new();
    }
    serde_json::to_string(v).unwrap_or_else(|_| v.to_string())
}

/// Serializes records as jsonl or csv into a buffer; the CSV header comes from the first
/// record's fields.
#[derive(Debug, Default)]
pub struct RecordWriter {
    csv: bool,
    columns: Option<Vec<String>>,
}

impl RecordWriter {
    /// A writer for `csv` (true) or jsonl (false).
    pub fn new(csv: bool) -> Self {
        Self { csv, columns: None }
    }

    /// Appends one record and its newline.
    pub fn write(&mut self, out: &mut Vec<u8>, record: &Dynamic) {
        if !self.csv {
            if crate::record::write_json(out, record).is_err() {
                out.extend_from_slice(format!("{:?}", record.to_string()).as_bytes());
            }
            out.push(b'\n');
            return;
        }
        let map = record.as_map_ref().ok();
        if self.columns.is_none() {
            let cols: Vec<String> = match &map {
                Some(m) => m.keys().map(|k| k.to_string()).collect(),
                None => vec!["value".to_owned()],
            };
            for (i, c) in cols.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_csv_field(out, c, b',');
            }
            out.push(b'\n');
            self.columns = Some(cols);
        }
        let cols = self.columns.as_deref().unwrap_or_default();
        match &map {
            Some(m) => {
                for (i, c) in cols.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    if let Some(v) = m.get(c.as_str()) {
                        write_csv_field(out, &csv_cell(v), b',');
                    }
                }
            }
            None => write_csv_field(out, &csv_cell(record), b','),
        }
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_lines_parse_with_quotes_and_types() {
        let mut p = LineParser::new(RecordFormat::Csv, None);
        p.set_header(b"name,qty,price,note\n").expect("header");
        let r = p
            .parse(b"\"a, b\",3,2.5,\"say \"\"hi\"\"\"\r\n")
            .expect("parse")
            .expect("record");
        let m = r.as_map_ref().expect("map");
        assert_eq!(m["name"].to_string(), "a, b");
        assert_eq!(m["qty"].as_int(), Ok(3));
        assert_eq!(m["price"].as_float(), Ok(2.5));
        assert_eq!(m["note"].to_string(), "say \"hi\"");
        assert!(p.parse(b"1,2,3,4,5").is_err());
    }

    #[test]
    fn a_csv_row_with_the_wrong_number_of_fields_is_an_error() {
        let mut p = LineParser::new(RecordFormat::Csv, None);
        p.set_header("\u{feff}user,amount\n".as_bytes()).expect("header");
        let r = p.parse(b"u1,3\n").expect("parse").expect("record");
        assert_eq!(r.as_map_ref().expect("map")["user"].to_string(), "u1", "no BOM in the name");
        let e = p.parse(b"u2\n").expect_err("short row");
        assert!(e.contains("1 field(s), but the header names 2: user, amount"), "{e}");
        assert!(p.parse(b"u2,1,x\n").is_err(), "long row");
    }

    #[test]
    fn a_jsonl_line_that_is_not_an_object_is_an_error() {
        let p = LineParser::new(RecordFormat::Jsonl, None);
        for (line, kind) in [
            ("[1,2]", "array"),
            ("\"text\"", "string"),
            ("42", "number"),
            ("null", "null"),
            ("true", "boolean"),
        ] {
            let e = p.parse(line.as_bytes()).expect_err(line);
            assert!(e.contains(&format!("the line is a JSON {kind}, not an object")), "{e}");
        }
        assert!(p.parse(b"{\"a\":1}").expect("object").is_some());
    }

    #[test]
    fn csv_writer_quotes_and_headers() {
        let mut w = RecordWriter::new(true);
        let mut out = Vec::new();
        w.write(
            &mut out,
            &crate::record::parse_json(br#"{"a":"x,y","b":2}"#).expect("json"),
        );
        w.write(
            &mut out,
            &crate::record::parse_json(br#"{"a":"z"}"#).expect("json"),
        );
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            "a,b\n\"x,y\",2\nz,\n"
        );
    }
}
