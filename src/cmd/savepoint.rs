//! `weir savepoint PIPELINE [--dir DIR]`: takes a savepoint of one pipeline of a running
//! `weir run` and waits until it is on disk. Its path goes alone on standard output (for
//! scripts: `sp=$(weir savepoint totals)`); its size and duration on standard error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use weir_engine::control::SavepointRequest;

use super::api_args::{self, ApiArgs};

/// Arguments of `weir savepoint`.
#[derive(Args, Debug)]
pub struct SavepointArgs {
    /// The pipeline id.
    pub pipeline: String,
    /// The directory to create the savepoint in (default: the pipeline's `savepoints.dir`,
    /// `.weir/savepoints` next to the file). A relative DIR is relative to that savepoint root,
    /// not to this shell's directory; an absolute one must lie inside the root unless
    /// `weir run` was started with --allow-any-savepoint-dir. On S3 (`savepoints.dir:
    /// s3://bucket/prefix`) the same holds for `s3://` URLs under that location.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Runs `weir savepoint`.
pub fn run(args: &SavepointArgs) -> ExitCode {
    let client = match args.api.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let request = SavepointRequest {
        dir: args.dir.clone(),
    };
    match client.savepoint(&args.pipeline, &request) {
        Ok(info) => {
            eprintln!(
                "savepoint of pipeline `{}` taken as checkpoint {}: {} in {}",
                info.pipeline,
                info.checkpoint,
                api_args::bytes(info.size),
                api_args::duration(info.duration_ms)
            );
            println!("{}", info.path.display());
            ExitCode::SUCCESS
        }
        Err(e) => api_args::fail(Some(&client), &e),
    }
}
