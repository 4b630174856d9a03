//! `weir stop PIPELINE [--savepoint] [--drain] [--dir DIR]`: stops one pipeline of a running
//! `weir run` (the others go on) and waits until it stopped. The savepoint's path, when one
//! was taken, goes alone on standard output; the rest of the outcome on standard error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use weir_engine::control::StopRequest;

use super::api_args::{self, ApiArgs};

/// Arguments of `weir stop`.
#[derive(Args, Debug)]
pub struct StopArgs {
    /// The pipeline id.
    pub pipeline: String,
    /// Take a savepoint at the stop (sources stop at its barrier, sinks commit); resume from
    /// it with `weir run --from-savepoint`.
    #[arg(long)]
    pub savepoint: bool,
    /// Drain first: sources end, and everything in flight and every `emit: final` result
    /// reaches the sinks before the pipeline stops.
    #[arg(long)]
    pub drain: bool,
    /// The directory to create the savepoint in (default: the pipeline's `savepoints.dir`,
    /// `.weir/savepoints` next to the file). A relative DIR is relative to that savepoint root,
    /// not to this shell's directory; an absolute one must lie inside the root unless
    /// `weir run` was started with --allow-any-savepoint-dir. On S3 (`savepoints.dir:
    /// s3://bucket/prefix`) the same holds for `s3://` URLs under that location.
    #[arg(long, value_name = "DIR", requires = "savepoint")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Runs `weir stop`.
pub fn run(args: &StopArgs) -> ExitCode {
    let client = match args.api.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let request = StopRequest {
        savepoint: args.savepoint,
        drain: args.drain,
        dir: args.dir.clone(),
    };
    match client.stop(&args.pipeline, &request) {
        Ok(outcome) => {
            let how = if args.drain {
                "drained and stopped"
            } else {
                "stopped"
            };
            match &outcome.savepoint {
                Some(sp) => {
                    eprintln!(
                        "pipeline `{}` {how}; savepoint taken as checkpoint {}: {} in {}",
                        outcome.pipeline,
                        sp.checkpoint,
                        api_args::bytes(sp.size),
                        api_args::duration(sp.duration_ms)
                    );
                    println!("{}", sp.path.display());
                }
                None => eprintln!("pipeline `{}` {how} (no savepoint)", outcome.pipeline),
            }
            ExitCode::SUCCESS
        }
        Err(e) => api_args::fail(Some(&client), &e),
    }
}
