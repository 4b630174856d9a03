//! A `weir run` in the background for scenario tests: started in a directory of the test's
//! choosing, its log collected, its control API asked for the status; killed when dropped.
#![allow(clippy::unwrap_used, dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use weir_engine::control::{JobStatus, ReloadOutcome};

/// Generous: the test machine is small and busy.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The `weir` binary under test, without colours, logging at `info`.
pub fn weir() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.env("NO_COLOR", "1").env("RUST_LOG", "info");
    c
}

/// A `weir run` in the background: its stderr is collected; it is killed when dropped (a
/// failed assertion must not leave it running).
pub struct Running {
    /// The process.
    pub child: Child,
    log: Arc<Mutex<String>>,
    /// The control API's address.
    pub api: String,
}

impl Running {
    /// `weir run --api-port 0 FILE` in the directory `cwd` (so that `FILE` may be relative,
    /// as most users name it).
    pub fn start(cwd: &Path, file: &Path, extra: &[&str]) -> Self {
        let mut child = weir()
            .current_dir(cwd)
            .args(["run", "--no-progress", "--api-port", "0"])
            .args(extra)
            .arg(file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("weir run starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (port_tx, port_rx) = mpsc::channel();
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = line.strip_prefix("control API on http://") {
                        let _ = port_tx.send(addr.trim().to_owned());
                    }
                    let mut log = log.lock().expect("log lock");
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let mut run = Self {
            child,
            log,
            api: String::new(),
        };
        match port_rx.recv_timeout(DEADLINE) {
            Ok(addr) => run.api = addr,
            Err(_) => panic!("`weir run` never printed its API address:\n{}", run.log()),
        }
        run
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// `weir status --json`, parsed.
    pub fn status(&self) -> JobStatus {
        let out = weir()
            .args(["status", "--json", "--api", &self.api])
            .output()
            .expect("weir status runs");
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
        (status, outcome)
    }

    /// Waits for the end of `weir run` and returns whether it succeeded.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let start = Instant::now();
        loop {
            if let Some(exit) = self.child.try_wait().expect("try_wait") {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(200));
                return exit.success();
            }
            assert!(
                start.elapsed() < within,
                "`weir run` did not end within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Replaces `path` the way most editors save: write a temporary file, rename it over.
pub fn write_by_rename(path: &Path, text: &str) {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.swp"));
    std::fs::write(&tmp, text).expect("write the temporary file");
    std::fs::rename(&tmp, path).expect("rename over the pipeline file");
}

/// Every committed output line of a file sink directory (hidden in-progress and pending parts
/// are left out), in file order per part file.
pub fn committed_lines(dir: &Path) -> Vec<String> {
    let mut parts: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| {
            !p.file_name()
                .expect("a file name")
                .to_string_lossy()
                .starts_with('.')
        })
        .collect();
    parts.sort();
    let mut lines = Vec::new();
    for part in parts {
        let text = std::fs::read_to_string(&part).expect("read a part file");
        lines.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned),
        );
    }
    lines
}
