//! `weir validate FILE...`: every check on every file, all diagnostics in one report.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use miette::{GraphicalReportHandler, GraphicalTheme};
use weir_engine::plan::guarantee::{Guarantee, guarantee};
use weir_engine::validate::{Validation, validate_file};
use weir_schema::Diagnostic;

/// Output format of `weir validate`.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Format {
    /// Human-readable reports with labelled snippets (on standard error).
    #[default]
    Text,
    /// One JSON document on standard output, for editors and CI.
    Json,
}

/// Arguments of `weir validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Pipeline files to check.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Treat warnings as errors (exit non-zero when there are any).
    #[arg(long)]
    pub deny_warnings: bool,
}

/// Renders diagnostics for a terminal or a log: colours only on a terminal without `NO_COLOR`.
pub fn render(diagnostics: &[&Diagnostic]) -> String {
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme).with_context_lines(2);
    let mut out = String::new();
    for d in diagnostics {
        if handler.render_report(&mut out, *d).is_err() {
            out.push_str(&format!("{}: {}\n", d.code, d.message));
        }
        out.push('\n');
    }
    out
}

/// The delivery guarantee of every pipeline of a file without errors (none otherwise).
fn guarantees(v: &Validation) -> Vec<(String, Guarantee)> {
    match &v.spec {
        Some(spec) if !v.diagnostics.has_errors() => spec
            .pipelines
            .iter()
            .map(|p| (p.id.clone(), guarantee(p)))
            .collect(),
        _ => Vec::new(),
    }
}

/// Prints a file's diagnostics, a one-line verdict and, for a file without errors, a note per
/// pipeline with its delivery guarantee, to standard error.
pub fn print_text(v: &Validation, deny_warnings: bool) {
    let all: Vec<&Diagnostic> = v.diagnostics.iter().collect();
    eprint!("{}", render(&all));
    let (e, w) = (v.diagnostics.error_count(), v.diagnostics.warning_count());
    let verdict = if v.is_ok(deny_warnings) {
        "valid"
    } else {
        "invalid"
    };
    match (e, w) {
        (0, 0) => eprintln!("{}: {verdict}", v.source.name),
        _ => eprintln!(
            "{}: {verdict} ({e} error{}, {w} warning{})",
            v.source.name,
            plural(e),
            plural(w)
        ),
    }
    for (id, g) in guarantees(v) {
        eprintln!("  note: pipeline `{id}` is {g}");
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Runs `weir validate`.
pub fn run(args: &ValidateArgs) -> ExitCode {
    let results: Vec<Validation> = args.files.iter().map(|f| validate_file(f)).collect();
    let ok = results.iter().all(|v| v.is_ok(args.deny_warnings));
    match args.format {
        Format::Text => {
            for v in &results {
                print_text(v, args.deny_warnings);
            }
        }
        Format::Json => {
            let files: Vec<serde_json::Value> = results
                .iter()
                .map(|v| {
                    serde_json::json!({
                        "file": v.source.name,
                        "valid": v.is_ok(args.deny_warnings),
                        "errors": v.diagnostics.error_count(),
                        "warnings": v.diagnostics.warning_count(),
                        "diagnostics": v.diagnostics.iter().map(Diagnostic::to_json).collect::<Vec<_>>(),
                        "guarantees": guarantees(v).into_iter().map(|(id, g)| serde_json::json!({
                            "pipeline": id,
                            "guarantee": g.level.name(),
                            "reasons": g.reasons,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let doc = serde_json::json!({ "valid": ok, "files": files });
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
