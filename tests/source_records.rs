//! Source records that cannot be read, and CSV records that span lines, through the `weir`
//! binary: `on_error: {dead_letter: ...}` on a source sends `{file, line, raw, error}` for a
//! malformed JSON line, a jsonl line that is not an object, text that is not UTF-8 and a CSV
//! row with the wrong field count, counts them as dead-lettered, and under exactly-once a
//! crash and restore neither loses nor repeats one; a CSV field may hold newlines, doubled
//! quotes and follow a byte-order mark, read whole (also when its end is written later), and
//! errors name the line the record starts on.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::files::append;
use common::output::committed;
use common::run::{Run, pipeline_of, run_to_end};
use serde_json::{Value, json};

/// The committed lines of sink directory `dir` as JSON, in file order.
fn records(dir: &Path) -> Vec<Value> {
    committed(dir)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A file source `in` over `path` with `format` and `on_error: {dead_letter: bad}`, into the
/// file sink `out`; `extra` goes into the pipeline (checkpoints, ...) and `source` into the
/// source's options.
fn write_pipeline(
    dir: &Path,
    path: &str,
    format: &str,
    source: &str,
    extra: &str,
) -> std::path::PathBuf {
    let yaml = format!(
        "version: 1\npipelines:\n  - id: p\n{extra}    sources:\n      - {{id: in, type: file, path: {path}, format: {format}, on_error: {{dead_letter: bad}}{source}}}\n    sinks:\n      - {{id: out, type: file, input: in, path: out}}\n      - {{id: bad, type: file, path: bad}}\n"
    );
    let file = dir.join("pipeline.yaml");
    std::fs::write(&file, yaml).unwrap();
    file
}

/// `(line, raw)` of every dead letter, sorted, after checking what each one carries.
fn letters(dir: &Path, file_name: &str) -> Vec<(i64, String)> {
    let mut out: Vec<(i64, String)> = records(&dir.join("bad"))
        .iter()
        .map(|d| {
            assert_eq!(d["source"], "in", "{d}");
            assert_eq!(d["pipeline"], "p", "{d}");
            assert!(
                d["file"].as_str().unwrap().ends_with(file_name),
                "the file: {d}"
            );
            assert!(!d["error"].as_str().unwrap().is_empty(), "{d}");
            (
                d["line"].as_i64().unwrap(),
                d["raw"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// The sum of `field` over the subtasks of element `id` in a pipeline's status.
fn counter(pipeline: &Value, id: &str, field: &str) -> u64 {
    pipeline["operators"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["id"] == id))
        .and_then(|o| o["subtasks"].as_array())
        .map_or(0, |subs| {
            subs.iter().filter_map(|s| s[field].as_u64()).sum()
        })
}

#[test]
fn jsonl_records_that_cannot_be_read_become_dead_letters_with_file_line_and_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = b"{\"a\":1}\n{oops\n[1,2]\n\n{\"a\":5}\n".to_vec();
    data.extend_from_slice(b"{\"a\":\"\xff\xfe\"}\n\"text\"\n{\"a\":8}");
    std::fs::write(dir.path().join("input.jsonl"), &data).unwrap();
    let yaml = write_pipeline(dir.path(), "input.jsonl", "jsonl", "", "");
    let (ok, log) = run_to_end(dir.path(), &yaml, &[]);
    assert!(ok, "{log}");
    assert_eq!(
        records(&dir.path().join("out")),
        [json!({"a": 1}), json!({"a": 5}), json!({"a": 8})]
    );
    assert_eq!(
        letters(dir.path(), "input.jsonl"),
        [
            (2, "{oops".to_owned()),
            (3, "[1,2]".to_owned()),
            (6, "{\"a\":\"\u{fffd}\u{fffd}\"}".to_owned()),
            (7, "\"text\"".to_owned()),
        ]
    );
    let summary = log
        .lines()
        .find(|l| l.split_whitespace().next() == Some("in"))
        .unwrap_or_else(|| panic!("a summary row for `in`:\n{log}"));
    assert_eq!(summary.split_whitespace().last(), Some("4"), "{summary}");
}

#[test]
fn a_skipped_record_is_counted_and_logged_by_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("input.jsonl"),
        "{\"a\":1}\n{oops\n{\"a\":3}\n",
    )
    .unwrap();
    let yaml = dir.path().join("pipeline.yaml");
    std::fs::write(
        &yaml,
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: in, type: file, path: input.jsonl, on_error: skip}\n    sinks:\n      - {id: out, type: file, input: in, path: out}\n",
    )
    .unwrap();
    let (ok, log) = run_to_end(dir.path(), &yaml, &[]);
    assert!(ok, "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("Skipped a record") && l.contains("input.jsonl:2")),
        "the log names input.jsonl:2:\n{log}"
    );
    assert_eq!(records(&dir.path().join("out")).len(), 2);
}

#[test]
fn csv_fields_hold_newlines_doubled_quotes_and_follow_a_byte_order_mark() {
    let dir = tempfile::tempdir().unwrap();
    let data = "\u{feff}id,note\r\n1,plain\r\n2,\"two\r\nlines\"\r\n\r\n3,\"say \"\"hi\"\", then, go\"\r\n4\r\n5,\"a\nb\nc\",extra\r\n6,last";
    std::fs::write(dir.path().join("input.csv"), data).unwrap();
    let yaml = write_pipeline(dir.path(), "input.csv", "csv", "", "");
    let (ok, log) = run_to_end(dir.path(), &yaml, &[]);
    assert!(ok, "{log}");
    assert_eq!(
        records(&dir.path().join("out")),
        [
            json!({"id": 1, "note": "plain"}),
            json!({"id": 2, "note": "two\r\nlines"}),
            json!({"id": 3, "note": "say \"hi\", then, go"}),
            json!({"id": 6, "note": "last"}),
        ]
    );
    // Row 4 is short; row 5 (lines 8 to 10) is long: each is reported at its first line.
    assert_eq!(
        letters(dir.path(), "input.csv"),
        [(7, "4".to_owned()), (8, "5,\"a\nb\nc\",extra".to_owned())]
    );
}

#[test]
fn a_csv_error_under_fail_names_the_line_the_record_starts_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("input.csv"),
        "id,note\n1,\"one\nmore\"\n2,\"x\ny\",3\n",
    )
    .unwrap();
    let yaml = dir.path().join("pipeline.yaml");
    std::fs::write(
        &yaml,
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: in, type: file, path: input.csv, format: csv}\n    sinks:\n      - {id: out, type: file, input: in, path: out}\n",
    )
    .unwrap();
    let (ok, log) = run_to_end(dir.path(), &yaml, &[]);
    assert!(!ok, "{log}");
    assert!(log.contains("input.csv:4"), "names input.csv:4:\n{log}");
}

#[test]
fn a_big_csv_file_read_in_parallel_keeps_every_multi_line_record_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = String::from("id,note\n");
    let mut want = Vec::new();
    for i in 0..100_000 {
        if i % 7 == 0 {
            data.push_str(&format!("{i},\"line one\n{i} line two\"\n"));
            want.push(json!({"id": i, "note": format!("line one\n{i} line two")}));
        } else {
            data.push_str(&format!("{i},note {i}\n"));
            want.push(json!({"id": i, "note": format!("note {i}")}));
        }
    }
    assert!(data.len() > 1 << 20, "big enough to be cut into ranges");
    std::fs::write(dir.path().join("input.csv"), data).unwrap();
    let yaml = write_pipeline(dir.path(), "input.csv", "csv", "", "    parallelism: 3\n");
    let (ok, log) = run_to_end(dir.path(), &yaml, &[]);
    assert!(ok, "{log}");
    let mut got = records(&dir.path().join("out"));
    got.sort_by_key(|r| r["id"].as_i64());
    assert!(got == want, "{} records of {}", got.len(), want.len());
    assert!(letters(dir.path(), "input.csv").is_empty());
}

/// Exactly-once across a crash: a followed CSV file whose last record is half written when the
/// run is killed; the restored run reads it whole once, and every dead letter is committed once.
#[test]
fn dead_letters_and_a_half_written_csv_record_survive_a_crash_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    let input = dir.path().join("in/data.csv");
    append(
        &input,
        "id,note\n1,plain\n2,\"two\nlines\"\n3\n4,\"say \"\"hi\"\"\"\n5,\"open\n",
    );
    let yaml = write_pipeline(
        dir.path(),
        "in/*.csv",
        "csv",
        ", follow: true",
        "    checkpoints: {enabled: true, mode: exactly_once, interval: 100ms, storage: ck}\n    restart: {strategy: none}\n",
    );
    let mut run = Run::start(dir.path(), &yaml, &[]);
    run.wait_for("the first records and a dead letter", |s| {
        let p = pipeline_of(s, "p");
        counter(&p, "in", "records_in") >= 3 && counter(&p, "in", "dead_lettered") >= 1
    });
    let p = run.pipeline("p");
    assert_eq!(counter(&p, "in", "errors"), 1, "{p:#}");
    assert_eq!(counter(&p, "in", "skipped"), 0, "{p:#}");
    run.wait_checkpoints(&["p"], 2);
    run.kill();

    append(&input, "still open\"\n6,x,y\n7,\"multi\nline \"\"q\"\"\"\n");
    let mut run = Run::start(dir.path(), &yaml, &[]);
    run.wait_for("the rest", |s| {
        let p = pipeline_of(s, "p");
        counter(&p, "in", "records_in") >= 2 && counter(&p, "in", "dead_lettered") >= 1
    });
    run.wait_checkpoints(&["p"], 1);
    let (status, log) = run.terminate_and_wait();
    assert!(status.success(), "{log}");

    let mut got: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for r in records(&dir.path().join("out")) {
        got.entry(r["id"].as_i64().unwrap())
            .or_default()
            .push(r["note"].as_str().unwrap().to_owned());
    }
    let want: BTreeMap<i64, Vec<String>> = [
        (1, "plain"),
        (2, "two\nlines"),
        (4, "say \"hi\""),
        (5, "open\nstill open"),
        (7, "multi\nline \"q\""),
    ]
    .into_iter()
    .map(|(i, n)| (i, vec![n.to_owned()]))
    .collect();
    assert_eq!(got, want);
    assert_eq!(
        letters(dir.path(), "data.csv"),
        [(5, "3".to_owned()), (9, "6,x,y".to_owned())]
    );
}

#[test]
fn a_source_dead_letter_target_is_validated_like_an_operator_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("input.jsonl"), "{}\n").unwrap();
    let yaml = dir.path().join("pipeline.yaml");
    std::fs::write(
        &yaml,
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: in, type: file, path: input.jsonl, on_error: {dead_letter: rejcted}}\n    sinks:\n      - {id: out, type: file, input: in, path: out}\n      - {id: rejected, type: file, path: rejected}\n",
    )
    .unwrap();
    let out = common::binary::plain()
        .args(["validate", "pipeline.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("weir::config::dead_letter"), "{stderr}");
    assert!(stderr.contains("did you mean `rejected`?"), "{stderr}");
}
