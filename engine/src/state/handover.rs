//! Hands keyed state from a pipeline version that stopped with a savepoint to the version
//! that restores that savepoint, in the same process, instead of decoding the savepoint
//! again. The savepoint is still written in full (it is the durable copy, and what a
//! rollback restores); the hand-over only spares the new version the decode and the old one
//! the freeing, which at a million keys are most of a hot reload's pause.
//!
//! A subtask parks its backend here only when it stopped right after a stop-with-savepoint
//! barrier and the backend's [`generation`](super::StateBackend::generation) is the one
//! recorded when the savepoint's snapshot was taken (nothing changed since). A subtask of
//! the new version takes it only for the same operator, subtask, checkpoint, key-group range
//! and state-backend configuration; otherwise it restores from the savepoint's files as
//! usual. Parking happens only for a pipeline being reloaded ([`Handover::expect`]); what
//! nobody claims is freed when its reload ends ([`Handover::clear`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use weir_schema::StateSpec;

use super::StateBackend;
use crate::base::dispose::dispose;
use crate::checkpoint::CheckpointId;
use crate::record::KeyGroupRange;

/// Which subtask's state, as of which savepoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HandoverKey {
    /// The pipeline.
    pub pipeline: Arc<str>,
    /// The operator id.
    pub operator: Arc<str>,
    /// The subtask.
    pub subtask: u32,
    /// The savepoint's checkpoint id.
    pub checkpoint: CheckpointId,
}

struct Parked {
    range: KeyGroupRange,
    backend: Arc<StateSpec>,
    state: Box<dyn StateBackend>,
}

/// Parked backends of one job.
#[derive(Default)]
pub struct Handover {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Pipelines being reloaded: only their states are parked.
    expecting: HashSet<String>,
    parked: HashMap<HandoverKey, Parked>,
    /// States taken per pipeline since its [`Handover::expect`].
    taken: HashMap<String, u64>,
}

impl Handover {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `pipeline` is about to be reloaded: park its states from now until [`clear`].
    ///
    /// [`clear`]: Self::clear
    pub fn expect(&self, pipeline: &str) {
        let mut inner = self.inner();
        inner.expecting.insert(pipeline.to_owned());
        inner.taken.insert(pipeline.to_owned(), 0);
    }

    /// Whether `pipeline` is being reloaded (between [`expect`](Self::expect) and
    /// [`clear`](Self::clear)).
    pub fn is_expecting(&self, pipeline: &str) -> bool {
        self.inner().expecting.contains(pipeline)
    }

    /// How many states of `pipeline` were taken since [`expect`](Self::expect).
    pub fn taken(&self, pipeline: &str) -> u64 {
        self.inner().taken.get(pipeline).copied().unwrap_or(0)
    }

    /// Parks `state`, which holds exactly the savepoint `key.checkpoint` of its subtask, for
    /// a backend configured as `backend`.
    pub fn put(&self, key: HandoverKey, backend: Arc<StateSpec>, state: Box<dyn StateBackend>) {
        let mut inner = self.inner();
        if !inner.expecting.contains(&*key.pipeline) {
            drop(inner);
            dispose(state);
            return;
        }
        let range = state.key_groups();
        let old = inner.parked.insert(
            key,
            Parked {
                range,
                backend,
                state,
            },
        );
        drop(inner);
        if let Some(old) = old {
            dispose(old.state);
        }
    }

    /// Takes the state parked under `key` if it covers exactly `range` with the same backend
    /// configuration; a parked state that does not fit is freed.
    pub fn take(
        &self,
        key: &HandoverKey,
        range: KeyGroupRange,
        backend: &StateSpec,
    ) -> Option<Box<dyn StateBackend>> {
        let mut inner = self.inner();
        let parked = inner.parked.remove(key)?;
        if parked.range == range && *parked.backend == *backend {
            *inner.taken.entry(key.pipeline.to_string()).or_default() += 1;
            drop(inner);
            let mut state = parked.state;
            state.detach_checkpoints();
            Some(state)
        } else {
            drop(inner);
            dispose(parked.state);
            None
        }
    }

    /// Ends `pipeline`'s reload: frees its parked states and parks no more.
    pub fn clear(&self, pipeline: &str) {
        let freed: Vec<Parked> = {
            let mut inner = self.inner();
            inner.expecting.remove(pipeline);
            inner.taken.remove(pipeline);
            let keys: Vec<HandoverKey> = inner
                .parked
                .keys()
                .filter(|k| &*k.pipeline == pipeline)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| inner.parked.remove(k)).collect()
        };
        for p in freed {
            dispose(p.state);
        }
    }

    /// How many states are parked.
    #[cfg(any(test, feature = "testkit"))]
    pub fn len(&self) -> usize {
        self.inner().parked.len()
    }

    /// Whether nothing is parked.
    #[cfg(any(test, feature = "testkit"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rhai::Dynamic;
    use weir_schema::StateKind;

    use super::*;
    use crate::record::Key;
    use crate::state::MemoryBackend;

    fn memory() -> Arc<StateSpec> {
        Arc::new(StateSpec::Memory)
    }

    fn key(subtask: u32, checkpoint: CheckpointId) -> HandoverKey {
        HandoverKey {
            pipeline: "p".into(),
            operator: "op".into(),
            subtask,
            checkpoint,
        }
    }

    fn backend(range: KeyGroupRange) -> Box<dyn StateBackend> {
        let mut b = MemoryBackend::new(8, range);
        let id = b.register("s", StateKind::Value).unwrap();
        let k = Key::from_dynamic(&Dynamic::from_int(1));
        if range.contains(k.key_group(8)) {
            b.put(id, &k, Dynamic::from_int(42)).unwrap();
        }
        Box::new(b)
    }

    #[test]
    fn a_parked_state_is_taken_once_and_only_when_it_fits() {
        let h = Handover::default();
        let all = KeyGroupRange { start: 0, end: 8 };
        let half = KeyGroupRange { start: 0, end: 4 };
        h.put(key(0, 7), memory(), backend(all));
        assert!(h.is_empty(), "not reloading: freed, not parked");
        h.expect("p");
        h.put(key(0, 7), memory(), backend(all));
        assert!(
            h.take(&key(0, 6), all, &StateSpec::Memory).is_none(),
            "other savepoint"
        );
        assert!(
            h.take(&key(1, 7), all, &StateSpec::Memory).is_none(),
            "other subtask"
        );
        let mut got = h.take(&key(0, 7), all, &StateSpec::Memory).expect("fits");
        let id = got.register("s", StateKind::Value).unwrap();
        let k = Key::from_dynamic(&Dynamic::from_int(1));
        assert_eq!(got.get(id, &k).unwrap().unwrap().as_int().unwrap(), 42);
        assert!(
            h.take(&key(0, 7), all, &StateSpec::Memory).is_none(),
            "taken once"
        );
        assert_eq!(h.taken("p"), 1);

        h.put(key(0, 7), memory(), backend(all));
        assert!(
            h.take(&key(0, 7), half, &StateSpec::Memory).is_none(),
            "rescaled"
        );
        assert!(h.is_empty(), "a misfit is freed");
        h.put(key(0, 7), memory(), backend(all));
        assert!(
            h.take(&key(0, 7), all, &StateSpec::Fs).is_none(),
            "other backend"
        );

        h.put(key(0, 7), memory(), backend(all));
        h.put(key(1, 7), memory(), backend(all));
        h.clear("other");
        assert_eq!(h.len(), 2);
        h.clear("p");
        assert!(h.is_empty());
        h.put(key(0, 7), memory(), backend(all));
        assert!(h.is_empty(), "the reload is over");
    }
}
