//! The `stdin` source: a reader thread turns standard input into chunks of lines on a small
//! bounded channel (so a fast producer is backpressured too); the source parses them.
//!
//! Not replayable: standard input cannot be rewound, so a snapshot only records how many lines
//! were read (informational), and a restore warns that records around the checkpoint may be
//! lost or duplicated. The schema refuses `stdin` with `exactly_once`.

use std::io::BufRead;
use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::time::Duration;

use rhai::Dynamic;
use weir_schema::SourceOnError;

use super::{BadRecord, BadRecords, CsvFramer, Frame, LineParser, Poll, Source, SourceContext};
use crate::base::error::{Result, RunError};
use crate::base::message::BATCH_SIZE;

/// The `stdin` source.
pub struct StdinSource {
    parser: LineParser,
    bad: BadRecords,
    rx: Option<Receiver<std::io::Result<Vec<Vec<u8>>>>>,
    /// Lines read so far.
    line: u64,
    /// Where a CSV record ends (`None`: every line is a record).
    framer: Option<CsvFramer>,
    /// The lines of the record being read (CSV: a quoted field may span lines).
    record: Vec<u8>,
    /// How many lines `record` holds.
    record_lines: u64,
    /// Whether the CSV header is still to come.
    header_due: bool,
    /// `(pipeline, source)` for logs, from `open`.
    ids: (String, String),
}

/// The stdin source's snapshot: `(version, lines read)`. Informational only; nothing is
/// resumed from it.
type StdinState = (u32, u64);

/// The version of [`StdinState`].
const STDIN_STATE_VERSION: u32 = 1;

impl StdinSource {
    /// A source parsing standard input with `parser`.
    pub fn new(parser: LineParser, on_error: &SourceOnError) -> Self {
        Self {
            framer: parser.framer(),
            header_due: parser.expects_header(),
            parser,
            bad: BadRecords::new(on_error),
            rx: None,
            line: 0,
            record: Vec::new(),
            record_lines: 0,
            ids: (String::new(), String::new()),
        }
    }

    /// Applies `on_error` to the record being read, which starts on line `first`, and
    /// forgets it.
    fn failed(&mut self, ctx: &mut SourceContext, first: u64, message: String) -> Result<()> {
        let result = self.bad.failed(
            ctx,
            BadRecord {
                file: "stdin",
                line: first,
                raw: &self.record,
                message,
            },
        );
        self.record.clear();
        self.record_lines = 0;
        result
    }
}

impl Source for StdinSource {
    fn open(&mut self, ctx: &mut SourceContext) -> Result<()> {
        self.ids = (ctx.pipeline.clone(), ctx.source.clone());
        let (tx, rx) = sync_channel(4);
        std::thread::Builder::new()
            .name("weir-stdin".into())
            .spawn(move || {
                let stdin = std::io::stdin();
                let mut lock = std::io::BufReader::with_capacity(1 << 16, stdin.lock());
                loop {
                    let mut chunk = Vec::with_capacity(BATCH_SIZE);
                    while chunk.len() < BATCH_SIZE {
                        let mut line = Vec::new();
                        match lock.read_until(b'\n', &mut line) {
                            Ok(0) => break,
                            Ok(_) => chunk.push(line),
                            Err(e) => {
                                let _ = tx.send(Err(e));
                                return;
                            }
                        }
                        if lock.buffer().is_empty() {
                            break;
                        }
                    }
                    let end = chunk.is_empty();
                    if end || tx.send(Ok(chunk)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| RunError::Internal(format!("cannot start the stdin reader: {e}")))?;
        self.rx = Some(rx);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll> {
        let Some(rx) = &self.rx else {
            return Ok(Poll::Done);
        };
        let chunk = match rx.try_recv() {
            Ok(Ok(chunk)) => chunk,
            Ok(Err(e)) => {
                return Err(RunError::Io {
                    pipeline: ctx.pipeline.clone(),
                    element: ctx.source.clone(),
                    what: "cannot read",
                    path: "<stdin>".into(),
                    source: e,
                });
            }
            Err(TryRecvError::Empty) => return Ok(Poll::Idle(Duration::from_millis(2))),
            Err(TryRecvError::Disconnected) => {
                if self.framer.as_ref().is_some_and(CsvFramer::is_open) {
                    let first = self.line + 1 - self.record_lines;
                    let message = format!(
                        "unterminated quoted field: the record starting on line {first} opens \
                         a quote that the input never closes"
                    );
                    self.framer = None;
                    self.failed(ctx, first, message)?;
                }
                return Ok(Poll::Done);
            }
        };
        for l in chunk {
            self.line += 1;
            self.record_lines += 1;
            let from = self.record.len();
            if from == 0 {
                self.record = l;
            } else {
                self.record.extend_from_slice(&l);
            }
            if let Some(framer) = self.framer.as_mut() {
                match framer.feed(&self.record[from..]) {
                    Frame::Complete => {}
                    Frame::Open => continue,
                    Frame::Blank => {
                        self.record.clear();
                        self.record_lines = 0;
                        continue;
                    }
                }
            }
            let first = self.line + 1 - self.record_lines;
            if std::mem::take(&mut self.header_due) {
                self.parser
                    .set_header(&self.record)
                    .map_err(|message| RunError::Parse {
                        pipeline: ctx.pipeline.clone(),
                        source_id: ctx.source.clone(),
                        location: format!("stdin:{first}"),
                        message,
                    })?;
            } else {
                match self.parser.parse(&self.record) {
                    Ok(Some(r)) => out.push(r),
                    Ok(None) => {}
                    Err(message) => self.failed(ctx, first, message)?,
                }
            }
            self.record.clear();
            self.record_lines = 0;
        }
        Ok(Poll::Ready)
    }

    /// The number of lines read so far (informational: stdin cannot be rewound).
    fn snapshot(&mut self) -> Result<Vec<u8>> {
        let state: StdinState = (STDIN_STATE_VERSION, self.line);
        crate::record::encode(&state).map_err(|e| {
            RunError::State(format!(
                "source `{}`: cannot encode the stdin position: {e}",
                self.ids.1
            ))
        })
    }

    /// Warns that standard input cannot be replayed; reading goes on from wherever stdin is.
    ///
    /// # Errors
    /// Never: even an unreadable snapshot only changes the warning.
    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let lines = crate::record::decode::<StdinState>(snapshot)
            .ok()
            .map(|(_, lines)| lines);
        tracing::warn!(
            pipeline = %self.ids.0,
            source = %self.ids.1,
            lines_read_at_checkpoint = %crate::base::human::Maybe::or(lines, "unknown"),
            "Stdin cannot be replayed; records after the checkpoint may be lost or duplicated."
        );
        Ok(())
    }
}

/// A stdin snapshot with its fields named (for `weir inspect`): the lines read.
///
/// # Errors
/// A malformed snapshot.
pub fn describe_snapshot(bytes: &[u8]) -> Result<serde_json::Value> {
    let (version, lines) = crate::record::decode::<StdinState>(bytes)
        .map_err(|e| RunError::StateCorrupt(format!("malformed stdin snapshot: {e}")))?;
    Ok(serde_json::json!({"version": version, "lines_read": lines}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_counts_lines_and_restore_only_warns() {
        let mut src = StdinSource::new(
            LineParser::new(Default::default(), None),
            &SourceOnError::Fail,
        );
        src.line = 17;
        let snap = src.snapshot().expect("snapshot");
        assert_eq!(
            crate::record::decode::<StdinState>(&snap).expect("decode"),
            (STDIN_STATE_VERSION, 17)
        );
        let mut again = StdinSource::new(
            LineParser::new(Default::default(), None),
            &SourceOnError::Fail,
        );
        again.restore(&snap).expect("restore");
        again.restore(b"junk").expect("restore never fails");
        assert_eq!(again.line, 0);
    }
}
