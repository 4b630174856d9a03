//! Scenario tests of the runtime: every operator and partitioning on known data against a
//! plain sequential reference, at parallelism 1 and 4, plus error policies and sandbox
//! breaches.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::in_process::assert_ok;

use serde_json::{Value, json};
use weir_engine::job::{self, JobOptions, JobSummary};

/// Writes `yaml` to `dir/pipeline.yaml`, validates, plans and runs it.
fn run_yaml(dir: &Path, yaml: &str) -> JobSummary {
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).unwrap();
    let v = weir_engine::validate::validate_file(&path);
    let msgs: Vec<String> = v
        .diagnostics
        .iter()
        .map(|d| format!("{}: {}", d.code, d.message))
        .collect();
    let plan = v
        .plan()
        .unwrap_or_else(|| panic!("invalid pipeline: {msgs:#?}"))
        .unwrap();
    job::run(
        plan,
        JobOptions {
            worker_threads: Some(2),
            ..JobOptions::default()
        },
    )
    .unwrap()
}

/// Every record of every part file in `dir`, sorted by their JSON text.
fn read_output(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        out.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str::<Value>(l).unwrap()),
        );
    }
    sorted(out)
}

fn sorted(mut v: Vec<Value>) -> Vec<Value> {
    v.sort_by_key(|x| x.to_string());
    v
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

/// Deterministic order records `{id, user, amount, tag}`.
fn orders(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let z = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            let tag = ["a", "b", "c"][i % 3];
            json!({"id": i, "user": format!("u{}", z % 37), "amount": (z % 100) as i64 + 1, "tag": tag})
        })
        .collect()
}

fn write_orders(dir: &Path, n: usize) -> Vec<Value> {
    let recs = orders(n);
    write_lines(
        &dir.join("orders.jsonl"),
        &recs.iter().map(Value::to_string).collect::<Vec<_>>(),
    );
    recs
}

#[test]
fn map_filter_flat_map_match_a_sequential_reference() {
    for p in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let recs = write_orders(dir.path(), 3000);
        let yaml = format!(
            r#"
version: 1
pipelines:
  - id: mff
    parallelism: {p}
    sources:
      - {{ id: in, type: file, path: orders.jsonl }}
    operators:
      - id: double
        type: map
        input: in
        script: |
          fn map(r) {{ r.amount = r.amount * 2; r }}
      - id: big
        type: filter
        input: double
        script: |
          fn filter(r) {{ r.amount > 100 }}
      - id: split
        type: flat_map
        input: big
        script: |
          fn flat_map(r) {{ if r.tag == "a" {{ [] }} else {{ [#{{id: r.id, part: 1}}, #{{id: r.id, part: 2}}] }} }}
    sinks:
      - {{ id: out, type: file, input: split, path: out }}
"#
        );
        assert_ok(&run_yaml(dir.path(), &yaml), "pipeline");
        let mut expected = Vec::new();
        for r in &recs {
            let amount = r["amount"].as_i64().unwrap() * 2;
            if amount > 100 && r["tag"] != "a" {
                expected.push(json!({"id": r["id"], "part": 1}));
                expected.push(json!({"id": r["id"], "part": 2}));
            }
        }
        assert_eq!(
            read_output(&dir.path().join("out")),
            sorted(expected),
            "parallelism {p}"
        );
    }
}

#[test]
fn word_count_is_the_same_at_parallelism_1_and_4() {
    let mut results = Vec::new();
    for p in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let words = ["stream", "weir", "flink", "state", "key", "barrier"];
        let lines: Vec<String> = (0..2000)
            .map(|i| {
                (0..(i % 7 + 1))
                    .map(|j| words[(i * 3 + j * 5) % 6])
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        write_lines(&dir.path().join("text.txt"), &lines);
        let yaml = format!(
            r#"
version: 1
pipelines:
  - id: wc
    parallelism: {p}
    sources:
      - {{ id: lines, type: file, path: text.txt, format: lines }}
    operators:
      - id: words
        type: flat_map
        input: lines
        script: |
          fn flat_map(r) {{ let out = []; for w in r.line.split(" ") {{ if w != "" {{ out.push(#{{word: w}}); }} }} out }}
      - {{ id: by_word, type: key_by, input: words, field: word }}
      - id: counts
        type: aggregate
        input: by_word
        emit: final
        key_field: word
        aggregations:
          - {{ fn: count, as: n }}
    sinks:
      - {{ id: out, type: file, input: counts, path: out }}
"#
        );
        assert_ok(&run_yaml(dir.path(), &yaml), "pipeline");
        let mut reference: BTreeMap<&str, i64> = BTreeMap::new();
        for l in &lines {
            for w in l.split(' ') {
                *reference.entry(w).or_default() += 1;
            }
        }
        let expected: Vec<Value> = reference
            .iter()
            .map(|(w, n)| json!({"word": w, "n": n}))
            .collect();
        let got = read_output(&dir.path().join("out"));
        assert_eq!(got, sorted(expected), "parallelism {p}");
        results.push(got);
    }
    assert_eq!(results[0], results[1]);
}

#[test]
fn builtin_aggregations_and_rhai_reduce_match_reference() {
    for p in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let recs = write_orders(dir.path(), 5000);
        let yaml = format!(
            r#"
version: 1
pipelines:
  - id: agg
    parallelism: {p}
    sources:
      - {{ id: in, type: file, path: orders.jsonl }}
    operators:
      - {{ id: by_user, type: key_by, input: in, field: user }}
      - id: stats
        type: aggregate
        input: by_user
        emit: final
        key_field: user
        aggregations:
          - {{ fn: sum, field: amount, as: total }}
          - {{ fn: count }}
          - {{ fn: min, field: amount, as: lo }}
          - {{ fn: max, field: amount, as: hi }}
          - {{ fn: avg, field: amount, as: mean }}
      - {{ id: by_user2, type: key_by, input: in, field: user }}
      - id: red
        type: reduce
        input: by_user2
        emit: final
        script: |
          fn reduce(acc, r) {{ acc.amount += r.amount; acc.id = 0; acc }}
    sinks:
      - {{ id: out, type: file, input: stats, path: out }}
      - {{ id: out2, type: file, input: red, path: out2 }}
"#
        );
        assert_ok(&run_yaml(dir.path(), &yaml), "pipeline");
        let mut per: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let mut first: BTreeMap<String, Value> = BTreeMap::new();
        for r in &recs {
            let u = r["user"].as_str().unwrap().to_owned();
            per.entry(u.clone())
                .or_default()
                .push(r["amount"].as_i64().unwrap());
            first.entry(u).or_insert_with(|| r.clone());
        }
        let expected: Vec<Value> = per
            .iter()
            .map(|(u, a)| {
                let total: i64 = a.iter().sum();
                json!({"user": u, "total": total, "count": a.len(), "lo": a.iter().min(), "hi": a.iter().max(),
                       "mean": total as f64 / a.len() as f64})
            })
            .collect();
        let got = read_output(&dir.path().join("out"));
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(sorted(expected).iter()) {
            for f in ["user", "total", "count", "lo", "hi"] {
                assert_eq!(g[f], e[f], "field {f}");
            }
            assert!((g["mean"].as_f64().unwrap() - e["mean"].as_f64().unwrap()).abs() < 1e-9);
        }
        // reduce: the first record is the accumulator; later ones add amount and zero id.
        let expected2: Vec<Value> = per
            .iter()
            .map(|(u, a)| {
                let mut acc = first[u].clone();
                acc["amount"] = json!(a.iter().sum::<i64>());
                if a.len() > 1 {
                    acc["id"] = json!(0);
                }
                acc["key"] = json!(u);
                acc
            })
            .collect();
        assert_eq!(
            read_output(&dir.path().join("out2")),
            sorted(expected2),
            "parallelism {p}"
        );
    }
}

#[test]
fn a_processing_time_window_emits_its_open_windows_at_the_end_of_input() {
    for p in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let recs = write_orders(dir.path(), 3000);
        // One window as long as a thousand days: the whole run falls into it.
        let yaml = format!(
            r#"
version: 1
pipelines:
  - id: win
    parallelism: {p}
    sources:
      - {{ id: in, type: file, path: orders.jsonl }}
    operators:
      - {{ id: by_user, type: key_by, input: in, field: user }}
      - id: per_user
        type: window
        input: by_user
        time: processing
        window: {{ tumbling: {{ size: 1000days }} }}
        key_field: user
        aggregations: [{{ fn: sum, field: amount, as: total }}, {{ fn: count }}]
    sinks:
      - {{ id: out, type: file, input: per_user, path: out }}
"#
        );
        assert_ok(&run_yaml(dir.path(), &yaml), "pipeline");
        let mut per: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for r in &recs {
            let e = per
                .entry(r["user"].as_str().unwrap().to_owned())
                .or_default();
            e.0 += r["amount"].as_i64().unwrap();
            e.1 += 1;
        }
        let got = read_output(&dir.path().join("out"));
        assert_eq!(got.len(), per.len(), "one window per user, parallelism {p}");
        let size = 1000 * 86_400_000_i64;
        for g in &got {
            let (total, count) = per[g["user"].as_str().unwrap()];
            assert_eq!(
                (g["total"].as_i64(), g["count"].as_i64()),
                (Some(total), Some(count))
            );
            let start = g["window_start"].as_i64().unwrap();
            assert_eq!(g["window_end"].as_i64(), Some(start + size));
            assert_eq!(start % size, 0, "aligned to the epoch");
        }
    }
}

#[test]
fn emit_updates_ends_with_the_final_value_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let recs = write_orders(dir.path(), 2000);
    let yaml = r#"
version: 1
pipelines:
  - id: upd
    parallelism: 2
    sources:
      - { id: in, type: file, path: orders.jsonl }
    operators:
      - { id: by_user, type: key_by, input: in, field: user }
      - id: running
        type: aggregate
        input: by_user
        aggregations:
          - { fn: count }
    sinks:
      - { id: out, type: file, input: running, path: out, parallelism: 2 }
"#;
    assert_ok(&run_yaml(dir.path(), yaml), "pipeline");
    let got = read_output(&dir.path().join("out"));
    assert_eq!(got.len(), recs.len(), "one update per record");
    let mut max: BTreeMap<String, i64> = BTreeMap::new();
    for g in &got {
        let e = max
            .entry(g["key"].as_str().unwrap().to_owned())
            .or_default();
        *e = (*e).max(g["count"].as_i64().unwrap());
    }
    let mut reference: BTreeMap<String, i64> = BTreeMap::new();
    for r in &recs {
        *reference
            .entry(r["user"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(max, reference);
}

#[test]
fn process_with_value_list_and_map_state() {
    for p in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let recs = write_orders(dir.path(), 3000);
        let yaml = format!(
            r#"
version: 1
pipelines:
  - id: proc
    parallelism: {p}
    sources:
      - {{ id: in, type: file, path: orders.jsonl }}
    operators:
      - {{ id: by_user, type: key_by, input: in, field: user }}
      - id: track
        type: process
        input: by_user
        state: {{ count: value, ids: list, tags: map }}
        script: |
          fn process(r) {{
            let n = state_get("count");
            if n == () {{ n = 0; }}
            state_set("count", n + 1);
            list_push("ids", r.id);
            let t = map_get("tags", r.tag);
            map_put("tags", r.tag, if t == () {{ 1 }} else {{ t + 1 }});
            if r.amount == 100 {{ emit(#{{alert: key(), id: r.id}}); }}
          }}
          fn on_end(k) {{
            emit(#{{user: k, count: state_get("count"), first: list_get("ids")[0], a: map_get("tags", "a") ?? 0}});
          }}
    sinks:
      - {{ id: out, type: file, input: track, path: out }}
"#
        );
        assert_ok(&run_yaml(dir.path(), &yaml), "pipeline");
        let mut expected = Vec::new();
        let mut per: BTreeMap<String, (i64, i64, i64)> = BTreeMap::new();
        for r in &recs {
            let u = r["user"].as_str().unwrap().to_owned();
            let e = per
                .entry(u.clone())
                .or_insert((0, r["id"].as_i64().unwrap(), 0));
            e.0 += 1;
            if r["tag"] == "a" {
                e.2 += 1;
            }
            if r["amount"] == 100 {
                expected.push(json!({"alert": u, "id": r["id"]}));
            }
        }
        for (u, (n, first, a)) in per {
            expected.push(json!({"user": u, "count": n, "first": first, "a": a}));
        }
        assert_eq!(
            read_output(&dir.path().join("out")),
            sorted(expected),
            "parallelism {p}"
        );
    }
}

#[test]
fn union_rebalance_and_broadcast() {
    let dir = tempfile::tempdir().unwrap();
    let recs = write_orders(dir.path(), 1500);
    let yaml = r#"
version: 1
pipelines:
  - id: parts
    parallelism: 1
    sources:
      - { id: a, type: file, path: orders.jsonl }
      - { id: b, type: generator, seed: 3, count: 500, fields: { id: { kind: sequence, start: 100000 } } }
    operators:
      - { id: both, type: union, inputs: [a, b] }
      - id: spread
        type: map
        input: both
        parallelism: 3
        partitioning: rebalance
        script: |
          fn map(r) { #{id: r.id} }
      - id: everywhere
        type: filter
        input: b
        parallelism: 2
        partitioning: broadcast
        script: |
          fn filter(r) { true }
    sinks:
      - { id: out, type: file, input: spread, path: out, parallelism: 3 }
      - { id: out_b, type: file, input: everywhere, path: out_b, parallelism: 2 }
"#;
    assert_ok(&run_yaml(dir.path(), yaml), "pipeline");
    let mut expected: Vec<Value> = recs.iter().map(|r| json!({"id": r["id"]})).collect();
    expected.extend((0..500).map(|i| json!({"id": 100_000 + i})));
    assert_eq!(read_output(&dir.path().join("out")), sorted(expected));
    let b = read_output(&dir.path().join("out_b"));
    assert_eq!(b.len(), 1000, "broadcast to 2 subtasks doubles the records");
}

#[test]
fn on_error_skip_and_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    write_orders(dir.path(), 300);
    let yaml = r#"
version: 1
pipelines:
  - id: errs
    sources:
      - { id: in, type: file, path: orders.jsonl }
    operators:
      - id: picky
        type: map
        input: in
        on_error: skip
        script: |
          fn map(r) { if r.id % 10 == 0 { throw "tens are bad"; } r }
      - id: dl
        type: map
        input: picky
        on_error: { dead_letter: dead }
        script: |
          fn map(r) {
            let id = r.id;
            r.id = -1;
            r.touched = true;
            if id % 7 == 0 { throw "sevens are worse"; }
            r.id = id;
            r.remove("touched");
            r
          }
    sinks:
      - { id: out, type: file, input: dl, path: out }
      - { id: dead, type: file, path: dead }
"#;
    let s = run_yaml(dir.path(), yaml);
    assert_ok(&s, "pipeline");
    let out = read_output(&dir.path().join("out"));
    assert_eq!(
        out.len(),
        (0..300).filter(|i| i % 10 != 0 && i % 7 != 0).count()
    );
    let dead = read_output(&dir.path().join("dead"));
    assert_eq!(
        dead.len(),
        (0..300).filter(|i| i % 10 != 0 && i % 7 == 0).count()
    );
    assert!(
        dead[0]["error"]
            .as_str()
            .unwrap()
            .contains("sevens are worse")
    );
    assert_eq!(dead[0]["operator"], "dl");
    // A dead letter carries the record as the operator received it, whatever the script did to
    // it before failing.
    for d in &dead {
        assert!(d["record"]["id"].as_i64().unwrap() % 7 == 0, "{d}");
        assert!(d["record"].get("touched").is_none(), "{d}");
    }
    assert!(out.iter().all(|r| r.get("touched").is_none()));
    let picky = s.pipelines[0]
        .nodes
        .iter()
        .find(|n| n.id == "picky")
        .unwrap();
    assert_eq!(picky.errors, 30);
}

fn failing(yaml_script: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    write_orders(dir.path(), 50);
    let yaml = format!(
        r#"
version: 1
pipelines:
  - id: sandbox
    limits: {{ max_operations: 100000, max_string_size: 64KiB }}
    sources:
      - {{ id: in, type: file, path: orders.jsonl }}
    operators:
      - id: bad
        type: map
        input: in
        script: |
{yaml_script}
    sinks:
      - {{ id: out, type: file, input: bad, path: out }}
"#
    );
    let s = run_yaml(dir.path(), &yaml);
    s.pipelines[0]
        .error
        .as_ref()
        .expect("the pipeline must fail")
        .to_string()
}

#[test]
fn rhai_infinite_loop_is_stopped_with_a_diagnostic() {
    let e = failing("          fn map(r) { let x = 0; loop { x += 1; } r }");
    assert!(e.contains("Too many operations"), "{e}");
    assert!(
        e.contains("`sandbox`") && e.contains("`bad`") && e.contains("subtask 0"),
        "{e}"
    );
    assert!(e.contains("\"user\""), "record excerpt expected: {e}");
}

#[test]
fn rhai_memory_bomb_is_stopped_with_a_diagnostic() {
    let e = failing("          fn map(r) { let s = \"xxxxxxxx\"; loop { s += s; } r }");
    assert!(e.to_lowercase().contains("too large"), "{e}");
    assert!(e.contains("`bad`"), "{e}");
}

#[test]
fn malformed_input_fails_with_file_and_line_or_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("in.jsonl"),
        "{\"a\":1}\n{\"a\":2}\nnot json\n{\"a\":4}\n",
    )
    .unwrap();
    let yaml = |on_error: &str| {
        format!(
            r#"
version: 1
pipelines:
  - id: parse
    sources:
      - {{ id: in, type: file, path: in.jsonl, on_error: {on_error} }}
    sinks:
      - {{ id: out, type: file, input: in, path: out }}
"#
        )
    };
    let s = run_yaml(dir.path(), &yaml("fail"));
    let e = s.pipelines[0].error.as_ref().unwrap().to_string();
    assert!(e.contains("in.jsonl:3"), "{e}");
    let s = run_yaml(dir.path(), &yaml("skip"));
    assert_ok(&s, "pipeline");
    assert_eq!(read_output(&dir.path().join("out")).len(), 3);
    assert_eq!(s.pipelines[0].nodes[0].errors, 1);
}

#[test]
fn csv_in_csv_out_and_glob_sources() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    std::fs::write(dir.path().join("in/a.csv"), "name,qty\nbolt,3\nnut,5\n").unwrap();
    std::fs::write(dir.path().join("in/b.csv"), "name,qty\n\"screw, wood\",7\n").unwrap();
    let yaml = r#"
version: 1
pipelines:
  - id: csv
    parallelism: 2
    sources:
      - { id: in, type: file, path: "in/*.csv", format: csv }
    operators:
      - { id: all, type: key_by, input: in, field: name }
      - id: total
        type: aggregate
        input: all
        emit: final
        key_field: name
        aggregations: [{ fn: sum, field: qty, as: qty }]
    sinks:
      - { id: out, type: file, input: total, path: out, format: csv, parallelism: 1 }
"#;
    assert_ok(&run_yaml(dir.path(), yaml), "pipeline");
    let mut lines: Vec<String> = Vec::new();
    for e in std::fs::read_dir(dir.path().join("out")).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        lines.extend(text.lines().map(str::to_owned));
    }
    assert_eq!(lines[0], "name,qty");
    let mut rows = lines[1..].to_vec();
    rows.sort();
    assert_eq!(rows, ["\"screw, wood\",7", "bolt,3", "nut,5"]);
}

#[test]
fn generator_output_is_the_same_at_any_parallelism() {
    let mut outs = Vec::new();
    for p in [1, 4] {
        let dir = tempfile::tempdir().unwrap();
        let yaml = format!(
            r#"
version: 1
pipelines:
  - id: gen
    parallelism: {p}
    sources:
      - id: g
        type: generator
        seed: 11
        count: 5000
        fields:
          id: {{ kind: sequence }}
          user: {{ kind: key, prefix: u, cardinality: 50 }}
          amount: {{ kind: int, min: 1, max: 9 }}
    sinks:
      - {{ id: out, type: file, input: g, path: out }}
"#
        );
        assert_ok(&run_yaml(dir.path(), &yaml), "pipeline");
        outs.push(read_output(&dir.path().join("out")));
    }
    assert_eq!(outs[0].len(), 5000);
    assert_eq!(outs[0], outs[1]);
}
