//! `weir inspect PATH [--dump OPERATOR [--state NAME]] [--format text|json]`: what a checkpoint
//! or savepoint directory holds, read without running its pipeline (the engine's `inspect`
//! module does the reading): per operator its states, entries and bytes per state and key
//! group, its files, and its subtasks' local state (a source's positions); or, with `--dump`,
//! one operator's keyed state as JSON lines on standard output. Damaged or missing files are
//! named on standard error and make the exit code 1.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use weir_engine::inspect::{self, InspectError, Inspection};

use super::api_args;

/// How `weir inspect` prints what it found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Readable text.
    #[default]
    Text,
    /// One JSON document (every figure, per key group too).
    Json,
}

/// Arguments of `weir inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A savepoint directory (`weir savepoint` prints it) or a checkpoint directory
    /// (`<storage>/<pipeline>/chk-<n>`).
    pub path: PathBuf,
    /// Write this operator's keyed state as JSON lines (`{"key", "state", "key_group",
    /// "value"}`) on standard output instead of the summary.
    #[arg(long, value_name = "OPERATOR")]
    pub dump: Option<String>,
    /// With --dump: only this keyed state.
    #[arg(long, value_name = "NAME", requires = "dump")]
    pub state: Option<String>,
    /// Output format of the summary.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// Runs `weir inspect`.
pub fn run(args: &InspectArgs) -> ExitCode {
    let snapshot = match inspect::open(&args.path) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if let Some(operator) = &args.dump {
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let result = snapshot.dump(operator, args.state.as_deref(), &mut out);
        let flushed = out.flush();
        return match (result, flushed) {
            (Ok(n), Ok(())) => {
                eprintln!("{n} entries of operator `{operator}`");
                ExitCode::SUCCESS
            }
            (Err(e), _) => fail(&e),
            (Ok(_), Err(e)) => fail(&InspectError::Write(e.to_string())),
        };
    }
    let report = snapshot.inspect();
    match args.format {
        Format::Json => match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("error: cannot print the inspection as JSON: {e}");
                return ExitCode::FAILURE;
            }
        },
        Format::Text => print!("{}", render(&report)),
    }
    if report.problems.is_empty() {
        return ExitCode::SUCCESS;
    }
    for p in &report.problems {
        eprintln!("error: `{}`: {}", p.file.display(), p.reason);
    }
    eprintln!(
        "{} damaged or missing file(s): their state is left out above",
        report.problems.len()
    );
    if !args.path.exists() {
        // The usual cause of files vanishing mid-read: retention of a running pipeline.
        eprintln!(
            "help: `{}` was deleted while it was read: a running pipeline keeps only its \
             latest checkpoints (`checkpoints.retain`); inspect a savepoint (`weir savepoint`) \
             or a newer checkpoint",
            args.path.display()
        );
    }
    ExitCode::FAILURE
}

/// Reports `e` and returns exit code 1.
fn fail(e: &InspectError) -> ExitCode {
    let (code, help) = match e {
        InspectError::NotASnapshot { .. } => (
            "weir::inspect::not_a_snapshot",
            "give a savepoint directory (`weir savepoint` prints it) or a checkpoint directory \
             `<storage>/<pipeline>/chk-<n>`",
        ),
        InspectError::Damaged { .. } => (
            "weir::inspect::damaged",
            "the file is missing or does not match what the metadata records; another \
             checkpoint or savepoint of the pipeline may be intact",
        ),
        InspectError::NoSuchOperator { .. } | InspectError::NoSuchState { .. } => (
            "weir::inspect::no_such_state",
            "`weir inspect PATH` lists the operators and their states",
        ),
        InspectError::Write(_) => ("weir::inspect::write", "check where standard output goes"),
    };
    api_args::fail_with(code, e.to_string(), help.to_owned())
}

/// The inspection as text.
pub fn render(r: &Inspection) -> String {
    let mut out = format!(
        "{} {} of pipeline `{}`{}: {} file(s), {}; {} key groups\n",
        r.kind,
        r.checkpoint,
        r.pipeline,
        r.backend
            .as_ref()
            .map(|b| format!(" ({b} state)"))
            .unwrap_or_default(),
        r.files,
        api_args::bytes(r.file_bytes),
        r.max_parallelism,
    );
    out.push_str(&format!("path: {}\n", r.path.display()));
    for op in &r.operators {
        let what = match (&op.type_name, &op.section) {
            (Some(t), Some(s)) => format!("{s} `{}` ({t})", op.id),
            _ => format!("`{}`", op.id),
        };
        out.push_str(&format!(
            "\n{what}: parallelism {}, {} on disk",
            op.parallelism,
            api_args::bytes(op.file_bytes)
        ));
        if op.states.is_empty() {
            out.push_str(", no keyed state\n");
        } else {
            out.push_str(&format!(
                ", {} keyed entries ({})\n",
                op.entries,
                api_args::bytes(op.bytes)
            ));
        }
        for s in &op.states {
            out.push_str(&format!(
                "  state {} ({}): {} keys, {}\n",
                s.name,
                s.kind,
                s.keys,
                api_args::bytes(s.bytes)
            ));
        }
        if let Some(declared) = &op.declared_states {
            for (name, kind) in declared {
                if !op.states.iter().any(|s| &s.name == name) {
                    out.push_str(&format!("  state {name} ({kind}): declared, empty\n"));
                }
            }
        }
        if !op.key_groups.is_empty() {
            let groups: Vec<String> = op
                .key_groups
                .iter()
                .map(|g| format!("{}:{}", g.key_group, g.entries))
                .collect();
            out.push_str(&format!(
                "  key groups with entries ({} of {}; group:entries): {}\n",
                op.key_groups.len(),
                r.max_parallelism,
                groups.join(" ")
            ));
        }
        for st in &op.subtasks {
            out.push_str(&format!(
                "  subtask {}: key groups {}..{}, {} file(s)",
                st.subtask,
                st.key_groups.0,
                st.key_groups.1,
                st.files.len()
            ));
            match &st.local {
                Some(local) => out.push_str(&format!(", local state {local}\n")),
                None => out.push('\n'),
            }
        }
    }
    out
}
