//! A slow sink does not make memory grow: the file sink writes into a FIFO that a reader
//! drains slowly, so the sink blocks, the bounded channels fill, and the sources wait. Peak
//! RSS (from /proc) stays far below what buffering the whole stream would need.
#![allow(clippy::unwrap_used, missing_docs)]

use std::io::Read;
use std::time::Duration;

use weir_engine::job::{self, JobOptions};

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn slow_sink_backpressures_sources() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let fifo = out.join("part-0-0.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let path = dir.path().join("pipeline.yaml");
    let prefix = "p".repeat(300);
    std::fs::write(
        &path,
        format!(
            r#"
version: 1
pipelines:
  - id: slow
    parallelism: 2
    sources:
      - id: gen
        type: generator
        count: 1000000
        fields:
          id: {{ kind: sequence }}
          pad: {{ kind: key, prefix: "{prefix}", cardinality: 1000000 }}
    sinks:
      - {{ id: out, type: file, input: gen, path: out, parallelism: 1 }}
"#
        ),
    )
    .unwrap();
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::open(&fifo).unwrap();
        let mut buf = vec![0u8; 128 * 1024];
        let mut lines = 0usize;
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            lines += buf[..n].iter().filter(|&&b| b == b'\n').count();
            std::thread::sleep(Duration::from_millis(2));
        }
        lines
    });
    let plan = weir_engine::validate::validate_file(&path)
        .plan()
        .unwrap()
        .unwrap();
    let summary = job::run(plan, JobOptions::default()).unwrap();
    assert!(summary.is_ok(), "{:?}", summary.pipelines[0].error);
    assert_eq!(reader.join().unwrap(), 1_000_000);
    // The stream is ~320 MB of JSON (more as records in memory); in flight are only the
    // channel capacities.
    let peak = peak_rss_kib().unwrap();
    assert!(peak < 200 * 1024, "peak RSS {peak} KiB");
}
