//! The reload and restore conformance matrix: every source kind × every edit × every way an
//! edit reaches a running pipeline, each cell asserting that the exactly-once file sinks end
//! with the output of a failure-free run (0 lost, 0 duplicated).
//!
//! - **Sources** (one pipeline each, all in one file, so one `weir run` serves six cells):
//!   a bounded jsonl file, a followed jsonl file, a followed glob (a new file appears after
//!   the edit), a followed csv file, a bounded `lines` file, a generator.
//! - **Edits**: a script change (an equivalent rewrite), parallelism up (2 → 3) and down
//!   (2 → 1), another state backend (fs → rocksdb), an operator added, a stateful operator
//!   removed (with `--allow-non-restored-state`), the source path spelled absolute instead of
//!   relative, another working directory.
//! - **Ways**: saving the file under `weir run --watch`, `weir reload`, `weir stop
//!   --savepoint` then `weir run --from-savepoint`, SIGKILL then `weir run` (resume from the
//!   latest checkpoint, into the edited file).
//!
//! Each pipeline: the source under test and a slow, never-ending "pacer" generator (its
//! records are filtered out at once; it keeps pipelines with bounded sources alive across
//! the edit) → `union` → `filter` → `map` to `{id, k}` → the `raw` sink; and → `key_by k` → a running
//! count per key (`aggregate`, every update) → the `counts` sink. Followed inputs grow after
//! the edit. The failure-free output is one straight run of the same pipelines over the whole
//! input with bounded sources (shared by every cell, computed once); a cell waits until its
//! sinks hold at least as many lines, stops with SIGTERM (a final checkpoint) and compares.
//!
//! Pruned, and why:
//! - another working directory under `--watch` or `weir reload`: a running process keeps its
//!   working directory, and a reload re-reads the same file; only a new process
//!   (`--from-savepoint`, a resume) can start elsewhere;
//! - the generator under the parallelism edits keeps its own parallelism (its operators
//!   rescale): a generator cannot rescale by design (its sequence is interleaved over its
//!   subtasks), which [`a_generator_rescale_is_refused_by_reload_and_restore`] asserts;
//! - the path edits leave the generator pipeline as it is (it names no path): it then checks
//!   that an unchanged pipeline next to reloaded ones stays exact.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::files::{append, write_by_rename};
use common::output::{OutputDiff, committed};
use common::run::{Run, run_to_end};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    BoundedFile,
    FollowFile,
    FollowGlob,
    Csv,
    Lines,
    Generator,
}

const SOURCES: [Source; 6] = [
    Source::BoundedFile,
    Source::FollowFile,
    Source::FollowGlob,
    Source::Csv,
    Source::Lines,
    Source::Generator,
];

impl Source {
    /// The pipeline id.
    fn id(self) -> &'static str {
        match self {
            Self::BoundedFile => "bounded_file",
            Self::FollowFile => "follow_file",
            Self::FollowGlob => "follow_glob",
            Self::Csv => "csv",
            Self::Lines => "lines",
            Self::Generator => "generator",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edit {
    Script,
    ParallelismUp,
    ParallelismDown,
    Backend,
    OperatorAdded,
    OperatorRemoved,
    AbsolutePath,
    OtherWorkingDir,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Watch,
    Reload,
    Savepoint,
    Kill,
}

/// Records per input phase (before and after the edit) of each file source.
const PHASE: usize = 1_500;
/// Records of the generator under test.
const GENERATED: usize = 3_000;

/// One version of the pipeline file.
#[derive(Clone, Debug)]
struct Version {
    parallelism: u32,
    backend: &'static str,
    /// The equivalent rewrite of the `map` script.
    rewritten: bool,
    /// A pass-through `map` between the filter and `shape`.
    extra: bool,
    /// A second keyed branch (`audit`, with its own sink).
    audit: bool,
    /// Source paths spelled absolute under this directory.
    absolute: Option<PathBuf>,
    /// The failure-free reference: bounded sources, no rates.
    golden: bool,
}

impl Default for Version {
    fn default() -> Self {
        Self {
            parallelism: 2,
            backend: "fs",
            rewritten: false,
            extra: false,
            audit: false,
            absolute: None,
            golden: false,
        }
    }
}

impl Version {
    fn path(&self, relative: &str) -> String {
        match &self.absolute {
            Some(dir) => dir.join(relative).to_string_lossy().into_owned(),
            None => relative.to_owned(),
        }
    }

    fn source(&self, source: Source) -> String {
        let follow = !self.golden;
        match source {
            Source::BoundedFile => format!(
                "{{ id: src, type: file, path: \"{}\" }}",
                self.path("data/bounded.jsonl")
            ),
            Source::FollowFile => format!(
                "{{ id: src, type: file, path: \"{}\", follow: {follow} }}",
                self.path("data/follow.jsonl")
            ),
            Source::FollowGlob => format!(
                "{{ id: src, type: file, path: \"{}\", follow: {follow} }}",
                self.path("data/glob/*.jsonl")
            ),
            Source::Csv => format!(
                "{{ id: src, type: file, format: csv, path: \"{}\", follow: {follow} }}",
                self.path("data/follow.csv")
            ),
            Source::Lines => format!(
                "{{ id: src, type: file, format: lines, path: \"{}\" }}",
                self.path("data/lines.txt")
            ),
            Source::Generator => {
                let rate = if self.golden { "" } else { ", rate: 1500" };
                format!(
                    "{{ id: src, type: generator, parallelism: 1, seed: 5, count: {GENERATED}{rate}, \
                     fields: {{ seq: {{ kind: sequence }}, k: {{ kind: key, prefix: k, cardinality: 17 }} }} }}"
                )
            }
        }
    }

    fn shape_script(&self, source: Source) -> &'static str {
        match (source, self.rewritten) {
            (Source::Lines, false) => {
                r#"fn map(r) { let p = r.line.split(" "); #{id: p[0], k: p[1]} }"#
            }
            (Source::Lines, true) => {
                r#"fn map(r) { let id = r.line.sub_string(0, r.line.index_of(" ")); let k = r.line.sub_string(r.line.index_of(" ") + 1); #{k: k, id: id} }"#
            }
            (Source::Generator, false) => r#"fn map(r) { #{id: `g${r.seq}`, k: r.k} }"#,
            (Source::Generator, true) => r#"fn map(r) { let id = `g${r.seq}`; #{k: r.k, id: id} }"#,
            (_, false) => r#"fn map(r) { #{id: r.id, k: r.k} }"#,
            (_, true) => r#"fn map(r) { let id = r.id; #{k: r.k, id: id} }"#,
        }
    }

    fn pipeline(&self, source: Source) -> String {
        let id = source.id();
        let pacer = if self.golden { "count: 1" } else { "rate: 20" };
        let shape_input = if self.extra { "extra" } else { "clean" };
        let extra = if self.extra {
            "      - { id: extra, type: map, input: clean, script: \"fn map(r) { r }\" }\n"
        } else {
            ""
        };
        let (audit, audit_sink) = if self.audit {
            (
                "      - { id: audit, type: aggregate, input: by, emit: updates, aggregations: [{ fn: count, as: n }] }\n".to_owned(),
                format!("      - {{ id: audit_out, type: file, input: audit, path: out/{id}/audit }}\n"),
            )
        } else {
            (String::new(), String::new())
        };
        format!(
            r#"  - id: {id}
    parallelism: {parallelism}
    max_parallelism: 64
    state: {{ backend: {backend} }}
    checkpoints: {{ mode: exactly_once, interval: 200ms, storage: ck }}
    restart: {{ strategy: none }}
    sources:
      - {source}
      - {{ id: pacer, type: generator, parallelism: 1, {pacer}, fields: {{ pacer: {{ kind: sequence }} }} }}
    operators:
      - {{ id: both, type: union, inputs: [src, pacer] }}
      - {{ id: clean, type: filter, input: both, script: "fn filter(r) {{ !(`pacer` in r) }}" }}
{extra}      - id: shape
        type: map
        input: {shape_input}
        script: '{script}'
      - {{ id: by, type: key_by, input: shape, field: k }}
      - {{ id: count, type: aggregate, input: by, emit: updates, aggregations: [{{ fn: count, as: n }}] }}
{audit}    sinks:
      - {{ id: raw, type: file, input: shape, path: out/{id}/raw }}
      - {{ id: counts, type: file, input: count, path: out/{id}/counts }}
{audit_sink}"#,
            parallelism = self.parallelism,
            backend = self.backend,
            source = self.source(source),
            script = self.shape_script(source),
        )
    }

    fn file(&self) -> String {
        let mut out = String::from("version: 1\npipelines:\n");
        for s in SOURCES {
            out.push_str(&self.pipeline(s));
        }
        out
    }
}

/// The versions before and after an edit.
fn versions(edit: Edit, dir: &Path) -> (Version, Version) {
    let old = Version::default();
    let new = match edit {
        Edit::Script => Version {
            rewritten: true,
            ..old.clone()
        },
        Edit::ParallelismUp => Version {
            parallelism: 3,
            ..old.clone()
        },
        Edit::ParallelismDown => Version {
            parallelism: 1,
            ..old.clone()
        },
        Edit::Backend => Version {
            backend: "rocksdb",
            ..old.clone()
        },
        Edit::OperatorAdded => Version {
            extra: true,
            ..old.clone()
        },
        Edit::OperatorRemoved => {
            return (
                Version {
                    audit: true,
                    ..old.clone()
                },
                old,
            );
        }
        Edit::AbsolutePath => Version {
            absolute: Some(dir.to_path_buf()),
            ..old.clone()
        },
        Edit::OtherWorkingDir => old.clone(),
    };
    (old, new)
}

fn jsonl(prefix: &str, range: std::ops::Range<usize>) -> String {
    range
        .map(|i| format!("{{\"id\":\"{prefix}{i}\",\"k\":\"k{}\"}}\n", i % 17))
        .collect()
}

/// The input before the edit: the bounded files whole, the followed ones' first phase.
fn write_phase_one(dir: &Path) {
    let d = dir.join("data");
    append(&d.join("bounded.jsonl"), &jsonl("b", 0..2 * PHASE));
    append(&d.join("follow.jsonl"), &jsonl("f", 0..PHASE));
    append(&d.join("glob/part-0.jsonl"), &jsonl("g", 0..PHASE));
    let csv: String = (0..PHASE).map(|i| format!("c{i},k{}\n", i % 17)).collect();
    append(&d.join("follow.csv"), &format!("id,k\n{csv}"));
    let lines: String = (0..2 * PHASE)
        .map(|i| format!("l{i} k{}\n", i % 17))
        .collect();
    append(&d.join("lines.txt"), &lines);
}

/// The input after the edit: more lines in the followed files, a new file in the glob.
fn write_phase_two(dir: &Path) {
    let d = dir.join("data");
    append(&d.join("follow.jsonl"), &jsonl("f", PHASE..2 * PHASE));
    append(&d.join("glob/part-1.jsonl"), &jsonl("g", PHASE..2 * PHASE));
    let csv: String = (PHASE..2 * PHASE)
        .map(|i| format!("c{i},k{}\n", i % 17))
        .collect();
    append(&d.join("follow.csv"), &csv);
}

const SINKS: [&str; 2] = ["raw", "counts"];

/// The failure-free output of every pipeline's sinks: one straight run over the whole input.
fn golden() -> &'static BTreeMap<(Source, &'static str), Vec<String>> {
    static GOLDEN: OnceLock<BTreeMap<(Source, &'static str), Vec<String>>> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        write_phase_one(dir.path());
        write_phase_two(dir.path());
        let file = dir.path().join("golden.yaml");
        let v = Version {
            golden: true,
            ..Version::default()
        };
        std::fs::write(&file, v.file()).unwrap();
        let (ok, log) = run_to_end(dir.path(), &file, &[]);
        assert!(ok, "the failure-free run failed:\n{log}");
        let mut out = BTreeMap::new();
        for s in SOURCES {
            for sink in SINKS {
                let lines = committed(&dir.path().join(format!("out/{}/{sink}", s.id())));
                let expected = if s == Source::Generator {
                    GENERATED
                } else {
                    2 * PHASE
                };
                assert_eq!(lines.len(), expected, "{s:?}/{sink}: the failure-free run");
                out.insert((s, sink), lines);
            }
        }
        out
    })
}

fn ids() -> Vec<&'static str> {
    SOURCES.iter().map(|s| s.id()).collect()
}

/// Every sink of every pipeline holds every line of the failure-free output (and maybe more).
fn complete(dir: &Path) -> bool {
    let golden = golden();
    SOURCES.iter().all(|s| {
        SINKS.iter().all(|sink| {
            let got = committed(&dir.join(format!("out/{}/{sink}", s.id())));
            got.len() >= golden[&(*s, *sink)].len()
                && OutputDiff::of(&got, &golden[&(*s, *sink)]).lost.is_empty()
        })
    })
}

/// One cell row: the edit applied one way to all six pipelines; each pipeline's sinks are
/// compared with the failure-free run, and every source kind that differs is reported.
fn cell(edit: Edit, way: Way) {
    let golden = golden();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_phase_one(dir);
    let (old, new) = versions(edit, dir);
    let file = dir.join("p.yaml");
    std::fs::write(&file, old.file()).unwrap();
    let allow = edit == Edit::OperatorRemoved;
    let mut first_args = Vec::new();
    if way == Way::Watch {
        first_args.push("--watch");
        if allow {
            first_args.push("--allow-non-restored-state");
        }
    }
    // Started the way most users do: in the file's directory, the file named relatively.
    let mut run = Run::start(dir, Path::new("p.yaml"), &first_args);
    run.wait_checkpoints(&ids(), 2);

    let mut run = match way {
        Way::Watch => {
            write_by_rename(&file, &new.file());
            let status = run.wait_for("the reload", |s| {
                s["last_reload"]["result"]
                    .as_str()
                    .is_some_and(|r| r != "unchanged")
            });
            assert_eq!(
                status["last_reload"]["result"],
                "applied",
                "{edit:?} via {way:?}: {:#}\n{}",
                status["last_reload"],
                run.log()
            );
            run
        }
        Way::Reload => {
            write_by_rename(&file, &new.file());
            let mut args = vec!["reload"];
            if allow {
                args.push("--allow-non-restored-state");
            }
            let out = run.cli(&args);
            assert!(
                out.status.success(),
                "{edit:?} via {way:?}: {}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                run.log()
            );
            run
        }
        Way::Savepoint | Way::Kill => {
            let mut next_args: Vec<String> = Vec::new();
            if way == Way::Savepoint {
                for id in ids() {
                    let sp = run.stop_with_savepoint(id);
                    next_args.push("--from-savepoint".into());
                    next_args.push(sp.to_string_lossy().into_owned());
                }
                run.finish_ok();
            } else {
                run.kill();
            }
            if allow {
                next_args.push("--allow-non-restored-state".into());
            }
            write_by_rename(&file, &new.file());
            let (cwd, name) = if edit == Edit::OtherWorkingDir {
                (std::env::temp_dir(), file.clone())
            } else {
                (dir.to_path_buf(), PathBuf::from("p.yaml"))
            };
            let args: Vec<&str> = next_args.iter().map(String::as_str).collect();
            Run::start(&cwd, &name, &args)
        }
    };

    write_phase_two(dir);
    // Until every failure-free line is there (duplicates show at the comparison), or a
    // pipeline failed (what it lost shows at the comparison too).
    let until = std::time::Instant::now() + common::run::DEADLINE;
    while !complete(dir)
        && !run.log().contains("Pipeline failed.")
        && std::time::Instant::now() < until
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (_, log) = run.terminate_and_wait();

    let mut failures = Vec::new();
    for s in SOURCES {
        for sink in SINKS {
            let got = committed(&dir.join(format!("out/{}/{sink}", s.id())));
            let diff = OutputDiff::of(&got, &golden[&(s, sink)]);
            if !diff.is_empty() {
                failures.push(format!("  {s:?}/{sink}: {}", diff.describe()));
            }
        }
    }
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Pipeline failed."))
        .collect();
    assert!(
        failures.is_empty() && failed.is_empty(),
        "{edit:?} via {way:?}: not exactly once:\n{}\n{}\nthe last run's log:\n{log}",
        failures.join("\n"),
        failed.join("\n")
    );
}

macro_rules! matrix {
    ($($test:ident: $edit:ident via $way:ident;)*) => {
        $(
            #[test]
            fn $test() {
                cell(Edit::$edit, Way::$way);
            }
        )*
    };
}

matrix! {
    script_via_watch: Script via Watch;
    script_via_reload: Script via Reload;
    script_via_savepoint: Script via Savepoint;
    script_via_kill: Script via Kill;
    parallelism_up_via_watch: ParallelismUp via Watch;
    parallelism_up_via_reload: ParallelismUp via Reload;
    parallelism_up_via_savepoint: ParallelismUp via Savepoint;
    parallelism_up_via_kill: ParallelismUp via Kill;
    parallelism_down_via_watch: ParallelismDown via Watch;
    parallelism_down_via_reload: ParallelismDown via Reload;
    parallelism_down_via_savepoint: ParallelismDown via Savepoint;
    parallelism_down_via_kill: ParallelismDown via Kill;
    backend_via_watch: Backend via Watch;
    backend_via_reload: Backend via Reload;
    backend_via_savepoint: Backend via Savepoint;
    backend_via_kill: Backend via Kill;
    operator_added_via_watch: OperatorAdded via Watch;
    operator_added_via_reload: OperatorAdded via Reload;
    operator_added_via_savepoint: OperatorAdded via Savepoint;
    operator_added_via_kill: OperatorAdded via Kill;
    operator_removed_via_watch: OperatorRemoved via Watch;
    operator_removed_via_reload: OperatorRemoved via Reload;
    operator_removed_via_savepoint: OperatorRemoved via Savepoint;
    operator_removed_via_kill: OperatorRemoved via Kill;
    absolute_path_via_watch: AbsolutePath via Watch;
    absolute_path_via_reload: AbsolutePath via Reload;
    absolute_path_via_savepoint: AbsolutePath via Savepoint;
    absolute_path_via_kill: AbsolutePath via Kill;
    other_working_dir_via_savepoint: OtherWorkingDir via Savepoint;
    other_working_dir_via_kill: OtherWorkingDir via Kill;
}

/// The pruned generator cells: a generator source cannot change its parallelism, and both
/// the reload and the restore say so before anything changes.
#[test]
fn a_generator_rescale_is_refused_by_reload_and_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let text = |p: u32| {
        format!(
            r#"version: 1
pipelines:
  - id: gen
    max_parallelism: 64
    state: {{ backend: fs }}
    checkpoints: {{ mode: exactly_once, interval: 200ms, storage: ck }}
    sources:
      - {{ id: src, type: generator, parallelism: {p}, rate: 500, fields: {{ seq: {{ kind: sequence }} }} }}
    sinks:
      - {{ id: out, type: file, input: src, path: out }}
"#
        )
    };
    let file = dir.join("p.yaml");
    std::fs::write(&file, text(2)).unwrap();
    let mut run = Run::start(dir, Path::new("p.yaml"), &[]);
    run.wait_checkpoints(&["gen"], 1);
    write_by_rename(&file, &text(3));
    let out = run.cli(&["reload"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("reload rejected")
            && said.contains("a generator cannot change its parallelism"),
        "{said}"
    );
    write_by_rename(&file, &text(2));
    let sp = run.stop_with_savepoint("gen");
    run.finish_ok();
    write_by_rename(&file, &text(3));
    let (ok, log) = run_to_end(
        dir,
        Path::new("p.yaml"),
        &["--from-savepoint", sp.to_str().unwrap()],
    );
    assert!(!ok, "{log}");
    assert!(
        log.contains("a generator cannot change its parallelism"),
        "{log}"
    );
}
