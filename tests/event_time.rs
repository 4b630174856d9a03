//! Event time end to end, proved by equivalence with failure-free runs: a windowed job (event
//! time on the source, per-user tumbling windows, and a `process` keyed by window that sums
//! each window's results from an event-time timer at its end) must commit exactly the output
//! of one uninterrupted run, and that of a plain sequential reference, when
//!
//! 1. `weir run` is killed with SIGKILL again and again, on fs and on RocksDB: windows are
//!    open and timers pending at every kill past the first window;
//! 2. the file is edited while it runs (`--watch`): the window and the process change
//!    parallelism and the script is refactored, so open windows and pending timers move to
//!    other subtasks through the reload;
//! 3. it is stopped with savepoints and restored at parallelism 1, then 3, then 2, reading a
//!    growing set of files, and the last run is drained (which fires what is still open).
//!
//! Records are at most 800 ms out of order within each file (the bound is 1 s, 30 s for the
//! growing files of the rescale, see [`follow_job`]) and every file only grows at its end
//! with later times, so no record is ever late, whatever the interleaving of the readers: the
//! output depends on the input alone. (Which records are late is deterministic only for one
//! reader in file order; the reference pipelines `pipelines/{page_views,top_pages,sessions}`
//! cover lateness that way.)
//! Kill moments are seeded (`WEIR_KILL_SEED`); nothing asserts on timing.
#![cfg(unix)]
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::files::{append, write_by_rename};
use common::kill::{
    Backend, KillPlan, Recovery, Rng, Runner, Scratch, assert_exactly, file_sinks, kill_loop,
    log_excerpt, read_log, restores_in, with_recovery,
};
use common::output::{OutputDiff, assert_exactly_once, committed, describe_counted};
use common::run::{Run, beside, pipeline_of, run_to_end};
use common::running::Running;

/// 2025-12-01T00:00:00Z in epoch milliseconds.
const T0: i64 = 1_764_547_200_000;
/// The windows' size.
const WINDOW_MS: i64 = 2_000;
/// At most this much behind the largest time of its file, under the 1 s bound.
const JITTER_MS: u64 = 800;

/// One input record: `(user, amount, ts)`.
type Event = (String, i64, i64);

// ---------------------------------------------------------------------------------------------
// The job and its reference.

/// The windowed job over `source` (a source spec without `id` and `event_time`) with
/// `max_out_of_orderness: ooo`, the window and the process at `parallelism` and the process
/// script `script`.
fn windowed_job(source: Value, ooo: &str, parallelism: u32, script: &str) -> Value {
    let mut source = source;
    source["id"] = json!("events");
    source["event_time"] = json!({"field": "ts", "unit": "ms", "max_out_of_orderness": ooo});
    json!({
        "version": 1,
        "pipelines": [{
            "id": "w",
            "parallelism": parallelism,
            "max_parallelism": 128,
            "sources": [source],
            "operators": [
                {"id": "by_user", "type": "key_by", "input": "events", "field": "user"},
                {"id": "windows", "type": "window", "input": "by_user",
                 "window": {"tumbling": {"size": format!("{WINDOW_MS}ms")}},
                 "aggregations": [{"fn": "sum", "field": "amount", "as": "sum"}, {"fn": "count", "as": "count"}]},
                {"id": "by_window", "type": "key_by", "input": "windows", "field": "window_end"},
                {"id": "totals", "type": "process", "input": "by_window",
                 "state": {"acc": "value"}, "script": script},
            ],
            "sinks": [
                {"id": "windows_out", "type": "file", "input": "windows", "path": "out/windows"},
                {"id": "totals_out", "type": "file", "input": "totals", "path": "out/totals"},
            ],
        }],
    })
}

/// Per window (the key), the number of user windows and their sum, emitted by the timer at
/// the window's end.
const TOTALS: &str = r#"fn process(r) {
    let acc = state_get("acc");
    if acc == () {
        register_event_timer(r.window_end - 1);
        acc = #{window_start: r.window_start, window_end: r.window_end, users: 0, sum: 0};
    }
    acc.users += 1;
    acc.sum += r.sum;
    state_set("acc", acc);
}

fn on_timer(ts, kind) {
    emit(state_get("acc"));
    state_clear("acc");
}
"#;

/// The same results, written differently.
const TOTALS_REFACTORED: &str = r#"fn process(r) {
    let acc = state_get("acc");
    if acc == () {
        acc = #{window_start: r.window_start, window_end: r.window_end, users: 0, sum: 0};
        register_event_timer(acc.window_end - 1);
    }
    state_set("acc", #{
        window_start: acc.window_start,
        window_end: acc.window_end,
        users: acc.users + 1,
        sum: acc.sum + r.sum,
    });
}

fn on_timer(ts, kind) {
    let acc = state_get("acc");
    state_clear("acc");
    emit(acc);
}
"#;

/// The job's two sinks computed sequentially: `{"w/windows_out": lines, "w/totals_out": ...}`.
fn reference(events: &[Event]) -> BTreeMap<String, Vec<String>> {
    let mut windows: BTreeMap<(String, i64), (i64, i64)> = BTreeMap::new();
    for (user, amount, ts) in events {
        let w = windows
            .entry((user.clone(), ts - ts.rem_euclid(WINDOW_MS)))
            .or_default();
        w.0 += amount;
        w.1 += 1;
    }
    let mut totals: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    let mut lines = Vec::new();
    for ((user, start), (sum, count)) in &windows {
        lines.push(
            json!({"key": user, "window_start": start, "window_end": start + WINDOW_MS,
                          "sum": sum, "count": count}),
        );
        let t = totals.entry(*start).or_default();
        t.0 += 1;
        t.1 += sum;
    }
    let totals = totals.iter().map(|(start, (users, sum))| {
        json!({"window_start": start, "window_end": start + WINDOW_MS, "users": users, "sum": sum})
    });
    let canonical = |v: Vec<Value>| {
        let mut l: Vec<String> = v.iter().map(Value::to_string).collect();
        l.sort();
        l
    };
    BTreeMap::from([
        ("w/windows_out".to_owned(), canonical(lines)),
        ("w/totals_out".to_owned(), canonical(totals.collect())),
    ])
}

/// Asserts that the committed output under `dir` equals the reference for `events`.
fn assert_reference(dir: &Path, events: &[Event], what: &str) {
    let want = reference(events);
    for (sink, sub) in [("w/windows_out", "windows"), ("w/totals_out", "totals")] {
        let got = committed(&dir.join("out").join(sub));
        let (missing, extra) = OutputDiff::of(&got, &want[sink]).counted();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{what} {sink} vs the sequential reference: {}",
            describe_counted(&missing, &extra)
        );
    }
}

/// Input files whose times only grow: each line's time is a global clock (advancing `step`
/// ms per line) minus a jitter below [`JITTER_MS`]. Users are dealt to files by number, so a
/// file's lines are all its users' lines.
struct Input {
    rng: Rng,
    clock: i64,
    users: u64,
    events: Vec<Event>,
}

impl Input {
    fn new(seed: u64, users: u64) -> Self {
        Self {
            rng: Rng(seed | 1),
            clock: T0 + JITTER_MS as i64,
            users,
            events: Vec::new(),
        }
    }

    /// Appends `n` lines, spread over files `in/<names[k]>.jsonl` by user, `step` ms apart.
    fn grow(&mut self, dir: &Path, names: &[&str], n: usize, step: i64) {
        let mut texts = vec![String::new(); names.len()];
        for _ in 0..n {
            let u = self.rng.below(self.users);
            let user = format!("u{u}");
            let amount = 1 + self.rng.below(100) as i64;
            let ts = self.clock - self.rng.below(JITTER_MS) as i64;
            self.clock += step;
            let line = json!({"user": user, "amount": amount, "ts": ts});
            texts[(u as usize) % names.len()].push_str(&format!("{line}\n"));
            self.events.push((user, amount, ts));
        }
        for (name, text) in names.iter().zip(texts) {
            append(&dir.join("in").join(format!("{name}.jsonl")), &text);
        }
    }
}

fn write_json(path: &Path, v: &Value) {
    let mut f = std::fs::File::create(path).unwrap();
    writeln!(f, "{}", serde_json::to_string_pretty(v).unwrap()).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 1. SIGKILL.

fn windowed_job_survives_sigkill(backend: Backend, seed: u64) {
    let started = Instant::now();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let data = tmp.join("data");
    let mut input = Input::new(seed, 2_000);
    input.grow(&data, &["even", "odd"], 120_000, 5);
    let source =
        json!({"type": "file", "path": data.join("in").to_str().unwrap(), "parallelism": 2});
    let job = windowed_job(source, "1s", 2, TOTALS);

    let prepare = |name: &str| {
        let dir = tmp.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        write_json(&dir.join("job.yaml"), &job);
        let file = with_recovery(
            &dir.join("job.yaml"),
            &Recovery {
                backend,
                mode: "exactly_once",
                interval: "100ms",
                root: &dir,
            },
        );
        (dir, file)
    };

    // Failure-free: equal to the reference.
    let (clean, clean_file) = prepare("clean");
    let mut runner = Runner::new(&clean_file, &tmp.join("logs"), "clean");
    let (wall, _) = runner.run_to_end();
    assert_reference(&clean, &input.events, "failure-free");
    let mut expected = BTreeMap::new();
    for s in file_sinks(&clean_file) {
        expected.insert(s.label(), committed(&s.dir));
    }

    // Killed again and again, then run to the end.
    let (_, file) = prepare("crash");
    let sinks = file_sinks(&file);
    let mut runner = Runner::new(&file, &tmp.join("logs"), "crash");
    let mut rng = Rng::new(seed);
    let lo = Duration::from_millis(50);
    let mut st = kill_loop(
        &mut runner,
        &mut rng,
        &KillPlan {
            random: 12,
            window: (lo, wall.mul_f64(0.9).max(lo)),
            targeted: 4,
        },
    );
    let (_, log) = runner.run_to_end();
    st.restored.extend(restores_in(&read_log(&log)));
    assert_exactly(
        "windowed job",
        &expected,
        &sinks,
        &format!(
            "windowed job ({}): output after {} SIGKILLs at {:?} ms differs from the \
             failure-free output\n{}",
            backend.name(),
            st.kills,
            st.moments,
            log_excerpt(&log)
        ),
    );
    assert!(st.kills >= 8, "only {} kills", st.kills);
    println!(
        "windowed_job_survives_sigkill_{} in {:.1}s: failure-free run {:.2}s; {}",
        backend.name(),
        started.elapsed().as_secs_f64(),
        wall.as_secs_f64(),
        st.report("crash runs"),
    );
}

#[test]
fn windowed_job_survives_sigkill_fs() {
    windowed_job_survives_sigkill(Backend::Fs, 0x5EED_0151);
}

#[test]
fn windowed_job_survives_sigkill_rocksdb() {
    windowed_job_survives_sigkill(Backend::Rocksdb, 0x5EED_0152);
}

// ---------------------------------------------------------------------------------------------
// 2. Hot reload.

/// The generator's records: 50 users, times 20 ms apart (strictly increasing, one generator).
fn generator(count: u64, rate: Option<u64>) -> Value {
    let mut g = json!({
        "type": "generator",
        "seed": 15,
        "count": count,
        "parallelism": 1,
        "fields": {
            "user": {"kind": "key", "prefix": "u", "cardinality": 50},
            "amount": {"kind": "int", "min": 1, "max": 10},
            "ts": {"kind": "timestamp", "start": T0, "step": 20},
        },
    });
    if let Some(rate) = rate {
        g["rate"] = json!(rate);
    }
    g
}

/// Exactly-once checkpoints every 200 ms to `ck/` on RocksDB; no API section (the test
/// starts the API on a free port).
fn with_checkpoints(mut job: Value) -> Value {
    let p = &mut job["pipelines"][0];
    p["state"] = json!({"backend": "rocksdb"});
    p["checkpoints"] = json!({"mode": "exactly_once", "interval": "200ms", "storage": "ck"});
    job
}

#[test]
fn a_reload_moves_open_windows_and_pending_timers_and_changes_nothing() {
    const COUNT: u64 = 12_000;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("p.yaml");
    let v0 = with_checkpoints(windowed_job(generator(COUNT, Some(1_000)), "1s", 1, TOTALS));
    write_json(&file, &v0);
    let mut run = Running::start(tmp.path(), &file, &["--watch"]);
    run.wait_until("a first checkpoint and a closed window", |s| {
        s.pipelines.first().is_some_and(|p| {
            p.state == "running" && p.latest_checkpoint.is_some() && p.sink_records > 0
        })
    });

    // The window and the process from 1 to 2 subtasks, the script refactored.
    let mut v1 = with_checkpoints(windowed_job(
        generator(COUNT, Some(1_000)),
        "1s",
        1,
        TOTALS_REFACTORED,
    ));
    for op in v1["pipelines"][0]["operators"].as_array_mut().unwrap() {
        if op["type"] != "key_by" {
            op["parallelism"] = json!(2);
        }
    }
    let at = run.status().last_reload.map_or(0, |o| o.at_ms);
    write_by_rename(&file, &serde_json::to_string_pretty(&v1).unwrap());
    let (_, outcome) = run.wait_outcome(at, "applied");
    let plan = &outcome.pipelines[0];
    for id in ["windows", "totals"] {
        let op = plan.operators.iter().find(|o| o.id == id).unwrap();
        assert_eq!(op.parallelism, Some((1, 2)), "{outcome:#?}");
    }
    let status = run.status();
    let read = status.pipelines.first().map_or(0, |p| p.source_records);
    assert!(
        read < COUNT,
        "the edit came after the end of input: {outcome:#?}"
    );

    // The rate lifted: the rest goes fast, to the end of the generator's records.
    let mut v2 = with_checkpoints(windowed_job(
        generator(COUNT, None),
        "1s",
        1,
        TOTALS_REFACTORED,
    ));
    v2["pipelines"][0]["operators"] = v1["pipelines"][0]["operators"].clone();
    write_by_rename(&file, &serde_json::to_string_pretty(&v2).unwrap());
    // The job may end before `weir status` shows the outcome: its log counts the reloads.
    assert!(run.wait_exit(Duration::from_secs(240)), "{}", run.log());
    let log = run.log();
    assert!(log.contains("2 reloads applied"), "{log}");

    // The straight run of the final version.
    let straight = tempfile::tempdir().unwrap();
    let sfile = straight.path().join("p.yaml");
    write_json(&sfile, &v2);
    let (ok, log) = run_to_end(straight.path(), &sfile, &[]);
    assert!(ok, "{log}");
    for sub in ["windows", "totals"] {
        let want = committed(&straight.path().join("out").join(sub));
        assert!(!want.is_empty());
        let got = committed(&tmp.path().join("out").join(sub));
        assert_exactly_once(&got, &want, &format!("{sub} across two reloads"));
    }
    // Every generated record counted once in its user's window.
    let windows = committed(&straight.path().join("out").join("windows"));
    let records: i64 = windows
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["count"]
                .as_i64()
                .unwrap()
        })
        .sum();
    assert_eq!(records, COUNT as i64);
}

// ---------------------------------------------------------------------------------------------
// 3. Rescale 1 -> 3 -> 2 through savepoints.

/// The job reading `in/` in follow mode at `parallelism` (the source's readers too).
///
/// A reader makes a watermark per split from the split's first record on (as Flink's
/// per-split watermarks), and reads one split's backlog before the next one's: a split it has
/// not read from yet does not hold the watermark back. Each growth of the input spans 18 s
/// of event time over several files, so the bound here is 30 s: a split first read after
/// another one of the same growth is never behind the watermark.
fn follow_job(parallelism: u32) -> Value {
    let source = json!({"type": "file", "path": "in", "follow": true, "poll_interval": "20ms"});
    with_checkpoints(windowed_job(source, "30s", parallelism, TOTALS))
}

/// Runs the job at `parallelism` (from `savepoint` when given) until its source read `lines`
/// lines in this run and a checkpoint completed; then stops it with a savepoint (returned),
/// or, when `drain`, drains it (the end of input fires every open window and timer).
fn step(
    dir: &Path,
    parallelism: u32,
    savepoint: Option<&Path>,
    lines: u64,
    drain: bool,
) -> Option<std::path::PathBuf> {
    let file = dir.join("p.yaml");
    write_json(&file, &follow_job(parallelism));
    let extra: Vec<&str> = match savepoint {
        Some(sp) => vec!["--from-savepoint", sp.to_str().unwrap()],
        None => Vec::new(),
    };
    let mut run = Run::start(beside(&file), &file, &extra);
    run.wait_for(
        &format!("{lines} lines at parallelism {parallelism}"),
        |s| {
            let p = pipeline_of(s, "w");
            p["checkpoints"].as_u64().unwrap_or(0) >= 1
                && p["source_records"].as_u64().unwrap_or(0) >= lines
        },
    );
    if drain {
        let out = run.cli(&["stop", "w", "--savepoint", "--drain"]);
        run.savepoint_path(&out, "weir stop --savepoint --drain");
        run.finish_ok();
        None
    } else {
        let sp = run.stop_with_savepoint("w");
        run.finish_ok();
        Some(sp)
    }
}

#[test]
fn rescaling_a_windowed_job_1_to_3_to_2_equals_the_sequential_reference() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut input = Input::new(0x5EED_0153, 300);
    input.grow(d, &["a", "b", "c"], 6_000, 3);
    let sp1 = step(d, 1, None, 6_000, false).unwrap();
    // Longer files and new ones: the readers resume mid-file, new files are dealt out.
    input.grow(d, &["a", "b", "c", "d", "e"], 6_000, 3);
    let sp2 = step(d, 3, Some(&sp1), 6_000, false).unwrap();
    input.grow(d, &["a", "c", "e", "f"], 6_000, 3);
    step(d, 2, Some(&sp2), 6_000, true);
    assert_reference(d, &input.events, "rescaled 1 -> 3 -> 2");
}

/// One reader reading two files in turn: the second file's records are not late against the
/// first file's progress (a queued split holds the watermark until it is read), so every
/// record of both files is counted in its window.
#[test]
fn a_reader_reading_several_files_in_turn_drops_none_as_late() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let data = tmp.path().join("in");
    std::fs::create_dir_all(&data).expect("mkdir");
    for f in ["a", "b"] {
        let lines: String = (0..2000)
            .map(|i| format!("{}\n", json!({"k": f, "ts": i * 50})))
            .collect();
        std::fs::write(data.join(format!("{f}.jsonl")), lines).expect("write");
    }
    let job = json!({
        "version": 1,
        "pipelines": [{
            "id": "p",
            "parallelism": 1,
            "sources": [{"id": "src", "type": "file", "path": "in",
                         "event_time": {"field": "ts", "max_out_of_orderness": "1s"}}],
            "operators": [
                {"id": "by", "type": "key_by", "input": "src", "field": "k"},
                {"id": "w", "type": "window", "input": "by",
                 "window": {"tumbling": {"size": "10s"}},
                 "aggregations": [{"fn": "count", "as": "n"}]}],
            "sinks": [{"id": "out", "type": "file", "input": "w", "path": "out"}],
        }],
    });
    let file = tmp.path().join("job.yaml");
    write_json(&file, &job);
    let (ok, log) = run_to_end(tmp.path(), &file, &[]);
    assert!(ok, "{log}");
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for line in committed(&tmp.path().join("out")) {
        let r: Value = serde_json::from_str(&line).expect("json");
        *counts
            .entry(r["key"].as_str().unwrap_or("").to_owned())
            .or_default() += r["n"].as_i64().unwrap_or(0);
    }
    assert_eq!(
        counts,
        BTreeMap::from([("a".to_owned(), 2000), ("b".to_owned(), 2000)]),
        "{log}"
    );
}
