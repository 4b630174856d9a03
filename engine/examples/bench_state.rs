//! Times the canonical snapshot of the memory backend: fill K keys (`{n, c}` maps, as the
//! reload benchmark's reduce holds), snapshot them, restore into a fresh backend, drop it.
//! Prints the median of RUNS rounds per step; for profiling the savepoint path without a job.
//!
//!     cargo run --release -p weir-engine --example bench_state -- [K=500000] [RUNS=5] [snapshot]
//!
//! With `snapshot`, only the snapshot step runs (for a profile of it alone).

use std::time::Instant;

/// As the `weir` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use rhai::{Dynamic, Map};
use weir_engine::record::{Key, KeyGroupRange};
use weir_engine::state::{MemoryBackend, StateBackend};
use weir_schema::StateKind;

const MAX_PARALLELISM: u32 = 128;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .take(2)
        .map(|a| a.parse().expect("numbers: K RUNS"))
        .collect();
    let keys = args.first().copied().unwrap_or(500_000);
    let runs = args.get(1).copied().unwrap_or(5).max(1);
    let only_snapshot = std::env::args().nth(3).as_deref() == Some("snapshot");
    let all = KeyGroupRange {
        start: 0,
        end: MAX_PARALLELISM,
    };
    let mut source = MemoryBackend::new(MAX_PARALLELISM, all);
    let id = source.register("acc", StateKind::Value).expect("register");
    for n in 0..keys as i64 {
        let mut m = Map::new();
        m.insert("n".into(), Dynamic::from_int(n));
        m.insert("c".into(), Dynamic::from_int(n % 17 + 1));
        source
            .put(
                id,
                &Key::from_dynamic(&Dynamic::from_int(n)),
                Dynamic::from_map(m),
            )
            .expect("put");
    }
    let (mut snap, mut restore, mut drop_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut size = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let bytes = source.snapshot(all).expect("snapshot");
        snap.push(t.elapsed().as_secs_f64() * 1e3);
        size = bytes.len();
        if only_snapshot {
            continue;
        }
        let t = Instant::now();
        let mut target = MemoryBackend::new(MAX_PARALLELISM, all);
        target.restore(&[&bytes]).expect("restore");
        restore.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        drop(target);
        drop_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    if only_snapshot {
        println!("{keys} keys, {size} bytes: snapshot {:.1} ms", median(snap));
        return;
    }
    println!(
        "{keys} keys, {size} bytes: snapshot {:.1} ms, restore {:.1} ms, drop {:.1} ms (medians of {runs})",
        median(snap),
        median(restore),
        median(drop_ms)
    );
}
