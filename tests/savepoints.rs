//! Savepoints end to end, through the real `weir` binary, real files, real RocksDB and the
//! real control API: `weir savepoint` / `weir stop --savepoint [--drain]` against a running
//! `weir run --api-port 0`, then `weir run --from-savepoint` into another state backend,
//! another parallelism or a changed pipeline; the restore rules (removed, added and migrated
//! operators, `max_parallelism`, moved and damaged savepoint directories); the API token; and
//! failures around a savepoint (an unwritable savepoint directory, a restored run that dies
//! before its first checkpoint); and the control API's security against the real binary (the
//! file's `api:` section and flag precedence, empty and missing tokens, confined savepoint
//! directories and reload files, cross-site requests, a taken port).
//!
//! Every scenario compares its committed output with a straight, failure-free run of the
//! final pipeline computed by `weir` itself in a separate directory. The keyed pipelines read
//! one generator subtask (the map and `key_by` run at parallelism 1 too), so each key's
//! records reach the reduce in sequence order and its running totals are deterministic: the
//! whole multiset of update lines is compared, not only the last value per key. Only where
//! parallel readers interleave a key's records (byte ranges of one file) are the update count
//! and the final total per key compared instead.
//!
//! No assertion is about time: generators are rate-limited and bounded inputs large, so
//! that a stop lands mid-run (which is asserted), and every wait polls the job's status
//! against a generous deadline (the running harness in `common::run`).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex, OnceLock};

use common::files::{append, copy_dir};
use common::output::{assert_exactly_once, committed};
use common::run::{Run, beside, kill_when, pipeline_of, run_to_end, run_to_end_with};
use serde_json::Value;

/// The keyed pipeline most scenarios use: 30 000 generated records at 6 000/s, per-user
/// running count and total by a Rhai reduce at parallelism 2, an exactly-once file sink,
/// checkpoints every 500 ms. Each update carries the sequence number of the record that
/// produced it (`last`).
const KEYED: &str = r#"version: 1
pipelines:
  - id: totals
    parallelism: 2
    max_parallelism: 128
    state: { backend: fs }
    checkpoints: { mode: exactly_once, interval: 500ms, storage: ck }
    restart: { strategy: none }
    sources:
      - id: gen
        type: generator
        parallelism: 1
        seed: 11
        count: 30000
        rate: 6000
        fields:
          seq: { kind: sequence }
          user: { kind: key, prefix: u, cardinality: 40 }
          amount: { kind: int, min: 1, max: 100 }
    operators:
      - id: shape
        type: map
        input: gen
        parallelism: 1
        script: |
          fn map(r) { #{user: r.user, n: 1, total: r.amount, last: r.seq} }
      - { id: by_user, type: key_by, input: shape, field: user, parallelism: 1 }
      - id: running
        type: reduce
        input: by_user
        emit: updates
        script: |
          fn reduce(acc, r) { #{n: acc.n + 1, total: acc.total + r.total, last: r.last} }
    sinks:
      - { id: out, type: file, input: running, path: out }
"#;

/// Records the keyed pipeline's generator produces.
const COUNT: usize = 30_000;

/// Stop a rate-limited run once its source produced this many records (and a checkpoint
/// completed): far from both ends of the input.
const STOP_AFTER: u64 = 3_000;

// ---------------------------------------------------------------------------------------
// Driving the binary
// ---------------------------------------------------------------------------------------

/// Replaces `from` by `to` in `text`, which must contain it.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the pipeline text has no `{from}`:\n{text}"
    );
    text.replace(from, to)
}

/// `text` without its rate limits (a straight run needs none: the rate only paces it).
fn unlimited(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("rate:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn write_yaml(dir: &Path, text: &str) -> PathBuf {
    let yaml = dir.join("job.yaml");
    std::fs::write(&yaml, text).expect("write the pipeline file");
    yaml
}

// ---------------------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------------------

fn parse(line: &str) -> Value {
    serde_json::from_str(line).expect("a canonical JSON line")
}

/// The `last` field (the sequence number of the record behind an update).
fn last(line: &str) -> i64 {
    parse(line)["last"]
        .as_i64()
        .unwrap_or_else(|| panic!("no `last` in {line}"))
}

fn filter(lines: &[String], keep: impl Fn(&str) -> bool) -> Vec<String> {
    lines.iter().filter(|l| keep(l)).cloned().collect()
}

/// Sorted union of two multisets of lines.
fn union(a: &[String], b: &[String]) -> Vec<String> {
    let mut v: Vec<String> = a.iter().chain(b).cloned().collect();
    v.sort();
    v
}

/// `all` minus `part` as multisets; `part` must be contained in `all`.
fn minus(all: &[String], part: &[String]) -> Vec<String> {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for l in all {
        *counts.entry(l).or_default() += 1;
    }
    for l in part {
        let c = counts.entry(l).or_default();
        *c -= 1;
        assert!(*c >= 0, "`{l}` is not (or not as often) in the larger set");
    }
    let mut out = Vec::new();
    for (l, c) in counts {
        for _ in 0..c {
            out.push(l.to_owned());
        }
    }
    out
}

/// Asserts that the committed output of a stopped keyed run is exactly the updates of the
/// records `0..n` (each once): stop-with-savepoint left a clean prefix. Returns `n`.
fn assert_clean_prefix(lines: &[String]) -> usize {
    let n = lines.len();
    assert!(
        n > 0 && n < COUNT,
        "the stop should land mid-run, but {n} of {COUNT} updates were committed"
    );
    let seen: BTreeSet<i64> = lines.iter().map(|l| last(l)).collect();
    let expected: BTreeSet<i64> = (0..n as i64).collect();
    assert_eq!(
        seen, expected,
        "the committed output is not the updates of records 0..{n}, each once"
    );
    n
}

/// The committed output of every sink directory in `sinks` after a straight, failure-free
/// run of `text` in a directory of its own (with `setup` preparing its input first).
/// Cached by pipeline text: several scenarios share a final pipeline.
fn straight_with(
    text: &str,
    sinks: &[&str],
    setup: impl FnOnce(&Path),
) -> BTreeMap<String, Vec<String>> {
    type Cache = Mutex<HashMap<String, Arc<OnceLock<BTreeMap<String, Vec<String>>>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = format!("{text}\n{sinks:?}");
    let cell = {
        let mut cache = CACHE
            .get_or_init(Cache::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(cache.entry(key).or_default())
    };
    cell.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        setup(dir.path());
        let yaml = write_yaml(dir.path(), text);
        let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
        assert!(ok, "the straight run failed:\n{log}");
        sinks
            .iter()
            .map(|s| ((*s).to_owned(), committed(&dir.path().join(s))))
            .collect()
    })
    .clone()
}

/// The committed output of sink directory `out` after a straight run of `text`.
fn straight(text: &str) -> Vec<String> {
    straight_with(text, &["out"], |_| {})
        .remove("out")
        .expect("the sink was read")
}

/// The keyed pipeline on `backend` (RocksDB with incremental checkpoints: its savepoints
/// must still be self-contained).
fn keyed(backend: &str) -> String {
    let state = match backend {
        "rocksdb" => "backend: rocksdb, incremental: true".to_owned(),
        other => format!("backend: {other}"),
    };
    edit(KEYED, "backend: fs", &state)
}

/// Runs `text` in `dir` until mid-run and stops it with a savepoint: the savepoint and the
/// number of records whose updates were committed (a clean prefix, checked).
fn run_and_stop_with_savepoint(dir: &Path, text: &str) -> (PathBuf, usize) {
    let yaml = write_yaml(dir, text);
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_mid_run("totals", STOP_AFTER);
    let savepoint = run.stop_with_savepoint("totals");
    let log = run.finish_ok();
    assert!(
        savepoint.starts_with(dir.join(".weir").join("savepoints"))
            && savepoint
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("savepoint-totals-")),
        "unexpected savepoint location `{}`",
        savepoint.display()
    );
    let first = committed(&dir.join("out"));
    let n = assert_clean_prefix(&first);
    assert!(log.contains("Savepoint written."), "{log}");
    (savepoint, n)
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

// ---------------------------------------------------------------------------------------
// 1. Every backend pair
// ---------------------------------------------------------------------------------------

/// Stop-with-savepoint on one backend, `--from-savepoint` on another, for all six ordered
/// pairs of memory, fs and rocksdb: the output equals a straight run on the target backend.
#[test]
fn a_savepoint_restores_into_every_other_backend() {
    let backends = ["memory", "fs", "rocksdb"];
    for from in backends {
        for to in backends {
            if from == to {
                continue;
            }
            let dir = tempfile::tempdir().expect("tempdir");
            let (savepoint, _) = run_and_stop_with_savepoint(dir.path(), &keyed(from));
            let yaml = write_yaml(dir.path(), &unlimited(&keyed(to)));
            let (ok, log) =
                run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&savepoint)]);
            assert!(ok, "{from} -> {to}: the restore failed:\n{log}");
            assert!(
                log.contains("Restoring from a savepoint"),
                "{from} -> {to}:\n{log}"
            );
            assert_exactly_once(
                &committed(&dir.path().join("out")),
                &straight(&unlimited(&keyed(to))),
                &format!("{from} -> {to}"),
            );
        }
    }
}

/// A savepoint taken while RocksDB writes incremental checkpoints (kept to the default one)
/// does not leave the next checkpoints pointing at shared SSTs that retention deleted: after
/// more checkpoints and a SIGKILL, the run resumes from its latest checkpoint and the output
/// equals the straight run.
#[test]
fn incremental_rocksdb_checkpoints_after_a_savepoint_still_restore() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = keyed("rocksdb");
    let yaml = write_yaml(dir.path(), &text);
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_mid_run("totals", STOP_AFTER);
    let out = run.cli(&["savepoint", "totals"]);
    run.savepoint_path(&out, "weir savepoint");
    run.wait_checkpoints(&["totals"], 3);
    run.kill();
    let yaml = write_yaml(dir.path(), &unlimited(&text));
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "the resumed run failed:\n{log}");
    assert!(
        log.contains("restored_from=") && !log.contains("restored_from=nothing"),
        "the second run did not resume from a checkpoint:\n{log}"
    );
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &straight(&unlimited(&text)),
        "savepoint, checkpoints, SIGKILL, resume",
    );
}

/// A pipeline `p` counting clicks per user (`u<i % 4>`) of a followed `in.jsonl` into `out`,
/// exactly-once with 50 ms checkpoints; `settings` go before its checkpoints (state backend,
/// parallelism).
fn clicks_job(settings: &str) -> String {
    const JOB: &str = r#"version: 1
pipelines:
  - id: p
    SETTINGS
    checkpoints: { mode: exactly_once, interval: 50ms }
    sources:
      - { id: lines, type: file, path: in.jsonl, follow: true }
    operators:
      - { id: by_user, type: key_by, input: lines, field: user }
      - id: running
        type: process
        input: by_user
        state: { clicks: value }
        script: |
          fn process(r) {
              let n = state_get("clicks");
              if n == () { n = 0; }
              state_set("clicks", n + 1);
              emit(#{user: r.user, clicks: n + 1, i: r.i});
          }
    sinks:
      - { id: out, type: file, input: running, path: out }
"#;
    JOB.replace("SETTINGS", settings)
}

/// The output of [`clicks_job`] over lines `0..n`: every line once, each user's clicks
/// counted on.
fn assert_clicks_once(dir: &Path, n: i64) {
    let lines = committed(&dir.join("out"));
    let mut seen: Vec<i64> = lines
        .iter()
        .map(|l| parse(l)["i"].as_i64().unwrap_or(-1))
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{lines:#?}");
    for l in &lines {
        let v = parse(l);
        let i = v["i"].as_i64().unwrap_or(-1);
        assert_eq!(v["clicks"].as_i64(), Some(i / 4 + 1), "{l}");
    }
}

/// `weir stop` without a savepoint, then `weir run` again, five times over a followed file
/// with lines appended before each run: every run resumes from a checkpoint that holds the
/// keyed state and the file position. (A checkpoint that completed after the tasks were told
/// to stop used to record them all as finished, with no state: the next run then restored
/// nothing and never read the file again.) Checkpoints every 50 ms make such a late
/// checkpoint likely in every cycle.
#[test]
fn stopping_without_a_savepoint_and_running_again_keeps_state_and_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = clicks_job("state: { backend: rocksdb, incremental: true }");
    let text = text.as_str();
    let yaml = write_yaml(dir.path(), text);
    const PER_RUN: usize = 20;
    for cycle in 0..5 {
        let lines: String = (cycle * PER_RUN..(cycle + 1) * PER_RUN)
            .map(|i| format!("{{\"user\":\"u{}\",\"i\":{i}}}\n", i % 4))
            .collect();
        append(&dir.path().join("in.jsonl"), &lines);
        let mut run = Run::start(beside(&yaml), &yaml, &[]);
        run.wait_for("this run's lines read and a checkpoint after them", |s| {
            let p = pipeline_of(s, "p");
            p["source_records"].as_u64().unwrap_or(0) >= PER_RUN as u64
                && p["checkpoints"].as_u64().unwrap_or(0) >= 3
        });
        let out = run.cli(&["stop", "p"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = run.finish_ok();
        if cycle > 0 {
            assert!(
                !log.contains("restored_from=nothing"),
                "cycle {cycle}: the run did not resume from a checkpoint:\n{log}"
            );
        }
    }
    // Every line once, and each user's clicks counted on across the five runs.
    assert_clicks_once(dir.path(), 5 * PER_RUN as i64);
}

/// A hot reload of a RocksDB pipeline, then more input and checkpoints. The new version takes
/// over the old version's open RocksDB instances (the reload's hand-over); the start of every
/// version used to remove their working directories as if a killed process had left them,
/// so the first checkpoint after any such reload failed and the reload rolled back.
#[test]
fn a_reloaded_rocksdb_pipeline_checkpoints_on_the_instances_it_took_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = clicks_job("parallelism: 2\n    state: { backend: rocksdb }");
    let text = text.as_str();
    let lines = |from: i64, to: i64| -> String {
        (from..to)
            .map(|i| format!("{{\"user\":\"u{}\",\"i\":{i}}}\n", i % 4))
            .collect()
    };
    let yaml = write_yaml(dir.path(), text);
    append(&dir.path().join("in.jsonl"), &lines(0, 40));
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_for("the first lines read and checkpointed", |s| {
        let p = pipeline_of(s, "p");
        p["source_records"].as_u64().unwrap_or(0) >= 40
            && p["checkpoints"].as_u64().unwrap_or(0) >= 3
    });
    // An edit that keeps every operator and its state: the instances are handed over.
    write_yaml(
        dir.path(),
        &text.replace("interval: 50ms", "interval: 60ms"),
    );
    let out = run.cli(&["reload"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.contains("reload applied"),
        "the reload did not apply:\n{said}"
    );
    let checkpoints = run
        .status()
        .map(|s| pipeline_of(&s, "p")["checkpoints"].as_u64().unwrap_or(0))
        .unwrap_or(0);
    append(&dir.path().join("in.jsonl"), &lines(40, 80));
    run.wait_for(
        "the new lines read and checkpointed by the new version",
        |s| {
            let p = pipeline_of(s, "p");
            p["source_records"].as_u64().unwrap_or(0) >= 80
                && p["checkpoints"].as_u64().unwrap_or(0) >= checkpoints + 3
        },
    );
    let out = run.cli(&["stop", "p"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = run.finish_ok();
    assert!(
        !log.contains("Checkpoint failed") && !log.contains("rolled back"),
        "{log}"
    );
    // Every line once, each user's clicks counted on across the reload.
    assert_clicks_once(dir.path(), 80);
}

// ---------------------------------------------------------------------------------------
// 2. Rescale 1 -> 3 -> 2
// ---------------------------------------------------------------------------------------

/// A file-to-file pipeline reading a directory in follow mode: the file source (several
/// files, split over its readers), the keyed reduce and the sink all run at `parallelism`.
/// Each key lives in one file, so its records arrive in file order at any parallelism.
fn files_job(parallelism: u32) -> String {
    format!(
        r#"version: 1
pipelines:
  - id: files
    parallelism: {parallelism}
    max_parallelism: 128
    state: {{ backend: rocksdb }}
    checkpoints: {{ mode: exactly_once, interval: 500ms, storage: ck }}
    restart: {{ strategy: none }}
    sources:
      - {{ id: src, type: file, path: in, follow: true }}
    operators:
      - id: shape
        type: map
        input: src
        script: |
          fn map(r) {{ #{{k: r.k, n: 1, total: r.v, last: r.i}} }}
      - {{ id: by_k, type: key_by, input: shape, field: k }}
      - id: running
        type: reduce
        input: by_k
        emit: updates
        script: |
          fn reduce(acc, r) {{ #{{n: acc.n + 1, total: acc.total + r.total, last: r.last}} }}
    sinks:
      - {{ id: out, type: file, input: running, path: out }}
"#
    )
}

/// Appends lines `from..to` of input file `name` (content depends only on name and line).
fn append_lines(dir: &Path, name: &str, from: usize, to: usize) {
    let seed: usize = name.bytes().map(usize::from).sum();
    let mut text = String::new();
    for i in from..to {
        text.push_str(&format!(
            "{{\"k\":\"{name}-{}\",\"i\":{i},\"v\":{}}}\n",
            i % 7,
            (i * 37 + seed * 11) % 101
        ));
    }
    append(&dir.join("in").join(format!("{name}.jsonl")), &text);
}

/// Starts `parallelism` (from `savepoint` when given), waits until `target` records reached
/// the sink when given (else any), stops with a savepoint.
fn files_step(
    dir: &Path,
    parallelism: u32,
    savepoint: Option<&Path>,
    target: Option<u64>,
) -> PathBuf {
    let yaml = write_yaml(dir, &files_job(parallelism));
    let extra: Vec<&str> = match savepoint {
        Some(sp) => vec!["--from-savepoint", arg(sp)],
        None => Vec::new(),
    };
    let mut run = Run::start(beside(&yaml), &yaml, &extra);
    run.wait_for(&format!("step at parallelism {parallelism}"), |s| {
        let p = pipeline_of(s, "files");
        let sunk = p["sink_records"].as_u64().unwrap_or(0);
        p["checkpoints"].as_u64().unwrap_or(0) >= 1 && target.map_or(sunk > 0, |t| sunk >= t)
    });
    let sp = run.stop_with_savepoint("files");
    run.finish_ok();
    sp
}

/// Appends `n` lines to input file `name`, keeping count in `lines`.
fn grow(dir: &Path, lines: &mut BTreeMap<&'static str, usize>, name: &'static str, n: usize) {
    let have = lines.entry(name).or_default();
    append_lines(dir, name, *have, *have + n);
    *have += n;
}

#[test]
fn rescaling_1_to_3_to_2_with_a_split_file_source_equals_the_straight_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // The input grows between the runs: files get longer (their readers resume mid-file)
    // and new files appear (follow mode assigns them to readers across rescales).
    let mut lines: BTreeMap<&'static str, usize> = BTreeMap::new();
    for f in ["a", "b", "c"] {
        grow(d, &mut lines, f, 1500);
    }
    let total = |lines: &BTreeMap<&str, usize>| lines.values().sum::<usize>();

    // Parallelism 1; stopped wherever it is once output flows.
    let sp1 = files_step(d, 1, None, None);
    let done1 = committed(&d.join("out")).len();
    assert!(done1 > 0 && done1 <= total(&lines));

    for f in ["a", "c"] {
        grow(d, &mut lines, f, 500);
    }
    for f in ["d", "e"] {
        grow(d, &mut lines, f, 1500);
    }
    let sp2 = files_step(d, 3, Some(&sp1), Some((total(&lines) - done1) as u64));
    assert_eq!(committed(&d.join("out")).len(), total(&lines));

    let done2 = total(&lines);
    for f in ["b", "d"] {
        grow(d, &mut lines, f, 500);
    }
    grow(d, &mut lines, "f", 1500);
    files_step(d, 2, Some(&sp2), Some((total(&lines) - done2) as u64));
    let got = committed(&d.join("out"));

    // The straight run: the final files from the start, at the final parallelism, stopped
    // (with a savepoint, so that everything is committed) once every line went through.
    let straight_dir = tempfile::tempdir().expect("tempdir");
    let s = straight_dir.path();
    for (name, n) in &lines {
        append_lines(s, name, 0, *n);
    }
    files_step(s, 2, None, Some(total(&lines) as u64));
    let want = committed(&s.join("out"));
    assert_eq!(want.len(), total(&lines));
    assert_exactly_once(&got, &want, "rescaled 1 -> 3 -> 2");
}

/// The same pipeline over a bounded input: the split plan (files dealt out to readers, and
/// files above 1 MiB cut into line-aligned byte ranges when readers outnumber files) is
/// list state, which a rescale redistributes (old reader `j`'s splits go to `j % p`).
fn bounded_files_job(parallelism: u32) -> String {
    edit(&files_job(parallelism), "follow: true", "follow: false")
}

/// Per key: its update count, and the total of its last update (the sum over its records).
/// Checks on the way that each key's updates are numbered `1..=count`, each once. Readers
/// of byte ranges of one file interleave a key's records in any order, so the intermediate
/// totals differ between runs; the count and the final total do not.
fn final_totals(lines: &[String]) -> BTreeMap<String, (i64, i64)> {
    let mut by_key: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for l in lines {
        let v = parse(l);
        by_key
            .entry(v["key"].as_str().expect("a key").to_owned())
            .or_default()
            .push((
                v["n"].as_i64().expect("n"),
                v["total"].as_i64().expect("total"),
            ));
    }
    by_key
        .into_iter()
        .map(|(key, mut updates)| {
            updates.sort_unstable();
            let numbers: Vec<i64> = updates.iter().map(|u| u.0).collect();
            let expected: Vec<i64> = (1..=updates.len() as i64).collect();
            assert_eq!(numbers, expected, "the updates of key {key}");
            let last = updates.last().map_or(0, |u| u.1);
            (key, (updates.len() as i64, last))
        })
        .collect()
}

/// Scaling down merges the readers' split lists: 3 readers (a file above 1 MiB cut into
/// byte ranges, as there are fewer files than readers), then 2, then 1.
#[test]
fn rescaling_a_bounded_split_file_source_3_to_2_to_1_equals_the_straight_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let mut lines: BTreeMap<&'static str, usize> = BTreeMap::new();
    grow(d, &mut lines, "a", 240_000);
    grow(d, &mut lines, "b", 30_000);
    let big = std::fs::metadata(d.join("in").join("a.jsonl")).expect("the big file");
    assert!(big.len() > 1 << 20, "the big file is cut into ranges");
    let total: usize = lines.values().sum();
    let step = |parallelism: u32, savepoint: Option<&Path>| -> PathBuf {
        let yaml = write_yaml(d, &bounded_files_job(parallelism));
        let extra: Vec<&str> = match savepoint {
            Some(sp) => vec!["--from-savepoint", arg(sp)],
            None => Vec::new(),
        };
        let mut run = Run::start(beside(&yaml), &yaml, &extra);
        // Stopped as soon as output flows: far from the end of the input.
        run.wait_for(&format!("output at parallelism {parallelism}"), |s| {
            pipeline_of(s, "files")["sink_records"]
                .as_u64()
                .unwrap_or(0)
                > 0
        });
        let sp = run.stop_with_savepoint("files");
        run.finish_ok();
        let done = committed(&d.join("out")).len();
        assert!(
            done < total,
            "the run at parallelism {parallelism} should stop mid-input ({done} of {total})"
        );
        sp
    };
    let sp3 = step(3, None);
    let sp2 = step(2, Some(&sp3));
    let yaml = write_yaml(d, &bounded_files_job(1));
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&sp2)]);
    assert!(ok, "{log}");
    let got = committed(&d.join("out"));
    assert_eq!(got.len(), total, "one update per input line, each once");

    let want = straight_with(&bounded_files_job(1), &["out"], |s| {
        for (name, n) in &lines {
            append_lines(s, name, 0, *n);
        }
    });
    assert_eq!(want["out"].len(), total);
    assert_eq!(
        final_totals(&got),
        final_totals(&want["out"]),
        "per key: count and final total"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Restore rules
// ---------------------------------------------------------------------------------------

/// The keyed pipeline without its reduce: the sink takes the map's records.
fn without_reduce() -> String {
    let text = edit(
        KEYED,
        r#"      - id: running
        type: reduce
        input: by_user
        emit: updates
        script: |
          fn reduce(acc, r) { #{n: acc.n + 1, total: acc.total + r.total, last: r.last} }
"#,
        "",
    );
    edit(&text, "input: running", "input: by_user")
}

#[test]
fn state_of_a_removed_operator_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (savepoint, n) = run_and_stop_with_savepoint(dir.path(), KEYED);
    let before = committed(&dir.path().join("out"));
    let final_text = unlimited(&without_reduce());
    let yaml = write_yaml(dir.path(), &final_text);

    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&savepoint)]);
    assert!(
        !ok,
        "restoring state of a removed operator must fail:\n{log}"
    );
    for needle in ["`running`", "--allow-non-restored-state", "no longer has"] {
        assert!(log.contains(needle), "missing `{needle}` in:\n{log}");
    }
    assert_eq!(
        committed(&dir.path().join("out")),
        before,
        "a refused restore touches no output"
    );

    let (ok, log) = run_to_end(
        beside(&yaml),
        &yaml,
        &[
            "--from-savepoint",
            arg(&savepoint),
            "--allow-non-restored-state",
        ],
    );
    assert!(ok, "{log}");
    assert!(
        log.contains("`running`"),
        "the dropped state is named:\n{log}"
    );
    // The new records are those after the savepoint, through the new pipeline.
    let new = minus(&committed(&dir.path().join("out")), &before);
    let want = filter(&straight(&final_text), |l| last(l) >= n as i64);
    assert_eq!(want.len(), COUNT - n);
    assert_exactly_once(&new, &want, "after dropping the reduce's state");
}

#[test]
fn a_changed_max_parallelism_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (savepoint, _) = run_and_stop_with_savepoint(dir.path(), KEYED);
    let before = committed(&dir.path().join("out"));
    let yaml = write_yaml(
        dir.path(),
        &edit(KEYED, "max_parallelism: 128", "max_parallelism: 256"),
    );
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&savepoint)]);
    assert!(!ok, "a changed max_parallelism must be refused:\n{log}");
    for needle in ["max_parallelism 128", "now has 256", "key groups"] {
        assert!(log.contains(needle), "missing `{needle}` in:\n{log}");
    }
    assert_eq!(committed(&dir.path().join("out")), before);

    // A generator cannot change its parallelism either (its sequence is interleaved over
    // its subtasks); the reason is given.
    let yaml = write_yaml(
        dir.path(),
        &edit(
            KEYED,
            "type: generator\n        parallelism: 1",
            "type: generator\n        parallelism: 2",
        ),
    );
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&savepoint)]);
    assert!(!ok, "a rescaled generator must be refused:\n{log}");
    assert!(
        log.contains("a generator cannot change its parallelism"),
        "{log}"
    );
    assert_eq!(committed(&dir.path().join("out")), before);
}

/// `(key, amount)` of every generated record, by sequence number, recovered from the keyed
/// pipeline's straight output (an update's total minus the key's previous total).
fn records_from_updates(lines: &[String]) -> BTreeMap<i64, (String, i64)> {
    let mut by_key: BTreeMap<String, Vec<(i64, i64, i64)>> = BTreeMap::new();
    for l in lines {
        let v = parse(l);
        let key = v["key"].as_str().expect("a key").to_owned();
        let n = v["n"].as_i64().expect("n");
        by_key
            .entry(key)
            .or_default()
            .push((n, v["total"].as_i64().expect("total"), last(l)));
    }
    let mut out = BTreeMap::new();
    for (key, mut updates) in by_key {
        updates.sort_unstable();
        let mut previous = 0;
        for (_, total, seq) in updates {
            out.insert(seq, (key.clone(), total - previous));
            previous = total;
        }
    }
    out
}

#[test]
fn a_new_keyed_operator_starts_empty_and_the_old_one_keeps_its_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (savepoint, n) = run_and_stop_with_savepoint(dir.path(), KEYED);
    let final_text = unlimited(&edit(
        KEYED,
        "    sinks:\n",
        r#"      - id: counts
        type: aggregate
        input: by_user
        emit: updates
        aggregations:
          - { fn: count, as: n }
          - { fn: sum, field: total, as: s }
    sinks:
      - { id: counts_out, type: file, input: counts, path: counts_out }
"#,
    ));
    let yaml = write_yaml(dir.path(), &final_text);
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&savepoint)]);
    assert!(ok, "{log}");

    let want = straight_with(&final_text, &["out", "counts_out"], |_| {});
    // The old reduce kept its state: its output is the straight run's.
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &want["out"],
        "the old reduce",
    );
    // The new aggregate started empty at the savepoint: per key, count and sum over the
    // records after it only.
    let records = records_from_updates(&want["out"]);
    assert_eq!(records.len(), COUNT);
    let mut acc: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    let mut expected = Vec::new();
    for (_, (key, amount)) in records.range(n as i64..) {
        let a = acc.entry(key.as_str()).or_default();
        a.0 += 1;
        a.1 += amount;
        expected.push(serde_json::json!({"key": key, "n": a.0, "s": a.1}).to_string());
    }
    expected.sort();
    assert_exactly_once(
        &committed(&dir.path().join("counts_out")),
        &expected,
        "the new aggregate",
    );
    // Sanity: a straight run of the new aggregate counts from the first record.
    assert_eq!(want["counts_out"].len(), COUNT);
}

/// The keyed pipeline with the accumulator's `total` renamed `sum`, and a `migrate` that
/// rewrites old accumulators.
fn migrated() -> String {
    let text = edit(
        KEYED,
        "fn map(r) { #{user: r.user, n: 1, total: r.amount, last: r.seq} }",
        "fn map(r) { #{user: r.user, n: 1, sum: r.amount, last: r.seq} }",
    );
    edit(
        &text,
        "          fn reduce(acc, r) { #{n: acc.n + 1, total: acc.total + r.total, last: r.last} }\n",
        "          fn reduce(acc, r) { #{n: acc.n + 1, sum: acc.sum + r.sum, last: r.last} }\n          fn migrate(old) { #{n: old.n, sum: old.total, last: old.last} }\n",
    )
}

#[test]
fn migrate_rewrites_restored_state_once_when_the_script_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sp1, n) = run_and_stop_with_savepoint(dir.path(), KEYED);

    // The new script: every restored accumulator goes through `migrate`.
    let yaml = write_yaml(dir.path(), &migrated());
    let mut run = Run::start(beside(&yaml), &yaml, &["--from-savepoint", arg(&sp1)]);
    run.wait_for("the migrated run to process", |s| {
        let p = pipeline_of(s, "totals");
        p["checkpoints"].as_u64().unwrap_or(0) >= 1
            && p["source_records"].as_u64().unwrap_or(0) >= STOP_AFTER
    });
    let sp2 = run.stop_with_savepoint("totals");
    let log = run.finish_ok();
    assert!(
        log.contains("Migrated restored state through `fn migrate`."),
        "the changed script migrates:\n{log}"
    );

    // The same script again: no second migration (it would turn `sum` into `()` and fail).
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&sp2)]);
    assert!(ok, "{log}");
    assert!(
        !log.contains("Migrated restored state"),
        "the same script must not migrate again:\n{log}"
    );

    // Before the first savepoint: the old script's updates; after it: the new script's,
    // continuing from the migrated totals.
    let old = filter(&straight(&unlimited(KEYED)), |l| last(l) < n as i64);
    let new = filter(&straight(&unlimited(&migrated())), |l| last(l) >= n as i64);
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &union(&old, &new),
        "migrated",
    );
}

// ---------------------------------------------------------------------------------------
// 4. Stop one pipeline of two
// ---------------------------------------------------------------------------------------

/// A second pipeline, without checkpoints.
const BETA: &str = r#"  - id: beta
    parallelism: 1
    restart: { strategy: none }
    sources:
      - id: gen
        type: generator
        seed: 3
        count: 24000
        rate: 4000
        fields:
          seq: { kind: sequence }
          v: { kind: int, min: 0, max: 1000 }
    operators:
      - id: double
        type: map
        input: gen
        script: |
          fn map(r) { r.w = r.v * 2; r }
    sinks:
      - { id: out, type: file, input: double, path: out_beta }
"#;

#[test]
fn stopping_one_pipeline_with_a_savepoint_leaves_the_other_running() {
    let text = format!(
        "{}{BETA}",
        edit(
            &edit(KEYED, "id: totals", "id: alpha"),
            "path: out }",
            "path: out_alpha }"
        )
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = write_yaml(dir.path(), &text);
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_mid_run("alpha", STOP_AFTER);
    let savepoint = run.stop_with_savepoint("alpha");
    assert!(
        savepoint
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("savepoint-alpha-")),
        "{}",
        savepoint.display()
    );
    let status = run.status().expect("the job still answers");
    assert_eq!(
        pipeline_of(&status, "alpha")["state"],
        "stopped",
        "{status}"
    );
    assert_eq!(pipeline_of(&status, "beta")["state"], "running", "{status}");
    let beta_before = pipeline_of(&status, "beta")["source_records"]
        .as_u64()
        .unwrap_or(0);
    assert!(beta_before < 24_000, "beta is mid-run: {status}");
    // A pipeline without checkpoints cannot take a savepoint, and says why.
    let out = run.cli(&["savepoint", "beta"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("takes no checkpoints"), "{stderr}");

    let log = run.finish_ok();
    assert!(
        !log.contains("FAILED"),
        "both pipelines end without error:\n{log}"
    );
    let want = straight_with(&unlimited(&text), &["out_alpha", "out_beta"], |_| {});
    assert_eq!(want["out_beta"].len(), 24_000);
    assert_exactly_once(
        &committed(&dir.path().join("out_beta")),
        &want["out_beta"],
        "beta, which ran to its end",
    );
    let alpha = committed(&dir.path().join("out_alpha"));
    let n = assert_clean_prefix(&alpha);
    assert_exactly_once(
        &alpha,
        &filter(&want["out_alpha"], |l| last(l) < n as i64),
        "alpha, stopped at its savepoint",
    );

    // The whole file again with alpha's savepoint (matched to alpha by its metadata):
    // alpha resumes where it stopped, beta starts over; both outputs are the straight ones.
    let yaml = write_yaml(dir.path(), &unlimited(&text));
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&savepoint)]);
    assert!(ok, "{log}");
    assert_exactly_once(
        &committed(&dir.path().join("out_alpha")),
        &want["out_alpha"],
        "alpha, resumed",
    );
    assert_exactly_once(
        &committed(&dir.path().join("out_beta")),
        &want["out_beta"],
        "beta, run again",
    );
}

// ---------------------------------------------------------------------------------------
// 5. Drain
// ---------------------------------------------------------------------------------------

const FINAL_AGGREGATE: &str = r#"version: 1
pipelines:
  - id: agg
    parallelism: 2
    max_parallelism: 128
    state: { backend: rocksdb }
    checkpoints: { mode: exactly_once, interval: 500ms, storage: ck }
    restart: { strategy: none }
    savepoints: { dir: kept }
    sources:
      - id: gen
        type: generator
        parallelism: 1
        seed: 5
        count: 30000
        rate: 6000
        fields:
          seq: { kind: sequence }
          user: { kind: key, prefix: u, cardinality: 40 }
    operators:
      - { id: by_user, type: key_by, input: gen, field: user }
      - id: totals
        type: aggregate
        input: by_user
        emit: final
        aggregations:
          - { fn: count, as: n }
          - { fn: sum, field: seq, as: s }
    sinks:
      - { id: out, type: file, input: totals, path: out }
"#;

#[test]
fn stop_with_drain_flushes_final_results_into_the_committed_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = write_yaml(dir.path(), FINAL_AGGREGATE);
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_mid_run("agg", STOP_AFTER);
    assert!(
        committed(&dir.path().join("out")).is_empty(),
        "`emit: final` emits nothing before the end"
    );
    let out = run.cli(&["stop", "agg", "--savepoint", "--drain"]);
    let savepoint = run.savepoint_path(&out, "weir stop --savepoint --drain");
    assert!(
        savepoint.starts_with(dir.path().join("kept")),
        "the savepoint goes to `savepoints.dir`: {}",
        savepoint.display()
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("drained and stopped"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The stop answered once the pipeline ended: the final results are committed.
    let got = committed(&dir.path().join("out"));
    let n: i64 = got
        .iter()
        .map(|l| parse(l)["n"].as_i64().expect("a count"))
        .sum();
    assert!(
        n >= STOP_AFTER as i64 && n < COUNT as i64,
        "the drain ends the input where the savepoint was taken: {n} records"
    );
    let log = run.finish_ok();
    assert!(log.contains("draining"), "{log}");
    // A straight run over exactly the records before the drain gives the same results.
    let want = straight(&unlimited(&edit(
        FINAL_AGGREGATE,
        "count: 30000",
        &format!("count: {n}"),
    )));
    assert_exactly_once(&got, &want, "drained final results");
}

// ---------------------------------------------------------------------------------------
// 6. The API token
// ---------------------------------------------------------------------------------------

fn assert_unauthorized(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(
        stderr.contains("unauthorized") && stderr.contains("token"),
        "{what}: {stderr}"
    );
}

#[test]
fn mutating_calls_need_the_api_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = write_yaml(dir.path(), KEYED);
    let mut run = Run::start(beside(&yaml), &yaml, &["--api-token", "secret"]);
    run.wait_mid_run("totals", STOP_AFTER);

    assert_unauthorized(
        &run.cli(&["savepoint", "totals"]),
        "savepoint without token",
    );
    assert_unauthorized(
        &run.cli(&["savepoint", "totals", "--token", "wrong"]),
        "savepoint with a wrong token",
    );
    assert_unauthorized(
        &run.cli_env(
            &["stop", "totals", "--savepoint"],
            &[("WEIR_API_TOKEN", "nope")],
        ),
        "stop with a wrong token",
    );
    let status = run.cli(&["status"]);
    assert!(
        status.status.success(),
        "status needs no token: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(String::from_utf8_lossy(&status.stdout).contains("totals"));
    assert_eq!(
        run.pipeline("totals")["state"],
        "running",
        "refused calls change nothing"
    );
    assert!(
        !dir.path().join(".weir").join("savepoints").exists(),
        "refused calls take no savepoint"
    );

    let out = run.cli(&["savepoint", "totals", "--token", "secret"]);
    let savepoint = run.savepoint_path(&out, "savepoint with the token");
    assert!(savepoint.starts_with(dir.path().join(".weir").join("savepoints")));
    assert_eq!(run.pipeline("totals")["state"], "running");

    let out = run.cli_env(
        &["stop", "totals", "--savepoint"],
        &[("WEIR_API_TOKEN", "secret")],
    );
    let stopped_at = run.savepoint_path(&out, "stop with the token from the environment");
    run.finish_ok();
    assert_clean_prefix(&committed(&dir.path().join("out")));

    let (ok, log) = run_to_end(
        beside(&yaml),
        &yaml,
        &["--from-savepoint", arg(&stopped_at)],
    );
    assert!(ok, "{log}");
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &straight(&unlimited(KEYED)),
        "after the token-guarded stop",
    );
}

// ---------------------------------------------------------------------------------------
// 7. Moved and damaged savepoints
// ---------------------------------------------------------------------------------------

#[test]
fn a_moved_savepoint_restores_and_a_damaged_one_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let yaml = write_yaml(d, KEYED);
    // A savepoint mid-run, then the run goes on (committing more output) and is stopped
    // without one: restoring the savepoint rolls the output back to it.
    // A directory outside the savepoint root needs --allow-any-savepoint-dir.
    let mut run = Run::start(beside(&yaml), &yaml, &["--allow-any-savepoint-dir"]);
    run.wait_mid_run("totals", STOP_AFTER);
    let custom = d.join("custom");
    let out = run.cli(&["savepoint", "totals", "--dir", arg(&custom)]);
    let savepoint = run.savepoint_path(&out, "weir savepoint --dir");
    assert!(savepoint.starts_with(&custom), "{}", savepoint.display());
    run.stop_after_checkpoints("totals", 2, "two more checkpoints after the savepoint");
    let before = committed(&d.join("out"));
    assert!(!before.is_empty() && before.len() < COUNT);

    // Move the savepoint elsewhere under another name, and drop the checkpoint storage.
    let moved = d.join("elsewhere").join("kept");
    std::fs::create_dir_all(d.join("elsewhere")).expect("mkdir");
    std::fs::rename(&savepoint, &moved).expect("move the savepoint");
    std::fs::remove_dir_all(d.join("ck")).expect("remove the checkpoint storage");

    // A copy with one state file damaged (same size, other bytes).
    let damaged = d.join("damaged");
    copy_dir(&moved, &damaged);
    let victim = std::fs::read_dir(&damaged)
        .expect("list the savepoint")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .flat_map(|chk| std::fs::read_dir(chk).expect("list chk-N"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|x| x == "keyed")
                && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        })
        .expect("a non-empty keyed state file");
    let mut bytes = std::fs::read(&victim).expect("read the state file");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&victim, &bytes).expect("damage the state file");
    let name = victim
        .file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned();
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&damaged)]);
    assert!(!ok, "a damaged savepoint must be refused:\n{log}");
    assert!(log.contains(&name), "the message names `{name}`:\n{log}");

    // A copy with truncated metadata.
    let truncated = d.join("truncated");
    copy_dir(&moved, &truncated);
    let meta = std::fs::read(truncated.join("_metadata")).expect("read _metadata");
    std::fs::write(truncated.join("_metadata"), &meta[..meta.len() / 2]).expect("truncate");
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&truncated)]);
    assert!(!ok, "a truncated savepoint must be refused:\n{log}");
    assert!(
        log.contains("_metadata"),
        "the message names `_metadata`:\n{log}"
    );
    assert_eq!(
        committed(&d.join("out")),
        before,
        "refusals touch no output"
    );

    let (ok, log) = run_to_end(beside(&yaml), &yaml, &["--from-savepoint", arg(&moved)]);
    assert!(ok, "{log}");
    assert_exactly_once(
        &committed(&d.join("out")),
        &straight(&unlimited(KEYED)),
        "restored from the moved savepoint",
    );
}

// ---------------------------------------------------------------------------------------
// 8. Failure around a savepoint
// ---------------------------------------------------------------------------------------

/// A savepoint directory that cannot be written is refused before the pipeline stops: with
/// the memory backend a stop whose savepoint is lost would lose the state with it.
#[test]
fn an_unwritable_savepoint_dir_is_refused_before_anything_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = keyed("memory");
    let yaml = write_yaml(dir.path(), &text);
    // Under a regular file: no directory can be created there.
    std::fs::write(dir.path().join("a-file"), b"x").expect("write a file");
    let bad = dir.path().join("a-file").join("savepoints");
    let mut run = Run::start(beside(&yaml), &yaml, &["--allow-any-savepoint-dir"]);
    run.wait_mid_run("totals", STOP_AFTER);
    for args in [
        vec!["stop", "totals", "--savepoint", "--dir", arg(&bad)],
        vec!["savepoint", "totals", "--dir", arg(&bad)],
    ] {
        let out = run.cli(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("a-file"),
            "{args:?} names the directory: {stderr}"
        );
        assert_eq!(
            run.pipeline("totals")["state"],
            "running",
            "{args:?}: the pipeline goes on\n{}",
            run.log()
        );
    }
    run.finish_ok();
    assert_exactly_once(
        &committed(&dir.path().join("out")),
        &straight(&unlimited(&text)),
        "after the refused savepoints",
    );
}

/// Starts `weir run --no-api EXTRA FILE` and SIGKILLs it as soon as its log has `needle`.
fn run_and_kill_at(yaml: &Path, extra: &[&str], needle: &str) -> String {
    let (seen, log) = kill_when(beside(yaml), yaml, extra, |line| line.contains(needle));
    assert!(seen, "`{needle}` never appeared:\n{log}");
    log
}

/// A run restored from an older savepoint rolls the committed output back to it. If that
/// run dies before it completes a checkpoint of its own, a plain `weir run` must restore
/// the savepoint again, not the storage's later checkpoints of the history the restore
/// left behind (whose output was rolled back).
#[test]
fn a_restore_that_dies_before_its_first_checkpoint_is_restored_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let yaml = write_yaml(d, KEYED);
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_mid_run("totals", STOP_AFTER);
    let out = run.cli(&["savepoint", "totals"]);
    let savepoint = run.savepoint_path(&out, "weir savepoint");
    run.stop_after_checkpoints("totals", 3, "three more checkpoints after the savepoint");

    run_and_kill_at(
        &yaml,
        &["--from-savepoint", arg(&savepoint)],
        "Pipeline started.",
    );
    let (ok, log) = run_to_end(beside(&yaml), &yaml, &[]);
    assert!(ok, "{log}");
    assert!(
        log.contains(&format!("{}", savepoint.display())),
        "the plain run restores the savepoint again:\n{log}"
    );
    assert_exactly_once(
        &committed(&d.join("out")),
        &straight(&unlimited(KEYED)),
        "a plain run after a restore that died early",
    );
}

// ---------------------------------------------------------------------------------------
// 9. Control API security
// ---------------------------------------------------------------------------------------

/// A short bounded pipeline (the `beta` of [`BETA`] without its rate limit) under `api`.
fn short_job(api: &str) -> String {
    unlimited(&format!("version: 1\n{api}pipelines:\n{BETA}"))
}

/// One raw HTTP/1.1 request to `addr` with exactly these header lines: the status code.
fn raw_status(addr: &str, method: &str, path: &str, headers: &[&str], body: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the API");
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {answer:?}"))
}

fn assert_forbidden(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(stderr.contains("weir::api::forbidden"), "{what}: {stderr}");
    stderr
}

#[test]
fn the_api_section_sets_port_and_token_and_flags_win() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two pipelines, one `api:` section for the whole file: port 0 (a free one) and a token
    // from MY_WEIR_TOKEN; no API flag on the command line.
    let api = "api: {enabled: true, port: 0, token_env: MY_WEIR_TOKEN}\n";
    let yaml = write_yaml(dir.path(), &format!("{KEYED}{BETA}{api}"));
    let mut run = Run::start_with(beside(&yaml), &yaml, &[], &[("MY_WEIR_TOKEN", "s3cret")]);
    assert!(run.log().contains("MY_WEIR_TOKEN"), "{}", run.log());
    assert_unauthorized(&run.cli(&["stop", "beta"]), "stop without the file's token");
    assert_eq!(run.pipeline("beta")["state"], "running");
    let out = run.cli(&["stop", "beta", "--token", "s3cret"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(run.pipeline("beta")["state"], "stopped");
    assert_eq!(run.pipeline("totals")["state"], "running");
    let out = run.cli_env(&["stop", "totals"], &[("WEIR_API_TOKEN", "s3cret")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run.finish_ok();

    // The issue's file: `enabled: false` on 7071 with the variable set serves no API at all.
    let off = write_yaml(
        dir.path(),
        &short_job("api: {enabled: false, port: 7071, token_env: MY_WEIR_TOKEN}\n"),
    );
    let (status, log) = run_to_end_with(beside(&off), &off, &[], &[("MY_WEIR_TOKEN", "s3cret")]);
    assert!(status.success(), "{log}");
    assert!(!log.contains("control API on"), "the API is off:\n{log}");
    assert!(!log.contains("Control API listening"), "{log}");

    // Flags win: --api-port switches it on, --api-token replaces the file's variable (which
    // is not even set), and the log says what the flags override. An endless generator keeps
    // the run up until the stop (the short job can end between two CLI calls).
    let endless = write_yaml(
        dir.path(),
        &format!(
            "version: 1\napi: {{enabled: false, port: 7071, token_env: MY_WEIR_TOKEN}}\npipelines:\n{}",
            BETA.replace("        count: 24000\n", "")
        ),
    );
    let mut run = Run::start_with(
        beside(&endless),
        &endless,
        &["--api-port", "0", "--api-token", "flag-token"],
        &[],
    );
    let log = run.log();
    assert!(
        log.contains("--api-port switches on the API the file disables"),
        "{log}"
    );
    assert!(
        log.contains("overrides the file's `api.token_env: MY_WEIR_TOKEN`"),
        "{log}"
    );
    assert_unauthorized(
        &run.cli(&["stop", "beta", "--token", "s3cret"]),
        "the file's token",
    );
    let out = run.cli(&["stop", "beta", "--token", "flag-token"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run.finish_ok();
}

#[test]
fn empty_or_missing_tokens_stop_weir_run_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = write_yaml(dir.path(), &short_job(""));
    // (flags, environment, the error code expected)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 3] = [
        (&["--api-token", ""], &[], "weir::api::empty_token"),
        (&[], &[("WEIR_API_TOKEN", "")], "weir::api::empty_token"),
        (&["--api-token", "two words"], &[], "weir::api::bad_token"),
    ];
    for (args, env, code) in cases {
        let (status, log) = run_to_end_with(beside(&plain), &plain, args, env);
        assert_eq!(status.code(), Some(1), "{args:?} {env:?}: {log}");
        assert!(log.contains(code), "{args:?} {env:?}: {log}");
        assert!(!dir.path().join("out_beta").exists(), "nothing ran: {log}");
    }
    let file = write_yaml(
        dir.path(),
        &short_job("api: {port: 0, token_env: MY_WEIR_TOKEN}\n"),
    );
    let (status, log) = run_to_end_with(beside(&file), &file, &[], &[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("weir::api::token_env_unset"), "{log}");
    assert!(log.contains("`MY_WEIR_TOKEN`, which is not set"), "{log}");
    let (status, log) = run_to_end_with(beside(&file), &file, &[], &[("MY_WEIR_TOKEN", "")]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("weir::api::empty_token"), "{log}");
    assert!(!dir.path().join("out_beta").exists(), "nothing ran: {log}");
}

#[test]
fn api_savepoint_dirs_are_confined_to_the_savepoint_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = std::fs::canonicalize(dir.path()).expect("canonical tempdir");
    let yaml = write_yaml(&d, KEYED);
    let root = d.join(".weir").join("savepoints");
    let outside = d.join("outside");
    std::fs::create_dir_all(&root).expect("mkdir root");
    std::fs::create_dir_all(&outside).expect("mkdir outside");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, root.join("escape")).expect("symlink");
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_mid_run("totals", STOP_AFTER);

    let mut refused = vec![
        vec!["savepoint", "totals", "--dir", arg(&outside)],
        vec!["savepoint", "totals", "--dir", "../../x"],
        vec![
            "stop",
            "totals",
            "--savepoint",
            "--dir",
            "/tmp/weir-elsewhere",
        ],
    ];
    if cfg!(unix) {
        refused.push(vec!["savepoint", "totals", "--dir", "escape/x"]);
    }
    for args in &refused {
        let stderr = assert_forbidden(&run.cli(args), &format!("{args:?}"));
        assert!(stderr.contains("--allow-any-savepoint-dir"), "{stderr}");
        assert_eq!(run.pipeline("totals")["state"], "running", "{args:?}");
    }
    assert_eq!(std::fs::read_dir(&outside).expect("list").count(), 0);
    assert!(!d.join("x").exists() && !Path::new("/tmp/weir-elsewhere").exists());

    // A relative directory is relative to the root.
    let out = run.cli(&["savepoint", "totals", "--dir", "nightly"]);
    let savepoint = run.savepoint_path(&out, "savepoint --dir nightly");
    assert!(
        savepoint.starts_with(root.join("nightly")),
        "{}",
        savepoint.display()
    );

    // Browsers: a foreign Origin or Host, or a body not declared JSON, is refused before
    // the token check and before the job; `weir`'s own requests pass.
    let stop = "/v1/pipelines/totals/stop";
    let json = "Content-Type: application/json";
    let host = "Host: 127.0.0.1";
    assert_eq!(
        raw_status(
            &run.api,
            "POST",
            stop,
            &[host, json, "Origin: http://evil.example"],
            "{}"
        ),
        403
    );
    assert_eq!(
        raw_status(
            &run.api,
            "POST",
            stop,
            &[host, "Content-Type: text/plain"],
            "{}"
        ),
        415
    );
    assert_eq!(raw_status(&run.api, "POST", stop, &[host], ""), 415);
    assert_eq!(
        raw_status(
            &run.api,
            "GET",
            "/v1/status",
            &["Host: evil.example:8642"],
            ""
        ),
        403
    );
    let huge = format!("{{\"dir\": \"{}\"}}", "a".repeat(70_000));
    assert_eq!(
        raw_status(
            &run.api,
            "POST",
            "/v1/pipelines/totals/savepoints",
            &[host, json],
            &huge
        ),
        413
    );
    assert_eq!(run.pipeline("totals")["state"], "running");
    run.stop_after_checkpoints("totals", 1, "a checkpoint after the refused calls");

    // With --allow-any-savepoint-dir, any directory goes.
    let mut run = Run::start(beside(&yaml), &yaml, &["--allow-any-savepoint-dir"]);
    run.wait_mid_run("totals", STOP_AFTER);
    let out = run.cli(&["stop", "totals", "--savepoint", "--dir", arg(&outside)]);
    let savepoint = run.savepoint_path(&out, "stop --savepoint --dir outside the root");
    assert!(savepoint.starts_with(&outside), "{}", savepoint.display());
    run.finish_ok();
}

#[test]
fn reload_reads_only_the_running_file_or_yaml_beside_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = std::fs::canonicalize(dir.path()).expect("canonical tempdir");
    let yaml = write_yaml(&d, KEYED);
    // The next version changes only the `api:` section.
    let next = d.join("next.yaml");
    std::fs::write(&next, format!("{KEYED}api: {{port: 7071}}\n")).expect("write next.yaml");
    std::fs::write(d.join("secret.txt"), "root:x:0:0:secret\n").expect("write a secret");
    let mut run = Run::start(beside(&yaml), &yaml, &[]);
    run.wait_mid_run("totals", STOP_AFTER);

    for file in [
        "/etc/passwd",
        "../../../../etc/passwd",
        arg(&d.join("secret.txt")),
    ] {
        let out = run.cli(&["reload", "--plan", file]);
        let stderr = assert_forbidden(&out, file);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains("root:") && !stderr.contains("root:"),
            "{file}: {stdout}{stderr}"
        );
        assert!(
            stderr.contains("compares only the running file"),
            "{stderr}"
        );
    }
    // The raw API call the issue names answers 403 with no line of the file.
    let client = weir_engine::api::ApiClient::new(&run.api, None).expect("client");
    let request = weir_engine::control::ReloadRequest {
        file: Some("/etc/passwd".into()),
        plan_only: true,
        allow_non_restored_state: false,
        ..weir_engine::control::ReloadRequest::default()
    };
    match client.reload(&request) {
        Err(weir_engine::api::ClientError::Api { status, error }) => {
            assert_eq!(status, 403);
            assert!(!error.to_string().contains("root:"), "{error}");
        }
        other => panic!("expected a 403, got {other:?}"),
    }

    // A file beside the running one is compared; its `api:` change is reported, not applied.
    let out = run.cli(&["reload", "--plan", arg(&next)]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("reload plan (nothing applied)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the file's `api:` section changed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("port: 8642") && stdout.contains("port: 7071"),
        "{stdout}"
    );
    run.stop_after_checkpoints("totals", 1, "a checkpoint after the plans");
}

#[test]
fn a_taken_port_stops_weir_run_naming_the_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let by_flag = write_yaml(dir.path(), &short_job(""));
    let by_file = dir.path().join("by_file.yaml");
    std::fs::write(&by_file, short_job(&format!("api: {{port: {port}}}\n"))).expect("write");
    for (yaml, args) in [
        (&by_flag, vec!["--api-port", port.as_str()]),
        (&by_file, vec![]),
    ] {
        let (status, log) = run_to_end_with(beside(yaml), yaml, &args, &[]);
        assert_eq!(status.code(), Some(1), "{log}");
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("address in use"))
            .collect();
        assert_eq!(lines.len(), 1, "{log}");
        let want = format!(
            "error[weir::api::address_in_use]: cannot listen on 127.0.0.1:{port}: address in use \
             by process {} (`",
            std::process::id()
        );
        assert!(lines[0].starts_with(&want), "{}\nwanted: {want}", lines[0]);
        assert!(lines[0].contains("--no-api"), "{}", lines[0]);
        assert!(
            !dir.path().join("out_beta").exists(),
            "no pipeline ran: {log}"
        );
    }
    // With --no-api the same file runs.
    let (ok, log) = run_to_end(beside(&by_file), &by_file, &[]);
    assert!(ok, "{log}");
    drop(taken);
}
