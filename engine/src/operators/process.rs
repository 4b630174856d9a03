//! `process` (keyed): Rhai `fn process(r)` with named keyed state (`state_get`, `list_push`,
//! `map_put`, ...) and `emit(record)`; optional `fn on_end(key)` per key at the end of a
//! bounded input, and optional `fn migrate(old)` (or `fn migrate(name, old)`) that rewrites
//! every value of every declared state after a savepoint restore.

use std::collections::HashSet;

use rhai::Dynamic;
use weir_schema::StateKind;

use super::reduce::{migrate_keyed_state, require_keys, unkeyed};
use crate::base::error::Result;
use crate::base::message::{Batch, Pending};
use crate::element::{Operator, OperatorContext};
use crate::record::{Key, KeyBuildHasher};
use crate::script::runtime::{ScriptFn, discard_emitted, set_key, take_emitted, with_frame};
use crate::state::StateId;

/// The `process` operator.
pub struct ProcessOperator {
    script: ScriptFn,
    declared: Vec<(String, StateKind)>,
    names: Vec<(String, StateId)>,
    /// Most records one call may `emit`.
    max_outputs: usize,
}

impl ProcessOperator {
    /// A process operator with its compiled script and declared state; `max_outputs` is the
    /// pipeline's `limits.max_outputs_per_record`.
    pub fn new(script: ScriptFn, declared: Vec<(String, StateKind)>, max_outputs: usize) -> Self {
        Self {
            script,
            declared,
            names: Vec::new(),
            max_outputs: max_outputs.max(1),
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
        let mut input = Pending::new(std::mem::take(batch));
        self.process_some(&mut input, batch, usize::MAX, ctx)
    }

    fn expands(&self) -> bool {
        true
    }

    fn process_some(
        &mut self,
        input: &mut Pending,
        out: &mut Batch,
        limit: usize,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if !input.is_empty() && !input.is_keyed() {
            return Err(unkeyed(ctx));
        }
        let mut failures = Vec::new();
        let script = &mut self.script;
        let records = &mut out.records;
        let exact = ctx.keeps_failed_records();
        with_frame(&mut ctx.state, &self.names, self.max_outputs, || {
            while records.len() < limit {
                let Some((r, k)) = input.next_record() else {
                    break;
                };
                set_key(k);
                let original = exact.then(|| r.clone());
                let mut args = [r];
                let failed = match script.invoke("process", &mut args) {
                    Ok(_) => take_emitted(records).err(),
                    Err(e) => {
                        discard_emitted();
                        Some(e)
                    }
                };
                if let Some(e) = failed {
                    let [left] = args;
                    failures.push((original.unwrap_or(left), e));
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
        with_frame(&mut ctx.state, &self.names, self.max_outputs, || {
            for k in keys {
                let kd = k.to_dynamic();
                set_key(Some(k));
                let failed = match script.call("on_end", (kd.clone(),)) {
                    Ok(_) => take_emitted(out).err(),
                    Err(e) => {
                        discard_emitted();
                        Some(e)
                    }
                };
                if let Some(e) = failed {
                    failures.push((kd, e));
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
    use crate::element::Harness;
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
            Box::new(ProcessOperator::new(script(STATES), declared(), 100)),
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
        let op = ProcessOperator::new(script(&format!("{STATES}\n{migrate}")), declared(), 100);
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

    /// A process operator over `u` keyed records with tight limits and `on_error: skip`.
    fn bounded(text: &str, limits: &weir_schema::ScriptLimitsSpec) -> Harness {
        let op = ProcessOperator::new(
            crate::operators::reduce::tests::script_with(limits, text),
            declared(),
            3,
        );
        let mut ctx = keyed_ctx();
        ctx.on_error = crate::element::ErrorPolicy::DeadLetter;
        Harness::new(Box::new(op), ctx).expect("opens")
    }

    fn keyed(values: &[Dynamic]) -> Batch {
        Batch {
            records: values.to_vec(),
            keys: values.iter().map(|_| key("u")).collect(),
        }
    }

    fn errors(h: &Harness) -> Vec<String> {
        h.ctx
            .dead_letters
            .iter()
            .map(|d| d.read_lock::<rhai::Map>().expect("a map")["error"].to_string())
            .collect()
    }

    fn ints(n: std::ops::Range<i64>) -> Vec<Dynamic> {
        n.map(Dynamic::from).collect()
    }

    #[test]
    fn list_writes_stop_where_reads_would_fail() {
        let limits = weir_schema::ScriptLimitsSpec {
            max_array_size: 5,
            ..Default::default()
        };
        // Each record pushes itself and reads the list back.
        let mut h = bounded(
            r#"fn process(r) { list_push("seen", r); emit(list_get("seen").len()); }"#,
            &limits,
        );
        let out = h.push(keyed(&ints(0..8))).expect("runs");
        let lens: Vec<i64> = out
            .records
            .iter()
            .map(|d| d.as_int().expect("int"))
            .collect();
        assert_eq!(
            lens,
            [1, 2, 3, 4, 5],
            "the list stops growing at the limit and stays readable"
        );
        assert_eq!(h.ctx.errors, 3);
        let e = &errors(&h)[0];
        assert!(e.contains(r#"list_push("seen")"#), "{e}");
        assert!(
            e.contains("6 array items, more than `limits.max_array_size` (5)"),
            "{e}"
        );
        assert!(e.contains("list_trim"), "{e}");
    }

    #[test]
    fn string_bytes_and_map_entries_are_bounded_as_reads_count_them() {
        let limits = weir_schema::ScriptLimitsSpec {
            max_string_size: weir_schema::units::SizeSpec(16),
            max_map_size: 2,
            ..Default::default()
        };
        let mut h = bounded(
            r#"fn process(r) {
                if r < 10 { list_push("seen", "abcdef"); emit(list_get("seen").len()); }
                else { map_put("by", `f${r % 3}`, r); emit(map_len("by")); }
            }"#,
            &limits,
        );
        let out = h.push(keyed(&ints(0..3))).expect("runs");
        assert_eq!(out.len(), 2, "12 bytes fit in 16, 18 do not");
        let e = &errors(&h)[0];
        assert!(
            e.contains("18 bytes of strings, more than `limits.max_string_size` (16 bytes)"),
            "{e}"
        );
        // Two entries fit; replacing one at the limit is fine; a third is refused.
        let out = h.push(keyed(&ints(10..14))).expect("runs");
        let lens: Vec<i64> = out
            .records
            .iter()
            .map(|d| d.as_int().expect("int"))
            .collect();
        assert_eq!(lens, [1, 2, 2], "f1, f2, f0 refused, f1 replaced");
        let e = &errors(&h)[1];
        assert!(e.contains(r#"map_put("by", "f0")"#), "{e}");
        assert!(
            e.contains("3 map entries, more than `limits.max_map_size` (2)"),
            "{e}"
        );
    }

    #[test]
    fn housekeeping_functions_keep_a_list_within_bounds() {
        let mut h = bounded(
            r#"fn process(r) {
                list_push("seen", r);
                if list_len("seen") > 3 { list_trim("seen", 3); }
                map_put("by", `k${r % 2}`, r);
                if r == 5 { emit(#{ popped: list_pop("seen"), left: list_get("seen"), keys: map_keys("by") }); }
            }"#,
            &weir_schema::ScriptLimitsSpec::default(),
        );
        let out = h.push(keyed(&ints(0..6))).expect("runs");
        assert_eq!(h.ctx.errors, 0, "{:?}", errors(&h));
        assert_eq!(
            excerpt(&out.records[0]),
            r#"{"keys":["k0","k1"],"left":[3,4],"popped":5}"#
        );
        let mut h = bounded(
            r#"fn process(r) { list_trim("seen", -1); }"#,
            &weir_schema::ScriptLimitsSpec::default(),
        );
        h.push(keyed(&ints(0..1))).expect("runs");
        assert!(
            errors(&h)[0].contains("cannot be negative"),
            "{:?}",
            errors(&h)
        );
    }

    #[test]
    fn emit_is_bounded_per_input_record_even_when_the_script_catches_it() {
        let mut h = bounded(
            r#"fn process(r) { for i in 0..r { try { emit(i); } catch { } } }"#,
            &weir_schema::ScriptLimitsSpec::default(),
        );
        let out = h.push(keyed(&ints(2..6))).expect("runs");
        assert_eq!(out.len(), 2 + 3, "4 and 5 are over the budget of 3");
        assert_eq!(h.ctx.errors, 2);
        let e = &errors(&h)[0];
        assert!(
            e.contains(
                "more than 3 records for one input record (`limits.max_outputs_per_record`)"
            ),
            "{e}"
        );
    }

    #[test]
    fn process_some_hands_the_output_over_in_steps() {
        let mut h = bounded(
            r#"fn process(r) { emit(r); emit(r); }"#,
            &weir_schema::ScriptLimitsSpec::default(),
        );
        let mut input = Pending::new(keyed(&ints(0..5)));
        let mut out = Batch::default();
        h.operator
            .process_some(&mut input, &mut out, 3, &mut h.ctx)
            .expect("runs");
        assert_eq!((out.len(), input.len()), (4, 3));
        let unkeyed = Pending::new(Batch::new(ints(0..2)));
        let e = h
            .operator
            .process_some(&mut { unkeyed }, &mut out, 3, &mut h.ctx)
            .expect_err("needs keys");
        assert!(e.to_string().contains("key_by"), "{e}");
    }
}
