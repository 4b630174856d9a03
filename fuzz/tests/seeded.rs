//! The short seeded fuzz run CI keeps: a few thousand inputs of every target with a fixed
//! seed, which must produce no finding (no panic, no hang, no input whose peak memory runs
//! away). `scripts/fuzz.sh` runs the same targets for millions of inputs.

use std::sync::Arc;
use std::time::Duration;

use weir_fuzz::{Config, Runner, targets};

/// Inputs per target: a few seconds in a debug build for the pipeline files (each goes
/// through the whole validation), well under a second for the savepoint decoders.
fn inputs(target: &str) -> u64 {
    match target {
        "pipeline-file" => 500,
        _ => 4_000,
    }
}

#[test]
fn a_seeded_run_of_every_target_finds_nothing() {
    let base = Config {
        seed: 20_261_201,
        timeout: Duration::from_secs(60),
        // Far above what a handled input needs (tens of MiB), far below a runaway.
        max_rss: Some(1024 * 1024 * 1024),
        ..Config::default()
    };
    let mut report = Vec::new();
    for target in targets() {
        let name = target.name();
        let config = Config {
            inputs: inputs(name),
            ..base.clone()
        };
        let outcome = Runner::run(Arc::from(target), &config);
        assert_eq!(
            outcome.inputs, config.inputs,
            "{name}: the run stopped early"
        );
        for f in &outcome.findings {
            report.push(format!(
                "{name} input {} ({} bytes): {:?}\n{}",
                f.index,
                f.input.len(),
                f.problem,
                String::from_utf8_lossy(&f.input[..f.input.len().min(2000)])
            ));
        }
    }
    assert!(report.is_empty(), "findings:\n{}", report.join("\n\n"));
}
