//! `weir status`, `savepoint`, `stop` and `reload` end to end: the real API server runs in
//! this process on an ephemeral port over a recording `JobControl`, and the real `weir`
//! binary calls it. Checks stdout, stderr, exit codes, and the arguments that reached the job.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::control::{Call, Job, status_fixture, weir_in};
use weir_engine::control::{JobStatus, ReloadRequest, SavepointRequest, StopRequest};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn status_prints_a_table_or_json() {
    let job = Job::start(None);
    let out = job.weir(&["status"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&"file: pipelines/totals.yaml"),
        "{text}"
    );
    assert!(
        lines
            .get(1)
            .is_some_and(|l| l.starts_with("PIPELINE  STATE")
                && l.contains("SOURCE RECORDS")
                && l.ends_with("RESTORED FROM")),
        "{text}"
    );
    let row: Vec<&str> = lines
        .get(2)
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(
        row,
        ["p", "running", "1200", "1100", "3", "3", "1", "/tmp/sp-1"],
        "{text}"
    );
    assert!(
        lines.get(3).is_some_and(|l| l.starts_with("busy")),
        "{text}"
    );
    assert!(
        text.contains(
            "reloads: 2; last reload applied at 2023-11-14T22:13:20Z, longest pause 12 ms"
        ),
        "{text}"
    );

    let out = job.weir(&["status", "--json"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parsed: JobStatus = serde_json::from_slice(&out.stdout).expect("JobStatus JSON");
    assert_eq!(parsed, status_fixture());
}

#[test]
fn the_address_can_come_from_the_environment() {
    let job = Job::start(None);
    let out = weir_in(
        &["status", "--json"],
        &[],
        &here(),
        &[("WEIR_API", &job.addr())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let url = format!("http://{}/", job.addr());
    let out = weir_in(&["status"], &["--api", &url], &here(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn savepoint_prints_its_path_alone_on_stdout() {
    let job = Job::start(None);
    let cwd = tempfile::tempdir().expect("tempdir");
    let out = job.weir(&["savepoint", "p", "--dir", "backups"], cwd.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "backups/sp-7\n");
    assert!(
        stderr(&out).contains("savepoint of pipeline `p` taken as checkpoint 7: 3.0 MiB in 250 ms"),
        "{}",
        stderr(&out)
    );
    // A relative --dir reaches the job as given: it is relative to the pipeline's savepoint
    // root, not to the caller's directory.
    assert_eq!(
        job.fake.calls(),
        vec![Call::Savepoint(
            "p".into(),
            SavepointRequest {
                dir: Some("backups".into())
            }
        )]
    );

    let out = job.weir(&["savepoint", "p"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "/data/savepoints/sp-7\n");
}

#[test]
fn stop_with_and_without_a_savepoint() {
    let job = Job::start(None);
    let out = job.weir(
        &["stop", "p", "--savepoint", "--drain", "--dir", "/sp"],
        &here(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "/sp/sp-7\n");
    assert!(
        stderr(&out).contains("pipeline `p` drained and stopped; savepoint taken as checkpoint 7"),
        "{}",
        stderr(&out)
    );

    let out = job.weir(&["stop", "p"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).contains("pipeline `p` stopped (no savepoint)"),
        "{}",
        stderr(&out)
    );

    assert_eq!(
        job.fake.calls(),
        vec![
            Call::Stop(
                "p".into(),
                StopRequest {
                    savepoint: true,
                    drain: true,
                    dir: Some("/sp".into()),
                }
            ),
            Call::Stop("p".into(), StopRequest::default()),
        ]
    );

    // --dir without --savepoint is a usage error, caught before any call.
    let out = job.weir(&["stop", "p", "--dir", "/sp"], &here());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(job.fake.calls().len(), 2);
}

#[test]
fn reload_applies_or_plans() {
    let job = Job::start(None);
    let out = job.weir(&["reload"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "reload applied (longest pause 42 ms)\n\
         pipeline p: changed (savepoint, new graph, restore)\n\
         \x20 events        state kept\n\
         \x20 sum           state migrated (script changed)\n\
         \x20 sum           parallelism 2 → 3 (key groups redistributed)\n"
    );

    let out = job.weir(&["reload", "--plan"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("reload plan (nothing applied)\n"),
        "{}",
        stdout(&out)
    );

    let cwd = tempfile::tempdir().expect("tempdir");
    let out = job.weir(&["reload", "--plan", "next.yaml"], cwd.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let next = std::path::absolute(cwd.path().join("next.yaml")).expect("absolute");

    // A plan with problems exits 1.
    let out = job.weir(&["reload", "--plan", "/x/bad.yaml"], &here());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("  problem: max_parallelism of `sum` changed"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("weir::reload::problems"),
        "{}",
        stderr(&out)
    );

    // The switch that lets a reload drop state the new version no longer declares.
    let out = job.weir(&["reload", "--allow-non-restored-state"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    assert_eq!(
        job.fake.calls(),
        vec![
            Call::Reload(ReloadRequest::default()),
            Call::Reload(ReloadRequest {
                file: None,
                plan_only: true,
                ..ReloadRequest::default()
            }),
            Call::Reload(ReloadRequest {
                file: Some(next),
                plan_only: true,
                ..ReloadRequest::default()
            }),
            Call::Reload(ReloadRequest {
                file: Some("/x/bad.yaml".into()),
                plan_only: true,
                ..ReloadRequest::default()
            }),
            Call::Reload(ReloadRequest {
                allow_non_restored_state: true,
                ..ReloadRequest::default()
            }),
        ]
    );
}

#[test]
fn a_rolled_back_reload_exits_1() {
    let job = Job::start(None);
    if let Ok(mut r) = job.fake.reload_result.lock() {
        *r = "rolled_back".into();
    }
    let out = job.weir(&["reload"], &here());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("reload rolled back: the new version failed to start"),
        "{text}"
    );
    assert!(
        text.contains("  operator `sum` failed to restore: missing field `count`"),
        "{text}"
    );
    let err = stderr(&out);
    assert!(err.contains("weir::reload::rolled_back"), "{err}");
    assert!(err.contains("the old one runs again"), "{err}");
}

#[test]
fn api_errors_are_reports_with_a_code_and_exit_1() {
    let job = Job::start(None);
    let out = job.weir(&["savepoint", "nope"], &here());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    let err = stderr(&out);
    assert!(err.contains("weir::api::no_such_pipeline"), "{err}");
    assert!(err.contains("no pipeline `nope` is running"), "{err}");
    assert!(
        err.contains("the pipelines of this job are: p, busy"),
        "{err}"
    );

    let out = job.weir(&["stop", "busy", "--savepoint"], &here());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("weir::api::busy"), "{err}");
    assert!(
        err.contains("a savepoint of `busy` is in progress"),
        "{err}"
    );

    let out = weir_in(&["status"], &["--api", "https://x:1"], &here(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("weir::api::bad_address"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_token_guards_mutating_verbs() {
    let job = Job::start(Some("s3cret"));
    // Reads are open.
    let out = job.weir(&["status"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = job.weir(&["savepoint", "p", "--token", "wrong"], &here());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("weir::api::unauthorized"), "{err}");
    assert!(err.contains("wrong bearer token"), "{err}");
    assert!(
        err.contains("--token") && err.contains("WEIR_API_TOKEN"),
        "{err}"
    );

    let out = job.weir(&["reload"], &here());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("missing bearer token"),
        "{}",
        stderr(&out)
    );
    assert!(job.fake.calls().is_empty(), "{:?}", job.fake.calls());

    let out = weir_in(
        &["savepoint", "p"],
        &["--api", &job.addr()],
        &here(),
        &[("WEIR_API_TOKEN", "s3cret")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = job.weir(&["stop", "p", "--token", "s3cret"], &here());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(job.fake.calls().len(), 2);
}

#[test]
fn nothing_listening_exits_2_with_a_clear_message() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let addr = format!("127.0.0.1:{port}");
    for verb in [
        &["status"][..],
        &["savepoint", "p"],
        &["stop", "p"],
        &["reload"],
    ] {
        let out = weir_in(verb, &["--api", &addr], &here(), &[]);
        assert_eq!(out.status.code(), Some(2), "{verb:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("weir::api::not_listening"), "{err}");
        assert!(
            err.contains(&format!(
                "nothing is listening on {addr}: is `weir run` running, with the API on?"
            )),
            "{err}"
        );
        assert_eq!(stdout(&out), "");
    }
}
