//! `weir run FILE`: validate, then run every pipeline of the file until its bounded sources
//! are exhausted or SIGINT/SIGTERM arrives; a live status line on a terminal, `tracing` logs
//! otherwise (text or JSON lines, at the level `--log-level` or `RUST_LOG` sets), and a
//! summary table at the end.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use weir_engine::job::{self, JobOptions, JobSummary, PipelineProgress};
use weir_engine::validate::validate_file;
use weir_schema::Diagnostic;

/// How `weir run` writes its log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event: time, level, module, message, `key=value` fields.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields.message`, the other
    /// fields), for log collectors.
    Json,
}

/// Arguments of `weir run`.
#[derive(Args, Debug)]
#[command(after_long_help = LOG_HELP)]
pub struct RunArgs {
    /// The pipeline file.
    pub file: PathBuf,
    /// Worker threads (default: one per core; at least 1).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub workers: Option<usize>,
    /// No live status line, even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
    /// Ignore existing checkpoints (they are deleted) and start from the beginning. By
    /// default a pipeline whose checkpoint storage holds a completed checkpoint resumes from
    /// the latest valid one.
    #[arg(long, conflicts_with = "from_checkpoint")]
    pub fresh: bool,
    /// Resume from this checkpoint directory (`<storage>/<pipeline>/chk-<n>`) instead of the
    /// latest one.
    #[arg(long, value_name = "PATH", conflicts_with = "from_savepoint")]
    pub from_checkpoint: Option<PathBuf>,
    /// Start from this savepoint directory (`weir savepoint` prints it): state is restored by
    /// operator id, into any state backend and parallelism. With several pipelines in the
    /// file, each one restores the savepoint taken of it (`savepoint-<pipeline>-...`); give the
    /// flag once per pipeline.
    #[arg(long, value_name = "PATH", conflicts_with = "fresh")]
    pub from_savepoint: Vec<PathBuf>,
    /// Let a restore (`--from-savepoint`, `--from-checkpoint`, a resume, and every reload of
    /// this run, `--watch` included) drop state the pipeline no longer declares (an operator
    /// removed from the file, a keyed state removed or renamed) instead of refusing.
    #[arg(long)]
    pub allow_non_restored_state: bool,
    /// Watch the file (and every script file it references) and hot-reload on changes: each
    /// changed pipeline is stopped with a savepoint and restarted from it in its new version;
    /// unchanged ones keep running. Off by default.
    #[arg(long)]
    pub watch: bool,
    /// Port of the control API on 127.0.0.1 (`weir status`, `savepoint`, `stop`, `reload`).
    /// Wins over the file's `api.port` (and `api.enabled: false`); default 8642. `weir run`
    /// refuses to start when the port is taken. 0 picks a free port (printed in the log).
    #[arg(long, value_name = "PORT", conflicts_with = "no_api")]
    pub api_port: Option<u16>,
    /// Do not serve the control API (wins over the file's `api:`).
    #[arg(long)]
    pub no_api: bool,
    /// Bearer token the API requires on mutating calls. Without the flag: the
    /// `WEIR_API_TOKEN` environment variable, else the variable the file's `api.token_env`
    /// names. An empty token is refused.
    #[arg(long, value_name = "TOKEN")]
    pub api_token: Option<String>,
    /// Let API requests (`weir savepoint --dir`, `weir stop --savepoint --dir`) write
    /// savepoints to any directory. Without it, a requested directory must lie under the
    /// pipeline's `savepoints.dir` (a relative one is relative to it).
    #[arg(long)]
    pub allow_any_savepoint_dir: bool,
    /// Log level: error, warn, info (the default: one line per lifecycle event), debug (every
    /// checkpoint, with its duration and size) or trace. Wins over `RUST_LOG`; for a filter per
    /// module, leave it out and set `RUST_LOG` (e.g. `info,weir_engine::checkpoint=debug`).
    #[arg(long, value_name = "LEVEL", value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: Option<String>,
    /// Log format: `text` (default) or `json` (one JSON object per line; the summary at the end
    /// stays text).
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Do not measure busy and backpressured time, input queue fill or source lag (they stay
    /// 0 in `/metrics` and `weir status`); record counts, checkpoint, restart and reload
    /// figures are kept. For measuring what the metrics cost (docs/METRICS.md).
    #[arg(long)]
    pub no_metrics: bool,
}

/// The log section of `weir run --help`.
const LOG_HELP: &str = "\
Logging:
  The log goes to standard error, except on a terminal without --no-progress, where a live
  status line takes its place. Its level comes from --log-level, else from
  the RUST_LOG environment variable (a tracing-subscriber filter such as
  `info,weir_engine::checkpoint=debug`), else `info`. At `info` each lifecycle event (a pipeline
  started, failed, restarted, finished; a savepoint; a reload) is one line and each failure is
  reported once with its causes; completed checkpoints are logged at `debug` (`weir checkpoints
  PIPELINE` shows their history). --log-format json writes one JSON object per line.";

/// Installs the log subscriber: `--log-level`, else `RUST_LOG`, else `info`; text or JSON.
fn init_logs(args: &RunArgs) {
    let filter = match &args.log_level {
        Some(level) => tracing_subscriber::EnvFilter::new(level),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| RedactingStderr);
    let _ = match args.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

/// Standard error with every `${secret:...}` value the process loaded replaced by `***`:
/// the log's writer (each event arrives in one write).
struct RedactingStderr;

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(weir_schema::interpolate::redact(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn status_line(p: &[PipelineProgress], elapsed: Duration) -> String {
    let total: u64 = p.iter().map(|x| x.source_records).sum();
    let rate = total as f64 / elapsed.as_secs_f64().max(1e-9);
    let parts: Vec<String> = p
        .iter()
        .map(|x| {
            format!(
                "{} {}{}",
                x.id,
                human(x.source_records as f64),
                if x.finished { " ✓" } else { "" }
            )
        })
        .collect();
    format!(
        "{:>6.1}s  {}/s  {}",
        elapsed.as_secs_f64(),
        human(rate),
        parts.join(" · ")
    )
}

fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn print_summary(s: &JobSummary) {
    let mut out = String::new();
    for p in &s.pipelines {
        let verdict = match &p.error {
            None => "ok",
            Some(weir_engine::error::RunError::StoppedWhileRestarting { .. }) => {
                "FAILED (stopped while restarting)"
            }
            Some(_) => "FAILED",
        };
        out.push_str(&format!(
            "pipeline {}: {verdict} in {:.3}s, {} records, {}/s\n",
            p.id,
            p.wall.as_secs_f64(),
            p.source_records(),
            human(p.throughput())
        ));
        out.push_str(&format!(
            "  {:<24} {:<10} {:>4} {:>12} {:>12} {:>8}\n",
            "element", "type", "par", "in", "out", "errors"
        ));
        for n in &p.nodes {
            let out_col = if n.role == weir_engine::plan::Role::Sink {
                "-".to_owned()
            } else {
                n.records_out.to_string()
            };
            out.push_str(&format!(
                "  {:<24} {:<10} {:>4} {:>12} {:>12} {:>8}\n",
                n.id, n.type_name, n.parallelism, n.records_in, out_col, n.errors
            ));
        }
        out.push_str(&format!("  {}\n", latency_line(p)));
        let mut notes = Vec::new();
        if let Some(c) = p.restored_from {
            notes.push(format!("resumed from checkpoint {c}"));
        }
        if p.checkpoints > 0 {
            // A checkpoint taken after every task finished holds no state: leave it out.
            let st: Vec<_> = p.checkpoint_stats.iter().filter(|c| c.size > 0).collect();
            let mut d: Vec<f64> = st.iter().map(|c| c.duration.as_secs_f64() * 1e3).collect();
            d.sort_by(f64::total_cmp);
            let median = d.get(d.len() / 2).copied().unwrap_or(0.0);
            let last = st.last().map_or(0, |c| c.size);
            let new: u64 = st.iter().map(|c| c.new_bytes).sum::<u64>() / st.len().max(1) as u64;
            notes.push(format!(
                "{} checkpoints (median {median:.1}ms, last {} bytes, {} new bytes on average)",
                p.checkpoints, last, new
            ));
            // Unaligned checkpoints: the in-flight records they stored.
            let channel: Vec<u64> = st
                .iter()
                .map(|c| c.channel_state_bytes)
                .filter(|&b| b > 0)
                .collect();
            if !channel.is_empty() {
                notes.push(format!(
                    "{} with channel state ({} bytes on average)",
                    channel.len(),
                    channel.iter().sum::<u64>() / channel.len() as u64
                ));
            }
        }
        if p.restarts > 0 {
            notes.push(format!("{} restarts", p.restarts));
        }
        if p.reloads > 0 {
            notes.push(format!("{} reloads applied", p.reloads));
        }
        if p.degraded > 0 {
            notes.push(format!("DEGRADED: {} tasks down", p.degraded));
        }
        if !notes.is_empty() {
            out.push_str(&format!("  {}\n", notes.join(", ")));
        }
    }
    out.push_str(&format!("total wall time {:.3}s\n", s.wall.as_secs_f64()));
    let redact = weir_schema::interpolate::redact;
    eprint!("{}", redact(&out));
    for p in &s.pipelines {
        if let Some(e) = &p.error {
            // Not wrapped: a record excerpt in the message stays whole and greppable.
            let report = super::api_args::render(failure_report(&p.id, e).as_ref());
            eprintln!("{}", redact(report.trim_end()));
        }
    }
}

/// From the start of `weir run`, over every generation of the pipeline: a source's first
/// record, the first record through every operator (sinks left out: after an `emit: final`
/// stage they see records only at the end), and the first record into a sink. A figure that
/// does not exist is left out rather than shown as `-`.
fn latency_line(p: &weir_engine::job::PipelineSummary) -> String {
    let ms = |d: Duration| format!("{:.1}ms", d.as_secs_f64() * 1e3);
    let mut parts = Vec::new();
    if let Some(d) = p.first_record {
        parts.push(format!("first record in {}", ms(d)));
    }
    if let Some(d) = p.all_processing {
        parts.push(format!("every operator processing after {}", ms(d)));
    }
    match p.first_output {
        Some(d) => parts.push(format!("first output in {}", ms(d))),
        None => parts.push("no output".to_owned()),
    }
    if p.first_record.is_none() {
        parts.insert(0, "no source record read".to_owned());
    }
    parts.join(", ")
}

/// A miette report for a pipeline that failed for good: the error names the pipeline,
/// operator, subtask and record; the help says what gave up and what to do.
fn failure_report(pipeline: &str, e: &weir_engine::error::RunError) -> miette::Report {
    use weir_engine::error::RunError;
    let (cause, reason) = match e {
        RunError::GaveUp { reason, cause } => (cause.as_ref(), Some(reason.as_str())),
        other => (other, None),
    };
    let class = weir_engine::error::class_name(cause.class());
    let help = match reason {
        Some(r) => format!(
            "{} ({class}). Fix the cause and run again: with checkpoints, the run resumes from \
             the latest one; `restart:` in the pipeline sets how often Weir retries",
            r.split("; last failure").next().unwrap_or(r)
        ),
        None => format!("{class}: fix the cause and run again"),
    };
    let text = cause.to_string();
    let message = if text.contains(&format!("`{pipeline}`")) {
        text
    } else {
        format!("pipeline `{pipeline}`: {text}")
    };
    miette::miette!(
        code = "weir::run::pipeline_failed",
        help = help,
        "{message}"
    )
}

/// Matches `--from-savepoint` paths to pipelines: with one pipeline, the one path; otherwise
/// by the `savepoint-<pipeline>-<id>-<ms>` directory name, or the pipeline recorded in the
/// savepoint's metadata.
fn savepoints_by_pipeline(
    plan: &weir_engine::plan::FilePlan,
    paths: &[PathBuf],
) -> Result<Vec<(String, PathBuf)>, miette::Report> {
    let mut out = Vec::new();
    for path in paths {
        let owner = if plan.pipelines.len() == 1 {
            plan.pipelines.first().map(|p| p.id.clone())
        } else {
            weir_engine::savepoint_pipeline(path)
                .filter(|id| plan.pipelines.iter().any(|p| &p.id == id))
        };
        let Some(owner) = owner else {
            return Err(miette::miette!(
                code = "weir::run::savepoint_pipeline",
                help = "give the savepoint of each pipeline; `weir savepoint PIPELINE` prints its path",
                "cannot tell which pipeline savepoint `{}` belongs to (it is missing, damaged, or was taken of a pipeline this file does not have)",
                path.display()
            ));
        };
        if out.iter().any(|(p, _)| p == &owner) {
            return Err(miette::miette!(
                code = "weir::run::savepoint_pipeline",
                "two savepoints given for pipeline `{owner}`"
            ));
        }
        out.push((owner, path.clone()));
    }
    Ok(out)
}

/// Runs `weir run`.
pub fn run(args: &RunArgs) -> ExitCode {
    let started = std::time::Instant::now();
    let validation = validate_file(&args.file);
    let all: Vec<&Diagnostic> = validation.diagnostics.iter().collect();
    if !all.is_empty() {
        eprint!("{}", super::validate::render(&all));
    }
    let plan = match validation.plan() {
        None => {
            eprintln!("{}: invalid; not running", validation.source.name);
            return ExitCode::FAILURE;
        }
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        Some(Ok(plan)) => plan,
    };
    let tty = std::io::stderr().is_terminal() && !args.no_progress;
    if !tty {
        init_logs(args);
    }
    let json_log = !tty && args.log_format == LogFormat::Json;
    let progress: Option<job::ProgressFn> = tty.then(|| {
        Arc::new(|p: &[PipelineProgress], elapsed: Duration| {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{}", status_line(p, elapsed));
            let _ = err.flush();
        }) as job::ProgressFn
    });
    let savepoints = match savepoints_by_pipeline(&plan, &args.from_savepoint) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{:?}", e);
            return ExitCode::FAILURE;
        }
    };
    let api_spec = validation
        .spec
        .as_ref()
        .map(|s| s.api.clone())
        .unwrap_or_default();
    let flags = weir_engine::api::settings::ApiFlags {
        no_api: args.no_api,
        port: args.api_port,
        token: args.api_token.clone(),
    };
    let api = match weir_engine::api::settings::resolve(&flags, &api_spec, &|name| {
        std::env::var_os(name)
    }) {
        Ok(settings) => settings,
        Err(e) => {
            eprint!("{}", super::api_args::render(&e));
            return ExitCode::FAILURE;
        }
    };
    // On a terminal (no log subscriber) the notes go straight to standard error.
    for note in &api.overrides {
        if tty {
            eprintln!("note: {note}");
        } else {
            tracing::warn!("Control API: {note}.");
        }
    }
    if api.config.is_some() && !tty {
        tracing::info!(
            token = %weir_engine::api::settings::source_name(&api.token_source),
            "Control API token source."
        );
    }
    let options = JobOptions {
        handle_signals: true,
        progress,
        worker_threads: args.workers,
        started: Some(started),
        recovery: job::RecoveryOptions {
            fresh: args.fresh,
            from_checkpoint: args.from_checkpoint.clone(),
            from_savepoint: None,
            allow_non_restored_state: args.allow_non_restored_state,
            latest_into_new_version: false,
        },
        file: Some(args.file.clone()),
        watch: args.watch,
        api: api.config,
        api_spec: Some(api_spec),
        allow_any_savepoint_dir: args.allow_any_savepoint_dir,
        // The one start-up line saying where the API listens (scripts and tests read it); in
        // a JSON log, a JSON line like the others.
        api_ready: Some(Arc::new(move |addr| {
            if json_log {
                tracing::info!(%addr, "Control API listening on http://{addr}.");
            } else {
                eprintln!("control API on http://{addr}");
            }
        })),
        render: Some(Arc::new(|d: &[&Diagnostic]| super::validate::render(d))),
        from_savepoints: savepoints,
        no_metrics: args.no_metrics,
        ..JobOptions::default()
    };
    match job::run(plan, options) {
        Ok(summary) => {
            if tty {
                eprint!("\r\x1b[2K");
            }
            print_summary(&summary);
            if summary.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(weir_engine::error::RunError::Api(e)) => {
            // One line: which address, who holds it, what to do.
            let code = miette::Diagnostic::code(&e)
                .map_or_else(|| "weir::api".to_owned(), |c| c.to_string());
            eprintln!("error[{code}]: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
