//! The `weir` binary end to end: exit codes, text and JSON diagnostics, `schema` and `graph`.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::binary::plain;

fn weir(args: &[&str]) -> Output {
    plain()
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run weir")
}

fn reference_pipelines() -> Vec<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("pipelines/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        // Test files of `weir test` are not pipeline files.
        .filter(|p| !p.to_string_lossy().ends_with(".test.yaml"))
        .map(|p| {
            format!(
                "pipelines/{}",
                p.file_name().and_then(|n| n.to_str()).unwrap_or_default()
            )
        })
        .collect();
    files.sort();
    files
}

fn write_temp(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
    f
}

const VALID: &str = "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: src, type: stdin}\n    operators:\n      - id: keep\n        type: filter\n        input: src\n        script: |\n          fn filter(r) { r.amount > 10 }\n    sinks:\n      - {id: out, type: stdout, input: keep}\n";

#[test]
fn reference_pipelines_are_valid_without_warnings() {
    let files = reference_pipelines();
    assert!(files.len() >= 5, "{files:?}");
    let mut args = vec!["validate", "--deny-warnings"];
    args.extend(files.iter().map(String::as_str));
    let out = weir(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn invalid_file_exits_non_zero_with_located_report() {
    let f = write_temp(&VALID.replace("input: keep", "input: kep"));
    let path = f.path().to_str().expect("utf-8 path");
    let out = weir(&["validate", path]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("weir::config::unknown_input"), "{stderr}");
    assert!(stderr.contains(":13:"), "report names line 13: {stderr}");
    assert!(stderr.contains("did you mean `keep`?"), "{stderr}");
}

#[test]
fn json_format_is_machine_readable() {
    let f = write_temp(&VALID.replace("r.amount > 10 }", "r.amount > }"));
    let path = f.path().to_str().expect("utf-8 path");
    let out = weir(&["validate", "--format", "json", path]);
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(doc["valid"], false);
    let d = &doc["files"][0]["diagnostics"][0];
    assert_eq!(d["code"], "weir::script::syntax");
    assert_eq!(d["severity"], "error");
    // `fn filter(r) { r.amount > }` is on YAML line 11; the error is at the `}`.
    assert_eq!(d["line"], 11);
    assert_eq!(d["column"], 37);
}

#[test]
fn warnings_fail_only_when_denied() {
    let text = VALID.replace("    sources:", "    failover: individual\n    sources:");
    let f = write_temp(&text);
    let path = f.path().to_str().expect("utf-8 path");
    assert!(weir(&["validate", path]).status.success());
    let denied = weir(&["validate", "--deny-warnings", path]);
    assert_eq!(denied.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&denied.stderr).contains("weir::config::lossy_failover"));
}

#[test]
fn missing_file_is_a_clear_error() {
    let out = weir(&["validate", "does/not/exist.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("weir::io") && stderr.contains("does/not/exist.yaml"),
        "{stderr}"
    );
}

#[test]
fn zero_workers_is_refused_with_the_flag_named() {
    let out = weir(&["run", "--workers", "0", "pipelines/all_operators.yaml"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--workers"), "{err}");
    assert!(err.contains("0 is not in 1.."), "{err}");
}

#[test]
fn schema_command_prints_the_checked_in_schema() {
    let out = weir(&["schema"]);
    assert!(out.status.success());
    let checked_in = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schema/weir.schema.json"),
    )
    .expect("schema file");
    assert_eq!(String::from_utf8_lossy(&out.stdout), checked_in);
}

#[test]
fn graph_renders_in_every_format() {
    let file = "pipelines/orders_totals.yaml";
    let text = weir(&["graph", file]);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("hash"), "{text}");
    let dot = weir(&["graph", "--format", "dot", file]);
    assert!(
        String::from_utf8_lossy(&dot.stdout)
            .trim_start()
            .starts_with("digraph")
    );
    let mermaid = weir(&["graph", "--format", "mermaid", file]);
    assert!(String::from_utf8_lossy(&mermaid.stdout).contains("flowchart"));
}

#[test]
fn graph_refuses_an_invalid_file() {
    let f = write_temp(&VALID.replace("input: keep", "input: nowhere"));
    let out = weir(&["graph", f.path().to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("weir::config::unknown_input"));
}

/// The reproductions, through the binary: each is a located diagnostic with its code
/// and exit code 1, never an abort or a runaway allocation.
#[test]
fn hostile_files_are_diagnostics_not_aborts() {
    let deep = write_temp(&format!("x:\n{}z\n", "- ".repeat(20_000)));
    let path = deep.path().to_str().expect("UTF-8 path");
    for verb in ["validate", "graph"] {
        let out = weir(&[verb, path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "weir {verb}: {stderr}");
        assert!(
            stderr.contains("weir::yaml::depth"),
            "weir {verb}: {stderr}"
        );
        assert!(stderr.contains("256 levels"), "weir {verb}: {stderr}");
    }
    let out = weir(&["run", "--no-api", path]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("weir::yaml::depth"), "weir run: {stderr}");
    assert!(
        out.status.code().is_some(),
        "weir run died from a signal: {stderr}"
    );

    let mut bomb = format!("s: &s \"{}\"\n", "x".repeat(100_000));
    for level in 1..=4 {
        let prev = if level == 1 {
            "s".to_owned()
        } else {
            format!("l{}", level - 1)
        };
        let refs = vec![format!("*{prev}"); 10].join(", ");
        bomb.push_str(&format!("l{level}: &l{level} [{refs}]\n"));
    }
    let bomb = write_temp(&bomb);
    let out = weir(&[
        "validate",
        "--format",
        "json",
        bomb.path().to_str().expect("UTF-8"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let d = &report["files"][0]["diagnostics"][0];
    assert_eq!(d["code"], "weir::yaml::alias_budget", "{report:#}");
    assert_eq!(d["line"], 3, "{report:#}");
    assert!(
        d["help"].as_str().is_some_and(|h| h.contains("4 MiB")),
        "{report:#}"
    );

    let out = weir(&["validate", "/dev/zero"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
}

/// Four pipelines, one per guarantee `weir validate` and `weir graph` must state.
const GUARANTEES: &str = "version: 1
pipelines:
  - id: exact
    checkpoints: {interval: 1s}
    state: {backend: fs}
    sources: [{id: in, type: generator, count: 5, fields: {n: {kind: sequence}}}]
    sinks: [{id: out, type: file, input: in, path: out/exact}]
  - id: console
    checkpoints: {interval: 1s, mode: at_least_once}
    state: {backend: fs}
    sources: [{id: in, type: generator, count: 5, fields: {n: {kind: sequence}}}]
    sinks: [{id: out, type: stdout, input: in}]
  - id: piped
    checkpoints: {interval: 1s, mode: at_least_once}
    state: {backend: fs}
    sources: [{id: in, type: stdin}]
    sinks: [{id: out, type: file, input: in, path: out/piped}]
  - id: plain
    sources: [{id: in, type: generator, count: 5, fields: {n: {kind: sequence}}}]
    sinks: [{id: out, type: file, input: in, path: out/plain}]
";

#[test]
fn validate_and_graph_state_each_pipelines_guarantee() {
    let f = write_temp(GUARANTEES);
    let path = f.path().to_str().expect("utf-8 path");
    let out = weir(&["validate", path]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in [
        "  note: pipeline `exact` is exactly-once (aligned `exactly_once` checkpoints",
        "  note: pipeline `console` is at-least-once (`checkpoints.mode: at_least_once`",
        "  note: pipeline `piped` is at-most-once (source `in` (stdin) cannot replay",
        "  note: pipeline `plain` is at-most-once (no checkpoints",
    ] {
        assert!(
            stderr.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("sink `out` (stdout) cannot take back output"),
        "{stderr}"
    );

    let out = weir(&["validate", "--format", "json", path]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let levels: Vec<(&str, &str)> = doc["files"][0]["guarantees"]
        .as_array()
        .expect("guarantees")
        .iter()
        .map(|g| {
            (
                g["pipeline"].as_str().expect("pipeline"),
                g["guarantee"].as_str().expect("guarantee"),
            )
        })
        .collect();
    assert_eq!(
        levels,
        [
            ("exact", "exactly-once"),
            ("console", "at-least-once"),
            ("piped", "at-most-once"),
            ("plain", "at-most-once")
        ]
    );

    let graph = weir(&["graph", path]);
    let text = String::from_utf8_lossy(&graph.stdout);
    for line in [
        "  guarantee: exactly-once",
        "  guarantee: at-least-once",
        "  guarantee: at-most-once",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
    let reference = weir(&["graph", "pipelines/orders_totals.yaml"]);
    assert!(String::from_utf8_lossy(&reference.stdout).contains("guarantee: exactly-once"));
}

/// A reader that goes away early (`weir schema | head -1`) ends the command quietly, as with
/// any Unix tool: no panic about a broken pipe.
#[test]
fn printing_to_a_reader_that_went_away_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    for args in [&["schema"][..], &["graph", "pipelines/wordcount.yaml"][..]] {
        let mut child = plain()
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run weir");
        let mut first = [0u8; 1];
        child
            .stdout
            .take()
            .expect("stdout")
            .read_exact(&mut first)
            .expect("a first byte");
        // The pipe's reading end is closed here; `schema` has far more to print than a pipe
        // buffer holds, so its next writes meet the closed pipe.
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(13),
            "{args:?}: {:?} {stderr}",
            out.status
        );
    }
}
