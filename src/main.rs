//! `weir`: the command-line interface. Thin by design: argument parsing and output only; every
//! behaviour lives in `weir-engine` and `weir-schema`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// mimalloc: records are allocated by source tasks and freed by downstream tasks on other
/// worker threads, which glibc malloc serves poorly (arena locks, consolidation).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Weir: declarative, fault-tolerant stream processing.
#[derive(Parser, Debug)]
#[command(name = "weir", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check pipeline files: YAML, schema, wiring, semantics and Rhai scripts.
    Validate(cmd::validate::ValidateArgs),
    /// Print the JSON Schema of the pipeline file format.
    Schema(cmd::schema::SchemaArgs),
    /// Print the operator graph of a pipeline file (logical and physical).
    Graph(cmd::graph::GraphArgs),
    /// Run every pipeline of a file until its sources are exhausted or it is stopped.
    Run(cmd::run::RunArgs),
    /// Show the pipelines of a running `weir run`: state, records, checkpoints, reloads.
    Status(cmd::status::StatusArgs),
    /// Show what a checkpoint or savepoint directory holds: operators, states, keys, source
    /// positions; or dump one operator's keyed state as JSON lines.
    Inspect(cmd::inspect::InspectArgs),
    /// Show the checkpoint history of one pipeline of a running `weir run`: durations, sizes,
    /// the slowest subtask, failures.
    Checkpoints(cmd::checkpoints::CheckpointsArgs),
    /// Take a savepoint of one pipeline of a running `weir run`; prints its path.
    Savepoint(cmd::savepoint::SavepointArgs),
    /// Stop one pipeline of a running `weir run`, with a savepoint if asked.
    Stop(cmd::stop::StopArgs),
    /// Reload the pipeline file of a running `weir run`, or show what a reload would do.
    Reload(cmd::reload::ReloadArgs),
    /// Stream a live sample of the records an operator of a running `weir run` emits (or
    /// receives) as JSON lines.
    Tap(cmd::tap::TapArgs),
    /// A live view of every pipeline and operator of a running `weir run`: rates,
    /// backpressure, lag, checkpoints, restarts, reloads.
    Top(cmd::top::TopArgs),
    /// A language server over standard input and output for pipeline files and test files
    /// (`*.test.yaml`): diagnostics as `validate` gives them, hover, completion, definition.
    Lsp(cmd::lsp::LspArgs),
    /// Run test files (`*.test.yaml`): inputs, steps (checkpoint, crash, savepoint, restore,
    /// reload) and expected outputs of a pipeline.
    Test(cmd::test::TestArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Rust ignores SIGPIPE, so printing to a reader that went away (`weir schema | head -1`)
    // panics. A command that only prints gets the Unix default instead: it ends quietly.
    // `weir run` keeps ignoring it: a closed stdout is a sink error there, reported as such,
    // and the rest of the job must not die with it.
    if !matches!(cli.command, Command::Run(_)) {
        sigpipe::reset();
    }
    match cli.command {
        Command::Validate(args) => cmd::validate::run(&args),
        Command::Schema(args) => cmd::schema::run(&args),
        Command::Graph(args) => cmd::graph::run(&args),
        Command::Run(args) => cmd::run::run(&args),
        Command::Status(args) => cmd::status::run(&args),
        Command::Checkpoints(args) => cmd::checkpoints::run(&args),
        Command::Inspect(args) => cmd::inspect::run(&args),
        Command::Savepoint(args) => cmd::savepoint::run(&args),
        Command::Stop(args) => cmd::stop::run(&args),
        Command::Reload(args) => cmd::reload::run(&args),
        Command::Tap(args) => cmd::tap::run(&args),
        Command::Top(args) => cmd::top::run(&args),
        Command::Lsp(args) => cmd::lsp::run(&args),
        Command::Test(args) => cmd::test::run(&args),
    }
}
