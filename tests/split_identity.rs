//! A file source knows a file by its canonical path, never by how `path:` spelled it: through
//! the real `weir` binary, a follow-mode file and a follow-mode glob are read exactly once
//! across a `--watch` reload (which resolves the pipeline file's directory as an absolute
//! path, where the first run named it relatively), a restart from another working directory,
//! and a restart through a symlinked directory. Each run appends lines, lets them commit
//! (exactly-once file sink), stops with SIGINT (a final checkpoint) and checks the output:
//! every line once, none lost.
#![cfg(unix)]
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use common::binary::signal;
use common::files::write_by_rename;
use common::output::committed;
use common::run::DEADLINE;
use common::running::Running;

/// Two pipelines: `single` follows one file named relatively, `glob` follows a glob; both tag
/// records with `v`.
fn pipeline_file(v: u32) -> String {
    format!(
        "version: 1
pipelines:
  - id: single
    checkpoints: {{interval: 1s}}
    state: {{backend: fs}}
    sources:
      - {{id: events, type: file, path: data/events.jsonl, follow: true}}
    operators:
      - {{id: tag, type: map, input: events, script: 'fn map(r) {{ r.v = {v}; r }}'}}
    sinks:
      - {{id: out, type: file, input: tag, path: out/single}}
  - id: glob
    checkpoints: {{interval: 1s}}
    state: {{backend: fs}}
    sources:
      - {{id: logs, type: file, path: logs/*.jsonl, follow: true}}
    operators:
      - {{id: tag, type: map, input: logs, script: 'fn map(r) {{ r.v = {v}; r }}'}}
    sinks:
      - {{id: out, type: file, input: tag, path: out/glob}}
"
    )
}

/// Appends records `{"id": i}` for `ids` to `path`.
fn append(path: &Path, ids: std::ops::Range<u64>) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for i in ids {
        writeln!(f, "{{\"id\":{i}}}").unwrap();
    }
}

/// The committed output of a pipeline as `id -> [v, ...]` (one entry per output line).
fn output(dir: &Path, pipeline: &str) -> BTreeMap<u64, Vec<u64>> {
    let mut by_id: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let out = dir.join("out").join(pipeline);
    if !out.is_dir() {
        return by_id;
    }
    for line in committed(&out) {
        let v: serde_json::Value = serde_json::from_str(&line).expect("an output line is JSON");
        by_id
            .entry(v["id"].as_u64().expect("an id"))
            .or_default()
            .push(v["v"].as_u64().expect("a v"));
    }
    by_id
}

/// Waits until both pipelines committed `single` and `glob` lines, then for two more
/// completed checkpoints of each (a duplicate read would have been committed by then).
fn settle(run: &Running, dir: &Path, single: usize, glob: usize) {
    let start = Instant::now();
    loop {
        let lines = |p| output(dir, p).values().map(Vec::len).sum::<usize>();
        if lines("single") >= single && lines("glob") >= glob {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "waiting for {single} + {glob} committed lines: {} + {}\n{}",
            lines("single"),
            lines("glob"),
            run.log()
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    let latest = |s: &weir_engine::control::JobStatus, id: &str| {
        s.pipelines
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| p.latest_checkpoint)
            .unwrap_or(0)
    };
    let now = run.status();
    let (a, b) = (latest(&now, "single"), latest(&now, "glob"));
    run.wait_until("two more checkpoints", |s| {
        latest(s, "single") >= a + 2 && latest(s, "glob") >= b + 2
    });
}

/// Stops the run with SIGINT (a final checkpoint) and waits for its clean end.
fn interrupt(mut run: Running) {
    assert!(signal(run.pid(), "INT"));
    assert!(run.wait_exit(DEADLINE), "the run failed:\n{}", run.log());
}

/// Every id of `0..n` exactly once, with `v` as `expected_v(id)`.
fn check_once(dir: &Path, pipeline: &str, n: u64, expected_v: impl Fn(u64) -> u64, log: &str) {
    let got = output(dir, pipeline);
    let dups: Vec<_> = got.iter().filter(|(_, vs)| vs.len() > 1).take(5).collect();
    assert!(
        dups.is_empty(),
        "{pipeline}: {} ids read more than once, e.g. {dups:?}\n{log}",
        got.values().filter(|vs| vs.len() > 1).count()
    );
    let missing: Vec<u64> = (0..n).filter(|i| !got.contains_key(i)).take(5).collect();
    assert!(
        missing.is_empty(),
        "{pipeline}: ids lost, e.g. {missing:?}\n{log}"
    );
    assert_eq!(got.len() as u64, n, "{pipeline}: foreign ids\n{log}");
    for (id, vs) in &got {
        assert_eq!(vs[0], expected_v(*id), "{pipeline}: id {id}\n{log}");
    }
}

#[test]
fn follow_sources_read_every_line_once_whatever_the_spelling_of_their_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("project");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    append(&dir.join("data/events.jsonl"), 0..1000);
    append(&dir.join("logs/a.jsonl"), 0..500);
    append(&dir.join("logs/b.jsonl"), 500..1000);
    let file = dir.join("g.yaml");
    std::fs::write(&file, pipeline_file(1)).unwrap();

    // 1. `weir run g.yaml --watch` in the project directory; edit the scripts (a reload,
    //    which names the directory absolutely), then append.
    let run = Running::start(&dir, Path::new("g.yaml"), &["--watch"]);
    settle(&run, &dir, 1000, 1000);
    write_by_rename(&file, &pipeline_file(2));
    run.wait_outcome(0, "applied");
    append(&dir.join("data/events.jsonl"), 1000..1010);
    append(&dir.join("logs/a.jsonl"), 1000..1005);
    append(&dir.join("logs/c.jsonl"), 1005..1010);
    settle(&run, &dir, 1010, 1010);
    let log = run.log();
    interrupt(run);
    let v = |id| if id < 1000 { 1 } else { 2 };
    check_once(&dir, "single", 1010, v, &log);
    check_once(&dir, "glob", 1010, v, &log);

    // 2. Resumed from another working directory: `weir run project/g.yaml`.
    let run = Running::start(tmp.path(), Path::new("project/g.yaml"), &[]);
    append(&dir.join("data/events.jsonl"), 1010..1020);
    append(&dir.join("logs/b.jsonl"), 1010..1015);
    append(&dir.join("logs/d.jsonl"), 1015..1020);
    settle(&run, &dir, 1020, 1020);
    let log = run.log();
    interrupt(run);
    check_once(&dir, "single", 1020, v, &log);
    check_once(&dir, "glob", 1020, v, &log);

    // 3. Resumed through a symlink to the project directory, by an absolute path.
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let run = Running::start(tmp.path(), &link.join("g.yaml"), &[]);
    append(&dir.join("data/events.jsonl"), 1020..1030);
    append(&dir.join("logs/e.jsonl"), 1020..1030);
    settle(&run, &dir, 1030, 1030);
    let log = run.log();
    interrupt(run);
    check_once(&dir, "single", 1030, v, &log);
    check_once(&dir, "glob", 1030, v, &log);
}
