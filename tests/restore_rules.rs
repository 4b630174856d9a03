//! The restore rules end to end: one decision (`checkpoint::restore_plan`) serves
//! `weir reload --plan`, the live reload (`weir reload`, `weir run --watch`) and
//! `weir run --from-savepoint`, so what the plan says and what the restore does agree. Each
//! scenario edits the state of a keyed `process` operator (a renamed state, a changed kind
//! with and without `migrate`, another state backend) and checks the plan's text, then the
//! outcome of each way of applying it, then the committed output: per key the running count
//! either continues (state kept or migrated) or starts at 1 (state new), every record once.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::files::write_by_rename;
use common::output::committed;
use common::run::{Run, run_to_end};
use serde_json::Value;

/// Version 1 of the counter: a running count per key in the value state `cnt`.
const V1: &str = r#"fn process(r) {
            let c = state_get("cnt");
            if c == () { c = 0; }
            c += 1;
            state_set("cnt", c);
            emit(#{k: r.k, n: c, seq: r.seq, v: VERSION});
          }"#;

/// The same count in the value state `count` (a rename).
const RENAMED: &str = r#"fn process(r) {
            let c = state_get("count");
            if c == () { c = 0; }
            c += 1;
            state_set("count", c);
            emit(#{k: r.k, n: c, seq: r.seq, v: VERSION});
          }"#;

/// The count as the length of the list state `cnt` (a kind change).
const AS_LIST: &str = r#"fn process(r) {
            list_push("cnt", r.seq);
            emit(#{k: r.k, n: list_get("cnt").len(), seq: r.seq, v: VERSION});
          }"#;

/// `migrate` for [`AS_LIST`]: a count `old` becomes a list of `old` elements.
const TO_LIST: &str = r#"
          fn migrate(name, old) { let a = []; a.pad(old, 0); a }"#;

/// A pipeline file: a rate-limited generator of 20 keys, the counter at parallelism 2, an
/// exactly-once file sink.
fn job(state: &str, script: &str, version: u32, backend: &str, rate: bool) -> String {
    let script = script.replace("VERSION", &version.to_string());
    let rate = if rate { "        rate: 2000\n" } else { "" };
    format!(
        r#"version: 1
pipelines:
  - id: counts
    parallelism: 2
    max_parallelism: 128
    state: {{ backend: {backend} }}
    checkpoints: {{ mode: exactly_once, interval: 200ms, storage: ck }}
    restart: {{ strategy: none }}
    sources:
      - id: gen
        type: generator
        parallelism: 1
        seed: 3
        count: 30000
{rate}        fields:
          seq: {{ kind: sequence }}
          k: {{ kind: key, prefix: k, cardinality: 20 }}
    operators:
      - {{ id: by_k, type: key_by, input: gen, field: k, parallelism: 1 }}
      - id: counter
        type: process
        input: by_k
        state: {{ {state} }}
        script: |
          {script}
    sinks:
      - {{ id: out, type: file, input: counter, path: out }}
"#
    )
}

/// One edit of the counter: the new version's file and what must be true of it.
struct Edit {
    name: &'static str,
    /// The new version (2) as written while a run goes on.
    yaml: String,
    /// Lines the plan must print.
    plan: &'static [&'static str],
    /// A problem that refuses the edit without `--allow-non-restored-state`, if any.
    problem: Option<&'static str>,
    /// The switch makes it applicable.
    allowed_by_switch: bool,
    /// After the edit the counts continue (state kept or migrated); else they start at 1.
    continues: bool,
}

fn edits() -> Vec<Edit> {
    vec![
        Edit {
            name: "rename",
            yaml: job("count: value", RENAMED, 2, "fs", true),
            plan: &[
                "counter       new (script changed)",
                "counter       state `count` (value) new (starts empty)",
                "counter       state `cnt` (value) dropped (not declared any more)",
            ],
            problem: Some("state `cnt` (value) is not declared any more"),
            allowed_by_switch: true,
            continues: false,
        },
        Edit {
            name: "kind change",
            yaml: job("cnt: list", AS_LIST, 2, "fs", true),
            plan: &["counter       state `cnt` value → list: incompatible (no migrate)"],
            problem: Some("state `cnt` changed kind from value to list"),
            allowed_by_switch: false,
            continues: false,
        },
        Edit {
            name: "kind change with migrate",
            yaml: job("cnt: list", &format!("{AS_LIST}{TO_LIST}"), 2, "fs", true),
            plan: &[
                "counter       state migrated (script changed)",
                "counter       state `cnt` value → list (every value goes through migrate)",
            ],
            problem: None,
            allowed_by_switch: false,
            continues: true,
        },
        Edit {
            name: "backend change",
            yaml: job("cnt: value", V1, 2, "rocksdb", true),
            plan: &[
                "state backend fs → rocksdb",
                "counter       state kept (script changed)",
            ],
            problem: None,
            allowed_by_switch: false,
            continues: true,
        },
    ]
}

fn v1() -> String {
    job("cnt: value", V1, 1, "fs", true)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    write_by_rename(&path, text);
    path
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Checks the committed output: every record once (the sequence numbers are `0..n`), and
/// per key the count `n` goes up by one within a version, starts at 1 for a key's first
/// record, and at a version `v` either continues (`continues[v]`) or starts at 1 again.
fn check_counts(lines: &[String], continues: &BTreeMap<i64, bool>, what: &str) -> usize {
    let mut by_key: BTreeMap<String, Vec<(i64, i64, i64)>> = BTreeMap::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        by_key
            .entry(v["k"].as_str().unwrap().to_owned())
            .or_default()
            .push((
                v["seq"].as_i64().unwrap(),
                v["v"].as_i64().unwrap(),
                v["n"].as_i64().unwrap(),
            ));
    }
    let mut seqs: Vec<i64> = by_key.values().flatten().map(|r| r.0).collect();
    seqs.sort_unstable();
    let n = seqs.len();
    assert!(n > 0, "{what}: no output");
    assert_eq!(
        seqs,
        (0..n as i64).collect::<Vec<_>>(),
        "{what}: the committed records are not 0..{n}, each once"
    );
    for (k, mut records) in by_key {
        records.sort_unstable();
        let mut prev: Option<(i64, i64)> = None;
        for (seq, v, count) in records {
            let want = match prev {
                None => 1,
                Some((pv, pn)) if pv == v => pn + 1,
                Some((pv, pn)) => {
                    assert!(v > pv, "{what}: key {k} went back from version {pv} to {v}");
                    if continues.get(&v).copied().unwrap_or(true) {
                        pn + 1
                    } else {
                        1
                    }
                }
            };
            assert_eq!(
                count, want,
                "{what}: key {k}, record {seq} (version {v}) counted {count}, expected {want}"
            );
            prev = Some((v, count));
        }
    }
    n
}

/// Applying the edit through `weir reload` against a running job: the plan first (its text,
/// and its problem when there is one), then the reload (rejected at plan time, never at run
/// time, when the plan has a problem; applied otherwise, with the switch where it is
/// needed); then a stop with a savepoint.
fn through_weir_reload(edit: &Edit) {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "job.yaml", &v1());
    let mut run = Run::start(dir.path(), &file, &[]);
    run.wait_checkpoints(&["counts"], 2);

    let candidate = write(dir.path(), "next.yaml", &edit.yaml);
    let plan = run.cli(&["reload", "--plan", candidate.to_str().unwrap()]);
    let plan_text = text(&plan);
    for line in edit.plan {
        assert!(
            plan_text.contains(line),
            "{}: plan lacks `{line}`:\n{plan_text}",
            edit.name
        );
    }
    match edit.problem {
        Some(problem) => {
            assert!(!plan.status.success(), "{}: {plan_text}", edit.name);
            assert!(plan_text.contains(problem), "{}: {plan_text}", edit.name);
            if edit.allowed_by_switch {
                assert!(
                    plan_text.contains("weir reload --allow-non-restored-state"),
                    "{}: the help names the switch:\n{plan_text}",
                    edit.name
                );
            }
            assert!(
                !plan_text.contains("allow_non_restored_state"),
                "{plan_text}"
            );
        }
        None => assert!(plan.status.success(), "{}: {plan_text}", edit.name),
    }

    write(dir.path(), "job.yaml", &edit.yaml);
    let reload = run.cli(&["reload"]);
    let reload_text = text(&reload);
    let mut continues = BTreeMap::new();
    if let Some(problem) = edit.problem {
        assert!(
            reload_text.contains("reload rejected") && reload_text.contains(problem),
            "{}: {reload_text}",
            edit.name
        );
        assert!(
            !run.log().contains("registered as"),
            "{}: failed at run time",
            edit.name
        );
        if !edit.allowed_by_switch {
            let sp = run.stop_with_savepoint("counts");
            run.finish_ok();
            assert!(sp.is_dir());
            check_counts(&committed(&dir.path().join("out")), &continues, edit.name);
            return;
        }
        let plan = run.cli(&[
            "reload",
            "--plan",
            candidate.to_str().unwrap(),
            "--allow-non-restored-state",
        ]);
        let allowed_plan = text(&plan);
        assert!(plan.status.success(), "{}: {allowed_plan}", edit.name);
        assert!(allowed_plan.contains("allowed: "), "{allowed_plan}");
        let reload = run.cli(&["reload", "--allow-non-restored-state"]);
        let applied = text(&reload);
        assert!(
            reload.status.success(),
            "{}: {applied}\n{}",
            edit.name,
            run.log()
        );
        for line in edit.plan {
            assert!(
                applied.contains(line),
                "{}: outcome lacks `{line}`:\n{applied}",
                edit.name
            );
        }
    } else {
        assert!(
            reload.status.success(),
            "{}: {reload_text}\n{}",
            edit.name,
            run.log()
        );
        assert!(reload_text.starts_with("reload applied"), "{reload_text}");
        for line in edit.plan {
            assert!(
                reload_text.contains(line),
                "{}: outcome lacks `{line}`:\n{reload_text}",
                edit.name
            );
        }
    }
    continues.insert(2, edit.continues);
    run.wait_checkpoints(&["counts"], 2);

    if edit.name == "rename" {
        // Renamed back: the values of `cnt` the first rename dropped must not come back.
        write(
            dir.path(),
            "job.yaml",
            &job("cnt: value", V1, 3, "fs", true),
        );
        let reload = run.cli(&["reload", "--allow-non-restored-state"]);
        let back = text(&reload);
        assert!(reload.status.success(), "{back}\n{}", run.log());
        assert!(
            back.contains("counter       state `cnt` (value) new (starts empty)")
                && back.contains("counter       state `count` (value) dropped"),
            "{back}"
        );
        continues.insert(3, false);
        run.wait_checkpoints(&["counts"], 2);
    }
    let sp = run.stop_with_savepoint("counts");
    run.finish_ok();
    assert!(sp.is_dir());
    check_counts(&committed(&dir.path().join("out")), &continues, edit.name);
}

/// Applying the edit by saving the file under `weir run --watch --allow-non-restored-state`:
/// the outcome's plan has the same lines, and the output agrees.
fn through_watch(edit: &Edit) {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "job.yaml", &v1());
    let mut run = Run::start(
        dir.path(),
        &file,
        &["--watch", "--allow-non-restored-state"],
    );
    run.wait_checkpoints(&["counts"], 2);
    write(dir.path(), "job.yaml", &edit.yaml);
    let status = run.wait_for("the reload outcome", |s| {
        s["last_reload"]["result"]
            .as_str()
            .is_some_and(|r| r != "unchanged")
    });
    let outcome: weir_engine::control::ReloadOutcome =
        serde_json::from_value(status["last_reload"].clone()).unwrap();
    let rendered = weir_engine::api::render_reload(&outcome);
    for line in edit.plan {
        assert!(
            rendered.contains(line),
            "{}: watch outcome lacks `{line}`:\n{rendered}",
            edit.name
        );
    }
    let mut continues = BTreeMap::new();
    if edit.problem.is_some() && !edit.allowed_by_switch {
        assert_eq!(outcome.result, "rejected", "{}: {rendered}", edit.name);
    } else {
        assert_eq!(
            outcome.result,
            "applied",
            "{}: {rendered}\n{}",
            edit.name,
            run.log()
        );
        continues.insert(2, edit.continues);
        run.wait_checkpoints(&["counts"], 2);
    }
    run.terminate();
    check_counts(&committed(&dir.path().join("out")), &continues, edit.name);
}

/// `weir stop --savepoint` of version 1, then `weir run --from-savepoint` of the edit: refused
/// with the plan's problem (before anything is touched) unless the switch helps; otherwise
/// it runs to the end and the output agrees with the plan.
fn through_savepoint(edit: &Edit) {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "job.yaml", &v1());
    let mut run = Run::start(dir.path(), &file, &[]);
    run.wait_checkpoints(&["counts"], 2);
    let sp = run.stop_with_savepoint("counts");
    run.finish_ok();
    let before = committed(&dir.path().join("out"));

    let unlimited = edit.yaml.replace("        rate: 2000\n", "");
    let file = write(dir.path(), "job.yaml", &unlimited);
    let sp_arg = sp.to_str().unwrap();
    let mut continues = BTreeMap::new();
    if let Some(problem) = edit.problem {
        let (ok, log) = run_to_end(dir.path(), &file, &["--from-savepoint", sp_arg]);
        assert!(!ok, "{}: the restore must be refused:\n{log}", edit.name);
        assert!(log.contains(problem), "{}: {log}", edit.name);
        assert_eq!(
            committed(&dir.path().join("out")),
            before,
            "a refused restore touched the output"
        );
        if !edit.allowed_by_switch {
            return;
        }
        let (ok, log) = run_to_end(
            dir.path(),
            &file,
            &["--from-savepoint", sp_arg, "--allow-non-restored-state"],
        );
        assert!(ok, "{}: {log}", edit.name);
        assert!(
            log.contains("State not restored"),
            "{}: the dropped state is logged:\n{log}",
            edit.name
        );
    } else {
        let (ok, log) = run_to_end(dir.path(), &file, &["--from-savepoint", sp_arg]);
        assert!(ok, "{}: {log}", edit.name);
    }
    continues.insert(2, edit.continues);
    let n = check_counts(&committed(&dir.path().join("out")), &continues, edit.name);
    assert_eq!(
        n, 30_000,
        "{}: the restored run reads to the end",
        edit.name
    );
}

fn edit(name: &str) -> Edit {
    edits()
        .into_iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no edit `{name}`"))
}

macro_rules! scenarios {
    ($($test:ident: $edit:literal via $way:ident;)*) => {
        $(
            #[test]
            fn $test() {
                $way(&edit($edit));
            }
        )*
    };
}

scenarios! {
    renamed_state_via_reload: "rename" via through_weir_reload;
    renamed_state_via_watch: "rename" via through_watch;
    renamed_state_via_savepoint: "rename" via through_savepoint;
    kind_change_via_reload: "kind change" via through_weir_reload;
    kind_change_via_watch: "kind change" via through_watch;
    kind_change_via_savepoint: "kind change" via through_savepoint;
    migrated_kind_change_via_reload: "kind change with migrate" via through_weir_reload;
    migrated_kind_change_via_watch: "kind change with migrate" via through_watch;
    migrated_kind_change_via_savepoint: "kind change with migrate" via through_savepoint;
    backend_change_via_reload: "backend change" via through_weir_reload;
    backend_change_via_watch: "backend change" via through_watch;
    backend_change_via_savepoint: "backend change" via through_savepoint;
}
