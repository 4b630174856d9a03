//! Measures how much stack the deepest script a pair of limits allows needs, through the real
//! runtime path (`CompiledScript`, `ScriptFn::invoke`): a function recursing `max_call_levels`
//! deep, each level inside the deepest nesting of `SHAPE` that `max_expr_depth` accepts. This
//! is how `SCRIPT_STACK_SIZE` and `SCRIPT_DEPTH_BUDGET` were chosen (README, "Script limits").
//!
//!     cargo run -p weir-engine --example script_stack -- CALLS DEPTH [SHAPE]
//!
//! SHAPE is what wraps each nesting level: `g(` (nested calls, the costliest measured; the
//! default), `-(`, `(1 + `, `[(`. The example runs each probe in a child process (a stack
//! overflow aborts the process) and bisects the smallest stack, in KiB, that survives.

use std::process::{Command, ExitCode};
use std::sync::Arc;

use rhai::Dynamic;
use weir_engine::script::runtime::{CompiledScript, ScriptFn, runtime_engine};
use weir_schema::ScriptLimitsSpec;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| args.get(i).and_then(|a| a.parse::<u32>().ok());
    let (Some(calls), Some(depth)) = (number(0), number(1)) else {
        eprintln!("usage: script_stack CALLS DEPTH [SHAPE]");
        return ExitCode::FAILURE;
    };
    let shape = args.get(2).cloned().unwrap_or_else(|| "g(".to_owned());
    if let Some(kib) = std::env::var("SCRIPT_STACK_PROBE_KIB")
        .ok()
        .and_then(|k| k.parse::<usize>().ok())
    {
        return probe(calls, depth, &shape, kib);
    }
    let Ok(me) = std::env::current_exe() else {
        eprintln!("cannot find this executable");
        return ExitCode::FAILURE;
    };
    let survives = |kib: usize| {
        Command::new(&me)
            .args([calls.to_string(), depth.to_string(), shape.clone()])
            .env("SCRIPT_STACK_PROBE_KIB", kib.to_string())
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let (mut lo, mut hi) = (64, 256 * 1024);
    if !survives(hi) {
        println!("calls {calls}, depth {depth}, shape {shape:?}: more than {hi} KiB");
        return ExitCode::FAILURE;
    }
    while hi - lo > lo / 50 {
        let mid = (lo + hi) / 2;
        if survives(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    println!("calls {calls}, depth {depth}, shape {shape:?}: needs about {hi} KiB of stack");
    ExitCode::SUCCESS
}

/// Compiles the deepest script and runs it on a thread with `kib` KiB of stack.
fn probe(calls: u32, depth: u32, shape: &str, kib: usize) -> ExitCode {
    let limits = ScriptLimitsSpec {
        max_call_levels: calls,
        max_expr_depth: depth,
        max_operations: 10_000_000_000,
        ..ScriptLimitsSpec::default()
    };
    let engine = Arc::new(runtime_engine(&limits));
    let close = if shape == "[(" { ")]" } else { ")" };
    let make = |n: usize| {
        format!(
            "fn g(x) {{ x }}\nfn f(n) {{ if n <= 0 {{ 0 }} else {{ 1 + {}f(n - 1){} }} }}\n\
             fn run(r) {{ f(r) }}",
            shape.repeat(n),
            close.repeat(n)
        )
    };
    let (mut lo, mut hi) = (0, depth as usize + 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if CompiledScript::compile(&engine, &make(mid)).is_ok() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let Ok(compiled) = CompiledScript::compile(&engine, &make(lo)) else {
        eprintln!("no script of this shape compiles under these limits");
        return ExitCode::FAILURE;
    };
    let compiled = Arc::new(compiled);
    let ran = std::thread::Builder::new()
        .stack_size(kib * 1024)
        .spawn(move || {
            // Deeper than the limit: the recursion stops at `max_call_levels` with an error.
            let mut f = ScriptFn::new(engine, compiled);
            f.invoke("run", &mut [Dynamic::from(i64::from(calls) + 5)])
                .is_err_and(|e| e.contains("max_call_levels"))
        })
        .map(|h| h.join().unwrap_or(false));
    if matches!(ran, Ok(true)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
