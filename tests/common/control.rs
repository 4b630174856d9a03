//! The fake control: the real API server in the test process on an ephemeral port over a
//! recording [`JobControl`] with canned answers ([`Job`], [`Fake`]), and the `weir` binary
//! run against it ([`weir_in`]). The engine's own API unit tests keep a fake of their own
//! (`engine/src/api/tests.rs`): this crate's test kit cannot reach into the engine's
//! `cfg(test)` code, and the engine does not ship test machinery in its release build.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};

use weir_engine::api::{ApiConfig, ApiServer, serve};
use weir_engine::control::{
    BoxFuture, CheckpointInfo, ControlError, JobControl, JobStatus, OperatorReloadPlan,
    PipelineReloadPlan, PipelineStatus, ReloadOutcome, ReloadRequest, SavepointInfo,
    SavepointRequest, StopOutcome, StopRequest, TapEvent, TapRequest, TapSource, TapStream,
};

use super::binary::without_api_env;

/// One call that reached the job.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// `savepoint` of a pipeline.
    Savepoint(String, SavepointRequest),
    /// `stop` of a pipeline.
    Stop(String, StopRequest),
    /// `reload` of the job.
    Reload(ReloadRequest),
    /// `tap` of a pipeline's operator.
    Tap(String, TapRequest),
}

/// Pipeline `p` succeeds, `busy` is busy, anything else does not exist; a reload ends with
/// `reload_result`.
pub struct Fake {
    calls: Mutex<Vec<Call>>,
    /// What a reload that is not `plan_only` ends with (`applied` at first).
    pub reload_result: Mutex<String>,
}

impl Fake {
    fn record(&self, call: Call) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(call);
        }
    }

    /// Every call that reached the job so far, in order.
    pub fn calls(&self) -> Vec<Call> {
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

/// The status the fake job answers.
pub fn status_fixture() -> JobStatus {
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
        ..JobStatus::default()
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

    fn tap(&self, pipeline: &str, request: TapRequest) -> Result<TapStream, ControlError> {
        self.open_tap(pipeline, &request)
    }
}

/// The events of the fake job's tap of `p`: two records, then five dropped, then an end that
/// is not ok (the operator gone after a reload).
pub fn tap_fixture(request: &TapRequest) -> Vec<TapEvent> {
    vec![
        TapEvent::Started {
            pipeline: "p".into(),
            operator: request.operator.clone(),
            side: request.side,
            sample: request.sample,
        },
        TapEvent::Record {
            subtask: 0,
            value: serde_json::json!({"n": 1}),
        },
        TapEvent::Record {
            subtask: 1,
            value: serde_json::json!({"n": 2, "s": "é\n"}),
        },
        TapEvent::Dropped { total: 5 },
        TapEvent::End {
            reason: format!("operator `{}` is gone", request.operator),
            records: 2,
            dropped: 5,
            ok: false,
        },
    ]
}

struct Canned(std::collections::VecDeque<TapEvent>);

impl TapSource for Canned {
    fn next(&mut self) -> BoxFuture<'_, Option<TapEvent>> {
        Box::pin(async move { self.0.pop_front() })
    }
}

impl Fake {
    fn open_tap(&self, pipeline: &str, request: &TapRequest) -> Result<TapStream, ControlError> {
        self.record(Call::Tap(pipeline.to_owned(), request.clone()));
        Self::check(pipeline)?;
        Ok(TapStream::new(Box::new(Canned(
            tap_fixture(request).into(),
        ))))
    }
}

/// The real API server on `127.0.0.1:0` over a fresh [`Fake`].
pub struct Job {
    server: ApiServer,
    /// The job behind it.
    pub fake: Arc<Fake>,
    _rt: tokio::runtime::Runtime,
}

impl Job {
    /// Serves a fresh [`Fake`], with `token` guarding the mutating routes.
    pub fn start(token: Option<&str>) -> Self {
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

    /// The server's address.
    pub fn addr(&self) -> String {
        self.server.local_addr().to_string()
    }

    /// Runs `weir VERB --api ADDR ARGS...` in `dir`, without the API environment variables.
    pub fn weir(&self, args: &[&str], dir: &Path) -> Output {
        weir_in(args, &["--api", &self.addr()], dir, &[])
    }
}

/// Runs `weir ARGS EXTRA` in `dir` with extra environment variables, without the API
/// settings of the developer's shell, to its end.
pub fn weir_in(args: &[&str], extra: &[&str], dir: &Path, env: &[(&str, &str)]) -> Output {
    without_api_env()
        .args(args)
        .args(extra)
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .expect("run weir")
}
