//! `weir top`: a live view of every pipeline and operator of a running `weir run`, over its
//! control API. Each refresh reads the status (whose per-operator counters are cumulative)
//! and each pipeline's checkpoint history; rates come from the difference with the previous
//! refresh (`model`). On a terminal the view is a full-screen ratatui screen (`screen`) that
//! q, Esc or Ctrl-C closes, restoring the terminal; otherwise it is printed as plain lines, one
//! block per refresh, or once with `--once`.

mod model;
mod screen;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use weir_engine::api::{ApiClient, ClientError};

use super::api_args::{self, ApiArgs};
use model::Sample;

/// Arguments of `weir top`.
#[derive(Args, Debug)]
#[command(after_help = "\
Columns, per operator (summed over its subtasks): records in and out per second, errors so far \
and per second, the share of wall time spent backpressured (waiting to send downstream) and \
busy, the fullest input queue, and a source's lag (how far behind its input it is). Each \
pipeline's line has its state, restarts and last checkpoint (id, age, duration); the first line \
has the reloads. Rates are measured between two refreshes, so the first refresh shows `-`.

On a terminal the view refreshes in place; q, Esc or Ctrl-C quits. When standard output is not a \
terminal (a pipe, a file), each refresh is printed as a block of plain lines.")]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub interval: f64,
    /// Print one snapshot as plain lines and exit (rates measured over one --interval).
    #[arg(long)]
    pub once: bool,
    /// Print plain lines even on a terminal.
    #[arg(long)]
    pub plain: bool,
    /// Stop after this many refreshes (plain output).
    #[arg(long, short = 'n', value_name = "N")]
    pub iterations: Option<u64>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Runs `weir top`.
pub fn run(args: &TopArgs) -> ExitCode {
    let client = match args.api.client() {
        Ok(c) => c.with_read_timeout(Some(Duration::from_secs(10))),
        Err(code) => return code,
    };
    if !(args.interval.is_finite() && args.interval >= 0.05) {
        return api_args::fail_with(
            "weir::top::interval",
            format!("--interval {} is too short", args.interval),
            "give the seconds between refreshes, at least 0.05 (default 1)".to_owned(),
        );
    }
    let interval = Duration::from_secs_f64(args.interval);
    let started = Instant::now();
    let take = || read(&client, started);
    if args.once {
        return plain(take, interval, Some(1));
    }
    if args.plain || !std::io::stdout().is_terminal() {
        return plain(take, interval, args.iterations);
    }
    live(&client, take, interval)
}

/// One sample of the job: its status, then each pipeline's checkpoint history.
fn read(client: &ApiClient, started: Instant) -> Result<Sample, ClientError> {
    let status = client.status()?;
    let at = started.elapsed();
    let mut checkpoints = HashMap::new();
    for p in &status.pipelines {
        // A pipeline that ended between the two calls has no history to show.
        if let Ok(history) = client.checkpoints(&p.id) {
            checkpoints.insert(p.id.clone(), history);
        }
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Ok(Sample {
        at,
        now_ms,
        status,
        checkpoints,
    })
}

/// Plain output: a block of lines per refresh (after the first sample, so that rates show),
/// `count` times or until `weir run` is gone.
fn plain(
    take: impl Fn() -> Result<Sample, ClientError>,
    interval: Duration,
    count: Option<u64>,
) -> ExitCode {
    use std::io::Write;
    let mut prev = match take() {
        Ok(s) => s,
        Err(e) => return api_args::fail(None, &e),
    };
    let mut printed = 0;
    while count.is_none_or(|n| printed < n) {
        std::thread::sleep(interval);
        let cur = match take() {
            Ok(s) => s,
            Err(ClientError::NotListening { addr }) if printed > 0 => {
                eprintln!("weir top: nothing listens on {addr} any more: `weir run` ended");
                return ExitCode::SUCCESS;
            }
            Err(e) => return api_args::fail(None, &e),
        };
        let text = model::view(Some(&prev), &cur).plain();
        let sep = if printed > 0 { "\n" } else { "" };
        let mut out = std::io::stdout().lock();
        if write!(out, "{sep}{text}")
            .and_then(|()| out.flush())
            .is_err()
        {
            // A closed pipe (`| head`) ends it quietly.
            return ExitCode::SUCCESS;
        }
        printed += 1;
        prev = cur;
    }
    ExitCode::SUCCESS
}

/// The full-screen view until q, Esc or Ctrl-C.
fn live(
    client: &ApiClient,
    take: impl Fn() -> Result<Sample, ClientError>,
    interval: Duration,
) -> ExitCode {
    use ratatui::crossterm::event;
    // Fail before taking the terminal over when nothing listens.
    let mut prev = match take() {
        Ok(s) => s,
        Err(e) => return api_args::fail(Some(client), &e),
    };
    let mut view = model::view(None, &prev);
    let mut problem: Option<String> = None;
    // Raw mode and the alternate screen; ratatui restores them on a panic too.
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            return api_args::fail_with(
                "weir::top::terminal",
                format!("cannot set the terminal up: {e}"),
                "run `weir top --plain` (or pipe it) for plain lines".to_owned(),
            );
        }
    };
    let mut next = Instant::now() + interval;
    let result = loop {
        if let Err(e) = terminal.draw(|f| screen::draw(f, Some(&view), problem.as_deref())) {
            break Err(e);
        }
        let wait = next.saturating_duration_since(Instant::now());
        match event::poll(wait) {
            Ok(true) => match event::read() {
                Ok(e) if screen::quits(&e) => break Ok(()),
                Ok(_) => continue,
                Err(e) => break Err(e),
            },
            Ok(false) => {}
            Err(e) => break Err(e),
        }
        next = Instant::now() + interval;
        match take() {
            Ok(cur) => {
                view = model::view(Some(&prev), &cur);
                prev = cur;
                problem = None;
            }
            Err(e) => problem = Some(format!("refresh failed: {e}")),
        }
    };
    ratatui::restore();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir top: the terminal failed: {e}");
            ExitCode::FAILURE
        }
    }
}
