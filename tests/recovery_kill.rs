//! Crash recovery, proved by equivalence: real `weir run` processes over real files (and real
//! RocksDB) are killed with SIGKILL at random moments, again and again, then run once more to
//! completion; the committed output must equal the output of one failure-free run as a
//! multiset of canonical JSON lines (exactly-once: nothing lost, nothing duplicated), or, with
//! `at_least_once`, contain every failure-free record at least once.
//!
//! Kill moments come from a seeded xorshift generator (set `WEIR_KILL_SEED` to change the
//! seed); the moments themselves are wall-clock, so the interleavings differ between runs.
//! A failing test keeps its temporary directory (runs' logs under `logs/`) and prints its path;
//! set `WEIR_KILL_KEEP=1` to keep it always.
//! Nothing here asserts on timing.
#![cfg(unix)]
#![allow(clippy::unwrap_used, missing_docs)]

mod common;
use common::binary::signal;
use common::in_process::{copy_reference_pipelines, golden_path, reference_files};
use common::kill::{
    Backend, HANG, KillPlan, KillStats, Recovery, Rng, Runner, Scratch, assert_exactly,
    checkpoints_with_channel_state, file_sinks, kill_loop, kill_now, log_excerpt, read_log,
    restores_in, rocksdb_leftovers, wait_bounded, with_checkpoint_settings, with_recovery,
};
use common::output::{
    OutputDiff, canonical_lines_marking_torn, committed_marking_torn, describe_counted,
    hidden_files, part_files,
};

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// 1. The reference pipelines.

fn reference_pipelines_survive_sigkill(backend: Backend, seed: u64) {
    let started = Instant::now();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let root = copy_reference_pipelines(tmp);
    let yamls = reference_files(&root);
    assert!(yamls.len() >= 5, "reference pipelines: {yamls:?}");
    let kills_per_file = 40_usize.div_ceil(yamls.len()).max(4);
    let mut rng = Rng::new(seed);
    let mut total = KillStats::default();
    let mut lines = Vec::new();
    for yaml in &yamls {
        let stem = yaml.file_stem().unwrap().to_string_lossy().into_owned();
        let file = with_recovery(
            yaml,
            &Recovery {
                backend,
                mode: "exactly_once",
                interval: "20ms",
                root: tmp,
            },
        );
        let sinks = file_sinks(&file);
        let mut runner = Runner::new(&file, &tmp.join("logs"), &stem);

        // Failure-free: must match the golden files; sinks without one (the generator's
        // output, the dead letters) are compared with this run's output instead.
        let (wall, _) = runner.run_to_end();
        let mut expected = BTreeMap::new();
        let mut golden = 0;
        for s in &sinks {
            let path = golden_path(&root, &stem, &s.pipeline, &s.id);
            let got = committed_marking_torn(&s.dir);
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let want = canonical_lines_marking_torn(&text);
                    assert_eq!(
                        got,
                        want,
                        "{stem} {}: failure-free run vs golden",
                        s.label()
                    );
                    golden += 1;
                    expected.insert(s.label(), want);
                }
                Err(_) => {
                    expected.insert(s.label(), got);
                }
            }
        }
        assert!(golden > 0, "{stem}: no golden output");

        // Kill anywhere from process start to past the end of a failure-free run, and a few
        // times right after a checkpoint.
        let mut st = kill_loop(
            &mut runner,
            &mut rng,
            &KillPlan {
                random: kills_per_file,
                window: (Duration::ZERO, wall.mul_f64(1.2)),
                targeted: 2,
            },
        );
        let (_, log) = runner.run_to_end();
        st.restored.extend(restores_in(&read_log(&log)));
        assert_exactly(
            &stem,
            &expected,
            &sinks,
            &format!(
                "{stem} ({}): output after {} SIGKILLs at {:?} ms differs from the failure-free \
                 output\n{}",
                backend.name(),
                st.kills,
                st.moments,
                log_excerpt(&log)
            ),
        );
        let hidden: usize = sinks.iter().map(|s| hidden_files(&s.dir)).sum();
        lines.push(format!(
            "  {}; failure-free {:.0}ms; hidden files left in sinks: {hidden}",
            st.report(&stem),
            wall.as_secs_f64() * 1e3
        ));
        total.absorb(st);
    }
    let leftovers = rocksdb_leftovers(&tmp.join("rocks"));
    println!(
        "reference_pipelines_survive_sigkill_{} in {:.1}s: {}; RocksDB working dirs left: {leftovers}\n{}",
        backend.name(),
        started.elapsed().as_secs_f64(),
        total.report("all files"),
        lines.join("\n")
    );
    assert!(total.kills >= 20, "only {} kills", total.kills);
}

#[test]
fn reference_pipelines_survive_sigkill_fs() {
    reference_pipelines_survive_sigkill(Backend::Fs, 0x5EED_0001);
}

#[test]
fn reference_pipelines_survive_sigkill_rocksdb() {
    reference_pipelines_survive_sigkill(Backend::Rocksdb, 0x5EED_0002);
}

// ---------------------------------------------------------------------------------------------
// 2. A long keyed job (W1-style): aggregate with `emit: final` and reduce with `emit: updates`.

const LONG_RECORDS: u64 = 200_000;
const LONG_USERS: u64 = 5_000;
/// The reduce pipeline (Rhai per record, one output per input) reads the first records only.
const REDUCE_RECORDS: u64 = 30_000;

/// W1-style orders `{user, amount, ts}` split over two files by user parity, so that each
/// user's records keep one order whichever reader takes which file: `<dir>/all/` holds every
/// record, `<dir>/head/` the first [`REDUCE_RECORDS`]. Returns the records in order.
fn write_orders(dir: &Path, seed: u64) -> Vec<(String, i64, i64)> {
    let mut rng = Rng(seed | 1);
    let mut orders = Vec::with_capacity(LONG_RECORDS as usize);
    for i in 0..LONG_RECORDS {
        let user = format!("u{}", rng.below(LONG_USERS));
        let amount = 1 + rng.below(100) as i64;
        orders.push((user, amount, 1_700_000_000_000 + 7 * i as i64));
    }
    for (sub, n) in [("all", LONG_RECORDS), ("head", REDUCE_RECORDS)] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        let mut files: Vec<_> = (0..2)
            .map(|k| {
                std::io::BufWriter::new(
                    std::fs::File::create(d.join(format!("orders-{k}.jsonl"))).unwrap(),
                )
            })
            .collect();
        for (user, amount, ts) in orders.iter().take(n as usize) {
            let parity = user[1..].parse::<usize>().unwrap() % 2;
            let line = json!({"user": user, "amount": amount, "ts": ts});
            writeln!(files[parity], "{line}").unwrap();
        }
        for mut f in files {
            f.flush().unwrap();
        }
    }
    orders
}

/// The long job: two pipelines of parallelism 2 in one file, reading `data` (absolute).
fn long_job(data: &Path) -> Value {
    let pipeline = |id: &str, input: &str, operators: Value| {
        json!({
            "id": id,
            "parallelism": 2,
            "sources": [{"id": "orders", "type": "file", "path": data.join(input).to_str().unwrap()}],
            "operators": operators,
            "sinks": [{"id": "out", "type": "file", "input": "result", "path": format!("out/{id}")}],
        })
    };
    json!({
        "version": 1,
        "pipelines": [
            pipeline("totals", "all", json!([
                {"id": "by_user", "type": "key_by", "input": "orders", "field": "user"},
                {"id": "result", "type": "aggregate", "input": "by_user", "emit": "final",
                 "aggregations": [{"fn": "sum", "field": "amount", "as": "sum"}, {"fn": "count", "as": "count"}]},
            ])),
            pipeline("running", "head", json!([
                {"id": "by_user", "type": "key_by", "input": "orders", "field": "user"},
                {"id": "result", "type": "reduce", "input": "by_user", "emit": "updates",
                 "script": "fn reduce(acc, r) { #{user: acc.user, amount: acc.amount + r.amount, ts: r.ts} }"},
            ])),
        ],
    })
}

/// A plain sequential reference for the long job's two sinks.
fn long_job_reference(orders: &[(String, i64, i64)]) -> BTreeMap<String, Vec<String>> {
    let mut totals: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (user, amount, _) in orders {
        let t = totals.entry(user).or_default();
        t.0 += amount;
        t.1 += 1;
    }
    let mut t: Vec<String> = totals
        .iter()
        .map(|(u, (sum, count))| json!({"key": u, "sum": sum, "count": count}).to_string())
        .collect();
    t.sort();
    let mut running: BTreeMap<&str, i64> = BTreeMap::new();
    let mut r: Vec<String> = orders
        .iter()
        .take(REDUCE_RECORDS as usize)
        .map(|(user, amount, ts)| {
            let acc = running.entry(user).or_default();
            *acc += amount;
            json!({"key": user, "user": user, "amount": *acc, "ts": ts}).to_string()
        })
        .collect();
    r.sort();
    BTreeMap::from([("totals/out".to_owned(), t), ("running/out".to_owned(), r)])
}

fn long_job_survives_sigkill(backend: Backend, seed: u64) {
    let started = Instant::now();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let data = tmp.join("data");
    let orders = write_orders(&data, seed);
    let reference = long_job_reference(&orders);
    drop(orders);
    let job = serde_json::to_string_pretty(&long_job(&data)).unwrap();
    // Failure-free, in its own directory.
    let clean = tmp.join("clean");
    std::fs::create_dir_all(&clean).unwrap();
    std::fs::write(clean.join("job.yaml"), &job).unwrap();
    let clean_file = with_recovery(
        &clean.join("job.yaml"),
        &Recovery {
            backend,
            mode: "exactly_once",
            interval: "100ms",
            root: &clean,
        },
    );
    let mut runner = Runner::new(&clean_file, &tmp.join("logs"), "clean");
    let (wall, clean_log) = runner.run_to_end();
    let clean_checkpoints = read_log(&clean_log)
        .matches("Checkpoint completed.")
        .count();
    let mut expected = BTreeMap::new();
    for s in file_sinks(&clean_file) {
        let got = committed_marking_torn(&s.dir);
        let want = &reference[&s.label()];
        let (missing, extra) = OutputDiff::of(&got, want).counted();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "failure-free {} vs the sequential reference: {}",
            s.label(),
            describe_counted(&missing, &extra)
        );
        expected.insert(s.label(), got);
    }

    // The same job, killed again and again, then run to the end.
    let crash = tmp.join("crash");
    std::fs::create_dir_all(&crash).unwrap();
    std::fs::write(crash.join("job.yaml"), &job).unwrap();
    let file = with_recovery(
        &crash.join("job.yaml"),
        &Recovery {
            backend,
            mode: "exactly_once",
            interval: "100ms",
            root: &crash,
        },
    );
    let sinks = file_sinks(&file);
    let mut runner = Runner::new(&file, &tmp.join("logs"), "crash");
    let lo = Duration::from_millis(50);
    let mut rng = Rng::new(seed);
    let mut st = kill_loop(
        &mut runner,
        &mut rng,
        &KillPlan {
            random: 20,
            window: (lo, wall.mul_f64(0.9).max(lo)),
            targeted: 5,
        },
    );
    let (final_wall, log) = runner.run_to_end();
    let final_restores = restores_in(&read_log(&log));
    st.restored.extend(final_restores.clone());
    assert_exactly(
        "long job",
        &expected,
        &sinks,
        &format!(
            "long job ({}): output after {} SIGKILLs at {:?} ms differs from the failure-free \
             output\n{}",
            backend.name(),
            st.kills,
            st.moments,
            log_excerpt(&log)
        ),
    );
    let hidden: usize = sinks.iter().map(|s| hidden_files(&s.dir)).sum();
    println!(
        "long_job_survives_sigkill_{} in {:.1}s: failure-free run {:.2}s with {clean_checkpoints} \
         checkpoints; {}; final run {:.2}s resumed from {final_restores:?}; hidden files left in \
         sinks: {hidden}; RocksDB working dirs left: {}",
        backend.name(),
        started.elapsed().as_secs_f64(),
        wall.as_secs_f64(),
        st.report("crash runs"),
        final_wall.as_secs_f64(),
        rocksdb_leftovers(&crash.join("rocks")),
    );
}

#[test]
fn long_job_survives_sigkill_fs() {
    long_job_survives_sigkill(Backend::Fs, 0x5EED_0011);
}

#[test]
fn long_job_survives_sigkill_rocksdb() {
    long_job_survives_sigkill(Backend::Rocksdb, 0x5EED_0012);
}

// ---------------------------------------------------------------------------------------------
// 3. At-least-once: nothing lost, duplicates allowed (and counted).

#[test]
fn at_least_once_keeps_every_record() {
    const RECORDS: u64 = 100_000;
    let started = Instant::now();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let data = tmp.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = Rng::new(0x5EED_0021);
    let mut files: Vec<_> = (0..2)
        .map(|k| {
            std::io::BufWriter::new(
                std::fs::File::create(data.join(format!("events-{k}.jsonl"))).unwrap(),
            )
        })
        .collect();
    let mut reference = Vec::with_capacity(RECORDS as usize);
    for seq in 0..RECORDS {
        let amount = rng.below(1000) as i64;
        let user = format!("u{}", rng.below(LONG_USERS));
        let line = json!({"seq": seq, "user": user, "amount": amount});
        writeln!(files[(seq % 2) as usize], "{line}").unwrap();
        reference.push(
            json!({"seq": seq, "user": user, "amount": amount, "doubled": 2 * amount}).to_string(),
        );
    }
    for mut f in files {
        f.flush().unwrap();
    }
    reference.sort();
    let job = json!({
        "version": 1,
        "pipelines": [{
            "id": "doubled",
            "parallelism": 2,
            "sources": [{"id": "events", "type": "file", "path": data.to_str().unwrap()}],
            "operators": [{"id": "double", "type": "map", "input": "events",
                           "script": "fn map(r) { r.doubled = r.amount * 2; r }"}],
            "sinks": [{"id": "out", "type": "file", "input": "double", "path": "out/doubled"}],
        }],
    });
    let mut walls: Vec<Duration> = Vec::new();
    let mut outputs = Vec::new();
    let mut stats = KillStats::default();
    for (name, kills) in [("clean", 0), ("crash", 20)] {
        let dir = tmp.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("job.yaml"), job.to_string()).unwrap();
        let file = with_recovery(
            &dir.join("job.yaml"),
            &Recovery {
                backend: Backend::Fs,
                mode: "at_least_once",
                interval: "100ms",
                root: &dir,
            },
        );
        let mut runner = Runner::new(&file, &tmp.join("logs"), name);
        if kills > 0 {
            let lo = Duration::from_millis(50);
            let hi = walls[0].mul_f64(0.9).max(lo);
            stats = kill_loop(
                &mut runner,
                &mut rng,
                &KillPlan {
                    random: kills,
                    window: (lo, hi),
                    targeted: 5,
                },
            );
        }
        let (wall, log) = runner.run_to_end();
        stats.restored.extend(restores_in(&read_log(&log)));
        walls.push(wall);
        let sinks = file_sinks(&file);
        outputs.push(committed_marking_torn(&sinks[0].dir));
    }
    let (clean_missing, clean_extra) = OutputDiff::of(&outputs[0], &reference).counted();
    assert!(
        clean_missing.is_empty() && clean_extra.is_empty(),
        "failure-free run vs the sequential reference: {}",
        describe_counted(&clean_missing, &clean_extra)
    );
    let (missing, extra) = OutputDiff::of(&outputs[1], &reference).counted();
    // Extra copies of expected records are the duplicates at-least-once allows; any other
    // extra line (a torn or foreign record) is corrupt output.
    let known: std::collections::BTreeSet<&str> = reference.iter().map(String::as_str).collect();
    let (dups, foreign): (Vec<_>, Vec<_>) =
        extra.iter().partition(|(l, _)| known.contains(l.as_str()));
    let duplicates: usize = dups.iter().map(|(_, c)| c).sum();
    println!(
        "at_least_once_keeps_every_record in {:.1}s: failure-free run {:.2}s; {}; {} records \
         committed for {RECORDS} expected: {duplicates} duplicates ({} distinct records \
         duplicated), {} missing, {} foreign lines",
        started.elapsed().as_secs_f64(),
        walls[0].as_secs_f64(),
        stats.report("crash runs"),
        outputs[1].len(),
        dups.len(),
        missing.iter().map(|(_, c)| c).sum::<usize>(),
        foreign.iter().map(|(_, c)| c).sum::<usize>(),
    );
    let foreign: Vec<(String, usize)> = foreign.into_iter().cloned().collect();
    assert!(
        missing.is_empty() && foreign.is_empty(),
        "at-least-once output after {} SIGKILLs at {:?} ms lost or corrupted records: {}",
        stats.kills,
        stats.moments,
        describe_counted(&missing, &foreign)
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Sink output stays whole: SIGKILLs in the middle of writes never leave a torn line.

/// Lines of the visible parts of `dir` that are not JSON (torn writes), with their file.
#[cfg(target_os = "linux")]
fn torn_lines(dir: &Path) -> Vec<String> {
    let mut torn = Vec::new();
    for p in part_files(dir) {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&p).unwrap();
        if !text.is_empty() && !text.ends_with('\n') {
            torn.push(format!("{name}: no newline at the end"));
        }
        for l in text.lines() {
            if serde_json::from_str::<Value>(l).is_err() {
                torn.push(format!("{name}: {l}"));
            }
        }
    }
    torn
}

/// Freezes `child` (SIGSTOP), appends half a record to every file under `out` it holds open
/// (what the kernel leaves when SIGKILL cuts a `write` short: a `write` to a file checks for
/// a fatal signal between pages), then SIGKILLs it. Returns its exit and how many files were
/// torn (none when it had already ended or held no part open at that moment).
#[cfg(target_os = "linux")]
fn tear_and_kill(child: &mut Child, out: &Path, log: &Path) -> (ExitStatus, usize) {
    if let Some(s) = child.try_wait().unwrap() {
        return (s, 0);
    }
    let pid = child.id().to_string();
    assert!(signal(child.id(), "STOP"), "cannot stop `weir run` {pid}");
    let out = std::fs::canonicalize(out).unwrap_or_else(|_| out.to_path_buf());
    let mut torn = 0;
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if !target.starts_with(&out) || !target.is_file() {
                continue;
            }
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&target)
                .unwrap();
            f.write_all(b"{\"count\":58,\"k").unwrap();
            torn += 1;
        }
    }
    (kill_now(child, log), torn)
}

/// W1 emitting every update (the shape that once left `{"count":58,"k` in a part for good): a
/// count and sum per user on every record of one input file, into a file sink, killed at
/// random moments in the middle of a write (half a record appended to the part it is
/// writing, then SIGKILL), in every mode: `exactly_once`, `at_least_once` and without
/// checkpoints. After every kill each visible part holds whole lines only; after a final run
/// to the end, `at_least_once` holds every update of the sequential reference (duplicates
/// allowed) and nothing else, and the other two equal it exactly.
#[cfg(target_os = "linux")]
#[test]
fn sink_parts_stay_whole_across_sigkills() {
    const RECORDS: u64 = 40_000;
    const USERS: u64 = 300;
    let started = Instant::now();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let mut rng = Rng::new(0x5EED_0042);
    let data = tmp.join("events.jsonl");
    let mut input = std::io::BufWriter::new(std::fs::File::create(&data).unwrap());
    let mut totals: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut reference = Vec::with_capacity(RECORDS as usize);
    for seq in 0..RECORDS {
        let user = format!("u{}", rng.below(USERS));
        let amount = rng.below(1000) as i64;
        writeln!(
            input,
            "{}",
            json!({"seq": seq, "user": user, "amount": amount})
        )
        .unwrap();
        let t = totals.entry(user.clone()).or_default();
        t.0 += amount;
        t.1 += 1;
        reference.push(json!({"key": user, "sum": t.0, "count": t.1}).to_string());
    }
    input.flush().unwrap();
    drop(input);
    reference.sort();
    let mut report = Vec::new();
    for mode in ["exactly_once", "at_least_once", "none"] {
        let dir = tmp.join(mode);
        std::fs::create_dir_all(&dir).unwrap();
        let mut pipeline = json!({
            "id": "w1",
            "sources": [{"id": "in", "type": "file", "path": data.to_str().unwrap()}],
            "operators": [
                {"id": "by_user", "type": "key_by", "input": "in", "field": "user"},
                {"id": "totals", "type": "aggregate", "input": "by_user", "emit": "updates",
                 "aggregations": [{"fn": "sum", "field": "amount", "as": "sum"}, {"fn": "count"}]},
            ],
            "sinks": [{"id": "out", "type": "file", "input": "totals", "path": "out"}],
        });
        if mode != "none" {
            pipeline["state"] = json!({"backend": "fs"});
            pipeline["checkpoints"] = json!({"interval": "100ms", "mode": mode, "storage": "ck"});
            pipeline["restart"] =
                json!({"strategy": "fixed_delay", "attempts": 1000, "delay": "10ms"});
        }
        let file = dir.join("w1.json");
        let job = json!({"version": 1, "api": {"enabled": false}, "pipelines": [pipeline]});
        std::fs::write(&file, serde_json::to_string_pretty(&job).unwrap()).unwrap();
        let out = dir.join("out");
        let mut runner = Runner::new(&file, &tmp.join("logs"), mode);
        let (wall, _) = runner.run_to_end();
        let (missing, extra) = OutputDiff::of(&committed_marking_torn(&out), &reference).counted();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{mode}: the failure-free run differs from the sequential reference: {}",
            describe_counted(&missing, &extra)
        );
        let mut kills = 0;
        let mut tears = 0;
        let mut moments = Vec::new();
        for _ in 0..40 {
            if kills == 10 {
                break;
            }
            let at = rng.between(Duration::from_millis(30), wall.mul_f64(0.9));
            let spawned = Instant::now();
            let (mut child, log) = runner.spawn(&[]);
            std::thread::sleep(at.saturating_sub(spawned.elapsed()));
            let (status, torn_files) = tear_and_kill(&mut child, &out, &log);
            tears += torn_files;
            let torn = torn_lines(&out);
            assert!(
                torn.is_empty(),
                "{mode}: after a SIGKILL at {}ms a visible part holds a torn line: {torn:?}\n{}",
                at.as_millis(),
                log_excerpt(&log)
            );
            if status.signal() == Some(9) {
                kills += 1;
                moments.push(at.as_millis());
            } else {
                assert!(status.success(), "{mode}: {status}\n{}", log_excerpt(&log));
            }
        }
        assert!(kills >= 5, "{mode}: only {kills} runs could be killed");
        assert!(
            tears >= 3,
            "{mode}: only {tears} kills caught a part being written"
        );
        let (_, log) = runner.run_to_end();
        let output = committed_marking_torn(&out);
        let (missing, extra) = OutputDiff::of(&output, &reference).counted();
        let known: std::collections::BTreeSet<&str> =
            reference.iter().map(String::as_str).collect();
        let foreign: Vec<_> = extra
            .iter()
            .filter(|(l, _)| !known.contains(l.as_str()))
            .collect();
        assert!(
            missing.is_empty() && foreign.is_empty(),
            "{mode} after SIGKILLs at {moments:?} ms lost or corrupted records: {}\n{}",
            describe_counted(&missing, &extra),
            log_excerpt(&log)
        );
        if mode != "at_least_once" {
            assert!(
                extra.is_empty(),
                "{mode}: exactly-once, or without checkpoints the last run starts over: {}",
                describe_counted(&missing, &extra)
            );
        }
        assert_eq!(
            hidden_files(&out),
            0,
            "{mode}: parts left hidden after the end"
        );
        report.push(format!(
            "{mode}: {kills} SIGKILLs at {moments:?} ms ({tears} mid-line), {} duplicates",
            extra.iter().map(|(_, c)| c).sum::<usize>()
        ));
    }
    println!(
        "sink_parts_stay_whole_across_sigkills in {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        report.join("; ")
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Unaligned checkpoints under backpressure: a slow keyed reduce keeps its input channels
//    full, so checkpoint barriers overtake queued records, which the checkpoints store as
//    channel state and restores replay. Exactly-once must hold all the same, and some
//    checkpoint must really have stored channel state.

/// `running`'s reduce, made slow on purpose (a busy loop per record).
const SLOW_REDUCE: &str = "fn reduce(acc, r) { let x = 0; for i in 0..60 { x += i; } \
                           #{user: acc.user, amount: acc.amount + r.amount, ts: r.ts} }";

/// The running totals [`slow_job`] emits, one per order, sorted (a sequential reference).
fn running_reference(orders: &[(String, i64, i64)]) -> BTreeMap<String, Vec<String>> {
    let mut running: BTreeMap<&str, i64> = BTreeMap::new();
    let mut r: Vec<String> = orders
        .iter()
        .map(|(user, amount, ts)| {
            let acc = running.entry(user).or_default();
            *acc += amount;
            json!({"key": user, "user": user, "amount": *acc, "ts": ts}).to_string()
        })
        .collect();
    r.sort();
    BTreeMap::from([("running/out".to_owned(), r)])
}

/// `running` of the long job over every order (more than the channels hold, so that the
/// sources are still reading when checkpoints come) with [`SLOW_REDUCE`], at `parallelism`.
fn slow_job(data: &Path, parallelism: u32) -> Value {
    json!({
        "version": 1,
        "pipelines": [{
            "id": "running",
            "parallelism": parallelism,
            "sources": [{"id": "orders", "type": "file", "path": data.join("all").to_str().unwrap()}],
            "operators": [
                {"id": "by_user", "type": "key_by", "input": "orders", "field": "user"},
                {"id": "result", "type": "reduce", "input": "by_user", "emit": "updates",
                 "script": SLOW_REDUCE},
            ],
            "sinks": [{"id": "out", "type": "file", "input": "result", "path": "out/running"}],
        }],
    })
}

/// `weir run` arguments for [`slow_job`]: a thread per task, so that the throttled reduce
/// does not starve the sources of the cores (with one thread per core on a loaded machine the
/// channels run dry, no barrier has records to overtake and no alignment lasts long enough
/// for `aligned_timeout`).
fn slow_job_args() -> Vec<String> {
    vec!["--workers".to_owned(), "8".to_owned()]
}

/// Writes [`slow_job`] into `dir` with checkpoints every 50ms on `backend` and the extra
/// checkpoint `settings` (unaligned ones); returns the file.
fn prepare_slow_job(
    dir: &Path,
    data: &Path,
    backend: Backend,
    settings: &Value,
) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let job = serde_json::to_string_pretty(&slow_job(data, 2)).unwrap();
    std::fs::write(dir.join("job.yaml"), job).unwrap();
    let file = with_recovery(
        &dir.join("job.yaml"),
        &Recovery {
            backend,
            mode: "exactly_once",
            interval: "50ms",
            root: dir,
        },
    );
    with_checkpoint_settings(&file, settings);
    file
}

fn unaligned_checkpoints_survive_sigkill(backend: Backend, settings: Value, seed: u64) {
    let started = Instant::now();
    let scratch = Scratch::new();
    let tmp = scratch.path();
    let data = tmp.join("data");
    let orders = write_orders(&data, seed);
    let expected = running_reference(&orders);
    drop(orders);

    // Failure-free: the sequential reference.
    let clean = tmp.join("clean");
    let clean_file = prepare_slow_job(&clean, &data, backend, &settings);
    let mut runner = Runner::new(&clean_file, &tmp.join("logs"), "clean");
    runner.args = slow_job_args();
    let (wall, _) = runner.run_to_end();
    assert_exactly(
        "unaligned",
        &expected,
        &file_sinks(&clean_file),
        "failure-free run with unaligned checkpoints vs the sequential reference",
    );
    let clean_channel = checkpoints_with_channel_state(&clean.join("checkpoints")).len();

    // Killed again and again, then run to the end.
    let crash = tmp.join("crash");
    let file = prepare_slow_job(&crash, &data, backend, &settings);
    let sinks = file_sinks(&file);
    let mut runner = Runner::new(&file, &tmp.join("logs"), "crash");
    runner.args = slow_job_args();
    let lo = Duration::from_millis(50);
    let mut rng = Rng::new(seed);
    let mut st = kill_loop(
        &mut runner,
        &mut rng,
        &KillPlan {
            random: 8,
            window: (lo, wall.mul_f64(0.9).max(lo)),
            targeted: 4,
        },
    );
    let crash_channel = checkpoints_with_channel_state(&crash.join("checkpoints")).len();
    let (final_wall, log) = runner.run_to_end();
    st.restored.extend(restores_in(&read_log(&log)));
    assert_exactly(
        "unaligned",
        &expected,
        &sinks,
        &format!(
            "unaligned ({}, {settings}): output after {} SIGKILLs at {:?} ms differs from the \
             sequential reference\n{}",
            backend.name(),
            st.kills,
            st.moments,
            log_excerpt(&log)
        ),
    );
    assert!(
        clean_channel + crash_channel > 0,
        "no completed checkpoint stored channel state: the test did not exercise unaligned \
         barriers ({settings})"
    );
    println!(
        "unaligned_checkpoints_survive_sigkill_{} {settings} in {:.1}s: failure-free run {:.2}s; \
         completed checkpoints with channel state: {clean_channel} failure-free, \
         {crash_channel} in the crash runs; {}; final run {:.2}s",
        backend.name(),
        started.elapsed().as_secs_f64(),
        wall.as_secs_f64(),
        st.report("crash runs"),
        final_wall.as_secs_f64(),
    );
}

#[test]
fn unaligned_checkpoints_stay_exactly_once_under_kills_with_a_slow_sink() {
    let settings = json!({"unaligned": true, "retain": 1000});
    unaligned_checkpoints_survive_sigkill(Backend::Fs, settings.clone(), 0x5EED_0061);
    unaligned_checkpoints_survive_sigkill(Backend::Rocksdb, settings, 0x5EED_0062);
}

#[test]
fn unaligned_checkpoints_with_an_aligned_timeout_stay_exactly_once() {
    let settings = json!({"unaligned": true, "aligned_timeout": "5ms", "retain": 1000});
    unaligned_checkpoints_survive_sigkill(Backend::Fs, settings.clone(), 0x5EED_0063);
    unaligned_checkpoints_survive_sigkill(Backend::Rocksdb, settings, 0x5EED_0064);
}

/// A run killed right after a checkpoint that stored channel state, restored from that
/// checkpoint at another parallelism: keyed channel state goes to the new subtask owning its
/// key group, and the output is exactly the sequential reference.
#[test]
fn unaligned_channel_state_is_redistributed_on_rescale() {
    for (backend, parallelism, seed) in [
        (Backend::Fs, 3, 0x5EED_0071_u64),
        (Backend::Rocksdb, 1, 0x5EED_0072),
    ] {
        let scratch = Scratch::new();
        let tmp = scratch.path();
        let data = tmp.join("data");
        let orders = write_orders(&data, seed);
        let expected = running_reference(&orders);
        drop(orders);
        let dir = tmp.join("crash");
        let settings = json!({"unaligned": true, "retain": 1000});
        let file = prepare_slow_job(&dir, &data, backend, &settings);
        let sinks = file_sinks(&file);
        let mut runner = Runner::new(&file, &tmp.join("logs"), "rescale");
        runner.args = slow_job_args();
        // Run until a completed checkpoint holds channel state, then SIGKILL.
        let mut from = None;
        for _attempt in 0..5 {
            let (mut child, log) = runner.spawn(&[]);
            let found = loop {
                let found = checkpoints_with_channel_state(&dir.join("checkpoints"));
                if let Some(last) = found.last() {
                    break Some(last.clone());
                }
                if child.try_wait().unwrap().is_some() {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            kill_now(&mut child, &log);
            if found.is_some() {
                from = found;
                break;
            }
            // The run ended before any: start over on fresh storage and output.
            let _ = std::fs::remove_dir_all(dir.join("checkpoints"));
            let _ = std::fs::remove_dir_all(dir.join("out"));
        }
        let from = from.expect("no run stored channel state in a completed checkpoint");

        // The same job at another parallelism, from that checkpoint, to the end.
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        v["pipelines"][0]["parallelism"] = json!(parallelism);
        std::fs::write(&file, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        let (mut child, log) = runner.spawn(&["--from-checkpoint", from.to_str().unwrap()]);
        let status = wait_bounded(&mut child, HANG, &log);
        assert!(
            status.success(),
            "rescaled run exited with {status}\n{}",
            log_excerpt(&log)
        );
        assert_exactly(
            "rescale",
            &expected,
            &sinks,
            &format!(
                "{} restored from {} at parallelism {parallelism}: output differs from the \
                 sequential reference\n{}",
                backend.name(),
                from.display(),
                log_excerpt(&log)
            ),
        );
    }
}
