//! Ending honestly, through the real `weir` binary: checkpoint storage on a full disk makes
//! the restart strategy give up, and `weir run` then exits (non-zero, promptly) naming the
//! operating system's error as an environment error, not a bug in Weir; a pipeline that
//! restarts over a poison record shows the failure count, the failing operator and the error
//! in `weir status`, and when it is stopped while restarting its summary says FAILED, never
//! `ok`.
#![cfg(unix)]
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::binary::signal;
use common::run::DEADLINE;
use common::running::Running;

/// A small tmpfs mounted for the test (unmounted when dropped), filled to the last byte.
struct FullDisk {
    dir: PathBuf,
}

impl FullDisk {
    /// Mounts and fills a 64 KiB tmpfs at `dir`; `None` when this process may not mount
    /// (not root, or no `CAP_SYS_ADMIN`).
    fn mount(dir: &Path) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return None;
        }
        let disk = Self {
            dir: dir.to_path_buf(),
        };
        let mut fill = std::fs::File::create(dir.join("fill")).unwrap();
        let block = vec![0u8; 4096];
        loop {
            match fill.write_all(&block) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        let _ = fill.sync_all();
        Some(disk)
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// An endless generator through a keyed count into a file sink, checkpointing every 200 ms
/// into `storage`, with `state`, `restart` and `tolerable_failures: 0`.
fn endless(storage: &str, state: &str, restart: &str) -> String {
    format!(
        "version: 1
pipelines:
  - id: full
    checkpoints: {{interval: 200ms, storage: {storage}, tolerable_failures: 0}}
    state: {state}
    restart: {restart}
    sources:
      - {{id: ev, type: generator, rate: 2000, fields: {{n: {{kind: sequence}}}}}}
    operators:
      - {{id: by_ten, type: key_by, input: ev, script: 'fn key(r) {{ r.n % 10 }}'}}
      - {{id: counts, type: aggregate, input: by_ten, aggregations: [{{fn: count}}]}}
    sinks:
      - {{id: out, type: file, input: counts, path: out}}
"
    )
}

#[test]
fn a_full_checkpoint_disk_ends_the_run_with_an_environment_error() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = tmp.path().join("ckpt");
    // Checkpoint storage on a full tmpfs, RocksDB's working directory too. Where this process
    // may not mount one, the storage directory is swapped for a regular file once the run has
    // completed a checkpoint (which fails the next writes for root as for anyone else).
    let disk = FullDisk::mount(&storage);
    let os_errors: &[&str] = if disk.is_some() {
        &["No space left on device"]
    } else {
        &["Not a directory", "No such file or directory"]
    };
    let file = tmp.path().join("p.yaml");
    let fs = "{backend: fs}";
    let rocksdb = "{backend: rocksdb, path: ckpt/full/rocks}";
    let fixed = "{strategy: fixed_delay, attempts: 2, delay: 100ms}";
    let exponential = "{strategy: exponential_delay, initial: 50ms, max: 200ms, attempts: 3}";
    for (i, (storage_dir, state, restart, gives_up)) in [
        ("ckpt", fs, fixed, true),
        ("ckpt", fs, exponential, true),
        ("store", rocksdb, fixed, false),
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&file, endless(storage_dir, state, restart)).unwrap();
        if disk.is_none() {
            std::fs::create_dir_all(storage.join("full")).unwrap();
        }
        let mut run = Running::start(tmp.path(), Path::new("p.yaml"), &[]);
        if disk.is_none() {
            run.wait_until("a first checkpoint", |s| {
                s.pipelines.iter().any(|p| p.latest_checkpoint.is_some())
            });
            std::fs::rename(&storage, tmp.path().join(format!("moved-{i}"))).unwrap();
            std::fs::write(&storage, b"not a directory").unwrap();
        }
        // It used to hang here forever after "Not restarting".
        let ok = run.wait_exit(DEADLINE);
        let log = run.log();
        let case = format!("{state} {restart}");
        assert!(!ok, "{case}: the run must fail:\n{log}");
        assert!(
            os_errors.iter().any(|e| log.contains(e)),
            "{case}: the OS error is named:\n{log}"
        );
        if gives_up {
            assert!(log.contains("gave up"), "{case}:\n{log}");
        }
        assert!(
            log.contains("external I/O error") && !log.contains("bug in Weir"),
            "{case}: a full disk is the environment's fault:\n{log}"
        );
        assert!(log.contains("pipeline full: FAILED"), "{case}:\n{log}");
        if disk.is_none() {
            std::fs::remove_file(&storage).unwrap();
        }
    }
    drop(disk);
}

/// A map that throws on one record of a bounded generator, with checkpoints and the default
/// restart strategy (`exponential_delay`, no limit), its back-off long next to the time the
/// pipeline takes to reach the record again.
const POISON: &str = "version: 1
pipelines:
  - id: poison
    checkpoints: {interval: 300ms}
    state: {backend: fs}
    restart: {strategy: exponential_delay, initial: 1s, max: 5s}
    sources:
      - {id: ev, type: generator, count: 100000, rate: 5000, fields: {n: {kind: sequence}}}
    operators:
      - id: check
        type: map
        input: ev
        script: |
          fn map(r) { if r.n == 700 { throw \"poison record\" } r }
    sinks:
      - {id: out, type: file, input: check, path: out}
";

#[test]
fn a_pipeline_stopped_while_restarting_over_a_poison_record_is_reported_failed() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("p.yaml"), POISON).unwrap();
    let mut run = Running::start(tmp.path(), Path::new("p.yaml"), &[]);
    let status = run.wait_until("two failures in a row, waiting to restart", |s| {
        s.pipelines
            .iter()
            .any(|p| p.id == "poison" && p.consecutive_failures >= 2 && p.state == "restarting")
    });
    let p = &status.pipelines[0];
    assert_eq!(p.failing.as_deref(), Some("check"), "{p:#?}");
    assert!(
        p.last_error
            .as_deref()
            .is_some_and(|e| e.contains("poison record")),
        "{p:#?}"
    );
    assert!(p.restarts >= 1, "{p:#?}");
    // The table says it too.
    let out = run.cli(&["status"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("failures in a row; the last, in `check`"),
        "{table}"
    );

    // Ctrl-C while it waits to restart.
    assert!(signal(run.pid(), "INT"));
    let ok = run.wait_exit(DEADLINE);
    let log = run.log();
    assert!(
        !ok,
        "a pipeline that never got past its poison record did not succeed:\n{log}"
    );
    assert!(log.contains("pipeline poison: FAILED"), "{log}");
    assert!(!log.contains("pipeline poison: ok"), "{log}");
    assert!(log.contains("stopped while restarting"), "{log}");
    assert!(log.contains("poison record"), "{log}");
}
