//! Two chained `flat_map`s turn 4 records into 8 M, each operator within every limit. The
//! chain hands the expansion downstream in batch-sized pieces, so peak RSS (from /proc) stays
//! far below the gigabytes that holding the 8 M records at once would take, and the output is
//! exact. (Alone in its test binary, so the peak is this run's.)
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::in_process::plan_of;
use common::memory::own_peak_rss_kib;
use weir_engine::job::{self, JobOptions};

#[test]
fn chained_flat_maps_expand_in_bounded_memory_with_exact_output() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(
        &path,
        r#"
version: 1
pipelines:
  - id: fanout
    sources:
      - id: gen
        type: generator
        count: 4
        fields:
          id: { kind: sequence }
    operators:
      - id: wide
        type: flat_map
        input: gen
        script: |
          fn flat_map(r) { let a = []; a.pad(2000, r); a }
      - id: wider
        type: flat_map
        input: wide
        script: |
          fn flat_map(r) { let a = []; a.pad(1000, r); a }
      - { id: by_id, type: key_by, input: wider, field: id }
      - id: count
        type: aggregate
        input: by_id
        emit: final
        aggregations: [{ fn: count }]
    sinks:
      - { id: out, type: file, input: count, path: out }
"#,
    )
    .unwrap();
    let summary = job::run(plan_of(&path), JobOptions::default()).unwrap();
    assert!(summary.is_ok(), "{:?}", summary.pipelines[0].error);
    let mut counts = Vec::new();
    for e in std::fs::read_dir(dir.path().join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            counts.push((v["key"].as_i64().unwrap(), v["count"].as_i64().unwrap()));
        }
    }
    counts.sort_unstable();
    assert_eq!(counts, (0..4).map(|id| (id, 2_000_000)).collect::<Vec<_>>());
    let peak = own_peak_rss_kib().unwrap();
    // 8 M records held at once take well over 1 GiB (a map per record); batch-sized pieces
    // keep the run near its baseline.
    assert!(peak < 256 * 1024, "peak RSS {peak} KiB");
}
