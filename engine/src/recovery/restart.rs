//! Restart strategies (Flink's): `fixed_delay`, `failure_rate`, `exponential_delay` and
//! `none`, built from a [`RestartSpec`], as a pure state machine with time injected.
//!
//! Each failure is reported with [`RestartStrategy::on_failure`], which looks only at the
//! failure's [`ErrorClass`] and the history of earlier failures and answers
//! [`Decision::Restart`] (after a delay, with the attempt number) or [`Decision::GiveUp`]
//! (with a reason naming the strategy, the class and the cause). Every class counts against
//! the same budget: a deterministic user-script error exhausts it quickly, which is the point
//! of having one. Randomness (the jitter of `exponential_delay`) comes from an injectable
//! [`JitterSource`].

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use weir_schema::RestartSpec;

use crate::base::error::{ErrorClass, RunError};

/// One failure of a pipeline (or of the region that restarts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The broad cause; the only thing strategies look at besides history.
    pub class: ErrorClass,
    /// What happened, for the give-up report.
    pub message: String,
}

impl Failure {
    /// A failure of a class with a message.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
        }
    }
}

impl From<&RunError> for Failure {
    fn from(e: &RunError) -> Self {
        Self::new(e.class(), e.to_string())
    }
}

/// A human name for an error class.
pub fn class_name(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Io => "external I/O error",
        ErrorClass::Data => "user script or data error",
        ErrorClass::Config => "configuration error",
        ErrorClass::Internal => "internal error (a bug in Weir)",
    }
}

/// What to do after a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Restart after `delay`; this is restart number `attempt` (from 1; for
    /// `exponential_delay`, counted since the last reset).
    Restart {
        /// How long to wait before restarting.
        delay: Duration,
        /// The restart's number.
        attempt: u32,
    },
    /// Do not restart: the pipeline fails.
    GiveUp {
        /// Why, naming the strategy, its limit and the last failure.
        reason: String,
    },
}

/// A source of uniform random numbers in `[0, 1)` for jitter.
pub trait JitterSource: Send {
    /// The next sample, in `[0, 1)`.
    fn next_unit(&mut self) -> f64;
}

/// A small seeded generator (SplitMix64): deterministic for a given seed.
#[derive(Clone, Debug)]
pub struct SeededJitter(u64);

impl SeededJitter {
    /// A generator with a fixed seed (tests, reproducible runs).
    #[cfg(any(test, feature = "testkit"))]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator seeded from the process's random hasher keys.
    pub fn from_entropy() -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        Self(h.finish())
    }
}

impl JitterSource for SeededJitter {
    fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 53 random bits → [0, 1).
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Debug)]
enum Policy {
    None,
    FixedDelay {
        attempts: u32,
        delay: Duration,
    },
    FailureRate {
        max_failures: u32,
        interval: Duration,
        delay: Duration,
    },
    ExponentialDelay {
        initial: Duration,
        max: Duration,
        multiplier: f64,
        reset_after: Duration,
        jitter: f64,
        attempts: Option<u32>,
    },
}

/// A restart strategy with its history (see the module docs).
pub struct RestartStrategy {
    policy: Policy,
    /// Restarts granted so far (since the last reset for `exponential_delay`).
    restarts: u32,
    /// `failure_rate`: times of earlier failures inside the window.
    window: VecDeque<Instant>,
    /// `exponential_delay`: the delay before jitter for the next restart.
    next_backoff: Duration,
    /// `exponential_delay`: when the pipeline was last restarted (failure time + delay).
    running_since: Option<Instant>,
    jitter: Box<dyn JitterSource>,
}

impl std::fmt::Debug for RestartStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestartStrategy")
            .field("policy", &self.policy)
            .field("restarts", &self.restarts)
            .finish_non_exhaustive()
    }
}

impl RestartStrategy {
    /// The strategy a spec declares, with jitter seeded from entropy. Out-of-range numbers
    /// that validation should have rejected are clamped (a multiplier below 1 acts as 1,
    /// jitter outside `[0, 1]` is clamped into it).
    pub fn from_spec(spec: &RestartSpec) -> Self {
        let policy = match spec {
            RestartSpec::None => Policy::None,
            RestartSpec::FixedDelay(s) => Policy::FixedDelay {
                attempts: s.attempts,
                delay: s.delay.get(),
            },
            RestartSpec::FailureRate(s) => Policy::FailureRate {
                max_failures: s.max_failures,
                interval: s.interval.get(),
                delay: s.delay.get(),
            },
            RestartSpec::ExponentialDelay(s) => Policy::ExponentialDelay {
                initial: s.initial.get(),
                max: s.max.get().max(s.initial.get()),
                multiplier: if s.multiplier.is_finite() && s.multiplier >= 1.0 {
                    s.multiplier
                } else {
                    1.0
                },
                reset_after: s.reset_after.get(),
                jitter: if s.jitter.is_finite() {
                    s.jitter.clamp(0.0, 1.0)
                } else {
                    0.0
                },
                attempts: s.attempts,
            },
        };
        let next_backoff = match &policy {
            Policy::ExponentialDelay { initial, .. } => *initial,
            _ => Duration::ZERO,
        };
        Self {
            policy,
            restarts: 0,
            window: VecDeque::new(),
            next_backoff,
            running_since: None,
            jitter: Box::new(SeededJitter::from_entropy()),
        }
    }

    /// Replaces the jitter source (tests inject a seeded or fixed one).
    #[must_use]
    #[cfg(any(test, feature = "testkit"))]
    pub fn with_jitter(mut self, jitter: Box<dyn JitterSource>) -> Self {
        self.jitter = jitter;
        self
    }

    /// The strategy's YAML name.
    pub fn name(&self) -> &'static str {
        match self.policy {
            Policy::None => "none",
            Policy::FixedDelay { .. } => "fixed_delay",
            Policy::FailureRate { .. } => "failure_rate",
            Policy::ExponentialDelay { .. } => "exponential_delay",
        }
    }

    /// Decides what follows a failure at `now`.
    pub fn on_failure(&mut self, now: Instant, cause: &Failure) -> Decision {
        let name = self.name();
        let give_up = |why: String| Decision::GiveUp {
            reason: format!(
                "restart strategy `{name}` gave up: {why}; last failure ({}): {}",
                class_name(cause.class),
                cause.message
            ),
        };
        match self.policy.clone() {
            Policy::None => give_up("it never restarts".into()),
            Policy::FixedDelay { attempts, delay } => {
                if self.restarts >= attempts {
                    return give_up(format!("all {attempts} restart attempts used"));
                }
                self.restarts += 1;
                Decision::Restart {
                    delay,
                    attempt: self.restarts,
                }
            }
            Policy::FailureRate {
                max_failures,
                interval,
                delay,
            } => {
                // Earlier failures still inside the window `(now - interval, now]`.
                while self
                    .window
                    .front()
                    .is_some_and(|&t| now.saturating_duration_since(t) >= interval)
                {
                    self.window.pop_front();
                }
                if self.window.len() >= max_failures as usize {
                    return give_up(format!(
                        "{} failures within {interval:?} (at most {max_failures} restarts per \
                         interval)",
                        self.window.len() + 1
                    ));
                }
                self.window.push_back(now);
                self.restarts += 1;
                Decision::Restart {
                    delay,
                    attempt: self.restarts,
                }
            }
            Policy::ExponentialDelay {
                initial,
                max,
                multiplier,
                reset_after,
                jitter,
                attempts,
            } => {
                if self
                    .running_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= reset_after)
                {
                    self.restarts = 0;
                    self.next_backoff = initial;
                }
                if let Some(limit) = attempts
                    && self.restarts >= limit
                {
                    return give_up(format!(
                        "{limit} restarts without {reset_after:?} of failure-free running"
                    ));
                }
                self.restarts += 1;
                let base = self.next_backoff;
                let spread = 1.0 + jitter * (2.0 * self.jitter.next_unit() - 1.0);
                let delay = scale(base, spread, max);
                self.next_backoff = scale(base, multiplier, max);
                self.running_since = Some(now + delay);
                Decision::Restart {
                    delay,
                    attempt: self.restarts,
                }
            }
        }
    }
}

/// `d * factor`, capped at `max` (and at `max` when the product is not representable).
fn scale(d: Duration, factor: f64, max: Duration) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor.max(0.0))
        .unwrap_or(max)
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_schema::units::DurationSpec;
    use weir_schema::{ExponentialDelaySpec, FailureRateSpec, FixedDelaySpec};

    const SEC: Duration = Duration::from_secs(1);

    fn failure() -> Failure {
        Failure::new(ErrorClass::Data, "script threw on record 42")
    }

    fn restart(d: &Decision) -> (Duration, u32) {
        match d {
            Decision::Restart { delay, attempt } => (*delay, *attempt),
            Decision::GiveUp { reason } => panic!("gave up: {reason}"),
        }
    }

    /// Always returns the same sample.
    struct Fixed(f64);
    impl JitterSource for Fixed {
        fn next_unit(&mut self) -> f64 {
            self.0
        }
    }

    #[test]
    fn none_never_restarts() {
        let mut s = RestartStrategy::from_spec(&RestartSpec::None);
        let d = s.on_failure(Instant::now(), &failure());
        let Decision::GiveUp { reason } = d else {
            panic!("restarted: {d:?}");
        };
        assert!(reason.contains("`none`"), "{reason}");
        assert!(reason.contains("user script"), "{reason}");
        assert!(reason.contains("record 42"), "{reason}");
    }

    #[test]
    fn fixed_delay_restarts_attempts_times_with_the_same_delay() {
        let mut s = RestartStrategy::from_spec(&RestartSpec::FixedDelay(FixedDelaySpec {
            attempts: 3,
            delay: DurationSpec::from_millis(500),
        }));
        let t0 = Instant::now();
        for k in 1..=3 {
            let d = s.on_failure(t0 + k * 3600 * SEC, &failure());
            assert_eq!(restart(&d), (Duration::from_millis(500), k));
        }
        let d = s.on_failure(t0 + 99 * 3600 * SEC, &failure());
        assert!(
            matches!(&d, Decision::GiveUp { reason } if reason.contains("all 3 restart attempts")),
            "{d:?}"
        );
    }

    #[test]
    fn failure_rate_counts_failures_in_a_sliding_window() {
        let mut s = RestartStrategy::from_spec(&RestartSpec::FailureRate(FailureRateSpec {
            max_failures: 2,
            interval: DurationSpec::from_secs(60),
            delay: DurationSpec::from_secs(1),
        }));
        let t0 = Instant::now();
        let f = failure();
        assert_eq!(restart(&s.on_failure(t0, &f)), (SEC, 1));
        assert_eq!(restart(&s.on_failure(t0 + 30 * SEC, &f)), (SEC, 2));
        // A third failure within 60 s of the first two: give up.
        let mut probe = RestartStrategy::from_spec(&RestartSpec::FailureRate(FailureRateSpec {
            max_failures: 2,
            interval: DurationSpec::from_secs(60),
            delay: DurationSpec::from_secs(1),
        }));
        let _ = probe.on_failure(t0, &f);
        let _ = probe.on_failure(t0 + 30 * SEC, &f);
        assert!(matches!(
            probe.on_failure(t0 + 59 * SEC, &f),
            Decision::GiveUp { .. }
        ));
        // At 60 s the first failure has left the window: restart.
        assert_eq!(restart(&s.on_failure(t0 + 60 * SEC, &f)), (SEC, 3));
        // At 100 s the window (40 s, 100 s] holds only the 60 s failure: restart.
        assert_eq!(restart(&s.on_failure(t0 + 100 * SEC, &f)), (SEC, 4));
        assert!(matches!(
            s.on_failure(t0 + 101 * SEC, &f),
            Decision::GiveUp { .. }
        ));
    }

    #[test]
    fn failure_rate_with_one_failure_allows_one_restart_per_interval() {
        let mut s = RestartStrategy::from_spec(&RestartSpec::FailureRate(FailureRateSpec {
            max_failures: 1,
            interval: DurationSpec::from_secs(60),
            delay: DurationSpec::from_secs(1),
        }));
        let t0 = Instant::now();
        assert_eq!(restart(&s.on_failure(t0, &failure())).1, 1);
        assert!(matches!(
            s.on_failure(t0 + 10 * SEC, &failure()),
            Decision::GiveUp { .. }
        ));
    }

    fn exponential(jitter: f64, attempts: Option<u32>) -> RestartStrategy {
        RestartStrategy::from_spec(&RestartSpec::ExponentialDelay(ExponentialDelaySpec {
            initial: DurationSpec::from_secs(1),
            max: DurationSpec::from_secs(10),
            multiplier: 2.0,
            reset_after: DurationSpec::from_secs(60),
            jitter,
            attempts,
        }))
    }

    #[test]
    fn exponential_delay_grows_by_the_multiplier_up_to_max() {
        let mut s = exponential(0.0, None);
        let t0 = Instant::now();
        let delays: Vec<u64> = (0..6)
            .map(|k| restart(&s.on_failure(t0 + k * SEC, &failure())).0.as_secs())
            .collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn exponential_delay_resets_after_reset_after_without_failure() {
        let mut s = exponential(0.0, Some(3));
        let t0 = Instant::now();
        assert_eq!(restart(&s.on_failure(t0, &failure())), (SEC, 1));
        assert_eq!(
            restart(&s.on_failure(t0 + 5 * SEC, &failure())),
            (2 * SEC, 2)
        );
        // Restarted at 7 s; failing at 66 s is 59 s of running: no reset.
        assert_eq!(
            restart(&s.on_failure(t0 + 66 * SEC, &failure())),
            (4 * SEC, 3)
        );
        assert!(
            matches!(
                s.on_failure(t0 + 71 * SEC, &failure()),
                Decision::GiveUp { .. }
            ),
            "attempts exhausted"
        );
        // Restarted at 70 s; 60 s of running later the delay and the attempts reset.
        assert_eq!(restart(&s.on_failure(t0 + 130 * SEC, &failure())), (SEC, 1));
        assert_eq!(
            restart(&s.on_failure(t0 + 131 * SEC, &failure())),
            (2 * SEC, 2)
        );
    }

    #[test]
    fn exponential_delay_jitter_stays_within_its_bounds() {
        let mut s = exponential(0.25, None).with_jitter(Box::new(SeededJitter::new(7)));
        let t0 = Instant::now();
        let mut base = 1.0_f64;
        let (mut below, mut above) = (false, false);
        for k in 0..200 {
            let (delay, _) = restart(&s.on_failure(t0 + k * SEC, &failure()));
            let d = delay.as_secs_f64();
            let lo = base * 0.75;
            let hi = (base * 1.25).min(10.0);
            assert!(d >= lo - 1e-9 && d <= hi + 1e-9, "{d} not in [{lo}, {hi}]");
            below |= d < base;
            above |= d > base;
            base = (base * 2.0).min(10.0);
        }
        assert!(below && above, "jitter spreads both ways");

        // The extremes of the sample map to the extremes of the spread.
        let mut lo = exponential(0.5, None).with_jitter(Box::new(Fixed(0.0)));
        assert_eq!(restart(&lo.on_failure(t0, &failure())).0, SEC / 2);
        let mut hi = exponential(0.5, None).with_jitter(Box::new(Fixed(0.999_999)));
        let d = restart(&hi.on_failure(t0, &failure())).0.as_secs_f64();
        assert!((d - 1.5).abs() < 1e-3, "{d}");
    }

    #[test]
    fn seeded_jitter_is_deterministic_and_in_range() {
        let mut a = SeededJitter::new(1);
        let mut b = SeededJitter::new(1);
        for _ in 0..1000 {
            let x = a.next_unit();
            assert_eq!(x, b.next_unit());
            assert!((0.0..1.0).contains(&x));
        }
    }

    #[test]
    fn failures_convert_from_run_errors_with_their_class() {
        let e = RunError::Internal("oops".into());
        let f = Failure::from(&e);
        assert_eq!(f.class, ErrorClass::Internal);
        assert!(f.message.contains("oops"));
    }
}
