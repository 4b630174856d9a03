//! Keeps the freeing of large state out of a hot reload's pause. A task that ends with a
//! million keys of heap state spends a few hundred milliseconds freeing it; during a reload
//! that would sit between the old version's savepoint and the new version's start, and
//! freeing it on another thread meanwhile would compete with the new version's restore for
//! the same cores. So while a [`Hold`] is alive (the job manager takes one for each reload,
//! and lets it go once the new version has started), [`dispose`] parks values instead of
//! dropping them; the last hold released hands them to a background thread. Without a hold,
//! [`dispose`] drops at once. [`wait_disposed`] (at the end of a job) joins those threads,
//! so that nothing a drop does (closing a RocksDB instance, removing its working directory)
//! is cut short by the process exiting.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

type Parked = Box<dyn Send>;

struct Graveyard {
    holds: usize,
    parked: Vec<Parked>,
    threads: Vec<JoinHandle<()>>,
}

static GRAVEYARD: Mutex<Graveyard> = Mutex::new(Graveyard {
    holds: 0,
    parked: Vec::new(),
    threads: Vec::new(),
});

fn graveyard() -> MutexGuard<'static, Graveyard> {
    GRAVEYARD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Drops `value` now, or, while a [`Hold`] is alive, once the last hold is released.
pub fn dispose<T: Send + 'static>(value: T) {
    let mut g = graveyard();
    if g.holds > 0 {
        g.parked.push(Box::new(value));
    } else {
        drop(g);
        drop(value);
    }
}

/// While alive, [`dispose`] parks values; see the module docs.
#[must_use = "the hold ends when dropped"]
pub struct Hold(());

/// Starts a hold.
pub fn hold() -> Hold {
    graveyard().holds += 1;
    Hold(())
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut g = graveyard();
        g.holds -= 1;
        if g.holds > 0 || g.parked.is_empty() {
            return;
        }
        let parked = std::mem::take(&mut g.parked);
        let spawned = std::thread::Builder::new()
            .name("weir-free".into())
            .spawn(move || drop(parked));
        // If no thread could be started, `spawn` dropped the closure, and the values with it.
        if let Ok(handle) = spawned {
            g.threads.retain(|h| !h.is_finished());
            g.threads.push(handle);
        }
    }
}

/// Waits until every value passed to [`dispose`] so far has been dropped (values still
/// parked under a live hold are dropped here).
pub fn wait_disposed() {
    let (parked, threads) = {
        let mut g = graveyard();
        (
            std::mem::take(&mut g.parked),
            std::mem::take(&mut g.threads),
        )
    };
    drop(parked);
    for t in threads {
        // A panicking drop has been reported by the panic hook; nothing to add.
        let _ = t.join();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    // One test: the graveyard is process-wide, and tests run in parallel.
    #[test]
    fn values_are_parked_while_held_and_dropped_after() {
        let drops = Arc::new(AtomicUsize::new(0));
        dispose(Counted(Arc::clone(&drops)));
        assert_eq!(drops.load(Ordering::SeqCst), 1, "no hold: dropped at once");
        let outer = hold();
        let inner = hold();
        for _ in 0..3 {
            dispose(Counted(Arc::clone(&drops)));
        }
        drop(inner);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "still held");
        drop(outer);
        wait_disposed();
        assert_eq!(drops.load(Ordering::SeqCst), 4);
    }
}
