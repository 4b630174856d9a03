//! `aggregate` (keyed): built-in `sum`/`count`/`min`/`max`/`avg` over field paths at native
//! speed (the per-key accumulator is updated in place in the state backend), or a Rhai
//! script with `fn init()`, `fn add(acc, r)` and optional `fn finish(acc)` (and optional
//! `fn migrate(old)` for the accumulators after a savepoint restore). Emits
//! `{<key_field>: key, <as>: value, ...}` per `emit`.
//!
//! Also home of [`Accumulator`], the accumulator logic (built-ins or Rhai `init/add/finish`,
//! plus `merge` for session windows) that `window` shares.

use std::cmp::Ordering;

use rhai::{Array, Dynamic, Map};
use weir_schema::{AggregateFunction, AggregationSpec, EmitMode, StateKind};

use super::reduce::{ACC, keyed_output, migrate_keyed_state, require_keys};
use crate::base::error::{Result, RunError};
use crate::base::message::Batch;
use crate::element::{ErrorPolicy, Operator, OperatorContext};
use crate::record::{FieldPath, Key};
use crate::script::runtime::ScriptFn;
use crate::operators::process::PREFETCH_AHEAD;
use crate::state::{END_CHUNK, EndCursor, StateId, RecordPrefetch};

/// One built-in aggregation.
#[derive(Clone, Debug)]
pub struct Aggregation {
    function: AggregateFunction,
    field: Option<FieldPath>,
    output: String,
}

impl Aggregation {
    /// From its spec.
    pub fn from_spec(spec: &AggregationSpec) -> Self {
        Self {
            function: spec.function,
            field: spec.field.as_deref().map(FieldPath::new),
            output: spec.output_name(),
        }
    }

    fn function_name(&self) -> &'static str {
        match self.function {
            AggregateFunction::Sum => "sum",
            AggregateFunction::Count => "count",
            AggregateFunction::Min => "min",
            AggregateFunction::Max => "max",
            AggregateFunction::Avg => "avg",
        }
    }

    fn init(&self) -> Dynamic {
        match self.function {
            AggregateFunction::Sum | AggregateFunction::Count => Dynamic::from(0_i64),
            AggregateFunction::Min | AggregateFunction::Max => Dynamic::UNIT,
            AggregateFunction::Avg => {
                Dynamic::from_array(vec![Dynamic::from(0.0_f64), Dynamic::from(0_i64)])
            }
        }
    }

    /// The output field's name.
    pub(crate) fn output_name(&self) -> &str {
        &self.output
    }

    /// The output value of accumulator slot `acc`.
    pub(crate) fn result(&self, acc: &Dynamic) -> Dynamic {
        match self.function {
            AggregateFunction::Avg => {
                let Ok(pair) = acc.as_array_ref() else {
                    return Dynamic::UNIT;
                };
                let (sum, n) = (
                    pair[0].as_float().unwrap_or(0.0),
                    pair[1].as_int().unwrap_or(0),
                );
                if n == 0 {
                    Dynamic::UNIT
                } else {
                    Dynamic::from(sum / n as f64)
                }
            }
            _ => acc.clone(),
        }
    }
}

fn number(v: &Dynamic) -> Option<f64> {
    v.as_int().map(|i| i as f64).or_else(|_| v.as_float()).ok()
}

fn compare(a: &Dynamic, b: &Dynamic) -> Option<Ordering> {
    if let (Some(x), Some(y)) = (number(a), number(b)) {
        return x.partial_cmp(&y);
    }
    match (a.as_immutable_string_ref(), b.as_immutable_string_ref()) {
        (Ok(x), Ok(y)) => Some(x.as_str().cmp(y.as_str())),
        _ => None,
    }
}

fn add_into(acc: &mut Dynamic, v: &Dynamic) {
    match (acc.as_int(), v.as_int()) {
        (Ok(a), Ok(b)) if a.checked_add(b).is_some() => *acc = Dynamic::from(a + b),
        _ => *acc = Dynamic::from(number(acc).unwrap_or(0.0) + number(v).unwrap_or(0.0)),
    }
}

/// The scripted form's functions.
pub struct ScriptAggregate {
    script: ScriptFn,
    has_finish: bool,
}

/// How a keyed accumulator is built, updated and turned into output: the built-in
/// aggregations, or a Rhai script with `fn init()`, `fn add(acc, r)`, optional
/// `fn finish(acc)` (and `fn merge(a, b)` where accumulators merge, as session windows do).
pub enum Accumulator {
    /// Built-in aggregations; the accumulator is an array with one slot per aggregation.
    Builtin(Vec<Aggregation>),
    /// A Rhai accumulator.
    Script(Box<ScriptAggregate>),
}

use Accumulator as Kind;

impl Accumulator {
    /// The scripted form.
    pub fn scripted(script: ScriptFn) -> Self {
        let has_finish = script.defines("finish", 1);
        Self::Script(Box::new(ScriptAggregate { script, has_finish }))
    }

    /// The script of the scripted form (`None` for built-ins).
    pub(crate) fn script_mut(&mut self) -> Option<&mut ScriptFn> {
        match self {
            Self::Builtin(_) => None,
            Self::Script(s) => Some(&mut s.script),
        }
    }

    /// The output record of accumulator `acc` under `key`: `{<key_field>: key, <as>: value,
    /// ...}` for built-ins, `{<key_field>: key, ...finish(acc)}` for a script (a map).
    ///
    /// # Errors
    /// A failing `finish`.
    pub fn output(
        &mut self,
        key_field: &str,
        key: &Key,
        acc: &Dynamic,
    ) -> std::result::Result<Dynamic, String> {
        AggregateOperator::output(self, key_field, key, acc)
    }

    /// Reads and checks the aggregated fields of `r` into `values` (built-ins; a script
    /// reads the record itself, so this does nothing there).
    ///
    /// # Errors
    /// As [`AggregateOperator::extract`]: a missing or ill-typed field.
    pub fn extract(&self, r: &Dynamic, values: &mut Vec<Dynamic>) -> std::result::Result<(), String> {
        match self {
            Self::Builtin(aggs) => AggregateOperator::extract(aggs, r, values),
            Self::Script(_) => Ok(()),
        }
    }

    /// Adds one record to the accumulator in `slot` (`None`: start from `init`). Built-ins
    /// take the `values` [`extract`](Self::extract) read; a script takes the record in
    /// `args[1]` (by value, handed back there) with `args[0]` as scratch. Under
    /// `keep_backup` a failing `add` leaves `slot` as it was and hands the record back as it
    /// came (copies are made only when Rhai runs the body, see `ScriptFn::invoke_keeping`);
    /// otherwise `slot` may be emptied.
    ///
    /// # Errors
    /// A failing `init` or `add`.
    pub fn add(
        &mut self,
        slot: &mut Option<Dynamic>,
        values: &[Dynamic],
        args: &mut [Dynamic; 2],
        keep_backup: bool,
    ) -> std::result::Result<(), String> {
        match self {
            Self::Builtin(aggs) => {
                apply(aggs, values, slot);
                Ok(())
            }
            Self::Script(s) => {
                args[0] = match slot.take() {
                    Some(a) => a,
                    None => s.script.call("init", ())?,
                };
                let result = if keep_backup {
                    s.script.invoke_keeping("add", args)
                } else {
                    s.script.invoke("add", args)
                };
                match result {
                    Ok(new) => {
                        *slot = Some(new);
                        Ok(())
                    }
                    Err(e) => {
                        // Kept: the accumulator as it was before the call.
                        *slot = keep_backup.then(|| std::mem::take(&mut args[0]));
                        Err(e)
                    }
                }
            }
        }
    }

    /// Merges accumulator `b` into `a` (session windows): built-ins combine slot by slot
    /// (sums and counts add, min/max compare, averages add their sums and counts); a script
    /// calls `fn merge(a, b)`.
    ///
    /// # Errors
    /// A script without `merge` (validation requires it), or a failing `merge`.
    pub fn merge(&mut self, a: Dynamic, b: Dynamic) -> std::result::Result<Dynamic, String> {
        match self {
            Self::Builtin(aggs) => {
                let mut a = a;
                if let (Ok(mut xs), Ok(ys)) = (a.as_array_mut(), b.as_array_ref()) {
                    for ((agg, x), y) in aggs.iter().zip(xs.iter_mut()).zip(ys.iter()) {
                        merge_slot(agg.function, x, y);
                    }
                }
                Ok(a)
            }
            Self::Script(s) => s.script.call("merge", (a, b)),
        }
    }
}

/// Folds built-in slot `y` into `x`.
fn merge_slot(function: AggregateFunction, x: &mut Dynamic, y: &Dynamic) {
    match function {
        AggregateFunction::Count => {
            *x = Dynamic::from(x.as_int().unwrap_or(0) + y.as_int().unwrap_or(0));
        }
        _ if y.is_unit() => {}
        _ if x.is_unit() => *x = y.clone(),
        AggregateFunction::Sum => add_into(x, y),
        AggregateFunction::Min | AggregateFunction::Max => {
            let better = if function == AggregateFunction::Min {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            if compare(y, x) == Some(better) {
                *x = y.clone();
            }
        }
        AggregateFunction::Avg => {
            let (Ok(mut p), Ok(q)) = (x.as_array_mut(), y.as_array_ref()) else {
                return;
            };
            let sum = p[0].as_float().unwrap_or(0.0) + q[0].as_float().unwrap_or(0.0);
            let n = p[1].as_int().unwrap_or(0) + q[1].as_int().unwrap_or(0);
            p[0] = Dynamic::from(sum);
            p[1] = Dynamic::from(n);
        }
    }
}

/// The `aggregate` operator.
pub struct AggregateOperator {
    kind: Kind,
    emit: EmitMode,
    key_field: String,
    state: Option<StateId>,
    values: Vec<Dynamic>,
    /// How far the end-of-input pass got (`emit: final`).
    end: EndCursor,
}

impl AggregateOperator {
    /// A built-in aggregate.
    pub fn builtin(aggregations: Vec<Aggregation>, emit: EmitMode, key_field: String) -> Self {
        Self {
            kind: Kind::Builtin(aggregations),
            emit,
            key_field,
            state: None,
            values: Vec::new(),
            end: EndCursor::default(),
        }
    }

    /// A scripted aggregate.
    pub fn scripted(script: ScriptFn, emit: EmitMode, key_field: String) -> Self {
        Self {
            kind: Accumulator::scripted(script),
            emit,
            key_field,
            state: None,
            values: Vec::new(),
            end: EndCursor::default(),
        }
    }

    fn output(
        kind: &mut Kind,
        key_field: &str,
        key: &Key,
        acc: &Dynamic,
    ) -> std::result::Result<Dynamic, String> {
        match kind {
            Kind::Builtin(aggs) => {
                let mut m = Map::new();
                m.insert(key_field.into(), key.to_dynamic());
                if let Ok(slots) = acc.as_array_ref() {
                    for (a, s) in aggs.iter().zip(slots.iter()) {
                        m.insert(a.output.as_str().into(), a.result(s));
                    }
                }
                Ok(Dynamic::from_map(m))
            }
            Kind::Script(s) => {
                let v = if s.has_finish {
                    s.script.call("finish", (acc.clone(),))?
                } else {
                    acc.clone()
                };
                Ok(keyed_output(key_field, key, &v))
            }
        }
    }

    /// Reads and checks the aggregated fields of `r` into `values` (unit for `count`).
    ///
    /// # Errors
    /// A record error when a field is missing, or holds a value its aggregation cannot take:
    /// `sum` and `avg` take numbers, `min` and `max` numbers or strings. A field no record has
    /// is thus an error on every record, never a silent `0`.
    fn extract(
        aggs: &[Aggregation],
        r: &Dynamic,
        values: &mut Vec<Dynamic>,
    ) -> std::result::Result<(), String> {
        values.clear();
        for a in aggs {
            let Some(path) = a.field.as_ref().filter(|_| a.function != AggregateFunction::Count)
            else {
                values.push(Dynamic::UNIT);
                continue;
            };
            let field = path.as_str();
            // Built only for an error: this runs for every record.
            let what = || format!("`{}` ({} of field `{field}`)", a.output, a.function_name());
            let Some(v) = path.get(r) else {
                return Err(format!(
                    "{}: missing field `{field}`; {}",
                    what(),
                    fields_of(r, path)
                ));
            };
            let fits = match a.function {
                AggregateFunction::Sum | AggregateFunction::Avg => number(&v).is_some(),
                _ => number(&v).is_some() || v.is_string(),
            };
            if !fits {
                let wants = match a.function {
                    AggregateFunction::Sum | AggregateFunction::Avg => "a number",
                    _ => "a number or a string",
                };
                return Err(format!(
                    "{}: the value is {}, not {wants}",
                    what(),
                    shown_type(&v)
                ));
            }
            values.push(v);
        }
        Ok(())
    }
}

/// "the record has: a, b" for the map the last part of `path` was looked up in.
fn fields_of(r: &Dynamic, path: &FieldPath) -> String {
    let parent = path
        .as_str()
        .rsplit_once('.')
        .map_or_else(|| Some(r.clone()), |(head, _)| FieldPath::new(head).get(r));
    match parent.as_ref().and_then(|p| p.as_map_ref().ok()) {
        Some(m) if m.is_empty() => "the record has no fields".to_owned(),
        Some(m) => format!(
            "the record has: {}",
            m.keys().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        ),
        None => "the path does not lead to a map in this record".to_owned(),
    }
}

/// A value's type as users know it from JSON.
fn shown_type(v: &Dynamic) -> &'static str {
    if v.is_unit() {
        "null"
    } else if v.is_string() {
        "a string"
    } else if v.is_bool() {
        "a boolean"
    } else if v.is_map() {
        "an object"
    } else if v.is_array() {
        "an array"
    } else {
        "not a number"
    }
}

fn apply(aggs: &[Aggregation], values: &[Dynamic], slot: &mut Option<Dynamic>) {
    if slot.is_none() {
        *slot = Some(Dynamic::from_array(
            aggs.iter().map(Aggregation::init).collect::<Array>(),
        ));
    }
    let Some(acc) = slot.as_mut() else { return };
    let Ok(mut slots) = acc.as_array_mut() else {
        return;
    };
    for ((a, v), s) in aggs.iter().zip(values).zip(slots.iter_mut()) {
        match a.function {
            AggregateFunction::Count => *s = Dynamic::from(s.as_int().unwrap_or(0) + 1),
            _ if v.is_unit() => {}
            AggregateFunction::Sum => add_into(s, v),
            AggregateFunction::Min | AggregateFunction::Max => {
                let better = if a.function == AggregateFunction::Min {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
                if s.is_unit() || compare(v, s) == Some(better) {
                    *s = v.clone();
                }
            }
            AggregateFunction::Avg => {
                if let Ok(mut pair) = s.as_array_mut() {
                    let sum = pair[0].as_float().unwrap_or(0.0) + number(v).unwrap_or(0.0);
                    let n = pair[1].as_int().unwrap_or(0) + 1;
                    pair[0] = Dynamic::from(sum);
                    pair[1] = Dynamic::from(n);
                }
            }
        }
    }
}

impl Operator for AggregateOperator {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.state = Some(ctx.state_mut()?.register(ACC, StateKind::Value)?);
        Ok(())
    }

    /// The scripted form rewrites its restored accumulators through `fn migrate`
    /// ([`migrate_keyed_state`]); the built-in form has no script and keeps them.
    fn migrate_state(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let Kind::Script(s) = &mut self.kind else {
            return Ok(());
        };
        let id = self
            .state
            .ok_or_else(|| RunError::Internal("aggregate used before open".into()))?;
        migrate_keyed_state(
            &mut s.script,
            &[(ACC.to_owned(), StateKind::Value, id)],
            ctx,
        )
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        require_keys(batch, ctx)?;
        let id = self
            .state
            .ok_or_else(|| RunError::Internal("aggregate used before open".into()))?;
        let updates = self.emit == EmitMode::Updates;
        let keep_backup = ctx.on_error != ErrorPolicy::Fail;
        let exact = ctx.keeps_failed_records();
        let records = std::mem::take(&mut batch.records);
        let prefetch = RecordPrefetch::new();
        let keys = std::mem::take(&mut batch.keys);
        let mut records = records.into_iter();
        for k in keys {
            let Some(mut r) = records.next() else { break };
            let ahead = records.as_slice();
            prefetch.ahead(ahead.get(2 * PREFETCH_AHEAD - 1), ahead.get(PREFETCH_AHEAD - 1));
            let mut failure = None;
            match &mut self.kind {
                Kind::Builtin(aggs) => {
                    if let Err(e) = Self::extract(aggs, &r, &mut self.values) {
                        ctx.record_failed(r, e)?;
                        continue;
                    }
                    let values = &self.values;
                    ctx.state_mut()?
                        .update(id, &k, &mut |slot| apply(aggs, values, slot))?;
                }
                Kind::Script(_) => {
                    let original = exact.then(|| r.clone());
                    // `add` gets the record by value and hands it back (see `ScriptFn::invoke`).
                    let mut args = [Dynamic::UNIT, r];
                    let kind = &mut self.kind;
                    ctx.state_mut()?.update(id, &k, &mut |slot| {
                        if let Err(e) = kind.add(slot, &[], &mut args, keep_backup) {
                            failure = Some(e);
                        }
                    })?;
                    let [_, left] = args;
                    r = original.unwrap_or(left);
                }
            }
            if let Some(e) = failure {
                ctx.record_failed(r, e)?;
                continue;
            }
            if updates {
                let acc = ctx.state_mut()?.get(id, &k)?.unwrap_or(Dynamic::UNIT);
                match Self::output(&mut self.kind, &self.key_field, &k, &acc) {
                    Ok(o) => batch.records.push(o),
                    Err(e) => ctx.record_failed(r, e)?,
                }
            }
        }
        Ok(())
    }

    fn on_end(&mut self, out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        if self.emit != EmitMode::Final {
            return Ok(());
        }
        let id = self
            .state
            .ok_or_else(|| RunError::Internal("aggregate used before open".into()))?;
        let start = out.len();
        while out.len() - start < END_CHUNK {
            let Some(keys) = self
                .end
                .next_keys(ctx.state_mut()?.as_ref(), &[id], |_, _, _| Ok(true))?
            else {
                break;
            };
            for k in keys {
                let Some(acc) = ctx.state_mut()?.get(id, &k)? else {
                    continue;
                };
                match Self::output(&mut self.kind, &self.key_field, &k, &acc) {
                    Ok(o) => out.push(o),
                    Err(e) => {
                        let rec = k.to_dynamic();
                        ctx.record_failed(rec, e)?;
                    }
                }
            }
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

    fn agg(function: AggregateFunction, field: Option<&str>) -> Aggregation {
        Aggregation::from_spec(&AggregationSpec {
            function,
            field: field.map(str::to_owned),
            output: Some("out".to_owned()),
        })
    }

    fn record(json: &str) -> Dynamic {
        serde_json::from_str(json).expect("json")
    }

    fn extract(a: Aggregation, json: &str) -> std::result::Result<Vec<Dynamic>, String> {
        let mut values = Vec::new();
        AggregateOperator::extract(&[a], &record(json), &mut values).map(|()| values)
    }

    /// Under `keep_backup`, a failing scripted `add` leaves the accumulator as it was and hands
    /// the record back as it came, on the native path's decline (a missing field) and on a
    /// body only Rhai runs (`throw`), though Rhai changed both before failing.
    #[test]
    fn a_failing_add_keeps_the_accumulator_as_it_was() {
        let bodies = [
            ("fn add(acc, r) { r.seen = 1; acc.n += 1; acc.sum += r.amount; acc }", 1),
            (
                r#"fn add(acc, r) { r.seen = 1; acc.n += 1; if r.amount == 2 { throw "two" } acc.sum += r.amount; acc }"#,
                2,
            ),
        ];
        for (body, failures) in bodies {
            let text = format!("fn init() {{ #{{n: 0, sum: 0}} }} {body}");
            let mut acc = Accumulator::scripted(crate::operators::reduce::tests::script(&text));
            let mut slot = None;
            let mut add = |slot: &mut Option<Dynamic>, json: &str| {
                let mut args = [Dynamic::UNIT, record(json)];
                let result = acc.add(slot, &[], &mut args, true);
                (result.is_ok(), crate::record::excerpt(&args[1]))
            };
            assert!(add(&mut slot, r#"{"amount":1}"#).0, "{body}");
            let mut failed = 0;
            for bad in [r#"{"other":true}"#, r#"{"amount":2}"#] {
                let (ok, left) = add(&mut slot, bad);
                if !ok {
                    failed += 1;
                    assert_eq!(left, bad, "{body}: the record as it came");
                    let kept = slot.as_ref().map(crate::record::excerpt);
                    assert_eq!(kept.as_deref(), Some(r#"{"n":1,"sum":1}"#), "{body}");
                }
            }
            assert_eq!(failed, failures, "{body}");
        }
    }

    #[test]
    fn a_missing_field_is_a_record_error_naming_the_fields() {
        let e = extract(agg(AggregateFunction::Sum, Some("amount")), r#"{"amt":1,"user":"u"}"#)
            .expect_err("missing");
        assert!(e.contains("`out` (sum of field `amount`): missing field `amount`"), "{e}");
        assert!(e.contains("amt, user"), "{e}");
        let e = extract(agg(AggregateFunction::Max, Some("o.n")), r#"{"o":{"m":1}}"#)
            .expect_err("missing");
        assert!(e.contains("missing field `o.n`; the record has: m"), "{e}");
        for f in [AggregateFunction::Avg, AggregateFunction::Min] {
            assert!(extract(agg(f, Some("x")), "{}").is_err());
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_is_a_record_error() {
        for (f, json) in [
            (AggregateFunction::Sum, r#"{"x":"5"}"#),
            (AggregateFunction::Avg, r#"{"x":null}"#),
            (AggregateFunction::Sum, r#"{"x":[1]}"#),
            (AggregateFunction::Min, r#"{"x":true}"#),
            (AggregateFunction::Max, r#"{"x":{"a":1}}"#),
        ] {
            let e = extract(agg(f, Some("x")), json).expect_err(json);
            assert!(e.contains("the value is"), "{e}");
        }
    }

    #[test]
    fn good_values_and_count_pass() {
        assert!(extract(agg(AggregateFunction::Sum, Some("x")), r#"{"x":1.5}"#).is_ok());
        assert!(extract(agg(AggregateFunction::Min, Some("x")), r#"{"x":"b"}"#).is_ok());
        let counted = extract(agg(AggregateFunction::Count, Some("absent")), "{}").expect("count");
        assert!(counted[0].is_unit(), "count reads no field");
        assert!(extract(agg(AggregateFunction::Count, None), "{}").is_ok());
    }
}
