//! `weir schema`: prints the JSON Schema of the pipeline file format.

use std::process::ExitCode;

use clap::Args;

/// Arguments of `weir schema`.
#[derive(Args, Debug)]
pub struct SchemaArgs {}

/// Runs `weir schema`.
pub fn run(_: &SchemaArgs) -> ExitCode {
    print!("{}", weir_schema::schema::json_schema_string());
    ExitCode::SUCCESS
}
