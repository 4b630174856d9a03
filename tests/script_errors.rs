//! Run-time script errors through the `weir` binary: the failure names the pipeline file's
//! line and column of the failing expression (or the script file's), a `weir::script::*` code
//! and a help line in Weir's terms, in the final report, the log and the dead letter. Rhai's own
//! wording is not asserted on.
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

/// The 1-based line and column where `needle` starts in `text` (its only occurrence).
fn locate(text: &str, needle: &str) -> (usize, usize) {
    assert_eq!(
        text.matches(needle).count(),
        1,
        "`{needle}` once in:\n{text}"
    );
    let at = text.find(needle).unwrap();
    let line = text[..at].matches('\n').count() + 1;
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    (line, text[start..at].chars().count() + 1)
}

/// A stdin → map `op` → stdout pipeline with `on_error` and an inline block `script` (its
/// lines indented under `script: |`); the dead-letter sink `rejected` when `on_error` names it.
fn pipeline(on_error: &str, script: &str) -> (tempfile::TempDir, String) {
    let script: String = script.lines().map(|l| format!("          {l}\n")).collect();
    let rejected = if on_error.contains("dead_letter") {
        "      - {id: rejected, type: file, path: rejected}\n"
    } else {
        ""
    };
    let yaml = format!(
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {{id: src, type: stdin}}\n    operators:\n      - id: op\n        type: map\n        input: src\n        on_error: {on_error}\n        script: |\n{script}    sinks:\n      - {{id: out, type: stdout, input: op}}\n{rejected}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pipeline.yaml"), &yaml).unwrap();
    (dir, yaml)
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

#[test]
fn a_missing_field_fails_at_the_yaml_line_and_column_with_a_code_and_help() {
    let script = "fn map(r) {\n    let n = 2;\n    #{total: r.amount * n}\n}";
    let (dir, yaml) = pipeline("fail", script);
    let (line, col) = locate(&yaml, "amount");
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        "{\"amonut\":4,\"user\":\"u\"}\n",
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("pipeline.yaml:{line}:{col}")),
        "names pipeline.yaml:{line}:{col}:\n{stderr}"
    );
    assert!(stderr.contains("weir::script::missing_field"), "{stderr}");
    assert!(stderr.contains("get(r, \"amount\", default)"), "{stderr}");
    assert!(stderr.contains("amonut, user"), "{stderr}");
    // The log line of the failure carries the same, on one line.
    let logged = stderr
        .lines()
        .find(|l| l.contains("Task failed."))
        .unwrap_or_else(|| panic!("a Task failed. log line:\n{stderr}"));
    assert!(
        logged.contains(&format!("pipeline.yaml:{line}:{col}"))
            && logged.contains("weir::script::missing_field"),
        "{logged}"
    );
}

#[test]
fn a_type_mix_in_a_dead_letter_names_the_position_the_code_and_how_to_convert() {
    let script = "fn map(r) {\n    r.next = r.user + 1;\n    r\n}";
    let (dir, yaml) = pipeline("{dead_letter: rejected}", script);
    let (line, col) = locate(&yaml, "+ 1");
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        "{\"user\":\"u1\"}\n{\"user\":2}\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let passed: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(passed, serde_json::json!({"user": 2, "next": 3}));
    let dead = dead_letters(dir.path());
    assert_eq!(dead.len(), 1, "{dead:?}");
    let error = dead[0]["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("pipeline.yaml:{line}:{col}")),
        "names pipeline.yaml:{line}:{col}: {error}"
    );
    assert!(error.contains("weir::script::type_mismatch"), "{error}");
    assert!(
        error.contains("parse_int") && error.contains("to_string"),
        "{error}"
    );
    assert!(!error.contains('\n'), "one line: {error}");
}

#[test]
fn a_function_not_found_for_some_types_says_which_types_in_weir_words() {
    let script = "fn map(r) {\n    #{n: abs(r.user)}\n}";
    let (dir, yaml) = pipeline("fail", script);
    let (line, col) = locate(&yaml, "abs(");
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        "{\"user\":\"u1\"}\n",
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("pipeline.yaml:{line}:{col}")),
        "names pipeline.yaml:{line}:{col}:\n{stderr}"
    );
    assert!(
        stderr.contains("weir::script::function_not_found"),
        "{stderr}"
    );
    assert!(stderr.contains("(string)"), "{stderr}");
    assert!(stderr.contains("parse_int"), "{stderr}");
}

#[test]
fn a_unit_value_is_explained_as_a_missing_value() {
    let script = "fn map(r) {\n    #{n: r.score + 1}\n}";
    let (dir, _) = pipeline("fail", script);
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        "{\"score\":null}\n",
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("weir::script::type_mismatch"), "{stderr}");
    assert!(stderr.contains("`()` means a missing value"), "{stderr}");
}

#[test]
fn a_script_file_error_names_the_script_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let script = "// doubles the total\nfn map(r) {\n  #{total: r.amount * 2}\n}\n";
    std::fs::write(dir.path().join("double.rhai"), script).unwrap();
    let (line, col) = locate(script, "amount");
    std::fs::write(
        dir.path().join("pipeline.yaml"),
        "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: src, type: stdin}\n    operators:\n      - {id: op, type: map, input: src, script_file: double.rhai}\n    sinks:\n      - {id: out, type: stdout, input: op}\n",
    )
    .unwrap();
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        "{\"x\":1}\n",
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("double.rhai:{line}:{col}")),
        "names double.rhai:{line}:{col}:\n{stderr}"
    );
    assert!(stderr.contains("weir::script::missing_field"), "{stderr}");
}

#[test]
fn a_quoted_one_line_script_is_placed_past_its_quote() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: src, type: stdin}\n    operators:\n      - {id: op, type: map, input: src, script: 'fn map(r) { #{t: r.amount} }'}\n    sinks:\n      - {id: out, type: stdout, input: op}\n";
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    let (line, col) = locate(yaml, "amount");
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        "{\"x\":1}\n",
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("pipeline.yaml:{line}:{col}")),
        "names pipeline.yaml:{line}:{col}:\n{stderr}"
    );
}

#[test]
fn a_long_record_excerpt_is_one_unbroken_line_shortened_with_an_ellipsis() {
    let script = "fn map(r) {\n    #{t: r.amount}\n}";
    let (dir, _) = pipeline("fail", script);
    let pad = "x".repeat(400);
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        &format!("{{\"pad\":\"{pad}\"}}\n"),
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    let excerpt = format!("{{\"pad\":\"{}", "x".repeat(150));
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(&excerpt)).collect();
    assert!(!lines.is_empty(), "the excerpt is printed whole:\n{stderr}");
    for l in &lines {
        assert!(l.contains('…'), "shortened with an ellipsis: {l}");
        assert!(!l.contains(&pad), "shortened: {l}");
    }
}
