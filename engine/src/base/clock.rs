//! Processing time: the [`Clock`] every operator reads `now` from (scripts' `now()`,
//! processing-time timers and windows, state TTL, sources' idle timeouts). Wall time in
//! production; a manual clock that only moves when told to in `weir test` (its `advance_time`
//! step) and in unit tests, so that processing-time behaviour is reproducible there. A task
//! waiting for a processing time ([`Clock::wait_until`]) wakes when a manual clock is moved
//! past it, as it would when the wall clock reaches it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// Where processing time comes from. Cloning shares a manual clock.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// A clock that moves only through [`Clock::advance`] / [`Clock::set`]; every move wakes
    /// the tasks waiting on it.
    Manual(Arc<watch::Sender<i64>>),
}

impl Clock {
    /// A manual clock starting at `start_ms` (epoch milliseconds).
    pub fn manual(start_ms: i64) -> Self {
        Self::Manual(Arc::new(watch::Sender::new(start_ms)))
    }

    /// The current processing time, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            Self::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Self::Manual(t) => *t.borrow(),
        }
    }

    /// Whether the clock only moves when told to.
    pub fn is_manual(&self) -> bool {
        matches!(self, Self::Manual(_))
    }

    /// Moves a manual clock forward by `ms` (no effect on the system clock).
    pub fn advance(&self, ms: i64) {
        if let Self::Manual(t) = self {
            t.send_modify(|now| *now = now.saturating_add(ms));
        }
    }

    /// Sets a manual clock (no effect on the system clock).
    pub fn set(&self, ms: i64) {
        if let Self::Manual(t) = self {
            t.send_replace(ms);
        }
    }

    /// Completes once processing time is at or past `deadline_ms`: a timer on the system
    /// clock, a wait for the moves of a manual one (pending forever if it never gets there).
    pub async fn wait_until(&self, deadline_ms: i64) {
        match self {
            Self::System => {
                let now = self.now_ms();
                if deadline_ms > now {
                    let ms = u64::try_from(deadline_ms.saturating_sub(now)).unwrap_or(u64::MAX);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
            Self::Manual(t) => {
                // Subscribing marks the current value seen: a move after the check below
                // wakes `changed`, so none is missed.
                let mut rx = t.subscribe();
                while *rx.borrow_and_update() < deadline_ms {
                    if rx.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
            }
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

    #[tokio::test]
    async fn waiting_on_a_manual_clock_wakes_when_it_is_moved_past_the_deadline() {
        let c = Clock::manual(0);
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.wait_until(1_000).await })
        };
        tokio::task::yield_now().await;
        c.advance(400);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "400 < 1000: still waiting");
        c.advance(600);
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("woken by the move")
            .expect("no panic");
        // Already due: completes at once.
        c.wait_until(5).await;
        Clock::System.wait_until(0).await;
    }
}
