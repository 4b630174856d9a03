//! Applying a hot reload to the running job: validate the new file, diff it against the
//! running version, then per changed pipeline stop-with-savepoint → build the new version →
//! restore → resume on probation, and bring the old version back from the same savepoint when
//! the new one fails to start; the result of each pipeline, ranked, makes the reload's result.
//! The job's slots and its control surface are `manager`'s; this module only drives a reload
//! through them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::oneshot;

use super::RecoveryOptions;
use super::manager::{Job, RELOAD_SAVEPOINTS_KEPT, now_ms};
use super::pipeline::{AfterSavepoint, LiveState, Request, StartWatch};
use crate::control::{
    ControlError, RELOAD_HISTORY_KEPT, ReloadOutcome, ReloadRequest, StopOutcome, StopRequest,
};
use crate::plan::PipelinePlan;
use crate::reload::plan::{Change, PipelineDiff};

impl Job {
    fn render(&self, validation: &crate::validate::Validation) -> Vec<String> {
        let diags: Vec<&weir_schema::Diagnostic> = validation.diagnostics.iter().collect();
        match &self.render {
            Some(r) => vec![r(&diags)],
            None => diags.iter().map(|d| d.to_string()).collect(),
        }
    }

    /// A note when the `api:` section of a reloaded file differs from the one the control API
    /// was set up from: the API is not rebound by a reload (its clients would lose it
    /// mid-call), so the change waits for the next start of `weir run`.
    fn api_change(&self, new: Option<&weir_schema::ApiSpec>) -> Option<String> {
        let (old, new) = (self.api_spec.as_ref()?, new?);
        if old == new {
            return None;
        }
        let show = |a: &weir_schema::ApiSpec| {
            format!(
                "enabled: {}, port: {}, token_env: {}",
                a.enabled,
                a.port,
                a.token_env.as_deref().unwrap_or("none")
            )
        };
        Some(format!(
            "the file's `api:` section changed ({} → {}); the control API keeps its current \
             settings until `weir run` restarts (and `weir run`'s --no-api, --api-port and \
             --api-token flags win over the file)",
            show(old),
            show(new)
        ))
    }

    /// Applies (or plans) a reload.
    pub(super) async fn do_reload(
        self: &Arc<Self>,
        request: ReloadRequest,
    ) -> Result<ReloadOutcome, ControlError> {
        let running = self.file.clone().ok_or_else(|| {
            ControlError::Invalid(
                "this job was not started from a file, so it cannot reload".into(),
            )
        })?;
        if request.file.is_some() && !request.plan_only {
            return Err(ControlError::Invalid(
                "a reload applies the running file; another file can only be compared (plan_only)"
                    .into(),
            ));
        }
        let file = match &request.file {
            Some(f) => super::confine::reload_file(&running, f)?,
            None => running,
        };
        let _guard = self
            .reload_lock
            .try_lock()
            .map_err(|_| ControlError::Busy("a reload is already in progress".into()))?;
        let mut outcome = ReloadOutcome::default();
        let validation = {
            let file = file.clone();
            tokio::task::spawn_blocking(move || crate::validate::validate_file(&file))
                .await
                .map_err(|e| ControlError::Failed(format!("validation panicked: {e}")))?
        };
        let new_plan = match validation.plan() {
            Some(Ok(plan)) => plan,
            Some(Err(e)) => {
                outcome.messages = vec![format!("{}: {e}", file.display())];
                return Ok(self.finish_reload(outcome, ReloadResult::Rejected, request.plan_only));
            }
            None => {
                outcome.messages = self.render(&validation);
                outcome.messages.push(format!(
                    "{}: invalid; the running version is left untouched",
                    file.display()
                ));
                return Ok(self.finish_reload(outcome, ReloadResult::Rejected, request.plan_only));
            }
        };
        if let Some(note) = self.api_change(validation.spec.as_ref().map(|s| &s.api)) {
            tracing::warn!("{note}");
            outcome.messages.push(note);
        }
        let old_plan = self.file_plan();
        let allow_non_restored_state =
            request.allow_non_restored_state || self.allow_non_restored_state;
        let plans = crate::reload::plan::diff(&old_plan, &new_plan, allow_non_restored_state);
        outcome.pipelines = plans.iter().map(PipelineDiff::to_wire).collect();
        if request.plan_only {
            return Ok(self.finish_reload(outcome, ReloadResult::Planned, true));
        }
        if !crate::reload::plan::is_applicable(&plans) {
            outcome.messages = plans
                .iter()
                .flat_map(|p| {
                    p.problems()
                        .iter()
                        .map(move |m| format!("pipeline `{}`: {m}", p.pipeline))
                })
                .collect();
            outcome
                .messages
                .push("the running version is left untouched".into());
            return Ok(self.finish_reload(outcome, ReloadResult::Rejected, false));
        }
        if plans.iter().all(|p| p.change == Change::Unchanged) {
            return Ok(self.finish_reload(outcome, ReloadResult::Unchanged, false));
        }
        let by_id: BTreeMap<&str, &PipelinePlan> = new_plan
            .pipelines
            .iter()
            .map(|p| (p.id.as_str(), p))
            .collect();
        let mut result = ReloadResult::Applied;
        let mut pause: Option<u64> = None;
        for p in &plans {
            match &p.change {
                Change::Added => {
                    if let Some(plan) = by_id.get(p.pipeline.as_str()) {
                        tracing::info!(pipeline = %p.pipeline, "Reload: starting a new pipeline.");
                        drop(self.launch(
                            (*plan).clone(),
                            RecoveryOptions::default(),
                            StartWatch::default(),
                        ));
                    }
                }
                Change::Removed => {
                    // With checkpoints, stopped with a savepoint that keeps its state;
                    // without, a plain stop (a savepoint would be refused, and the pipeline
                    // would run on unseen).
                    let checkpoints = self
                        .slots()
                        .iter()
                        .find(|s| s.plan.id == p.pipeline && !s.removed)
                        .is_some_and(|s| s.plan.spec.checkpoints.enabled);
                    tracing::info!(pipeline = %p.pipeline, savepoint = checkpoints, "Reload: the pipeline is gone from the file; stopping it.");
                    let stopped = self
                        .stop_pipeline(
                            &p.pipeline,
                            StopRequest {
                                savepoint: checkpoints,
                                ..StopRequest::default()
                            },
                        )
                        .await;
                    match stopped {
                        Ok(StopOutcome {
                            savepoint: Some(sp),
                            ..
                        }) => outcome.messages.push(format!(
                            "pipeline `{}` removed; its state is in savepoint {}",
                            p.pipeline,
                            sp.path.display()
                        )),
                        Ok(StopOutcome {
                            savepoint: None, ..
                        }) => outcome.messages.push(format!(
                            "pipeline `{}` removed; it took no checkpoints, so no state was kept",
                            p.pipeline
                        )),
                        Err(e) if self.is_running(&p.pipeline) => {
                            // The savepoint failed: stop it anyway, it is gone from the file.
                            outcome.messages.push(format!(
                                "pipeline `{}` removed without a savepoint (it failed: {e})",
                                p.pipeline
                            ));
                            if let Err(e) = self
                                .stop_pipeline(&p.pipeline, StopRequest::default())
                                .await
                            {
                                outcome
                                    .messages
                                    .push(format!("pipeline `{}`: {e}", p.pipeline));
                            }
                        }
                        // It had ended already.
                        Err(_) => {}
                    }
                    self.set_slot(&p.pipeline, |s| s.removed = true);
                }
                Change::Changed(_) => {
                    let Some(new) = by_id.get(p.pipeline.as_str()) else {
                        continue;
                    };
                    match self
                        .replace(
                            new,
                            allow_non_restored_state,
                            request.probation_idle_wait,
                            &mut outcome.messages,
                        )
                        .await
                    {
                        Ok(ms) => pause = Some(pause.map_or(ms, |p| p.max(ms))),
                        Err(e) => {
                            result = result.worse(e.into());
                            if e == ReplaceError::Failed {
                                break;
                            }
                        }
                    }
                }
                Change::Unchanged => {}
            }
        }
        outcome.pause_ms = pause;
        Ok(self.finish_reload(outcome, result, false))
    }

    /// Replaces one running pipeline by its new version: savepoint and stop, start the new
    /// version from the savepoint on probation; on failure start the old one again from the
    /// same savepoint. `Ok(pause ms)`, or how it did not apply.
    async fn replace(
        self: &Arc<Self>,
        new: &PipelinePlan,
        allow_non_restored_state: bool,
        probation_idle_wait: Option<std::time::Duration>,
        messages: &mut Vec<String>,
    ) -> Result<u64, ReplaceError> {
        let id = new.id.clone();
        let old = {
            let slots = self.slots();
            match slots.iter().find(|s| s.plan.id == id) {
                Some(s) => Arc::clone(&s.plan),
                None => return Err(ReplaceError::Failed),
            }
        };
        self.set_slot(&id, |s| s.reloading = true);
        // The old version's state is handed over to the new one where it fits, and what is
        // left is freed after this reload, not during its pause.
        let _free_later = crate::base::dispose::hold();
        self.handover.expect(&id);
        let result = self
            .replace_inner(
                new,
                &old,
                allow_non_restored_state,
                probation_idle_wait,
                messages,
            )
            .await;
        self.handover.clear(&id);
        self.prune_reload_savepoints(&id);
        result
    }

    /// Deletes the savepoints of this pipeline's older reloads beyond the last
    /// [`RELOAD_SAVEPOINTS_KEPT`]. Only savepoints this job took for reloads: those taken
    /// with `weir savepoint` or `weir stop --savepoint`, or when a pipeline is removed from
    /// the file, are the user's and stay.
    fn prune_reload_savepoints(&self, pipeline: &str) {
        let old: Vec<PathBuf> = {
            let mut all = self
                .reload_savepoints
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(list) = all.get_mut(pipeline) else {
                return;
            };
            let excess = list.len().saturating_sub(RELOAD_SAVEPOINTS_KEPT);
            list.drain(..excess).collect()
        };
        for path in old {
            match crate::checkpoint::savepoint::delete_savepoint(&path) {
                Ok(()) => {
                    tracing::info!(pipeline, path = %path.display(), kept = RELOAD_SAVEPOINTS_KEPT, "Removed the savepoint of an older reload.");
                }
                Err(e) => {
                    tracing::warn!(pipeline, path = %path.display(), error = %e, "Cannot remove the savepoint of an older reload; delete it by hand.");
                }
            }
        }
    }

    async fn replace_inner(
        self: &Arc<Self>,
        new: &PipelinePlan,
        old: &Arc<PipelinePlan>,
        allow_non_restored_state: bool,
        probation_idle_wait: Option<std::time::Duration>,
        messages: &mut Vec<String>,
    ) -> Result<u64, ReplaceError> {
        let id = new.id.clone();
        let paused_at = Instant::now();
        let mut crash_looping = false;
        let savepoint = if old.spec.checkpoints.enabled {
            match self
                .ask(&id, |reply| Request::Savepoint {
                    dir: None,
                    after: AfterSavepoint::Stop,
                    reply,
                })
                .await
            {
                Ok(sp) => {
                    self.reload_savepoints
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(id.clone())
                        .or_default()
                        .push_back(sp.path.clone());
                    Some(sp)
                }
                Err(e) if self.live_state(&id) == Some(LiveState::Restarting) => {
                    // A crash-looping pipeline cannot take a savepoint, and editing its file
                    // is how it gets fixed: stop it, and start the new version from its latest
                    // completed checkpoint instead.
                    tracing::warn!(pipeline = %id, error = %e, "The pipeline is restarting after failures; the new version starts from its latest completed checkpoint.");
                    messages.push(format!(
                        "pipeline `{id}` was restarting after failures (no savepoint possible): the new version starts from its latest completed checkpoint"
                    ));
                    let _ = self.ask(&id, Request::Stop).await;
                    crash_looping = true;
                    None
                }
                Err(e) => {
                    // The old version goes on (a failed stop-savepoint resumes it).
                    self.set_slot(&id, |s| s.reloading = false);
                    messages.push(format!(
                        "pipeline `{id}`: the savepoint before the reload failed, the running version goes on: {e}"
                    ));
                    return Err(ReplaceError::Rejected);
                }
            }
        } else {
            messages.push(format!(
                "pipeline `{id}` takes no checkpoints: it restarts without its state"
            ));
            let _ = self.ask(&id, Request::Stop).await;
            None
        };
        self.wait_ended(&id).await;
        let recovery = RecoveryOptions {
            from_savepoint: savepoint.as_ref().map(|s| s.path.clone()),
            allow_non_restored_state,
            latest_into_new_version: crash_looping,
            ..RecoveryOptions::default()
        };
        let (started_tx, started_rx) = oneshot::channel();
        let (probation_tx, probation_rx) = oneshot::channel();
        let ended = self.launch(
            new.clone(),
            recovery.clone(),
            StartWatch {
                all_started: Some(started_tx),
                probation: Some(probation_tx),
                probation_idle_wait,
            },
        );
        let verdict = probation_rx
            .await
            .unwrap_or_else(|_| Err("the new version ended before it started".into()));
        match verdict {
            Ok(()) => {
                let started_at = started_rx.await.unwrap_or_else(|_| Instant::now());
                let pause = started_at.saturating_duration_since(paused_at).as_millis() as u64;
                let handed = self.handover.taken(&id);
                tracing::info!(pipeline = %id, pause = %crate::base::human::Elapsed::ms(pause), handed_over = handed, savepoint = %crate::base::human::Maybe::or(savepoint.as_ref().map(|s| s.path.display()), "none"), "Reload applied.");
                if handed > 0 {
                    messages.push(format!(
                        "pipeline `{id}`: the keyed state of {handed} subtask(s) was handed over in memory instead of being read back from the savepoint"
                    ));
                }
                self.set_slot(&id, |s| s.reloading = false);
                Ok(pause)
            }
            Err(why) => {
                tracing::error!(pipeline = %id, error = %why, "The new version failed to start; bringing the previous version back.");
                messages.push(format!(
                    "pipeline `{id}`: the new version failed to start: {why}"
                ));
                // The failed version stops by itself on probation; wait for its end.
                let _ = ended.await;
                let (probation_tx, probation_rx) = oneshot::channel();
                let _restarted = self.launch(
                    (**old).clone(),
                    RecoveryOptions {
                        allow_non_restored_state: true,
                        ..recovery
                    },
                    StartWatch {
                        all_started: None,
                        // A version that was crash-looping goes back to its restart strategy.
                        probation: (!crash_looping).then_some(probation_tx),
                        probation_idle_wait,
                    },
                );
                let back = if crash_looping {
                    Ok(())
                } else {
                    probation_rx.await.unwrap_or_else(|_| {
                        Err("the previous version ended before it started".into())
                    })
                };
                self.set_slot(&id, |s| s.reloading = false);
                match back {
                    Ok(()) => {
                        messages.push(if crash_looping {
                            format!("pipeline `{id}`: rolled back; the previous version runs again from its latest checkpoint")
                        } else {
                            format!("pipeline `{id}`: rolled back; the previous version runs again from the same savepoint")
                        });
                        Err(ReplaceError::RolledBack)
                    }
                    Err(e) => {
                        messages.push(format!(
                            "pipeline `{id}`: the previous version failed to come back too: {e}"
                        ));
                        Err(ReplaceError::Failed)
                    }
                }
            }
        }
    }

    fn finish_reload(
        &self,
        mut outcome: ReloadOutcome,
        result: ReloadResult,
        plan_only: bool,
    ) -> ReloadOutcome {
        outcome.result = result.as_str().to_owned();
        outcome.at_ms = now_ms();
        if !plan_only {
            let counter = match result {
                ReloadResult::Applied => Some(&self.reloads),
                ReloadResult::Rejected => Some(&self.reload_counts.rejected),
                ReloadResult::RolledBack => Some(&self.reload_counts.rolled_back),
                ReloadResult::Failed => Some(&self.reload_counts.failed),
                _ => None,
            };
            if let Some(c) = counter {
                c.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(ms) = outcome.pause_ms {
                self.reload_counts
                    .last_pause_ms
                    .store(ms, Ordering::Relaxed);
            }
            if let Ok(mut last) = self.last_reload.lock() {
                *last = Some(outcome.clone());
            }
            if let Ok(mut history) = self.reload_history.lock() {
                if history.len() >= RELOAD_HISTORY_KEPT {
                    history.pop_front();
                }
                history.push_back(outcome.clone());
            }
        }
        outcome
    }
}

/// The result of a reload. The order ranks how bad a pipeline's result is: the overall
/// result is the worst (`failed`, then `rolled_back`, then `rejected`, then `applied`), so that
/// a pipeline reloaded later in the same file never hides an earlier pipeline's rollback or
/// failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum ReloadResult {
    /// Only compared (`plan_only`).
    Planned,
    /// Nothing changed.
    Unchanged,
    /// Every change applied.
    Applied,
    /// Nothing changed: the file or the plan was refused, or a savepoint failed.
    Rejected,
    /// A new version failed to start; the previous one runs again.
    RolledBack,
    /// The previous version did not come back either.
    Failed,
}

impl ReloadResult {
    /// The worse of `self` and `other`.
    fn worse(self, other: Self) -> Self {
        self.max(other)
    }

    /// The wire form ([`ReloadOutcome::result`]).
    fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Planned => "planned",
            ReloadResult::Unchanged => "unchanged",
            ReloadResult::Applied => "applied",
            ReloadResult::Rejected => "rejected",
            ReloadResult::RolledBack => "rolled_back",
            ReloadResult::Failed => "failed",
        }
    }
}

/// How the replacement of one pipeline by its new version did not apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReplaceError {
    /// The savepoint before it failed: the running version goes on.
    Rejected,
    /// The new version failed to start: the previous one runs again.
    RolledBack,
    /// The previous version did not come back either (or was gone).
    Failed,
}

impl From<ReplaceError> for ReloadResult {
    fn from(e: ReplaceError) -> Self {
        match e {
            ReplaceError::Rejected => ReloadResult::Rejected,
            ReplaceError::RolledBack => ReloadResult::RolledBack,
            ReplaceError::Failed => ReloadResult::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReloadResult::{Applied, Failed, Rejected, RolledBack};

    #[test]
    fn the_worst_pipeline_result_is_the_reload_result() {
        assert_eq!(Applied.worse(Rejected), Rejected);
        assert_eq!(Applied.worse(RolledBack), RolledBack);
        // A pipeline rejected after another one rolled back does not hide the rollback.
        assert_eq!(RolledBack.worse(Rejected), RolledBack);
        assert_eq!(Rejected.worse(RolledBack), RolledBack);
        assert_eq!(RolledBack.worse(Failed), Failed);
        assert_eq!(Failed.worse(Rejected), Failed);
        assert_eq!(Failed.as_str(), "failed");
        assert_eq!(RolledBack.as_str(), "rolled_back");
    }
}
