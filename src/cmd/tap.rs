//! `weir tap PIPELINE OPERATOR [--input] [--sample RATE] [--limit N]`: a live sample of the
//! records an operator of a running `weir run` emits (or receives), one JSON record per line
//! on standard output; what the tap is doing (opened, records dropped because this reader fell
//! behind, why it ended) goes to standard error.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use weir_engine::control::{TapEvent, TapRequest, TapSide};

use super::api_args::{self, ApiArgs};

/// Arguments of `weir tap`.
#[derive(Args, Debug)]
#[command(after_help = "\
Records are printed as they pass, one JSON value per line; notes about the tap go to stderr. \
The tap never slows the pipeline: records this reader cannot keep up with are dropped (and \
counted on stderr), not waited for. It keeps streaming across restarts and hot reloads, and \
ends at --limit, when the pipeline ends, or when a reload removes the operator (exit code 1). \
Ctrl-C closes it.

Examples:
  weir tap totals enrich                     every record `enrich` emits
  weir tap totals enrich --sample 0.01       one record in a hundred
  weir tap totals out --input --limit 10     the next 10 records the sink `out` writes")]
pub struct TapArgs {
    /// The pipeline (as `weir status` lists it).
    pub pipeline: String,
    /// The source, operator or sink to tap (its `id:` in the file).
    pub operator: String,
    /// Show the records the operator receives instead of those it emits (needed for a sink).
    #[arg(long)]
    pub input: bool,
    /// The fraction of records shown, in (0, 1]: 1 shows every record, 0.1 every tenth.
    #[arg(long, value_name = "RATE", default_value_t = 1.0)]
    pub sample: f64,
    /// Stop after this many records.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Print each record with the subtask that saw it: `{"subtask": 0, "value": ...}`.
    #[arg(long)]
    pub subtask: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Runs `weir tap`.
pub fn run(args: &TapArgs) -> ExitCode {
    let client = match args.api.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let request = TapRequest {
        operator: args.operator.clone(),
        side: if args.input {
            TapSide::Input
        } else {
            TapSide::Output
        },
        sample: args.sample,
        limit: args.limit,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut code = ExitCode::SUCCESS;
    let result = client.tap(&args.pipeline, &request, |event| match event {
        TapEvent::Started {
            pipeline,
            operator,
            side,
            sample,
        } => {
            let which = if sample >= 1.0 {
                "every record".to_owned()
            } else {
                format!("a sample of {sample}")
            };
            let what = match side {
                TapSide::Input => "received by",
                TapSide::Output => "emitted by",
            };
            eprintln!(
                "weir tap: {which} {what} `{operator}` in pipeline `{pipeline}`; Ctrl-C stops"
            );
            true
        }
        TapEvent::Record { subtask, value } => {
            let line = if args.subtask {
                serde_json::json!({"subtask": subtask, "value": value}).to_string()
            } else {
                value.to_string()
            };
            // A closed stdout (`| head`) ends the tap quietly.
            writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
        }
        TapEvent::Dropped { total } => {
            eprintln!(
                "weir tap: {total} record(s) dropped so far: beyond the tap's 1000 records a \
                 second, or this reader fell behind (the pipeline did not wait; use --sample \
                 for an even spread)"
            );
            true
        }
        TapEvent::End {
            reason,
            records,
            dropped,
            ok,
        } => {
            let dropped = if dropped > 0 {
                format!(", {dropped} dropped")
            } else {
                String::new()
            };
            eprintln!("weir tap: ended: {reason} ({records} record(s) shown{dropped})");
            if !ok {
                code = ExitCode::FAILURE;
            }
            false
        }
    });
    match result {
        Ok(()) => code,
        Err(e) => api_args::fail(Some(&client), &e),
    }
}
