//! `weir graph FILE`: validates, plans and prints the operator graph.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use weir_engine::plan::render;
use weir_engine::validate::validate_file;

/// Output format of `weir graph`.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum GraphFormat {
    /// Logical and physical graph as indented text.
    #[default]
    Text,
    /// Graphviz DOT.
    Dot,
    /// Mermaid flowchart.
    Mermaid,
}

/// Arguments of `weir graph`.
#[derive(Args, Debug)]
pub struct GraphArgs {
    /// The pipeline file.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
    pub format: GraphFormat,
}

/// Runs `weir graph`.
pub fn run(args: &GraphArgs) -> ExitCode {
    let validation = validate_file(&args.file);
    if validation.diagnostics.has_errors() {
        super::validate::print_text(&validation, false);
        return ExitCode::FAILURE;
    }
    let plan = match validation.plan() {
        Some(Ok(plan)) => plan,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        None => return ExitCode::FAILURE,
    };
    let text = match args.format {
        GraphFormat::Text => render::text(&plan),
        GraphFormat::Dot => render::dot(&plan),
        GraphFormat::Mermaid => render::mermaid(&plan),
    };
    print!("{}", validation.secrets.redact(&text));
    ExitCode::SUCCESS
}
