//! The contract between the task loop and every element that handles records: the one
//! [`Operator`] trait (built-in operators and sinks implement it), the per-subtask
//! [`OperatorContext`] (identity, error policy, keyed state), the [`ErrorPolicy`] of
//! `on_error`, and (for tests) the `Harness` that drives one operator without tasks or
//! channels.
//!
//! `operators` and `connectors` implement this; the runtime and the registry call it. It
//! imports none of them (nor the runtime): only the ground floor (`base`), `record` and the
//! state backend trait.

use std::sync::Arc;

use rhai::{Dynamic, Map};
use weir_schema::OnErrorSpec;

use crate::base::clock::Clock;
use crate::base::error::{Result, RunError};
use crate::base::message::{Batch, Pending};
use crate::record::{KeyGroupRange, excerpt};
use crate::state::StateBackend;

/// One operator subtask. Only [`process`](Self::process) is required.
///
/// Call order: `open` → (`restore`, `migrate_state`, `state_restored`, when starting from a
/// checkpoint) → `process`* (with `snapshot`, `notify_checkpoint_complete`, `on_watermark`
/// and `on_processing_time` between batches) → `on_watermark(WATERMARK_END)` and `on_end`
/// (bounded input finished) → `close`. `close` also runs when the task stops early; `on_end` does not.
pub trait Operator: Send {
    /// Prepares the subtask (register state, open files).
    ///
    /// # Errors
    /// Any failure to start; the task fails.
    fn open(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Transforms a batch in place: drop, change or add records. What the batch holds
    /// afterwards goes downstream. Failed records go through [`OperatorContext::record_failed`].
    ///
    /// # Errors
    /// A failure under `on_error: fail`, or an I/O failure.
    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()>;

    /// Whether the records that leave [`process`](Self::process) are the ones that entered,
    /// unchanged and in order, so that their event times ([`Batch::times`]) still hold
    /// (`key_by`). The task drops the times after every operator that says no.
    fn keeps_times(&self) -> bool {
        false
    }

    /// Whether one input record may become many output records (`flat_map`, `process`):
    /// the task then drives the operator through [`process_some`](Self::process_some), so
    /// that what it produces goes downstream in pieces rather than as one giant batch.
    fn expands(&self) -> bool {
        false
    }

    /// Processes records from the front of `input`, appending what comes out to `out`, and
    /// returns as soon as `out` holds at least `limit` records (after the record that crossed
    /// it: one record's outputs are never split across calls) or `input` is empty. Called
    /// instead of [`process`](Self::process) when [`expands`](Self::expands) says so. The
    /// default processes everything at once.
    ///
    /// # Errors
    /// As [`process`](Self::process).
    fn process_some(
        &mut self,
        input: &mut Pending,
        out: &mut Batch,
        limit: usize,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let _ = limit;
        let mut batch = input.take(usize::MAX);
        self.process(&mut batch, ctx)?;
        out.append(&mut batch);
        Ok(())
    }

    /// Takes a snapshot of operator-local state (not keyed state: the runtime snapshots
    /// `ctx.state` itself) at a barrier, e.g. a sink's pending files. `None`: nothing to keep.
    /// Runs on the task between batches; keep it quick.
    ///
    /// # Errors
    /// A failure declines the checkpoint.
    fn snapshot(
        &mut self,
        _checkpoint: u64,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    /// Restores operator-local state after `open` and before the first record, when the task
    /// starts from a checkpoint (`ctx.restored_from`); `snapshot` is what this subtask's
    /// [`snapshot`](Self::snapshot) returned then (`None` when it returned nothing).
    ///
    /// # Errors
    /// A malformed snapshot, or a failure to reconcile (the task fails).
    fn restore(&mut self, _snapshot: Option<&[u8]>, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Restores operator-local state after a change of parallelism (a savepoint restored
    /// into a rescaled pipeline). Local state is list state: old subtask `j`'s snapshot goes
    /// to new subtask `j % parallelism`, so `snapshots` holds the snapshots of the old
    /// subtasks assigned to this one, in old-subtask order (possibly none). Called instead
    /// of [`restore`](Self::restore). The default accepts no snapshot at all and refuses
    /// anything else with an error naming the operator.
    ///
    /// # Errors
    /// An operator whose local state cannot be split or merged.
    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &mut OperatorContext) -> Result<()> {
        if snapshots.is_empty() {
            return self.restore(None, ctx);
        }
        Err(RunError::StateMismatch(format!(
            "pipeline `{}`, operator `{}`: its state cannot be redistributed over a new \
             parallelism ({} snapshots for subtask {} of {}); restore with the old parallelism",
            ctx.pipeline,
            ctx.operator,
            snapshots.len(),
            ctx.subtask,
            ctx.parallelism
        )))
    }

    /// Called once after the keyed state (`ctx.state`) was restored from a savepoint
    /// (`ctx.migrate` is set), before the first record: an operator with a Rhai
    /// `migrate(old)` function rewrites every restored value through it here.
    ///
    /// # Errors
    /// A failing `migrate` (the restore fails and, on a reload, the old version comes back).
    fn migrate_state(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// The checkpoint `checkpoint` completed everywhere (second phase of two-phase commit).
    ///
    /// # Errors
    /// A failure to commit.
    fn notify_checkpoint_complete(
        &mut self,
        _checkpoint: u64,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// The event-time watermark of this operator's input advanced to `watermark` (epoch
    /// milliseconds; [`WATERMARK_END`](crate::base::message::WATERMARK_END) when every input
    /// ended, which comes before [`on_end`](Self::on_end)): fire the event-time timers and
    /// windows now due, appending what they emit to `out`. `ctx.watermark` already holds the
    /// new value. The task loop calls it between batches, only when the combined watermark
    /// (the minimum over the inputs that are not idle) grew, and forwards the watermark
    /// downstream after `out`.
    ///
    /// # Errors
    /// As `process`.
    fn on_watermark(
        &mut self,
        _watermark: i64,
        _out: &mut Vec<Dynamic>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// The earliest processing time (epoch milliseconds, on `ctx.clock`) at which the
    /// operator wants [`on_processing_time`](Self::on_processing_time): its first pending
    /// processing-time timer or window. `None`: no such wish. The task loop asks after every
    /// call into the operator and wakes the task then.
    fn next_processing_time(&self) -> Option<i64> {
        None
    }

    /// Processing time reached `now` (at or after
    /// [`next_processing_time`](Self::next_processing_time)): fire what is due, appending
    /// what it emits to `out`.
    ///
    /// # Errors
    /// As `process`.
    fn on_processing_time(
        &mut self,
        _now: i64,
        _out: &mut Vec<Dynamic>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// The keyed state (`ctx.state`) was restored (from checkpoint files, or handed over by
    /// the version that took a savepoint), after [`restore`](Self::restore) and
    /// [`migrate_state`](Self::migrate_state): rebuild in-memory indexes of it, such as the
    /// queue of pending timers.
    ///
    /// # Errors
    /// A backend failure while scanning the state.
    fn state_restored(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Every input ended: emit final results into `out`. The task loop sends `out` on and
    /// calls again while [`end_pending`](Self::end_pending) says results are left, so that an
    /// operator with many keys emits them a chunk at a time.
    ///
    /// # Errors
    /// As `process`.
    fn on_end(&mut self, _out: &mut Vec<Dynamic>, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// After [`on_end`](Self::on_end): whether it left final results to emit (it is then
    /// called again, after what it emitted went downstream).
    fn end_pending(&self) -> bool {
        false
    }

    /// Releases resources (flush files). Runs once, last.
    ///
    /// # Errors
    /// A failure to flush.
    fn close(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }
}

/// What a failed record does, from the operator's `on_error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// Fail the task.
    Fail,
    /// Drop the record and count it.
    Skip,
    /// Send `{record, error, operator}` to the dead-letter output.
    DeadLetter,
}

impl From<&OnErrorSpec> for ErrorPolicy {
    fn from(s: &OnErrorSpec) -> Self {
        match s {
            OnErrorSpec::Fail => Self::Fail,
            OnErrorSpec::Skip => Self::Skip,
            OnErrorSpec::DeadLetter(_) => Self::DeadLetter,
        }
    }
}

/// The world of one operator subtask.
pub struct OperatorContext {
    /// Pipeline id.
    pub pipeline: Arc<str>,
    /// The operator's id.
    pub operator: Arc<str>,
    /// This subtask's index.
    pub subtask: u32,
    /// The operator's parallelism.
    pub parallelism: u32,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// The key groups this subtask owns.
    pub key_groups: KeyGroupRange,
    /// The error policy.
    pub on_error: ErrorPolicy,
    /// Dead letters produced since the runtime last collected them.
    pub dead_letters: Vec<Dynamic>,
    /// Records failed (skipped or dead-lettered) so far.
    pub errors: u64,
    /// Late records (a `window`'s) for its `late` output, since the runtime last collected
    /// them.
    pub late: Vec<Dynamic>,
    /// Late records dropped (a `window` without `late` output) since the runtime last
    /// collected the count.
    pub late_dropped: u64,
    /// Keyed state, for keyed operators.
    pub state: Option<Box<dyn StateBackend>>,
    /// The checkpoint this run restored from (`None` on a fresh start).
    pub restored_from: Option<u64>,
    /// The restore is from a savepoint taken while the operator had another script: keyed
    /// values go through its `migrate` hook ([`Operator::migrate_state`]). Restoring a
    /// savepoint of the same script, or any checkpoint, never migrates.
    pub migrate: bool,
    /// The current event-time watermark of the operator's input (epoch milliseconds;
    /// [`WATERMARK_MIN`](crate::base::message::WATERMARK_MIN) before the first one), kept by
    /// the task loop.
    pub watermark: i64,
    /// Processing time.
    pub clock: Clock,
}

impl OperatorContext {
    /// A context for tests and tools: subtask 0 of 1, fail on error, no state.
    #[cfg(any(test, feature = "testkit"))]
    pub fn standalone(pipeline: &str, operator: &str, max_parallelism: u32) -> Self {
        Self {
            pipeline: pipeline.into(),
            operator: operator.into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism,
            key_groups: KeyGroupRange::all(max_parallelism),
            on_error: ErrorPolicy::Fail,
            dead_letters: Vec::new(),
            errors: 0,
            late: Vec::new(),
            late_dropped: 0,
            state: None,
            restored_from: None,
            migrate: false,
            watermark: crate::base::message::WATERMARK_MIN,
            clock: Clock::System,
        }
    }

    /// The error for `message` on `record` under `on_error: fail`.
    pub fn error(&self, record: &Dynamic, message: impl Into<String>) -> RunError {
        RunError::Operator {
            pipeline: self.pipeline.to_string(),
            operator: self.operator.to_string(),
            subtask: self.subtask,
            message: message.into(),
            record: excerpt(record),
        }
    }

    /// Whether a record that fails must be reported exactly as it arrived, because dead
    /// letters carry it. Otherwise the record as the script left it when it failed serves for
    /// the excerpt in the error, which spares scripted operators a deep clone per record.
    pub fn keeps_failed_records(&self) -> bool {
        self.on_error == ErrorPolicy::DeadLetter
    }

    /// Applies the error policy to a failed record: `Err` under `fail`; otherwise counts it
    /// (and queues the dead letter) and returns `Ok` so processing goes on.
    ///
    /// # Errors
    /// The operator error, under `on_error: fail`.
    pub fn record_failed(&mut self, record: Dynamic, message: impl Into<String>) -> Result<()> {
        let message = message.into();
        match self.on_error {
            ErrorPolicy::Fail => Err(self.error(&record, message)),
            ErrorPolicy::Skip => {
                self.errors += 1;
                Ok(())
            }
            ErrorPolicy::DeadLetter => {
                self.errors += 1;
                let mut m = Map::new();
                m.insert("record".into(), record);
                // One line: a script error's position and help lines joined by `; `.
                let error = crate::base::human::flatten(&message);
                m.insert("error".into(), Dynamic::from(error));
                m.insert("operator".into(), Dynamic::from(self.operator.to_string()));
                m.insert("pipeline".into(), Dynamic::from(self.pipeline.to_string()));
                m.insert("subtask".into(), Dynamic::from(i64::from(self.subtask)));
                self.dead_letters.push(Dynamic::from_map(m));
                Ok(())
            }
        }
    }

    /// The keyed state backend.
    ///
    /// # Errors
    /// When the operator is not keyed (a wiring bug).
    pub fn state_mut(&mut self) -> Result<&mut Box<dyn StateBackend>> {
        let op = &self.operator;
        self.state
            .as_mut()
            .ok_or_else(|| RunError::Internal(format!("operator `{op}` has no keyed state")))
    }
}

/// Drives one operator through batches without tasks or channels: the test harness (in the
/// engine's tests and with the `testkit` feature only).
#[cfg(any(test, feature = "testkit"))]
pub struct Harness {
    /// The operator.
    pub operator: Box<dyn Operator>,
    /// Its context.
    pub ctx: OperatorContext,
}

#[cfg(any(test, feature = "testkit"))]
impl Harness {
    /// Opens the operator.
    ///
    /// # Errors
    /// As [`Operator::open`].
    pub fn new(mut operator: Box<dyn Operator>, mut ctx: OperatorContext) -> Result<Self> {
        operator.open(&mut ctx)?;
        Ok(Self { operator, ctx })
    }

    /// Runs one batch and returns what came out.
    ///
    /// # Errors
    /// As [`Operator::process`].
    pub fn push(&mut self, batch: Batch) -> Result<Batch> {
        let mut batch = batch;
        self.operator.process(&mut batch, &mut self.ctx)?;
        Ok(batch)
    }

    /// Ends the input and returns the final records.
    ///
    /// # Errors
    /// As [`Operator::on_end`] and [`Operator::close`].
    pub fn finish(&mut self) -> Result<Vec<Dynamic>> {
        let mut out = Vec::new();
        self.operator.on_end(&mut out, &mut self.ctx)?;
        while self.operator.end_pending() {
            self.operator.on_end(&mut out, &mut self.ctx)?;
        }
        self.operator.close(&mut self.ctx)?;
        Ok(out)
    }
}
