//! `weir tap` against a real `weir run`: it prints the records of the operator it names (its
//! output, or its input with `--input`), `--limit` ends it, it keeps streaming across a hot
//! reload and ends with a clear message when a reload removes its operator or the pipeline
//! stops; unknown pipelines and operators are clear errors with exit code 1.

mod common;

use std::io::{Read, Seek};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::binary::{wait_child, without_api_env};
use common::control::{Call, Job};
use common::run::{DEADLINE, Run};
use weir_engine::control::{TapRequest, TapSide};

/// A generator (`n` counting up) tagged by `tag` with `version`, written by `out`; exactly
/// once, so a reload goes through a savepoint. Long enough never to end during a test.
fn pipeline(version: &str, tag_id: &str) -> String {
    format!(
        "version: 1
pipelines:
  - id: p
    checkpoints: {{mode: exactly_once, interval: 1s, storage: .weir/checkpoints}}
    sources:
      - {{id: ev, type: generator, count: 10000000, rate: 2000, fields: {{n: {{kind: sequence}}}}}}
    operators:
      - id: {tag_id}
        type: map
        input: ev
        script: |
          fn map(r) {{ r.version = \"{version}\"; r }}
    sinks:
      - {{id: out, type: file, input: {tag_id}, path: out/p}}
"
    )
}

fn start(version: &str) -> (tempfile::TempDir, Run) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(tmp.path().join("p.yaml"), pipeline(version, "tag")).expect("write");
    let run = Run::start(tmp.path(), Path::new("p.yaml"), &[]);
    (tmp, run)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every stdout line as JSON.
fn records(out: &Output) -> Vec<serde_json::Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// A `weir tap` streaming in the background, its output going to files.
struct Tap {
    child: Child,
    stdout: std::fs::File,
    stderr: std::fs::File,
}

impl Tap {
    fn start(run: &Run, args: &[&str]) -> Self {
        let stdout = tempfile::tempfile().expect("a temporary file");
        let stderr = tempfile::tempfile().expect("a temporary file");
        let child = without_api_env()
            .arg("tap")
            .args(args)
            .args(["--api", &run.api])
            .stdin(Stdio::null())
            .stdout(stdout.try_clone().expect("clone"))
            .stderr(stderr.try_clone().expect("clone"))
            .spawn()
            .expect("start weir tap");
        Self {
            child,
            stdout,
            stderr,
        }
    }

    fn read(file: &mut std::fs::File) -> String {
        let mut s = String::new();
        file.rewind().expect("rewind");
        file.read_to_string(&mut s).expect("read");
        s
    }

    fn stdout(&mut self) -> String {
        Self::read(&mut self.stdout)
    }

    fn stderr(&mut self) -> String {
        Self::read(&mut self.stderr)
    }

    /// Polls until the printed records satisfy `done`.
    fn wait_for(&mut self, run: &Run, what: &str, done: impl Fn(&[serde_json::Value]) -> bool) {
        let until = Instant::now() + DEADLINE;
        loop {
            let lines: Vec<serde_json::Value> = self
                .stdout()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            if done(&lines) {
                return;
            }
            assert!(
                Instant::now() < until,
                "the tap never showed {what}; its stderr:\n{}\nthe run's log:\n{}",
                self.stderr(),
                run.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the tap to end: `(exit code, stdout, stderr)`.
    fn finish(mut self, run: &Run) -> (Option<i32>, String, String) {
        let status = wait_child(&mut self.child, DEADLINE, || run.log());
        (status.code(), self.stdout(), self.stderr())
    }
}

fn with_version(lines: &[serde_json::Value], version: &str) -> usize {
    lines.iter().filter(|r| r["version"] == version).count()
}

#[test]
fn a_tap_prints_the_records_of_its_operator_and_ends_at_its_limit() {
    let (_tmp, mut run) = start("v1");
    let out = run.cli(&["tap", "p", "tag", "--limit", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = records(&out);
    assert_eq!(shown.len(), 5, "{}", text(&out.stdout));
    let mut last = -1;
    for r in &shown {
        // The map's output: tagged, in order within its one subtask.
        assert_eq!(r["version"], "v1", "{r}");
        let n = r["n"].as_i64().expect("an n");
        assert!(n > last, "{shown:?}");
        last = n;
    }
    let err = text(&out.stderr);
    assert!(
        err.contains("every record emitted by `tag` in pipeline `p`")
            && err.contains("ended: limit of 5 records reached (5 record(s) shown)"),
        "{err}"
    );

    // The source's output is untagged; the sink's input is tagged; one in ten, with subtasks.
    let out = run.cli(&["tap", "p", "ev", "--limit", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(records(&out).iter().all(|r| r.get("version").is_none()));
    let out = run.cli(&[
        "tap",
        "p",
        "out",
        "--input",
        "--sample",
        "0.1",
        "--limit",
        "3",
        "--subtask",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = records(&out);
    assert_eq!(shown.len(), 3);
    for r in &shown {
        assert_eq!(r["subtask"], 0, "{r}");
        assert_eq!(r["value"]["version"], "v1", "{r}");
        // Every tenth record of the sink's input: the counter picks n = 9, 19, ... after
        // the tap opened, so the gaps are exactly ten.
    }
    let ns: Vec<i64> = shown
        .iter()
        .map(|r| r["value"]["n"].as_i64().expect("n"))
        .collect();
    assert!(ns.windows(2).all(|w| w[1] - w[0] == 10), "{ns:?}");
    assert!(run.log().contains("Tap opened."), "{}", run.log());
    run.kill();
}

#[test]
fn unknown_pipelines_and_operators_are_clear_errors() {
    let (_tmp, mut run) = start("v1");
    let cases: [(&[&str], &str); 5] = [
        (&["tap", "nope", "tag"], "no pipeline `nope` is running"),
        (
            &["tap", "p", "tga"],
            "pipeline `p` has no operator `tga` (did you mean `tag`?); its sources, operators \
             and sinks are: ev, tag, out",
        ),
        (&["tap", "p", "out"], "`out` in pipeline `p` is a sink"),
        (
            &["tap", "p", "ev", "--input"],
            "`ev` in pipeline `p` is a source",
        ),
        (
            &["tap", "p", "tag", "--sample", "2"],
            "sample rate 2 is outside (0, 1]",
        ),
    ];
    for (args, says) in cases {
        let out = run.cli(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // The unknown pipeline's help lists the running ones.
    let out = run.cli(&["tap", "nope", "tag"]);
    assert!(
        text(&out.stderr).contains("the pipelines of this job are: p"),
        "{}",
        text(&out.stderr)
    );
    run.kill();
    // Nothing listening: exit code 2, as for every verb.
    let out = run.cli(&["tap", "p", "tag"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn a_tap_keeps_streaming_across_a_hot_reload_and_ends_when_its_operator_goes() {
    let (tmp, run) = start("v1");
    let file = tmp.path().join("p.yaml");
    let mut tap = Tap::start(&run, &["p", "tag", "--sample", "0.1"]);
    tap.wait_for(&run, "records of v1", |r| with_version(r, "v1") >= 3);

    // Version 2 of the same operator: the same tap sees its records.
    std::fs::write(&file, pipeline("v2", "tag")).expect("write");
    let out = run.cli(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    tap.wait_for(&run, "records of v2 after the reload", |r| {
        with_version(r, "v2") >= 3
    });

    // Version 3 renames the operator: the tap ends, saying why, with exit code 1.
    std::fs::write(&file, pipeline("v3", "tagged")).expect("write");
    let out = run.cli(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (code, stdout, stderr) = tap.finish(&run);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("ended: a reload changed the pipeline: pipeline `p` has no operator `tag`"),
        "{stderr}"
    );
    assert!(!stdout.contains("v3"), "{stdout}");
    // Every line printed is a whole record, the v1 ones before the v2 ones.
    let versions: Vec<String> = stdout
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).expect("a JSON record per line");
            r["version"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    let first_v2 = versions
        .iter()
        .position(|v| v == "v2")
        .expect("a v2 record");
    assert!(
        versions[..first_v2].iter().all(|v| v == "v1"),
        "{versions:?}"
    );
    assert!(
        versions[first_v2..].iter().all(|v| v == "v2"),
        "{versions:?}"
    );

    // A tap of the new operator ends when the pipeline stops.
    let tap = Tap::start(&run, &["p", "tagged"]);
    let mut tap = tap;
    tap.wait_for(&run, "records of v3", |r| with_version(r, "v3") >= 1);
    let out = run.cli(&["stop", "p"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (code, _, stderr) = tap.finish(&run);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("ended: pipeline `p` was stopped"),
        "{stderr}"
    );
}

/// Against the fake job: what reaches the job, how drops and an end that is not ok are shown.
#[test]
fn the_cli_prints_records_on_stdout_and_the_rest_on_stderr() {
    let job = Job::start(Some("s3cret"));
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    // A tap streams records: it needs the token like a mutating call.
    let refused = job.weir(&["tap", "p", "sum"], here);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("missing bearer token"),
        "{}",
        text(&refused.stderr)
    );
    assert!(job.fake.calls().is_empty());
    let out = job.weir(
        &[
            "tap", "p", "sum", "--input", "--sample", "0.5", "--limit", "9", "--token", "s3cret",
        ],
        here,
    );
    // Records on stdout, one JSON value per line, whatever they contain.
    assert_eq!(text(&out.stdout), "{\"n\":1}\n{\"n\":2,\"s\":\"é\\n\"}\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("a sample of 0.5 received by `sum` in pipeline `p`")
            && err.contains("5 record(s) dropped so far")
            && err.contains("ended: operator `sum` is gone (2 record(s) shown, 5 dropped)"),
        "{err}"
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        job.fake.calls(),
        vec![Call::Tap(
            "p".into(),
            TapRequest {
                operator: "sum".into(),
                side: TapSide::Input,
                sample: 0.5,
                limit: Some(9),
            }
        )]
    );
    let out = job.weir(&["tap", "p", "sum", "--subtask", "--token", "s3cret"], here);
    assert!(
        text(&out.stdout).starts_with("{\"subtask\":0,\"value\":{\"n\":1}}\n"),
        "{}",
        text(&out.stdout)
    );
}
