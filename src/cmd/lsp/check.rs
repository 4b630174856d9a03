//! The background checker of `weir lsp`: documents are validated on a thread of their own, so
//! that hover, completion and definition are answered while a large file is being checked
//! (validating is the engine's `validate`, which compiles every script: seconds for a file of
//! thousands of operators). Texts that arrive while a check runs are coalesced: per document
//! only the newest is checked next, and a document closed meanwhile gets its diagnostics
//! cleared. Publishing goes through an outbox the server closes when the session ends, so a
//! check still running then can neither write after `exit` nor delay the process's end.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use lsp_server::{Message, Notification};
use lsp_types::notification::{Notification as _, PublishDiagnostics};
use lsp_types::{PublishDiagnosticsParams, Uri};

use super::analysis::{self, Doc};

/// Sends a message to the client; `false` once the connection is gone.
type Send = Box<dyn Fn(Message) -> bool + std::marker::Send>;

/// Where the checker's results go: `None` once the session ended.
type Outbox = Arc<Mutex<Option<Send>>>;

/// One document to check: its text, or `None` when it was closed (its diagnostics are
/// cleared).
pub struct Job {
    /// The document.
    pub uri: Uri,
    /// Its text, shared with the server's copy.
    pub text: Option<Arc<str>>,
    /// The version the diagnostics are for.
    pub version: Option<i32>,
}

/// The checking thread and its queue. Dropping it closes the outbox.
pub struct Checker {
    jobs: Option<mpsc::Sender<Job>>,
    outbox: Outbox,
}

impl Checker {
    /// Starts the thread; `send` delivers a message to the client. Without a thread (the
    /// system refused one), jobs are checked on the caller's thread instead.
    pub fn start(send: Send) -> Self {
        let outbox: Outbox = Arc::new(Mutex::new(Some(send)));
        let (tx, rx) = mpsc::channel::<Job>();
        let out = Arc::clone(&outbox);
        let spawned = std::thread::Builder::new()
            .name("weir-lsp-check".into())
            .spawn(move || work(&rx, &out));
        Self {
            jobs: spawned.is_ok().then_some(tx),
            outbox,
        }
    }

    /// Queues a document for checking.
    pub fn submit(&self, job: Job) {
        let job = match &self.jobs {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        publish(&self.outbox, check(&job));
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        self.jobs = None;
        self.outbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// The thread: takes every job waiting, keeps the newest per document, checks and publishes
/// them; ends when the queue closes or the outbox does.
fn work(rx: &mpsc::Receiver<Job>, outbox: &Outbox) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(job) = rx.try_recv() {
            match batch.iter_mut().find(|b| b.uri == job.uri) {
                Some(slot) => *slot = job,
                None => batch.push(job),
            }
        }
        for job in &batch {
            if !publish(outbox, check(job)) {
                return;
            }
        }
    }
}

/// The diagnostics of one job (none for a closed document, or if checking panicked).
fn check(job: &Job) -> PublishDiagnosticsParams {
    let Some(text) = &job.text else {
        return PublishDiagnosticsParams::new(job.uri.clone(), Vec::new(), None);
    };
    let found = catch_unwind(AssertUnwindSafe(|| {
        analysis::diagnostics(Doc {
            uri: &job.uri,
            text,
        })
    }));
    let diagnostics = found.unwrap_or_else(|_| {
        eprintln!("weir lsp: checking {} panicked", job.uri.as_str());
        Vec::new()
    });
    PublishDiagnosticsParams::new(job.uri.clone(), diagnostics, job.version)
}

/// Sends diagnostics to the client; `false` once the session ended.
fn publish(outbox: &Outbox, params: PublishDiagnosticsParams) -> bool {
    let out = outbox.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(send) = out.as_ref() else {
        return false;
    };
    send(Notification::new(PublishDiagnostics::METHOD.to_owned(), params).into())
}
