//! `${VAR}` interpolation in pipeline files through the `weir` binary: diagnostics point at
//! the reference in the file; values marked `${secret:...}` never appear in what `weir
//! validate`, `weir graph` and `weir run` print, in the run's log, in `weir status`, nor in
//! the files of a savepoint.

mod common;

use std::path::Path;
use std::process::Output;

use common::binary::plain;
use common::run::{Run, beside};

/// A value no test writes anywhere but in the environment.
const SECRET: &str = "hunter2-s3cr3t-token";

fn weir(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Output {
    plain()
        .args(args)
        .current_dir(dir)
        .env_remove("WEIR_TEST_UNSET")
        .envs(env.iter().copied())
        .output()
        .expect("run weir")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The 1-based line and column of the first `needle` in `text`.
fn line_col(text: &str, needle: &str) -> (u64, u64) {
    let at = text.find(needle).expect("needle in text");
    let line = text[..at].matches('\n').count() as u64 + 1;
    let col = text[..at]
        .rsplit('\n')
        .next()
        .map_or(0, |l| l.chars().count()) as u64
        + 1;
    (line, col)
}

#[test]
fn an_undefined_variable_is_a_diagnostic_at_its_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = "\
version: 1
pipelines:
  - id: p
    sources:
      - {id: src, type: stdin}
    sinks:
      - id: out
        type: file
        input: src
        path: out/${WEIR_TEST_UNSET}/x
";
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, yaml).expect("write");
    let out = weir(&["validate", "--format", "json", "p.yaml"], dir.path(), &[]);
    assert!(!out.status.success(), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let diagnostics = doc["files"][0]["diagnostics"]
        .as_array()
        .expect("diagnostics");
    assert_eq!(diagnostics.len(), 1, "{doc:#}");
    let d = &diagnostics[0];
    assert_eq!(d["code"], "weir::env::undefined", "{d:#}");
    let (line, col) = line_col(yaml, "${WEIR_TEST_UNSET}");
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(line), Some(col))
    );
    assert_eq!(
        d["length"].as_u64(),
        Some("${WEIR_TEST_UNSET}".len() as u64)
    );
    assert!(
        d["help"]
            .as_str()
            .is_some_and(|h| h.contains("WEIR_TEST_UNSET")),
        "{d:#}"
    );

    // Text output shows the same place; with the variable set (or a default) the file is valid.
    let out = weir(&["validate", "p.yaml"], dir.path(), &[]);
    let shown = text(&out);
    assert!(shown.contains("weir::env::undefined"), "{shown}");
    assert!(shown.contains(&format!("p.yaml:{line}:{col}")), "{shown}");
    let out = weir(
        &["validate", "p.yaml"],
        dir.path(),
        &[("WEIR_TEST_UNSET", "sub")],
    );
    assert!(out.status.success(), "{}", text(&out));

    // Malformed references are diagnostics too.
    std::fs::write(&file, yaml.replace("${WEIR_TEST_UNSET}", "${1A}")).expect("write");
    let out = weir(&["validate", "p.yaml"], dir.path(), &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("weir::env::syntax"), "{}", text(&out));
}

#[test]
fn defaults_escapes_and_typed_values_expand() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("in")).expect("mkdir");
    std::fs::write(dir.path().join("in/a.jsonl"), "{\"n\":1}\n{\"n\":2}\n").expect("write");
    let yaml = "\
version: 1
pipelines:
  - id: p
    parallelism: ${WEIR_TEST_PAR}
    description: costs $$5 in ${WEIR_TEST_UNSET:-dev}
    sources:
      - {id: src, type: file, path: \"${WEIR_TEST_IN}/a.jsonl\"}
    sinks:
      - {id: out, type: file, input: src, path: out}
";
    std::fs::write(dir.path().join("p.yaml"), yaml).expect("write");
    let env = [("WEIR_TEST_PAR", "1"), ("WEIR_TEST_IN", "in")];
    let out = weir(&["graph", "p.yaml"], dir.path(), &env);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("# costs $5 in dev"), "{}", text(&out));
    let out = weir(
        &["run", "--no-progress", "--no-api", "p.yaml"],
        dir.path(),
        &env,
    );
    assert!(out.status.success(), "{}", text(&out));
    let written = common::output::committed(&dir.path().join("out"));
    assert_eq!(written.len(), 2, "{written:?}");
}

/// Every file under `dir`, as text, with its path.
fn files_under(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                pending.push(p);
            } else {
                let bytes = std::fs::read(&p).expect("read");
                found.push((
                    p.display().to_string(),
                    String::from_utf8_lossy(&bytes).into_owned(),
                ));
            }
        }
    }
    found
}

#[test]
fn a_secret_is_never_shown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [("WEIR_TEST_SECRET", SECRET)];

    // A diagnostic that would quote the value shows `***`.
    let bad = "\
version: 1
pipelines:
  - id: p
    checkpoints: {interval: \"${secret:WEIR_TEST_SECRET}\"}
    sources:
      - {id: src, type: stdin}
    sinks:
      - {id: out, type: stdout, input: src}
";
    std::fs::write(dir.path().join("bad.yaml"), bad).expect("write");
    for format in ["text", "json"] {
        let out = weir(
            &["validate", "--format", format, "bad.yaml"],
            dir.path(),
            &env,
        );
        let shown = text(&out);
        assert!(!out.status.success(), "{shown}");
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }

    // `weir graph` and `weir run` (its log at debug, `weir status`, the summary, a savepoint).
    let yaml = "\
version: 1
pipelines:
  - id: totals
    description: \"token ${secret:WEIR_TEST_SECRET}\"
    state: { backend: fs }
    checkpoints: { interval: 200ms, storage: ck }
    sources:
      - id: gen
        type: generator
        seed: 1
        count: 100000
        rate: 2000
        fields:
          user: { kind: key, prefix: u, cardinality: 5 }
          amount: { kind: int, min: 1, max: 9 }
    operators:
      - { id: by_user, type: key_by, input: gen, field: user }
      - id: sum
        type: aggregate
        input: by_user
        emit: updates
        aggregations: [{ fn: sum, field: amount, as: total }]
    sinks:
      - { id: out, type: file, input: sum, path: out }
";
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, yaml).expect("write");
    let out = weir(&["validate", "p.yaml"], dir.path(), &env);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains(SECRET));
    let out = weir(&["graph", "p.yaml"], dir.path(), &env);
    assert!(out.status.success(), "{}", text(&out));
    let graph = text(&out);
    assert!(!graph.contains(SECRET), "{graph}");
    assert!(graph.contains("# ***\n"), "{graph}");

    let args = ["--api-port", "0", "--log-level", "trace"];
    let mut run = Run::start_with(beside(&file), &file, &args, &env);
    run.wait_mid_run("totals", 100);
    let status = run.cli(&["status", "--json"]);
    assert!(!text(&status).contains(SECRET), "{}", text(&status));
    let savepoint = run.stop_with_savepoint("totals");
    let log = run.terminate();
    assert!(!log.contains(SECRET), "the log shows the secret:\n{log}");
    for (path, content) in files_under(&savepoint) {
        assert!(!content.contains(SECRET), "{path} holds the secret");
    }
    for (path, content) in files_under(&dir.path().join("ck")) {
        assert!(!content.contains(SECRET), "{path} holds the secret");
    }
}
