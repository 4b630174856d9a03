//! Writes the W1/W2 benchmark input with the same bytes as `shared/bench/gen.py`, and the
//! expected per-user totals next to it.
//!
//!     cargo run --release -p weir-engine --example bench_gen -- N OUT.jsonl [SEED] [USERS]
//!
//! USERS (default 10 000, the shared workload) changes the number of distinct users drawn
//! from; only the default gives gen.py's bytes.

use std::io::{BufWriter, Write};
use std::process::ExitCode;

const DEFAULT_USERS: u64 = 10_000;
const T0: u64 = 1_700_000_000_000;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !(2..=4).contains(&args.len()) {
        eprintln!("usage: bench_gen N OUT.jsonl [SEED] [USERS]");
        return ExitCode::FAILURE;
    }
    let (Ok(n), out) = (args[0].parse::<u64>(), &args[1]) else {
        eprintln!("N must be a number");
        return ExitCode::FAILURE;
    };
    let seed = args
        .get(2)
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(42);
    let users = match args.get(3).map(|s| s.parse::<u64>()) {
        None => DEFAULT_USERS,
        Some(Ok(u)) if u > 0 => u,
        Some(_) => {
            eprintln!("USERS must be a positive number");
            return ExitCode::FAILURE;
        }
    };
    match generate(n, out, seed, users) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn generate(n: u64, out: &str, seed: u64, users: u64) -> std::io::Result<()> {
    let mut sums = vec![0u64; users as usize];
    let mut counts = vec![0u64; users as usize];
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(out)?);
    let mut s = seed;
    for i in 0..n {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = weir_engine::connectors::generator::splitmix64(s);
        let k = (z & 0xFFFF_FFFF) % users;
        let amount = 1 + (z >> 32) % 100;
        sums[k as usize] += amount;
        counts[k as usize] += 1;
        writeln!(
            w,
            "{{\"user\":\"u{k}\",\"amount\":{amount},\"ts\":{}}}",
            T0 + i
        )?;
    }
    w.flush()?;
    let base = out.strip_suffix(".jsonl").unwrap_or(out);
    let mut expected: Vec<(String, u64, u64)> = (0..users)
        .filter(|&k| counts[k as usize] > 0)
        .map(|k| (format!("u{k}"), sums[k as usize], counts[k as usize]))
        .collect();
    expected.sort();
    let mut e = BufWriter::new(std::fs::File::create(format!("{base}.expected.json"))?);
    write!(e, "{{")?;
    for (i, (u, sum, count)) in expected.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        write!(e, "{sep}\"{u}\": {{\"count\": {count}, \"sum\": {sum}}}")?;
    }
    writeln!(e, "}}")?;
    e.flush()
}
