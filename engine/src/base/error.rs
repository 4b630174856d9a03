//! The engine's one error type: every failure a running pipeline can report
//! ([`RunError`]), each with the context (pipeline, element, subtask) that locates it and an
//! [`ErrorClass`] for restart decisions and reports. The two narrower errors it wraps live
//! here too, so that no layer has to import another to report a failure:
//! [`CheckpointError`] (checkpoint storage and protocol, the `checkpoint` module's own
//! `Result`) and [`ApiError`] (the control API could not listen).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The broad cause of a failure: what reports name and what restart strategies may look at
/// (today every class counts against the same restart budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The environment: a disk (full, unreadable, damaged data on it), a pipe, permissions, a
    /// port, a peer task that went away. The message carries the operating system's.
    Io,
    /// The user's data or scripts: a malformed record or line, a script that throws or
    /// breaches its sandbox, under `on_error: fail`.
    Data,
    /// The pipeline file or its plan is wrong, or does not fit what it restores (an element
    /// that cannot be built, stored state of another backend or key-group count).
    Config,
    /// A broken invariant: a bug in Weir.
    Internal,
}

/// A failure of a running pipeline.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A script or built-in failed on a record under `on_error: fail`.
    #[error(
        "pipeline `{pipeline}`, operator `{operator}` (subtask {subtask}): {message}\n  record: {record}"
    )]
    Operator {
        /// Pipeline id.
        pipeline: String,
        /// Operator id.
        operator: String,
        /// Subtask index.
        subtask: u32,
        /// What went wrong (Rhai's message for scripts, with its position).
        message: String,
        /// An excerpt of the record; for a script, as the script left it when it failed.
        record: String,
    },
    /// A source could not parse its input under `on_error: fail`.
    #[error("pipeline `{pipeline}`, source `{source_id}`: {location}: {message}")]
    Parse {
        /// Pipeline id.
        pipeline: String,
        /// Source id.
        source_id: String,
        /// `file:line` (or `stdin:line`).
        location: String,
        /// The parse error.
        message: String,
    },
    /// An I/O failure.
    #[error("pipeline `{pipeline}`, `{element}`: {what} `{}`: {source}", path.display())]
    Io {
        /// Pipeline id.
        pipeline: String,
        /// Element id.
        element: String,
        /// What was being done (`cannot read`, `cannot write`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An external system a connector talks to (a database, a broker) failed, refused or
    /// could not be reached: what, where, and how to fix it.
    #[error("pipeline `{pipeline}`, `{element}`: {system}: {message}")]
    External {
        /// Pipeline id.
        pipeline: String,
        /// Element id.
        element: String,
        /// The system (`PostgreSQL`, `Kafka`).
        system: &'static str,
        /// What went wrong, with the system's own message.
        message: String,
    },
    /// The pipeline's elements could not be built from the plan.
    #[error("pipeline `{pipeline}`, `{element}`: {message}")]
    Build {
        /// Pipeline id.
        pipeline: String,
        /// Element id.
        element: String,
        /// What is wrong.
        message: String,
    },
    /// A state backend operation failed on an invariant (an unknown handle, a value that does
    /// not encode): a bug in Weir.
    #[error("state: {0}")]
    State(String),
    /// Stored state does not fit the pipeline that restores it (written by another backend,
    /// for another number of key groups, a state under another kind, or the local state of
    /// an element that cannot be redistributed over a new parallelism): the configuration or
    /// the restore is wrong, not Weir.
    #[error("state: {0}")]
    StateMismatch(String),
    /// A state backend could not read or write its storage (a full disk, permissions, a
    /// missing directory); the message carries the operating system's.
    #[error("state storage: {0}")]
    StateIo(String),
    /// Stored state is damaged (RocksDB reports corruption, a snapshot does not decode).
    #[error("state corrupt: {0}")]
    StateCorrupt(String),
    /// A neighbouring task went away (a consequence of another failure, not a cause).
    #[error("pipeline `{pipeline}`, `{element}`: a connected task stopped")]
    Disconnected {
        /// Pipeline id.
        pipeline: String,
        /// Element id.
        element: String,
    },
    /// Checkpoint storage or protocol trouble (writing or restoring a checkpoint).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Checkpoints failed more often in a row than `tolerable_failures` allows; the class is
    /// the last failure's.
    #[error(
        "{consecutive} failed checkpoint(s) in a row (tolerable_failures: {tolerable}); last: {last}"
    )]
    CheckpointsFailing {
        /// Consecutive failed checkpoints.
        consecutive: u32,
        /// The pipeline's `tolerable_failures`.
        tolerable: u32,
        /// The last failure.
        last: String,
        /// The last failure's class.
        class: ErrorClass,
    },
    /// The pipeline was stopped while it waited to restart after failures: it did not run to
    /// its end or a final checkpoint; the class is the last failure's.
    #[error(
        "stopped while restarting after {consecutive} consecutive failure(s); the last, in \
         `{failing}`: {last}"
    )]
    StoppedWhileRestarting {
        /// Failures in a row.
        consecutive: u32,
        /// The operator (or task) that failed last.
        failing: String,
        /// The last failure.
        last: String,
        /// The last failure's class.
        class: ErrorClass,
    },
    /// The restart strategy gave up after this failure.
    #[error("{cause}\n  {reason}")]
    GaveUp {
        /// Why it gave up (strategy, limit).
        reason: String,
        /// The failure that ended the pipeline.
        cause: Box<RunError>,
    },
    /// The control API could not listen (its port is taken): the job did not start.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl RunError {
    /// The error's class.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Operator { .. } | Self::Parse { .. } => ErrorClass::Data,
            Self::Build { .. } | Self::StateMismatch(_) => ErrorClass::Config,
            Self::Io { .. }
            | Self::External { .. }
            | Self::Disconnected { .. }
            | Self::Api(_)
            | Self::StateIo(_)
            | Self::StateCorrupt(_) => ErrorClass::Io,
            Self::State(_) | Self::Internal(_) => ErrorClass::Internal,
            Self::CheckpointsFailing { class, .. } | Self::StoppedWhileRestarting { class, .. } => {
                *class
            }
            Self::Checkpoint(e) => e.class(),
            Self::GaveUp { cause, .. } => cause.class(),
        }
    }

    /// The operator (or source, sink) the error names, when it names one.
    pub fn element(&self) -> Option<&str> {
        match self {
            Self::Operator { operator, .. } => Some(operator.as_str()),
            Self::Parse { source_id, .. } => Some(source_id.as_str()),
            Self::Io { element, .. }
            | Self::External { element, .. }
            | Self::Build { element, .. }
            | Self::Disconnected { element, .. } => Some(element.as_str()),
            Self::GaveUp { cause, .. } => cause.element(),
            Self::StoppedWhileRestarting { failing, .. } => Some(failing.as_str()),
            _ => None,
        }
    }

    /// Whether this error is only the echo of another task's failure.
    pub fn is_secondary(&self) -> bool {
        matches!(self, Self::Disconnected { .. })
    }
}

/// Why a checkpoint operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The storage could not be read or written.
    #[error("checkpoint storage: {what} `{}`: {source}", path.display())]
    Io {
        /// What was being done (`cannot write`, `cannot read`, ...).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file the caller asked for does not exist.
    #[error("checkpoint storage: `{path}` does not exist")]
    NotFound {
        /// The store-relative path.
        path: String,
    },
    /// A store-relative path is empty, absolute or leaves the store (`..`).
    #[error("checkpoint storage: invalid path `{path}`: {reason}")]
    InvalidPath {
        /// The offending path.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A file's content does not match what the metadata recorded.
    #[error("checkpoint file `{path}` is corrupt: {reason}")]
    Corrupt {
        /// The store-relative path.
        path: String,
        /// Size or checksum mismatch, truncated or undecodable content.
        reason: String,
    },
    /// The protocol was driven out of order (a bug in the caller).
    #[error("checkpoint protocol: {0}")]
    Protocol(String),
    /// Remote checkpoint storage (object storage) did not answer or refused a request: the
    /// service is down, unreachable or overloaded. Unlike [`Io`](Self::Io) on a local disk,
    /// this says nothing about the stored files, so a restore MUST NOT take it for a damaged
    /// checkpoint and fall back to an older one; it fails, and the restart strategy retries.
    #[error("checkpoint storage unavailable: {what} `{url}`: {message}")]
    Unavailable {
        /// What was being done (`cannot write`, `cannot read`, ...).
        what: &'static str,
        /// The object's URL (`s3://bucket/key`).
        url: String,
        /// The client's error, with the endpoint it tried.
        message: String,
    },
}

impl CheckpointError {
    /// The error's class, for restart decisions: storage trouble (a missing or damaged file
    /// included) is the environment's, a bad path or a protocol violation is a bug in Weir.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Io { .. }
            | Self::NotFound { .. }
            | Self::Corrupt { .. }
            | Self::Unavailable { .. } => ErrorClass::Io,
            Self::InvalidPath { .. } | Self::Protocol(_) => ErrorClass::Internal,
        }
    }
}

/// Why the API could not start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ApiError {
    /// Another process (often another `weir run`) listens on the address.
    #[error(
        "cannot listen on {addr}: address in use by {owner}; stop it, pick another port with \
         --api-port (or `api.port` in the file), or run without the API with --no-api"
    )]
    #[diagnostic(code(weir::api::address_in_use))]
    AddressInUse {
        /// The address asked for.
        addr: SocketAddr,
        /// Who holds it: `process 1234 (`weir run p.yaml`)`, or how to find out.
        owner: String,
    },
    /// Any other failure to bind (permission, no such interface, ...).
    #[error(
        "cannot listen on {addr}: {source}; pick another port with --api-port or switch the \
         API off with --no-api"
    )]
    #[diagnostic(code(weir::api::cannot_listen))]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

/// The engine's result type.
pub type Result<T, E = RunError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_not_a_bug() {
        let full = RunError::StateIo("rocksdb: cannot open `x`: IO error: No space left".into());
        assert_eq!(full.class(), ErrorClass::Io);
        assert!(full.to_string().contains("No space left"), "{full}");
        assert_eq!(
            RunError::StateCorrupt("malformed key".into()).class(),
            ErrorClass::Io
        );
        assert_eq!(
            RunError::State("unknown state handle 3".into()).class(),
            ErrorClass::Internal
        );
        let failing = RunError::CheckpointsFailing {
            consecutive: 1,
            tolerable: 0,
            last: "cannot write: No space left on device".into(),
            class: ErrorClass::Io,
        };
        assert_eq!(failing.class(), ErrorClass::Io);
        let gave_up = RunError::GaveUp {
            reason: "restart strategy `none` gave up".into(),
            cause: Box::new(RunError::Operator {
                pipeline: "p".into(),
                operator: "check".into(),
                subtask: 0,
                message: "poison".into(),
                record: "{}".into(),
            }),
        };
        assert_eq!(gave_up.class(), ErrorClass::Data);
        assert_eq!(gave_up.element(), Some("check"));
        assert_eq!(failing.element(), None);
    }

    #[test]
    fn every_class_has_its_causes() {
        let build = RunError::Build {
            pipeline: "p".into(),
            element: "sum".into(),
            message: "unknown type".into(),
        };
        assert_eq!(build.class(), ErrorClass::Config);
        let moved = RunError::StateMismatch("snapshot has 64 key groups".into());
        assert_eq!(moved.class(), ErrorClass::Config);
        assert_eq!(moved.to_string(), "state: snapshot has 64 key groups");
        let parse = RunError::Parse {
            pipeline: "p".into(),
            source_id: "in".into(),
            location: "in.jsonl:3".into(),
            message: "expected value".into(),
        };
        assert_eq!(parse.class(), ErrorClass::Data);
        let disk = RunError::Checkpoint(CheckpointError::Io {
            what: "cannot write",
            path: "/full/chk-1".into(),
            source: io::Error::other("No space left on device"),
        });
        assert_eq!(disk.class(), ErrorClass::Io);
        assert!(disk.to_string().contains("No space left"), "{disk}");
        assert_eq!(
            RunError::Checkpoint(CheckpointError::Protocol("ack for unknown id".into())).class(),
            ErrorClass::Internal
        );
    }
}
