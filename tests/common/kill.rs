//! Killing `weir run` with SIGKILL, again and again, and checking what it committed: a seeded
//! RNG for kill moments ([`Rng`]), a scratch directory kept on failure ([`Scratch`]), pipeline
//! files given recovery settings ([`with_recovery`]), runs of one file with their logs
//! ([`Runner`]), the kill loop ([`kill_loop`]: random and after-a-checkpoint kills, with
//! [`KillStats`] for the report) and the exactly-once check of every file sink against a
//! failure-free run ([`assert_exactly`]). Used by `recovery_kill.rs` and `event_time.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::binary::{plain, wait_child, weir};
use super::output::{OutputDiff, committed_marking_torn, describe_counted};

/// Longest a run that is not killed may take before the test calls it a hang.
pub const HANG: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------------------------
// Small tools: a seeded RNG, a temporary directory kept on failure, canonical output.

/// xorshift64*: enough randomness for kill moments, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(default_seed: u64) -> Self {
        let seed = std::env::var("WEIR_KILL_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default_seed);
        // splitmix64 once, so that small seeds still give well-mixed states (never 0).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[lo, hi]`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + hi.saturating_sub(lo).mul_f64(unit)
    }
}

/// A temporary directory that is kept (and its path printed) when the test panics.
pub struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    pub fn new() -> Self {
        Self(Some(tempfile::tempdir().unwrap()))
    }

    pub fn path(&self) -> &Path {
        self.0.as_ref().unwrap().path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if (std::thread::panicking() || std::env::var_os("WEIR_KILL_KEEP").is_some())
            && let Some(dir) = self.0.take()
        {
            eprintln!("kept the test directory {}", dir.keep().display());
        }
    }
}

pub fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The lines of a run's log that matter for a recovery diagnosis, and its last lines.
pub fn log_excerpt(path: &Path) -> String {
    let text = read_log(path);
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.contains("Resuming")
                || l.contains("Restoring")
                || l.contains("starting from the beginning")
                || l.contains("WARN")
                || l.contains("ERROR")
                || l.contains("Pipeline finished")
        })
        .take(40)
        .collect();
    out.push("  -- last lines --");
    out.extend(lines.iter().skip(lines.len().saturating_sub(25)).copied());
    format!("{}:\n{}", path.display(), out.join("\n"))
}

// ---------------------------------------------------------------------------------------------
// Pipeline files: recovery settings, sinks, validation.

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Fs,
    Rocksdb,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Fs => "fs",
            Self::Rocksdb => "rocksdb",
        }
    }
}

/// Recovery settings written into every pipeline of a file.
pub struct Recovery<'a> {
    pub backend: Backend,
    pub mode: &'a str,
    pub interval: &'a str,
    /// Scratch root: checkpoints go to `<root>/checkpoints/<file stem>`, RocksDB's working
    /// directories to `<root>/rocks`.
    pub root: &'a Path,
}

/// Reads a pipeline file (YAML), gives every pipeline the state backend, checkpoints and
/// restart strategy of `r`, switches the control API off (runs of parallel tests must not race
/// for its port), and writes the result as JSON (valid YAML for the loader) next to the
/// original, so that relative paths still resolve. `weir validate` must accept it.
pub fn with_recovery(yaml: &Path, r: &Recovery<'_>) -> PathBuf {
    let text = std::fs::read_to_string(yaml).unwrap();
    let mut file: Value = serde_saphyr::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not YAML: {e}", yaml.display()));
    let stem = yaml.file_stem().unwrap().to_string_lossy().into_owned();
    let storage = r.root.join("checkpoints").join(&stem);
    let state = match r.backend {
        Backend::Fs => json!({"backend": "fs"}),
        Backend::Rocksdb => {
            json!({"backend": "rocksdb", "path": r.root.join("rocks").to_str().unwrap()})
        }
    };
    file["api"] = json!({"enabled": false});
    for p in file["pipelines"].as_array_mut().unwrap() {
        p["state"] = state.clone();
        p["checkpoints"] = json!({
            "interval": r.interval,
            "mode": r.mode,
            "storage": storage.to_str().unwrap(),
        });
        p["restart"] = json!({"strategy": "fixed_delay", "attempts": 1000, "delay": "10ms"});
    }
    let out = yaml.with_file_name(format!("{stem}.{}-{}.json", r.mode, r.backend.name()));
    std::fs::write(&out, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    let v = plain().arg("validate").arg(&out).output().unwrap();
    assert!(
        v.status.success(),
        "{} does not validate:\n{}{}",
        out.display(),
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
    out
}

/// A file sink of a pipeline file: `(pipeline id, sink id, directory)`.
pub struct Sink {
    pub pipeline: String,
    pub id: String,
    pub dir: PathBuf,
}

impl Sink {
    pub fn label(&self) -> String {
        format!("{}/{}", self.pipeline, self.id)
    }
}

pub fn file_sinks(file: &Path) -> Vec<Sink> {
    let v: Value = serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let base = file.parent().unwrap();
    let mut sinks = Vec::new();
    for p in v["pipelines"].as_array().unwrap() {
        for s in p["sinks"].as_array().unwrap() {
            if s["type"] == "file" {
                sinks.push(Sink {
                    pipeline: p["id"].as_str().unwrap().to_owned(),
                    id: s["id"].as_str().unwrap().to_owned(),
                    dir: base.join(s["path"].as_str().unwrap()),
                });
            }
        }
    }
    sinks
}

// ---------------------------------------------------------------------------------------------
// Running and killing `weir run`.

/// Runs of one pipeline file, each logging to `<logs>/<label>-<n>.{out,err}`.
pub struct Runner {
    pub file: PathBuf,
    pub logs: PathBuf,
    pub label: String,
    pub runs: usize,
    /// Environment variables given to every run (e.g. the `AWS_*` settings of a service).
    pub env: Vec<(String, String)>,
    /// Arguments given to every `weir run` (e.g. `--workers`).
    pub args: Vec<String>,
}

impl Runner {
    pub fn new(file: &Path, logs: &Path, label: &str) -> Self {
        std::fs::create_dir_all(logs).unwrap();
        Self {
            file: file.to_owned(),
            logs: logs.to_owned(),
            label: label.to_owned(),
            runs: 0,
            env: Vec::new(),
            args: Vec::new(),
        }
    }

    pub fn spawn(&mut self, extra: &[&str]) -> (Child, PathBuf) {
        self.runs += 1;
        let base = self.logs.join(format!("{}-{:03}", self.label, self.runs));
        let out = std::fs::File::create(base.with_extension("out")).unwrap();
        let err_path = base.with_extension("err");
        let err = std::fs::File::create(&err_path).unwrap();
        let child = weir()
            .arg("run")
            .arg("--no-progress")
            .arg("--no-api")
            .args(&self.args)
            .args(extra)
            .arg(&self.file)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        (child, err_path)
    }

    /// Runs to the end; panics on a hang or a non-zero exit. Returns the wall time and log.
    pub fn run_to_end(&mut self) -> (Duration, PathBuf) {
        let started = Instant::now();
        let (mut child, log) = self.spawn(&[]);
        let status = wait_bounded(&mut child, HANG, &log);
        let wall = started.elapsed();
        assert!(
            status.success(),
            "{}: `weir run` exited with {status}\n{}",
            self.label,
            log_excerpt(&log)
        );
        (wall, log)
    }
}

pub fn wait_bounded(child: &mut Child, limit: Duration, log: &Path) -> ExitStatus {
    wait_child(child, limit, || log_excerpt(log))
}

/// What the kill loops did, for the report.
#[derive(Default)]
pub struct KillStats {
    /// Runs ended by SIGKILL.
    pub kills: usize,
    /// Of which at a uniformly random moment.
    pub random: usize,
    /// Of which shortly after a checkpoint completed (see [`KillPlan::targeted`]).
    pub targeted: usize,
    /// Killed before any pipeline had started its tasks (validation, planning, restore).
    pub during_startup: usize,
    /// Killed after at least one checkpoint had completed in that run.
    pub after_checkpoint: usize,
    /// Killed while running from a restored checkpoint.
    pub resumed: usize,
    /// Killed after a checkpoint completed or while resumed: the mid-stream kills.
    pub mid_stream: usize,
    /// Runs that finished on their own before the kill was due.
    pub finished_first: usize,
    /// `(pipeline, checkpoint)` of every restore seen in the logs, final run included.
    pub restored: Vec<(String, u64)>,
    /// Kill moments, in order: `<ms>` after the spawn, or `ck<n>+<ms>` after the n-th
    /// completed checkpoint of the run.
    pub moments: Vec<String>,
}

impl KillStats {
    pub fn absorb(&mut self, o: KillStats) {
        self.kills += o.kills;
        self.random += o.random;
        self.targeted += o.targeted;
        self.during_startup += o.during_startup;
        self.after_checkpoint += o.after_checkpoint;
        self.resumed += o.resumed;
        self.mid_stream += o.mid_stream;
        self.finished_first += o.finished_first;
        self.restored.extend(o.restored);
        self.moments.extend(o.moments);
    }

    pub fn restored_summary(&self) -> String {
        let mut by: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (p, c) in &self.restored {
            by.entry(p).or_default().push(*c);
        }
        if by.is_empty() {
            return "none".to_owned();
        }
        by.iter()
            .map(|(p, cs)| format!("{p} {cs:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn report(&self, label: &str) -> String {
        format!(
            "{label}: {} SIGKILLs ({} random, {} after a checkpoint; {} during startup, {} \
             mid-stream: {} after a checkpoint completed in that run, {} in a run resumed from a \
             checkpoint); {} runs finished before their kill; restored from checkpoints: {}",
            self.kills,
            self.random,
            self.targeted,
            self.during_startup,
            self.mid_stream,
            self.after_checkpoint,
            self.resumed,
            self.finished_first,
            self.restored_summary()
        )
    }
}

/// `(pipeline, checkpoint)` of each "Resuming from the latest completed checkpoint." line.
pub fn restores_in(log: &str) -> Vec<(String, u64)> {
    log.lines()
        .filter(|l| l.contains("Resuming from the latest completed checkpoint"))
        .filter_map(|l| {
            let field = |name: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .map(str::to_owned)
            };
            Some((field("pipeline=")?, field("checkpoint=")?.parse().ok()?))
        })
        .collect()
}

/// How many runs to kill, and when.
pub struct KillPlan {
    /// Runs killed at a uniformly random moment in `window` after the spawn.
    pub random: usize,
    pub window: (Duration, Duration),
    /// Runs started to be killed 0-150ms after their first or second completed checkpoint (a
    /// run that finishes first just counts as finished), so that restores from a checkpoint
    /// are exercised whatever the input size. These runs get `--workers 8` (at least one
    /// worker thread per task here): with the default of one per core and every worker busy,
    /// periodic checkpoints are triggered seconds late (seen in debug builds on 2 cores), and
    /// a short run would see no checkpoint at all. The random kills keep the default.
    pub targeted: usize,
}

/// Kills runs of `runner` as `plan` says, in a random order of the two kinds; a run that
/// finishes before its kill must exit 0 and does not count as a kill.
pub fn kill_loop(runner: &mut Runner, rng: &mut Rng, plan: &KillPlan) -> KillStats {
    let mut st = KillStats::default();
    let mut random_runs = 0;
    let mut targeted_runs = 0;
    while st.random < plan.random || targeted_runs < plan.targeted {
        let targeted = if st.random >= plan.random {
            true
        } else if targeted_runs >= plan.targeted {
            false
        } else {
            let left = (plan.random - st.random) + (plan.targeted - targeted_runs);
            rng.below(left as u64) < (plan.targeted - targeted_runs) as u64
        };
        if targeted {
            targeted_runs += 1;
        } else {
            random_runs += 1;
            assert!(
                random_runs <= plan.random * 10,
                "{}: only {} of {random_runs} runs could be killed",
                runner.label,
                st.random
            );
        }
        let (status, log, moment) = if targeted {
            let nth = 1 + rng.below(2) as usize;
            let delay = rng.between(Duration::ZERO, Duration::from_millis(150));
            let workers: &[&str] = if runner.args.iter().any(|a| a == "--workers") {
                &[]
            } else {
                &["--workers", "8"]
            };
            let (mut child, log) = runner.spawn(workers);
            let status = loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break Some(s);
                }
                if read_log(&log).matches("Checkpoint completed.").count() >= nth {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            let status = status.unwrap_or_else(|| {
                std::thread::sleep(delay);
                kill_now(&mut child, &log)
            });
            (status, log, format!("ck{nth}+{}", delay.as_millis()))
        } else {
            let at = rng.between(plan.window.0, plan.window.1);
            let started = Instant::now();
            let (mut child, log) = runner.spawn(&[]);
            std::thread::sleep(at.saturating_sub(started.elapsed()));
            (kill_now(&mut child, &log), log, at.as_millis().to_string())
        };
        let text = read_log(&log);
        st.restored.extend(restores_in(&text));
        if status.signal() != Some(9) {
            assert!(
                status.success(),
                "{}: a run that was not killed exited with {status}\n{}",
                runner.label,
                log_excerpt(&log)
            );
            st.finished_first += 1;
            continue;
        }
        st.kills += 1;
        if targeted {
            st.targeted += 1;
        } else {
            st.random += 1;
        }
        st.moments.push(moment);
        let completed = text.contains("Checkpoint completed.");
        let resumed = text.contains("Resuming from the latest completed checkpoint");
        st.during_startup += usize::from(!text.contains("Pipeline started."));
        st.after_checkpoint += usize::from(completed);
        st.resumed += usize::from(resumed);
        st.mid_stream += usize::from(completed || resumed);
    }
    st
}

/// SIGKILLs `child` unless it has exited already, and reaps it.
pub fn kill_now(child: &mut Child, log: &Path) -> ExitStatus {
    if let Some(s) = child.try_wait().unwrap() {
        return s;
    }
    child.kill().unwrap();
    wait_bounded(child, HANG, log)
}

/// RocksDB working directories (`db-*`) left under `root` by killed runs.
pub fn rocksdb_leftovers(root: &Path) -> usize {
    let Ok(ops) = std::fs::read_dir(root) else {
        return 0;
    };
    ops.flatten()
        .filter_map(|op| std::fs::read_dir(op.path()).ok())
        .flat_map(|dbs| dbs.flatten())
        .filter(|d| d.file_name().to_string_lossy().starts_with("db-"))
        .count()
}

/// Asserts that every sink holds exactly the expected multiset.
pub fn assert_exactly(
    label: &str,
    expected: &BTreeMap<String, Vec<String>>,
    sinks: &[Sink],
    why: &str,
) {
    let mut failures = String::new();
    for s in sinks {
        let Some(want) = expected.get(&s.label()) else {
            continue;
        };
        let got = committed_marking_torn(&s.dir);
        let (missing, extra) = OutputDiff::of(&got, want).counted();
        if !missing.is_empty() || !extra.is_empty() {
            let _ = write!(
                failures,
                "{label} {}: {} expected, {} committed; {}",
                s.label(),
                want.len(),
                got.len(),
                describe_counted(&missing, &extra)
            );
        }
    }
    assert!(failures.is_empty(), "{why}\n{failures}");
}

// ---------------------------------------------------------------------------------------------
// Unaligned checkpoints: settings and the channel state they stored.

/// Merges `settings` into the `checkpoints:` of every pipeline of a file written by
/// [`with_recovery`] (e.g. `{"unaligned": true}`), in place; `weir validate` must accept it.
pub fn with_checkpoint_settings(file: &Path, settings: &Value) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    for p in v["pipelines"].as_array_mut().unwrap() {
        for (k, x) in settings.as_object().unwrap() {
            p["checkpoints"][k] = x.clone();
        }
    }
    std::fs::write(file, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let out = plain().arg("validate").arg(file).output().unwrap();
    assert!(
        out.status.success(),
        "{} does not validate:\n{}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Completed checkpoints (`chk-<n>` with `_metadata`) under `root`, at any depth, that hold
/// channel state (a `.channel` file: in-flight records of an unaligned checkpoint).
pub fn checkpoints_with_channel_state(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut channel = false;
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "channel") {
                channel = true;
            }
        }
        if channel && d.join("_metadata").is_file() {
            out.push(d);
        }
    }
    out.sort();
    out
}
