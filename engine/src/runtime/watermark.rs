//! Combining the watermarks of a task's input channels into the task's own (ARCHITECTURE.md,
//! event time): the minimum over the inputs that are neither idle nor ended, never going
//! back. An input that says [`Watermark::Idle`] leaves the minimum until its next
//! [`Watermark::At`]; an input that ended leaves it for good. When every input that has not
//! ended is idle, the task is idle too and says so downstream.
//!
//! Pure bookkeeping, unit-tested without tokio: the task loop feeds it the watermarks and
//! ends it reads, in channel order, and does what the returned [`Advance`] says. Barriers
//! need no rule here: a watermark travels in order with the records and barriers of its
//! channel, and an input parked by exactly-once alignment is not read, so the watermarks a
//! task has combined when it snapshots are exactly those sent before the barrier.

use crate::base::message::{WATERMARK_MIN, Watermark};

/// Where one input stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InputMark {
    /// Its last watermark.
    At(i64),
    /// Idle since its last watermark.
    Idle,
    /// Ended.
    Ended,
}

/// What the task does after an input's watermark or end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advance {
    /// Nothing changed downstream.
    None,
    /// The task's watermark grew to this: every node gets `on_watermark`, and the
    /// watermark goes downstream.
    To(i64),
    /// Every input that has not ended is idle: say so downstream.
    Idle,
    /// The task was idle and an input is back: say the (unchanged) watermark downstream
    /// again, so that the task is counted there again.
    Active(i64),
}

/// The combined watermark of one task's inputs.
#[derive(Clone, Debug)]
pub struct WatermarkCombiner {
    inputs: Vec<InputMark>,
    current: i64,
    idle: bool,
}

impl WatermarkCombiner {
    /// A combiner over `inputs` channels, none heard from (each at [`WATERMARK_MIN`]).
    pub fn new(inputs: usize) -> Self {
        Self {
            inputs: vec![InputMark::At(WATERMARK_MIN); inputs],
            current: WATERMARK_MIN,
            idle: false,
        }
    }

    /// The same, for a task restored at watermark `watermark`: its inputs' watermarks up to it
    /// change nothing.
    #[must_use]
    pub fn starting_at(mut self, watermark: i64) -> Self {
        self.current = self.current.max(watermark);
        self
    }

    /// The combined watermark ([`WATERMARK_MIN`] before any progress).
    #[cfg(any(test, feature = "testkit"))]
    pub fn current(&self) -> i64 {
        self.current
    }

    /// Input `input` sent `watermark`.
    pub fn on_watermark(&mut self, input: usize, watermark: Watermark) -> Advance {
        let Some(mark) = self.inputs.get_mut(input) else {
            return Advance::None;
        };
        if *mark == InputMark::Ended {
            return Advance::None;
        }
        *mark = match (watermark, *mark) {
            // An input's watermark never goes back either.
            (Watermark::At(w), InputMark::At(was)) => InputMark::At(w.max(was)),
            (Watermark::At(w), _) => InputMark::At(w),
            (Watermark::Idle, _) => InputMark::Idle,
        };
        self.recompute()
    }

    /// Input `input` ended: it no longer holds the watermark back. (When every input ended,
    /// the task's end calls `on_watermark(WATERMARK_END)`; this returns [`Advance::None`].)
    pub fn on_end(&mut self, input: usize) -> Advance {
        if let Some(mark) = self.inputs.get_mut(input) {
            *mark = InputMark::Ended;
        }
        self.recompute()
    }

    fn recompute(&mut self) -> Advance {
        let mut min: Option<i64> = None;
        let mut any_idle = false;
        for m in &self.inputs {
            match *m {
                InputMark::At(w) => min = Some(min.map_or(w, |x| x.min(w))),
                InputMark::Idle => any_idle = true,
                InputMark::Ended => {}
            }
        }
        match min {
            Some(w) => {
                let was_idle = std::mem::replace(&mut self.idle, false);
                if w > self.current {
                    self.current = w;
                    Advance::To(w)
                } else if was_idle {
                    Advance::Active(self.current)
                } else {
                    Advance::None
                }
            }
            None if any_idle && !self.idle => {
                self.idle = true;
                Advance::Idle
            }
            None => Advance::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::message::Watermark::{At, Idle};

    #[test]
    fn the_minimum_over_inputs_never_goes_back() {
        let mut c = WatermarkCombiner::new(3);
        assert_eq!(c.on_watermark(0, At(10)), Advance::None, "inputs 1 and 2 unheard");
        assert_eq!(c.on_watermark(1, At(5)), Advance::None);
        assert_eq!(c.on_watermark(2, At(7)), Advance::To(5));
        assert_eq!(c.on_watermark(1, At(20)), Advance::To(7));
        assert_eq!(c.on_watermark(1, At(3)), Advance::None, "an input does not go back");
        assert_eq!(c.on_watermark(2, At(30)), Advance::To(10));
        assert_eq!(c.current(), 10);
    }

    #[test]
    fn idle_inputs_leave_the_minimum_and_come_back_when_they_advance() {
        let mut c = WatermarkCombiner::new(2);
        assert_eq!(c.on_watermark(0, At(100)), Advance::None);
        assert_eq!(c.on_watermark(1, At(50)), Advance::To(50));
        assert_eq!(c.on_watermark(1, Idle), Advance::To(100), "input 1 no longer holds back");
        assert_eq!(c.on_watermark(0, At(200)), Advance::To(200));
        // Input 1 comes back below: it counts again, the watermark stays.
        assert_eq!(c.on_watermark(1, At(150)), Advance::None);
        assert_eq!(c.on_watermark(0, At(300)), Advance::None, "input 1 holds back again");
        assert_eq!(c.on_watermark(1, At(250)), Advance::To(250));
        // Everyone idle: the task is idle; the first to come back makes it active again.
        assert_eq!(c.on_watermark(0, Idle), Advance::None);
        assert_eq!(c.on_watermark(1, Idle), Advance::Idle);
        assert_eq!(c.on_watermark(1, Idle), Advance::None, "said once");
        assert_eq!(c.on_watermark(0, At(120)), Advance::Active(250));
        assert_eq!(c.on_watermark(0, At(400)), Advance::To(400));
    }

    #[test]
    fn a_restored_task_goes_on_from_its_watermark() {
        let mut c = WatermarkCombiner::new(2).starting_at(100);
        assert_eq!(c.current(), 100);
        assert_eq!(c.on_watermark(0, At(100)), Advance::None, "said again after the restore");
        assert_eq!(c.on_watermark(1, At(100)), Advance::None);
        assert_eq!(c.on_watermark(0, At(150)), Advance::None);
        assert_eq!(c.on_watermark(1, At(120)), Advance::To(120));
    }

    #[test]
    fn ended_inputs_leave_for_good() {
        let mut c = WatermarkCombiner::new(3);
        assert_eq!(c.on_watermark(0, At(10)), Advance::None);
        assert_eq!(c.on_end(1), Advance::None, "input 2 still unheard");
        assert_eq!(c.on_watermark(2, At(40)), Advance::To(10));
        assert_eq!(c.on_end(0), Advance::To(40));
        assert_eq!(c.on_watermark(0, At(99)), Advance::None, "ignored after its end");
        assert_eq!(c.on_end(2), Advance::None, "all ended: the task's end takes over");
        // A union of one input: each of its watermarks is the task's.
        let mut one = WatermarkCombiner::new(1);
        assert_eq!(one.on_watermark(0, At(1)), Advance::To(1));
        assert_eq!(one.on_watermark(0, Idle), Advance::Idle);
        assert_eq!(one.on_watermark(0, At(1)), Advance::Active(1));
    }
}
