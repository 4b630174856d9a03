//! A 5 M-record run (generator → key_by → aggregate → file sink) whose peak RSS, read from
//! /proc, stays under a generous bound: memory is bounded by the channels and the keyed state,
//! not by the input size.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::in_process::plan_of;
use common::memory::own_peak_rss_kib;
use weir_engine::job::{self, JobOptions};

#[test]
fn five_million_records_run_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(
        &path,
        r#"
version: 1
pipelines:
  - id: big
    parallelism: 2
    sources:
      - id: gen
        type: generator
        seed: 5
        count: 5000000
        fields:
          user: { kind: key, prefix: user-, cardinality: 1000 }
          amount: { kind: int, min: 1, max: 100 }
    operators:
      - { id: by_user, type: key_by, input: gen, field: user }
      - id: totals
        type: aggregate
        input: by_user
        emit: final
        aggregations: [{ fn: sum, field: amount, as: sum }, { fn: count }]
    sinks:
      - { id: out, type: file, input: totals, path: out }
"#,
    )
    .unwrap();
    let summary = job::run(plan_of(&path), JobOptions::default()).unwrap();
    assert!(summary.is_ok(), "{:?}", summary.pipelines[0].error);
    let mut total = 0;
    let mut keys = 0;
    for e in std::fs::read_dir(dir.path().join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            total += v["count"].as_i64().unwrap();
            keys += 1;
        }
    }
    assert_eq!(total, 5_000_000);
    assert_eq!(keys, 1000);
    let peak = own_peak_rss_kib().unwrap();
    // Buffering the input would take several GiB; bounded channels keep it near the baseline.
    assert!(peak < 512 * 1024, "peak RSS {peak} KiB");
}
