//! The supervisor of one pipeline: builds and spawns its tasks, drives its checkpoint
//! coordinator (triggers, acknowledgements, metadata writes, completion notices, retention),
//! and handles task failures with the pipeline's restart and failover strategies.
//!
//! This module owns the links between the job and a supervisor (requests, live status, start
//! notices) and [`supervise`], the entry point. The work is split by concern:
//! - `supervisor`: the loop, one `select!` over task results, task events, internal results,
//!   requests and timers, dispatching each to the current phase;
//! - `phase`: the lifecycle as a typed state (running, probation, restarting, stopping,
//!   halted), with the data each phase needs;
//! - `requests`: the control surface's requests and stops;
//! - `failure`: failures, restarts and failover;
//! - `probation`: a reload's new version proving itself;
//! - `completion`: what a completed or aborted checkpoint or savepoint sets off (statistics,
//!   status history, savepoint copy, retention);
//! - `spawn`: building and spawning tasks and their state backends;
//! - `restore`: choosing what a run restores from;
//! - `storage`: checkpoint storage and local state directories.
//!
//! One async loop owns everything here, so there is no lock. The protocol decisions are the
//! coordinator's and the strategies' (pure logic elsewhere); this module only carries them
//! out.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

use crate::base::error::RunError;
use crate::base::metrics::{NodeReport, PipelineMetrics};
use crate::checkpoint::CheckpointId;
use crate::checkpoint::TaskId;
use crate::control::{CheckpointInfo, ControlError, SavepointInfo};
use crate::plan::PipelinePlan;
use crate::runtime::fault::Fault;
use crate::runtime::task::Control;
use crate::state::handover::Handover;

mod completion;
mod failure;
mod phase;
mod probation;
mod requests;
mod restore;
mod spawn;
mod storage;
mod supervisor;

pub(crate) use failure::give_up_head;
use supervisor::Supervisor;

/// Where a run starts from.
#[derive(Clone, Debug, Default)]
pub struct RecoveryOptions {
    /// Ignore (and delete) existing checkpoints and start from the beginning.
    pub fresh: bool,
    /// Restore from this checkpoint directory (`.../<pipeline>/chk-<n>`) instead of the
    /// latest valid one.
    pub from_checkpoint: Option<PathBuf>,
    /// Restore from this savepoint directory (state by operator id, rescaled, migrated).
    pub from_savepoint: Option<PathBuf>,
    /// Let a savepoint hold state of operators the pipeline no longer has (it is dropped).
    pub allow_non_restored_state: bool,
    /// The latest checkpoint is restored into a new version of the pipeline (a reload of a
    /// pipeline that could not take a savepoint): the savepoint restore rules apply.
    pub latest_into_new_version: bool,
}

/// A request from the job's control surface to one pipeline's supervisor.
pub(crate) enum Request {
    /// Take a checkpoint now; answer when it completed.
    Checkpoint(oneshot::Sender<Result<CheckpointInfo, ControlError>>),
    /// Take a savepoint into `dir` (default: `savepoints.dir`), then go on, stop or
    /// drain; answer when it is on disk.
    Savepoint {
        dir: Option<PathBuf>,
        after: AfterSavepoint,
        reply: oneshot::Sender<Result<SavepointInfo, ControlError>>,
    },
    /// Stop without a savepoint; answer when every task stopped.
    Stop(oneshot::Sender<Result<(), ControlError>>),
}

/// What a pipeline does once its savepoint is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterSavepoint {
    /// Go on.
    Continue,
    /// Stop (sources stop at the savepoint's barrier; nothing after it is processed).
    Stop,
    /// End the input: end-of-stream flows down, `emit: final` results are flushed and
    /// committed, then the pipeline ends.
    Drain,
}

/// The live state of a running pipeline, as its status shows it (the job adds the end
/// states: failed, stopped, reloading, finished).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum LiveState {
    /// Launched; the supervisor is building it.
    #[default]
    Starting,
    /// Every task runs (or finished).
    Running,
    /// Waiting to restart after a failure.
    Restarting,
    /// A stop is under way.
    Stopping,
    /// Running with tasks left down by a `noop` failover.
    Degraded,
}

impl AfterSavepoint {
    /// `go on`, `stop` or `drain`, as the log says it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            AfterSavepoint::Continue => "go on",
            AfterSavepoint::Stop => "stop",
            AfterSavepoint::Drain => "drain",
        }
    }
}

impl LiveState {
    /// The name `weir status` and the API show.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LiveState::Starting => "starting",
            LiveState::Running => "running",
            LiveState::Restarting => "restarting",
            LiveState::Stopping => "stopping",
            LiveState::Degraded => "degraded",
        }
    }
}

/// Live figures of a pipeline, read by the control surface.
#[derive(Clone, Debug, Default)]
pub(crate) struct LiveStatus {
    /// Where the pipeline is.
    pub state: LiveState,
    pub restarts: u32,
    pub checkpoints: u64,
    pub latest: Option<CheckpointId>,
    /// The most recent checkpoints and savepoints, completed and failed (at most
    /// [`HISTORY`]).
    pub history: VecDeque<CheckpointInfo>,
    pub restored_from: Option<String>,
    /// Failures in a row (see `failure::Failures`).
    pub consecutive_failures: u32,
    /// The operator (or task) of the last failure.
    pub failing: Option<String>,
    /// The last failure.
    pub last_error: Option<String>,
}

/// Checkpoints kept in [`LiveStatus::history`].
const HISTORY: usize = crate::control::CHECKPOINT_HISTORY;

/// Shared [`LiveStatus`].
pub(crate) type SharedStatus = Arc<std::sync::Mutex<LiveStatus>>;

/// How the supervisor tells the job that the pipeline is up.
#[derive(Default)]
pub(crate) struct StartWatch {
    /// When every task opened and restored.
    pub all_started: Option<oneshot::Sender<Instant>>,
    /// On probation (a reload), `Ok` once the first checkpoint after the start completed
    /// (every task processed up to its barrier), `Err` with the failure when a task failed
    /// before that: the pipeline then stops at once instead of restarting.
    pub probation: Option<oneshot::Sender<std::result::Result<(), String>>>,
    /// On probation, how long to wait for the sources' first records; `None`: the default
    /// (one second).
    pub probation_idle_wait: Option<std::time::Duration>,
}

/// The links between the job and one supervisor.
pub(crate) struct SupervisorLinks {
    pub requests: UnboundedReceiver<Request>,
    pub status: SharedStatus,
    pub start: StartWatch,
    /// The job's hand-over of keyed state between versions (hot reload).
    pub handover: Option<Arc<Handover>>,
    /// The pipeline's taps, which outlive this generation (`weir tap` across reloads).
    pub taps: Option<Arc<crate::runtime::tap::TapRegistry>>,
    /// The pipeline's figures, kept by the job across generations.
    pub metrics: Arc<PipelineMetrics>,
    /// Processing time for every operator (the job's, shared by every generation).
    pub clock: crate::base::clock::Clock,
}

/// Figures of one completed checkpoint.
#[derive(Clone, Debug)]
pub struct CheckpointStats {
    /// Its id.
    pub checkpoint: CheckpointId,
    /// From trigger to completion.
    pub duration: Duration,
    /// Bytes of every file it references.
    pub size: u64,
    /// Bytes of the files the previous completed checkpoint did not reference (what this one
    /// wrote; for incremental RocksDB much less than `size`).
    pub new_bytes: u64,
    /// Bytes of channel state (the in-flight records of an unaligned checkpoint), over every
    /// subtask; 0 for an aligned one.
    pub channel_state_bytes: u64,
}

/// How a pipeline ended.
pub(super) struct Ended {
    pub stats: Vec<CheckpointStats>,
    pub error: Option<RunError>,
    pub restarts: u32,
    pub checkpoints: u64,
    pub restored_from: Option<CheckpointId>,
    pub degraded: Vec<TaskId>,
}

/// Supervises one pipeline until it finishes, is stopped, or its restart strategy gives up.
pub(super) async fn supervise(
    plan: PipelinePlan,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    recovery: RecoveryOptions,
    faults: Vec<(String, Arc<Fault>)>,
    workers: crate::runtime::workers::Workers,
    links: SupervisorLinks,
) -> Ended {
    let mut ended = Ended {
        error: None,
        restarts: 0,
        checkpoints: 0,
        restored_from: None,
        degraded: Vec::new(),
        stats: Vec::new(),
    };
    let mut sup = match Supervisor::new(plan, reports, control, &recovery, workers, faults) {
        Ok(s) => s.linked(links),
        Err(e) => {
            if let Some(tx) = links.start.probation {
                let _ = tx.send(Err(e.to_string()));
            }
            ended.error = Some(e);
            return ended;
        }
    };
    ended.restored_from = sup.restored_from;
    ended.error = sup.run().await.err();
    ended.restarts = sup.restarts;
    ended.checkpoints = sup.checkpoints.completed_count;
    ended.degraded = sup.tasks.degraded.iter().copied().collect();
    ended.stats = std::mem::take(&mut sup.checkpoints.stats);
    ended
}
