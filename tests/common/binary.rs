//! The `weir` binary under test: its path, the three environments the scenario tests start it
//! in ([`plain`], [`without_api_env`], [`weir`]), signalling a started process ([`signal`])
//! and waiting for it against a deadline ([`wait_child`]), and running it to its end with a
//! given standard input ([`run_with_stdin`]). Nothing here knows a verb; `run` drives `weir run`.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The path of the `weir` binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_weir");

/// The binary with plain (uncoloured) output; the environment is otherwise the test's.
pub fn plain() -> Command {
    let mut c = Command::new(BIN);
    c.env("NO_COLOR", "1");
    c
}

/// As [`plain`], without the API settings (`WEIR_API`, `WEIR_API_TOKEN`) a developer's shell
/// may hold.
pub fn without_api_env() -> Command {
    let mut c = plain();
    c.env_remove("WEIR_API_TOKEN").env_remove("WEIR_API");
    c
}

/// As [`without_api_env`], logging at `info`, and completed checkpoints (`debug`) too: the
/// log lines the scenarios wait for.
pub fn weir() -> Command {
    let mut c = without_api_env();
    c.env("RUST_LOG", SCENARIO_LOG);
    c
}

/// The `RUST_LOG` filter of [`weir`].
pub const SCENARIO_LOG: &str = "info,weir_engine::checkpoint::coordinator=debug";

/// Sends `signal` (`TERM`, `INT`, `STOP`, ...) to process `pid` with the shell's built-in
/// `kill` (no dependency on procps); whether it was delivered.
pub fn signal(pid: u32, signal: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("kill -{signal} {pid}")])
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits for `child` with a deadline; kills it (and fails with `log()`) when the deadline
/// passes.
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
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs [`plain`] `weir ARGS` in `dir` with `env` added and `stdin` as its whole input, to its
/// end.
pub fn run_with_stdin(dir: &Path, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    let mut child = plain()
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weir");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("weir ends")
}
