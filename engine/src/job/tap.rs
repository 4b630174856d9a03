//! `weir tap` on the running job: opening a tap on a pipeline's operator (checking that the
//! pipeline runs and has that operator and side), and the stream of [`TapEvent`]s a tap
//! produces: the records its [`TapReceiver`] samples, the count of records dropped, and its
//! end, with the reason.
//!
//! The sampling itself is `runtime::tap`'s; the registry a tap lives in is the job's, one per
//! pipeline id, so every generation of the pipeline (restarts, hot reloads, a rollback) feeds
//! the same taps. A tap watches the job's slots and ends when its limit is reached, when the
//! pipeline ends for good (not when a reload replaces it) or when a new version no longer has
//! its operator (or no longer has the side tapped).

use std::sync::Arc;

use tokio::sync::watch;

use super::manager::Job;
use crate::control::{
    BoxFuture, ControlError, TapEvent, TapRequest, TapSide, TapSource, TapStream,
};
use crate::plan::{PipelinePlan, Role};
use crate::runtime::tap::{self, TapReceiver, TapRegistry};

/// Records a tap holds for its reader before it drops: enough to ride out a slow terminal,
/// little enough that copying them costs the pipeline nothing measurable.
pub const TAP_CAPACITY: usize = 1024;

impl Job {
    /// The taps of `pipeline`, shared by all its generations.
    pub(super) fn tap_registry(&self, pipeline: &str) -> Arc<TapRegistry> {
        let mut taps = self
            .taps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(taps.entry(pipeline.to_owned()).or_default())
    }

    /// Opens a tap as [`crate::control::JobControl::tap`] describes.
    pub(super) fn open_tap(
        self: &Arc<Self>,
        pipeline: &str,
        request: TapRequest,
    ) -> Result<TapStream, ControlError> {
        if !(request.sample > 0.0 && request.sample <= 1.0) {
            return Err(ControlError::Invalid(format!(
                "sample rate {} is outside (0, 1]: 1 shows every record, 0.01 one in a hundred",
                request.sample
            )));
        }
        if request.limit == Some(0) {
            return Err(ControlError::Invalid(
                "a limit of 0 records would show nothing; give at least 1".into(),
            ));
        }
        {
            let slots = self.slots();
            let slot = slots
                .iter()
                .find(|s| s.plan.id == pipeline && !s.removed)
                .ok_or_else(|| ControlError::NoSuchPipeline(pipeline.to_owned()))?;
            if slot.ended.is_some() && !slot.reloading {
                return Err(ControlError::Invalid(format!(
                    "pipeline `{pipeline}` is not running any more"
                )));
            }
            check_operator(&slot.plan, &request.operator, request.side)?;
        }
        let side = match request.side {
            TapSide::Input => tap::TapSide::Input,
            TapSide::Output => tap::TapSide::Output,
        };
        // Subscribed before the receiver opens, so no change in between goes unseen.
        let changes = self.changes.subscribe();
        let receiver =
            self.tap_registry(pipeline)
                .open(&request.operator, side, request.sample, TAP_CAPACITY);
        tracing::info!(pipeline, operator = %request.operator, side = request.side.as_str(), sample = request.sample, "Tap opened.");
        Ok(TapStream::new(Box::new(JobTap {
            job: Arc::clone(self),
            pipeline: pipeline.to_owned(),
            request,
            receiver,
            changes,
            started: false,
            shown: 0,
            reported_dropped: 0,
            closing: None,
            done: false,
        })))
    }

    /// Why a tap on `operator`'s `side` in `pipeline` cannot go on, if it cannot: `(reason,
    /// whether that is a normal end)`.
    fn tap_gone(&self, pipeline: &str, operator: &str, side: TapSide) -> Option<(String, bool)> {
        let slots = self.slots();
        let Some(slot) = slots.iter().find(|s| s.plan.id == pipeline && !s.removed) else {
            return Some((
                format!("pipeline `{pipeline}` was removed from the file"),
                false,
            ));
        };
        match &slot.ended {
            Some(_) if slot.reloading => {}
            Some(end) if end.error.is_some() => {
                return Some((format!("pipeline `{pipeline}` failed"), false));
            }
            Some(_) if slot.stopped => {
                return Some((format!("pipeline `{pipeline}` was stopped"), true));
            }
            Some(_) => return Some((format!("pipeline `{pipeline}` finished"), true)),
            None => {}
        }
        check_operator(&slot.plan, operator, side)
            .err()
            .map(|e| (format!("a reload changed the pipeline: {e}"), false))
    }
}

/// `Ok` when `plan` has `operator` and it has `side` (a source has no input, a sink no
/// output).
fn check_operator(plan: &PipelinePlan, operator: &str, side: TapSide) -> Result<(), ControlError> {
    let Some(node) = plan.nodes.iter().find(|n| n.id == operator) else {
        let ids: Vec<&str> = plan.nodes.iter().map(|n| n.id.as_str()).collect();
        let close = ids
            .iter()
            .filter(|id| looks_like(id, operator))
            .map(|id| format!(" (did you mean `{id}`?)"))
            .next()
            .unwrap_or_default();
        return Err(ControlError::Invalid(format!(
            "pipeline `{}` has no operator `{operator}`{close}; its sources, operators and \
             sinks are: {}",
            plan.id,
            ids.join(", ")
        )));
    };
    match (node.kind.role(), side) {
        (Role::Source, TapSide::Input) => Err(ControlError::Invalid(format!(
            "`{operator}` in pipeline `{}` is a source: it has no input; tap its output \
             (without --input)",
            plan.id
        ))),
        (Role::Sink, TapSide::Output) => Err(ControlError::Invalid(format!(
            "`{operator}` in pipeline `{}` is a sink: it emits nothing; tap what it writes \
             with --input",
            plan.id
        ))),
        _ => Ok(()),
    }
}

/// Whether the id `a` looks like what `b` misspelt (a few edits, or a prefix).
fn looks_like(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
    !b.is_empty() && (a.starts_with(&b) || edit_distance(&a, &b) <= (b.chars().count() / 3).max(1))
}

/// Edits (insert, delete, substitute, swap two neighbours) from `a` to `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// One open tap of the job.
struct JobTap {
    job: Arc<Job>,
    pipeline: String,
    request: TapRequest,
    receiver: TapReceiver,
    /// Bumped whenever a slot of the job changes (a generation ended, a reload, a removal).
    changes: watch::Receiver<u64>,
    started: bool,
    shown: u64,
    reported_dropped: u64,
    /// The tap is ending for this reason: the records already sampled go out first.
    closing: Option<(String, bool)>,
    done: bool,
}

impl JobTap {
    fn record(&mut self, r: tap::TapRecord) -> TapEvent {
        self.shown += 1;
        let value = serde_json::to_value(&r.record)
            .unwrap_or_else(|e| serde_json::Value::String(format!("(not JSON: {e})")));
        TapEvent::Record {
            subtask: r.subtask,
            value,
        }
    }

    fn end(&mut self, reason: String, ok: bool) -> TapEvent {
        self.done = true;
        let dropped = self.receiver.dropped();
        tracing::info!(pipeline = %self.pipeline, operator = %self.request.operator, records = self.shown, dropped, reason = %reason, "Tap ended.");
        TapEvent::End {
            reason,
            records: self.shown,
            dropped,
            ok,
        }
    }

    async fn next_event(&mut self) -> Option<TapEvent> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            return Some(TapEvent::Started {
                pipeline: self.pipeline.clone(),
                operator: self.request.operator.clone(),
                side: self.request.side,
                sample: self.request.sample,
            });
        }
        loop {
            let dropped = self.receiver.dropped();
            if dropped > self.reported_dropped {
                self.reported_dropped = dropped;
                return Some(TapEvent::Dropped { total: dropped });
            }
            if let Some(limit) = self.request.limit
                && self.shown >= limit
            {
                return Some(self.end(format!("limit of {limit} records reached"), true));
            }
            if let Some((reason, ok)) = self.closing.clone() {
                return Some(match self.receiver.try_recv() {
                    Some(r) => self.record(r),
                    None => self.end(reason, ok),
                });
            }
            tokio::select! {
                biased;
                r = self.receiver.recv() => {
                    return Some(match r {
                        Some(r) => self.record(r),
                        None => self.end("the tap was closed".into(), false),
                    });
                }
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        self.closing = Some(("the job ended".into(), true));
                    } else {
                        self.closing = self.job.tap_gone(
                            &self.pipeline,
                            &self.request.operator,
                            self.request.side,
                        );
                    }
                }
            }
        }
    }
}

impl TapSource for JobTap {
    fn next(&mut self) -> BoxFuture<'_, Option<TapEvent>> {
        Box::pin(self.next_event())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_names_are_suggested() {
        assert!(looks_like("enrich", "enrch"));
        assert!(looks_like("enrich", "enr"));
        assert!(!looks_like("enrich", "sink"));
        assert!(looks_like("tag", "tga"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
