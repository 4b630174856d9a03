//! What the verbs that talk to a running `weir run` share (`status`, `checkpoints`, `savepoint`,
//! `stop`, `reload`, `tap`, `top`): the `--api` and `--token` arguments, and the rendering of a
//! failed call as a miette report with its exit code (1 for a failed call, 2 when nothing is
//! listening).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use miette::{GraphicalReportHandler, GraphicalTheme, MietteDiagnostic};
use weir_engine::api::{ADDR_ENV, ApiClient, ClientError, DEFAULT_ADDR, TOKEN_ENV};
use weir_engine::control::ControlError;

/// Where the API of the running `weir run` is, and the token its mutating calls need.
#[derive(Args, Debug, Clone)]
pub struct ApiArgs {
    /// The API of the `weir run` to talk to: HOST:PORT or http://HOST:PORT.
    #[arg(long, value_name = "ADDR", env = ADDR_ENV, default_value = DEFAULT_ADDR)]
    pub api: String,
    /// The bearer token `weir run` was started with (`--api-token`); needed by savepoint, stop
    /// and reload when it has one.
    #[arg(long, value_name = "TOKEN", env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
}

impl ApiArgs {
    /// The client, or the exit code after reporting a malformed `--api`.
    pub fn client(&self) -> Result<ApiClient, ExitCode> {
        ApiClient::new(&self.api, self.token.clone()).map_err(|e| fail(None, &e))
    }
}

/// The exit code of a verb whose call failed: 2 when nothing is listening, 1 otherwise.
pub fn exit_code(err: &ClientError) -> ExitCode {
    match err {
        ClientError::NotListening { .. } => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

/// Prints `err` as a report on standard error and returns the verb's exit code. With the
/// client, an unknown pipeline's help lists the running ones.
pub fn fail(client: Option<&ApiClient>, err: &ClientError) -> ExitCode {
    eprint!("{}", render(&report(client, err)));
    exit_code(err)
}

/// Prints a report built from its parts and returns exit code 1.
pub fn fail_with(code: &str, message: String, help: String) -> ExitCode {
    let diagnostic = MietteDiagnostic::new(message)
        .with_code(code)
        .with_help(help);
    eprint!("{}", render(&diagnostic));
    ExitCode::FAILURE
}

/// The report of a failed call: a code per kind of failure, the message, and how to fix it.
fn report(client: Option<&ApiClient>, err: &ClientError) -> MietteDiagnostic {
    let (code, help) = match err {
        ClientError::Address { .. } => (
            "weir::api::bad_address",
            format!(
                "--api (or {ADDR_ENV}) takes HOST:PORT or http://HOST:PORT, e.g. {DEFAULT_ADDR}"
            ),
        ),
        ClientError::NotListening { .. } => (
            "weir::api::not_listening",
            format!(
                "start it with `weir run FILE` (its API listens on {DEFAULT_ADDR} unless \
                 --api-port or --no-api says otherwise), or point --api (or {ADDR_ENV}) at the \
                 address it listens on"
            ),
        ),
        ClientError::Api { error, .. } => match error {
            ControlError::NoSuchPipeline(_) => {
                ("weir::api::no_such_pipeline", running_pipelines(client))
            }
            ControlError::Busy(_) => (
                "weir::api::busy",
                "wait for the savepoint, stop or reload in progress to finish (`weir status` \
                 shows it), then try again"
                    .to_owned(),
            ),
            ControlError::Invalid(_) => (
                "weir::api::invalid",
                "`weir status` shows each pipeline's state; `weir help` lists the verbs and \
                 their arguments"
                    .to_owned(),
            ),
            ControlError::Failed(_) => (
                "weir::api::failed",
                "the `weir run` log has the details; `weir status` shows whether the pipeline \
                 still runs"
                    .to_owned(),
            ),
            ControlError::Unauthorized(_) => (
                "weir::api::unauthorized",
                format!(
                    "pass the token `weir run` was started with (its --api-token, {TOKEN_ENV} \
                     or the variable its file's `api.token_env` names) with --token TOKEN or \
                     the {TOKEN_ENV} environment variable"
                ),
            ),
            ControlError::Forbidden(_) => (
                "weir::api::forbidden",
                "the API refuses this whatever the token; the message says what it accepts \
                 (README, \"Control API security\")"
                    .to_owned(),
            ),
        },
        ClientError::TimedOut { .. } => (
            "weir::api::timed_out",
            "`weir status` shows whether the work completed".to_owned(),
        ),
        ClientError::Protocol { addr, .. } => (
            "weir::api::protocol",
            format!(
                "is {addr} the API of a `weir run` of the same version as this `weir` ({})? \
                 Point --api (or {ADDR_ENV}) at it",
                env!("CARGO_PKG_VERSION")
            ),
        ),
        ClientError::Io { .. } => (
            "weir::api::io",
            format!("check the address (--api or {ADDR_ENV}) and that `weir run` is up"),
        ),
    };
    MietteDiagnostic::new(err.to_string())
        .with_code(code)
        .with_help(help)
}

/// The help of an unknown pipeline: the ids that do run, when the job answers.
fn running_pipelines(client: Option<&ApiClient>) -> String {
    let ids: Option<Vec<String>> = client
        .and_then(|c| c.status().ok())
        .map(|s| s.pipelines.into_iter().map(|p| p.id).collect());
    match ids {
        Some(ids) if !ids.is_empty() => format!(
            "the pipelines of this job are: {}; `weir status` shows them",
            ids.join(", ")
        ),
        Some(_) => "this job runs no pipeline".to_owned(),
        None => "`weir status` lists the pipelines of the job".to_owned(),
    }
}

/// Renders a report for standard error: colours only on a terminal without `NO_COLOR`; long
/// lines are not wrapped (the terminal does it), so flags and paths stay whole and greppable.
pub fn render(diagnostic: &dyn miette::Diagnostic) -> String {
    use std::io::IsTerminal;
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let mut out = String::new();
    if GraphicalReportHandler::new_themed(theme)
        .with_wrap_lines(false)
        .render_report(&mut out, diagnostic)
        .is_err()
    {
        out = format!(
            "error[{}]: {diagnostic}\n",
            diagnostic
                .code()
                .map_or_else(|| "weir::api".to_owned(), |c| c.to_string()),
        );
    }
    out
}

/// `path` made absolute against this process's working directory: `weir run` resolves paths
/// against its own, which may be another.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Milliseconds as text: `250 ms`, `3.4 s`, `2m 5s`.
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{}m {}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

/// Bytes as text (`1.2 MiB`).
pub fn bytes(n: u64) -> String {
    bytesize::ByteSize(n).display().iec().to_string()
}

/// The lines of a table (no newlines): each column as wide as its widest cell, cells two
/// spaces apart, right-aligned where `right` says, the last column not padded.
pub fn table_lines<const N: usize>(rows: &[[String; N]], right: [bool; N]) -> Vec<String> {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .zip(right)
                .enumerate()
                .map(|(i, ((cell, w), r))| match (r, i + 1 == N) {
                    (true, _) => format!("{cell:>w$}"),
                    (false, true) => cell.clone(),
                    (false, false) => format!("{cell:<w$}"),
                })
                .collect();
            cells.join("  ")
        })
        .collect()
}
