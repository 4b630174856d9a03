//! `process` (keyed): Rhai `fn process(r)` with named keyed state (`state_get`, `list_push`,
//! `map_put`, ...) and `emit(record)`; optional `fn on_end(key)` per key at the end of a
//! bounded input, and optional `fn migrate(old)` (or `fn migrate(name, old)`) that rewrites
//! every value of every declared state after a savepoint restore.
//!
//! Keyed timers: a script that defines `fn on_timer(ts, kind)` may set and delete event- and
//! processing-time timers for the current key (`register_event_timer(t)`, ...). They live in
//! [`Timers`] (keyed state, so checkpoints, savepoints and rescaling carry them); event-time
//! timers fire in [`Operator::on_watermark`] once the watermark reaches them, processing-time
//! ones in [`Operator::on_processing_time`], earliest first, each with its key current (state
//! functions, `emit` and `key()` work as in `process`). After a restore the queue is rebuilt
//! ([`Operator::state_restored`]), and timers already due fire at the next watermark or
//! wake-up.
//!
//! State time-to-live: states declared with a `ttl` expire through [`Ttl`] on every access,
//! with processing time from `ctx.clock`; a sweep on a processing-time wake-up (every
//! shortest `ttl`) removes expired values that are never read again.

use std::sync::Arc;
use std::time::Duration;

use rhai::Dynamic;
use weir_schema::{StateKind, TtlUpdate};

use super::reduce::{migrate_keyed_state, require_keys, unkeyed};
use crate::base::error::Result;
use crate::base::message::{Batch, Pending};
use crate::element::{Operator, OperatorContext};
use crate::record::Key;
use crate::script::runtime::{
    ProcessContext, ScriptFn, TimerOp, discard_emitted, set_key, set_process_context,
    take_emitted, take_timer_ops, with_frame, with_frame_state,
};
use crate::state::timers::{TimeDomain, Timers};
use crate::state::ttl::{Ttl, TtlRule};
use crate::state::{END_CHUNK, EndCursor, RecordPrefetch, StateBackend, StateId, prefetch_ahead};

/// How many records ahead of the one it runs a `process` operator hints the state backend
/// that a key's state is next ([`StateBackend::prefetch`]): far enough ahead for the loads to
/// complete before that record runs, near enough for them to be still cached. This is the last
/// stage's distance ([`Reach::Contents`](crate::state::Reach)); the stages before it go two and
/// three times as far ([`prefetch_ahead`]). Measured on W4 (a million records over ten
/// thousand keys) with one stage: 2, 3 and 4 gained alike; 6 did worse.
pub(crate) const PREFETCH_AHEAD: usize = 4;

/// The `process` operator.
pub struct ProcessOperator {
    script: ScriptFn,
    declared: Vec<(String, StateKind)>,
    names: Vec<(String, StateId)>,
    /// Most records one call may `emit`.
    max_outputs: usize,
    /// Declared time-to-live by state name.
    ttl_declared: Vec<(String, Duration, TtlUpdate)>,
    /// The registered time-to-live rules (after `open`), when a state has one.
    ttl: Option<Arc<Ttl>>,
    /// When the next sweep of expired values is due (processing time).
    next_sweep: Option<i64>,
    /// The timers, when the script defines `fn on_timer(ts, kind)` (after `open`).
    timers: Option<Timers>,
    /// How far the end-of-input pass got.
    end: EndCursor,
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
            ttl_declared: Vec::new(),
            ttl: None,
            next_sweep: None,
            timers: None,
            end: EndCursor::default(),
        }
    }

    /// Gives declared states a time-to-live: `(state name, ttl, what renews it)`.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Vec<(String, Duration, TtlUpdate)>) -> Self {
        self.ttl_declared = ttl;
        self
    }

    /// The frame context of calls made at processing time `now`.
    fn context(&self, now: i64, ctx: &OperatorContext) -> ProcessContext {
        ProcessContext {
            now,
            watermark: ctx.watermark,
            ttl: self.ttl.clone(),
            timers: self.timers.is_some(),
        }
    }

    /// Applies the timers calls set or deleted.
    fn apply(&mut self, ops: Vec<TimerOp>, ctx: &mut OperatorContext) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let (Some(timers), Some(state)) = (self.timers.as_mut(), ctx.state.as_deref_mut()) else {
            return Ok(());
        };
        apply_ops(timers, state, ops)
    }

    /// Fires the timers of `domain` due at `upto`, each through `fn on_timer(ts, kind)` with
    /// its key current, appending what they emit to `out`.
    fn fire(
        &mut self,
        domain: TimeDomain,
        upto: i64,
        now: i64,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if self.timers.as_ref().is_none_or(|t| t.next(domain).is_none_or(|t| t > upto)) {
            return Ok(());
        }
        let cx = self.context(now, ctx);
        let Some(timers) = self.timers.as_mut() else {
            return Ok(());
        };
        let script = &mut self.script;
        let mut failures = Vec::new();
        let result = with_frame(&mut ctx.state, &self.names, self.max_outputs, || {
            set_process_context(cx);
            loop {
                let Some(due) = with_frame_state(|s| timers.pop_due(s, domain, upto)) else {
                    return Ok(());
                };
                let Some((time, key)) = due? else {
                    return Ok(());
                };
                set_key(Some(key.clone()));
                let kind = Dynamic::from(domain.name());
                let failed = match script.call("on_timer", (time, kind)) {
                    Ok(_) => take_emitted(out).err(),
                    Err(e) => {
                        discard_emitted();
                        Some(e)
                    }
                };
                let ops = take_timer_ops();
                if let Some(applied) = with_frame_state(|s| apply_ops(timers, s, ops)) {
                    applied?;
                }
                if let Some(e) = failed {
                    failures.push((timer_record(&key, time, domain), e));
                }
            }
        });
        for (r, e) in failures {
            ctx.record_failed(r, e)?;
        }
        result
    }
}

/// Sets and deletes timers as the calls asked, in order.
fn apply_ops(timers: &mut Timers, state: &mut dyn StateBackend, ops: Vec<TimerOp>) -> Result<()> {
    for op in ops {
        if op.set {
            timers.set(state, op.domain, &op.key, op.time)?;
        } else {
            timers.delete(state, op.domain, &op.key, op.time)?;
        }
    }
    Ok(())
}

/// What a failing `on_timer` call reports as its record: `{key, timer, kind}`.
fn timer_record(key: &Key, time: i64, domain: TimeDomain) -> Dynamic {
    let mut m = rhai::Map::new();
    m.insert("key".into(), key.to_dynamic());
    m.insert("timer".into(), Dynamic::from(time));
    m.insert("kind".into(), Dynamic::from(domain.name()));
    Dynamic::from_map(m)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Operator for ProcessOperator {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let state = ctx.state_mut()?;
        for (name, kind) in &self.declared {
            let id = state.register(name, *kind)?;
            self.names.push((name.clone(), id));
        }
        let rules = self
            .ttl_declared
            .iter()
            .filter_map(|(name, ttl, update)| {
                let (_, id) = self.names.iter().find(|(n, _)| n == name)?;
                Some(TtlRule {
                    state: *id,
                    name: name.clone(),
                    ttl_ms: millis(*ttl).max(1),
                    renew_on_read: *update == TtlUpdate::OnReadAndWrite,
                })
            })
            .collect();
        self.ttl = Ttl::register(state.as_mut(), rules)?.map(Arc::new);
        if self.script.defines("on_timer", 2) {
            self.timers = Some(Timers::register(state.as_mut())?);
        }
        if let Some(ttl) = &self.ttl {
            self.next_sweep = Some(ctx.clock.now_ms().saturating_add(ttl.sweep_interval()));
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

    /// Rebuilds the timer queue from the restored state.
    fn state_restored(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        if let Some(timers) = self.timers.as_mut() {
            timers.rebuild(ctx.state_mut()?.as_ref())?;
        }
        Ok(())
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
        let cx = self.context(ctx.clock.now_ms(), ctx);
        let script = &mut self.script;
        let records = &mut out.records;
        let prefetch = RecordPrefetch::new();
        let exact = ctx.keeps_failed_records();
        let ops = with_frame(&mut ctx.state, &self.names, self.max_outputs, || {
            set_process_context(cx);
            while records.len() < limit {
                if input.key_ahead(PREFETCH_AHEAD).is_some() {
                    with_frame_state(|state| {
                        prefetch_ahead(state, PREFETCH_AHEAD, |n| input.key_ahead(n));
                    });
                }
                prefetch.ahead(
                    input.record_ahead(2 * PREFETCH_AHEAD),
                    input.record_ahead(PREFETCH_AHEAD),
                );
                let Some((r, k)) = input.next_record() else {
                    break;
                };
                set_key(k);
                let original = exact.then(|| r.clone());
                let mut args = [r];
                let failed = match script.run_process("process", &mut args) {
                    Ok(()) => take_emitted(records).err(),
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
            take_timer_ops()
        });
        self.apply(ops, ctx)?;
        for (r, e) in failures {
            ctx.record_failed(r, e)?;
        }
        Ok(())
    }

    /// Fires the event-time timers the watermark reached, earliest first.
    fn on_watermark(
        &mut self,
        watermark: i64,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let now = ctx.clock.now_ms();
        self.fire(TimeDomain::Event, watermark, now, out, ctx)
    }

    fn next_processing_time(&self) -> Option<i64> {
        let timer = self
            .timers
            .as_ref()
            .and_then(|t| t.next(TimeDomain::Processing));
        match (timer, self.next_sweep) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fires the processing-time timers due at `now`, then removes expired state values when
    /// a sweep is due.
    fn on_processing_time(
        &mut self,
        now: i64,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        self.fire(TimeDomain::Processing, now, now, out, ctx)?;
        if let (Some(ttl), Some(due)) = (&self.ttl, self.next_sweep)
            && now >= due
        {
            let removed = ttl.sweep(ctx.state_mut()?.as_mut(), now)?;
            if removed > 0 {
                tracing::debug!(operator = %ctx.operator, subtask = ctx.subtask, removed, "Removed expired state values.");
            }
            self.next_sweep = Some(now.saturating_add(ttl.sweep_interval()));
        }
        Ok(())
    }

    /// Calls `fn on_end(key)` for the keys of the next key groups, until about
    /// [`END_CHUNK`] records were emitted ([`EndCursor`]).
    fn on_end(&mut self, out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        if !self.script.defines("on_end", 1) {
            return Ok(());
        }
        let now = ctx.clock.now_ms();
        let ids: Vec<StateId> = self.names.iter().map(|(_, id)| *id).collect();
        let mut failures = Vec::new();
        let cx = self.context(now, ctx);
        let script = &mut self.script;
        let cursor = &mut self.end;
        let ttl = self.ttl.clone();
        let start = out.len();
        let ops = with_frame(&mut ctx.state, &self.names, self.max_outputs, || {
            set_process_context(cx);
            while out.len() - start < END_CHUNK {
                let keys = with_frame_state(|state| {
                    cursor.next_keys(state, &ids, |state, id, k| match &ttl {
                        // A key whose only values expired holds no state any more.
                        Some(ttl) => Ok(!ttl.is_expired(state, id, k, now)?),
                        None => Ok(true),
                    })
                });
                let keys: Option<Vec<Key>> = match keys {
                    Some(Ok(keys)) => keys,
                    Some(Err(e)) => return Err(e),
                    None => None,
                };
                let Some(keys) = keys else {
                    break;
                };
                for k in keys {
                    let kd = k.to_dynamic();
                    set_key(Some(k));
                    // As a record's `process`: natively when the body allows.
                    let failed = match script.run_process("on_end", &mut [kd.clone()]) {
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
            }
            Ok(take_timer_ops())
        })?;
        self.apply(ops, ctx)?;
        for (r, e) in failures {
            ctx.record_failed(r, e)?;
        }
        Ok(())
    }

    fn end_pending(&self) -> bool {
        self.end.pending()
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
            times: Vec::new(),
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
            times: Vec::new(),
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

    /// W4's logic (`shared/bench/w4`) as written with `state_get`/`state_set`, a sorted list
    /// rebuilt with `state_clear` and `list_push`, and `map_get`/`map_put` ...
    const LONG_FORM: &str = r#"
        fn process(r) {
            let s = state_get("sum");
            if s == () { s = 0; }
            let c = state_get("count");
            if c == () { c = 0; }
            state_set("sum", s + r.amount);
            state_set("count", c + 1);
            let top = list_get("top");
            top.push(r.amount);
            top.sort(|a, b| b - a);
            if top.len() > 5 { top.pop(); }
            state_clear("top");
            for a in top { list_push("top", a); }
            let d = `${(r.amount - 1) / 10}`;
            let n = map_get("deciles", d);
            if n == () { n = 0; }
            map_put("deciles", d, n + 1);
        }
        fn on_end(k) {
            emit(#{key: k, sum: state_get("sum"), count: state_get("count"),
                   top: list_get("top"), deciles: state_get("deciles")});
        }
    "#;

    /// ... and with the read-modify-write helpers.
    const HELPERS: &str = r#"
        fn process(r) {
            state_add("sum", r.amount);
            state_add("count", 1);
            list_top("top", r.amount, 5);
            map_add("deciles", `${(r.amount - 1) / 10}`, 1);
        }
        fn on_end(k) {
            emit(#{key: k, sum: state_get("sum"), count: state_get("count"),
                   top: list_get("top"), deciles: state_get("deciles")});
        }
    "#;

    /// Runs `text` over `records` (`(key, amount)`) on `state` and returns what `on_end`
    /// emits, sorted.
    fn w4_on(text: &str, records: &[(String, i64)], state: Box<dyn StateBackend>) -> Vec<String> {
        let declared = vec![
            ("sum".to_owned(), StateKind::Value),
            ("count".to_owned(), StateKind::Value),
            ("top".to_owned(), StateKind::List),
            ("deciles".to_owned(), StateKind::Map),
        ];
        let mut ctx = keyed_ctx();
        ctx.state = Some(state);
        let op = ProcessOperator::new(script(text), declared, 10);
        let mut h = Harness::new(Box::new(op), ctx).expect("opens");
        for chunk in records.chunks(7) {
            h.push(Batch {
                times: Vec::new(),
                records: chunk
                    .iter()
                    .map(|(_, a)| {
                        let mut m = rhai::Map::new();
                        m.insert("amount".into(), Dynamic::from(*a));
                        Dynamic::from_map(m)
                    })
                    .collect(),
                keys: chunk.iter().map(|(k, _)| key(k)).collect(),
            })
            .expect("runs");
        }
        assert_eq!(h.ctx.errors, 0);
        let mut out: Vec<String> = h.finish().expect("ends").iter().map(excerpt).collect();
        out.sort();
        out
    }

    #[test]
    fn read_modify_write_helpers_agree_with_the_long_forms() {
        let mut z: u64 = 7;
        let records: Vec<(String, i64)> = (0..600)
            .map(|_| {
                z = z.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (format!("k{}", (z >> 33) % 23), 1 + ((z >> 45) % 100) as i64)
            })
            .collect();
        let memory = || -> Box<dyn StateBackend> {
            Box::new(crate::state::MemoryBackend::new(128, KeyGroupRange::all(128)))
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let rocksdb = || -> Box<dyn StateBackend> {
            let mut db = crate::state::RocksdbBackend::open(
                dir.path(),
                128,
                KeyGroupRange::all(128),
                &weir_schema::RocksdbSpec::default(),
            )
            .expect("rocksdb");
            // Every access goes through the database.
            db.set_cache_capacity(1).expect("cache");
            Box::new(db)
        };
        let expected = w4_on(LONG_FORM, &records, memory());
        assert_eq!(expected.len(), 23);
        assert!(expected[0].contains(r#""top":["#), "{}", expected[0]);
        assert_eq!(w4_on(HELPERS, &records, memory()), expected, "memory");
        assert_eq!(w4_on(HELPERS, &records, rocksdb()), expected, "rocksdb");
        assert_eq!(w4_on(LONG_FORM, &records, rocksdb()), expected, "rocksdb, long form");
    }

    #[test]
    fn read_modify_write_helpers_fail_the_record_not_the_state() {
        let limits = weir_schema::ScriptLimitsSpec {
            max_array_size: 3,
            max_map_size: 2,
            ..Default::default()
        };
        let cases = [
            (r#"state_set("count", "x"); state_add("count", 1)"#, "cannot add an int to the stored string"),
            (r#"state_set("count", 9223372036854775807); state_add("count", 1)"#, "overflows"),
            (r#"state_add("count", "1")"#, "must be an int or a float"),
            (r#"state_add("count", 1.5); state_add("count", 1)"#, "cannot add an int to the stored f64"),
            (r#"list_top("seen", 1, -1)"#, "cannot be negative"),
            (r#"list_top("seen", 1, 3); list_top("seen", "a", 3)"#, "cannot rank string against i64"),
            (r#"list_top("seen", 1, 9); list_top("seen", 2, 9); list_top("seen", 3, 9); list_top("seen", 4, 9)"#, "more than `limits.max_array_size` (3)"),
            (r#"map_add("by", "a", 1); map_add("by", "b", 1); map_add("by", "c", 1)"#, "more than `limits.max_map_size` (2)"),
            (r#"map_put("by", "a", "x"); map_add("by", "a", 1)"#, "cannot add an int to the stored string"),
        ];
        for (body, wanted) in cases {
            let mut h = bounded(&format!("fn process(r) {{ {body}; }}"), &limits);
            h.push(keyed(&ints(0..1))).expect("runs");
            let e = errors(&h);
            assert!(e.len() == 1 && e[0].contains(wanted), "{body}: {e:?}");
        }
        // A refused write leaves the state as it was.
        let mut h = bounded(
            r#"fn process(r) {
                if r == 0 { list_top("seen", 5, 2); list_top("seen", 7, 2); }
                if r == 1 { list_top("seen", "z", 2); }
                if r == 2 { emit([list_top("seen", 6, 2), list_get("seen")]); list_set("seen", []); emit(list_len("seen")); }
            }"#,
            &weir_schema::ScriptLimitsSpec::default(),
        );
        let out = h.push(keyed(&ints(0..3))).expect("runs");
        assert_eq!(h.ctx.errors, 1);
        let shown: Vec<String> = out.records.iter().map(excerpt).collect();
        assert_eq!(shown, ["[true,[7,6]]", "0"]);
    }

    /// Timers, `now()`, `watermark()` and state time-to-live, on the memory and the rocksdb
    /// backend, with a manual clock; the watermark and wake-ups are driven by hand as the task
    /// loop drives them.
    mod time {
        use super::*;
        use crate::base::clock::Clock;
        use crate::base::message::WATERMARK_END;
        use crate::checkpoint::{MemoryStore, FileRef};
        use crate::element::OperatorContext;
        use crate::state::{MemoryBackend, RocksdbBackend, SnapshotTarget, StateBackend};

        const MAX: u32 = 32;
        /// The manual clock's start (epoch milliseconds).
        const T0: i64 = 1_700_000_000_000;

        type Backends<'a> = dyn Fn(KeyGroupRange) -> Box<dyn StateBackend> + 'a;

        /// Runs `case` on a memory backend factory, then on a rocksdb one.
        fn on_every_backend(case: impl Fn(&Backends<'_>)) {
            case(&|range| Box::new(MemoryBackend::new(MAX, range)));
            let dir = tempfile::tempdir().expect("tempdir");
            let spec = weir_schema::RocksdbSpec {
                block_cache_size: weir_schema::units::SizeSpec::mib(8),
                write_buffer_size: weir_schema::units::SizeSpec::mib(4),
                ..Default::default()
            };
            case(&|range| {
                Box::new(RocksdbBackend::open(dir.path(), MAX, range, &spec).expect("rocksdb"))
            });
        }

        /// A process running `text` on `state` for the key groups `range`, its clock `clock`.
        fn timed(
            text: &str,
            ttl: Vec<(String, Duration, TtlUpdate)>,
            state: Box<dyn StateBackend>,
            range: KeyGroupRange,
            clock: &Clock,
        ) -> Harness {
            let op = ProcessOperator::new(script(text), declared(), 100).with_ttl(ttl);
            let mut ctx = OperatorContext::standalone("p", "timed", MAX);
            ctx.key_groups = range;
            ctx.state = Some(state);
            ctx.clock = clock.clone();
            ctx.on_error = crate::element::ErrorPolicy::DeadLetter;
            Harness::new(Box::new(op), ctx).expect("opens")
        }

        fn pairs(items: &[(&str, i64)]) -> Batch {
            Batch {
                times: Vec::new(),
                records: items.iter().map(|(_, n)| Dynamic::from(*n)).collect(),
                keys: items.iter().map(|(k, _)| key(k)).collect(),
            }
        }

        fn shown(out: &[Dynamic]) -> Vec<String> {
            out.iter()
                .map(|d| d.clone().into_string().unwrap_or_else(|_| excerpt(d)))
                .collect()
        }

        fn push(h: &mut Harness, items: &[(&str, i64)]) -> Vec<String> {
            shown(&h.push(pairs(items)).expect("runs").records)
        }

        /// The watermark advances to `wm`, as the task loop reports it.
        fn watermark(h: &mut Harness, wm: i64) -> Vec<String> {
            h.ctx.watermark = wm;
            let mut out = Vec::new();
            h.operator.on_watermark(wm, &mut out, &mut h.ctx).expect("fires");
            shown(&out)
        }

        /// The task wakes at `now` on the clock `clock`.
        fn wake(h: &mut Harness, clock: &Clock, now: i64) -> Vec<String> {
            clock.set(now);
            let mut out = Vec::new();
            h.operator
                .on_processing_time(now, &mut out, &mut h.ctx)
                .expect("fires");
            shown(&out)
        }

        fn dead_letters(h: &Harness) -> Vec<String> {
            h.ctx.dead_letters.iter().map(excerpt).collect()
        }

        const EVENT: &str = r#"
            fn process(r) {
                let c = state_get("count");
                state_set("count", if c == () { 1 } else { c + 1 });
                register_event_timer(r);
                if r == 25 { delete_event_timer(25); }
            }
            fn on_timer(ts, kind) {
                emit(`${key()} ${kind} ${ts} count=${state_get("count")} wm=${watermark()}`);
                if ts == 10 { register_event_timer(12); }
            }
        "#;

        #[test]
        fn event_timers_fire_in_time_order_with_their_key_current() {
            on_every_backend(|backend| {
                let clock = Clock::manual(T0);
                let all = KeyGroupRange::all(MAX);
                let mut h = timed(EVENT, Vec::new(), backend(all), all, &clock);
                assert!(push(&mut h, &[("u", 10), ("v", 30), ("u", 20), ("v", 25), ("v", 20)]).is_empty());
                assert_eq!(h.operator.next_processing_time(), None, "no processing timers");
                assert_eq!(
                    watermark(&mut h, 15),
                    [
                        "u event 10 count=2 wm=15",
                        // Set by the timer at 10, already due: fires in the same advance.
                        "u event 12 count=2 wm=15",
                    ]
                );
                let mut at_20 = watermark(&mut h, 20);
                at_20.sort();
                assert_eq!(at_20, ["u event 20 count=2 wm=20", "v event 20 count=3 wm=20"]);
                // A timer set behind the watermark fires at the next advance.
                assert!(push(&mut h, &[("u", 5)]).is_empty());
                assert_eq!(watermark(&mut h, 21), ["u event 5 count=3 wm=21"]);
                assert!(watermark(&mut h, 29).is_empty(), "the deleted timer at 25 never fires");
                assert_eq!(
                    watermark(&mut h, WATERMARK_END),
                    [format!("v event 30 count=3 wm={WATERMARK_END}")]
                );
                assert!(watermark(&mut h, WATERMARK_END).is_empty(), "each fires once");
            });
        }

        const PROCESSING: &str = r#"
            fn process(r) { register_processing_timer(now() + r); emit(`${key()} now=${now() - 1700000000000}`); }
            fn on_timer(ts, kind) {
                emit(`${key()} ${kind} ${ts - 1700000000000} at=${now() - 1700000000000} wm=${watermark()}`);
            }
        "#;

        #[test]
        fn processing_timers_fire_on_wake_ups_and_report_the_next_one() {
            let clock = Clock::manual(T0);
            let all = KeyGroupRange::all(MAX);
            let mut h = timed(PROCESSING, Vec::new(), Box::new(MemoryBackend::new(MAX, all)), all, &clock);
            assert_eq!(push(&mut h, &[("u", 100), ("v", 50)]), ["u now=0", "v now=0"]);
            clock.advance(10);
            assert_eq!(push(&mut h, &[("u", 90)]), ["u now=10"], "now() follows the clock");
            assert_eq!(h.operator.next_processing_time(), Some(T0 + 50));
            assert_eq!(wake(&mut h, &clock, T0 + 60), [format!("v processing 50 at=60 wm={}", i64::MIN)]);
            assert_eq!(h.operator.next_processing_time(), Some(T0 + 100));
            assert!(watermark(&mut h, WATERMARK_END).is_empty(), "the watermark fires no processing timer");
            // Both of u's timers (100 and 10 + 90 = 100) are one: one key, one time.
            assert_eq!(wake(&mut h, &clock, T0 + 150), [format!("u processing 100 at=150 wm={WATERMARK_END}")]);
            assert_eq!(h.operator.next_processing_time(), None);
        }

        /// Checkpoints the backend of `h` as a task does and returns the files written.
        fn checkpoint(h: &mut Harness, store: &MemoryStore) -> Vec<FileRef> {
            let state = h.ctx.state_mut().expect("state");
            let pending = state.checkpoint(1).expect("checkpoint");
            let target = SnapshotTarget {
                checkpoint: 1,
                private_prefix: "chk-1/timed-0".to_owned(),
                shared_prefix: "shared/timed-0".to_owned(),
            };
            pending.write(store, &target).expect("write")
        }

        const BOTH: &str = r#"
            fn process(r) {
                list_push("seen", r);
                register_event_timer(r);
                register_processing_timer(1700000000000 + r);
            }
            fn on_timer(ts, kind) { emit(`${kind} ${key()} ${ts % 1000000} ${list_len("seen")}`); }
        "#;

        #[test]
        fn timers_survive_restore_and_rescale_and_due_ones_fire_first() {
            on_every_backend(|backend| {
                let clock = Clock::manual(T0);
                let all = KeyGroupRange::all(MAX);
                let mut h = timed(BOTH, Vec::new(), backend(all), all, &clock);
                let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
                let records: Vec<(&str, i64)> =
                    keys.iter().enumerate().map(|(i, k)| (k.as_str(), 10 * i as i64)).collect();
                push(&mut h, &records);
                assert_eq!(watermark(&mut h, 45).len(), 5, "k0..k4 fire before the checkpoint");
                let store = MemoryStore::new();
                let files = checkpoint(&mut h, &store);
                // After the barrier: not in the checkpoint.
                push(&mut h, &[("late", 1)]);

                // Restored into three subtasks, later: every processing timer is due.
                clock.set(T0 + 1_000);
                let (mut event, mut processing) = (Vec::new(), Vec::new());
                for sub in 0..3 {
                    let range = KeyGroupRange::for_subtask(MAX, 3, sub);
                    let mut r = timed(BOTH, Vec::new(), backend(range), range, &clock);
                    r.ctx.state_mut().expect("state").restore_files(&store, &files).expect("restore");
                    r.operator.state_restored(&mut r.ctx).expect("rebuilt");
                    let next = r.operator.next_processing_time();
                    if let Some(next) = next {
                        assert!(next <= T0 + 1_000, "due already: the next wake-up is immediate");
                    }
                    let fired = wake(&mut r, &clock, T0 + 1_000);
                    assert_eq!(fired.len(), usize::from(next.is_some()) * fired.len());
                    for line in &fired {
                        let k = line.split(' ').nth(1).expect("key");
                        assert!(range.contains(key(k).key_group(MAX)), "{line} in subtask {sub}");
                    }
                    processing.extend(fired);
                    // Event timers already due fire at the next watermark, in time order.
                    let fired = watermark(&mut r, 95);
                    let times: Vec<i64> = fired
                        .iter()
                        .map(|l| l.split(' ').nth(2).expect("time").parse().expect("int"))
                        .collect();
                    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{fired:?}");
                    event.extend(fired);
                    event.extend(watermark(&mut r, WATERMARK_END));
                    assert_eq!(r.operator.next_processing_time(), None);
                }
                event.sort();
                processing.sort();
                let mut expected: Vec<String> =
                    (5..20).map(|i| format!("event k{i} {} 1", 10 * i)).collect();
                expected.sort();
                assert_eq!(event, expected, "fired ones stay fired; the rest fire once");
                let mut expected: Vec<String> =
                    (0..20).map(|i| format!("processing k{i} {} 1", 10 * i)).collect();
                expected.sort();
                assert_eq!(processing, expected);
            });
        }

        fn ttls() -> Vec<(String, Duration, TtlUpdate)> {
            vec![
                ("count".to_owned(), Duration::from_millis(1_000), TtlUpdate::OnWrite),
                ("seen".to_owned(), Duration::from_millis(1_000), TtlUpdate::OnReadAndWrite),
                ("by".to_owned(), Duration::from_millis(5_000), TtlUpdate::OnWrite),
            ]
        }

        /// `0` reads the three states; any other record writes them.
        const TTL: &str = r#"
            fn process(r) {
                if r == 0 {
                    let c = state_get("count");
                    if c == () { c = "-"; }
                    emit(`${c} ${list_len("seen")} ${map_len("by")}`);
                    return;
                }
                state_set("count", r);
                list_push("seen", r);
                map_put("by", `f${r}`, r);
            }
            fn on_end(key) { emit(`end ${key}`); }
        "#;

        #[test]
        fn expired_values_read_as_absent_and_renew_as_declared() {
            on_every_backend(|backend| {
                let clock = Clock::manual(T0);
                let all = KeyGroupRange::all(MAX);
                let mut h = timed(TTL, ttls(), backend(all), all, &clock);
                push(&mut h, &[("u", 7)]);
                clock.set(T0 + 900);
                assert_eq!(push(&mut h, &[("u", 0)]), ["7 1 1"], "all alive; the read renews `seen`");
                clock.set(T0 + 1_000);
                assert_eq!(push(&mut h, &[("u", 0)]), ["- 1 1"], "`count` expired (on_write)");
                clock.set(T0 + 1_999);
                assert_eq!(push(&mut h, &[("u", 0)]), ["- 1 1"], "renewed by each read");
                clock.set(T0 + 3_000);
                assert_eq!(push(&mut h, &[("u", 0)]), ["- 0 1"]);
                clock.set(T0 + 4_900);
                push(&mut h, &[("v", 3)]);
                clock.set(T0 + 5_000);
                assert_eq!(push(&mut h, &[("u", 0), ("v", 0)]), ["- 0 0", "3 1 1"]);
                // A write starts over.
                push(&mut h, &[("u", 8)]);
                assert_eq!(push(&mut h, &[("u", 0)]), ["8 1 1"]);
                // At the end only keys holding live values get `on_end`.
                clock.set(T0 + 10_500);
                push(&mut h, &[("w", 1)]);
                assert_eq!(shown(&h.finish().expect("ends")), ["end w"]);
            });
        }

        #[test]
        fn expiry_holds_across_a_restore() {
            on_every_backend(|backend| {
                let clock = Clock::manual(T0);
                let all = KeyGroupRange::all(MAX);
                let mut h = timed(TTL, ttls(), backend(all), all, &clock);
                push(&mut h, &[("u", 7), ("v", 9)]);
                let store = MemoryStore::new();
                let files = checkpoint(&mut h, &store);
                // Restored 1.5 s later, rescaled to two subtasks.
                clock.set(T0 + 1_500);
                let mut seen = Vec::new();
                for sub in 0..2 {
                    let range = KeyGroupRange::for_subtask(MAX, 2, sub);
                    let mut r = timed(TTL, ttls(), backend(range), range, &clock);
                    r.ctx.state_mut().expect("state").restore_files(&store, &files).expect("restore");
                    r.operator.state_restored(&mut r.ctx).expect("restored");
                    for k in ["u", "v"] {
                        if range.contains(key(k).key_group(MAX)) {
                            seen.extend(push(&mut r, &[(k, 0)]));
                        }
                    }
                }
                assert_eq!(seen, ["- 0 1", "- 0 1"], "`count` and `seen` expired, `by` lives");
            });
        }

        #[test]
        fn sweeps_keep_the_state_bounded() {
            on_every_backend(|backend| {
                let clock = Clock::manual(T0);
                let all = KeyGroupRange::all(MAX);
                let mut h = timed(TTL, ttls(), backend(all), all, &clock);
                let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
                let records: Vec<(&str, i64)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
                push(&mut h, &records);
                assert_eq!(h.operator.next_processing_time(), Some(T0 + 1_000), "the first sweep");
                clock.set(T0 + 5_500);
                push(&mut h, &[("fresh", 2)]);
                wake(&mut h, &clock, T0 + 5_500);
                assert_eq!(h.operator.next_processing_time(), Some(T0 + 6_500));
                let state = h.ctx.state_mut().expect("state");
                for (name, kind) in declared() {
                    let id = state.register(&name, kind).expect("id");
                    let left: Vec<String> =
                        state.keys(id).expect("keys").iter().map(|k| excerpt(&k.to_dynamic())).collect();
                    assert_eq!(left, [r#""fresh""#], "{name}: only the live key is left");
                }
                let index = state.register(crate::state::ttl::STATE, StateKind::Map).expect("id");
                assert_eq!(state.keys(index).expect("keys").len(), 1, "expiry times go too");
            });
        }

        #[test]
        fn timer_functions_need_on_timer_and_failures_name_the_timer() {
            let clock = Clock::manual(T0);
            let all = KeyGroupRange::all(MAX);
            let mut h = timed(
                "fn process(r) { register_event_timer(r); }",
                Vec::new(),
                Box::new(MemoryBackend::new(MAX, all)),
                all,
                &clock,
            );
            push(&mut h, &[("u", 1)]);
            let errors = dead_letters(&h);
            assert!(errors[0].contains("defines no `fn on_timer(ts, kind)`"), "{errors:?}");

            let mut h = timed(
                r#"fn process(r) { register_event_timer(r); }
                   fn on_timer(ts, kind) { if ts == 2 { throw "boom"; } emit(ts); }"#,
                Vec::new(),
                Box::new(MemoryBackend::new(MAX, all)),
                all,
                &clock,
            );
            push(&mut h, &[("u", 1), ("u", 2), ("u", 3)]);
            assert_eq!(watermark(&mut h, 10), ["1", "3"], "a failing timer does not stop the rest");
            assert_eq!(h.ctx.dead_letters.len(), 1);
            let letter = h.ctx.dead_letters[0].read_lock::<rhai::Map>().expect("a map").clone();
            assert_eq!(excerpt(&letter["record"]), r#"{"key":"u","kind":"event","timer":2}"#);
            assert!(letter["error"].to_string().contains("boom"), "{letter:?}");
        }

        #[test]
        fn now_and_timers_are_for_process_scripts_only() {
            let mut map = Harness::new(
                Box::new(crate::operators::map::MapOperator::new(script("fn map(r) { now() }"))),
                {
                    let mut c = OperatorContext::standalone("p", "m", MAX);
                    c.on_error = crate::element::ErrorPolicy::DeadLetter;
                    c
                },
            )
            .expect("opens");
            map.push(Batch::new(vec![Dynamic::from(1_i64)])).expect("runs");
            let errors = dead_letters(&map);
            assert!(errors[0].contains("only available in a `process` operator"), "{errors:?}");
        }
    }
}
