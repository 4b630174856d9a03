//! The lifecycle of a supervised pipeline as a typed state: which phase it is in and the data
//! that phase needs (a pending restart, a stop under way, a probation's progress). Only the
//! types and their pure questions live here; the transitions are carried out by the
//! supervisor's `requests`, `failure`, `probation` and `completion` modules.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::checkpoint::{CheckpointId, TaskId};
use crate::control::ControlError;
use crate::recovery::failover::RestartFrom;

/// Where the pipeline is in its life.
pub(super) enum Phase {
    /// Every task runs (or has finished, or stays down after a `noop` failover).
    Running,
    /// A reload's new version proves itself: no restart on a failure, which is reported to
    /// the job instead, until the first checkpoint after the start completes.
    Probation(Probation),
    /// Tasks failed and wait out the restart strategy's delay before they are spawned again.
    Restarting {
        /// What restarts, when, and from where.
        restart: PendingRestart,
        /// A stop with a savepoint that was under way when the failure came: it goes on
        /// after the restart unless the restart aborts its savepoint.
        stop: Option<Stopping>,
    },
    /// A stop is under way: a final checkpoint or savepoint, then every task stops.
    Stopping(Stopping),
    /// A stop came while the pipeline waited to restart: every task was aborted, the loop
    /// ends once they are gone, and the run ends as failed (the next run resumes from the
    /// latest completed checkpoint).
    Halted {
        /// The answer to a stop request, sent when the loop ends.
        reply: Option<StopReply>,
    },
}

/// The answer to a stop without savepoint, sent when every task stopped.
pub(super) type StopReply = oneshot::Sender<Result<(), ControlError>>;

/// The verdict of a probation: `Ok` once it passed, `Err` with the failure.
pub(super) type Verdict = oneshot::Sender<Result<(), String>>;

impl Phase {
    /// Whether a stop is under way (a signal's stop then waits for it; another stop or a
    /// savepoint request is refused as busy).
    pub(super) fn is_stopping(&self) -> bool {
        self.stopping().is_some() || matches!(self, Phase::Halted { .. })
    }

    /// The stop under way, if any (also while a restart interrupts it).
    pub(super) fn stopping(&self) -> Option<&Stopping> {
        match self {
            Phase::Stopping(s) | Phase::Restarting { stop: Some(s), .. } => Some(s),
            _ => None,
        }
    }

    /// The stop under way, if any, for a change.
    pub(super) fn stopping_mut(&mut self) -> Option<&mut Stopping> {
        match self {
            Phase::Stopping(s) | Phase::Restarting { stop: Some(s), .. } => Some(s),
            _ => None,
        }
    }

    /// Whether the stop under way stops at checkpoint `id`.
    pub(super) fn stops_at(&self, id: CheckpointId) -> bool {
        self.stopping().is_some_and(|s| s.at == Some(id))
    }

    /// The probation under way, if any (a stop may begin during one).
    pub(super) fn probation_mut(&mut self) -> Option<&mut Probation> {
        match self {
            Phase::Probation(p) => Some(p),
            Phase::Stopping(s) => s.probation.as_mut(),
            _ => None,
        }
    }

    /// Whether the pipeline is on probation.
    pub(super) fn on_probation(&self) -> bool {
        match self {
            Phase::Probation(_) => true,
            Phase::Stopping(s) => s.probation.is_some(),
            _ => false,
        }
    }

    /// Takes the probation out of the phase (it ended).
    pub(super) fn take_probation(&mut self) -> Option<Probation> {
        match self {
            Phase::Probation(_) => match std::mem::replace(self, Phase::Running) {
                Phase::Probation(p) => Some(p),
                _ => None,
            },
            Phase::Stopping(s) => s.probation.take(),
            _ => None,
        }
    }

    /// The pending restart, if any.
    pub(super) fn pending_restart(&self) -> Option<&PendingRestart> {
        match self {
            Phase::Restarting { restart, .. } => Some(restart),
            _ => None,
        }
    }

    /// The earliest instant at which the phase has something to do by itself: a restart
    /// that is due (once the aborted tasks are gone), a stop that stops waiting for its final
    /// checkpoint, a probation that stops waiting for the sources' records.
    pub(super) fn next_wakeup(&self, aborting: bool) -> Option<Instant> {
        match self {
            Phase::Running | Phase::Halted { .. } => None,
            Phase::Probation(p) => p.deadline(),
            Phase::Restarting { restart, .. } => (!aborting).then_some(restart.at),
            Phase::Stopping(s) => [
                s.deadline,
                s.probation.as_ref().and_then(Probation::deadline),
            ]
            .into_iter()
            .flatten()
            .min(),
        }
    }
}

/// Tasks waiting to be restarted.
pub(super) struct PendingRestart {
    /// When the restart strategy's delay is over.
    pub at: Instant,
    /// The failover scope.
    pub tasks: BTreeSet<TaskId>,
    /// Whether the scope's channels are renewed (a restart from the latest checkpoint).
    pub from: RestartFrom,
}

/// Who asked for a stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StopCause {
    /// A signal or the job's stop flag: the run ends, nothing calls the stop off.
    Signal,
    /// The control surface: when the stop's savepoint fails, the pipeline goes on.
    Request,
}

/// What the tasks do once the stop's savepoint completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StopThen {
    /// Stop where they are.
    Stop,
    /// End the input (end-of-stream flows down, results are flushed), then end.
    Drain,
}

/// A stop under way.
pub(super) struct Stopping {
    /// The final checkpoint or savepoint the tasks stop at; `None`: they were told to stop
    /// without one.
    pub at: Option<CheckpointId>,
    /// When a signal's stop stops waiting for its final checkpoint.
    pub deadline: Option<Instant>,
    /// Who asked.
    pub cause: StopCause,
    /// What follows the savepoint.
    pub then: StopThen,
    /// The answer to a stop without savepoint.
    pub reply: Option<StopReply>,
    /// A probation under way when the stop began: its verdict still comes from the first
    /// checkpoint that completes.
    pub probation: Option<Probation>,
}

impl Stopping {
    /// A stop of `cause` at checkpoint `at` (`None`: without one).
    pub(super) fn new(at: Option<CheckpointId>, cause: StopCause) -> Self {
        Self {
            at,
            deadline: None,
            cause,
            then: StopThen::Stop,
            reply: None,
            probation: None,
        }
    }
}

/// A reload's new version on probation.
pub(super) struct Probation {
    /// Where the verdict goes.
    pub verdict: Verdict,
    /// How far it got.
    pub step: ProbationStep,
    /// Probation checkpoints that were aborted so far.
    pub failed_checkpoints: u32,
    /// How long an armed probation waits for records ([`Self::IDLE_WAIT`] unless the reload
    /// asked for another wait).
    pub idle_wait: Duration,
}

impl Probation {
    /// Aborted probation checkpoints after which the probation fails.
    pub(super) const MAX_FAILED_CHECKPOINTS: u32 = 3;

    /// How long the probation waits for the sources' first records before it takes its
    /// checkpoint anyway (an idle input).
    pub(super) const IDLE_WAIT: Duration = Duration::from_secs(1);

    /// A probation that starts now, answering on `verdict`.
    pub(super) fn new(verdict: Verdict) -> Self {
        Self {
            verdict,
            step: ProbationStep::Starting,
            failed_checkpoints: 0,
            idle_wait: Self::IDLE_WAIT,
        }
    }

    /// When the wait for the sources' first records is over.
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self.step {
            ProbationStep::Armed { since } => Some(since + self.idle_wait),
            _ => None,
        }
    }
}

/// How far a probation got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ProbationStep {
    /// Tasks are opening and restoring.
    Starting,
    /// Every task started: the probation checkpoint waits for a source to produce records
    /// (it was asked to tell), or until [`Probation::IDLE_WAIT`] after `since`.
    Armed {
        /// When every task had started.
        since: Instant,
    },
    /// The probation checkpoint is in flight (or none is, after one was aborted and the next
    /// could not be triggered yet).
    Checkpoint(Option<CheckpointId>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart(at: Instant) -> PendingRestart {
        PendingRestart {
            at,
            tasks: BTreeSet::new(),
            from: RestartFrom::LatestCheckpoint,
        }
    }

    #[test]
    fn a_stop_interrupted_by_a_restart_is_still_under_way() {
        let at = Instant::now();
        let phase = Phase::Restarting {
            restart: restart(at),
            stop: Some(Stopping::new(Some(7), StopCause::Request)),
        };
        assert!(phase.is_stopping());
        assert!(phase.stops_at(7));
        assert!(!phase.stops_at(8));
        assert_eq!(phase.next_wakeup(false), Some(at));
        assert_eq!(
            phase.next_wakeup(true),
            None,
            "aborted tasks must be gone first"
        );
    }

    #[test]
    fn halted_is_stopping_without_a_checkpoint() {
        let phase = Phase::Halted { reply: None };
        assert!(phase.is_stopping());
        assert!(!phase.stops_at(0));
        assert!(Phase::Running.next_wakeup(false).is_none());
    }

    #[test]
    fn an_armed_probation_wakes_after_the_idle_wait_and_survives_a_stop() {
        let (tx, _rx) = oneshot::channel();
        let since = Instant::now();
        let mut p = Probation::new(tx);
        assert_eq!(p.deadline(), None);
        p.step = ProbationStep::Armed { since };
        let mut stop = Stopping::new(None, StopCause::Signal);
        stop.probation = Some(p);
        let mut phase = Phase::Stopping(stop);
        assert!(phase.on_probation());
        assert_eq!(phase.next_wakeup(false), Some(since + Probation::IDLE_WAIT));
        assert!(phase.take_probation().is_some());
        assert!(!phase.on_probation());
        assert!(phase.is_stopping());
    }
}
