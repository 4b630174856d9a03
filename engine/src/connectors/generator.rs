//! The `generator` source: deterministic synthetic records. Record `i`'s fields depend only on
//! the seed, `i` and the field's position, so the same seed gives the same multiset of records
//! whatever the parallelism; subtask `s` of `p` produces `i = s, s+p, s+2p, ...`.

use std::time::{Duration, Instant};

use indexmap::IndexMap;
use rhai::{Dynamic, Map};
use weir_schema::GeneratorFieldSpec;

use super::{Poll, Source, SourceContext};
use crate::runtime::BATCH_SIZE;
use crate::runtime::error::{Result, RunError};

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
    started: Option<Instant>,
    produced: u64,
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
            started: None,
            produced: 0,
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
        }
        if self.count.is_some_and(|c| self.next >= c) {
            return Ok(Poll::Done);
        }
        Ok(Poll::Ready)
    }

    fn snapshot(&mut self) -> Result<Vec<u8>> {
        crate::record::encode(&(1u32, self.next)).map_err(|e| RunError::State(e.to_string()))
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let (_version, next): (u32, u64) =
            crate::record::decode(snapshot).map_err(|e| RunError::State(e.to_string()))?;
        self.next = next;
        Ok(())
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
            let mut ctx = SourceContext {
                pipeline: "p".into(),
                source: "g".into(),
                subtask: s,
                parallelism: p,
                skipped: 0,
            };
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
}
