//! Barrier alignment for one task with several input channels (ARCHITECTURE.md 5.3).
//!
//! The task loop feeds every barrier and end-of-stream it reads into a [`BarrierAligner`] and
//! does what the returned [`AlignerStep`] says: park an input (stop reading it), or snapshot
//! the chain, forward the barrier and release every parked input. Operators never see
//! barriers. This module owns only the counting; it never touches channels or state.
//!
//! Rules:
//! - `exactly_once`: an input that delivered barrier *n* is parked until every live input
//!   delivered *n*; at most one alignment is in progress.
//! - `at_least_once`: no input is ever parked; the snapshot is taken when the last barrier *n*
//!   arrives. Several alignments may overlap (a fast input may run ahead to *n+1*).
//! - Savepoint barriers are aligned as in `exactly_once` whatever the mode, so a savepoint is
//!   always a consistent cut.
//! - A finished input (end of stream) counts as aligned for every barrier.
//! - Unaligned checkpoints: [`BarrierAligner::unaligned`] ends the alignment of a checkpoint
//!   at once (its barrier was announced ahead of the queued records, or its alignment lasted
//!   longer than `aligned_timeout`); the task then records the inputs it names as channel
//!   state, and the in-band barriers of that checkpoint that come later are dropped.
//! - Subsumption: when an input delivers barrier *m* while an older alignment *n < m* still
//!   waits for that same input, *n* can never complete here (channels are FIFO, so that input
//!   skipped *n*); *n* is aborted. Completing *m* also aborts every older alignment.
//! - Savepoints are never overtaken: with unaligned checkpoints a savepoint barrier is also
//!   announced on the priority lanes (only as a notice: it is aligned in band), and a
//!   checkpoint announced after it is not taken unaligned while the savepoint is still to be
//!   taken here ([`BarrierAligner::savepoint_ahead`]); the task loop defers it until the
//!   savepoint's snapshot. Otherwise the checkpoint's barrier would reach downstream tasks
//!   ahead of the savepoint's, and they would give the savepoint up (or never see it).
//! - A barrier of an already aborted or completed checkpoint from an input that had not
//!   delivered it yet is dropped. An input delivering ids that do not increase is a protocol
//!   bug: debug builds panic, release builds return [`AlignError::StaleBarrier`].

use std::collections::BTreeMap;

use weir_schema::CheckpointMode;

use super::CheckpointId;
use crate::base::message::{Barrier, BarrierKind};

/// Whether inputs are parked during alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlignmentMode {
    /// Park inputs that delivered barrier *n* until all have (aligned, exactly-once).
    ExactlyOnce,
    /// Never park; snapshot when the last barrier *n* arrives (at-least-once).
    AtLeastOnce,
}

impl From<CheckpointMode> for AlignmentMode {
    fn from(mode: CheckpointMode) -> Self {
        match mode {
            CheckpointMode::ExactlyOnce => Self::ExactlyOnce,
            CheckpointMode::AtLeastOnce => Self::AtLeastOnce,
        }
    }
}

/// What the task loop does with the input it just read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlignerAction {
    /// Keep reading every unblocked input; nothing to snapshot yet (or a barrier of an
    /// aborted checkpoint was dropped).
    Continue,
    /// Exactly-once: stop reading this input until a later step releases it
    /// ([`BarrierAligner::is_blocked`] turns false).
    Park,
    /// Every live input delivered this barrier: snapshot every operator of the chain, forward
    /// the barrier downstream, then acknowledge it. Every parked input is released.
    Snapshot(Barrier),
}

/// The result of feeding one event to the aligner.
#[must_use = "the task loop must park, snapshot or decline as the step says"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlignerStep {
    /// What to do now.
    pub action: AlignerAction,
    /// Checkpoints whose alignment was given up (subsumed by a newer barrier), oldest first.
    /// The task declines them to the coordinator and takes no snapshot for them.
    pub aborted: Vec<CheckpointId>,
}

impl AlignerStep {
    fn new(action: AlignerAction, aborted: Vec<CheckpointId>) -> Self {
        Self { action, aborted }
    }
}

/// An unaligned snapshot the task loop takes now ([`BarrierAligner::unaligned`]).
#[must_use = "the task loop must snapshot, forward the barrier and record the channel state"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnalignedStart {
    /// The checkpoint.
    pub barrier: Barrier,
    /// Older alignments given up (declined, as in [`AlignerStep::aborted`]).
    pub aborted: Vec<CheckpointId>,
    /// `log[i]`: input `i` has not delivered the barrier yet; what it delivers until then
    /// is channel state of the checkpoint.
    pub log: Vec<bool>,
}

/// A barrier or end-of-stream that breaks the protocol; a bug in the task loop or upstream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlignError {
    /// The input index is out of range.
    #[error("barrier on input {input}, but the task has {inputs} inputs")]
    UnknownInput {
        /// The input index.
        input: u32,
        /// The number of inputs.
        inputs: u32,
    },
    /// A barrier arrived on an input that already ended.
    #[error("barrier {checkpoint} on input {input} after its end of stream")]
    AfterEndOfStream {
        /// The input index.
        input: u32,
        /// The barrier's checkpoint id.
        checkpoint: CheckpointId,
    },
    /// An input delivered a barrier id not above the last one it delivered.
    #[error("stale barrier {checkpoint} on input {input}, which already delivered {last}")]
    StaleBarrier {
        /// The input index.
        input: u32,
        /// The barrier's checkpoint id.
        checkpoint: CheckpointId,
        /// The last id this input delivered.
        last: CheckpointId,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct InputState {
    last_barrier: Option<CheckpointId>,
    finished: bool,
}

#[derive(Clone, Debug)]
struct Alignment {
    barrier: Barrier,
    /// `arrived[i]`: input `i` delivered this barrier.
    arrived: Vec<bool>,
}

/// Barrier alignment state of one task (see the module docs for the rules).
///
/// Call order: [`on_barrier`](Self::on_barrier) for each barrier read,
/// [`on_end_of_stream`](Self::on_end_of_stream) once per input that ends; between events, read
/// only inputs for which [`is_blocked`](Self::is_blocked) is false.
#[derive(Clone, Debug)]
pub struct BarrierAligner {
    mode: AlignmentMode,
    inputs: Vec<InputState>,
    /// Alignments in progress, by checkpoint id (at most one in exactly-once).
    pending: BTreeMap<CheckpointId, Alignment>,
    /// Every id up to this one is completed or aborted here.
    done_up_to: Option<CheckpointId>,
    /// The newest savepoint announced on a priority lane or delivered in band.
    savepoint: Option<CheckpointId>,
}

impl BarrierAligner {
    /// An aligner for a task with `inputs` input channels.
    pub fn new(inputs: u32, mode: AlignmentMode) -> Self {
        Self {
            mode,
            inputs: vec![InputState::default(); inputs as usize],
            pending: BTreeMap::new(),
            done_up_to: None,
            savepoint: None,
        }
    }

    /// Notes a barrier announced on a priority lane ahead of the records queued in its
    /// channel. Only a savepoint's matters here: its in-band barrier is still to come, and no
    /// newer checkpoint may overtake it ([`Self::savepoint_ahead`]).
    pub fn announced(&mut self, barrier: Barrier) {
        if barrier.kind != BarrierKind::Checkpoint {
            self.savepoint = self.savepoint.max(Some(barrier.checkpoint));
        }
    }

    /// Whether a savepoint older than checkpoint `id` was announced or delivered but is not
    /// taken (or aborted) here yet: `id` must not be taken unaligned before it, or its barrier
    /// would overtake the savepoint's downstream.
    pub fn savepoint_ahead(&self, id: CheckpointId) -> bool {
        self.savepoint
            .is_some_and(|s| s < id && !self.is_done(s))
    }

    /// The alignment mode.
    #[cfg(any(test, feature = "testkit"))]
    pub fn mode(&self) -> AlignmentMode {
        self.mode
    }

    /// The number of input channels.
    pub fn inputs(&self) -> u32 {
        self.inputs.len() as u32
    }

    /// Whether the task loop must not read `input` now: the input delivered the barrier
    /// being aligned, in exactly-once mode or for a savepoint (savepoints are always aligned,
    /// so that they are consistent whatever the pipeline's mode). Out-of-range inputs are
    /// never blocked.
    pub fn is_blocked(&self, input: u32) -> bool {
        self.pending.values().any(|a| {
            (self.mode == AlignmentMode::ExactlyOnce || a.barrier.kind != BarrierKind::Checkpoint)
                && a.arrived.get(input as usize).copied().unwrap_or(false)
        })
    }

    /// The checkpoint being aligned, oldest first when several are (at-least-once).
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.pending.keys().next().copied()
    }

    /// Whether every input has ended.
    #[cfg(any(test, feature = "testkit"))]
    pub fn all_finished(&self) -> bool {
        self.inputs.iter().all(|i| i.finished)
    }

    /// Feeds a barrier read from `input`.
    ///
    /// # Errors
    ///
    /// [`AlignError::UnknownInput`] for an out-of-range input, [`AlignError::AfterEndOfStream`]
    /// for a barrier on an ended input, [`AlignError::StaleBarrier`] when the input's barrier
    /// ids do not increase (debug builds panic on that one instead).
    pub fn on_barrier(&mut self, input: u32, barrier: Barrier) -> Result<AlignerStep, AlignError> {
        let inputs = self.inputs();
        let id = barrier.checkpoint;
        let state = self
            .inputs
            .get_mut(input as usize)
            .ok_or(AlignError::UnknownInput { input, inputs })?;
        if state.finished {
            return Err(AlignError::AfterEndOfStream {
                input,
                checkpoint: id,
            });
        }
        if let Some(last) = state.last_barrier
            && id <= last
        {
            debug_assert!(
                false,
                "stale barrier {id} on input {input}, which already delivered {last}"
            );
            return Err(AlignError::StaleBarrier {
                input,
                checkpoint: id,
                last,
            });
        }
        state.last_barrier = Some(id);
        self.announced(barrier);

        // Older alignments still waiting for this input can never complete: abort them.
        let skipped: Vec<CheckpointId> = self
            .pending
            .range(..id)
            .filter(|(_, a)| !a.arrived[input as usize])
            .map(|(&n, _)| n)
            .collect();
        let mut aborted = Vec::with_capacity(skipped.len());
        for n in skipped {
            self.pending.remove(&n);
            self.mark_done(n);
            aborted.push(n);
        }

        if self.done_up_to.is_some_and(|done| id <= done) {
            // A barrier of a checkpoint already completed or aborted here, from an input that
            // had not delivered it: drop it.
            return Ok(AlignerStep::new(AlignerAction::Continue, aborted));
        }

        let width = self.inputs.len();
        let alignment = self.pending.entry(id).or_insert_with(|| Alignment {
            barrier,
            arrived: vec![false; width],
        });
        alignment.arrived[input as usize] = true;

        if let Some(done) = self.try_complete(id) {
            aborted.extend(done.1);
            return Ok(AlignerStep::new(AlignerAction::Snapshot(done.0), aborted));
        }
        let action = match (self.mode, barrier.kind) {
            (AlignmentMode::ExactlyOnce, _)
            | (_, BarrierKind::Savepoint)
            | (_, BarrierKind::SavepointThenStop) => AlignerAction::Park,
            (AlignmentMode::AtLeastOnce, BarrierKind::Checkpoint) => AlignerAction::Continue,
        };
        Ok(AlignerStep::new(action, aborted))
    }

    /// Whether checkpoint `id` is completed or aborted here (a barrier of it is dropped).
    pub fn is_done(&self, id: CheckpointId) -> bool {
        self.done_up_to.is_some_and(|done| id <= done)
    }

    /// Unaligned checkpoints: takes checkpoint `barrier` now, without waiting for the
    /// inputs that have not delivered it (ARCHITECTURE.md 6, "Unaligned checkpoints"). Older
    /// alignments are aborted, the alignment of `barrier` (if one started) ends and its parked
    /// inputs are released, and later in-band barriers of it are dropped. Returns `None` when
    /// the checkpoint is already completed or aborted here. Call it only when no savepoint is
    /// [ahead](Self::savepoint_ahead) of the checkpoint.
    pub fn unaligned(&mut self, barrier: Barrier) -> Option<UnalignedStart> {
        let id = barrier.checkpoint;
        if self.is_done(id) {
            return None;
        }
        debug_assert!(
            !self.savepoint_ahead(id),
            "checkpoint {id} taken unaligned ahead of a savepoint"
        );
        let older: Vec<CheckpointId> = self.pending.range(..id).map(|(&n, _)| n).collect();
        for n in &older {
            self.pending.remove(n);
        }
        let arrived = self
            .pending
            .remove(&id)
            .map_or_else(|| vec![false; self.inputs.len()], |a| a.arrived);
        self.mark_done(id);
        let log = self
            .inputs
            .iter()
            .zip(arrived)
            .map(|(input, arrived)| !arrived && !input.finished)
            .collect();
        Some(UnalignedStart {
            barrier,
            aborted: older,
            log,
        })
    }

    /// Records that `input` ended. A finished input counts as aligned, so this may complete
    /// the alignment in progress.
    ///
    /// # Errors
    ///
    /// [`AlignError::UnknownInput`] for an out-of-range input.
    pub fn on_end_of_stream(&mut self, input: u32) -> Result<AlignerStep, AlignError> {
        let inputs = self.inputs();
        let state = self
            .inputs
            .get_mut(input as usize)
            .ok_or(AlignError::UnknownInput { input, inputs })?;
        state.finished = true;
        // Complete the newest alignment that is now full; it subsumes the older ones.
        let ready = self
            .pending
            .iter()
            .rev()
            .find(|(_, a)| self.is_full(a))
            .map(|(&n, _)| n);
        match ready.and_then(|n| self.try_complete(n)) {
            Some((barrier, aborted)) => {
                Ok(AlignerStep::new(AlignerAction::Snapshot(barrier), aborted))
            }
            None => Ok(AlignerStep::new(AlignerAction::Continue, Vec::new())),
        }
    }

    fn is_full(&self, alignment: &Alignment) -> bool {
        self.inputs
            .iter()
            .zip(&alignment.arrived)
            .all(|(input, &arrived)| arrived || input.finished)
    }

    /// Completes alignment `id` when every live input delivered it: returns its barrier and
    /// the older alignments it subsumes.
    fn try_complete(&mut self, id: CheckpointId) -> Option<(Barrier, Vec<CheckpointId>)> {
        let full = self.pending.get(&id).is_some_and(|a| self.is_full(a));
        if !full {
            return None;
        }
        let alignment = self.pending.remove(&id)?;
        let older: Vec<CheckpointId> = self.pending.range(..id).map(|(&n, _)| n).collect();
        for n in &older {
            self.pending.remove(n);
        }
        self.mark_done(id);
        Some((alignment.barrier, older))
    }

    fn mark_done(&mut self, id: CheckpointId) {
        self.done_up_to = Some(self.done_up_to.map_or(id, |d| d.max(id)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn barrier(n: CheckpointId) -> Barrier {
        Barrier {
            checkpoint: n,
            kind: BarrierKind::Checkpoint,
        }
    }

    fn step(a: &mut BarrierAligner, input: u32, n: CheckpointId) -> AlignerStep {
        a.on_barrier(input, barrier(n)).expect("valid barrier")
    }

    #[test]
    fn the_aligner_parks_inputs_only_in_exactly_once() {
        let mut exact = BarrierAligner::new(3, AlignmentMode::ExactlyOnce);
        assert_eq!(step(&mut exact, 0, 1).action, AlignerAction::Park);
        assert!(exact.is_blocked(0));
        assert!(!exact.is_blocked(1));
        assert_eq!(step(&mut exact, 2, 1).action, AlignerAction::Park);
        assert!(exact.is_blocked(0) && exact.is_blocked(2) && !exact.is_blocked(1));
        assert_eq!(
            step(&mut exact, 1, 1).action,
            AlignerAction::Snapshot(barrier(1))
        );
        assert!(
            (0..3).all(|i| !exact.is_blocked(i)),
            "snapshot releases all"
        );

        let mut loose = BarrierAligner::new(3, AlignmentMode::AtLeastOnce);
        assert_eq!(step(&mut loose, 0, 1).action, AlignerAction::Continue);
        assert!(!loose.is_blocked(0));
        assert_eq!(step(&mut loose, 2, 1).action, AlignerAction::Continue);
        assert!((0..3).all(|i| !loose.is_blocked(i)));
        assert_eq!(
            step(&mut loose, 1, 1).action,
            AlignerAction::Snapshot(barrier(1)),
            "the snapshot is taken when the last barrier arrives"
        );
    }

    #[test]
    fn an_unaligned_snapshot_releases_parked_inputs_and_logs_the_others() {
        let mut a = BarrierAligner::new(3, AlignmentMode::ExactlyOnce);
        assert_eq!(step(&mut a, 0, 1).action, AlignerAction::Park);
        let _ = a.on_end_of_stream(2).expect("valid");
        let start = a.unaligned(barrier(1)).expect("not done yet");
        assert_eq!(start.log, vec![false, true, false]);
        assert!(start.aborted.is_empty());
        assert!((0..3).all(|i| !a.is_blocked(i)), "nothing parked any more");
        assert!(a.is_done(1));
        assert!(a.unaligned(barrier(1)).is_none(), "taken once");
        // The in-band barrier that comes later is dropped.
        assert_eq!(step(&mut a, 1, 1).action, AlignerAction::Continue);
        // An announced barrier no input delivered yet logs every live input, and aborts an
        // older alignment.
        assert_eq!(step(&mut a, 0, 2).action, AlignerAction::Park);
        let start = a.unaligned(barrier(3)).expect("new");
        assert_eq!(start.aborted, vec![2]);
        assert_eq!(start.log, vec![true, true, false]);
    }

    #[test]
    fn a_single_input_snapshots_at_once() {
        for mode in [AlignmentMode::ExactlyOnce, AlignmentMode::AtLeastOnce] {
            let mut a = BarrierAligner::new(1, mode);
            let s = step(&mut a, 0, 7);
            assert_eq!(s.action, AlignerAction::Snapshot(barrier(7)));
            assert!(s.aborted.is_empty());
            assert!(!a.is_blocked(0));
        }
    }

    #[test]
    fn savepoints_are_aligned_even_at_least_once() {
        let mut a = BarrierAligner::new(2, AlignmentMode::AtLeastOnce);
        let sp = Barrier {
            checkpoint: 3,
            kind: BarrierKind::Savepoint,
        };
        assert_eq!(
            a.on_barrier(0, sp).map(|s| s.action),
            Ok(AlignerAction::Park)
        );
        assert!(a.is_blocked(0));
        assert!(!a.is_blocked(1));
        assert_eq!(
            a.on_barrier(1, sp).map(|s| s.action),
            Ok(AlignerAction::Snapshot(sp))
        );
        assert!(!a.is_blocked(0));
        // A periodic checkpoint in the same aligner is still not aligned.
        assert_eq!(
            a.on_barrier(0, barrier(4)).map(|s| s.action),
            Ok(AlignerAction::Continue)
        );
        assert!(!a.is_blocked(0));
    }

    #[test]
    fn the_barrier_kind_is_carried_to_the_snapshot() {
        let mut a = BarrierAligner::new(2, AlignmentMode::ExactlyOnce);
        let sp = Barrier {
            checkpoint: 4,
            kind: BarrierKind::SavepointThenStop,
        };
        assert_eq!(
            a.on_barrier(0, sp).map(|s| s.action),
            Ok(AlignerAction::Park)
        );
        assert_eq!(
            a.on_barrier(1, sp).map(|s| s.action),
            Ok(AlignerAction::Snapshot(sp))
        );
    }

    #[test]
    fn a_finished_input_counts_as_aligned() {
        let mut a = BarrierAligner::new(2, AlignmentMode::ExactlyOnce);
        assert_eq!(step(&mut a, 0, 1).action, AlignerAction::Park);
        // Input 1 ends without delivering barrier 1: alignment completes.
        let s = a.on_end_of_stream(1).expect("valid input");
        assert_eq!(s.action, AlignerAction::Snapshot(barrier(1)));
        assert!(!a.is_blocked(0));
        // Later barriers need only the live input.
        assert_eq!(
            step(&mut a, 0, 2).action,
            AlignerAction::Snapshot(barrier(2))
        );
        assert!(!a.all_finished());
        assert_eq!(
            a.on_end_of_stream(0).map(|s| s.action),
            Ok(AlignerAction::Continue)
        );
        assert!(a.all_finished());
    }

    #[test]
    fn a_barrier_after_end_of_stream_is_an_error() {
        let mut a = BarrierAligner::new(2, AlignmentMode::ExactlyOnce);
        assert!(a.on_end_of_stream(0).is_ok());
        assert_eq!(
            a.on_barrier(0, barrier(1)),
            Err(AlignError::AfterEndOfStream {
                input: 0,
                checkpoint: 1
            })
        );
        assert_eq!(
            a.on_barrier(5, barrier(1)),
            Err(AlignError::UnknownInput {
                input: 5,
                inputs: 2
            })
        );
    }

    #[test]
    fn a_newer_barrier_subsumes_the_alignment_in_progress() {
        let mut a = BarrierAligner::new(3, AlignmentMode::ExactlyOnce);
        assert_eq!(step(&mut a, 0, 1).action, AlignerAction::Park);
        // Input 1 skipped checkpoint 1 (its upstream aborted it) and delivers 2.
        let s = step(&mut a, 1, 2);
        assert_eq!(s.aborted, vec![1]);
        assert_eq!(s.action, AlignerAction::Park);
        assert!(
            !a.is_blocked(0),
            "the parked input of the aborted alignment is released"
        );
        assert!(a.is_blocked(1));
        assert_eq!(a.aligning(), Some(2));
        // Input 2 still delivers the stale barrier 1 before 2: dropped.
        let s = step(&mut a, 2, 1);
        assert_eq!(s.action, AlignerAction::Continue);
        assert!(s.aborted.is_empty());
        assert!(!a.is_blocked(2));
        assert_eq!(step(&mut a, 2, 2).action, AlignerAction::Park);
        let s = step(&mut a, 0, 2);
        assert_eq!(s.action, AlignerAction::Snapshot(barrier(2)));
        assert!((0..3).all(|i| !a.is_blocked(i)));
    }

    #[test]
    fn at_least_once_overlaps_alignments_and_completion_subsumes_older_ones() {
        let mut a = BarrierAligner::new(2, AlignmentMode::AtLeastOnce);
        // Input 0 runs ahead through barriers 1 and 2.
        assert_eq!(step(&mut a, 0, 1).action, AlignerAction::Continue);
        assert_eq!(step(&mut a, 0, 2).action, AlignerAction::Continue);
        assert_eq!(a.aligning(), Some(1));
        // Input 1 catches up: 1 completes, then 2.
        assert_eq!(
            step(&mut a, 1, 1).action,
            AlignerAction::Snapshot(barrier(1))
        );
        assert_eq!(
            step(&mut a, 1, 2).action,
            AlignerAction::Snapshot(barrier(2))
        );

        // Input 1 skips 3 and delivers 4: 3 is aborted there and then.
        assert_eq!(step(&mut a, 0, 3).action, AlignerAction::Continue);
        assert_eq!(step(&mut a, 0, 4).action, AlignerAction::Continue);
        let s = step(&mut a, 1, 4);
        assert_eq!(s.aborted, vec![3]);
        assert_eq!(s.action, AlignerAction::Snapshot(barrier(4)));
        assert_eq!(a.aligning(), None);
    }

    #[test]
    fn end_of_stream_completes_the_newest_full_alignment() {
        let mut a = BarrierAligner::new(3, AlignmentMode::AtLeastOnce);
        assert_eq!(step(&mut a, 0, 1).action, AlignerAction::Continue);
        assert_eq!(step(&mut a, 0, 2).action, AlignerAction::Continue);
        assert_eq!(step(&mut a, 1, 1).action, AlignerAction::Continue);
        assert_eq!(step(&mut a, 1, 2).action, AlignerAction::Continue);
        let s = a.on_end_of_stream(2).expect("valid input");
        assert_eq!(s.action, AlignerAction::Snapshot(barrier(2)));
        assert_eq!(s.aborted, vec![1]);
    }

    #[test]
    fn a_savepoint_announced_or_aligning_holds_newer_unaligned_checkpoints_back() {
        let savepoint = |n| Barrier {
            checkpoint: n,
            kind: BarrierKind::Savepoint,
        };
        let mut a = BarrierAligner::new(2, AlignmentMode::ExactlyOnce);
        // Savepoint 1 is announced on a lane, then checkpoint 2: 2 must wait for 1.
        a.announced(savepoint(1));
        a.announced(barrier(2));
        assert!(a.savepoint_ahead(2));
        assert!(!a.savepoint_ahead(1), "only newer checkpoints wait");
        // 1 arrives in band on both inputs and is taken aligned; then 2 may go unaligned.
        assert_eq!(
            a.on_barrier(0, savepoint(1)).expect("valid").action,
            AlignerAction::Park
        );
        assert!(a.savepoint_ahead(2), "still aligning");
        assert_eq!(
            a.on_barrier(1, savepoint(1)).expect("valid").action,
            AlignerAction::Snapshot(savepoint(1))
        );
        assert!(!a.savepoint_ahead(2));
        let start = a.unaligned(barrier(2)).expect("not done yet");
        assert!(start.aborted.is_empty());
        assert_eq!(start.log, vec![true, true]);

        // A savepoint seen only in band (no lanes) holds newer checkpoints back as well,
        // until its alignment is given up.
        let mut a = BarrierAligner::new(2, AlignmentMode::ExactlyOnce);
        assert_eq!(
            a.on_barrier(0, savepoint(3)).expect("valid").action,
            AlignerAction::Park
        );
        assert!(a.savepoint_ahead(4));
        // Input 1 skipped 3 (its upstream gave it up) and delivers 4: 3 is aborted here.
        let s = step(&mut a, 1, 4);
        assert_eq!(s.aborted, vec![3]);
        assert!(!a.savepoint_ahead(4));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "stale barrier")]
    fn a_stale_barrier_panics_in_debug_builds() {
        let mut a = BarrierAligner::new(2, AlignmentMode::ExactlyOnce);
        let _ = step(&mut a, 0, 3);
        let _ = a.on_barrier(0, barrier(3));
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn a_stale_barrier_is_an_error_in_release_builds() {
        let mut a = BarrierAligner::new(2, AlignmentMode::ExactlyOnce);
        let _ = step(&mut a, 0, 3);
        assert_eq!(
            a.on_barrier(0, barrier(2)),
            Err(AlignError::StaleBarrier {
                input: 0,
                checkpoint: 2,
                last: 3
            })
        );
    }
}
