//! The runtime's error type: every failure a running pipeline can report, each with the
//! context (pipeline, element, subtask) that locates it and a class for restart decisions.

use std::path::PathBuf;

/// The broad cause of a failure; restart strategies look only at this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The user's data or script (a malformed line, a script error or sandbox breach).
    User,
    /// Something outside Weir (the disk, a closed pipe).
    External,
    /// A bug in Weir.
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
    /// A state backend operation failed.
    #[error("state: {0}")]
    State(String),
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
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
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
    Api(#[from] crate::api::ApiError),
    /// A bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl RunError {
    /// The error's class.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Operator { .. } | Self::Parse { .. } | Self::Build { .. } => ErrorClass::User,
            Self::Io { .. } | Self::Disconnected { .. } | Self::Api(_) => ErrorClass::External,
            Self::State(_) | Self::Internal(_) => ErrorClass::Internal,
            Self::Checkpoint(e) => e.class(),
            Self::GaveUp { cause, .. } => cause.class(),
        }
    }

    /// Whether this error is only the echo of another task's failure.
    pub fn is_secondary(&self) -> bool {
        matches!(self, Self::Disconnected { .. })
    }
}

/// The runtime's result type.
pub type Result<T, E = RunError> = std::result::Result<T, E>;
