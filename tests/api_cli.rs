//! `weir status`, `savepoint`, `stop` and `reload` end to end: the real API server runs in
//! this process on an ephemeral port over a recording `JobControl`, and the real `weir`
//! binary calls it. Checks stdout, stderr, exit codes, and the arguments that reached the job.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use weir_engine::api::{ApiConfig, ApiServer, serve};
use weir_engine::control::{
    BoxFuture, CheckpointInfo, ControlError, JobControl, JobStatus, OperatorReloadPlan,
    PipelineReloadPlan, PipelineStatus, ReloadOutcome, ReloadRequest, SavepointInfo,
    SavepointRequest, StopOutcome, StopRequest,
};

/// One call that reached the job.
#[derive(Clone, Debug, PartialEq)]
enum Call {
    Savepoint(String, SavepointRequest),
    Stop(String, StopRequest),
    Reload(ReloadRequest),
}

/// Pipeline `p` succeeds, `busy` is busy, anything else does not exist; a reload ends with
/// `reload_result`.
struct Fake {
    calls: Mutex<Vec<Call>>,
    reload_result: Mutex<String>,
}

impl Fake {
    fn record(&self, call: Call) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(call);
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn check(pipeline: &str) -> Result<(), ControlError> {
        match pipeline {
            "p" => Ok(()),
            "busy" => Err(ControlError::Busy(
                "a savepoint of `busy` is in progress".into(),
            )),
            other => Err(ControlError::NoSuchPipeline(other.into())),
        }
    }
}

fn status_fixture() -> JobStatus {
    JobStatus {
        file: PathBuf::from("pipelines/totals.yaml"),
        pipelines: vec![
            PipelineStatus {
                id: "p".into(),
                state: "running".into(),
                source_records: 1200,
                sink_records: 1100,
                restarts: 1,
                checkpoints: 3,
                latest_checkpoint: Some(3),
                restored_from: Some("/tmp/sp-1".into()),
                error: None,
                ..PipelineStatus::default()
            },
            PipelineStatus {
                id: "busy".into(),
                state: "stopping".into(),
                ..PipelineStatus::default()
            },
        ],
        reloads: 2,
        last_reload: Some(ReloadOutcome {
            result: "applied".into(),
            pause_ms: Some(12),
            at_ms: 1_700_000_000_000,
            ..ReloadOutcome::default()
        }),
    }
}

fn savepoint_fixture(pipeline: &str, dir: Option<&PathBuf>) -> SavepointInfo {
    let dir = dir
        .cloned()
        .unwrap_or_else(|| PathBuf::from("/data/savepoints"));
    SavepointInfo {
        pipeline: pipeline.into(),
        path: dir.join("sp-7"),
        checkpoint: 7,
        size: 3 * 1024 * 1024,
        duration_ms: 250,
    }
}

impl JobControl for Fake {
    fn status(&self) -> JobStatus {
        status_fixture()
    }

    fn checkpoints(&self, pipeline: &str) -> Result<Vec<CheckpointInfo>, ControlError> {
        Self::check(pipeline)?;
        Ok(vec![])
    }

    fn trigger_checkpoint(
        &self,
        pipeline: &str,
    ) -> BoxFuture<'_, Result<CheckpointInfo, ControlError>> {
        let pipeline = pipeline.to_owned();
        Box::pin(async move {
            Self::check(&pipeline)?;
            Ok(CheckpointInfo::default())
        })
    }

    fn savepoint(
        &self,
        pipeline: &str,
        request: SavepointRequest,
    ) -> BoxFuture<'_, Result<SavepointInfo, ControlError>> {
        let pipeline = pipeline.to_owned();
        Box::pin(async move {
            self.record(Call::Savepoint(pipeline.clone(), request.clone()));
            Self::check(&pipeline)?;
            Ok(savepoint_fixture(&pipeline, request.dir.as_ref()))
        })
    }

    fn stop(
        &self,
        pipeline: &str,
        request: StopRequest,
    ) -> BoxFuture<'_, Result<StopOutcome, ControlError>> {
        let pipeline = pipeline.to_owned();
        Box::pin(async move {
            self.record(Call::Stop(pipeline.clone(), request.clone()));
            Self::check(&pipeline)?;
            Ok(StopOutcome {
                savepoint: request
                    .savepoint
                    .then(|| savepoint_fixture(&pipeline, request.dir.as_ref())),
                pipeline,
            })
        })
    }

    fn reload(&self, request: ReloadRequest) -> BoxFuture<'_, Result<ReloadOutcome, ControlError>> {
        Box::pin(async move {
            self.record(Call::Reload(request.clone()));
            let result = if request.plan_only {
                "planned".to_owned()
            } else {
                self.reload_result
                    .lock()
                    .map(|r| r.clone())
                    .unwrap_or_default()
            };
            let problems = if request
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("bad.yaml"))
            {
                vec!["max_parallelism of `sum` changed from 128 to 64".to_owned()]
            } else {
                vec![]
            };
            Ok(ReloadOutcome {
                messages: if result == "rolled_back" {
                    vec!["operator `sum` failed to restore: missing field `count`".into()]
                } else {
                    vec![]
                },
                pause_ms: (result == "applied").then_some(42),
                result,
                pipelines: vec![PipelineReloadPlan {
                    pipeline: "p".into(),
                    change: "changed".into(),
                    operators: vec![
                        OperatorReloadPlan {
                            id: "events".into(),
                            state: "kept".into(),
                            ..OperatorReloadPlan::default()
                        },
                        OperatorReloadPlan {
                            id: "sum".into(),
                            state: "migrated".into(),
                            script_changed: true,
                            parallelism: Some((2, 3)),
                            key_groups_redistributed: true,
                            ..OperatorReloadPlan::default()
                        },
                    ],
                    problems,
                    ..PipelineReloadPlan::default()
                }],
                at_ms: 1_700_000_000_000,
            })
        })
    }
}

/// The real API server on `127.0.0.1:0` over a fresh [`Fake`].
struct Job {
    server: ApiServer,
    fake: Arc<Fake>,
    _rt: tokio::runtime::Runtime,
}

impl Job {
    fn start(token: Option<&str>) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let fake = Arc::new(Fake {
            calls: Mutex::new(Vec::new()),
            reload_result: Mutex::new("applied".into()),
        });
        let control: Arc<dyn JobControl> = fake.clone();
        let server = rt
            .block_on(serve(control, ApiConfig::local(0, token.map(String::from))))
            .expect("serve");
        Self {
            server,
            fake,
            _rt: rt,
        }
    }

    fn addr(&self) -> String {
        self.server.local_addr().to_string()
    }

    /// Runs `weir VERB --api ADDR ARGS...` in `dir`, without the API environment variables.
    fn weir(&self, args: &[&str], dir: &Path) -> Output {
        weir_in(args, &["--api", &self.addr()], dir, &[])
    }
}

fn weir_in(args: &[&str], extra: &[&str], dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weir"));
    cmd.args(args)
        .args(extra)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("WEIR_API")
        .env_remove("WEIR_API_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run weir")
}

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
