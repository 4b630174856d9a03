//! A slow sink does not make memory grow: `weir run` writes a large stream through a `stdout`
//! sink into a pipe that the test drains slowly, so the sink blocks, the bounded channels
//! fill, and the sources wait. The process's peak RSS (VmHWM, from /proc) stays far below
//! what buffering the whole stream would need.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use common::binary::plain;
use common::memory::peak_rss_kib;

#[test]
fn slow_sink_backpressures_sources() {
    let dir = tempfile::tempdir().unwrap();
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
      - {{ id: out, type: stdout, input: gen }}
"#
        ),
    )
    .unwrap();
    let mut child = plain()
        .args(["run", "--no-progress", "--no-api"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 128 * 1024];
    let mut lines = 0usize;
    let mut peak = 0;
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count();
        if let Some(kib) = peak_rss_kib(pid) {
            peak = peak.max(kib);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "weir run: {status}");
    assert_eq!(lines, 1_000_000);
    assert!(peak > 0, "the peak RSS was read while the run wrote");
    // The stream is ~320 MB of JSON (more as records in memory); in flight are only the
    // channel capacities.
    assert!(peak < 200 * 1024, "peak RSS {peak} KiB");
}
