//! Fault injection for recovery tests: a fault that makes one operator fail (or panic) once,
//! on a given record. A `Fault` can be made only in the engine's own tests and with the
//! `testkit` feature; in any other build the type has no value, so the task loop's check for
//! one is dead code the compiler removes, and a release `weir` carries none of it.

/// How an injected fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
pub enum FaultKind {
    /// The operator fails on the record, as a script that throws under `on_error: fail`.
    Error,
    /// The operator panics.
    Panic,
}

#[cfg(any(test, feature = "testkit"))]
pub use armed::Fault;

#[cfg(not(any(test, feature = "testkit")))]
pub use inert::Fault;

#[cfg(any(test, feature = "testkit"))]
mod armed {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::FaultKind;

    /// A fault injected into one operator: it strikes once per process, on the record that
    /// makes the operator's input count (over every subtask and restart) reach `after`.
    #[derive(Debug)]
    pub struct Fault {
        after: u64,
        kind: FaultKind,
        seen: AtomicU64,
        fired: AtomicBool,
    }

    impl Fault {
        /// A fault striking at the `after`-th record (1-based).
        pub fn new(after: u64, kind: FaultKind) -> Self {
            Self {
                after: after.max(1),
                kind,
                seen: AtomicU64::new(0),
                fired: AtomicBool::new(false),
            }
        }

        /// Whether the fault has struck.
        pub fn fired(&self) -> bool {
            self.fired.load(Ordering::Relaxed)
        }

        /// Counts `n` records; returns the index in the batch of the one to strike on, and
        /// how.
        pub(crate) fn hit(&self, n: usize) -> Option<(usize, FaultKind)> {
            let before = self.seen.fetch_add(n as u64, Ordering::Relaxed);
            if before < self.after
                && before + n as u64 >= self.after
                && !self.fired.swap(true, Ordering::Relaxed)
            {
                return Some(((self.after - before - 1) as usize, self.kind));
            }
            None
        }
    }
}

#[cfg(not(any(test, feature = "testkit")))]
mod inert {
    use super::FaultKind;

    /// No fault can be made in this build (see the module docs).
    #[derive(Debug)]
    pub enum Fault {}

    impl Fault {
        /// Never called: there is no value to call it on.
        pub(crate) fn hit(&self, _n: usize) -> Option<(usize, FaultKind)> {
            match *self {}
        }
    }
}
