//! `weir test` from the outside: every pipeline file of `pipelines/` and `examples/` has a
//! test file and passes it; a deliberately failing test shows its diff and exits 1;
//! `--format junit` is well-formed and counts the failure; an invalid test file gets located
//! diagnostics; crash, rescaling restore, reload and advance_time steps keep the output
//! exactly once; a wait that takes too long fails its test naming the step and what it
//! waited for.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::binary::weir;
use common::files::copy_dir;

fn run_in(cwd: &Path, args: &[&str]) -> Output {
    weir()
        .current_dir(cwd)
        .arg("test")
        .args(args)
        .output()
        .expect("run weir test")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_reference_pipelines_and_examples_pass_their_tests() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["pipelines", "examples"] {
        copy_dir(&root.join(dir), &tmp.path().join(dir));
        let o = run_in(&tmp.path().join(dir), &[]);
        let t = text(&o);
        assert!(o.status.success(), "{dir}:\n{t}");
        assert!(t.contains(" 0 failed"), "{dir}:\n{t}");
        assert!(!t.contains("FAIL"), "{dir}:\n{t}");
    }
}

const PIPELINE: &str = r#"version: 1
pipelines:
  - id: p
    sources:
      - { id: in, type: stdin, format: jsonl }
    operators:
      - id: double
        type: map
        input: in
        script: |
          fn map(r) { #{n: r.n * 2} }
    sinks:
      - { id: out, type: stdout, input: double }
"#;

const FAILING: &str = r#"pipeline: p.yaml
tests:
  - name: passes
    inputs: { in: [{n: 1}] }
    expect: { out: { exact: [{n: 2}] } }
  - name: expects the wrong doubling
    inputs: { in: [{n: 1}, {n: 2}] }
    expect: { out: { exact: [{n: 2}, {n: 5}] } }
"#;

#[test]
fn a_failing_test_shows_its_diff_and_exits_1() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("p.yaml"), PIPELINE).unwrap();
    std::fs::write(tmp.path().join("p.test.yaml"), FAILING).unwrap();
    let o = run_in(tmp.path(), &["p.test.yaml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("ok   passes"), "{t}");
    assert!(t.contains("FAIL expects the wrong doubling"), "{t}");
    assert!(t.contains(r#"- {"n":5}"#), "{t}");
    assert!(t.contains(r#"+ {"n":4}"#), "{t}");
    assert!(t.contains("1 passed, 1 failed"), "{t}");
}

#[test]
fn junit_is_well_formed_and_counts_the_failure() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("p.yaml"), PIPELINE).unwrap();
    std::fs::write(tmp.path().join("p.test.yaml"), FAILING).unwrap();
    let o = run_in(tmp.path(), &["--format", "junit"]);
    assert_eq!(o.status.code(), Some(1));
    let xml = String::from_utf8(o.stdout).unwrap();
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert!(xml.contains(r#"tests="2" failures="1""#), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), 2, "{xml}");
    assert_eq!(xml.matches("</testcase>").count(), 2, "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    // Well-formed: every tag opened is closed, in order.
    let mut stack = Vec::new();
    for tag in xml.split('<').skip(1) {
        let tag = tag.split('>').next().unwrap();
        if tag.starts_with('?') || tag.ends_with('/') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.to_owned()), "{xml}");
        } else {
            stack.push(tag.split_whitespace().next().unwrap().to_owned());
        }
    }
    assert!(stack.is_empty(), "{xml}");
}

#[test]
fn an_invalid_test_file_gets_located_diagnostics() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("p.yaml"), PIPELINE).unwrap();
    std::fs::write(
        tmp.path().join("bad.test.yaml"),
        "pipeline: p.yaml\ntests:\n  - name: x\n    stepz: [crash]\n",
    )
    .unwrap();
    let o = run_in(tmp.path(), &["bad.test.yaml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("stepz"), "{t}");
    assert!(t.contains("bad.test.yaml:4"), "{t}");
}

#[test]
fn a_reload_step_applies_the_new_version() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("p.yaml"), PIPELINE).unwrap();
    std::fs::write(
        tmp.path().join("p_v2.yaml"),
        PIPELINE.replace("r.n * 2", "r.n * 3"),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("reload.test.yaml"),
        r#"pipeline: p.yaml
tests:
  - name: triples after the reload
    inputs: { in: [{n: 1}] }
    steps:
      - checkpoint
      - reload: p_v2.yaml
      - input: { in: [{n: 2}] }
    expect: { out: { exact: [{n: 2}, {n: 6}] } }
"#,
    )
    .unwrap();
    let o = run_in(tmp.path(), &["reload.test.yaml"]);
    let t = text(&o);
    // The run without steps reloads at the same place, so the outputs agree.
    assert!(o.status.success(), "{t}");
    assert!(t.contains("1 passed, 0 failed"), "{t}");
}

/// Every pipeline file under `pipelines/` and `examples/` (every `*.yaml` but test files) is
/// the `pipeline:` of a test file there or the target of one's `reload:` step.
#[test]
fn every_pipeline_file_has_a_test_file() {
    fn yaml_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                yaml_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["pipelines", "examples"] {
        yaml_files(&root.join(dir), &mut files);
    }
    let is_test = |p: &Path| p.to_string_lossy().ends_with(".test.yaml");
    let mut covered = std::collections::BTreeSet::new();
    for t in files.iter().filter(|p| is_test(p)) {
        let loaded = weir_schema::test_file::load_test_file(t);
        let spec = loaded
            .spec
            .unwrap_or_else(|| panic!("{} does not load: {:?}", t.display(), loaded.diagnostics));
        let dir = t.parent().unwrap();
        covered.insert(dir.join(&spec.pipeline).canonicalize().unwrap());
        for test in &spec.tests {
            for step in &test.steps {
                if let weir_schema::test_file::StepSpec::Reload(f) = step {
                    covered.insert(dir.join(f).canonicalize().unwrap());
                }
            }
        }
    }
    let untested: Vec<String> = files
        .iter()
        .filter(|p| !is_test(p))
        .filter(|p| !covered.contains(&p.canonicalize().unwrap()))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        untested.is_empty(),
        "pipeline files without a test file: {untested:?}"
    );
}

/// Per-key running counts: keyed state that a crash must neither lose nor count twice.
const COUNTS: &str = r#"version: 1
pipelines:
  - id: p
    sources:
      - { id: in, type: stdin, format: jsonl }
    operators:
      - { id: by_word, type: key_by, input: in, field: w }
      - id: counts
        type: aggregate
        input: by_word
        aggregations: [{ fn: count, as: n }]
        emit: updates
    sinks:
      - { id: out, type: stdout, input: counts }
"#;

const COUNTS_EXPECTED: &str = r#"    expect:
      out:
        exact:
          - {key: a, n: 1}
          - {key: a, n: 2}
          - {key: a, n: 3}
          - {key: b, n: 1}
          - {key: b, n: 2}
        last_per_key:
          field: key
          records: [{key: a, n: 3}, {key: b, n: 2}]
"#;

fn counts_test(name: &str, steps: &str) -> String {
    format!(
        "pipeline: p.yaml\ntests:\n  - name: {name}\n    inputs: {{ in: [{{w: a}}, {{w: b}}] }}\n    \
         steps:\n{steps}{COUNTS_EXPECTED}"
    )
}

fn run_counts(steps: &str) -> (Output, String) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("p.yaml"), COUNTS).unwrap();
    std::fs::write(
        tmp.path().join("p.test.yaml"),
        counts_test("stepped", steps),
    )
    .unwrap();
    let o = run_in(tmp.path(), &["p.test.yaml"]);
    let t = text(&o);
    (o, t)
}

#[test]
fn a_crash_step_restores_the_latest_checkpoint_and_repeats_nothing() {
    let (o, t) = run_counts(
        "      - checkpoint\n      - input: { in: [{w: a}] }\n      - crash\n      \
         - input: { in: [{w: b}, {w: a}] }\n",
    );
    assert!(o.status.success(), "{t}");
    assert!(t.contains("ok   stepped"), "{t}");
    assert!(t.contains("1 passed, 0 failed"), "{t}");
}

#[test]
fn a_savepoint_restored_at_another_parallelism_and_backend_changes_nothing() {
    let (o, t) = run_counts(
        "      - checkpoint\n      - input: { in: [{w: a}] }\n      - savepoint\n      \
         - restore: { parallelism: 3, backend: rocksdb }\n      - input: { in: [{w: b}] }\n      \
         - advance_time: 1s\n      - savepoint\n      - restore: { parallelism: 1, backend: fs }\n      \
         - input: { in: [{w: a}] }\n",
    );
    assert!(o.status.success(), "{t}");
    assert!(t.contains("1 passed, 0 failed"), "{t}");
}

#[test]
fn a_wait_that_takes_too_long_fails_its_test_naming_the_step() {
    let tmp = tempfile::tempdir().unwrap();
    // Every record keeps the map busy for far longer than the timeout, so the checkpoint's
    // barrier waits behind it.
    std::fs::write(
        tmp.path().join("p.yaml"),
        PIPELINE
            .replace(
                "    sources:",
                "    limits: { max_operations: 10000000000 }\n    sources:",
            )
            .replace(
                "fn map(r) { #{n: r.n * 2} }",
                "fn map(r) { let x = 0; for i in 0..200000000 { x += 1; } #{n: r.n * 2} }",
            ),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("slow.test.yaml"),
        "pipeline: p.yaml\ntests:\n  - name: slow\n    inputs: { in: [{n: 1}] }\n    \
         steps: [checkpoint]\n    expect: { out: { exact: [{n: 2}] } }\n",
    )
    .unwrap();
    let o = run_in(tmp.path(), &["--timeout", "200ms", "slow.test.yaml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("FAIL slow"), "{t}");
    assert!(
        t.contains("step 1 (`checkpoint`): timed out after 200ms waiting for"),
        "{t}"
    );
}

#[test]
fn names_the_pipeline_lacks_are_located_diagnostics() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("p.yaml"), PIPELINE).unwrap();
    std::fs::write(
        tmp.path().join("names.test.yaml"),
        "pipeline: p.yaml\ntests:\n  - name: x\n    inputs: { in: [{n: 1}] }\n    \
         steps:\n      - input: { inn: [{n: 2}] }\n    expect: { outt: { count: 2 } }\n    \
         dead_letters: { doubel: [] }\n",
    )
    .unwrap();
    let o = run_in(tmp.path(), &["names.test.yaml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("no source `inn`"), "{t}");
    assert!(t.contains("names.test.yaml:6:18"), "{t}");
    assert!(t.contains("no sink `outt`"), "{t}");
    assert!(t.contains("names.test.yaml:7:15"), "{t}");
    assert!(t.contains("no operator `doubel`"), "{t}");
    assert!(t.contains("names.test.yaml:8:21"), "{t}");
    // Each at the name itself (the key), not at what it is given.
}
