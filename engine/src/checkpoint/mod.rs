//! The checkpoint protocol (docs/ARCHITECTURE.md section 5), as pure decisions over observed
//! facts, plus the small storage trait it writes through.
//!
//! - [`aligner`]: barrier alignment for one task with several input channels.
//! - [`channel_state`]: the in-flight records an unaligned barrier overtook: recording,
//!   encoding, and their share per subtask after a rescale.
//! - [`coordinator`]: the per-pipeline state machine that triggers checkpoints and savepoints,
//!   collects acknowledgements, completes, aborts and subsumes them, and asks for a failover
//!   when too many fail in a row.
//! - [`metadata`]: the durable record of a completed checkpoint and its encoding.
//! - [`storage`]: the [`storage::CheckpointStore`] trait, an in-memory fake and a local
//!   filesystem store; checksum-verified reads; choosing the latest valid checkpoint.
//! - [`retention`]: which completed checkpoints and which files to delete.
//! - [`restore_plan`]: what a restore (of a checkpoint or savepoint, or a reload's) does to
//!   each operator's state: kept, migrated, dropped, new, or why it cannot be restored.
//! - [`s3`]: the store on S3-compatible object storage (`s3://bucket/prefix`).
//! - [`savepoint`]: self-contained savepoint directories (write, read, verify).
//!
//! This module owns no task, channel, timer or thread: the runtime drives it by calling its
//! methods with the current time and the events it observed, and carries out the commands it
//! returns. It must not touch operators, state backends or the task loop.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::base::error::CheckpointError;

pub mod aligner;
pub mod channel_state;
pub mod coordinator;
pub mod metadata;
pub mod restore_plan;
pub mod retention;
pub mod s3;
pub mod savepoint;
pub mod storage;

pub use aligner::{AlignerAction, AlignerStep, AlignmentMode, BarrierAligner};
pub use coordinator::{CheckpointPlan, Command, Coordinator, CoordinatorConfig};
pub use metadata::{CheckpointMetadata, FileRef, SubtaskState};
pub use retention::plan_retention;
pub use storage::{CheckpointStore, LocalStore, MemoryStore};
#[cfg(any(test, feature = "testkit"))]
pub use {aligner::AlignError, coordinator::AbortReason, retention::RetentionPlan, storage::latest_valid};

/// A checkpoint id. Ids of one pipeline increase strictly, across restarts too.
pub type CheckpointId = u64;

/// One running task: subtask `subtask` of chain `chain` (an index into
/// [`PipelinePlan::chains`](crate::plan::PipelinePlan::chains)). Tasks acknowledge
/// checkpoints, fail and restart as a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    /// Index of the chain in the plan.
    pub chain: u32,
    /// Subtask index, in `0..parallelism` of the chain.
    pub subtask: u32,
}

impl TaskId {
    /// Builds a task id.
    pub const fn new(chain: u32, subtask: u32) -> Self {
        Self { chain, subtask }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chain {} subtask {}", self.chain, self.subtask)
    }
}

/// The checkpoint module's result type.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;
