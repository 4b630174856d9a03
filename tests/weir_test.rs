//! `weir test` from the outside: the test files of the reference pipelines and examples pass;
//! a deliberately failing test shows its diff and exits 1; `--format junit` is well-formed
//! and counts the failure; an invalid test file gets located diagnostics; a reload step
//! applies a new version whose output the expectations see.

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
