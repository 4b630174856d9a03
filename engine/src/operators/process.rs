//! `process` (keyed): Rhai `fn process(r)` with named keyed state (`state_get`, `list_push`,
//! `map_put`, ...) and `emit(record)`; optional `fn on_end(key)` per key at the end of a
//! bounded input, and optional `fn migrate(old)` (or `fn migrate(name, old)`) that rewrites
//! every value of every declared state after a savepoint restore.

use std::collections::HashSet;

use rhai::Dynamic;
use weir_schema::StateKind;

use super::reduce::{migrate_keyed_state, require_keys};
use crate::operators::{Operator, OperatorContext};
use crate::record::{Key, KeyBuildHasher};
use crate::runtime::Batch;
use crate::runtime::error::Result;
use crate::script::runtime::{ScriptFn, discard_emitted, set_key, take_emitted, with_frame};
use crate::state::StateId;

/// The `process` operator.
pub struct ProcessOperator {
    script: ScriptFn,
    declared: Vec<(String, StateKind)>,
    names: Vec<(String, StateId)>,
}

impl ProcessOperator {
    /// A process operator with its compiled script and declared state.
    pub fn new(script: ScriptFn, declared: Vec<(String, StateKind)>) -> Self {
        Self {
            script,
            declared,
            names: Vec::new(),
        }
    }
}

impl Operator for ProcessOperator {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let state = ctx.state_mut()?;
        for (name, kind) in &self.declared {
            let id = state.register(name, *kind)?;
            self.names.push((name.clone(), id));
        }
        Ok(())
    }

    /// Rewrites the values of every declared state through `fn migrate`
    /// ([`migrate_keyed_state`]).
    fn migrate_state(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let states: Vec<(String, StateKind, StateId)> = self
            .declared
            .iter()
            .zip(&self.names)
            .map(|((name, kind), (_, id))| (name.clone(), *kind, *id))
            .collect();
        migrate_keyed_state(&mut self.script, &states, ctx)
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        require_keys(batch, ctx)?;
        let records = std::mem::take(&mut batch.records);
        let keys = std::mem::take(&mut batch.keys);
        let mut failures = Vec::new();
        let script = &mut self.script;
        let out = &mut batch.records;
        let exact = ctx.keeps_failed_records();
        with_frame(&mut ctx.state, &self.names, || {
            for (r, k) in records.into_iter().zip(keys) {
                set_key(Some(k));
                let original = exact.then(|| r.clone());
                let mut args = [r];
                match script.invoke("process", &mut args) {
                    Ok(_) => take_emitted(out),
                    Err(e) => {
                        discard_emitted();
                        let [left] = args;
                        failures.push((original.unwrap_or(left), e));
                    }
                }
            }
        });
        for (r, e) in failures {
            ctx.record_failed(r, e)?;
        }
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        if !self.script.defines("on_end", 1) {
            return Ok(());
        }
        let mut keys: HashSet<Key, KeyBuildHasher> = HashSet::default();
        {
            let state = ctx.state_mut()?;
            for (_, id) in &self.names {
                keys.extend(state.keys(*id)?);
            }
        }
        let mut failures = Vec::new();
        let script = &mut self.script;
        with_frame(&mut ctx.state, &self.names, || {
            for k in keys {
                let kd = k.to_dynamic();
                set_key(Some(k));
                match script.call("on_end", (kd.clone(),)) {
                    Ok(_) => take_emitted(out),
                    Err(e) => {
                        discard_emitted();
                        failures.push((kd, e));
                    }
                }
            }
        });
        for (r, e) in failures {
            ctx.record_failed(r, e)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::Harness;
    use crate::operators::reduce::tests::{key, keyed_ctx, script};
    use crate::record::{KeyGroupRange, excerpt};

    const STATES: &str = r#"
        fn process(r) {
            let c = state_get("count");
            if c == () { c = 0; }
            state_set("count", c + 1);
            list_push("seen", r);
            map_put("by", "last", r);
        }
    "#;

    fn declared() -> Vec<(String, StateKind)> {
        vec![
            ("count".to_owned(), StateKind::Value),
            ("seen".to_owned(), StateKind::List),
            ("by".to_owned(), StateKind::Map),
        ]
    }

    /// Runs `u: 1, 2` and `v: 7` through [`STATES`], then restores the keyed state into a
    /// process with `migrate` added, as a savepoint restore; returns it and the states.
    fn restored(migrate: &str) -> Result<(Harness, Vec<(String, StateId)>)> {
        let mut first = Harness::new(
            Box::new(ProcessOperator::new(script(STATES), declared())),
            keyed_ctx(),
        )?;
        let records = [("u", 1_i64), ("u", 2), ("v", 7)];
        first.push(Batch {
            records: records.iter().map(|(_, n)| Dynamic::from(*n)).collect(),
            keys: records.iter().map(|(k, _)| key(k)).collect(),
        })?;
        let snap = first.ctx.state_mut()?.snapshot(KeyGroupRange::all(128))?;
        let mut ctx = keyed_ctx();
        ctx.restored_from = Some(1);
        ctx.migrate = true;
        let op = ProcessOperator::new(script(&format!("{STATES}\n{migrate}")), declared());
        let mut h = Harness::new(Box::new(op), ctx)?;
        h.ctx.state_mut()?.restore(&[snap.as_slice()])?;
        let mut ids = Vec::new();
        for (name, kind) in declared() {
            ids.push((name.clone(), h.ctx.state_mut()?.register(&name, kind)?));
        }
        h.operator.migrate_state(&mut h.ctx)?;
        Ok((h, ids))
    }

    fn get(h: &mut Harness, ids: &[(String, StateId)], state: &str, k: &str) -> Option<String> {
        let id = ids.iter().find(|(n, _)| n == state).expect("state").1;
        h.ctx
            .state_mut()
            .expect("state")
            .get(id, &key(k))
            .expect("get")
            .map(|v| excerpt(&v))
    }

    #[test]
    fn migrate_with_the_state_name_rewrites_every_declared_state() {
        let (mut h, ids) = restored(
            r#"fn migrate(name, old) {
                switch name {
                    "count" => old * 100,
                    "seen" => old + [key()],
                    _ => #{ last: old.last, key: key() },
                }
            }"#,
        )
        .expect("restore");
        assert_eq!(get(&mut h, &ids, "count", "u").as_deref(), Some("200"));
        assert_eq!(get(&mut h, &ids, "count", "v").as_deref(), Some("100"));
        assert_eq!(
            get(&mut h, &ids, "seen", "u").as_deref(),
            Some(r#"[1,2,"u"]"#)
        );
        assert_eq!(
            get(&mut h, &ids, "by", "v").as_deref(),
            Some(r#"{"key":"v","last":7}"#)
        );
    }

    #[test]
    fn the_one_parameter_form_wins_and_unit_deletes() {
        let (mut h, ids) = restored(
            "fn migrate(old) { if type_of(old) == \"i64\" { () } else { old } }
             fn migrate(name, old) { throw \"not this one\" }",
        )
        .expect("restore");
        assert_eq!(get(&mut h, &ids, "count", "u"), None);
        assert_eq!(get(&mut h, &ids, "seen", "u").as_deref(), Some("[1,2]"));
    }

    #[test]
    fn a_list_state_must_stay_a_list() {
        let err = restored(r#"fn migrate(name, old) { if name == "seen" { 0 } else { old } }"#)
            .err()
            .expect("wrong shape");
        let msg = err.to_string();
        assert!(msg.contains("state `seen`"), "{msg}");
        assert!(msg.contains("list state holds arrays"), "{msg}");
        assert!(
            msg.contains("record: [1,2]") || msg.contains("record: [7]"),
            "{msg}"
        );
    }
}
