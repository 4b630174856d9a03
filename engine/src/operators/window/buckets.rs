//! Aligned windows (tumbling and sliding) kept on the heap, for the heap state backends
//! (`memory`, `fs`). Every open window is a bucket of per-key accumulators, ordered by start:
//! a record costs one hash lookup per window it belongs to, and a watermark closes whole
//! windows at once, in one ordered pass, with no timer per key (every key's copy of an
//! aligned window ends at the same time).
//!
//! The keyed backend stays the record of truth for checkpoints. At every snapshot
//! ([`Buckets::flush`]) the entries changed since the previous one are written to the
//! [`WINDOWS`](super::WINDOWS) map state, in the layout the backend path uses (field = the
//! window's start in decimal, value = `[end, accumulator]`), and the entries of windows that
//! went away are removed. So checkpoints, savepoints, rescaling by key group and restores into
//! any backend (or from any) see one format. After a restore or a hand-over the buckets are
//! rebuilt from the backend ([`Buckets::load`]); windows that fired before the snapshot (kept
//! for their allowed lateness) are known by their end against the restored watermark.

use std::collections::{BTreeMap, HashMap};

use rhai::Dynamic;

use super::{Applied, WindowConfig, set_field, window_end};
use crate::base::error::{Result, RunError};
use crate::element::OperatorContext;
use crate::operators::aggregate::Accumulator;
use crate::record::{Key, KeyBuildHasher};
use crate::state::timers::key_order;
use crate::state::{StateBackend, StateId};

/// One key's accumulator in one window.
struct Entry {
    acc: Dynamic,
    /// Changed since the last flush.
    dirty: bool,
    /// Written to the backend by a flush (so its removal must be written too).
    mirrored: bool,
}

/// One window `[start, end)` of every key that has it.
struct Bucket {
    end: i64,
    /// Emitted on close already (it stays for its allowed lateness).
    fired: bool,
    /// Some entry changed since the last flush.
    dirty: bool,
    entries: HashMap<Key, Entry, KeyBuildHasher>,
}

/// The open aligned windows of one subtask.
#[derive(Default)]
pub(super) struct Buckets {
    /// Open windows by start (with one size for all, also in order of end).
    open: BTreeMap<i64, Bucket>,
    /// Windows gone since the last flush: their start and the keys whose entries the backend
    /// still holds.
    gone: Vec<(i64, Vec<Key>)>,
    /// Scratch: a field name.
    field: String,
}

impl Buckets {
    /// Adds a record of `key` (its values in `values`, or the record in `args[1]` for a
    /// script) to the windows starting at `starts` (newest first), as the backend path does:
    /// oldest window first; a window the failed record would open is not kept.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add(
        &mut self,
        acc: &mut Accumulator,
        config: &WindowConfig,
        (starts, size): (&[i64], i64),
        values: &[Dynamic],
        args: &mut [Dynamic; 2],
        key: &Key,
        watermark: i64,
        keep_backup: bool,
    ) -> Applied {
        let mut applied = Applied::default();
        let on_update = config.emit == weir_schema::WindowEmitSpec::OnUpdate;
        for &start in starts.iter().rev() {
            let end = start.saturating_add(size);
            let bucket = self.open.entry(start).or_insert_with(|| Bucket {
                end,
                // A window first seen after it would have fired emits at once.
                fired: config.fired(end, watermark),
                dirty: false,
                entries: HashMap::default(),
            });
            let (mut slot, new) = match bucket.entries.get_mut(key) {
                Some(e) => (Some(std::mem::take(&mut e.acc)), false),
                None => (None, true),
            };
            let result = acc.add(&mut slot, values, args, keep_backup);
            match (slot, new) {
                (Some(a), false) => {
                    if let Some(e) = bucket.entries.get_mut(key) {
                        e.acc = a;
                        e.dirty = true;
                    }
                }
                (Some(a), true) if result.is_ok() => {
                    bucket.entries.insert(
                        key.clone(),
                        Entry {
                            acc: a,
                            dirty: true,
                            mirrored: false,
                        },
                    );
                }
                (None, false) => {
                    // The accumulator is lost (a failing script without a backup): as the
                    // backend path, the window goes.
                    if let Some(e) = bucket.entries.remove(key)
                        && e.mirrored
                    {
                        self.gone.push((start, vec![key.clone()]));
                    }
                }
                _ => {}
            }
            bucket.dirty = true;
            if bucket.entries.is_empty() {
                self.open.remove(&start);
            }
            if let Err(e) = result {
                applied.failure = Some(e);
                break;
            }
            let Some(bucket) = self.open.get(&start) else {
                continue;
            };
            if (on_update || bucket.fired)
                && let Some(e) = bucket.entries.get(key)
            {
                let out = super::WindowOperator::output(acc, config, key, start, end, &e.acc);
                applied.outputs.push(out);
            }
        }
        applied
    }

    /// Closes every window due at `upto`: emits (under `on_close`) those whose end passed,
    /// each window's keys in the stable key order, and drops those whose lateness passed.
    pub(super) fn fire_due(
        &mut self,
        acc: &mut Accumulator,
        config: &WindowConfig,
        upto: i64,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let emit = config.emit == weir_schema::WindowEmitSpec::OnClose;
        let mut done = Vec::new();
        for (&start, bucket) in &mut self.open {
            if WindowConfig::fire_time(bucket.end) > upto {
                break;
            }
            let cleanup = config.cleanup_time(bucket.end) <= upto;
            if !bucket.fired {
                bucket.fired = true;
                if emit {
                    let mut keys: Vec<(&Key, &Entry)> = bucket.entries.iter().collect();
                    keys.sort_unstable_by(|a, b| key_order(a.0, b.0));
                    for (key, e) in keys {
                        match super::WindowOperator::output(
                            acc,
                            config,
                            key,
                            start,
                            bucket.end,
                            &e.acc,
                        ) {
                            Ok(o) => out.push(o),
                            Err(err) => ctx.record_failed(key.to_dynamic(), err)?,
                        }
                    }
                }
            }
            if cleanup {
                done.push(start);
            }
        }
        for start in done {
            if let Some(bucket) = self.open.remove(&start) {
                let mirrored: Vec<Key> = bucket
                    .entries
                    .into_iter()
                    .filter(|(_, e)| e.mirrored)
                    .map(|(k, _)| k)
                    .collect();
                if !mirrored.is_empty() {
                    self.gone.push((start, mirrored));
                }
            }
        }
        Ok(())
    }

    /// When the earliest open window that has not fired fires.
    pub(super) fn next_fire(&self) -> Option<i64> {
        self.open
            .values()
            .find(|b| !b.fired)
            .map(|b| WindowConfig::fire_time(b.end))
    }

    /// Writes what changed since the last flush to the backend's `id` map state.
    pub(super) fn flush(&mut self, state: &mut dyn StateBackend, id: StateId) -> Result<()> {
        for (start, keys) in self.gone.drain(..) {
            set_field(&mut self.field, start);
            for key in keys {
                state.map_remove(id, &key, &self.field)?;
            }
        }
        for (&start, bucket) in self.open.iter_mut().filter(|(_, b)| b.dirty) {
            bucket.dirty = false;
            set_field(&mut self.field, start);
            for (key, e) in bucket.entries.iter_mut().filter(|(_, e)| e.dirty) {
                e.dirty = false;
                e.mirrored = true;
                let value = Dynamic::from_array(vec![Dynamic::from(bucket.end), e.acc.clone()]);
                state.map_put(id, key, &self.field, value)?;
            }
        }
        Ok(())
    }

    /// Rebuilds the buckets from the backend's `id` map state (after a restore or a
    /// hand-over), with `watermark` the restored one.
    pub(super) fn load(
        &mut self,
        state: &dyn StateBackend,
        id: StateId,
        config: &WindowConfig,
        watermark: i64,
    ) -> Result<()> {
        self.open.clear();
        self.gone.clear();
        for key in state.keys(id)? {
            for field in state.map_keys(id, &key)? {
                let damaged = || {
                    RunError::StateMismatch(format!(
                        "a stored window `{field}` is not `start: [end, accumulator]`; the \
                         checkpoint is damaged"
                    ))
                };
                let start: i64 = field.parse().map_err(|_| damaged())?;
                let value = state.map_get(id, &key, &field)?.ok_or_else(damaged)?;
                let end = window_end(&value).ok_or_else(damaged)?;
                let acc = value
                    .into_array()
                    .ok()
                    .and_then(|mut a| (a.len() == 2).then(|| a.swap_remove(1)))
                    .ok_or_else(damaged)?;
                let bucket = self.open.entry(start).or_insert_with(|| Bucket {
                    end,
                    fired: config.fired(end, watermark),
                    dirty: false,
                    entries: HashMap::default(),
                });
                bucket.entries.insert(
                    key.clone(),
                    Entry {
                        acc,
                        dirty: false,
                        mirrored: true,
                    },
                );
            }
        }
        Ok(())
    }
}
