//! Failures of a supervised pipeline: counting them for the status, asking the restart
//! strategy whether and when to restart and the failover strategy what (the failed task's
//! region, every task, or nothing: the task stays down), and carrying the restart out once
//! its delay is over. The strategies themselves are pure logic in `crate::recovery`.

use std::collections::BTreeSet;
use std::time::Instant;

use super::LiveState;
use super::phase::{PendingRestart, Phase};
use super::supervisor::Supervisor;
use crate::base::error::{ErrorClass, Result, RunError};
use crate::base::human::{Elapsed, Maybe, OneLine};
use crate::checkpoint::TaskId;
use crate::recovery::failover::{FailoverAction, RestartFrom, failover_scope};
use crate::recovery::restart::{Decision, Failure};

/// The failures of a pipeline in a row: what `weir status` shows and what a stop during a
/// restart reports. A failure is behind the pipeline once two checkpoints completed after it
/// (one can complete between a restore and a record that fails deterministically again).
#[derive(Default)]
pub(super) struct Failures {
    /// How many, in a row.
    pub consecutive: u32,
    /// Checkpoints completed since the last failure.
    pub checkpoints_since: u32,
    /// The last one: the failing operator (or task, or `pipeline`), its text and class.
    pub last: Option<(String, String, ErrorClass)>,
}

impl Supervisor {
    /// Handles a failure of `task` (`None`: of the whole pipeline, e.g. too many failed
    /// checkpoints): ask the restart strategy, then the failover strategy. An error ends the
    /// pipeline.
    pub(super) fn on_task_failed(&mut self, task: Option<TaskId>, error: RunError) -> Result<()> {
        let node = task.map_or_else(|| "pipeline".to_owned(), |t| self.tasks.task_name(t));
        tracing::error!(pipeline = %self.plan.id, task = %node, error = %OneLine(&error), "Task failed.");
        self.failures.consecutive += 1;
        self.failures.checkpoints_since = 0;
        let failing = error.element().map_or_else(|| node.clone(), str::to_owned);
        self.failures.last = Some((failing, error.to_string(), error.class()));
        if self.phase.on_probation() {
            // A new version on probation (a reload) failed before its first checkpoint: no
            // restart; the job brings the previous version back.
            self.end_probation(Err(error.to_string()));
            self.halt_tasks();
            return Err(error);
        }
        if self.control.stop.load(std::sync::atomic::Ordering::Relaxed) {
            // Stopping: no restart, the failure stands.
            self.halt_tasks();
            return Err(error);
        }
        if matches!(self.phase, Phase::Halted { .. }) {
            // Every task was stopped on purpose already: nothing restarts.
            self.tasks.abort_all();
            return Ok(());
        }
        let decision = self
            .restart
            .on_failure(Instant::now(), &Failure::from(&error));
        let (delay, attempt) = match decision {
            Decision::GiveUp { reason } => {
                // The failure was logged above, and the job logs the pipeline's end with this
                // reason ("Pipeline failed.").
                tracing::debug!(pipeline = %self.plan.id, reason = %give_up_head(&reason), "Not restarting.");
                self.tasks.abort_all();
                return Err(RunError::GaveUp {
                    reason,
                    cause: Box::new(error),
                });
            }
            Decision::Restart { delay, attempt } => (delay, attempt),
        };
        let action = match task {
            Some(task) => failover_scope(&self.plan, self.failover, task)
                .map_err(|e| RunError::Internal(e.to_string()))?,
            None => FailoverAction::Restart {
                tasks: self.tasks.all.iter().copied().collect(),
                from: RestartFrom::LatestCheckpoint,
            },
        };
        match action {
            FailoverAction::Degrade { down } => {
                tracing::warn!(pipeline = %self.plan.id, task = %self.tasks.task_name(down), "Failover `noop`: the task stays down; the pipeline runs degraded.");
                self.tasks.degraded.insert(down);
                self.tasks.spawn_drainer(down);
                if let Some(c) = self.checkpoints.coordinator.as_mut() {
                    let cmds = c.task_finished(down);
                    self.execute(cmds)?;
                }
            }
            FailoverAction::Restart { tasks, from } => {
                let mut scope: BTreeSet<TaskId> = tasks.into_iter().collect();
                // A restart already pending widens; a stop under way waits for the restart.
                let stop = match std::mem::replace(&mut self.phase, Phase::Running) {
                    Phase::Restarting { restart, stop } => {
                        scope.extend(restart.tasks);
                        stop
                    }
                    Phase::Stopping(stop) => Some(stop),
                    Phase::Running | Phase::Probation(_) | Phase::Halted { .. } => None,
                };
                self.tasks.abort_for_restart(&scope);
                self.restarts += 1;
                self.checkpoints
                    .metrics
                    .restarts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.publish(LiveState::Restarting);
                // The failure itself was logged just above ("Task failed."): not again.
                tracing::warn!(
                    pipeline = %self.plan.id,
                    attempt,
                    delay = %Elapsed(delay),
                    tasks = scope.len(),
                    strategy = %self.restart.name(),
                    failover = %failover_name(self.failover),
                    "Restarting after a failure."
                );
                self.phase = Phase::Restarting {
                    restart: PendingRestart {
                        at: Instant::now() + delay,
                        tasks: scope,
                        from,
                    },
                    stop,
                };
            }
        }
        Ok(())
    }

    /// Aborts every task and calls a pending restart off (the pipeline ends).
    pub(super) fn halt_tasks(&mut self) {
        self.tasks.abort_all();
        if let Phase::Restarting { stop, .. } = &mut self.phase {
            self.phase = match stop.take() {
                Some(stop) => Phase::Stopping(stop),
                None => Phase::Running,
            };
        }
    }

    /// The pending restart is due (and the aborted tasks are gone): restart them.
    pub(super) fn restart_if_due(&mut self) -> Result<()> {
        let due = !self.tasks.aborting()
            && self
                .phase
                .pending_restart()
                .is_some_and(|p| p.at <= Instant::now());
        if !due {
            return Ok(());
        }
        let Phase::Restarting { restart, stop } =
            std::mem::replace(&mut self.phase, Phase::Running)
        else {
            return Ok(());
        };
        // A stop that was under way goes on (its savepoint may be aborted by the restart,
        // which calls it off).
        if let Some(stop) = stop {
            self.phase = Phase::Stopping(stop);
        }
        self.do_restart(restart)
    }

    /// Restarts the tasks of `p` from the latest completed checkpoint.
    fn do_restart(&mut self, p: PendingRestart) -> Result<()> {
        let restore = self
            .checkpoints
            .setup
            .as_ref()
            .and_then(|ck| ck.latest.clone());
        let finished_in_restore: BTreeSet<TaskId> = restore
            .as_ref()
            .map(|r| r.metadata.finished_tasks.iter().copied().collect())
            .unwrap_or_default();
        if let Some(c) = self.checkpoints.coordinator.as_mut() {
            let mut finished: BTreeSet<TaskId> = self
                .tasks
                .finished
                .iter()
                .chain(self.tasks.degraded.iter())
                .copied()
                .collect();
            finished.extend(p.tasks.intersection(&finished_in_restore).copied());
            let cmds = c.restart(Instant::now(), finished);
            self.execute(cmds)?;
        }
        if p.from == RestartFrom::LatestCheckpoint {
            self.tasks.channels.renew(&self.tasks.topology, &p.tasks);
        }
        tracing::debug!(
            pipeline = %self.plan.id,
            tasks = p.tasks.len(),
            from_checkpoint = %Maybe::or(restore.as_ref().map(|r| r.metadata.checkpoint), "none (from the start)"),
            "Restarting tasks."
        );
        for t in &p.tasks {
            self.tasks.spawn(*t, restore.clone())?;
        }
        self.publish(if self.tasks.degraded.is_empty() {
            LiveState::Running
        } else {
            LiveState::Degraded
        });
        Ok(())
    }
}

/// A restart strategy's give-up reason without its `; last failure ...` tail (the failure has
/// its own log line).
pub(crate) fn give_up_head(reason: &str) -> &str {
    reason.split("; last failure").next().unwrap_or(reason)
}

/// The YAML name of a failover strategy.
fn failover_name(f: weir_schema::FailoverSpec) -> &'static str {
    match f {
        weir_schema::FailoverSpec::Full => "full",
        weir_schema::FailoverSpec::Region => "region",
        weir_schema::FailoverSpec::Individual => "individual",
        weir_schema::FailoverSpec::Noop => "noop",
    }
}
