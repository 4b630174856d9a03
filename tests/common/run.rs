//! Driving the real `weir` binary from scenario tests: a `weir run` in the background with
//! its control API and its log ([`Run`]), a run to its end ([`run_to_end`]), the CLI verbs
//! against a running job, and the committed output of a file sink compared with a
//! failure-free run's ([`committed`], [`assert_exactly_once`]).
//!
//! Every wait polls against a generous deadline; nothing asserts on time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long anything that should happen soon may take on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(90);
/// How long a whole `weir run` may take.
pub const RUN_DEADLINE: Duration = Duration::from_secs(240);

/// The `weir` binary, with a plain log and no API settings from the environment.
pub fn weir() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .env_remove("WEIR_API_TOKEN")
        .env_remove("WEIR_API");
    c
}

/// Waits for `child` with a deadline; kills it (and fails) when the deadline passes.
pub fn wait_child(child: &mut Child, deadline: Duration, log: impl Fn() -> String) -> ExitStatus {
    let until = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`weir` did not end within {deadline:?}; its log:\n{}",
                log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `weir run --no-progress --no-api EXTRA FILE` in `cwd` to its end: `(success, log)`.
pub fn run_to_end(cwd: &Path, file: &Path, extra: &[&str]) -> (bool, String) {
    let log = tempfile::NamedTempFile::new().expect("a temporary file");
    let mut child = weir()
        .current_dir(cwd)
        .args(["run", "--no-progress", "--no-api"])
        .args(extra)
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().expect("reopen the log file"))
        .spawn()
        .expect("start weir run");
    let read = || std::fs::read_to_string(log.path()).unwrap_or_default();
    let status = wait_child(&mut child, RUN_DEADLINE, read);
    (status.success(), read())
}

/// A `weir run --api-port 0` in the background, its stderr collected.
pub struct Run {
    child: Child,
    /// The control API's address.
    pub api: String,
    log: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

impl Run {
    /// Starts `weir run EXTRA FILE` in `cwd` and waits until its control API listens.
    pub fn start(cwd: &Path, file: &Path, extra: &[&str]) -> Self {
        let mut child = weir()
            .current_dir(cwd)
            .args(["run", "--no-progress", "--api-port", "0"])
            .args(extra)
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start weir run");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let reader = {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = line.strip_prefix("control API on http://") {
                        let _ = tx.send(addr.trim().to_owned());
                    }
                    let mut log = log
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    log.push_str(&line);
                    log.push('\n');
                }
            })
        };
        let api = rx.recv_timeout(DEADLINE);
        let mut run = Self {
            child,
            api: String::new(),
            log,
            reader: Some(reader),
        };
        match api {
            Ok(api) => run.api = api,
            Err(_) => {
                let _ = run.child.kill();
                let _ = run.child.wait();
                if let Some(r) = run.reader.take() {
                    let _ = r.join();
                }
                panic!(
                    "`weir run` never said where its control API listens:\n{}",
                    run.log()
                );
            }
        }
        run
    }

    /// The process id of `weir run`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, when it has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll the child")
    }

    /// Everything the run logged so far.
    pub fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs a CLI verb against this run's API (`--api` appended). A verb that does not answer
    /// within the deadline is killed and fails the test.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut stdout = tempfile::tempfile().expect("a temporary file");
        let mut stderr = tempfile::tempfile().expect("a temporary file");
        let mut child = weir()
            .args(args)
            .args(["--api", &self.api])
            .stdin(Stdio::null())
            .stdout(stdout.try_clone().expect("clone a file handle"))
            .stderr(stderr.try_clone().expect("clone a file handle"))
            .spawn()
            .expect("run a weir verb");
        let status = wait_child(&mut child, DEADLINE * 2, || {
            format!("(`weir {}`)\n{}", args.join(" "), self.log())
        });
        let read = |f: &mut std::fs::File| {
            let mut v = Vec::new();
            f.rewind().expect("rewind");
            f.read_to_end(&mut v).expect("read the output");
            v
        };
        Output {
            status,
            stdout: read(&mut stdout),
            stderr: read(&mut stderr),
        }
    }

    /// `weir status --json`, once; `None` when it fails (e.g. the run just ended).
    pub fn status(&self) -> Option<Value> {
        let client = weir_engine::api::ApiClient::new(&self.api, None).ok()?;
        let status = client.status().ok()?;
        serde_json::to_value(status).ok()
    }

    /// Polls the status until `ready` holds, and returns that status.
    pub fn wait_for(&mut self, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(exit) = self.child.try_wait().expect("poll the child") {
                panic!(
                    "`weir run` ended ({exit}) while waiting for {what}; its log:\n{}",
                    self.log()
                );
            }
            if let Some(status) = self.status()
                && ready(&status)
            {
                return status;
            }
            assert!(
                Instant::now() < until,
                "{what} did not happen within {DEADLINE:?}; the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls until `ready` holds (checked against the file system, say), failing with the
    /// log after the deadline.
    pub fn wait_until(&mut self, what: &str, mut ready: impl FnMut() -> bool) {
        let until = Instant::now() + DEADLINE;
        while !ready() {
            if let Some(exit) = self.child.try_wait().expect("poll the child") {
                panic!(
                    "`weir run` ended ({exit}) while waiting for {what}; its log:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < until,
                "{what} did not happen within {DEADLINE:?}; the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every pipeline named completed `more` checkpoints beyond those it had.
    pub fn wait_checkpoints(&mut self, pipelines: &[&str], more: u64) {
        let now = self.status().unwrap_or_default();
        let at: BTreeMap<String, u64> = pipelines
            .iter()
            .map(|p| ((*p).to_owned(), checkpoints_of(&now, p)))
            .collect();
        self.wait_for(&format!("{more} more checkpoints of {pipelines:?}"), |s| {
            at.iter().all(|(p, n)| checkpoints_of(s, p) >= n + more)
        });
    }

    /// `weir stop PIPELINE --savepoint`: the savepoint's directory.
    pub fn stop_with_savepoint(&self, pipeline: &str) -> PathBuf {
        let out = self.cli(&["stop", pipeline, "--savepoint"]);
        assert!(
            out.status.success(),
            "weir stop --savepoint failed: {}\nthe run's log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            path.join("_metadata").is_file(),
            "`weir stop --savepoint` printed `{}`, which is not a savepoint directory",
            path.display()
        );
        path
    }

    /// SIGTERM: a final checkpoint, then a clean exit; waits for it and returns the log.
    pub fn terminate(&mut self) -> String {
        let (status, log) = self.terminate_and_wait();
        assert!(status.success(), "`weir run` failed ({status}):\n{log}");
        log
    }

    /// SIGTERM (if the process still runs), then waits for the end: `(status, whole log)`.
    pub fn terminate_and_wait(&mut self) -> (ExitStatus, String) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
        }
        self.finish()
    }

    /// SIGKILL, and waits for the process to be gone; returns the log.
    pub fn kill(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.log()
    }

    /// Waits for the process to end: `(status, whole log)`.
    pub fn finish(&mut self) -> (ExitStatus, String) {
        let log = Arc::clone(&self.log);
        let status = wait_child(&mut self.child, RUN_DEADLINE, move || {
            log.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        });
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.log())
    }

    /// Waits for a successful end and returns the log.
    pub fn finish_ok(&mut self) -> String {
        let (status, log) = self.finish();
        assert!(status.success(), "`weir run` failed ({status}):\n{log}");
        log
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // A failed test never leaves a `weir run` behind.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The status of pipeline `id` in a `weir status --json` answer.
pub fn pipeline_of(status: &Value, id: &str) -> Value {
    status["pipelines"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["id"] == id))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Completed checkpoints of pipeline `id` in a status answer (0 when unknown).
pub fn checkpoints_of(status: &Value, id: &str) -> u64 {
    pipeline_of(status, id)["checkpoints"].as_u64().unwrap_or(0)
}

/// The committed output of a file sink directory (hidden in-progress and pending parts left
/// out), as sorted canonical JSON lines. A missing directory has none.
pub fn committed(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut text = String::new();
    for e in entries {
        let e = e.expect("list the sink directory");
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        text.push_str(&std::fs::read_to_string(e.path()).expect("read a part file"));
        text.push('\n');
    }
    super::canonical_lines(&text)
}

/// Lines of `a` not matched by a line of `b` (multisets).
fn minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for l in b {
        *counts.entry(l).or_default() += 1;
    }
    a.iter()
        .filter(|l| {
            let c = counts.entry(l).or_default();
            *c -= 1;
            *c < 0
        })
        .cloned()
        .collect()
}

/// How a run's output differs from the failure-free run's: records lost and duplicated (or
/// otherwise unexpected), as multisets.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OutputDiff {
    /// In the failure-free output, not (or not as often) in this one.
    pub lost: Vec<String>,
    /// In this output, not (or not as often) in the failure-free one.
    pub extra: Vec<String>,
}

impl OutputDiff {
    /// Compares two outputs (sorted canonical lines or not).
    pub fn of(got: &[String], want: &[String]) -> Self {
        Self {
            lost: minus(want, got),
            extra: minus(got, want),
        }
    }

    /// Whether they are equal.
    pub fn is_empty(&self) -> bool {
        self.lost.is_empty() && self.extra.is_empty()
    }

    /// `N lost (first: ...), M duplicated or unexpected (first: ...)`.
    pub fn describe(&self) -> String {
        format!(
            "{} lost (first: {:?}), {} duplicated or unexpected (first: {:?})",
            self.lost.len(),
            self.lost.iter().take(3).collect::<Vec<_>>(),
            self.extra.len(),
            self.extra.iter().take(3).collect::<Vec<_>>()
        )
    }
}

/// Asserts that `got` equals the failure-free `want`: 0 lost, 0 duplicated.
pub fn assert_exactly_once(got: &[String], want: &[String], what: &str) {
    let diff = OutputDiff::of(got, want);
    assert!(
        diff.is_empty(),
        "{what}: {} lines, the failure-free run has {}; {}",
        got.len(),
        want.len(),
        diff.describe()
    );
}
