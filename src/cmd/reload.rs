//! `weir reload [--plan [FILE]]`: re-reads the pipeline file of a running `weir run` and
//! applies the changes (savepoint, new graph, restore; rollback on failure), printing the
//! outcome; with `--plan`, prints what a reload would do (comparing FILE, or the running file,
//! with the running version) and changes nothing.
//!
//! Exit code 1 when the reload was rejected, rolled back or failed, or when a plan has
//! problems that would reject it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use weir_engine::api::render_reload;
use weir_engine::control::{ReloadOutcome, ReloadRequest};

use super::api_args::{self, ApiArgs};

/// Arguments of `weir reload`.
#[derive(Args, Debug)]
pub struct ReloadArgs {
    /// Print the reload plan only and apply nothing; with FILE, plan a reload to FILE instead
    /// of the file `weir run` was started with.
    #[arg(long, value_name = "FILE")]
    #[allow(clippy::option_option)]
    pub plan: Option<Option<PathBuf>>,
    /// Let this reload drop state the new version no longer declares (an operator removed
    /// from the file, a keyed state removed or renamed): it is not restored, and logged.
    #[arg(long)]
    pub allow_non_restored_state: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Runs `weir reload`.
pub fn run(args: &ReloadArgs) -> ExitCode {
    let client = match args.api.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let request = ReloadRequest {
        file: args
            .plan
            .as_ref()
            .and_then(|f| f.as_deref())
            .map(api_args::absolute),
        plan_only: args.plan.is_some(),
        allow_non_restored_state: args.allow_non_restored_state,
        ..ReloadRequest::default()
    };
    match client.reload(&request) {
        Ok(outcome) => {
            print!("{}", render_reload(&outcome));
            verdict(&outcome)
        }
        Err(e) => api_args::fail(Some(&client), &e),
    }
}

/// Success, or a report saying why not and exit code 1.
fn verdict(outcome: &ReloadOutcome) -> ExitCode {
    let problems: usize = outcome.pipelines.iter().map(|p| p.problems.len()).sum();
    let (code, message, help) = match outcome.result.as_str() {
        "applied" | "unchanged" => return ExitCode::SUCCESS,
        "planned" if problems == 0 => return ExitCode::SUCCESS,
        "planned" => (
            "weir::reload::problems",
            format!("this reload would be rejected: {problems} problem(s) in the plan"),
            "fix the pipeline file (see each `problem:` above) and plan again",
        ),
        "rejected" => (
            "weir::reload::rejected",
            "the reload was rejected; the running version goes on unchanged".to_owned(),
            "fix the pipeline file (see the messages above) and reload again",
        ),
        "rolled_back" => (
            "weir::reload::rolled_back",
            "the new version failed to start and was rolled back; the old one runs again"
                .to_owned(),
            "fix the cause above and reload again; `weir reload --plan` shows what would change",
        ),
        "failed" => (
            "weir::reload::failed",
            "the reload failed and so did the rollback".to_owned(),
            "`weir status` shows which pipelines run; the `weir run` log has the details",
        ),
        other => (
            "weir::reload::unknown",
            format!("the reload ended as `{other}`, which this `weir` does not know"),
            "is `weir run` of the same version as this `weir`?",
        ),
    };
    api_args::fail_with(code, message, help.to_owned())
}
