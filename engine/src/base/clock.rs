//! Processing time: the [`Clock`] every operator reads `now` from (scripts' `now()`,
//! processing-time timers and windows, state TTL). Wall time in production; a manual clock
//! that only moves when told to in `weir test` (its `advance_time` step) and in unit tests, so
//! that processing-time behaviour is reproducible there.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where processing time comes from. Cloning shares a manual clock.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// A clock that moves only through [`Clock::advance`] / [`Clock::set`].
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// A manual clock starting at `start_ms` (epoch milliseconds).
    pub fn manual(start_ms: i64) -> Self {
        Self::Manual(Arc::new(AtomicI64::new(start_ms)))
    }

    /// The current processing time, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            Self::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Self::Manual(t) => t.load(Ordering::Acquire),
        }
    }

    /// Whether the clock only moves when told to.
    pub fn is_manual(&self) -> bool {
        matches!(self, Self::Manual(_))
    }

    /// Moves a manual clock forward by `ms` (no effect on the system clock).
    pub fn advance(&self, ms: i64) {
        if let Self::Manual(t) = self {
            t.fetch_add(ms, Ordering::AcqRel);
        }
    }

    /// Sets a manual clock (no effect on the system clock).
    pub fn set(&self, ms: i64) {
        if let Self::Manual(t) = self {
            t.store(ms, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let c = Clock::manual(1_000);
        let d = c.clone();
        assert_eq!(c.now_ms(), 1_000);
        d.advance(500);
        assert_eq!(c.now_ms(), 1_500);
        c.set(7);
        assert_eq!(d.now_ms(), 7);
        assert!(Clock::System.now_ms() > 1_600_000_000_000);
    }
}
