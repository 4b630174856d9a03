//! The running harness: `weir run` in the background with its control API and its log
//! ([`Run`]: status, waits, the CLI verbs against it, stop, savepoint, SIGTERM, SIGKILL), a
//! run to its end ([`run_to_end`], [`run_to_end_with`]) and a run killed at a log line
//! ([`kill_when`]). Reading its output is `output`'s business.
//!
//! Every wait polls against a generous deadline; nothing asserts on time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::binary::{signal, wait_child, weir};

/// How long anything that should happen soon may take on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(90);
/// How long a whole `weir run` may take.
pub const RUN_DEADLINE: Duration = Duration::from_secs(240);

/// The directory of a pipeline file: where a run of it starts when the scenario has no
/// other reason to choose.
pub fn beside(file: &Path) -> &Path {
    file.parent().expect("the pipeline file is in a directory")
}

/// `weir run --no-progress --no-api EXTRA FILE` in `cwd` to its end: `(success, log)`.
pub fn run_to_end(cwd: &Path, file: &Path, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["--no-api"];
    args.extend_from_slice(extra);
    let (status, log) = run_to_end_with(cwd, file, &args, &[]);
    (status.success(), log)
}

/// `weir run --no-progress ARGS FILE` in `cwd` with extra environment variables, to its end
/// (the API settings come from `args`, `env` and the file): `(status, log)`.
pub fn run_to_end_with(
    cwd: &Path,
    file: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (ExitStatus, String) {
    let log = tempfile::NamedTempFile::new().expect("a temporary file");
    let stderr = log.reopen().expect("reopen the log file");
    let mut child = spawn_run(cwd, file, args, env, stderr.into());
    let read = || std::fs::read_to_string(log.path()).unwrap_or_default();
    let status = wait_child(&mut child, RUN_DEADLINE, read);
    (status, read())
}

/// `weir run --no-progress --no-api EXTRA FILE` in `cwd`, SIGKILLed at the first log line for
/// which `hit` holds: `(whether one did, the log up to there)`. A run that ends first is
/// waited for.
pub fn kill_when(
    cwd: &Path,
    file: &Path,
    extra: &[&str],
    mut hit: impl FnMut(&str) -> bool,
) -> (bool, String) {
    let mut args = vec!["--no-api"];
    args.extend_from_slice(extra);
    let mut child = spawn_run(cwd, file, &args, &[], Stdio::piped());
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut log = String::new();
    let mut seen = false;
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        log.push_str(&line);
        log.push('\n');
        if hit(&line) {
            seen = true;
            let _ = child.kill();
            break;
        }
    }
    let _ = wait_child(&mut child, DEADLINE, String::new);
    (seen, log)
}

/// Starts `weir run --no-progress ARGS FILE` in `cwd` with extra environment variables, no
/// input, its stdout discarded and its log to `stderr`.
fn spawn_run(cwd: &Path, file: &Path, args: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Child {
    weir()
        .current_dir(cwd)
        .args(["run", "--no-progress"])
        .args(args)
        .arg(file)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start weir run")
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
    /// Starts `weir run --api-port 0 EXTRA FILE` in `cwd` and waits until its control API
    /// listens.
    pub fn start(cwd: &Path, file: &Path, extra: &[&str]) -> Self {
        let mut args = vec!["--api-port", "0"];
        args.extend_from_slice(extra);
        Self::start_with(cwd, file, &args, &[])
    }

    /// Starts `weir run ARGS FILE` in `cwd` with extra environment variables (the API
    /// settings come from `args`, `env` and the file) and waits until its control API listens.
    pub fn start_with(cwd: &Path, file: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = spawn_run(cwd, file, args, env, Stdio::piped());
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

    /// Runs a CLI verb against this run's API (`--api` appended).
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_env(args, &[])
    }

    /// As [`cli`](Self::cli), with extra environment variables. A verb that does not answer
    /// within the deadline is killed and fails the test.
    pub fn cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut stdout = tempfile::tempfile().expect("a temporary file");
        let mut stderr = tempfile::tempfile().expect("a temporary file");
        let mut child = weir()
            .args(args)
            .args(["--api", &self.api])
            .envs(env.iter().copied())
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

    /// The status of one pipeline (`null` when the job does not list it); fails when
    /// `weir status` does.
    pub fn pipeline(&self, id: &str) -> Value {
        let status = self
            .status()
            .unwrap_or_else(|| panic!("`weir status` failed; the log:\n{}", self.log()));
        pipeline_of(&status, id)
    }

    /// Waits until `pipeline` completed a checkpoint and its source produced `records`.
    pub fn wait_mid_run(&mut self, pipeline: &str, records: u64) {
        self.wait_for(&format!("`{pipeline}` to be mid-run"), |s| {
            let p = pipeline_of(s, pipeline);
            p["checkpoints"].as_u64().unwrap_or(0) >= 1
                && p["source_records"].as_u64().unwrap_or(0) >= records
        });
    }

    /// Lets `pipeline` complete `more` checkpoints beyond its count now, then stops it with
    /// `weir stop` (no savepoint) and waits for a successful end.
    pub fn stop_after_checkpoints(&mut self, pipeline: &str, more: u64, what: &str) {
        let at = self.pipeline(pipeline)["checkpoints"].as_u64().unwrap_or(0);
        self.wait_for(what, |s| checkpoints_of(s, pipeline) >= at + more);
        let out = self.cli(&["stop", pipeline]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.finish_ok();
    }

    /// `weir stop PIPELINE --savepoint`: the savepoint's directory.
    pub fn stop_with_savepoint(&self, pipeline: &str) -> PathBuf {
        let out = self.cli(&["stop", pipeline, "--savepoint"]);
        self.savepoint_path(&out, "weir stop --savepoint")
    }

    /// The path a successful `weir savepoint` / `weir stop --savepoint` printed (`what`
    /// names the verb in a failure).
    pub fn savepoint_path(&self, out: &Output, what: &str) -> PathBuf {
        assert!(
            out.status.success(),
            "{what} failed: {}\nthe run's log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            path.join("_metadata").is_file(),
            "{what} printed `{}`, which is not a savepoint directory",
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
            signal(self.child.id(), "TERM");
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
