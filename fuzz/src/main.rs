//! `weir-fuzz`: runs the fuzz targets (see the library docs; `scripts/fuzz.sh` drives it).
//!
//! ```text
//! weir-fuzz [--target NAME]... [--inputs N] [--seed S] [--skip I] [--timeout-secs T]
//!           [--max-rss-mib M] [--findings DIR] [--progress N] [--list]
//! weir-fuzz --target NAME --replay FILE
//! ```
//!
//! `--replay` feeds one saved input (a finding) to the target, on the same thread size.
//!
//! Prints one summary line per target; exits with 1 when anything was found (or the replayed
//! input panicked), 2 on bad arguments, 3 on a hang.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use weir_fuzz::{Config, Problem, Runner, Target, targets};

fn main() -> ExitCode {
    let mut config = Config {
        inputs: 10_000,
        progress_every: 0,
        ..Config::default()
    };
    let mut chosen: Vec<String> = Vec::new();
    let mut replay: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let parsed: Result<(), String> = (|| {
            match arg.as_str() {
                "--target" => chosen.push(value("--target")?),
                "--inputs" => config.inputs = number(&value("--inputs")?)?,
                "--seed" => config.seed = number(&value("--seed")?)?,
                "--skip" => config.skip = number(&value("--skip")?)?,
                "--timeout-secs" => {
                    config.timeout = Duration::from_secs(number(&value("--timeout-secs")?)?);
                }
                "--max-rss-mib" => {
                    config.max_rss = Some(number(&value("--max-rss-mib")?)? * 1024 * 1024);
                }
                "--findings" => config.findings = Some(PathBuf::from(value("--findings")?)),
                "--progress" => config.progress_every = number(&value("--progress")?)?,
                "--replay" => replay = Some(PathBuf::from(value("--replay")?)),
                "--list" => {
                    for t in targets() {
                        println!("{}", t.name());
                    }
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument `{other}`")),
            }
            Ok(())
        })();
        if let Err(e) = parsed {
            eprintln!("weir-fuzz: {e}");
            return ExitCode::from(2);
        }
    }
    if let Some(dir) = &config.findings
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!("weir-fuzz: cannot create {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let all: Vec<Arc<dyn Target>> = targets().into_iter().map(Arc::from).collect();
    let selected: Vec<Arc<dyn Target>> = all
        .into_iter()
        .filter(|t| chosen.is_empty() || chosen.iter().any(|c| c == t.name()))
        .collect();
    if selected.is_empty() {
        eprintln!("weir-fuzz: no such target (see --list)");
        return ExitCode::from(2);
    }
    if let Some(file) = replay {
        let input = match std::fs::read(&file) {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("weir-fuzz: cannot read {}: {e}", file.display());
                return ExitCode::from(2);
            }
        };
        let target = Arc::clone(&selected[0]);
        let ran = std::thread::Builder::new()
            .stack_size(config.stack)
            .spawn(move || target.run(&input))
            .map(|t| t.join().is_ok());
        let returned = matches!(ran, Ok(true));
        println!(
            "replayed {}: {}",
            file.display(),
            if returned { "returned" } else { "panicked" }
        );
        return if returned {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let mut found = false;
    for target in selected {
        let report = Runner::run(Arc::clone(&target), &config);
        println!(
            "{}: seed {} inputs {}..{}: ran {} in {:.1} s, {} findings, slowest input {} ms (#{}), \
             largest input {} bytes, highest per-input peak RSS {} MiB",
            target.name(),
            config.seed,
            config.skip,
            config.skip + config.inputs,
            report.inputs,
            report.elapsed.as_secs_f64(),
            report.findings.len(),
            report.slowest.as_millis(),
            report.slowest_index,
            report.largest_input,
            report.peak_rss / (1024 * 1024),
        );
        for f in &report.findings {
            found = true;
            let what = match &f.problem {
                Problem::Panic(m) => format!("panic: {m}"),
                Problem::Hang => format!("hang: more than {:?}", config.timeout),
                Problem::Memory(b) => format!("memory: peak RSS {} MiB", b / (1024 * 1024)),
            };
            println!("  input {} ({} bytes): {what}", f.index, f.input.len());
        }
        if report
            .findings
            .iter()
            .any(|f| matches!(f.problem, Problem::Hang))
        {
            // The hung input still runs on its thread; nothing more can be trusted.
            std::process::exit(3);
        }
    }
    if found {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn number(s: &str) -> Result<u64, String> {
    s.replace('_', "")
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))
}
