//! Strict data errors end to end, through the `weir` binary: a missing field or a type mix in
//! a script is a record error under the operator's `on_error` (counted, dead-lettered, or
//! failing the run) instead of a silent `()`, `false` or string concatenation.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Output;

use common::binary::run_with_stdin;

fn weir(dir: &Path, args: &[&str], stdin: &str) -> Output {
    run_with_stdin(dir, args, stdin, &[])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A stdin → `type` operator → stdout pipeline, the operator with `on_error` and `script`.
fn pipeline(kind: &str, on_error: &str, script: &str) -> tempfile::TempDir {
    let script: String = script.lines().map(|l| format!("          {l}\n")).collect();
    let rejected = if on_error.contains("dead_letter") {
        "      - {id: rejected, type: file, path: rejected}\n"
    } else {
        ""
    };
    let yaml = format!(
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {{id: src, type: stdin}}\n    operators:\n      - id: op\n        type: {kind}\n        input: src\n        on_error: {on_error}\n        script: |\n{script}    sinks:\n      - {{id: out, type: stdout, input: op}}\n{rejected}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    dir
}

fn dead_letters(dir: &Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir.join("rejected")) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            out.push(serde_json::from_str(line).unwrap());
        }
    }
    out
}

/// The `errors` column of `element` in `weir run`'s summary table.
fn errors_of(summary: &str, element: &str) -> Option<u64> {
    summary
        .lines()
        .find(|l| l.split_whitespace().next() == Some(element))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

#[test]
fn a_string_plus_an_int_is_a_record_error_not_a_silent_false() {
    let dir = pipeline(
        "filter",
        "{dead_letter: rejected}",
        "fn filter(r) { (r.user + 1) > 0 }",
    );
    let input = "{\"user\":\"u1\"}\n{\"user\":2}\n";
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], input);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "{\"user\":2}");
    assert_eq!(errors_of(&text(&out.stderr), "op"), Some(1));
    let dead = dead_letters(dir.path());
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["record"]["user"], "u1");
    let error = dead[0]["error"].as_str().unwrap();
    assert!(
        error.contains("cannot apply `+` to string and int"),
        "{error}"
    );
}

#[test]
fn a_missing_field_is_a_record_error_naming_the_fields_the_record_has() {
    let dir = pipeline("map", "skip", "fn map(r) { #{total: r.amount * 2} }");
    let input = "{\"amount\":3}\n{\"amonut\":4,\"user\":\"u\"}\n";
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], input);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "{\"total\":6}");
    assert_eq!(errors_of(&text(&out.stderr), "op"), Some(1));

    let dir = pipeline("map", "fail", "fn map(r) { #{total: r.amount * 2} }");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], input);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("missing field `amount`"), "{stderr}");
    assert!(stderr.contains("amonut, user"), "{stderr}");
}

#[test]
fn get_reads_an_optional_field_with_a_default() {
    let dir = pipeline(
        "map",
        "fail",
        "fn map(r) { #{total: get(r, \"amount\", 0) * 2, has: \"amount\" in r} }",
    );
    let input = "{\"amount\":3}\n{\"user\":\"u\"}\n";
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], input);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["total"], 6);
    assert_eq!(lines[0]["has"], true);
    assert_eq!(lines[1]["total"], 0);
    assert_eq!(lines[1]["has"], false);
}

/// A file → key_by → aggregate → stdout pipeline summing `field`.
fn sum_pipeline(field: &str, on_error: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("in.jsonl"),
        "{\"user\":\"a\",\"amount\":1}\n{\"user\":\"b\",\"amount\":2}\n{\"user\":\"a\",\"amount\":3}\n",
    )
    .unwrap();
    let yaml = format!(
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {{id: src, type: file, path: in.jsonl}}\n    operators:\n      - {{id: by, type: key_by, input: src, field: user}}\n      - id: op\n        type: aggregate\n        input: by\n        emit: final\n        on_error: {on_error}\n        aggregations: [{{fn: sum, field: {field}, as: total}}]\n    sinks:\n      - {{id: out, type: stdout, input: op}}\n"
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    dir
}

#[test]
fn sum_of_a_field_no_record_has_is_an_error_not_zero() {
    let dir = sum_pipeline("amout", "skip");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "", "no key got a total");
    assert_eq!(errors_of(&text(&out.stderr), "op"), Some(3));

    let dir = sum_pipeline("amout", "fail");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], "");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("missing field `amout`"), "{stderr}");
    assert!(
        stderr.contains("amount, user") || stderr.contains("user, amount"),
        "{stderr}"
    );

    let dir = sum_pipeline("amount", "fail");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut got: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    got.sort();
    assert_eq!(
        got,
        ["{\"key\":\"a\",\"total\":4}", "{\"key\":\"b\",\"total\":2}"]
    );
}

/// A file → stdout pipeline over `in.<ext>` holding `data`, the source with `on_error`.
fn source_pipeline(ext: &str, data: &str, on_error: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(format!("in.{ext}")), data).unwrap();
    let format = if ext == "csv" { "csv" } else { "jsonl" };
    let yaml = format!(
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {{id: src, type: file, path: in.{ext}, format: {format}, on_error: {on_error}}}\n    sinks:\n      - {{id: out, type: stdout, input: src}}\n"
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    dir
}

#[test]
fn a_jsonl_line_that_is_an_array_is_a_source_record_error() {
    let data = "{\"a\":1}\n[1,2]\n\"text\"\n{\"a\":4}\n";
    let dir = source_pipeline("jsonl", data, "fail");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], "");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("in.jsonl:2"), "{stderr}");
    assert!(stderr.contains("JSON array, not an object"), "{stderr}");

    let dir = source_pipeline("jsonl", data, "skip");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "{\"a\":1}\n{\"a\":4}\n");
}

#[test]
fn a_short_csv_row_is_a_source_record_error() {
    let data = "\u{feff}user,amount\nu1,3\nu2\nu3,5\n";
    let dir = source_pipeline("csv", data, "fail");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], "");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("in.csv:3"), "{stderr}");
    assert!(
        stderr.contains("1 field(s), but the header names 2"),
        "{stderr}"
    );

    let dir = source_pipeline("csv", data, "skip");
    let out = weir(dir.path(), &["run", "--no-api", "pipeline.yaml"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "{\"amount\":3,\"user\":\"u1\"}\n{\"amount\":5,\"user\":\"u3\"}\n"
    );
}
