//! The script sandbox end to end, through the `weir` binary: limits are refused above their
//! ceilings with a diagnostic naming the ceiling; scripts as deep as the ceilings allow
//! compile (`weir validate`) and run (`weir run`, on the real worker threads) without
//! overflowing a stack; `print`/`debug` go to the log on stderr, never into a `stdout` sink's
//! records; `flat_map` and `emit` are held to `limits.max_outputs_per_record`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Output;

use common::binary::run_with_stdin;

use weir_schema::ScriptLimitsSpec;
use weir_schema::model::{MAX_CALL_LEVELS_CEILING, MAX_EXPR_DEPTH_CEILING, SCRIPT_DEPTH_BUDGET};

/// Runs `weir ARGS` in `dir` with `stdin` as its input.
fn weir(dir: &Path, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    run_with_stdin(dir, args, stdin, env)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Writes `yaml` as `pipeline.yaml` in a new directory.
fn pipeline(yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    dir
}

/// A stdin → map → stdout pipeline with `limits` and the map's `script` (indented).
fn map_pipeline(limits: &str, script: &str) -> String {
    let script: String = script.lines().map(|l| format!("          {l}\n")).collect();
    format!(
        "version: 1\npipelines:\n  - id: p\n    limits: {limits}\n    sources:\n      - {{id: src, type: stdin}}\n    operators:\n      - id: m\n        type: map\n        input: src\n        on_error: skip\n        script: |\n{script}    sinks:\n      - {{id: out, type: stdout, input: m}}\n"
    )
}

fn run(dir: &Path, stdin: &str) -> (Output, Vec<serde_json::Value>) {
    let out = weir(dir, &["run", "--no-api", "pipeline.yaml"], stdin, &[]);
    let records = text(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("stdout line {l:?} is not a record: {e}"))
        })
        .collect();
    (out, records)
}

/// The largest `n` for which the script `make(n)` compiles under `limits`, and that script:
/// found by compiling, so the test does not depend on how Rhai counts depth.
fn deepest(limits: &ScriptLimitsSpec, make: impl Fn(usize) -> String) -> (usize, String) {
    let engine = weir_engine::script::build_engine(limits);
    let compiles = |n: usize| {
        let t = make(n);
        weir_engine::script::on_script_stack(|| weir_engine::script::compile(&engine, &t).is_ok())
            .unwrap()
    };
    let (mut lo, mut hi) = (0, limits.max_expr_depth as usize + 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if compiles(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    assert!(lo > 0, "nothing compiles: {}", make(1));
    (lo, make(lo))
}

/// `fn map(r)` returning `inner` nested `n` times in `open` ... `close`.
fn nested_map(prefix: &str, open: &str, inner: &str, close: &str) -> impl Fn(usize) -> String {
    let (prefix, open, inner, close) = (
        prefix.to_owned(),
        open.to_owned(),
        inner.to_owned(),
        close.to_owned(),
    );
    move |n| {
        format!(
            "{prefix}fn map(r) {{ {}{inner}{} }}",
            open.repeat(n),
            close.repeat(n)
        )
    }
}

#[test]
fn limits_above_their_ceilings_are_diagnostics_naming_the_ceiling() {
    let cases = [
        (
            "{max_call_levels: 1000}",
            "max_call_levels",
            "Allowed: 1 to 512.",
        ),
        (
            "{max_expr_depth: 1000000}",
            "max_expr_depth",
            "Allowed: 1 to 1000.",
        ),
        (
            "{max_operations: 100000000000}",
            "max_operations",
            "Allowed: 1 to 10000000000.",
        ),
        (
            "{max_array_size: 20000000}",
            "max_array_size",
            "Allowed: 1 to 10000000.",
        ),
        (
            "{max_map_size: 0}",
            "max_map_size",
            "Allowed: 1 to 10000000.",
        ),
        (
            "{max_outputs_per_record: 2000000}",
            "max_outputs_per_record",
            "Allowed: 1 to 1000000.",
        ),
        ("{max_string_size: 0B}", "max_string_size", "up to `256MiB`"),
        (
            "{max_string_size: 1GiB}",
            "max_string_size",
            "at most `256MiB`",
        ),
        (
            "{max_call_levels: 200, max_expr_depth: 100}",
            "max_call_levels",
            "at most 8192 (it is 21600): with this `max_expr_depth` use at most `max_call_levels: 75`",
        ),
    ];
    for (limits, field, help) in cases {
        let dir = pipeline(&map_pipeline(limits, "fn map(r) { r }"));
        let out = weir(
            dir.path(),
            &["validate", "--format", "json", "pipeline.yaml"],
            "",
            &[],
        );
        assert!(!out.status.success(), "{limits} must be refused");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{limits}: {e}: {}", text(&out.stdout)));
        let all = report.to_string();
        let d = report["files"][0]["diagnostics"]
            .as_array()
            .and_then(|ds| {
                ds.iter()
                    .find(|d| d["code"] == "weir::config::invalid_value")
            })
            .unwrap_or_else(|| panic!("{limits}: no invalid_value diagnostic in {all}"));
        assert!(
            d["path"].as_str().unwrap_or_default().ends_with(field),
            "{limits}: {d}"
        );
        assert!(
            d["line"].as_u64() == Some(4),
            "{limits}: located on the limits line: {d}"
        );
        assert!(
            d["help"].as_str().unwrap_or_default().contains(help),
            "{limits}: help should say {help:?}: {d}"
        );
    }
}

#[test]
fn recursion_as_deep_as_the_limits_allow_runs_on_the_real_runtime() {
    // Along the depth budget: a shallow expression depth (16, about the least a recursive
    // function compiles under) with the most call levels it allows, and the default depth
    // with the most call levels it allows. Each level of the recursion sits inside the
    // deepest nesting of calls the expression limit accepts, the costliest shape measured.
    let budget = SCRIPT_DEPTH_BUDGET as u32;
    let corners = [(budget / (16 + 8), 16), (budget / (64 + 8), 64)];
    for (calls, depth) in corners {
        assert!(calls <= MAX_CALL_LEVELS_CEILING);
        let limits = ScriptLimitsSpec {
            max_call_levels: calls,
            max_expr_depth: depth,
            ..ScriptLimitsSpec::default()
        };
        let (nesting, script) = deepest(&limits, |n| {
            format!(
                "fn g(x) {{ x }}\nfn f(n) {{ if n <= 0 {{ 0 }} else {{ 1 + {}f(n - 1){} }} }}\n\
                 fn map(r) {{ #{{n: r.n, depth: f(r.n)}} }}",
                "g(".repeat(n),
                ")".repeat(n)
            )
        });
        let yaml = map_pipeline(
            &format!("{{max_call_levels: {calls}, max_expr_depth: {depth}}}"),
            &script,
        );
        let dir = pipeline(&yaml);
        let validated = weir(dir.path(), &["validate", "pipeline.yaml"], "", &[]);
        assert!(
            validated.status.success(),
            "calls {calls}, depth {depth}: {}",
            text(&validated.stderr)
        );
        // One record recursing as deep as allowed, one beyond: a record error, not a crash.
        let deep = i64::from(calls) - 3;
        let too_deep = i64::from(calls) + 10;
        let (out, records) = run(
            dir.path(),
            &format!("{{\"n\": {deep}}}\n{{\"n\": {too_deep}}}\n"),
        );
        assert!(
            out.status.success(),
            "calls {calls}, depth {depth}, nesting {nesting}: {:?}\n{}",
            out.status,
            text(&out.stderr)
        );
        assert_eq!(
            records,
            vec![serde_json::json!({"n": deep, "depth": deep})],
            "calls {calls}, depth {depth}"
        );
    }
}

#[test]
fn expressions_as_deep_as_the_ceiling_compile_and_run() {
    let calls = SCRIPT_DEPTH_BUDGET as u32 / (MAX_EXPR_DEPTH_CEILING + 8);
    let limits = ScriptLimitsSpec {
        max_call_levels: calls,
        max_expr_depth: MAX_EXPR_DEPTH_CEILING,
        ..ScriptLimitsSpec::default()
    };
    let limits_yaml =
        format!("{{max_call_levels: {calls}, max_expr_depth: {MAX_EXPR_DEPTH_CEILING}}}");
    // Parentheses, unary operators and nested calls: the costliest shapes to parse and to run.
    let shapes = [
        deepest(&limits, nested_map("", "(", "r.n", ")")).1,
        deepest(&limits, nested_map("", "-(", "r.n", ")")).1,
        deepest(&limits, nested_map("fn g(x) { x }\n", "g(", "r.n", ")")).1,
        deepest(&limits, nested_map("", "[(", "r.n", ")]")).1,
        deepest(&limits, nested_map("", "#{a: ", "r.n", "}")).1,
    ];
    for script in shapes {
        let dir = pipeline(&map_pipeline(&limits_yaml, &script));
        let validated = weir(dir.path(), &["validate", "pipeline.yaml"], "", &[]);
        assert!(
            validated.status.success(),
            "{}...: {:?}\n{}",
            &script[..40],
            validated.status,
            text(&validated.stderr)
        );
        // (Not parsed: serde_json refuses to read JSON nested deeper than 128.)
        let out = weir(
            dir.path(),
            &["run", "--no-api", "pipeline.yaml"],
            "{\"n\": 1}\n",
            &[],
        );
        assert_eq!(
            text(&out.stdout).lines().count(),
            1,
            "{}",
            text(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{}...: {:?}\n{}",
            &script[..40],
            out.status,
            text(&out.stderr)
        );
    }
    // One level more is a located diagnostic, not a crash.
    let parens = nested_map("", "(", "r.n", ")");
    let (n, _) = deepest(&limits, &parens);
    let dir = pipeline(&map_pipeline(&limits_yaml, &parens(n + 1)));
    let out = weir(dir.path(), &["validate", "pipeline.yaml"], "", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("weir::script::syntax"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn print_and_debug_go_to_the_log_and_stdout_holds_only_records() {
    let dir = pipeline(&map_pipeline(
        "{}",
        "fn map(r) {\n  print(`seen ${r.n}`);\n  debug(r.n);\n  r\n}",
    ));
    let input = "{\"n\": 1}\n{\"n\": 2}\n{\"n\": 3}\n";
    let out = weir(
        dir.path(),
        &["run", "--no-api", "pipeline.yaml"],
        input,
        &[("RUST_LOG", "info,weir::script=debug")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let records: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} on stdout: {e}")))
        .collect();
    assert_eq!(
        records,
        (1..=3)
            .map(|n| serde_json::json!({"n": n}))
            .collect::<Vec<_>>()
    );
    let stderr = text(&out.stderr);
    for n in 1..=3 {
        let line = stderr
            .lines()
            .find(|l| l.contains(&format!("seen {n}")))
            .unwrap_or_else(|| panic!("no log line for print {n} in:\n{stderr}"));
        assert!(line.contains("INFO"), "{line}");
        assert!(
            line.contains("pipeline=p") && line.contains("operator=m"),
            "{line}"
        );
    }
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("DEBUG") && l.contains("operator=m") && l.contains("position=")),
        "{stderr}"
    );
}

#[test]
fn flat_map_and_emit_over_the_output_budget_are_record_errors() {
    let yaml = r#"version: 1
pipelines:
  - id: p
    limits: {max_outputs_per_record: 3}
    sources:
      - {id: src, type: stdin}
    operators:
      - id: fan
        type: flat_map
        input: src
        on_error: skip
        script: |
          fn flat_map(r) { let a = []; a.pad(r.n, r.n); a }
      - {id: by, type: key_by, input: fan, script: "fn key(r) { r }"}
      - id: more
        type: process
        input: by
        on_error: {dead_letter: rejected}
        script: |
          fn process(r) { for i in 0..r + 1 { emit(r); } }
    sinks:
      - {id: out, type: stdout, input: more}
      - {id: rejected, type: file, path: rejected}
"#;
    let dir = pipeline(yaml);
    // `fan`: 2 → [2, 2], 3 → [3, 3, 3], 4 → four records: over the budget, skipped.
    // `more`: a 2 emits three records (within the budget), a 3 four (over it).
    let (out, records) = run(dir.path(), "{\"n\": 2}\n{\"n\": 4}\n{\"n\": 3}\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(records, vec![serde_json::json!(2); 6]);
    let mut letters = Vec::new();
    for e in std::fs::read_dir(dir.path().join("rejected")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            letters.push(serde_json::from_str::<serde_json::Value>(line).unwrap());
        }
    }
    assert_eq!(letters.len(), 3, "{letters:?}");
    for l in &letters {
        assert_eq!(l["record"], 3);
        assert_eq!(l["operator"], "more");
        let error = l["error"].as_str().unwrap();
        assert!(error.contains("`limits.max_outputs_per_record`"), "{error}");
    }
}
