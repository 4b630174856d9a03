//! Probation: a reload's new version proves itself before the job lets the old one go. Once
//! every task started, the supervisor takes a checkpoint as soon as a source tells it that it
//! produced records (or a second later, for an idle input: a deadline, not a poll), so that
//! its barrier follows records: its completion proves every task processes them. A failure before that ends the pipeline at
//! once (the job brings the previous version back) instead of restarting it.

use std::time::Instant;

use super::phase::{Probation, ProbationStep};
use super::supervisor::Supervisor;
use crate::base::message::BarrierKind;
use crate::checkpoint::CheckpointId;
use crate::checkpoint::coordinator::AbortReason;
use crate::runtime::task::TaskCommand;

impl Supervisor {
    /// Every task of the first attempt started: arm the probation checkpoint, and ask the
    /// sources to tell when they next produce records.
    pub(super) fn arm_probation(&mut self) {
        let Some(p) = self.phase.probation_mut() else {
            return;
        };
        p.step = ProbationStep::Armed {
            since: Instant::now(),
        };
        self.tasks.send_sources(TaskCommand::NotifyProduced);
    }

    /// A source produced records: an armed probation takes its checkpoint now, so that its
    /// barrier follows them.
    pub(super) fn on_produced(&mut self) {
        if self.probation_armed() {
            self.trigger_probation();
        }
    }

    /// An armed probation whose idle wait is over takes its checkpoint (nothing was produced:
    /// an idle input).
    pub(super) fn probation_due(&mut self) {
        let due = self.phase.probation_mut().is_some_and(|p| {
            p.deadline()
                .is_some_and(|deadline| deadline <= Instant::now())
        });
        if due {
            self.trigger_probation();
        }
    }

    fn probation_armed(&mut self) -> bool {
        self.phase
            .probation_mut()
            .is_some_and(|p| matches!(p.step, ProbationStep::Armed { .. }))
    }

    /// Triggers the probation checkpoint; with nothing left to checkpoint (every task already
    /// finished, a short bounded input) the probation passes.
    fn trigger_probation(&mut self) {
        let Some(c) = self.checkpoints.coordinator.as_mut() else {
            self.end_probation(Ok(()));
            return;
        };
        match c.trigger_now(Instant::now(), BarrierKind::Checkpoint) {
            Ok(barrier) => {
                if let Some(p) = self.phase.probation_mut() {
                    p.step = ProbationStep::Checkpoint(Some(barrier.checkpoint));
                }
                self.inject(barrier);
            }
            // Every task already finished (a short bounded input): nothing failed.
            Err(_) => self.end_probation(Ok(())),
        }
    }

    /// Checkpoint `id` completed: the probation passes when it was the probation's or later.
    pub(super) fn probation_checkpoint_completed(&mut self, id: CheckpointId) {
        let passed = self
            .phase
            .probation_mut()
            .is_some_and(|p| matches!(p.step, ProbationStep::Checkpoint(Some(c)) if c <= id));
        if passed {
            self.end_probation(Ok(()));
        }
    }

    /// Checkpoint `id` was aborted: when it was the probation's, try again, up to
    /// [`Probation::MAX_FAILED_CHECKPOINTS`] times.
    pub(super) fn probation_checkpoint_aborted(&mut self, id: CheckpointId, reason: &AbortReason) {
        let Some(p) = self.phase.probation_mut() else {
            return;
        };
        if p.step != ProbationStep::Checkpoint(Some(id)) {
            return;
        }
        p.step = ProbationStep::Checkpoint(None);
        p.failed_checkpoints += 1;
        if p.failed_checkpoints >= Probation::MAX_FAILED_CHECKPOINTS {
            self.end_probation(Err(format!(
                "the first checkpoints after the start failed: {reason}"
            )));
        } else {
            self.trigger_probation();
        }
    }

    /// Ends the probation (if any) with `result`, told to the job.
    pub(super) fn end_probation(&mut self, result: std::result::Result<(), String>) {
        if let Some(p) = self.phase.take_probation() {
            let _ = p.verdict.send(result);
        }
    }
}
