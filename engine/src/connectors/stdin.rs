//! The `stdin` source: a reader thread turns standard input into chunks of lines on a small
//! bounded channel (so a fast producer is backpressured too); the source parses them.

use std::io::BufRead;
use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};
use std::time::Duration;

use rhai::Dynamic;
use weir_schema::SourceOnError;

use super::{LineParser, Poll, Source, SourceContext};
use crate::runtime::BATCH_SIZE;
use crate::runtime::error::{Result, RunError};

/// The `stdin` source.
pub struct StdinSource {
    parser: LineParser,
    on_error: SourceOnError,
    rx: Option<Receiver<std::io::Result<Vec<Vec<u8>>>>>,
    line: u64,
}

impl StdinSource {
    /// A source parsing standard input with `parser`.
    pub fn new(parser: LineParser, on_error: SourceOnError) -> Self {
        Self {
            parser,
            on_error,
            rx: None,
            line: 0,
        }
    }
}

impl Source for StdinSource {
    fn open(&mut self, _ctx: &mut SourceContext) -> Result<()> {
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
            Err(TryRecvError::Disconnected) => return Ok(Poll::Done),
        };
        let mut lines = chunk.into_iter();
        if self.line == 0
            && self.parser.expects_header()
            && let Some(h) = lines.next()
        {
            {
                self.line += 1;
                self.parser
                    .set_header(&h)
                    .map_err(|message| RunError::Parse {
                        pipeline: ctx.pipeline.clone(),
                        source_id: ctx.source.clone(),
                        location: "stdin:1".into(),
                        message,
                    })?;
            }
        }
        for l in lines {
            self.line += 1;
            match self.parser.parse(&l) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(message) if self.on_error == SourceOnError::Fail => {
                    return Err(RunError::Parse {
                        pipeline: ctx.pipeline.clone(),
                        source_id: ctx.source.clone(),
                        location: format!("stdin:{}", self.line),
                        message,
                    });
                }
                Err(_) => ctx.skipped += 1,
            }
        }
        Ok(Poll::Ready)
    }
}
