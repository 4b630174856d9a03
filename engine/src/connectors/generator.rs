//! The `generator` source: deterministic synthetic records. Record `i`'s fields depend only on
//! the seed, `i` and the field's position, so the same seed gives the same multiset of records
//! whatever the parallelism; subtask `s` of `p` produces `i = s, s+p, s+2p, ...`.
//!
//! Replayable: there is no RNG state to carry (every value is a pure function of the seed and
//! `i`), so a snapshot is the next sequence number plus bookkeeping, and a restored subtask
//! continues the identical sequence. The rate limit restarts its window at the restore (no
//! burst to "catch up" the downtime). This module must not touch channels or checkpoints.
//!
//! Rescaling is refused: the sequence is interleaved over the subtasks (`i = s + k*p`), so
//! the old subtasks' positions cannot be recombined into a new interleaving without losing
//! or repeating records. The one exception is a bounded generator whose old subtasks had all
//! produced their whole sequence: nothing is left to redistribute, so every new subtask
//! accepts and produces nothing. A new subtask that receives no snapshot (added by a
//! scale-up) cannot see the others' positions; it accepts for a bounded generator and
//! produces nothing (if any old subtask had records left, the new subtask that received its
//! snapshot refuses, and with it the whole restore) and refuses for an unbounded one.

use std::time::{Duration, Instant};

use indexmap::IndexMap;
use rhai::{Dynamic, Map};
use weir_schema::GeneratorFieldSpec;

use serde::{Deserialize, Serialize};

use super::{Poll, Source, SourceContext};
use crate::base::error::{Result, RunError};
use crate::base::message::BATCH_SIZE;

/// splitmix64's output function over a state.
pub fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The field generators, prepared once.
#[derive(Clone, Debug)]
enum Field {
    Sequence(i64),
    Int(i64, u64),
    Float(f64, f64),
    Key(String, u64),
    Choice(Vec<Dynamic>),
    Timestamp(i64, i64),
    Const(Dynamic),
}

/// One generator subtask.
pub struct GeneratorSource {
    seed: u64,
    count: Option<u64>,
    rate: Option<f64>,
    fields: Vec<(String, Field)>,
    next: u64,
    stride: u64,
    subtask: u32,
    parallelism: u32,
    /// Start of the current rate-limit window (the first poll after open or restore).
    started: Option<Instant>,
    /// Records produced in the current rate-limit window.
    produced: u64,
    /// Records produced by this subtask since the very first start (carried across restores).
    emitted: u64,
    /// `(pipeline, source)` for errors and logs, from `open`.
    ids: (String, String),
}

/// The generator's snapshot, format version [`GeneratorState::VERSION`].
///
/// `next` is the only thing needed to continue; `seed` and `parallelism` are recorded so a
/// restore can tell when the sequence would not line up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct GeneratorState {
    /// Format version.
    version: u32,
    /// The seed the records were produced with.
    seed: u64,
    /// The subtask and parallelism the snapshot was taken at.
    subtask: u32,
    parallelism: u32,
    /// The sequence number of the next record this subtask produces.
    next: u64,
    /// Records this subtask produced before the snapshot (rate-limit and progress bookkeeping).
    emitted: u64,
}

impl GeneratorState {
    const VERSION: u32 = 2;
}

impl GeneratorSource {
    /// Subtask `subtask` of `parallelism`.
    ///
    /// # Errors
    /// A `choice`/`const` value that cannot become a record value.
    pub fn new(
        seed: u64,
        count: Option<u64>,
        rate: Option<u64>,
        fields: &IndexMap<String, GeneratorFieldSpec>,
        subtask: u32,
        parallelism: u32,
    ) -> std::result::Result<Self, String> {
        let to_dyn = |v: &serde_json::Value| rhai::serde::to_dynamic(v).map_err(|e| e.to_string());
        let mut out = Vec::with_capacity(fields.len());
        for (name, spec) in fields {
            let f = match spec {
                GeneratorFieldSpec::Sequence { start } => Field::Sequence(*start),
                GeneratorFieldSpec::Int { min, max } => {
                    let span = (i128::from(*max) - i128::from(*min) + 1)
                        .clamp(1, i128::from(u64::MAX)) as u64;
                    Field::Int(*min, span)
                }
                GeneratorFieldSpec::Float { min, max } => Field::Float(*min, *max),
                GeneratorFieldSpec::Key {
                    prefix,
                    cardinality,
                } => Field::Key(prefix.clone(), (*cardinality).max(1)),
                GeneratorFieldSpec::Choice { values } => Field::Choice(
                    values
                        .iter()
                        .map(to_dyn)
                        .collect::<std::result::Result<_, _>>()?,
                ),
                GeneratorFieldSpec::Timestamp { start, step } => Field::Timestamp(*start, *step),
                GeneratorFieldSpec::Const { value } => Field::Const(to_dyn(value)?),
            };
            out.push((name.clone(), f));
        }
        let p = u64::from(parallelism.max(1));
        Ok(Self {
            seed,
            count,
            rate: rate.map(|r| r as f64 / p as f64),
            fields: out,
            next: u64::from(subtask),
            stride: p,
            subtask,
            parallelism: parallelism.max(1),
            started: None,
            produced: 0,
            emitted: 0,
            ids: (String::new(), String::new()),
        })
    }

    /// Record number `i`.
    pub fn record(&self, i: u64) -> Dynamic {
        let mut m = Map::new();
        for (j, (name, f)) in self.fields.iter().enumerate() {
            let z = splitmix64(
                self.seed
                    .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .wrapping_add((j as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)),
            );
            let v = match f {
                Field::Sequence(start) => Dynamic::from(start.wrapping_add(i as i64)),
                Field::Int(min, span) => Dynamic::from(min.wrapping_add((z % span) as i64)),
                Field::Float(min, max) => {
                    Dynamic::from(min + (z >> 11) as f64 / (1u64 << 53) as f64 * (max - min))
                }
                Field::Key(prefix, card) => Dynamic::from(format!("{prefix}{}", z % card)),
                Field::Choice(values) => values[(z % values.len() as u64) as usize].clone(),
                Field::Timestamp(start, step) => {
                    Dynamic::from(start.wrapping_add(step.wrapping_mul(i as i64)))
                }
                Field::Const(v) => v.clone(),
            };
            m.insert(name.as_str().into(), v);
        }
        Dynamic::from_map(m)
    }
}

impl Source for GeneratorSource {
    fn open(&mut self, ctx: &mut SourceContext) -> Result<()> {
        self.ids = (ctx.pipeline.clone(), ctx.source.clone());
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Dynamic>, _ctx: &mut SourceContext) -> Result<Poll> {
        let started = *self.started.get_or_insert_with(Instant::now);
        let mut budget = BATCH_SIZE as u64;
        if let Some(rate) = self.rate {
            let allowed = (started.elapsed().as_secs_f64() * rate) as u64 + 1;
            let left = allowed.saturating_sub(self.produced);
            if left == 0 {
                let wait = ((self.produced + 1) as f64 / rate - started.elapsed().as_secs_f64())
                    .max(0.001);
                return Ok(Poll::Idle(Duration::from_secs_f64(wait.min(0.1))));
            }
            budget = budget.min(left);
        }
        for _ in 0..budget {
            if self.count.is_some_and(|c| self.next >= c) {
                return Ok(Poll::Done);
            }
            out.push(self.record(self.next));
            self.next += self.stride;
            self.produced += 1;
            self.emitted += 1;
        }
        if self.count.is_some_and(|c| self.next >= c) {
            return Ok(Poll::Done);
        }
        Ok(Poll::Ready)
    }

    /// Encodes [`GeneratorState`].
    fn snapshot(&mut self) -> Result<Vec<u8>> {
        let state = GeneratorState {
            version: GeneratorState::VERSION,
            seed: self.seed,
            subtask: self.subtask,
            parallelism: self.parallelism,
            next: self.next,
            emitted: self.emitted,
        };
        crate::record::encode(&state).map_err(|e| {
            RunError::State(format!(
                "source `{}`: cannot encode the generator position: {e}",
                self.ids.1
            ))
        })
    }

    /// Continues at the snapshot's sequence number. Also accepts version 1 snapshots
    /// (`(1, next)`).
    ///
    /// # Errors
    /// A malformed snapshot, or one taken at another parallelism (the interleaving of the
    /// sequence over subtasks would change, so records would be lost or repeated).
    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let (pipeline, source) = self.ids.clone();
        let state = match crate::record::decode::<GeneratorState>(snapshot) {
            Ok(state) => state,
            Err(e) => match crate::record::decode::<(u32, u64)>(snapshot) {
                Ok((1, next)) => GeneratorState {
                    version: 1,
                    seed: self.seed,
                    subtask: self.subtask,
                    parallelism: self.parallelism,
                    next,
                    emitted: 0,
                },
                _ => {
                    return Err(RunError::StateCorrupt(format!(
                        "source `{source}`: malformed generator snapshot: {e}"
                    )));
                }
            },
        };
        if state.version > GeneratorState::VERSION {
            return Err(RunError::StateMismatch(format!(
                "source `{source}`: generator snapshot version {} is newer than this build \
                 supports ({})",
                state.version,
                GeneratorState::VERSION
            )));
        }
        if state.parallelism != self.parallelism || state.subtask != self.subtask {
            return Err(RunError::Build {
                pipeline,
                element: source,
                message: format!(
                    "cannot restore generator subtask {} of {} from a snapshot of subtask {} of \
                     {}: a generator cannot change its parallelism across a restore",
                    self.subtask, self.parallelism, state.subtask, state.parallelism
                ),
            });
        }
        if state.next % self.stride != u64::from(self.subtask) % self.stride {
            return Err(RunError::State(format!(
                "source `{source}`: generator snapshot position {} is not on subtask {}'s \
                 sequence",
                state.next, self.subtask
            )));
        }
        if state.seed != self.seed {
            tracing::warn!(
                pipeline = %pipeline,
                source = %source,
                checkpoint_seed = state.seed,
                seed = self.seed,
                "Generator seed changed since the checkpoint; continuing at its position with the new seed."
            );
        }
        self.next = state.next;
        self.emitted = state.emitted;
        self.started = None;
        self.produced = 0;
        Ok(())
    }

    /// Refuses a change of parallelism (see the module docs), unless every old subtask this
    /// one takes over had produced its whole bounded sequence: then this subtask produces
    /// nothing. With no snapshot, a bounded generator produces nothing and an unbounded one
    /// refuses.
    ///
    /// # Errors
    /// A change of parallelism with records left, or a malformed snapshot.
    fn restore_rescaled(&mut self, snapshots: &[&[u8]], ctx: &SourceContext) -> Result<()> {
        if self.ids.1.is_empty() {
            self.ids = (ctx.pipeline.clone(), ctx.source.clone());
        }
        let mut old_parallelism = None;
        let mut left = Vec::new();
        for bytes in snapshots {
            // Version 1 snapshots are `(1, next)`: no subtask or parallelism recorded.
            let (subtask, parallelism, next) = match crate::record::decode::<GeneratorState>(bytes)
            {
                Ok(state) => (
                    state.subtask.to_string(),
                    Some(state.parallelism),
                    state.next,
                ),
                Err(e) => match crate::record::decode::<(u32, u64)>(bytes) {
                    Ok((1, next)) => ("(unrecorded)".to_owned(), None, next),
                    _ => {
                        return Err(RunError::StateCorrupt(format!(
                            "source `{}`: malformed generator snapshot: {e}",
                            self.ids.1
                        )));
                    }
                },
            };
            old_parallelism = old_parallelism.or(parallelism);
            if self.count.is_none_or(|c| next < c) {
                left.push(subtask);
            }
        }
        if (snapshots.is_empty() && self.count.is_none()) || !left.is_empty() {
            let old = old_parallelism.map_or_else(
                || "another parallelism".to_owned(),
                |p| format!("parallelism {p}"),
            );
            let which = if left.is_empty() {
                String::new()
            } else {
                format!(" (old subtask(s) {} had records left)", left.join(", "))
            };
            return Err(RunError::Build {
                pipeline: self.ids.0.clone(),
                element: self.ids.1.clone(),
                message: format!(
                    "a generator cannot change its parallelism across a restore: its sequence \
                     is interleaved over the subtasks (subtask s of p produces records s, s+p, \
                     s+2p, ...), so the positions saved at {old} cannot be dealt out again to \
                     subtask {} of {} without losing or repeating records{which}. To fix: keep \
                     this source's old parallelism, or give the source a new id to start its \
                     sequence over",
                    self.subtask, self.parallelism
                ),
            });
        }
        // Everything this subtask takes over was produced; with no snapshot, the subtasks
        // that received the others' positions decide (see the module docs).
        self.next = self.count.unwrap_or(u64::MAX);
        self.started = None;
        self.produced = 0;
        tracing::info!(
            pipeline = %self.ids.0,
            source = %self.ids.1,
            subtask = self.subtask,
            "Generator restored at a new parallelism with its whole sequence produced; it produces nothing more."
        );
        Ok(())
    }
}

/// A generator snapshot with its fields named (for `weir inspect`): the seed, the next
/// sequence number and the records emitted (a version 1 snapshot holds only `next`).
///
/// # Errors
/// A malformed snapshot.
pub fn describe_snapshot(bytes: &[u8]) -> Result<serde_json::Value> {
    match crate::record::decode::<GeneratorState>(bytes) {
        Ok(state) => serde_json::to_value(&state)
            .map_err(|e| RunError::State(format!("cannot describe a generator snapshot: {e}"))),
        Err(e) => match crate::record::decode::<(u32, u64)>(bytes) {
            Ok((version, next)) => Ok(serde_json::json!({"version": version, "next": next})),
            Err(_) => Err(RunError::StateCorrupt(format!(
                "malformed generator snapshot: {e}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> IndexMap<String, GeneratorFieldSpec> {
        let mut f = IndexMap::new();
        f.insert("id".to_owned(), GeneratorFieldSpec::Sequence { start: 0 });
        f.insert(
            "user".to_owned(),
            GeneratorFieldSpec::Key {
                prefix: "u".into(),
                cardinality: 10,
            },
        );
        f.insert(
            "amount".to_owned(),
            GeneratorFieldSpec::Int { min: 1, max: 100 },
        );
        f.insert(
            "x".to_owned(),
            GeneratorFieldSpec::Float { min: 0.0, max: 1.0 },
        );
        f
    }

    fn run(p: u32) -> Vec<String> {
        let mut all = Vec::new();
        for s in 0..p {
            let mut g = GeneratorSource::new(7, Some(2500), None, &fields(), s, p).expect("gen");
            let mut ctx = SourceContext::new("p", "g", s, p, None);
            loop {
                let mut out = Vec::new();
                let poll = g.poll(&mut out, &mut ctx).expect("poll");
                all.extend(out.iter().map(crate::record::excerpt));
                if poll == Poll::Done {
                    break;
                }
            }
        }
        all.sort();
        all
    }

    #[test]
    fn same_records_at_any_parallelism() {
        let one = run(1);
        assert_eq!(one.len(), 2500);
        assert_eq!(one, run(3));
        assert_eq!(one, run(4));
    }

    #[test]
    fn values_stay_in_range() {
        let g = GeneratorSource::new(1, Some(10), None, &fields(), 0, 1).expect("gen");
        for i in 0..1000 {
            let r = g.record(i);
            let m = r.as_map_ref().expect("map");
            let a = m["amount"].as_int().expect("int");
            assert!((1..=100).contains(&a));
            let x = m["x"].as_float().expect("float");
            assert!((0.0..1.0).contains(&x));
        }
    }

    fn ctx(s: u32, p: u32, restored_from: Option<u64>) -> SourceContext {
        SourceContext::new("p", "g", s, p, restored_from)
    }

    fn drain(g: &mut GeneratorSource, ctx: &mut SourceContext) -> Vec<String> {
        let mut all = Vec::new();
        loop {
            let mut out = Vec::new();
            let poll = g.poll(&mut out, ctx).expect("poll");
            all.extend(out.iter().map(crate::record::excerpt));
            if poll == Poll::Done {
                return all;
            }
        }
    }

    #[test]
    fn restore_continues_the_identical_sequence() {
        for p in [1u32, 2] {
            for s in 0..p {
                let mut first =
                    GeneratorSource::new(42, Some(5000), None, &fields(), s, p).expect("gen");
                let mut c = ctx(s, p, None);
                first.open(&mut c).expect("open");
                let mut head = Vec::new();
                assert_eq!(first.poll(&mut head, &mut c).expect("poll"), Poll::Ready);
                let snap = first.snapshot().expect("snapshot");
                let tail = drain(&mut first, &mut c);
                assert!(!tail.is_empty());

                let mut second =
                    GeneratorSource::new(42, Some(5000), None, &fields(), s, p).expect("gen");
                let mut c = ctx(s, p, Some(1));
                second.open(&mut c).expect("open");
                second.restore(&snap).expect("restore");
                assert_eq!(drain(&mut second, &mut c), tail, "subtask {s} of {p}");
                assert_eq!(second.emitted, first.emitted);
            }
        }
    }

    #[test]
    fn restore_from_a_rate_limited_run_keeps_the_sequence() {
        let mut first =
            GeneratorSource::new(3, Some(40), Some(10_000), &fields(), 0, 1).expect("gen");
        let mut c = ctx(0, 1, None);
        first.open(&mut c).expect("open");
        let mut head = Vec::new();
        while head.len() < 5 {
            if let Poll::Idle(d) = first.poll(&mut head, &mut c).expect("poll") {
                std::thread::sleep(d);
            }
        }
        let snap = first.snapshot().expect("snapshot");
        let mut tail = Vec::new();
        loop {
            let mut out = Vec::new();
            let poll = first.poll(&mut out, &mut c).expect("poll");
            tail.extend(out.iter().map(crate::record::excerpt));
            match poll {
                Poll::Done => break,
                Poll::Idle(d) => std::thread::sleep(d),
                Poll::Ready => {}
            }
        }
        let mut second =
            GeneratorSource::new(3, Some(40), Some(10_000), &fields(), 0, 1).expect("gen");
        second.open(&mut c).expect("open");
        second.restore(&snap).expect("restore");
        let mut again = Vec::new();
        loop {
            let mut out = Vec::new();
            let poll = second.poll(&mut out, &mut c).expect("poll");
            again.extend(out.iter().map(crate::record::excerpt));
            match poll {
                Poll::Done => break,
                Poll::Idle(d) => std::thread::sleep(d),
                Poll::Ready => {}
            }
        }
        assert_eq!(again, tail);
        assert_eq!(head.len() + tail.len(), 40);
    }

    #[test]
    fn version_one_snapshots_still_restore() {
        let mut g = GeneratorSource::new(7, Some(10), None, &fields(), 0, 1).expect("gen");
        let mut c = ctx(0, 1, Some(1));
        g.open(&mut c).expect("open");
        g.restore(&crate::record::encode(&(1u32, 6u64)).expect("encode"))
            .expect("restore");
        assert_eq!(drain(&mut g, &mut c).len(), 4);
    }

    #[test]
    fn restore_rejects_another_parallelism_and_garbage() {
        let mut a = GeneratorSource::new(7, Some(100), None, &fields(), 0, 2).expect("gen");
        let snap = a.snapshot().expect("snapshot");
        let mut b = GeneratorSource::new(7, Some(100), None, &fields(), 0, 3).expect("gen");
        let err = b.restore(&snap).expect_err("parallelism changed");
        assert!(err.to_string().contains("parallelism"), "{err}");
        assert!(b.restore(b"\xff\x00junk").is_err());
    }

    #[test]
    fn rescaled_restore_is_refused_with_a_clear_message() {
        let mut snaps = Vec::new();
        for s in 0..2 {
            let mut a = GeneratorSource::new(7, Some(5000), None, &fields(), s, 2).expect("gen");
            let mut c = ctx(s, 2, None);
            a.open(&mut c).expect("open");
            a.poll(&mut Vec::new(), &mut c).expect("poll");
            snaps.push(a.snapshot().expect("snapshot"));
        }
        let mut b = GeneratorSource::new(7, Some(5000), None, &fields(), 0, 3).expect("gen");
        let c = ctx(0, 3, Some(1));
        b.open(&mut c.clone()).expect("open");
        let err = b
            .restore_rescaled(&[snaps[0].as_slice()], &c)
            .expect_err("records left");
        let msg = err.to_string();
        assert!(msg.contains("interleaved"), "{msg}");
        assert!(msg.contains("parallelism 2"), "{msg}");
        assert!(msg.contains("new id"), "{msg}");
        assert!(msg.contains("old subtask(s) 0"), "{msg}");

        // A subtask added by a scale-up: refused when unbounded, nothing to do when bounded.
        let mut u = GeneratorSource::new(7, None, None, &fields(), 2, 3).expect("gen");
        let err = u
            .restore_rescaled(&[], &ctx(2, 3, Some(1)))
            .expect_err("unbounded");
        assert!(
            err.to_string()
                .contains("keep this source's old parallelism"),
            "{err}"
        );
        let mut n = GeneratorSource::new(7, Some(5000), None, &fields(), 2, 3).expect("gen");
        let mut c = ctx(2, 3, Some(1));
        n.restore_rescaled(&[], &c).expect("bounded, no snapshot");
        assert!(drain(&mut n, &mut c).is_empty());
        assert!(n.restore_rescaled(&[b"junk".as_slice()], &c).is_err());
    }

    #[test]
    fn a_finished_bounded_generator_may_rescale() {
        let mut snaps = Vec::new();
        for s in 0..3 {
            let mut a = GeneratorSource::new(7, Some(100), None, &fields(), s, 3).expect("gen");
            let mut c = ctx(s, 3, None);
            drain(&mut a, &mut c);
            snaps.push(a.snapshot().expect("snapshot"));
        }
        for s in 0..2 {
            let mut b = GeneratorSource::new(7, Some(100), None, &fields(), s, 2).expect("gen");
            let refs: Vec<&[u8]> = snaps
                .iter()
                .enumerate()
                .filter(|(j, _)| j % 2 == s as usize)
                .map(|(_, v)| v.as_slice())
                .collect();
            let mut c = ctx(s, 2, Some(1));
            b.restore_rescaled(&refs, &c).expect("all produced");
            assert!(drain(&mut b, &mut c).is_empty());
        }
        // A larger count since: records are left, refused.
        let mut b = GeneratorSource::new(7, Some(200), None, &fields(), 0, 2).expect("gen");
        assert!(
            b.restore_rescaled(&[snaps[0].as_slice()], &ctx(0, 2, Some(1)))
                .is_err()
        );
    }
}
