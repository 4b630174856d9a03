//! `weir-fuzz`: a fuzzing harness for the places where Weir reads input it does not control:
//! pipeline files (`weir validate`, `graph`, `run`, every reload) and savepoints (keyed-state
//! snapshots, checkpoint metadata, sources' `.op` state). It runs on the stable toolchain,
//! with no fuzzing engine: each [`Target`] generates input number `i` from a seeded
//! [`Rng`] (structure-aware mutations of real files, plus raw bytes), and the [`Runner`]
//! feeds the inputs to the code under test, one at a time, on a thread with the stack size
//! Weir's own threads have, recording as a [`Finding`] every input that panics, runs longer
//! than the per-input timeout, or whose peak memory exceeds the limit. An input that aborts
//! the process (a stack overflow, a failed allocation) cannot be caught in-process: the
//! runner keeps the input it is running in a file, which `scripts/fuzz.sh` saves when the
//! process dies.
//!
//! Inputs depend only on the seed and their index, so `weir-fuzz --target T --seed S --skip
//! I --inputs 1` replays input `I` exactly.
//!
//! # Adding a target
//! 1. Write a type implementing [`Target`] in its own module: `generate` builds one input
//!    from the `Rng` (start from valid inputs taken from the repository or built with the
//!    engine's own writers, then damage them; see [`bytes::mutate`] for byte-level damage);
//!    `run` feeds it to the library entry under test and returns normally whatever the
//!    input: errors are the expected outcome, only panics, hangs and runaway memory are
//!    findings.
//! 2. Register it in [`targets`].
//! 3. `scripts/fuzz.sh` runs every registered target; the seeded test in `tests/seeded.rs`
//!    runs a few thousand inputs of each in CI.
//!
//! This crate only drives Weir's public library entries; it must not change their behaviour.

pub mod bytes;
pub mod savepoint;
pub mod yaml;

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A small, fast, seedable generator (SplitMix64): inputs must be reproducible from a seed
/// and an index, with no dependency on a randomness crate's versions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The generator for input `index` of a run seeded with `seed`.
    pub fn for_input(seed: u64, index: u64) -> Self {
        let mut r = Self(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A count skewed towards small values, sometimes large: `0..=max`.
    pub fn small(&mut self, max: usize) -> usize {
        match self.below(10) {
            0..=5 => self.below(4.min(max + 1)),
            6..=8 => self.below(32.min(max + 1)),
            _ => self.below(max + 1),
        }
    }
}

/// One fuzz target: a generator of inputs and the entry point they go to.
pub trait Target: Send + Sync {
    /// A stable name (`--target NAME`, findings files).
    fn name(&self) -> &'static str;

    /// Builds one input from `rng`. Must depend on nothing but `rng` (inputs are replayed from
    /// their seed and index).
    fn generate(&self, rng: &mut Rng) -> Vec<u8>;

    /// Feeds one input to the code under test. Errors are expected outcomes: it must return
    /// normally for every input, and a panic, a hang or a runaway allocation is a finding.
    fn run(&self, input: &[u8]);
}

/// Every target `scripts/fuzz.sh` runs.
pub fn targets() -> Vec<Box<dyn Target>> {
    vec![
        Box::new(yaml::PipelineFile::from_repository()),
        Box::new(savepoint::Savepoint::new()),
    ]
}

/// What went wrong with one input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The entry point panicked (the message).
    Panic(String),
    /// The input ran longer than the timeout (the run stops there).
    Hang,
    /// The process's peak resident memory while running the input (bytes).
    Memory(u64),
}

/// An input that broke a rule.
#[derive(Clone, Debug)]
pub struct Finding {
    /// The target's name.
    pub target: &'static str,
    /// The input's index (replay with `--skip INDEX --inputs 1`).
    pub index: u64,
    /// What happened.
    pub problem: Problem,
    /// The input itself.
    pub input: Vec<u8>,
}

/// How a run goes.
#[derive(Clone, Debug)]
pub struct Config {
    /// The seed every input derives from.
    pub seed: u64,
    /// Index of the first input.
    pub skip: u64,
    /// How many inputs.
    pub inputs: u64,
    /// Longest time one input may take.
    pub timeout: Duration,
    /// Highest peak resident memory (bytes) one input may reach, measured per input on Linux.
    pub max_rss: Option<u64>,
    /// Stack size of the thread that runs the inputs (that of tokio's blocking threads,
    /// where `weir run` validates a reloaded file, by default).
    pub stack: usize,
    /// Where the input being run is kept (saved by the script when the process dies), and
    /// where findings are written.
    pub findings: Option<PathBuf>,
    /// Print progress to standard error every this many inputs (0: never).
    pub progress_every: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            seed: 1,
            skip: 0,
            inputs: 1000,
            timeout: Duration::from_secs(10),
            max_rss: None,
            stack: 2 * 1024 * 1024,
            findings: None,
            progress_every: 0,
        }
    }
}

/// The outcome of a run.
#[derive(Debug, Default)]
pub struct Report {
    /// Inputs run to completion.
    pub inputs: u64,
    /// Every input that broke a rule.
    pub findings: Vec<Finding>,
    /// The highest per-input peak resident memory seen (bytes; 0 when not measured).
    pub peak_rss: u64,
    /// The largest input generated (bytes).
    pub largest_input: usize,
    /// The longest time one input took, and its index.
    pub slowest: Duration,
    /// The index of that input.
    pub slowest_index: u64,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// Runs one target's inputs.
pub struct Runner;

impl Runner {
    /// Runs `config.inputs` inputs of `target`. Returns early on a hang (the thread running
    /// it cannot be stopped); every other finding is recorded and the run goes on.
    pub fn run(target: Arc<dyn Target>, config: &Config) -> Report {
        let started = Instant::now();
        let current = Arc::new(AtomicU64::new(u64::MAX));
        let since = Arc::new(Mutex::new(Instant::now()));
        let finished = Arc::new(AtomicBool::new(false));
        let worker = {
            let (target, config) = (Arc::clone(&target), config.clone());
            let (current, since, finished) = (
                Arc::clone(&current),
                Arc::clone(&since),
                Arc::clone(&finished),
            );
            std::thread::Builder::new()
                .name("weir-fuzz".into())
                .stack_size(config.stack)
                .spawn(move || {
                    let report = run_inputs(&*target, &config, &current, &since);
                    finished.store(true, Ordering::SeqCst);
                    report
                })
                .expect("cannot start the fuzzing thread")
        };
        // The watchdog: a hang cannot be interrupted, so it is recorded and the run ends.
        loop {
            std::thread::sleep(Duration::from_millis(50));
            if finished.load(Ordering::SeqCst) {
                break;
            }
            let index = current.load(Ordering::SeqCst);
            let running = since.lock().map(|t| t.elapsed()).unwrap_or_default();
            if index != u64::MAX && running > config.timeout {
                let mut rng = Rng::for_input(config.seed, index);
                let input = target.generate(&mut rng);
                let finding = Finding {
                    target: target.name(),
                    index,
                    problem: Problem::Hang,
                    input,
                };
                save_finding(config, &finding);
                return Report {
                    inputs: index - config.skip,
                    findings: vec![finding],
                    elapsed: started.elapsed(),
                    ..Report::default()
                };
            }
        }
        let mut report = worker.join().unwrap_or_default();
        report.elapsed = started.elapsed();
        if let Some(dir) = &config.findings {
            let _ = std::fs::remove_file(current_path(dir, target.name()));
        }
        report
    }
}

fn run_inputs(
    target: &dyn Target,
    config: &Config,
    current: &AtomicU64,
    since: &Mutex<Instant>,
) -> Report {
    let mut report = Report::default();
    let mut keep = config
        .findings
        .as_ref()
        .and_then(|dir| File::create(current_path(dir, target.name())).ok());
    let memory = config.max_rss.is_some() && PeakRss::available();
    // Panics are findings, reported once each in the report, not on standard error.
    let message = Arc::new(Mutex::new(String::new()));
    {
        let message = Arc::clone(&message);
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(mut m) = message.lock() {
                *m = info.to_string();
            }
        }));
    }
    for index in config.skip..config.skip + config.inputs {
        let mut rng = Rng::for_input(config.seed, index);
        let input = target.generate(&mut rng);
        report.largest_input = report.largest_input.max(input.len());
        if let Some(f) = keep.as_mut() {
            // The input being run, for the script to save should the process die.
            let ok = f.seek(SeekFrom::Start(0)).is_ok()
                && f.write_all(&input).is_ok()
                && f.set_len(input.len() as u64).is_ok();
            if !ok {
                keep = None;
            }
        }
        if memory {
            PeakRss::reset();
        }
        if let Ok(mut t) = since.lock() {
            *t = Instant::now();
        }
        current.store(index, Ordering::SeqCst);
        let t0 = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| target.run(&input)));
        if t0.elapsed() > report.slowest {
            report.slowest = t0.elapsed();
            report.slowest_index = index;
        }
        current.store(u64::MAX, Ordering::SeqCst);
        let mut problem = None;
        if outcome.is_err() {
            let m = message.lock().map(|m| m.clone()).unwrap_or_default();
            problem = Some(Problem::Panic(m));
        }
        if memory {
            let peak = PeakRss::read();
            report.peak_rss = report.peak_rss.max(peak);
            if problem.is_none() && config.max_rss.is_some_and(|max| peak > max) {
                problem = Some(Problem::Memory(peak));
            }
        }
        if let Some(problem) = problem {
            let finding = Finding {
                target: target.name(),
                index,
                problem,
                input,
            };
            save_finding(config, &finding);
            report.findings.push(finding);
        }
        report.inputs += 1;
        if config.progress_every > 0 && report.inputs.is_multiple_of(config.progress_every) {
            eprintln!(
                "{}: {} inputs, {} findings",
                target.name(),
                report.inputs,
                report.findings.len()
            );
        }
    }
    let _ = std::panic::take_hook();
    report
}

fn current_path(dir: &std::path::Path, target: &str) -> PathBuf {
    dir.join(format!("current-{target}-{}.input", std::process::id()))
}

fn save_finding(config: &Config, finding: &Finding) {
    let Some(dir) = &config.findings else {
        return;
    };
    let kind = match finding.problem {
        Problem::Panic(_) => "panic",
        Problem::Hang => "hang",
        Problem::Memory(_) => "memory",
    };
    let base = dir.join(format!(
        "{}-{kind}-seed{}-input{}",
        finding.target, config.seed, finding.index
    ));
    let _ = std::fs::write(base.with_extension("input"), &finding.input);
    let _ = std::fs::write(
        base.with_extension("txt"),
        format!("{:?}\n", finding.problem),
    );
}

/// Per-input peak resident memory on Linux: `/proc/self/clear_refs` resets the peak
/// (`VmHWM`) that `/proc/self/status` reports.
struct PeakRss;

impl PeakRss {
    fn available() -> bool {
        Self::reset() && Self::read() > 0
    }

    fn reset() -> bool {
        std::fs::write("/proc/self/clear_refs", "5").is_ok()
    }

    fn read() -> u64 {
        let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
            return 0;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Panicky;

    impl Target for Panicky {
        fn name(&self) -> &'static str {
            "panicky"
        }
        fn generate(&self, rng: &mut Rng) -> Vec<u8> {
            vec![rng.below(4) as u8]
        }
        fn run(&self, input: &[u8]) {
            assert_ne!(input[0], 3, "three");
        }
    }

    #[test]
    fn inputs_are_reproducible_and_panics_are_findings() {
        let a: Vec<u64> = (0..4).map(|i| Rng::for_input(7, i).next_u64()).collect();
        let b: Vec<u64> = (0..4).map(|i| Rng::for_input(7, i).next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
        let report = Runner::run(
            Arc::new(Panicky),
            &Config {
                inputs: 200,
                ..Config::default()
            },
        );
        assert_eq!(report.inputs, 200);
        assert!(!report.findings.is_empty());
        for f in &report.findings {
            assert_eq!(f.input, vec![3]);
            assert!(matches!(&f.problem, Problem::Panic(m) if m.contains("three")));
            // Replaying the index gives the same input.
            assert_eq!(Panicky.generate(&mut Rng::for_input(1, f.index)), vec![3]);
        }
    }
}
