//! Event time at the source: reading each record's time from its `event_time.field`
//! ([`TimeExtractor`]: epoch ms, epoch s or RFC 3339), turning the times seen into watermarks
//! per split ([`WatermarkGenerator`]: largest time − `max_out_of_orderness` − 1 ms, minimum
//! over the splits that are not idle, never going back), and [`EventTimeSource`], the wrapper
//! the registry puts around any source that declares `event_time`. The wrapper hands its
//! watermarks to the task between polls ([`Source::take_watermark`]) and keeps the generator's
//! state in the source's snapshot, so a restored run starts from the watermark the failed run
//! had sent (it is handed out again before the first poll) and judges lateness alike.
//!
//! A record whose time is missing or unreadable is a record the source cannot read: it goes
//! through the source's `on_error` (fail, skip, dead letter). Sources without `event_time`
//! are never wrapped and pay nothing.
//!
//! Splits: a source that reads several splits at once marks where each split's records begin
//! in its output ([`SourceContext::mark_split`]) and when a split is finished
//! ([`SourceContext::end_split`]); without marks, everything is one split.

use rhai::Dynamic;
use serde::{Deserialize, Serialize};
use weir_schema::{EventTimeSpec, SourceOnError};

use super::{BadRecord, BadRecords, Poll, Source, SourceContext};
use crate::base::error::{Result, RunError};
use crate::base::message::{WATERMARK_MIN, Watermark};
use crate::record::event_time::TimeExtractor;

/// One split's progress in a [`WatermarkGenerator`].
#[derive(Clone, Copy, Debug)]
struct SplitClock {
    id: u64,
    /// The largest event time seen.
    max: i64,
    /// Processing time of its last record; [`i64::MIN`] right after a restore (set on the
    /// next look at the clock).
    active_at: i64,
}

/// The generator's part of a source snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct GeneratorState {
    /// The last watermark handed out.
    emitted: i64,
    /// `(split id, largest event time)` of every split not finished.
    splits: Vec<(u64, i64)>,
}

/// Watermarks of one source subtask from the event times of its records, per split.
#[derive(Clone, Debug)]
pub struct WatermarkGenerator {
    out_of_orderness: i64,
    idle_timeout: Option<i64>,
    splits: Vec<SplitClock>,
    /// The last watermark handed out (never decreases).
    emitted: i64,
    /// Whether the last thing handed out was [`Watermark::Idle`].
    idle: bool,
    /// Processing time of the last record (or of the first look at the clock).
    last_record_at: Option<i64>,
}

impl WatermarkGenerator {
    /// A generator with nothing seen yet.
    pub fn new(spec: &EventTimeSpec) -> Self {
        Self {
            out_of_orderness: spec.out_of_orderness_ms(),
            idle_timeout: spec
                .idle_timeout
                .map(|d| i64::try_from(d.get().as_millis()).unwrap_or(i64::MAX)),
            splits: Vec::new(),
            emitted: WATERMARK_MIN,
            idle: false,
            last_record_at: None,
        }
    }

    /// The index of split `id`, added when new.
    fn split(&mut self, id: u64) -> usize {
        if let Some(i) = self.splits.iter().position(|s| s.id == id) {
            return i;
        }
        self.splits.push(SplitClock {
            id,
            max: WATERMARK_MIN,
            active_at: i64::MIN,
        });
        self.splits.len() - 1
    }

    /// Split `id` is assigned to this subtask but not read yet: until its first record it
    /// holds the watermark at [`WATERMARK_MIN`] and is never idle (its records are waiting,
    /// not missing). A split already known is left as it is.
    pub fn assign(&mut self, id: u64) {
        match self.splits.iter_mut().find(|s| s.id == id) {
            // Known but never read from (e.g. restored before its first record).
            Some(s) if s.max == WATERMARK_MIN => s.active_at = i64::MAX,
            Some(_) => {}
            None => self.splits.push(SplitClock {
                id,
                max: WATERMARK_MIN,
                active_at: i64::MAX,
            }),
        }
    }

    /// A record of split index `split` with event time `ts` arrived at processing time `now`.
    fn observe(&mut self, split: usize, ts: i64, now: i64) {
        let s = &mut self.splits[split];
        s.max = s.max.max(ts);
        s.active_at = now;
    }

    /// Split `id` is finished: it no longer holds the watermark back.
    pub fn end_split(&mut self, id: u64) {
        self.splits.retain(|s| s.id != id);
    }

    /// What to hand out now, at processing time `now`: a higher watermark, the watermark
    /// again when the subtask comes back from idle, [`Watermark::Idle`] when every split has
    /// been idle for `idle_timeout` (or, with no split at all, nothing was read for that
    /// long); otherwise nothing.
    pub fn watermark(&mut self, now: i64) -> Option<Watermark> {
        let last = *self.last_record_at.get_or_insert(now);
        let mut min: Option<i64> = None;
        for s in &mut self.splits {
            if s.active_at == i64::MIN {
                s.active_at = now;
            }
            // A split not started (`assign`) is never idle: `active_at` is in the future.
            if self
                .idle_timeout
                .is_some_and(|t| now.saturating_sub(s.active_at) >= t)
            {
                continue;
            }
            let w = s
                .max
                .saturating_sub(self.out_of_orderness)
                .saturating_sub(1);
            min = Some(min.map_or(w, |m| m.min(w)));
        }
        match min {
            Some(w) => {
                let w = w.max(self.emitted);
                if w > self.emitted || self.idle {
                    self.emitted = w;
                    self.idle = false;
                    return Some(Watermark::At(w));
                }
                None
            }
            None => {
                let idle = !self.splits.is_empty()
                    || self
                        .idle_timeout
                        .is_some_and(|t| now.saturating_sub(last) >= t);
                if idle && !self.idle {
                    self.idle = true;
                    return Some(Watermark::Idle);
                }
                None
            }
        }
    }

    /// The watermark last handed out ([`WATERMARK_MIN`] before any).
    pub fn current(&self) -> i64 {
        self.emitted
    }

    fn state(&self) -> GeneratorState {
        GeneratorState {
            emitted: self.emitted,
            splits: self.splits.iter().map(|s| (s.id, s.max)).collect(),
        }
    }

    /// Takes over the states of old subtasks (one for a plain restore, several after a
    /// rescale): every split they had, and the smallest of their watermarks.
    fn load(&mut self, states: &[GeneratorState]) {
        self.splits.clear();
        for st in states {
            for &(id, max) in &st.splits {
                let i = self.split(id);
                self.splits[i].max = self.splits[i].max.max(max);
            }
        }
        self.emitted = states
            .iter()
            .map(|s| s.emitted)
            .min()
            .unwrap_or(WATERMARK_MIN);
        self.idle = false;
    }
}

/// The first byte of a source position that carries a generator's state: `0xc1` is never
/// used in MessagePack, the encoding of every source's own position, so no position starts
/// with it.
const ENVELOPE: [u8; 4] = [0xc1, b'W', b'M', 1];

/// A source position with the generator's state in front: [`ENVELOPE`], the state's length
/// (u32, little endian), the state (MessagePack), then the source's own position.
fn wrap_position(state: &GeneratorState, position: &[u8]) -> Result<Vec<u8>> {
    let encoded = crate::record::encode(state)
        .map_err(|e| RunError::State(format!("cannot encode a watermark generator: {e}")))?;
    let len = u32::try_from(encoded.len())
        .map_err(|_| RunError::State("watermark generator state too large".into()))?;
    let mut out = Vec::with_capacity(8 + encoded.len() + position.len());
    out.extend_from_slice(&ENVELOPE);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&encoded);
    out.extend_from_slice(position);
    Ok(out)
}

/// Splits a position written by [`wrap_position`] into the generator's state and the
/// source's own position; a position without the envelope (taken before `event_time` was
/// declared) is the source's alone.
fn unwrap_position(bytes: &[u8]) -> Result<(Option<GeneratorState>, &[u8])> {
    let Some(rest) = bytes.strip_prefix(&ENVELOPE) else {
        return Ok((None, bytes));
    };
    let bad = || RunError::State("a source position with a malformed watermark state".into());
    let len = rest
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(bad)? as usize;
    let state = rest.get(4..4 + len).ok_or_else(bad)?;
    let state: GeneratorState = crate::record::decode(state).map_err(|_| bad())?;
    Ok((Some(state), &rest[4 + len..]))
}

/// The source's own position inside `bytes`, and the watermark the generator had handed out
/// (`weir inspect`).
///
/// # Errors
/// A malformed envelope.
pub fn inner_position(bytes: &[u8]) -> Result<(&[u8], Option<i64>)> {
    let (state, rest) = unwrap_position(bytes)?;
    Ok((rest, state.map(|s| s.emitted)))
}

/// A source with `event_time`: reads each record's time, drops (through `on_error`) the
/// records without one, and makes watermarks.
pub struct EventTimeSource {
    inner: Box<dyn Source>,
    extractor: TimeExtractor,
    generator: WatermarkGenerator,
    bad: BadRecords,
    /// The watermark to hand out at the next [`Source::take_watermark`].
    pending: Option<Watermark>,
    /// Records read by this subtask (numbers the records whose time cannot be read).
    read: u64,
}

impl EventTimeSource {
    /// Wraps `inner`, whose records carry their time as `spec` says; `on_error` is the
    /// source's (`fail` for a source that has none).
    pub fn new(inner: Box<dyn Source>, spec: &EventTimeSpec, on_error: &SourceOnError) -> Self {
        Self {
            inner,
            extractor: TimeExtractor::new(spec),
            generator: WatermarkGenerator::new(spec),
            bad: BadRecords::new(on_error),
            pending: None,
            read: 0,
        }
    }

    /// Reads the times of the records the inner source just appended to `out` (from `from`
    /// on), removing those without one.
    fn stamp(&mut self, out: &mut Vec<Dynamic>, from: usize, ctx: &mut SourceContext) -> Result<()> {
        let now = ctx.clock.now_ms();
        let marks = std::mem::take(&mut ctx.split_marks);
        let mut m = 0;
        let mut split_id = 0;
        let mut split: Option<usize> = None;
        let mut keep = from;
        for i in from..out.len() {
            while m < marks.len() && marks[m].0 <= i {
                split_id = marks[m].1;
                split = None;
                m += 1;
            }
            self.read += 1;
            match self.extractor.extract(&out[i]) {
                Ok(ts) => {
                    let s = match split {
                        Some(s) => s,
                        None => *split.insert(self.generator.split(split_id)),
                    };
                    self.generator.observe(s, ts, now);
                    ctx.times.push(ts);
                    out.swap(keep, i);
                    keep += 1;
                }
                Err(message) => {
                    let raw = serde_json::to_vec(&out[i]).unwrap_or_default();
                    let source = ctx.source.clone();
                    self.bad.failed(
                        ctx,
                        BadRecord {
                            file: &source,
                            line: self.read,
                            raw: &raw,
                            message,
                        },
                    )?;
                }
            }
        }
        out.truncate(keep);
        if keep > from {
            self.generator.last_record_at = Some(now);
        }
        ctx.split_marks = marks;
        ctx.split_marks.clear();
        for id in ctx.assigned_splits.drain(..) {
            self.generator.assign(id);
        }
        for id in ctx.ended_splits.drain(..) {
            self.generator.end_split(id);
        }
        if let Some(w) = self.generator.watermark(now) {
            self.pending = Some(w);
        }
        Ok(())
    }

    fn source_id(ctx: &SourceContext) -> (String, String) {
        (ctx.pipeline.clone(), ctx.source.clone())
    }
}

impl Source for EventTimeSource {
    fn open(&mut self, ctx: &mut SourceContext) -> Result<()> {
        ctx.track_splits = true;
        self.inner.open(ctx)
    }

    fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll> {
        let from = out.len();
        ctx.split_marks.clear();
        // Times line up with the records from `from` on, after the ones already there.
        ctx.times.truncate(from);
        let poll = self.inner.poll(out, ctx)?;
        self.stamp(out, from, ctx)?;
        Ok(poll)
    }

    fn take_watermark(&mut self) -> Option<Watermark> {
        self.pending.take()
    }

    fn snapshot(&mut self) -> Result<Vec<u8>> {
        let position = self.inner.snapshot()?;
        wrap_position(&self.generator.state(), &position)
    }

    fn snapshot_for(&mut self, checkpoint: u64) -> Result<Vec<u8>> {
        let position = self.inner.snapshot_for(checkpoint)?;
        wrap_position(&self.generator.state(), &position)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<()> {
        self.inner.notify_checkpoint_complete(checkpoint)
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let (state, position) = unwrap_position(snapshot)?;
        self.inner.restore(position)?;
        if let Some(state) = state {
            self.generator.load(&[state]);
            self.pending = (self.generator.current() > WATERMARK_MIN)
                .then(|| Watermark::At(self.generator.current()));
        }
        Ok(())
    }

    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &SourceContext) -> Result<()> {
        let mut states = Vec::with_capacity(snapshots.len());
        let mut positions = Vec::with_capacity(snapshots.len());
        for bytes in snapshots {
            let (state, position) = unwrap_position(bytes).map_err(|e| {
                let (pipeline, element) = Self::source_id(ctx);
                RunError::Build {
                    pipeline,
                    element,
                    message: e.to_string(),
                }
            })?;
            states.extend(state);
            positions.push(position);
        }
        self.inner.restore_rescaled(&positions, ctx)?;
        if !states.is_empty() {
            self.generator.load(&states);
            self.pending = (self.generator.current() > WATERMARK_MIN)
                .then(|| Watermark::At(self.generator.current()));
        }
        Ok(())
    }

    fn lag(&mut self) -> Option<u64> {
        self.inner.lag()
    }

    fn partitions(&mut self) -> Vec<crate::base::metrics::PartitionProgress> {
        self.inner.partitions()
    }

    fn close(&mut self) -> Result<()> {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use crate::record::event_time::parse_rfc3339;
    use weir_schema::{TimeFormat, TimeUnit};
    use std::time::Duration;

    use weir_schema::units::DurationSpec;

    use super::*;
    use crate::base::clock::Clock;
    use crate::record::parse_json;

    fn spec(ooo_ms: u64, idle_ms: Option<u64>) -> EventTimeSpec {
        EventTimeSpec {
            field: "ts".into(),
            unit: None,
            format: None,
            max_out_of_orderness: Some(DurationSpec::from_millis(ooo_ms)),
            idle_timeout: idle_ms.map(DurationSpec::from_millis),
        }
    }

    fn rec(json: &str) -> Dynamic {
        parse_json(json.as_bytes()).expect("json")
    }

    #[test]
    fn rfc3339_times_parse_to_epoch_millis() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01.5Z"), Some(1_500));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00.250+01:00"), Some(250));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59.999Z"), Some(-1));
        assert_eq!(
            parse_rfc3339("2026-12-02T05:00:00.123456Z"),
            Some(1_796_187_600_123)
        );
        assert_eq!(parse_rfc3339("2024-02-29t12:00:00-00:30"), Some(1_709_209_800_000));
        for bad in [
            "2026-02-29T00:00:00Z",
            "2026-12-02 05:00:00",
            "2026-12-02T05:00:00.Z",
            "2026-13-01T00:00:00Z",
            "2026-12-02T05:00:00+1:00",
            "yesterday",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn extractors_read_ms_seconds_and_rfc3339_and_say_what_is_wrong() {
        let ms = TimeExtractor::new(&spec(0, None));
        assert_eq!(ms.extract(&rec(r#"{"ts": 1500}"#)), Ok(1_500));
        assert_eq!(ms.extract(&rec(r#"{"ts": 1500.9}"#)), Ok(1_500));
        let e = ms.extract(&rec(r#"{"t": 1}"#)).expect_err("missing");
        assert!(e.contains("no event-time field `ts`"), "{e}");
        let e = ms.extract(&rec(r#"{"ts": "soon"}"#)).expect_err("string");
        assert!(e.contains("not a number of epoch milliseconds"), "{e}");
        let mut s = spec(0, None);
        s.field = "meta.at".into();
        s.unit = Some(TimeUnit::S);
        let secs = TimeExtractor::new(&s);
        assert_eq!(secs.extract(&rec(r#"{"meta": {"at": 2}}"#)), Ok(2_000));
        assert_eq!(secs.extract(&rec(r#"{"meta": {"at": 2.25}}"#)), Ok(2_250));
        s.unit = None;
        s.format = Some(TimeFormat::Rfc3339);
        let text = TimeExtractor::new(&s);
        assert_eq!(
            text.extract(&rec(r#"{"meta": {"at": "1970-01-01T00:00:02Z"}}"#)),
            Ok(2_000)
        );
        assert!(text.extract(&rec(r#"{"meta": {"at": 5}}"#)).is_err());
    }

    #[test]
    fn the_watermark_trails_the_largest_time_per_split_and_takes_the_minimum() {
        let mut g = WatermarkGenerator::new(&spec(100, None));
        assert_eq!(g.watermark(0), None, "nothing seen");
        let a = g.split(1);
        g.observe(a, 1_000, 0);
        g.observe(a, 900, 0);
        assert_eq!(g.watermark(0), Some(Watermark::At(899)));
        assert_eq!(g.watermark(0), None, "unchanged: nothing new");
        let b = g.split(2);
        g.observe(b, 500, 0);
        assert_eq!(g.watermark(0), None, "split 2 holds it back; never goes back");
        g.observe(b, 2_000, 0);
        g.observe(a, 1_500, 0);
        assert_eq!(g.watermark(0), Some(Watermark::At(1_399)), "min over the splits");
        g.end_split(1);
        assert_eq!(g.watermark(0), Some(Watermark::At(1_899)), "a finished split lets go");
    }

    #[test]
    fn a_split_assigned_but_not_read_yet_holds_the_watermark_and_is_never_idle() {
        // One reader, two files read one after the other: the second file's records must
        // not be late against the first file's progress.
        let mut g = WatermarkGenerator::new(&spec(0, Some(1_000)));
        g.assign(1);
        g.assign(2);
        let a = g.split(1);
        g.observe(a, 100_000, 0);
        assert_eq!(g.watermark(0), None, "split 2 is waiting: no watermark yet");
        assert_eq!(g.watermark(60_000), None, "a waiting split never goes idle");
        g.end_split(1);
        g.assign(2);
        let b = g.split(2);
        g.observe(b, 50, 60_000);
        assert_eq!(g.watermark(60_000), Some(Watermark::At(49)));
    }

    #[test]
    fn idle_splits_stop_holding_back_and_come_back_when_they_advance() {
        let mut g = WatermarkGenerator::new(&spec(0, Some(1_000)));
        let (a, b) = (g.split(1), g.split(2));
        g.observe(a, 100, 0);
        g.observe(b, 5_000, 0);
        assert_eq!(g.watermark(0), Some(Watermark::At(99)));
        // Split 1 goes quiet; split 2 goes on.
        g.observe(b, 6_000, 900);
        assert_eq!(g.watermark(900), None);
        assert_eq!(g.watermark(1_000), Some(Watermark::At(5_999)), "split 1 is idle");
        // Both quiet: the subtask is idle.
        assert_eq!(g.watermark(1_900), Some(Watermark::Idle));
        assert_eq!(g.watermark(2_000), None, "said once");
        // Split 1 comes back below the watermark: re-included, the watermark does not go back.
        g.observe(a, 200, 2_100);
        assert_eq!(g.watermark(2_100), Some(Watermark::At(5_999)));
        g.observe(a, 9_000, 2_200);
        assert_eq!(g.watermark(2_200), Some(Watermark::At(8_999)), "split 2 idle again");
    }

    /// A source that appends what it is given, marking two splits.
    struct Scripted {
        polls: Vec<Vec<(u64, Vec<&'static str>)>>,
        ended: Vec<Vec<u64>>,
        position: u64,
        restored: Option<Vec<u8>>,
    }

    impl Source for Scripted {
        fn poll(&mut self, out: &mut Vec<Dynamic>, ctx: &mut SourceContext) -> Result<Poll> {
            if self.polls.is_empty() {
                return Ok(Poll::Done);
            }
            for (split, records) in self.polls.remove(0) {
                ctx.mark_split(split, out.len());
                out.extend(records.into_iter().map(rec));
            }
            for id in self.ended.remove(0) {
                ctx.end_split(id);
            }
            self.position += 1;
            Ok(Poll::Ready)
        }

        fn snapshot(&mut self) -> Result<Vec<u8>> {
            crate::record::encode(&self.position).map_err(|e| RunError::State(e.to_string()))
        }

        fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
            self.restored = Some(snapshot.to_vec());
            Ok(())
        }
    }

    fn ctx(clock: &Clock, on_error_skip: bool) -> (SourceContext, SourceOnError) {
        let mut c = SourceContext::new("p", "src", 0, 1, None);
        c.clock = clock.clone();
        let on_error = if on_error_skip {
            SourceOnError::Skip
        } else {
            SourceOnError::Fail
        };
        (c, on_error)
    }

    #[test]
    fn the_wrapper_stamps_per_split_applies_on_error_and_checkpoints_its_generator() {
        let clock = Clock::manual(0);
        let (mut c, on_error) = ctx(&clock, true);
        let inner = Scripted {
            polls: vec![
                vec![
                    (1, vec![r#"{"ts": 1000}"#, r#"{"ts": "bad"}"#]),
                    (2, vec![r#"{"ts": 400}"#, r#"{"x": 1}"#, r#"{"ts": 300}"#]),
                ],
                vec![(1, vec![r#"{"ts": 3000}"#])],
            ],
            ended: vec![vec![], vec![2]],
            position: 0,
            restored: None,
        };
        let mut s = EventTimeSource::new(Box::new(inner), &spec(0, None), &on_error);
        s.open(&mut c).expect("open");
        assert!(c.track_splits);
        let mut out = Vec::new();
        s.poll(&mut out, &mut c).expect("poll");
        assert_eq!(out.len(), 3, "two records without a time are skipped");
        assert_eq!(c.skipped, 2);
        assert_eq!(s.take_watermark(), Some(Watermark::At(399)), "split 2 holds back");
        assert_eq!(s.take_watermark(), None);
        let snap = s.snapshot().expect("snapshot");
        assert_eq!(inner_position(&snap).expect("inner").1, Some(399));
        out.clear();
        s.poll(&mut out, &mut c).expect("poll");
        assert_eq!(s.take_watermark(), Some(Watermark::At(2_999)), "split 2 ended");

        // A restore hands the snapshot's watermark out first; the inner source gets its own
        // position back.
        let inner = Scripted {
            polls: vec![vec![(2, vec![r#"{"ts": 350}"#])]],
            ended: vec![vec![]],
            position: 0,
            restored: None,
        };
        let mut r = EventTimeSource::new(Box::new(inner), &spec(0, None), &on_error);
        r.open(&mut c).expect("open");
        r.restore(&snap).expect("restore");
        assert_eq!(r.take_watermark(), Some(Watermark::At(399)));
        out.clear();
        r.poll(&mut out, &mut c).expect("poll");
        assert_eq!(out.len(), 1);
        assert_eq!(
            r.take_watermark(),
            None,
            "the restored splits judge as before: split 1 at 1000, split 2 at 400"
        );
    }

    #[test]
    fn a_record_without_a_time_fails_the_source_under_on_error_fail() {
        let clock = Clock::manual(0);
        let (mut c, on_error) = ctx(&clock, false);
        let inner = Scripted {
            polls: vec![vec![(0, vec![r#"{"ts": 1}"#, r#"{"no": 1}"#])]],
            ended: vec![vec![]],
            position: 0,
            restored: None,
        };
        let mut s = EventTimeSource::new(Box::new(inner), &spec(0, None), &on_error);
        let e = s
            .poll(&mut Vec::new(), &mut c)
            .expect_err("fails")
            .to_string();
        assert!(e.contains("src:2") && e.contains("no event-time field `ts`"), "{e}");
        let dl = SourceOnError::DeadLetter("dead".into());
        let inner = Scripted {
            polls: vec![vec![(0, vec![r#"{"no": 1}"#])]],
            ended: vec![vec![]],
            position: 0,
            restored: None,
        };
        let mut s = EventTimeSource::new(Box::new(inner), &spec(0, None), &dl);
        let mut out = Vec::new();
        s.poll(&mut out, &mut c).expect("dead letter");
        assert!(out.is_empty());
        assert_eq!(c.dead_letters.len(), 1);
        let m = c.dead_letters[0].as_map_ref().expect("map");
        assert_eq!(m["raw"].to_string(), r#"{"no":1}"#);
        let _ = Duration::ZERO;
    }
}
