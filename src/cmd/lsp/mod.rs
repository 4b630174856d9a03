//! `weir lsp`: a language server over standard input and output for pipeline files and test
//! files (`*.test.yaml`).
//!
//! The transport (Content-Length framing, the initialize handshake, shutdown) is
//! rust-analyzer's `lsp-server`; the messages are `lsp-types`. This module is the dispatcher:
//! it keeps the open documents' text (full sync), has the [`check`] thread publish diagnostics
//! on open and on every change (and for every open document when any is saved: it may be a
//! script file another reads), and answers hover, completion and definition requests from
//! [`analysis`] meanwhile. Any other request gets a `MethodNotFound` error; a panic while
//! answering becomes an `InternalError` response (or an empty diagnostic list), never a dead
//! server. Diagnostics come from the same function as `weir validate`; this module must not
//! grow checks of its own.

mod analysis;
mod check;
mod outline;
mod schema_nav;
mod text;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, DidSaveTextDocument,
    Notification as _,
};
use lsp_types::request::{Completion, GotoDefinition, HoverRequest, Request as _};
use lsp_types::{
    CompletionOptions, CompletionParams, CompletionResponse, DidChangeTextDocumentParams,
    DidCloseTextDocumentParams, DidOpenTextDocumentParams, GotoDefinitionParams,
    GotoDefinitionResponse, HoverParams, HoverProviderCapability, OneOf, ServerCapabilities,
    TextDocumentPositionParams, TextDocumentSyncCapability, TextDocumentSyncKind,
    TextDocumentSyncOptions, TextDocumentSyncSaveOptions, Uri,
};

use analysis::Doc;
use check::{Checker, Job};
use text::LineIndex;

/// Arguments of `weir lsp`.
#[derive(Args, Debug)]
pub struct LspArgs {
    /// Accepted for editors that pass it; standard input and output are the only transport.
    #[arg(long)]
    pub stdio: bool,
}

/// Runs `weir lsp` until the client says `exit` (status 0 after `shutdown`, 1 without) or
/// closes standard input.
pub fn run(_: &LspArgs) -> ExitCode {
    let (connection, io_threads) = Connection::stdio();
    let outcome = serve(&connection);
    // Every sender is gone now (the checker's closed with its outbox), so the writer ends
    // once it has written what was sent.
    drop(connection);
    let joined = io_threads.join();
    match (outcome, joined) {
        (Ok(Ended::Shutdown), Ok(())) => ExitCode::SUCCESS,
        (Ok(Ended::Shutdown), Err(e)) => {
            eprintln!("weir lsp: {e}");
            ExitCode::SUCCESS
        }
        (Ok(Ended::Exit), _) => ExitCode::FAILURE,
        (Err(e), _) => {
            eprintln!("weir lsp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How the session ended.
enum Ended {
    /// `shutdown`, then `exit`.
    Shutdown,
    /// `exit` without `shutdown`, or standard input closed.
    Exit,
}

fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Options(
            TextDocumentSyncOptions {
                open_close: Some(true),
                change: Some(TextDocumentSyncKind::FULL),
                save: Some(TextDocumentSyncSaveOptions::Supported(true)),
                ..TextDocumentSyncOptions::default()
            },
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec![":".into(), ".".into(), "[".into()]),
            ..CompletionOptions::default()
        }),
        definition_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    }
}

fn serve(connection: &Connection) -> Result<Ended, String> {
    let (id, _params) = connection.initialize_start().map_err(|e| e.to_string())?;
    let result = serde_json::json!({
        "capabilities": capabilities(),
        "serverInfo": { "name": "weir", "version": env!("CARGO_PKG_VERSION") },
    });
    connection
        .initialize_finish(id, result)
        .map_err(|e| e.to_string())?;
    let sender = connection.sender.clone();
    let checker = Checker::start(Box::new(move |m| sender.send(m).is_ok()));
    let mut server = Server::default();
    while let Ok(message) = connection.receiver.recv() {
        match message {
            Message::Request(req) if req.method == "shutdown" => {
                send(connection, Response::new_ok(req.id, ()).into())?;
                // After `shutdown` only `exit` counts; requests are refused.
                while let Ok(m) = connection.receiver.recv() {
                    match m {
                        Message::Notification(n) if n.method == "exit" => break,
                        Message::Request(r) => send(
                            connection,
                            Response::new_err(
                                r.id,
                                ErrorCode::InvalidRequest as i32,
                                "weir lsp is shutting down".to_owned(),
                            )
                            .into(),
                        )?,
                        _ => {}
                    }
                }
                return Ok(Ended::Shutdown);
            }
            Message::Request(req) => {
                let response = server.request(req);
                send(connection, response.into())?;
            }
            Message::Notification(n) if n.method == "exit" => return Ok(Ended::Exit),
            Message::Notification(n) => {
                for job in server.notification(n) {
                    checker.submit(job);
                }
            }
            Message::Response(_) => {}
        }
    }
    // Standard input closed without `exit`.
    Ok(Ended::Exit)
}

fn send(connection: &Connection, message: Message) -> Result<(), String> {
    connection
        .sender
        .send(message)
        .map_err(|_| "the client's connection closed".to_owned())
}

/// A result that does not serialize (it always does).
fn internal(e: serde_json::Error) -> (ErrorCode, String) {
    (ErrorCode::InternalError, e.to_string())
}

/// The open documents.
#[derive(Default)]
struct Server {
    docs: HashMap<Uri, Document>,
}

/// Which documents a notification makes due for checking.
enum Due {
    One(Uri),
    All,
}

struct Document {
    text: Arc<str>,
    version: Option<i32>,
}

impl Server {
    /// Applies a notification; returns the checks now due.
    fn notification(&mut self, n: Notification) -> Vec<Job> {
        let uris = match self.apply(n) {
            None => Vec::new(),
            Some(Due::One(uri)) => vec![uri],
            Some(Due::All) => {
                let mut all: Vec<Uri> = self.docs.keys().cloned().collect();
                all.sort();
                all
            }
        };
        uris.into_iter()
            .map(|uri| {
                let doc = self.docs.get(&uri);
                Job {
                    text: doc.map(|d| Arc::clone(&d.text)),
                    version: doc.and_then(|d| d.version),
                    uri,
                }
            })
            .collect()
    }

    fn apply(&mut self, n: Notification) -> Option<Due> {
        match n.method.as_str() {
            DidOpenTextDocument::METHOD => {
                let p: DidOpenTextDocumentParams = serde_json::from_value(n.params).ok()?;
                let d = p.text_document;
                self.docs.insert(
                    d.uri.clone(),
                    Document {
                        text: d.text.into(),
                        version: Some(d.version),
                    },
                );
                Some(Due::One(d.uri))
            }
            DidChangeTextDocument::METHOD => {
                let p: DidChangeTextDocumentParams = serde_json::from_value(n.params).ok()?;
                // Full sync: the last change holds the whole text.
                let text = p.content_changes.into_iter().last()?.text;
                let uri = p.text_document.uri;
                self.docs.insert(
                    uri.clone(),
                    Document {
                        text: text.into(),
                        version: Some(p.text_document.version),
                    },
                );
                Some(Due::One(uri))
            }
            DidCloseTextDocument::METHOD => {
                let p: DidCloseTextDocumentParams = serde_json::from_value(n.params).ok()?;
                self.docs.remove(&p.text_document.uri);
                Some(Due::One(p.text_document.uri))
            }
            // A saved file may be a script file or a CSV another document reads: check them
            // all again (saves are rare; checks are per document and quick).
            DidSaveTextDocument::METHOD => Some(Due::All),
            _ => None,
        }
    }

    /// Answers a request.
    fn request(&self, req: Request) -> Response {
        let id = req.id.clone();
        let answered = catch_unwind(AssertUnwindSafe(|| self.answer(req)));
        match answered {
            Ok(Ok(value)) => Response::new_ok(id, value),
            Ok(Err((code, message))) => Response::new_err(id, code as i32, message),
            Err(_) => Response::new_err(
                id,
                ErrorCode::InternalError as i32,
                "weir lsp failed to answer this request (a bug; please report it)".to_owned(),
            ),
        }
    }

    fn answer(&self, req: Request) -> Result<serde_json::Value, (ErrorCode, String)> {
        let invalid = |e: serde_json::Error| (ErrorCode::InvalidParams, e.to_string());
        match req.method.as_str() {
            HoverRequest::METHOD => {
                let p: HoverParams = serde_json::from_value(req.params).map_err(invalid)?;
                serde_json::to_value(self.at(&p.text_document_position_params, analysis::hover))
                    .map_err(internal)
            }
            Completion::METHOD => {
                let p: CompletionParams = serde_json::from_value(req.params).map_err(invalid)?;
                let trigger = p.context.and_then(|c| c.trigger_character);
                let items = self
                    .at(&p.text_document_position, |d, o| {
                        Some(analysis::completion(d, o, trigger.as_deref()))
                    })
                    .unwrap_or_default();
                serde_json::to_value(CompletionResponse::Array(items)).map_err(internal)
            }
            GotoDefinition::METHOD => {
                let p: GotoDefinitionParams =
                    serde_json::from_value(req.params).map_err(invalid)?;
                let found = self.at(&p.text_document_position_params, analysis::definition);
                serde_json::to_value(found.map(GotoDefinitionResponse::Scalar)).map_err(internal)
            }
            other => Err((
                ErrorCode::MethodNotFound,
                format!("weir lsp does not handle `{other}`"),
            )),
        }
    }

    /// Runs `f` on the open document at a position (its byte offset); `None` for a document
    /// that is not open.
    fn at<T>(
        &self,
        p: &TextDocumentPositionParams,
        f: impl Fn(Doc<'_>, usize) -> Option<T>,
    ) -> Option<T> {
        let uri = &p.text_document.uri;
        let doc = self.docs.get(uri)?;
        let offset = LineIndex::new(&doc.text).offset(p.position);
        f(
            Doc {
                uri,
                text: &doc.text,
            },
            offset,
        )
    }
}
