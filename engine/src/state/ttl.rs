//! State time-to-live: the expiry of the values of the named states that declare a `ttl`
//! (`seen: {kind: map, ttl: 1h}`), kept in the subtask's backend like any other keyed state.
//!
//! A key's value of a state (a whole list or map counts as one value) expires `ttl` of
//! processing time after it was last written, or also read with `ttl_update:
//! on_read_and_write`. Expiry times are absolute epoch milliseconds stored in one map state,
//! [`STATE`] (under the value's key: field = the state's name), so checkpoints, savepoints,
//! rescaling and every backend carry them, and a value that expired while the pipeline was
//! stopped reads as absent after the restore. Callers check [`Ttl::expire_if_due`] before an
//! access and report it with [`Ttl::touched`] afterwards; [`Ttl::sweep`] removes every expired
//! value, so that keys never read again do not keep the state growing.
//!
//! This module owns only the bookkeeping; processing time comes from the caller (the
//! operator's `ctx.clock`).

use rhai::Dynamic;
use weir_schema::StateKind;

use crate::base::error::Result;
use crate::record::Key;
use crate::state::{StateBackend, StateId};

/// The map state holding expiry times. Names starting with `__` cannot be declared by a
/// pipeline's `state:`, so this never clashes with a script's state.
pub const STATE: &str = "__ttl.expiry";

/// The time-to-live of one named state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TtlRule {
    /// The state's handle.
    pub state: StateId,
    /// Its name (the field of [`STATE`] holding its expiry).
    pub name: String,
    /// Milliseconds of processing time a value lives after its last renewal.
    pub ttl_ms: i64,
    /// Whether a read that finds the value renews it too (`on_read_and_write`).
    pub renew_on_read: bool,
}

/// How an access used a value, for [`Ttl::touched`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Wrote (set, pushed, put or removed parts of) the value.
    Write,
    /// Removed the whole value.
    Clear,
}

/// The time-to-live rules of one operator subtask's states.
#[derive(Debug)]
pub struct Ttl {
    index: StateId,
    rules: Vec<TtlRule>,
}

impl Ttl {
    /// Registers [`STATE`] in `state` (call in `open`, before a restore); `None` when no
    /// state has a time-to-live.
    ///
    /// # Errors
    /// A state of the same name registered with another kind.
    pub fn register(state: &mut dyn StateBackend, rules: Vec<TtlRule>) -> Result<Option<Self>> {
        if rules.is_empty() {
            return Ok(None);
        }
        let index = state.register(STATE, StateKind::Map)?;
        Ok(Some(Self { index, rules }))
    }

    /// The rule of state `id`, if it has a time-to-live.
    pub fn rule(&self, id: StateId) -> Option<&TtlRule> {
        self.rules.iter().find(|r| r.state == id)
    }

    /// The shortest time-to-live: how often a [`sweep`](Self::sweep) keeps expired values
    /// from outliving their expiry by more than that.
    pub fn sweep_interval(&self) -> i64 {
        self.rules.iter().map(|r| r.ttl_ms).min().unwrap_or(i64::MAX).max(1)
    }

    fn expiry(&self, state: &dyn StateBackend, key: &Key, rule: &TtlRule) -> Result<Option<i64>> {
        Ok(state
            .map_get(self.index, key, &rule.name)?
            .and_then(|d| d.as_int().ok()))
    }

    /// Before an access of `key`'s value of state `id` at processing time `now`: removes the
    /// value when it has expired, so that the access finds it absent. Returns whether it did.
    ///
    /// # Errors
    /// Backend failures.
    pub fn expire_if_due(
        &self,
        state: &mut dyn StateBackend,
        id: StateId,
        key: &Key,
        now: i64,
    ) -> Result<bool> {
        let Some(rule) = self.rule(id) else {
            return Ok(false);
        };
        match self.expiry(state, key, rule)? {
            Some(at) if at <= now => {
                state.clear(id, key)?;
                state.map_remove(self.index, key, &rule.name)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// After an access of `key`'s value of state `id` at `now`: a write renews its expiry, a
    /// read does under `on_read_and_write` when the value is there, a clear forgets it.
    ///
    /// # Errors
    /// Backend failures.
    pub fn touched(
        &self,
        state: &mut dyn StateBackend,
        id: StateId,
        key: &Key,
        now: i64,
        access: Access,
    ) -> Result<()> {
        let Some(rule) = self.rule(id) else {
            return Ok(());
        };
        let renew = match access {
            Access::Write => true,
            Access::Read => rule.renew_on_read && self.expiry(state, key, rule)?.is_some(),
            Access::Clear => {
                return state.map_remove(self.index, key, &rule.name);
            }
        };
        if renew {
            let at = now.saturating_add(rule.ttl_ms);
            state.map_put(self.index, key, &rule.name, Dynamic::from_int(at))?;
        }
        Ok(())
    }

    /// Whether `key`'s value of state `id` is expired at `now` (without removing it).
    ///
    /// # Errors
    /// Backend failures.
    pub fn is_expired(&self, state: &dyn StateBackend, id: StateId, key: &Key, now: i64) -> Result<bool> {
        let Some(rule) = self.rule(id) else {
            return Ok(false);
        };
        Ok(self.expiry(state, key, rule)?.is_some_and(|at| at <= now))
    }

    /// Removes every value expired at `now`, of every key; returns how many.
    ///
    /// # Errors
    /// Backend failures.
    pub fn sweep(&self, state: &mut dyn StateBackend, now: i64) -> Result<usize> {
        let mut removed = 0;
        for key in state.keys(self.index)? {
            for rule in &self.rules {
                if self.expire_if_due(state, rule.state, &key, now)? {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::KeyGroupRange;
    use crate::state::MemoryBackend;

    #[test]
    fn no_rules_register_nothing() -> Result<()> {
        let mut b = MemoryBackend::new(8, KeyGroupRange::all(8));
        assert!(Ttl::register(&mut b, Vec::new())?.is_none());
        Ok(())
    }
}
