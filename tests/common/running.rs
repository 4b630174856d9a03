//! A typed view of a background `weir run` ([`super::run::Run`]) for scenario tests that read
//! `weir status` as a [`JobStatus`] and wait for reload outcomes.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use weir_engine::control::{JobStatus, ReloadOutcome};

use super::run::{DEADLINE, Run};

/// A `weir run --api-port 0` in the background (see [`Run`]), its status read typed.
pub struct Running {
    run: Run,
    /// The control API's address.
    pub api: String,
}

impl Running {
    /// `weir run --api-port 0 EXTRA FILE` in the directory `cwd` (so that `FILE` may be
    /// relative, as most users name it).
    pub fn start(cwd: &Path, file: &Path, extra: &[&str]) -> Self {
        let run = Run::start(cwd, file, extra);
        Self {
            api: run.api.clone(),
            run,
        }
    }

    /// The process id of `weir run`.
    pub fn pid(&self) -> u32 {
        self.run.pid()
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.run.try_wait().is_none()
    }

    /// Everything the run logged so far.
    pub fn log(&self) -> String {
        self.run.log()
    }

    /// Runs a CLI verb against this run's API (see [`Run::cli`]).
    pub fn cli(&self, args: &[&str]) -> Output {
        self.run.cli(args)
    }

    /// As [`cli`](Self::cli), with extra environment variables (see [`Run::cli_env`]).
    pub fn cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.run.cli_env(args, env)
    }

    /// `weir status --json`, parsed.
    pub fn status(&self) -> JobStatus {
        let out = self.cli(&["status", "--json"]);
        assert!(
            out.status.success(),
            "weir status failed: {}\nrun log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        serde_json::from_slice(&out.stdout).expect("weir status --json prints a JobStatus")
    }

    /// Polls the status until `done` holds; panics with `what` and the log after
    /// [`DEADLINE`].
    pub fn wait_until(&self, what: &str, mut done: impl FnMut(&JobStatus) -> bool) -> JobStatus {
        let start = Instant::now();
        loop {
            let status = self.status();
            if done(&status) {
                return status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}; last status: {status:#?}\nrun log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Waits for the first reload outcome newer than `after` (its `at_ms`) that is not
    /// `unchanged` (unless `unchanged` is expected: a late duplicate file event may reload an
    /// unchanged file), and checks it is `expected`.
    pub fn wait_outcome(&self, after: u64, expected: &str) -> (JobStatus, ReloadOutcome) {
        let mut seen = after;
        let status = self.wait_until(&format!("a reload outcome `{expected}`"), |s| {
            match &s.last_reload {
                Some(o) if o.at_ms > seen => {
                    if o.result == "unchanged" && expected != "unchanged" {
                        seen = o.at_ms;
                        return false;
                    }
                    true
                }
                _ => false,
            }
        });
        let outcome = status.last_reload.clone().expect("an outcome");
        assert_eq!(
            outcome.result,
            expected,
            "unexpected reload outcome: {outcome:#?}\nrun log:\n{}",
            self.log()
        );
        assert_eq!(
            status.reload_history.last(),
            Some(&outcome),
            "the reload history ends with the last reload: {:#?}",
            status.reload_history
        );
        (status, outcome)
    }

    /// Waits for the end of `weir run` (failing after `within`) and returns whether it
    /// succeeded.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.run.try_wait().is_some() {
                return self.run.finish().0.success();
            }
            assert!(
                start.elapsed() < within,
                "`weir run` did not end within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
