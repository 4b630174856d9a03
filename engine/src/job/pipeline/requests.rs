//! The control surface's requests to one pipeline (a checkpoint, a savepoint then go on, stop
//! or drain, a stop without savepoint) and stops by signal: refusing what cannot be done now,
//! triggering the checkpoint, and moving the lifecycle into and out of `Stopping` as the
//! stop's checkpoint completes, fails or takes too long.

use std::time::{Duration, Instant};

use super::completion::Waiter;
use super::phase::{Phase, StopCause, StopReply, StopThen, Stopping};
use super::storage::check_writable;
use super::supervisor::Supervisor;
use super::{AfterSavepoint, LiveState, Request};
use crate::base::message::BarrierKind;
use crate::checkpoint::CheckpointId;
use crate::checkpoint::coordinator::AbortReason;
use crate::control::ControlError;
use crate::runtime::task::TaskCommand;

impl Supervisor {
    /// Carries out a request of the control surface.
    pub(super) fn on_request(&mut self, request: Request) {
        match request {
            Request::Checkpoint(reply) => self.request_checkpoint(reply),
            Request::Savepoint { dir, after, reply } => self.request_savepoint(dir, after, reply),
            Request::Stop(reply) => self.request_stop(reply),
        }
    }

    fn request_checkpoint(
        &mut self,
        reply: tokio::sync::oneshot::Sender<Result<crate::control::CheckpointInfo, ControlError>>,
    ) {
        let id = &self.plan.id;
        let Some(c) = self.checkpoints.coordinator.as_mut() else {
            let _ = reply.send(Err(ControlError::Invalid(format!(
                "pipeline `{id}` takes no checkpoints (`checkpoints: {{enabled: false}}`)"
            ))));
            return;
        };
        match c.trigger_now(Instant::now(), BarrierKind::Checkpoint) {
            Ok(barrier) => {
                self.checkpoints
                    .waiters
                    .insert(barrier.checkpoint, Waiter::Checkpoint(reply));
                self.inject(barrier);
            }
            Err(e) => {
                let _ = reply.send(Err(ControlError::Invalid(format!("pipeline `{id}`: {e}"))));
            }
        }
    }

    fn request_savepoint(
        &mut self,
        dir: Option<std::path::PathBuf>,
        after: AfterSavepoint,
        reply: tokio::sync::oneshot::Sender<Result<crate::control::SavepointInfo, ControlError>>,
    ) {
        let id = self.plan.id.clone();
        if self.phase.is_stopping() {
            let _ = reply.send(Err(busy_stopping(&id)));
            return;
        }
        if self.phase.pending_restart().is_some() {
            let _ = reply.send(Err(ControlError::Busy(format!(
                "pipeline `{id}` is restarting after a failure: a savepoint needs every task running; try again when it runs (`weir status`), or stop it without a savepoint"
            ))));
            return;
        }
        if let Some((n, _)) = self
            .checkpoints
            .waiters
            .iter()
            .find(|(_, w)| matches!(w, Waiter::Savepoint { .. }))
        {
            let _ = reply.send(Err(ControlError::Busy(format!(
                "a savepoint of pipeline `{id}` is already in progress (checkpoint {n})"
            ))));
            return;
        }
        let Some(c) = self.checkpoints.coordinator.as_mut() else {
            let _ = reply.send(Err(ControlError::Invalid(format!(
                "pipeline `{id}` takes no checkpoints (`checkpoints: {{enabled: false}}`), so it cannot take a savepoint; enable checkpoints to keep its state across stops and reloads"
            ))));
            return;
        };
        let dir = dir.unwrap_or_else(|| self.plan.paths.savepoints.clone());
        // Once a stop-with-savepoint's checkpoint completes the tasks stop, whether or not
        // the copy into `dir` succeeds: find out now that it cannot.
        if let Err(e) = check_writable(&dir) {
            let _ = reply.send(Err(ControlError::Invalid(format!(
                "pipeline `{id}`: cannot write a savepoint into `{}`: {e}; nothing was stopped or taken",
                dir.display()
            ))));
            return;
        }
        let kind = if after == AfterSavepoint::Continue {
            BarrierKind::Savepoint
        } else {
            BarrierKind::SavepointThenStop
        };
        match c.trigger_now(Instant::now(), kind) {
            Ok(barrier) => {
                tracing::debug!(pipeline = %id, checkpoint = barrier.checkpoint, dir = %dir.display(), then = %after.name(), "Taking a savepoint.");
                self.checkpoints
                    .waiters
                    .insert(barrier.checkpoint, Waiter::Savepoint { dir, reply });
                if after != AfterSavepoint::Continue {
                    let mut stop = Stopping::new(Some(barrier.checkpoint), StopCause::Request);
                    if after == AfterSavepoint::Drain {
                        stop.then = StopThen::Drain;
                    }
                    self.enter_stopping(stop);
                    self.publish(LiveState::Stopping);
                }
                self.inject(barrier);
            }
            Err(e) => {
                let _ = reply.send(Err(ControlError::Invalid(format!("pipeline `{id}`: {e}"))));
            }
        }
    }

    fn request_stop(&mut self, reply: StopReply) {
        let id = &self.plan.id;
        if self.phase.is_stopping() {
            let _ = reply.send(Err(busy_stopping(id)));
            return;
        }
        tracing::info!(pipeline = %id, "Stop requested (no savepoint).");
        let mut reply = Some(reply);
        if self.halt_restart(&mut reply) {
            self.publish(LiveState::Stopping);
            return;
        }
        let mut stop = Stopping::new(None, StopCause::Request);
        stop.reply = reply;
        self.enter_stopping(stop);
        self.publish(LiveState::Stopping);
        self.tasks.stop_all();
    }

    /// Moves into `Stopping` with `stop`, carrying a probation under way along.
    fn enter_stopping(&mut self, mut stop: Stopping) {
        if let Phase::Probation(p) = std::mem::replace(&mut self.phase, Phase::Running) {
            stop.probation = Some(p);
        }
        self.phase = Phase::Stopping(stop);
    }

    /// A stop while the pipeline waits to restart after a failure: no checkpoint can be taken
    /// (tasks are down), so the restart is called off and every task stops now; the next run
    /// resumes from the latest completed checkpoint. Whether it halted; then the stop's
    /// `reply` is taken along, to be sent when the loop ends.
    fn halt_restart(&mut self, reply: &mut Option<StopReply>) -> bool {
        if self.phase.pending_restart().is_none() {
            return false;
        }
        tracing::info!(pipeline = %self.plan.id, "Stop requested while restarting after a failure: the restart is called off.");
        self.tasks.abort_all();
        self.phase = Phase::Halted {
            reply: reply.take(),
        };
        true
    }

    /// A stop was requested by a signal: take a final checkpoint; the tasks stop when it
    /// completes.
    pub(super) fn begin_stop(&mut self) {
        if self.halt_restart(&mut None) {
            return;
        }
        let Some(c) = self.checkpoints.coordinator.as_mut() else {
            return;
        };
        match c.trigger_now(Instant::now(), BarrierKind::SavepointThenStop) {
            Ok(barrier) => {
                tracing::info!(pipeline = %self.plan.id, checkpoint = barrier.checkpoint, "Stop requested: taking a final checkpoint.");
                let wait = self
                    .plan
                    .spec
                    .checkpoints
                    .timeout
                    .get()
                    .min(Duration::from_secs(30));
                let mut stop = Stopping::new(Some(barrier.checkpoint), StopCause::Signal);
                stop.deadline = Some(Instant::now() + wait);
                self.enter_stopping(stop);
                self.inject(barrier);
            }
            Err(e) => {
                tracing::info!(pipeline = %self.plan.id, reason = %e, "Stop requested; no final checkpoint.");
                self.enter_stopping(Stopping::new(None, StopCause::Signal));
                self.tasks.stop_all();
            }
        }
    }

    /// The stop's final checkpoint is taking too long: stop without it.
    pub(super) fn stop_deadline_passed(&mut self) {
        let Some(stop) = self.phase.stopping_mut() else {
            return;
        };
        if stop.deadline.is_none_or(|d| d > Instant::now()) {
            return;
        }
        stop.deadline = None;
        tracing::warn!(pipeline = %self.plan.id, "The final checkpoint is taking too long; stopping without it (the next run resumes from the last completed one).");
        self.tasks.stop_all();
    }

    /// Checkpoint `id` completed: when the stop stops at it, the tasks stop (or drain).
    pub(super) fn stop_after_checkpoint(&mut self, id: CheckpointId) {
        if !self.phase.stops_at(id) {
            return;
        }
        let Some(stop) = self.phase.stopping_mut() else {
            return;
        };
        stop.deadline = None;
        let command = if stop.then == StopThen::Drain {
            tracing::info!(pipeline = %self.plan.id, checkpoint = id, "Savepoint complete; draining (sources end, results are flushed).");
            TaskCommand::Drain
        } else if matches!(
            self.checkpoints.waiters.get(&id),
            Some(Waiter::Savepoint { .. })
        ) {
            tracing::debug!(pipeline = %self.plan.id, checkpoint = id, "Savepoint complete; stopping.");
            TaskCommand::Stop
        } else {
            tracing::info!(pipeline = %self.plan.id, checkpoint = id, "Final checkpoint complete; stopping (the next run resumes from it).");
            TaskCommand::Stop
        };
        if command == TaskCommand::Stop {
            self.tasks.stop_all();
        } else {
            self.tasks.send_all(command);
        }
    }

    /// Checkpoint `id` was aborted: when the stop stops at it, a requested stop is called
    /// off (the pipeline goes on) and a signal's stop stops without it.
    pub(super) fn stop_checkpoint_aborted(&mut self, id: CheckpointId, reason: &AbortReason) {
        if !self.phase.stops_at(id) {
            return;
        }
        let cause = self.phase.stopping().map(|s| s.cause);
        if cause == Some(StopCause::Request) {
            tracing::warn!(pipeline = %self.plan.id, %reason, "The stop's savepoint failed; the pipeline goes on.");
            self.call_stop_off();
            self.tasks.send_sources(TaskCommand::Resume);
            self.publish(LiveState::Running);
        } else {
            tracing::warn!(pipeline = %self.plan.id, %reason, "The final checkpoint failed; stopping anyway (the next run resumes from the last completed one).");
            self.tasks.stop_all();
        }
    }

    /// The stop under way is called off: back to running (or to the probation the stop
    /// interrupted).
    fn call_stop_off(&mut self) {
        match std::mem::replace(&mut self.phase, Phase::Running) {
            Phase::Stopping(stop) => {
                if let Some(p) = stop.probation {
                    self.phase = Phase::Probation(p);
                }
            }
            Phase::Restarting { restart, .. } => {
                self.phase = Phase::Restarting {
                    restart,
                    stop: None,
                };
            }
            other => self.phase = other,
        }
    }
}

fn busy_stopping(id: &str) -> ControlError {
    ControlError::Busy(format!(
        "pipeline `{id}` is stopping; try again when it is done"
    ))
}
