//! `window` (keyed): groups each key's records into tumbling, sliding or session windows of
//! event time (a record field, closed by the watermark) or processing time (`ctx.clock`,
//! closed by the clock), aggregates each window with the accumulators of `aggregate`
//! ([`Accumulator`]: built-ins, or Rhai `init/add/finish`, plus `merge` for sessions), and
//! emits `{<key_field>: key, window_start, window_end, ...}` when a window closes
//! (`on_close`) or after every change (`on_update`).
//!
//! State: every open window of a key is one entry of the map state [`WINDOWS`] under that key
//! (field = the window's start in decimal, value = `[end, accumulator]`). That is keyed
//! backend state, so checkpoints, savepoints, every backend and rescaling carry open windows
//! with no extra code; the firings and clean-ups follow from the windows' ends and are derived
//! again by [`Operator::state_restored`]. A scripted accumulator's `fn migrate` rewrites the
//! restored windows first ([`Operator::migrate_state`]).
//!
//! Semantics are Flink's: a window `[start, end)` fires when the watermark reaches `end - 1`;
//! a record is late for a window when `end - 1 + allowed_lateness <= watermark` on arrival; a
//! record late for every window it belongs to goes to the `late` output (or is dropped and
//! counted), one late for some only updates the others; a record accepted after its window
//! fired updates it and emits its result again (`on_close`), and the window's state goes
//! when the watermark passes `end - 1 + allowed_lateness`. Sessions start as
//! `[time, time + gap)` and merge with every window of the key they overlap or touch.
//!
//! Two ways to keep the windows, one state format. On the heap backends (`memory`, `fs`),
//! tumbling and sliding windows live in [`buckets`]: one bucket of per-key accumulators per
//! window, closed whole by a watermark, written to the backend at every snapshot. Otherwise
//! (RocksDB, and sessions everywhere, whose windows differ per key) every change goes to the
//! backend at once and per-key timers close the windows. Timers of windows are not state of
//! their own: they follow from the windows' ends, and are derived again after a restore.
//!
//! It never sees channels or the task loop: watermarks and the clock arrive through the
//! [`Operator`] hooks, late records leave through [`OperatorContext::late`].

mod buckets;

use std::fmt::Write as _;

use rhai::{Dynamic, Map};
use weir_schema::{
    EventTimeSpec, StateKind, WindowEmitSpec, WindowKindSpec, WindowSpec, WindowTimeSpec,
};

use super::aggregate::Accumulator;
use super::reduce::{call_migrate, migrate_failure, migrate_form, migrated_log, require_keys};
use crate::script::runtime::{set_key, with_frame};
use crate::base::error::{Result, RunError};
use crate::base::message::{Batch, WATERMARK_MIN};
use crate::element::{ErrorPolicy, Operator, OperatorContext};
use crate::record::event_time::TimeExtractor;
use crate::record::Key;
use crate::state::StateId;
use crate::state::timers::{TimeDomain, Timers};
use buckets::Buckets;

/// The name of the map state holding a key's open windows: declared by the plan.
pub use crate::plan::declared::WINDOWS;

/// Which windows a record belongs to (times in epoch milliseconds, all positive lengths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assigner {
    /// `[k * size, (k + 1) * size)`.
    Tumbling {
        /// Window length.
        size: i64,
    },
    /// `[k * slide, k * slide + size)`.
    Sliding {
        /// Window length.
        size: i64,
        /// Distance between window starts (at most `size`).
        slide: i64,
    },
    /// `[time, time + gap)`, merged with the key's overlapping or touching windows.
    Session {
        /// Inactivity gap.
        gap: i64,
    },
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl Assigner {
    /// From the spec (durations in whole milliseconds, at least 1).
    pub fn from_spec(spec: &WindowKindSpec) -> Self {
        match spec {
            WindowKindSpec::Tumbling { size } => Self::Tumbling { size: millis(size.0) },
            WindowKindSpec::Sliding { size, slide } => Self::Sliding {
                size: millis(size.0),
                slide: millis(slide.0).min(millis(size.0)),
            },
            WindowKindSpec::Session { gap } => Self::Session { gap: millis(gap.0) },
        }
    }
}

/// Where a record's time comes from.
#[derive(Clone, Debug)]
pub enum WindowTime {
    /// Event time: read from a field as the sources declare it (epoch ms, epoch s or RFC
    /// 3339).
    Event(TimeExtractor),
    /// Processing time: `ctx.clock` when the record arrives.
    Processing,
}

/// A `window`'s settings, from its spec.
#[derive(Clone, Debug)]
pub struct WindowConfig {
    /// The window kind.
    pub assigner: Assigner,
    /// Event or processing time.
    pub time: WindowTime,
    /// `allowed_lateness` in milliseconds (event time only).
    pub allowed_lateness: i64,
    /// When results go out.
    pub emit: WindowEmitSpec,
    /// Name of the key field in output records.
    pub key_field: String,
    /// Whether late records go to a `late` output (else they are dropped and counted).
    pub late_output: bool,
    /// Whether the state backend keeps state on the heap (`memory`, `fs`): aligned windows
    /// then live in [`buckets`] between snapshots.
    pub heap: bool,
    /// Whether the event times records carry from their sources ([`Batch::times`]) are the
    /// ones this window would read (same field, same unit): then it reads no field.
    pub carried_times: bool,
    /// The output template of built-in aggregations (set by [`WindowOperator::new`]).
    pub(crate) shape: Option<OutputShape>,
}

/// Where each field of a built-in window's output comes from.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Key,
    Aggregation(usize),
    Start,
    End,
}

/// The output record of built-in aggregations as a template: every field present (in the
/// map's order), so an output is one clone and one pass over its values, with no field
/// names to build and no searches. Fields written later win, as they would by insertion:
/// the key, the aggregations in order, `window_start`, `window_end`.
#[derive(Clone, Debug)]
pub(crate) struct OutputShape {
    template: Map,
    slots: Vec<Slot>,
}

impl OutputShape {
    fn new(key_field: &str, aggs: &[super::aggregate::Aggregation]) -> Self {
        let mut by_name: std::collections::BTreeMap<&str, Slot> = std::collections::BTreeMap::new();
        by_name.insert(key_field, Slot::Key);
        for (i, a) in aggs.iter().enumerate() {
            by_name.insert(a.output_name(), Slot::Aggregation(i));
        }
        by_name.insert("window_start", Slot::Start);
        by_name.insert("window_end", Slot::End);
        let template: Map = by_name.keys().map(|k| ((*k).into(), Dynamic::UNIT)).collect();
        // `Map` orders its fields as the `BTreeMap` of `&str` above does (byte order).
        let slots = by_name.values().copied().collect();
        Self { template, slots }
    }
}

impl WindowConfig {
    /// From the spec, with the event time already resolved (the field: `time_field`, or the
    /// sources' `event_time.field`; its unit or format: the sources'). `event_time` is only
    /// read for `time: event`.
    pub fn from_spec(spec: &WindowSpec, event_time: &EventTimeSpec) -> Self {
        Self {
            assigner: Assigner::from_spec(&spec.window),
            time: match spec.time {
                WindowTimeSpec::Event => WindowTime::Event(TimeExtractor::new(event_time)),
                WindowTimeSpec::Processing => WindowTime::Processing,
            },
            allowed_lateness: i64::try_from(spec.lateness().as_millis()).unwrap_or(i64::MAX),
            emit: spec.emit,
            key_field: spec.key_field.clone(),
            late_output: spec.late.is_some(),
            heap: false,
            carried_times: false,
            shape: None,
        }
    }

    /// With `heap` set as the pipeline's state backend says.
    #[must_use]
    pub fn on_heap(mut self, heap: bool) -> Self {
        self.heap = heap;
        self
    }

    /// With `carried_times` set as the sources upstream allow (see the field).
    #[must_use]
    pub fn with_carried_times(mut self, carried: bool) -> Self {
        self.carried_times = carried;
        self
    }

    /// The windows a record at `time` belongs to and that are not past their lateness at
    /// `watermark`, newest first, into `starts` (tumbling: `slide == size`).
    fn aligned_starts(
        &self,
        (size, slide): (i64, i64),
        time: i64,
        watermark: i64,
        starts: &mut Vec<i64>,
    ) {
        starts.clear();
        let mut start = time - time.rem_euclid(slide);
        while start > time.saturating_sub(size) {
            let end = start.saturating_add(size);
            if self.cleanup_time(end) > watermark {
                starts.push(start);
            }
            start = start.saturating_sub(slide);
        }
    }

    fn domain(&self) -> TimeDomain {
        match self.time {
            WindowTime::Event(_) => TimeDomain::Event,
            WindowTime::Processing => TimeDomain::Processing,
        }
    }

    /// Lateness counts in event time only.
    fn lateness(&self) -> i64 {
        match self.time {
            WindowTime::Event(_) => self.allowed_lateness,
            WindowTime::Processing => 0,
        }
    }

    /// When a window ending at `end` fires.
    fn fire_time(end: i64) -> i64 {
        end.saturating_sub(1)
    }

    /// Whether a window ending at `end` already fired at `watermark` (event time), so that a
    /// change to it emits at once.
    fn fired(&self, end: i64, watermark: i64) -> bool {
        matches!(self.time, WindowTime::Event(_)) && Self::fire_time(end) <= watermark
    }

    /// When the state of a window ending at `end` goes.
    fn cleanup_time(&self, end: i64) -> i64 {
        Self::fire_time(end).saturating_add(self.lateness())
    }
}

/// The `window` operator.
pub struct WindowOperator {
    acc: Accumulator,
    config: WindowConfig,
    windows: Option<StateId>,
    timers: Option<Timers>,
    /// Aligned windows on a heap backend (see the module docs).
    buckets: Option<Buckets>,
    /// Scratch: the aggregated values of the current record (built-ins).
    values: Vec<Dynamic>,
    /// Scratch: the starts of the windows the current record belongs to.
    starts: Vec<i64>,
    /// Scratch: the `(start, end)` of the sessions the current record touches.
    spans: Vec<(i64, i64)>,
    /// Scratch: ends of the windows the current record created.
    created: Vec<i64>,
    /// Scratch: timer times no window needs any more (merged sessions).
    stale: Vec<i64>,
    /// Scratch: a window's field name.
    field: String,
}

/// What one record did to its key's windows.
#[derive(Default)]
struct Applied {
    failure: Option<String>,
    late: bool,
    outputs: Vec<std::result::Result<Dynamic, String>>,
}

impl WindowOperator {
    /// A window over `acc`'s accumulators.
    pub fn new(acc: Accumulator, mut config: WindowConfig) -> Self {
        let aligned = !matches!(config.assigner, Assigner::Session { .. });
        if let Accumulator::Builtin(aggs) = &acc {
            config.shape = Some(OutputShape::new(&config.key_field, aggs));
        }
        Self {
            acc,
            buckets: (config.heap && aligned).then(Buckets::default),
            config,
            windows: None,
            timers: None,
            values: Vec::new(),
            starts: Vec::new(),
            spans: Vec::new(),
            created: Vec::new(),
            stale: Vec::new(),
            field: String::new(),
        }
    }

    fn handles(&self) -> Result<StateId> {
        self.windows
            .ok_or_else(|| RunError::Internal("window used before open".into()))
    }

    /// The output record of one window.
    fn output(
        acc: &mut Accumulator,
        config: &WindowConfig,
        key: &Key,
        start: i64,
        end: i64,
        value: &Dynamic,
    ) -> std::result::Result<Dynamic, String> {
        if let (Some(shape), Accumulator::Builtin(aggs)) = (&config.shape, &*acc) {
            let slots = value.as_array_ref().ok();
            let mut m = shape.template.clone();
            for (v, slot) in m.values_mut().zip(&shape.slots) {
                *v = match *slot {
                    Slot::Key => key.to_dynamic(),
                    Slot::Aggregation(i) => match slots.as_ref().and_then(|s| s.get(i)) {
                        Some(s) => aggs[i].result(s),
                        None => Dynamic::UNIT,
                    },
                    Slot::Start => Dynamic::from(start),
                    Slot::End => Dynamic::from(end),
                };
            }
            return Ok(Dynamic::from_map(m));
        }
        let mut o = acc.output(&config.key_field, key, value)?;
        if let Ok(mut m) = o.as_map_mut() {
            m.insert("window_start".into(), Dynamic::from(start));
            m.insert("window_end".into(), Dynamic::from(end));
        }
        Ok(o)
    }

    /// A record late for all its windows: to the `late` output, or dropped and counted.
    fn late(&self, r: Dynamic, ctx: &mut OperatorContext) {
        if self.config.late_output {
            ctx.late.push(r);
        } else {
            ctx.late_dropped += 1;
        }
    }

    /// Adds a record at `time` to its tumbling (`slide == size`) or sliding windows.
    #[allow(clippy::too_many_arguments)]
    fn add_aligned(
        &mut self,
        (size, slide): (i64, i64),
        args: &mut [Dynamic; 2],
        key: &Key,
        time: i64,
        watermark: i64,
        ctx: &mut OperatorContext,
    ) -> Result<Applied> {
        self.config
            .aligned_starts((size, slide), time, watermark, &mut self.starts);
        let mut applied = Applied::default();
        if self.starts.is_empty() {
            applied.late = true;
            return Ok(applied);
        }
        let keep_backup = ctx.on_error != ErrorPolicy::Fail;
        if let Some(buckets) = self.buckets.as_mut() {
            return Ok(buckets.add(
                &mut self.acc,
                &self.config,
                (&self.starts, size),
                &self.values,
                args,
                key,
                watermark,
                keep_backup,
            ));
        }
        self.created.clear();
        let id = self.handles()?;
        let on_update = self.config.emit == WindowEmitSpec::OnUpdate;
        let Self {
            acc,
            config,
            values,
            starts,
            created,
            field,
            ..
        } = self;
        ctx.state_mut()?.update(id, key, &mut |slot| {
            let map = slot.get_or_insert_with(|| Dynamic::from_map(Map::new()));
            let Ok(mut map) = map.as_map_mut() else {
                return;
            };
            // Oldest window first, so that outputs come out in window order.
            for &start in starts.iter().rev() {
                let end = start.saturating_add(size);
                set_field(field, start);
                let new = !map.contains_key(field.as_str());
                if new {
                    map.insert(
                        field.as_str().into(),
                        Dynamic::from_array(vec![Dynamic::from(end), Dynamic::UNIT]),
                    );
                }
                let Some(mut pair) = map
                    .get_mut(field.as_str())
                    .and_then(|v| v.as_array_mut().ok())
                else {
                    continue;
                };
                let mut acc_slot = (!new).then(|| std::mem::take(&mut pair[1]));
                let result = acc.add(&mut acc_slot, values, args, keep_backup);
                let Some(a) = acc_slot.filter(|_| !(new && result.is_err())) else {
                    // A window the failed record would have opened is not kept.
                    drop(pair);
                    map.remove(field.as_str());
                    applied.failure = result.err();
                    break;
                };
                pair[1] = a;
                if let Err(e) = result {
                    applied.failure = Some(e);
                    break;
                }
                if on_update || config.fired(end, watermark) {
                    let out = Self::output(acc, config, key, start, end, &pair[1]);
                    applied.outputs.push(out);
                }
                if new {
                    created.push(end);
                }
            }
            if map.is_empty() {
                drop(map);
                *slot = None;
            }
        })?;
        Ok(applied)
    }

    /// Adds a record at `time` to its session, merging the key's sessions it bridges.
    #[allow(clippy::too_many_arguments)]
    fn add_session(
        &mut self,
        gap: i64,
        args: &mut [Dynamic; 2],
        key: &Key,
        time: i64,
        watermark: i64,
        ctx: &mut OperatorContext,
    ) -> Result<Applied> {
        self.created.clear();
        self.stale.clear();
        let id = self.handles()?;
        let on_update = self.config.emit == WindowEmitSpec::OnUpdate;
        let keep_backup = ctx.on_error != ErrorPolicy::Fail;
        let mut applied = Applied::default();
        let Self {
            acc,
            config,
            values,
            spans,
            created,
            stale,
            field,
            ..
        } = self;
        let config = &*config;
        ctx.state_mut()?.update(id, key, &mut |slot| {
            let map = slot.get_or_insert_with(|| Dynamic::from_map(Map::new()));
            let Ok(mut map) = map.as_map_mut() else {
                return;
            };
            // The sessions this record touches, and the merged bounds.
            let (mut start, mut end) = (time, time.saturating_add(gap));
            spans.clear();
            for (f, v) in map.iter() {
                let (Ok(s), Some(e)) = (f.parse::<i64>(), window_end(v)) else {
                    continue;
                };
                if s <= time.saturating_add(gap) && e >= time {
                    spans.push((s, e));
                    start = start.min(s);
                    end = end.max(e);
                }
            }
            if config.cleanup_time(end) <= watermark {
                applied.late = true;
                if map.is_empty() {
                    drop(map);
                    *slot = None;
                }
                return;
            }
            spans.sort_unstable();
            // The accumulator to add to: none (a new session), the one session's (taken out
            // in place), or the merge of several (copies, so that a failure changes nothing).
            let mut merged: Option<Dynamic> = None;
            if let [(s, _)] = spans[..] {
                set_field(field, s);
                if let Some(mut pair) = map
                    .get_mut(field.as_str())
                    .and_then(|v| v.as_array_mut().ok())
                {
                    merged = Some(std::mem::take(&mut pair[1]));
                }
            } else {
                for &(s, _) in spans.iter() {
                    set_field(field, s);
                    let Some(a) = map
                        .get(field.as_str())
                        .and_then(|v| v.as_array_ref().ok().map(|p| p[1].clone()))
                    else {
                        continue;
                    };
                    merged = Some(match merged.take() {
                        None => a,
                        Some(m) => match acc.merge(m, a) {
                            Ok(x) => x,
                            Err(e) => {
                                applied.failure = Some(e);
                                return;
                            }
                        },
                    });
                }
            }
            let result = acc.add(&mut merged, values, args, keep_backup);
            if let Err(e) = result {
                applied.failure = Some(e);
                if let [(s, _)] = spans[..] {
                    set_field(field, s);
                    match merged {
                        Some(a) => {
                            if let Some(mut pair) = map
                                .get_mut(field.as_str())
                                .and_then(|v| v.as_array_mut().ok())
                            {
                                pair[1] = a;
                            }
                        }
                        None => {
                            map.remove(field.as_str());
                        }
                    }
                }
                return;
            }
            let Some(value) = merged else { return };
            // Replace the old sessions by the merged one, reusing a stored `[end, acc]`.
            let mut holder = None;
            for &(s, e) in spans.iter() {
                set_field(field, s);
                if let Some(v) = map.remove(field.as_str()) {
                    holder.get_or_insert(v);
                }
                if (s, e) != (start, end) {
                    stale.push(WindowConfig::fire_time(e));
                    stale.push(config.cleanup_time(e));
                }
            }
            if !spans.contains(&(start, end)) {
                created.push(end);
            }
            if on_update || config.fired(end, watermark) {
                let o = Self::output(acc, config, key, start, end, &value);
                applied.outputs.push(o);
            }
            let mut v =
                holder.unwrap_or_else(|| Dynamic::from_array(vec![Dynamic::UNIT, Dynamic::UNIT]));
            if let Ok(mut pair) = v.as_array_mut() {
                pair[0] = Dynamic::from(end);
                pair[1] = value;
            }
            set_field(field, start);
            map.insert(field.as_str().into(), v);
            // A stale time another window of the key still needs stays.
            if !stale.is_empty() {
                for v in map.values() {
                    if let Some(e) = window_end(v) {
                        let (f, c) = (WindowConfig::fire_time(e), config.cleanup_time(e));
                        stale.retain(|&t| t != f && t != c);
                    }
                }
            }
        })?;
        Ok(applied)
    }

    /// Fires the key's windows due at timer `time`: emits (under `on_close`) those that close
    /// now and drops the state of those whose lateness passed.
    fn fire(
        &mut self,
        time: i64,
        key: &Key,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let id = self.handles()?;
        let emit = self.config.emit == WindowEmitSpec::OnClose;
        let mut outputs: Vec<(i64, std::result::Result<Dynamic, String>)> = Vec::new();
        let Self { acc, config, .. } = self;
        let config = &*config;
        ctx.state_mut()?.update(id, key, &mut |slot| {
            let Some(mut map) = slot.as_mut().and_then(|v| v.as_map_mut().ok()) else {
                return;
            };
            map.retain(|f, v| {
                let (Ok(start), Some(end)) = (f.parse::<i64>(), window_end(v)) else {
                    return false;
                };
                if emit
                    && WindowConfig::fire_time(end) == time
                    && let Ok(pair) = v.as_array_ref()
                {
                    let o = Self::output(acc, config, key, start, end, &pair[1]);
                    outputs.push((start, o));
                }
                config.cleanup_time(end) > time
            });
            if map.is_empty() {
                drop(map);
                *slot = None;
            }
        })?;
        outputs.sort_by_key(|(start, _)| *start);
        for (_, o) in outputs {
            match o {
                Ok(o) => out.push(o),
                Err(e) => ctx.record_failed(key.to_dynamic(), e)?,
            }
        }
        Ok(())
    }

    /// Fires every timer of the operator's time domain due at `upto`.
    fn fire_due(
        &mut self,
        upto: i64,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if let Some(buckets) = self.buckets.as_mut() {
            return buckets.fire_due(&mut self.acc, &self.config, upto, out, ctx);
        }
        let domain = self.config.domain();
        loop {
            let timers = self
                .timers
                .as_mut()
                .ok_or_else(|| RunError::Internal("window used before open".into()))?;
            let Some((time, key)) = timers.pop_due(ctx.state_mut()?.as_mut(), domain, upto)?
            else {
                return Ok(());
            };
            self.fire(time, &key, out, ctx)?;
        }
    }
}

impl WindowOperator {
    /// Sets the timers of the windows the last record created and deletes those of the
    /// sessions it merged away (backend windows).
    fn add_timers(&mut self, k: &Key, watermark: i64, ctx: &mut OperatorContext) -> Result<()> {
        if self.stale.is_empty() && self.created.is_empty() {
            return Ok(());
        }
        let domain = self.config.domain();
        let timers = self
            .timers
            .as_mut()
            .ok_or_else(|| RunError::Internal("window used before open".into()))?;
        let state = ctx.state_mut()?.as_mut();
        for &t in &self.stale {
            timers.delete(state, domain, k, t)?;
        }
        for &end in &self.created {
            let fire = WindowConfig::fire_time(end);
            // A window created after it would have fired emitted already.
            if domain == TimeDomain::Processing || fire > watermark {
                timers.set(state, domain, k, fire)?;
            }
            let cleanup = self.config.cleanup_time(end);
            if cleanup != fire {
                timers.set(state, domain, k, cleanup)?;
            }
        }
        self.stale.clear();
        Ok(())
    }
}

/// The end of a stored window `[end, acc]`.
fn window_end(v: &Dynamic) -> Option<i64> {
    v.as_array_ref().ok()?.first()?.as_int().ok()
}

/// Writes a window's field name (its start in decimal) into `field`, reusing its buffer.
fn set_field(field: &mut String, start: i64) {
    field.clear();
    let _ = write!(field, "{start}");
}

impl Operator for WindowOperator {
    fn open(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let state = ctx.state_mut()?;
        self.windows = Some(state.register(WINDOWS, StateKind::Map)?);
        self.timers = Some(Timers::register(state.as_mut())?);
        Ok(())
    }

    /// A scripted accumulator's `fn migrate(old)` (or `migrate(name, old)`, with the state's
    /// name `windows`) rewrites every restored open window's accumulator; `()` drops that
    /// window. It runs before [`Self::state_restored`], so buckets and timers follow from the
    /// migrated windows.
    fn migrate_state(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let id = self.handles()?;
        let Some(script) = self.acc.script_mut() else {
            return Ok(());
        };
        let Some(with_name) = migrate_form(script) else {
            return Ok(());
        };
        let (mut migrated, mut deleted) = (0_u64, 0_u64);
        for key in ctx.state_mut()?.keys(id)? {
            // `(message, old accumulator)` of a failed call.
            let mut failure: Option<(String, Dynamic)> = None;
            let mut no_frame_state = None;
            let state = ctx.state_mut()?;
            with_frame(&mut no_frame_state, &[], 0, || {
                set_key(Some(key.clone()));
                state.update(id, &key, &mut |slot| {
                    let Some(mut windows) = slot.take().and_then(|v| v.try_cast::<Map>()) else {
                        return;
                    };
                    let mut gone = Vec::new();
                    for (start, window) in &mut windows {
                        let Some(mut pair) = window.write_lock::<rhai::Array>() else {
                            continue;
                        };
                        let Some(old) = pair.get(1).cloned() else {
                            continue;
                        };
                        match call_migrate(script, with_name, WINDOWS, &old) {
                            Ok(new) if new.is_unit() => gone.push(start.clone()),
                            Ok(new) => pair[1] = new,
                            Err(e) => {
                                failure = Some((e, old));
                                break;
                            }
                        }
                    }
                    if failure.is_none() {
                        deleted += gone.len() as u64;
                        migrated += (windows.len() - gone.len()) as u64;
                        for start in &gone {
                            windows.remove(start);
                        }
                    }
                    if !windows.is_empty() {
                        *slot = Some(Dynamic::from_map(windows));
                    }
                })
            })?;
            if let Some((message, old)) = failure {
                return Err(migrate_failure(ctx, &key, WINDOWS, &message, &old));
            }
        }
        migrated_log(ctx, migrated, deleted);
        Ok(())
    }

    /// Rebuilds what follows from the restored windows: the buckets (heap), or the timers
    /// (their ends give the firing and clean-up times; stored timers of builds that kept
    /// them as state are read too, then dropped on the heap, which needs none).
    fn state_restored(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let id = self.handles()?;
        let watermark = ctx.watermark;
        let state = ctx.state_mut()?;
        let timers = self
            .timers
            .as_mut()
            .ok_or_else(|| RunError::Internal("window used before open".into()))?;
        if let Some(buckets) = self.buckets.as_mut() {
            timers.clear_stored(state.as_mut())?;
            return buckets.load(state.as_ref(), id, &self.config, watermark);
        }
        timers.rebuild(state.as_ref())?;
        let domain = self.config.domain();
        for key in state.keys(id)? {
            for field in state.map_keys(id, &key)? {
                let end = state
                    .map_get(id, &key, &field)?
                    .as_ref()
                    .and_then(window_end)
                    .ok_or_else(|| {
                        RunError::StateMismatch(format!(
                            "a stored window `{field}` has no end; the checkpoint is damaged"
                        ))
                    })?;
                let fire = WindowConfig::fire_time(end);
                if domain == TimeDomain::Processing || fire > watermark {
                    timers.set(state.as_mut(), domain, &key, fire)?;
                }
                let cleanup = self.config.cleanup_time(end);
                if cleanup != fire {
                    timers.set(state.as_mut(), domain, &key, cleanup)?;
                }
            }
        }
        Ok(())
    }

    /// Heap windows go to the backend, which the task snapshots next.
    fn snapshot(&mut self, _checkpoint: u64, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        let id = self.handles()?;
        if let Some(buckets) = self.buckets.as_mut() {
            buckets.flush(ctx.state_mut()?.as_mut(), id)?;
        }
        Ok(None)
    }

    fn process(&mut self, batch: &mut Batch, ctx: &mut OperatorContext) -> Result<()> {
        require_keys(batch, ctx)?;
        let carried = self.config.carried_times && batch.has_times();
        let records = std::mem::take(&mut batch.records);
        let keys = std::mem::take(&mut batch.keys);
        let mut times = std::mem::take(&mut batch.times).into_iter();
        let (now, watermark) = match self.config.time {
            WindowTime::Event(_) => (0, ctx.watermark),
            WindowTime::Processing => (ctx.clock.now_ms(), WATERMARK_MIN),
        };
        let exact = ctx.keeps_failed_records() && matches!(self.acc, Accumulator::Script(_));
        for (r, k) in records.into_iter().zip(keys) {
            let carried_time = times.next().filter(|_| carried);
            let time = match (&self.config.time, carried_time) {
                (WindowTime::Event(_), Some(t)) => t,
                (WindowTime::Event(extractor), None) => match extractor.extract(&r) {
                    Ok(t) => t,
                    Err(e) => {
                        ctx.record_failed(r, e)?;
                        continue;
                    }
                },
                (WindowTime::Processing, _) => now,
            };
            if let Err(e) = self.acc.extract(&r, &mut self.values) {
                ctx.record_failed(r, e)?;
                continue;
            }
            let original = exact.then(|| r.clone());
            // A script's `add` gets the record by value and hands it back.
            let mut args = [Dynamic::UNIT, r];
            let applied = match self.config.assigner {
                Assigner::Tumbling { size } => {
                    self.add_aligned((size, size), &mut args, &k, time, watermark, ctx)?
                }
                Assigner::Sliding { size, slide } => {
                    self.add_aligned((size, slide), &mut args, &k, time, watermark, ctx)?
                }
                Assigner::Session { gap } => {
                    self.add_session(gap, &mut args, &k, time, watermark, ctx)?
                }
            };
            let [_, r] = args;
            if applied.late {
                self.late(r, ctx);
                continue;
            }
            // Heap windows need no timer per key (see the module docs).
            if self.buckets.is_none() {
                self.add_timers(&k, watermark, ctx)?;
            }
            for o in applied.outputs {
                match o {
                    Ok(o) => batch.records.push(o),
                    Err(e) => ctx.record_failed(k.to_dynamic(), e)?,
                }
            }
            if let Some(e) = applied.failure {
                ctx.record_failed(original.unwrap_or(r), e)?;
            }
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        watermark: i64,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if matches!(self.config.time, WindowTime::Event(_)) {
            self.fire_due(watermark, out, ctx)?;
        }
        Ok(())
    }

    fn next_processing_time(&self) -> Option<i64> {
        match self.config.time {
            WindowTime::Processing => match self.buckets.as_ref() {
                Some(b) => b.next_fire(),
                None => self.timers.as_ref()?.next(TimeDomain::Processing),
            },
            WindowTime::Event(_) => None,
        }
    }

    fn on_processing_time(
        &mut self,
        now: i64,
        out: &mut Vec<Dynamic>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if matches!(self.config.time, WindowTime::Processing) {
            self.fire_due(now, out, ctx)?;
        }
        Ok(())
    }

    /// The input ended: every window still open emits (processing-time windows; event-time
    /// ones were fired by the final watermark already, unless the task loop gave none).
    fn on_end(&mut self, out: &mut Vec<Dynamic>, ctx: &mut OperatorContext) -> Result<()> {
        self.fire_due(i64::MAX, out, ctx)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weir_schema::{AggregateFunction, AggregationSpec, RocksdbSpec};

    use super::*;
    use crate::base::clock::Clock;
    use crate::base::message::WATERMARK_END;
    use crate::element::Harness;
    use crate::operators::aggregate::Aggregation;
    use crate::operators::reduce::tests::{key, keyed_ctx, script};
    use crate::record::KeyGroupRange;
    use crate::state::{MemoryBackend, RocksdbBackend, StateBackend};

    const MAX: u32 = 128;

    fn ts_millis() -> weir_schema::EventTimeSpec {
        weir_schema::EventTimeSpec {
            field: "ts".to_owned(),
            unit: None,
            format: None,
            max_out_of_orderness: None,
            idle_timeout: None,
        }
    }

    fn config(assigner: Assigner) -> WindowConfig {
        WindowConfig {
            carried_times: false,
            assigner,
            time: WindowTime::Event(TimeExtractor::new(&ts_millis())),
            allowed_lateness: 0,
            emit: WindowEmitSpec::OnClose,
            key_field: "key".to_owned(),
            late_output: false,
            heap: false,
            shape: None,
        }
    }

    fn count_and_sum() -> Accumulator {
        let spec = |function, field: Option<&str>, output: &str| AggregationSpec {
            function,
            field: field.map(str::to_owned),
            output: Some(output.to_owned()),
        };
        Accumulator::Builtin(vec![
            Aggregation::from_spec(&spec(AggregateFunction::Count, None, "n")),
            Aggregation::from_spec(&spec(AggregateFunction::Sum, Some("v"), "sum")),
        ])
    }

    thread_local! {
        /// Whether [`harness`] keeps windows on the heap (see [`both`]).
        static HEAP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Runs a behaviour test with backend windows, then with heap windows.
    fn both(test: impl Fn()) {
        for heap in [false, true] {
            HEAP.with(|h| h.set(heap));
            test();
        }
        HEAP.with(|h| h.set(false));
    }

    fn harness(acc: Accumulator, config: WindowConfig) -> Harness {
        let config = config.on_heap(HEAP.with(std::cell::Cell::get));
        Harness::new(Box::new(WindowOperator::new(acc, config)), keyed_ctx()).expect("open")
    }

    /// `(key, ts, v)` records as one keyed batch.
    fn batch(records: &[(&str, i64, i64)]) -> Batch {
        let mut b = Batch::default();
        for &(k, ts, v) in records {
            b.records.push(
                serde_json::from_str(&format!(r#"{{"k":"{k}","ts":{ts},"v":{v}}}"#))
                    .expect("json"),
            );
            b.keys.push(key(k));
        }
        b
    }

    fn watermark(h: &mut Harness, wm: i64) -> Vec<Dynamic> {
        h.ctx.watermark = wm;
        let mut out = Vec::new();
        h.operator
            .on_watermark(wm, &mut out, &mut h.ctx)
            .expect("on_watermark");
        out
    }

    /// Records as JSON lines, sorted (the order across keys is not specified).
    fn lines(records: &[Dynamic]) -> Vec<String> {
        let mut v: Vec<String> = records
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect();
        v.sort();
        v
    }

    fn row(k: &str, start: i64, end: i64, n: i64, sum: i64) -> String {
        format!(r#"{{"key":"{k}","n":{n},"sum":{sum},"window_end":{end},"window_start":{start}}}"#)
    }

    #[test]
    fn event_time_is_read_in_the_sources_unit() {
        both(|| {
            let mut config = config(Assigner::Tumbling { size: 10_000 });
            let mut seconds = ts_millis();
            seconds.unit = Some(weir_schema::TimeUnit::S);
            config.time = WindowTime::Event(TimeExtractor::new(&seconds));
            let mut h = harness(count_and_sum(), config);
            // 12 s and 19 s share the window [10 000, 20 000) ms; 21 s is the next one.
            h.push(batch(&[("a", 12, 1), ("a", 19, 2), ("a", 21, 4)]))
                .expect("push");
            assert_eq!(
                lines(&watermark(&mut h, 19_999)),
                vec![row("a", 10_000, 20_000, 2, 3)]
            );
        });
    }

    #[test]
    fn tumbling_windows_fire_when_the_watermark_passes_their_end() {
        both(|| {
            let mut h = harness(count_and_sum(), config(Assigner::Tumbling { size: 60_000 }));
            let out = h
                .push(batch(&[("a", 1_000, 1), ("b", 2_000, 5), ("a", 61_000, 7), ("a", 1_500, 2)]))
                .expect("push");
            assert!(out.is_empty(), "on_close emits nothing per record");
            // A snapshot puts heap windows into the backend; closing them takes them out.
            assert!(h.operator.snapshot(1, &mut h.ctx).expect("snapshot").is_none());
            assert!(watermark(&mut h, 59_998).is_empty());
            assert_eq!(
                lines(&watermark(&mut h, 59_999)),
                vec![row("a", 0, 60_000, 2, 3), row("b", 0, 60_000, 1, 5)]
            );
            assert!(watermark(&mut h, 60_000).is_empty(), "fires once");
            assert_eq!(
                lines(&watermark(&mut h, WATERMARK_END)),
                vec![row("a", 60_000, 120_000, 1, 7)]
            );
            let id = StateId(0);
            assert!(h.operator.snapshot(2, &mut h.ctx).expect("snapshot").is_none());
            assert!(
                h.ctx.state_mut().expect("state").keys(id).expect("keys").is_empty(),
                "closed windows leave no state"
            );
            assert!(h.finish().expect("finish").is_empty());
        });
    }

    #[test]
    fn a_record_updates_each_of_its_sliding_windows() {
        both(|| {
            let mut h = harness(
                count_and_sum(),
                config(Assigner::Sliding {
                    size: 10_000,
                    slide: 5_000,
                }),
            );
            h.push(batch(&[("a", 7_000, 1), ("a", 12_000, 10), ("a", -1, 100)]))
                .expect("push");
            assert_eq!(
                lines(&watermark(&mut h, WATERMARK_END)),
                vec![
                    row("a", 0, 10_000, 1, 1),
                    row("a", 10_000, 20_000, 1, 10),
                    row("a", -10_000, 0, 1, 100),
                    row("a", -5_000, 5_000, 1, 100),
                    row("a", 5_000, 15_000, 2, 11),
                ]
            );
        });
    }

    #[test]
    fn sessions_merge_when_a_record_bridges_them() {
        let mut h = harness(count_and_sum(), config(Assigner::Session { gap: 10 }));
        h.push(batch(&[("a", 0, 1), ("a", 18, 2), ("a", 100, 50), ("b", 5, 9)]))
            .expect("push");
        // 9 opens [9, 19), which overlaps [0, 10) and [18, 28): one session [0, 28).
        h.push(batch(&[("a", 9, 4)])).expect("push");
        assert_eq!(
            lines(&watermark(&mut h, 27)),
            vec![row("a", 0, 28, 3, 7), row("b", 5, 15, 1, 9)]
        );
        // Touching windows merge too (Flink's rule): 110 touches [100, 110).
        h.push(batch(&[("a", 110, 1)])).expect("push");
        assert!(watermark(&mut h, 110).is_empty());
        assert_eq!(
            lines(&watermark(&mut h, 119)),
            vec![row("a", 100, 120, 2, 51)]
        );
    }

    #[test]
    fn scripted_sessions_merge_through_fn_merge_and_finish() {
        let s = script(
            "fn init() { #{n: 0} } fn add(acc, r) { acc.n += r.v; acc } \
             fn merge(a, b) { a.n += b.n; a } fn finish(acc) { #{total: acc.n} }",
        );
        let mut h = harness(Accumulator::scripted(s), config(Assigner::Session { gap: 10 }));
        h.push(batch(&[("a", 0, 1), ("a", 18, 2), ("a", 9, 4)]))
            .expect("push");
        assert_eq!(
            lines(&watermark(&mut h, WATERMARK_END)),
            vec![r#"{"key":"a","total":7,"window_end":28,"window_start":0}"#.to_owned()]
        );
    }

    #[test]
    fn allowed_lateness_re_emits_and_later_records_are_dropped_and_counted() {
        both(|| {
            let mut c = config(Assigner::Tumbling { size: 10 });
            c.allowed_lateness = 5;
            let mut h = harness(count_and_sum(), c);
            h.push(batch(&[("a", 1, 1)])).expect("push");
            assert_eq!(lines(&watermark(&mut h, 9)), vec![row("a", 0, 10, 1, 1)]);
            // Late but within lateness: updates the window and emits it again at once.
            let out = h.push(batch(&[("a", 3, 2)])).expect("push");
            assert_eq!(lines(&out.records), vec![row("a", 0, 10, 2, 3)]);
            assert!(watermark(&mut h, 14).is_empty(), "clean-up emits nothing");
            // Past the lateness: late, dropped and counted; the window is gone.
            let out = h.push(batch(&[("a", 4, 4)])).expect("push");
            assert!(out.is_empty());
            assert_eq!(h.ctx.late_dropped, 1);
            assert!(h.ctx.late.is_empty());
            assert!(watermark(&mut h, WATERMARK_END).is_empty());
        });
    }

    #[test]
    fn late_records_go_to_the_late_output_unchanged() {
        let mut c = config(Assigner::Session { gap: 10 });
        c.late_output = true;
        let mut h = harness(count_and_sum(), c);
        watermark(&mut h, 50);
        // [30, 40) ends before the watermark: late. [45, 55) is still open.
        h.push(batch(&[("a", 30, 1), ("a", 45, 2)])).expect("push");
        assert_eq!(lines(&h.ctx.late), vec![r#"{"k":"a","ts":30,"v":1}"#.to_owned()]);
        assert_eq!(h.ctx.late_dropped, 0);
        assert_eq!(
            lines(&watermark(&mut h, 54)),
            vec![row("a", 45, 55, 1, 2)]
        );
    }

    #[test]
    fn a_sliding_record_late_for_some_windows_updates_the_others() {
        both(|| {
            let mut h = harness(
                count_and_sum(),
                config(Assigner::Sliding { size: 10, slide: 5 }),
            );
            watermark(&mut h, 9);
            // 7 is in [0, 10) (closed) and [5, 15) (open).
            h.push(batch(&[("a", 7, 1)])).expect("push");
            assert_eq!(h.ctx.late_dropped, 0);
            assert_eq!(
                lines(&watermark(&mut h, WATERMARK_END)),
                vec![row("a", 5, 15, 1, 1)]
            );
        });
    }

    #[test]
    fn on_update_emits_every_change_and_nothing_at_close() {
        both(|| {
            let mut c = config(Assigner::Tumbling { size: 10 });
            c.emit = WindowEmitSpec::OnUpdate;
            let mut h = harness(count_and_sum(), c);
            let out = h.push(batch(&[("a", 1, 1), ("a", 2, 2), ("a", 12, 4)])).expect("push");
            assert_eq!(
                out.records
                    .iter()
                    .map(|r| serde_json::to_string(r).expect("json"))
                    .collect::<Vec<_>>(),
                vec![row("a", 0, 10, 1, 1), row("a", 0, 10, 2, 3), row("a", 10, 20, 1, 4)]
            );
            assert!(watermark(&mut h, WATERMARK_END).is_empty());
        });
    }

    #[test]
    fn processing_time_windows_follow_the_clock_and_emit_at_the_end() {
        both(|| {
            let mut c = config(Assigner::Tumbling { size: 100 });
            c.time = WindowTime::Processing;
            let clock = Clock::manual(1_000);
            let mut ctx = keyed_ctx();
            ctx.clock = clock.clone();
            let mut h = Harness::new(
                Box::new(WindowOperator::new(
                    count_and_sum(),
                    c.on_heap(HEAP.with(std::cell::Cell::get)),
                )),
                ctx,
            )
            .expect("open");
            // The records' own `ts` is ignored: they are in the window of their arrival.
            h.push(batch(&[("a", 5, 1)])).expect("push");
            clock.set(1_050);
            h.push(batch(&[("a", 5, 2)])).expect("push");
            assert_eq!(h.operator.next_processing_time(), Some(1_099));
            assert!(watermark(&mut h, WATERMARK_END).is_empty(), "no event time here");
            let mut out = Vec::new();
            h.operator
                .on_processing_time(1_098, &mut out, &mut h.ctx)
                .expect("timer");
            assert!(out.is_empty());
            clock.set(1_099);
            h.operator
                .on_processing_time(1_099, &mut out, &mut h.ctx)
                .expect("timer");
            assert_eq!(lines(&out), vec![row("a", 1_000, 1_100, 2, 3)]);
            clock.set(1_150);
            h.push(batch(&[("b", 5, 7)])).expect("push");
            assert_eq!(
                lines(&h.finish().expect("finish")),
                vec![row("b", 1_100, 1_200, 1, 7)]
            );
        });
    }

    #[test]
    fn a_record_without_a_usable_event_time_is_a_record_error() {
        both(|| {
            let mut h = harness(count_and_sum(), config(Assigner::Tumbling { size: 10 }));
            let mut b = batch(&[("a", 1, 1)]);
            b.records[0] = serde_json::from_str(r#"{"ts":"soon","v":1}"#).expect("json");
            let e = h.push(b).expect_err("fails").to_string();
            assert!(e.contains("event time `ts` is a string"), "{e}");
        });
    }

    // ---- snapshot / restore / rescale equivalence

    enum Step {
        Records(Vec<(&'static str, i64, i64)>),
        Watermark(i64),
    }

    /// Out-of-order records of many keys, with watermarks in between.
    fn script_of_steps() -> Vec<Step> {
        const KEYS: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let mut steps = Vec::new();
        let mut wm = 0;
        for round in 0..12_i64 {
            let mut rs = Vec::new();
            for (i, k) in KEYS.iter().enumerate() {
                let i = i as i64;
                // Gaps vary by key so that sessions both merge and close.
                let t = round * 7 + (i * 3 + round * 5) % 11 - 4;
                if (round + i) % 5 != 0 {
                    rs.push((*k, t, i + round));
                }
            }
            steps.push(Step::Records(rs));
            wm = wm.max(round * 7 - 6);
            steps.push(Step::Watermark(wm));
        }
        steps.push(Step::Watermark(WATERMARK_END));
        steps
    }

    #[derive(Clone, Copy, Debug)]
    enum Kind {
        Memory,
        Rocksdb,
    }

    fn open_backend(kind: Kind, range: KeyGroupRange, dir: &std::path::Path) -> Box<dyn StateBackend> {
        match kind {
            Kind::Memory => Box::new(MemoryBackend::new(MAX, range)),
            Kind::Rocksdb => Box::new(
                RocksdbBackend::open(dir, MAX, range, &RocksdbSpec::default()).expect("rocksdb"),
            ),
        }
    }

    fn subtask_harness(
        make: &dyn Fn(bool) -> WindowOperator,
        kind: Kind,
        parallelism: u32,
        subtask: u32,
        dir: &std::path::Path,
    ) -> Harness {
        let range = KeyGroupRange::for_subtask(MAX, parallelism, subtask);
        let mut ctx = OperatorContext::standalone("p", "w", MAX);
        ctx.subtask = subtask;
        ctx.parallelism = parallelism;
        ctx.key_groups = range;
        ctx.on_error = ErrorPolicy::Fail;
        ctx.state = Some(open_backend(kind, range, dir));
        // Windows live on the heap with the memory backend, as the registry decides.
        Harness::new(Box::new(make(matches!(kind, Kind::Memory))), ctx).expect("open")
    }

    /// Runs `steps` over `harnesses` (records by key group), returning every output and late
    /// record.
    fn run(harnesses: &mut [Harness], steps: &[Step], out: &mut Vec<Dynamic>) {
        for step in steps {
            match step {
                Step::Records(rs) => {
                    for h in harnesses.iter_mut() {
                        let mine: Vec<_> = rs
                            .iter()
                            .copied()
                            .filter(|(k, _, _)| h.ctx.key_groups.contains(key(k).key_group(MAX)))
                            .collect();
                        let o = h.push(batch(&mine)).expect("push");
                        out.extend(o.records);
                        out.append(&mut h.ctx.late);
                    }
                }
                Step::Watermark(wm) => {
                    for h in harnesses.iter_mut() {
                        out.extend(watermark(h, *wm));
                    }
                }
            }
        }
    }

    /// A run cut in half by a snapshot and restored, from and into either backend (heap
    /// windows with memory, backend windows with RocksDB) at parallelism 1 or 2, gives the
    /// output of a straight run, on either backend.
    fn equivalence(make: &dyn Fn(bool) -> WindowOperator) {
        let steps = script_of_steps();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut straight = vec![subtask_harness(make, Kind::Memory, 1, 0, dir.path())];
        let mut expected = Vec::new();
        run(&mut straight, &steps, &mut expected);
        assert!(expected.len() > 10, "the scenario produces windows: {expected:?}");
        let expected = lines(&expected);
        let mut on_rocksdb = vec![subtask_harness(make, Kind::Rocksdb, 1, 0, dir.path())];
        let mut other = Vec::new();
        run(&mut on_rocksdb, &steps, &mut other);
        drop(on_rocksdb);
        assert_eq!(lines(&other), expected, "heap and backend windows agree");
        let cut = steps.len() / 2;
        for (from, kind) in [Kind::Memory, Kind::Rocksdb]
            .into_iter()
            .flat_map(|f| [(f, Kind::Memory), (f, Kind::Rocksdb)])
        {
            for parallelism in [1, 2] {
                let mut first = vec![subtask_harness(make, from, 1, 0, dir.path())];
                let mut got = Vec::new();
                run(&mut first, &steps[..cut], &mut got);
                // As the task loop does: the operator's snapshot first (heap windows go to
                // the backend), then the backend's.
                let h = &mut first[0];
                assert!(h.operator.snapshot(1, &mut h.ctx).expect("snapshot").is_none());
                let snap = h
                    .ctx
                    .state_mut()
                    .expect("state")
                    .snapshot(KeyGroupRange::all(MAX))
                    .expect("snapshot");
                drop(first);
                let mut restored: Vec<Harness> = (0..parallelism)
                    .map(|s| {
                        let mut h = subtask_harness(make, kind, parallelism, s, dir.path());
                        h.ctx.state_mut().expect("state").restore(&[&snap]).expect("restore");
                        // As the task loop: the checkpointed watermark, then the keyed state.
                        h.ctx.watermark = match steps[..cut]
                            .iter()
                            .rev()
                            .find_map(|s| match s {
                                Step::Watermark(w) => Some(*w),
                                Step::Records(_) => None,
                            }) {
                            Some(w) => w,
                            None => WATERMARK_MIN,
                        };
                        h.operator.state_restored(&mut h.ctx).expect("restored");
                        h
                    })
                    .collect();
                run(&mut restored, &steps[cut..], &mut got);
                let name = |k| match k {
                    Kind::Memory => "memory",
                    Kind::Rocksdb => "rocksdb",
                };
                assert_eq!(
                    lines(&got),
                    expected,
                    "{} into {} at {parallelism} subtasks",
                    name(from),
                    name(kind)
                );
            }
        }
    }

    #[test]
    fn a_restore_mid_window_into_one_or_two_subtasks_changes_no_output() {
        for assigner in [
            Assigner::Tumbling { size: 10 },
            Assigner::Sliding { size: 12, slide: 4 },
            Assigner::Session { gap: 6 },
        ] {
            let make = move |heap| {
                let mut c = config(assigner).on_heap(heap);
                c.allowed_lateness = 3;
                c.late_output = true;
                WindowOperator::new(count_and_sum(), c)
            };
            equivalence(&make);
        }
        for assigner in [Assigner::Session { gap: 6 }, Assigner::Sliding { size: 12, slide: 4 }] {
            let scripted = move |heap| {
                let s = script(
                    "fn init() { 0 } fn add(acc, r) { acc + r.v } fn merge(a, b) { a + b }",
                );
                WindowOperator::new(Accumulator::scripted(s), config(assigner).on_heap(heap))
            };
            equivalence(&scripted);
        }
    }

    /// Restores the open windows of a scripted tumbling window (cut by a snapshot) into an
    /// operator whose script is `new_script`, with `migrate` on, on either backend; returns
    /// what the rest of the run emits, or the restore's error.
    fn restore_with(new_script: &str, kind: Kind) -> std::result::Result<Vec<String>, String> {
        let old = |heap: bool| {
            let s = script("fn init() { 0 } fn add(acc, r) { acc + r.v }");
            WindowOperator::new(
                Accumulator::scripted(s),
                config(Assigner::Tumbling { size: 10 }).on_heap(heap),
            )
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let mut first = subtask_harness(&old, kind, 1, 0, dir.path());
        first.push(batch(&[("a", 1, 2), ("a", 3, 5), ("b", 4, 8), ("c", 12, 1)])).expect("push");
        assert!(first.operator.snapshot(1, &mut first.ctx).expect("snapshot").is_none());
        let snap = first
            .ctx
            .state_mut()
            .expect("state")
            .snapshot(KeyGroupRange::all(MAX))
            .expect("snapshot");
        drop(first);
        let text = new_script.to_owned();
        let new = move |heap: bool| {
            WindowOperator::new(
                Accumulator::scripted(script(&text)),
                config(Assigner::Tumbling { size: 10 }).on_heap(heap),
            )
        };
        let mut h = subtask_harness(&new, kind, 1, 0, dir.path());
        h.ctx.state_mut().expect("state").restore(&[&snap]).expect("restore");
        h.ctx.migrate = true;
        h.operator.migrate_state(&mut h.ctx).map_err(|e| e.to_string())?;
        h.operator.state_restored(&mut h.ctx).expect("restored");
        h.push(batch(&[("a", 5, 1)])).expect("push");
        Ok(lines(&watermark(&mut h, WATERMARK_END)))
    }

    #[test]
    fn fn_migrate_rewrites_or_drops_every_restored_window_on_either_backend() {
        let row = |k: &str, start: i64, v: &str| {
            format!(r#"{{"key":"{k}","value":{v},"window_end":{},"window_start":{start}}}"#, start + 10)
        };
        for kind in [Kind::Memory, Kind::Rocksdb] {
            // The new accumulator is a map; the old ones were numbers.
            let got = restore_with(
                "fn init() { #{n: 0} } fn add(acc, r) { acc.n += r.v; acc } \
                 fn finish(acc) { acc.n } \
                 fn migrate(old) { if old == 8 { () } else { #{n: old * 10} } }",
                kind,
            )
            .expect("migrated");
            // `a`: (2 + 5) * 10 + 1; `b` (8) dropped; `c`: 1 * 10.
            assert_eq!(got, vec![row("a", 0, "71"), row("c", 10, "10")], "{kind:?}");
            // The two-parameter form gets the state's name.
            let got = restore_with(
                "fn init() { 0 } fn add(acc, r) { acc + r.v } \
                 fn migrate(name, old) { if name == \"windows\" { old + 100 } else { old } }",
                kind,
            )
            .expect("migrated");
            assert_eq!(
                got,
                vec![row("a", 0, "108"), row("b", 0, "108"), row("c", 10, "101")],
                "{kind:?}"
            );
            // Without `migrate`, the windows are kept as they were.
            let got = restore_with("fn init() { 0 } fn add(acc, r) { acc + r.v }", kind)
                .expect("kept");
            assert_eq!(got, vec![row("a", 0, "8"), row("b", 0, "8"), row("c", 10, "1")]);
            // A failing `migrate` fails the restore, naming the state and the value.
            let err = restore_with(
                "fn init() { 0 } fn add(acc, r) { acc + r.v } \
                 fn migrate(old) { if old == 8 { throw \"no\" } old }",
                kind,
            )
            .expect_err("fails");
            assert!(err.contains("`fn migrate` failed") && err.contains("`windows`"), "{err}");
        }
    }

    #[test]
    fn carried_event_times_are_read_only_when_they_are_the_windows_own() {
        both(|| {
            // The records' `ts` says one window; the times they carry say another.
            let mut b = batch(&[("a", 1, 2), ("a", 3, 5)]);
            b.times = vec![15, 17];
            let mut carried = harness(
                count_and_sum(),
                config(Assigner::Tumbling { size: 10 }).with_carried_times(true),
            );
            carried.push(b.clone()).expect("push");
            assert_eq!(
                lines(&watermark(&mut carried, WATERMARK_END)),
                vec![row("a", 10, 20, 2, 7)]
            );
            let mut own = harness(count_and_sum(), config(Assigner::Tumbling { size: 10 }));
            own.push(b).expect("push");
            assert_eq!(lines(&watermark(&mut own, WATERMARK_END)), vec![row("a", 0, 10, 2, 7)]);
        });
    }

    #[test]
    fn a_scripted_session_window_without_fn_merge_is_invalid() {
        let yaml = |script: &str| {
            format!(
                "version: 1
pipelines:
  - id: p
    sources:
      - {{id: src, type: file, path: in.jsonl}}
    operators:
      - {{id: by, type: key_by, input: src, field: user}}
      - id: w
        type: window
        input: by
        time: processing
        window: {{session: {{gap: 30s}}}}
        script: '{script}'
    sinks:
      - {{id: out, type: file, input: w, path: out}}
"
            )
        };
        let base = "fn init() { 0 } fn add(acc, r) { acc + 1 }";
        let v = crate::validate::validate_str("p.yaml", &yaml(base), std::path::Path::new("."));
        let found: Vec<_> = v.diagnostics.iter().map(|d| (d.code, d.message.clone())).collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, weir_schema::diagnostic::codes::SCRIPT_MISSING_FUNCTION);
        assert!(found[0].1.contains("fn merge(a, b)"), "{found:?}");
        let with_merge = format!("{base} fn merge(a, b) {{ a + b }}");
        let v = crate::validate::validate_str("p.yaml", &yaml(&with_merge), std::path::Path::new("."));
        assert!(v.is_ok(true), "{:?}", v.diagnostics);
        assert!(v.plan().expect("plan").is_ok());
    }

    #[test]
    fn open_windows_are_keyed_state_under_their_key() {
        both(|| {
            let mut h = harness(count_and_sum(), config(Assigner::Tumbling { size: 10 }));
            h.push(batch(&[("a", 1, 1), ("a", 15, 1)])).expect("push");
            assert!(h.operator.snapshot(1, &mut h.ctx).expect("snapshot").is_none());
            let state = h.ctx.state_mut().expect("state");
            let fields: BTreeMap<String, ()> = state
                .map_keys(StateId(0), &key("a"))
                .expect("map")
                .into_iter()
                .map(|f| (f, ()))
                .collect();
            assert_eq!(fields.keys().cloned().collect::<Vec<_>>(), vec!["0", "10"]);
        });
    }
}
