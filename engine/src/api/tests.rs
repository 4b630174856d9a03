//! The real server on an ephemeral loopback port, driven through the real client, against a
//! recording [`JobControl`] with canned answers: every route, every error code, the bearer
//! token, malformed bodies, unknown routes and nothing listening.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client::{ApiClient, ClientError};
use super::server::{ApiConfig, ApiServer, serve};
use crate::base::error::ApiError;
use crate::control::{
    BoxFuture, CheckpointInfo, ControlError, JobControl, JobStatus, PipelineReloadPlan,
    PipelineStatus, ReloadOutcome, ReloadRequest, SavepointInfo, SavepointRequest, StopOutcome,
    StopRequest, SubtaskCheckpointInfo, TapEvent, TapRequest, TapSide, TapSource, TapStream,
};

/// One call that reached the control object.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Call {
    Checkpoints(String),
    Trigger(String),
    Savepoint(String, SavepointRequest),
    SavepointDone(String),
    Stop(String, StopRequest),
    Reload(ReloadRequest),
    Tap(String, TapRequest),
}

/// Answers by pipeline id: `p` succeeds, `busy`/`bad`/`boom` fail with busy/invalid/failed,
/// `slow` takes 300 ms, anything else is no such pipeline.
#[derive(Default)]
pub(super) struct Fake {
    calls: Mutex<Vec<Call>>,
}

impl Fake {
    fn record(&self, call: Call) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(call);
        }
    }

    /// Every call so far, in order.
    pub(super) fn calls(&self) -> Vec<Call> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Forgets the calls so far.
    pub(super) fn clear(&self) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.clear();
        }
    }

    fn canned(pipeline: &str) -> Result<(), ControlError> {
        match pipeline {
            "p" | "slow" => Ok(()),
            "busy" => Err(ControlError::Busy(
                "a savepoint of `busy` is in progress".into(),
            )),
            "bad" => Err(ControlError::Invalid(
                "pipeline `bad` already finished".into(),
            )),
            "boom" => Err(ControlError::Failed(
                "disk full writing the savepoint".into(),
            )),
            other => Err(ControlError::NoSuchPipeline(other.into())),
        }
    }
}

fn status_fixture() -> JobStatus {
    JobStatus {
        file: PathBuf::from("pipelines/totals.yaml"),
        pipelines: vec![PipelineStatus {
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
        }],
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

fn checkpoint_fixture(id: u64) -> CheckpointInfo {
    CheckpointInfo {
        id,
        kind: "checkpoint".into(),
        status: "completed".into(),
        failure: None,
        trigger_time_ms: 1_700_000_000_000,
        duration_ms: 40,
        size: 4096,
        new_bytes: 1024,
        alignment_ms: 3,
        channel_state_bytes: 0,
        subtasks: vec![SubtaskCheckpointInfo {
            task: "sum".into(),
            subtask: 1,
            size: 2048,
            ack_ms: 30,
            alignment_ms: 3,
            channel_state_bytes: 0,
        }],
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
        size: 123_456,
        duration_ms: 250,
    }
}

impl JobControl for Fake {
    fn status(&self) -> JobStatus {
        status_fixture()
    }

    fn checkpoints(&self, pipeline: &str) -> Result<Vec<CheckpointInfo>, ControlError> {
        self.record(Call::Checkpoints(pipeline.into()));
        Self::canned(pipeline)?;
        Ok(vec![checkpoint_fixture(1), checkpoint_fixture(2)])
    }

    fn trigger_checkpoint(
        &self,
        pipeline: &str,
    ) -> BoxFuture<'_, Result<CheckpointInfo, ControlError>> {
        let pipeline = pipeline.to_owned();
        Box::pin(async move {
            self.record(Call::Trigger(pipeline.clone()));
            Self::canned(&pipeline)?;
            Ok(checkpoint_fixture(3))
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
            Self::canned(&pipeline)?;
            if pipeline == "slow" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            self.record(Call::SavepointDone(pipeline.clone()));
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
            Self::canned(&pipeline)?;
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
            if request.file.as_deref() == Some(std::path::Path::new("busy.yaml")) {
                return Err(ControlError::Busy("a reload is in progress".into()));
            }
            Ok(ReloadOutcome {
                result: if request.plan_only {
                    "planned"
                } else {
                    "applied"
                }
                .into(),
                pipelines: vec![PipelineReloadPlan {
                    pipeline: "p".into(),
                    change: "unchanged".into(),
                    ..PipelineReloadPlan::default()
                }],
                messages: vec![],
                pause_ms: (!request.plan_only).then_some(5),
                at_ms: 1,
            })
        })
    }

    fn tap(&self, pipeline: &str, request: TapRequest) -> Result<TapStream, ControlError> {
        self.open_tap(pipeline, request)
    }
}

/// A tap's canned events.
struct Canned(std::collections::VecDeque<TapEvent>);

impl TapSource for Canned {
    fn next(&mut self) -> BoxFuture<'_, Option<TapEvent>> {
        Box::pin(async move { self.0.pop_front() })
    }
}

/// What the fake's tap of `p` streams: the start, `n` records, a drop count, the end.
fn tap_events(request: &TapRequest, n: u64) -> Vec<TapEvent> {
    let mut events = vec![TapEvent::Started {
        pipeline: "p".into(),
        operator: request.operator.clone(),
        side: request.side,
        sample: request.sample,
    }];
    for i in 0..n {
        events.push(TapEvent::Record {
            subtask: (i % 2) as u32,
            value: serde_json::json!({"n": i, "text": "line\nbreak"}),
        });
    }
    events.push(TapEvent::Dropped { total: 2 });
    events.push(TapEvent::End {
        reason: "limit reached".into(),
        records: n,
        dropped: 2,
        ok: true,
    });
    events
}

impl Fake {
    fn open_tap(&self, pipeline: &str, request: TapRequest) -> Result<TapStream, ControlError> {
        self.record(Call::Tap(pipeline.into(), request.clone()));
        Self::canned(pipeline)?;
        let n = request.limit.unwrap_or(3);
        Ok(TapStream::new(Box::new(Canned(
            tap_events(&request, n).into(),
        ))))
    }
}

/// The real server on `127.0.0.1:0` over a fresh [`Fake`].
pub(super) struct Harness {
    server: Option<ApiServer>,
    pub(super) fake: Arc<Fake>,
    rt: tokio::runtime::Runtime,
}

impl Harness {
    pub(super) fn start(token: Option<&str>) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let fake = Arc::new(Fake::default());
        let control: Arc<dyn JobControl> = fake.clone();
        let server = rt
            .block_on(serve(control, ApiConfig::local(0, token.map(String::from))))
            .expect("serve on an ephemeral port");
        Self {
            server: Some(server),
            fake,
            rt,
        }
    }

    pub(super) fn addr(&self) -> String {
        self.server
            .as_ref()
            .map(|s| s.local_addr().to_string())
            .unwrap_or_default()
    }

    pub(super) fn client(&self, token: Option<&str>) -> ApiClient {
        ApiClient::new(&self.addr(), token.map(String::from)).expect("client")
    }
}

fn api_error<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, ControlError) {
    match r {
        Err(ClientError::Api { status, error }) => (status, error),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[test]
fn status_round_trips_without_a_token_even_when_one_is_set() {
    let h = Harness::start(Some("s3cret"));
    assert_eq!(h.client(None).status().expect("status"), status_fixture());
    assert_eq!(
        h.client(None).checkpoints("p").expect("checkpoints"),
        vec![checkpoint_fixture(1), checkpoint_fixture(2)]
    );
    assert_eq!(h.fake.calls(), vec![Call::Checkpoints("p".into())]);
}

#[test]
fn every_mutating_route_round_trips() {
    let h = Harness::start(None);
    let c = h.client(None);
    assert_eq!(
        c.trigger_checkpoint("p").expect("trigger"),
        checkpoint_fixture(3)
    );
    let dir = PathBuf::from("/backups");
    let sp = c
        .savepoint(
            "p",
            &SavepointRequest {
                dir: Some(dir.clone()),
            },
        )
        .expect("savepoint");
    assert_eq!(sp, savepoint_fixture("p", Some(&dir)));
    let stop = StopRequest {
        savepoint: true,
        drain: true,
        dir: Some(dir.clone()),
    };
    let outcome = c.stop("p", &stop).expect("stop");
    assert_eq!(outcome.pipeline, "p");
    assert_eq!(outcome.savepoint, Some(savepoint_fixture("p", Some(&dir))));
    let plan = ReloadRequest {
        file: Some("next.yaml".into()),
        plan_only: true,
        ..ReloadRequest::default()
    };
    assert_eq!(c.reload(&plan).expect("plan").result, "planned");
    let applied = c.reload(&ReloadRequest::default()).expect("reload");
    assert_eq!(
        (applied.result.as_str(), applied.pause_ms),
        ("applied", Some(5))
    );
    assert_eq!(
        h.fake.calls(),
        vec![
            Call::Trigger("p".into()),
            Call::Savepoint("p".into(), SavepointRequest { dir: Some(dir) }),
            Call::SavepointDone("p".into()),
            Call::Stop("p".into(), stop),
            Call::Reload(plan),
            Call::Reload(ReloadRequest::default()),
        ]
    );
}

#[test]
fn an_empty_body_is_the_default_request() {
    let h = Harness::start(None);
    let c = h.client(None);
    let sp: SavepointInfo = c
        .call("POST", "/v1/pipelines/p/savepoints", Some(b""))
        .expect("savepoint");
    assert_eq!(sp, savepoint_fixture("p", None));
    let _: StopOutcome = c
        .call("POST", "/v1/pipelines/p/stop", Some(b" \n"))
        .expect("stop");
    let _: ReloadOutcome = c.call("POST", "/v1/reload", None).expect("reload");
    assert_eq!(
        h.fake.calls(),
        vec![
            Call::Savepoint("p".into(), SavepointRequest::default()),
            Call::SavepointDone("p".into()),
            Call::Stop("p".into(), StopRequest::default()),
            Call::Reload(ReloadRequest::default()),
        ]
    );
}

#[test]
fn each_error_code_has_its_status_and_comes_back_as_an_api_error() {
    let h = Harness::start(None);
    let c = h.client(None);
    let cases = [
        (
            "busy",
            409,
            ControlError::Busy("a savepoint of `busy` is in progress".into()),
        ),
        (
            "bad",
            400,
            ControlError::Invalid("pipeline `bad` already finished".into()),
        ),
        (
            "boom",
            500,
            ControlError::Failed("disk full writing the savepoint".into()),
        ),
        ("nope", 404, ControlError::NoSuchPipeline("nope".into())),
        ("a b/c", 404, ControlError::NoSuchPipeline("a b/c".into())),
    ];
    for (id, status, error) in cases {
        let want = (status, error);
        assert_eq!(api_error(c.checkpoints(id)), want, "{id}");
        assert_eq!(api_error(c.trigger_checkpoint(id)), want, "{id}");
        assert_eq!(
            api_error(c.savepoint(id, &SavepointRequest::default())),
            want,
            "{id}"
        );
        assert_eq!(api_error(c.stop(id, &StopRequest::default())), want, "{id}");
    }
    let busy = ReloadRequest {
        file: Some("busy.yaml".into()),
        plan_only: true,
        ..ReloadRequest::default()
    };
    assert_eq!(
        api_error(c.reload(&busy)),
        (409, ControlError::Busy("a reload is in progress".into()))
    );
    // The wire form is the `ControlError` serde form under `error`.
    let raw = c
        .raw("POST", "/v1/pipelines/nope/stop", Some(b"{}"))
        .expect("answer");
    assert_eq!(raw.status, 404);
    assert_eq!(raw.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_slice(&raw.body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"error": {"code": "no_such_pipeline", "message": "nope"}})
    );
}

#[test]
fn the_token_is_checked_on_mutating_calls() {
    let h = Harness::start(Some("s3cret"));
    let (status, error) = api_error(h.client(None).trigger_checkpoint("p"));
    assert_eq!(status, 401);
    let ControlError::Unauthorized(message) = error else {
        panic!("expected unauthorized, got {error:?}");
    };
    assert!(message.starts_with("missing bearer token"), "{message}");
    assert!(
        message.contains("--token") && message.contains("WEIR_API_TOKEN"),
        "{message}"
    );

    for (call, name) in [
        (
            h.client(Some("wrong"))
                .savepoint("p", &SavepointRequest::default())
                .map(|_| ()),
            "savepoint",
        ),
        (
            h.client(Some("s3cre"))
                .stop("p", &StopRequest::default())
                .map(|_| ()),
            "stop",
        ),
        (
            h.client(Some("s3cret!"))
                .reload(&ReloadRequest::default())
                .map(|_| ()),
            "reload",
        ),
    ] {
        let (status, error) = api_error(call);
        assert_eq!(status, 401, "{name}");
        let ControlError::Unauthorized(message) = error else {
            panic!("{name}: expected unauthorized, got {error:?}");
        };
        assert!(
            message.starts_with("wrong bearer token"),
            "{name}: {message}"
        );
        assert!(message.contains("--token"), "{name}: {message}");
    }
    let raw = h
        .client(None)
        .raw("POST", "/v1/reload", Some(b"{}"))
        .expect("answer");
    assert_eq!(
        raw.header("www-authenticate"),
        Some("Bearer realm=\"weir\"")
    );
    // Refused calls never reach the job.
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());

    let right = h.client(Some("s3cret"));
    assert_eq!(
        right.trigger_checkpoint("p").expect("trigger"),
        checkpoint_fixture(3)
    );
    assert_eq!(right.status().expect("status"), status_fixture());
    assert_eq!(h.fake.calls(), vec![Call::Trigger("p".into())]);
}

#[test]
fn a_malformed_body_is_a_400_with_the_parse_error() {
    let h = Harness::start(None);
    let c = h.client(None);
    let (status, error) = api_error(c.call::<SavepointInfo>(
        "POST",
        "/v1/pipelines/p/savepoints",
        Some(b"{\"dir\": "),
    ));
    assert_eq!(status, 400);
    let ControlError::Invalid(message) = error else {
        panic!("expected invalid, got {error:?}");
    };
    assert!(message.starts_with("malformed JSON body"), "{message}");
    assert!(message.contains("line 1 column"), "{message}");

    let (status, error) = api_error(c.call::<StopOutcome>(
        "POST",
        "/v1/pipelines/p/stop",
        Some(b"{\"savepoint\": \"yes\"}"),
    ));
    assert_eq!(status, 400);
    assert!(
        matches!(&error, ControlError::Invalid(m) if m.contains("field `savepoint`: invalid type")),
        "{error:?}"
    );

    let (status, error) = api_error(c.call::<StopOutcome>(
        "POST",
        "/v1/pipelines/p/stop",
        Some(b"{\"savepiont\": true}"),
    ));
    assert_eq!(status, 400);
    assert!(
        matches!(&error, ControlError::Invalid(m) if m.contains("unknown field `savepiont`") && m.contains("(fields: dir, drain, savepoint)")),
        "{error:?}"
    );

    let (status, error) = api_error(c.call::<ReloadOutcome>("POST", "/v1/reload", Some(b"[1]")));
    assert_eq!(status, 400);
    assert!(
        matches!(&error, ControlError::Invalid(m) if m.contains("not an object")),
        "{error:?}"
    );
    assert!(h.fake.calls().is_empty());

    // Fields left out take their defaults.
    let _: StopOutcome = c
        .call(
            "POST",
            "/v1/pipelines/p/stop",
            Some(b"{\"savepoint\": true}"),
        )
        .expect("stop");
    assert_eq!(
        h.fake.calls(),
        vec![Call::Stop(
            "p".into(),
            StopRequest {
                savepoint: true,
                ..StopRequest::default()
            }
        )]
    );
}

#[test]
fn unknown_routes_and_wrong_methods_are_json_errors() {
    let h = Harness::start(None);
    let c = h.client(None);
    let (status, error) = api_error(c.call::<JobStatus>("GET", "/v1/nothing", None));
    assert_eq!(status, 404);
    assert!(
        matches!(&error, ControlError::Invalid(m) if m.contains("no route `GET /v1/nothing`") && m.contains("/v1/status")),
        "{error:?}"
    );
    let (status, _) = api_error(c.call::<JobStatus>("POST", "/v1/pipelines/p/nothing", Some(b"")));
    assert_eq!(status, 404);
    let (status, error) = api_error(c.call::<JobStatus>("GET", "/v1/reload", None));
    assert_eq!(status, 405);
    assert!(
        matches!(&error, ControlError::Invalid(m) if m.contains("does not answer to GET")),
        "{error:?}"
    );
}

#[test]
fn a_client_that_gives_up_does_not_cancel_the_work() {
    let h = Harness::start(None);
    let impatient = h
        .client(None)
        .with_read_timeout(Some(Duration::from_millis(50)));
    let r = impatient.savepoint("slow", &SavepointRequest::default());
    assert!(matches!(r, Err(ClientError::TimedOut { .. })), "{r:?}");
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        h.fake.calls().contains(&Call::SavepointDone("slow".into())),
        "{:?}",
        h.fake.calls()
    );
}

#[test]
fn nothing_listening_is_its_own_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let addr = format!("127.0.0.1:{port}");
    let err = ApiClient::new(&addr, None)
        .expect("client")
        .status()
        .expect_err("nothing listens");
    assert!(
        matches!(&err, ClientError::NotListening { addr: a } if *a == addr),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "nothing is listening on {addr}: is `weir run` running, with the API on? \
             (`weir run --api-port`)"
        )
    );
}

#[test]
fn shutdown_stops_listening() {
    let mut h = Harness::start(None);
    let c = h.client(None);
    c.status().expect("up");
    if let Some(server) = h.server.take() {
        h.rt.block_on(server.shutdown());
    }
    assert!(matches!(c.status(), Err(ClientError::NotListening { .. })));
}

#[test]
fn dropping_the_handle_stops_listening() {
    let mut h = Harness::start(None);
    let c = h.client(None);
    drop(h.server.take());
    let mut last = c.status().map(|_| ());
    for _ in 0..100 {
        if matches!(last, Err(ClientError::NotListening { .. })) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        last = c.status().map(|_| ());
    }
    assert!(
        matches!(last, Err(ClientError::NotListening { .. })),
        "{last:?}"
    );
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let control: Arc<dyn JobControl> = Arc::new(Fake::default());
    let err = rt
        .block_on(serve(control, ApiConfig { addr, token: None }))
        .expect_err("the port is taken");
    assert!(matches!(err, ApiError::AddressInUse { .. }), "{err:?}");
    let text = err.to_string();
    // This very process holds the port, and the message says so (on Linux, via /proc).
    let owner = if std::path::Path::new("/proc/net/tcp").exists() {
        format!("process {} (`", std::process::id())
    } else {
        "another process (see which with `ss".to_owned()
    };
    assert!(
        text.starts_with(&format!(
            "cannot listen on {addr}: address in use by {owner}"
        )),
        "{text}"
    );
    assert!(
        text.ends_with(
            "; stop it, pick another port with --api-port (or `api.port` in the file), or run \
             without the API with --no-api"
        ),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
}

#[test]
fn the_default_address_uses_the_default_port() {
    assert_eq!(
        super::DEFAULT_ADDR,
        format!("127.0.0.1:{}", super::DEFAULT_PORT)
    );
}

#[test]
fn a_tap_streams_its_events_line_by_line() {
    let h = Harness::start(Some("s3cret"));
    let request = TapRequest {
        operator: "enrich/1".into(),
        side: TapSide::Input,
        sample: 0.25,
        limit: Some(40),
    };
    // A tap streams records: unlike other reads it needs the token when one is set.
    let (status, error) = api_error(h.client(None).tap("p", &request, |_| true));
    assert_eq!(status, 401);
    assert!(matches!(error, ControlError::Unauthorized(_)), "{error:?}");
    let raw = h
        .client(Some("wrong"))
        .raw("GET", "/v1/pipelines/p/tap/enrich", None)
        .expect("raw");
    assert_eq!(raw.status, 401);
    assert!(h.fake.calls().is_empty());
    let c = h.client(Some("s3cret"));
    let mut events = Vec::new();
    c.tap("p", &request, |e| {
        events.push(e);
        true
    })
    .expect("tap");
    assert_eq!(events, tap_events(&request, 40));
    assert_eq!(h.fake.calls(), vec![Call::Tap("p".into(), request.clone())]);

    // The reader may stop early.
    let mut seen = 0;
    let all = TapRequest {
        operator: "enrich".into(),
        ..TapRequest::default()
    };
    c.tap("p", &all, |_| {
        seen += 1;
        seen < 2
    })
    .expect("tap");
    assert_eq!(seen, 2);

    // Over the raw route: NDJSON, one event per line.
    let raw = c
        .raw("GET", "/v1/pipelines/p/tap/enrich?limit=1", None)
        .expect("raw");
    assert_eq!(raw.status, 200);
    assert_eq!(raw.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<TapEvent> = raw
        .body
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("a tap event per line"))
        .collect();
    assert_eq!(
        lines,
        tap_events(
            &TapRequest {
                operator: "enrich".into(),
                limit: Some(1),
                ..TapRequest::default()
            },
            1
        )
    );
}

#[test]
fn a_tap_of_an_unknown_pipeline_or_with_bad_parameters_is_refused() {
    let h = Harness::start(None);
    let c = h.client(None);
    let request = TapRequest {
        operator: "x".into(),
        ..TapRequest::default()
    };
    let (status, error) = api_error(c.tap("nope", &request, |_| true));
    assert_eq!(status, 404);
    assert_eq!(error, ControlError::NoSuchPipeline("nope".into()));
    for (query, says) in [
        ("side=both", "side `both`"),
        ("sample=lots", "sample `lots`"),
        ("limit=-1", "limit `-1`"),
        ("every=1", "unknown query parameter `every`"),
    ] {
        let raw = c
            .raw("GET", &format!("/v1/pipelines/p/tap/x?{query}"), None)
            .expect("raw");
        assert_eq!(raw.status, 400, "{query}");
        assert!(
            String::from_utf8_lossy(&raw.body).contains(says),
            "{query}: {}",
            String::from_utf8_lossy(&raw.body)
        );
    }
    // Only the taps that passed the query reached the job.
    assert_eq!(h.fake.calls(), vec![Call::Tap("nope".into(), request)]);
}
