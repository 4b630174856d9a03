//! The HTTP side of the control API: binds the listener, routes requests to a
//! [`JobControl`], refuses what a browser or a stray client must not do, checks the bearer
//! token on mutating calls and turns every failure into a JSON error with the status code of
//! its [`ControlError`] variant.
//!
//! It also serves the web page (`page`) at `/`, behind the same screening.
//!
//! Every request passes, in order: a `Host` that is a loopback name or an IP address (a web
//! page that rebinds its own domain to 127.0.0.1 sends its domain: refused, 403); for a
//! mutating call (anything but `GET`/`HEAD`), no foreign `Origin` (403), `Content-Type:
//! application/json` (415: a cross-site form or `fetch` cannot send it without a CORS
//! preflight, which this server never grants) and the bearer token when one is set (401).
//! Bodies are limited to [`MAX_BODY`] bytes (413). What a request may name on disk (reload
//! files, savepoint directories) is the job's to confine, not this module's.
//!
//! It owns no job behaviour and keeps no state beyond the control object and the token.
//! Mutating calls run on their own tokio task, so a client that hangs up mid-savepoint does
//! not cancel the savepoint half-way; there is no server-side timeout on them (a savepoint of
//! a large state or a reload may take minutes).

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::page;
use crate::base::error::ApiError;
use crate::control::{
    CheckpointInfo, ControlError, JobControl, JobStatus, ReloadOutcome, ReloadRequest,
    SavepointInfo, SavepointRequest, StopOutcome, StopRequest, TapRequest, TapSide, TapStream,
};

/// Every route, for the message of an unknown route or a wrong method.
const ROUTES: &str = "GET /metrics, GET /v1/status, GET and POST /v1/pipelines/{id}/checkpoints, \
                      POST /v1/pipelines/{id}/savepoints, POST /v1/pipelines/{id}/stop, \
                      GET /v1/pipelines/{id}/tap/{operator}, POST /v1/reload, and the \
                      web page at GET /";

/// How long [`ApiServer::shutdown`] waits for calls in flight before it stops waiting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The largest request body accepted (every request type is a few hundred bytes at most).
pub const MAX_BODY: usize = 64 * 1024;

/// Where and how the API listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiConfig {
    /// The address to bind, normally `127.0.0.1:<port>`; port 0 picks a free one (read it
    /// back with [`ApiServer::local_addr`]).
    pub addr: SocketAddr,
    /// When set, every `POST` must carry `Authorization: Bearer <token>`; `GET`s stay open.
    pub token: Option<String>,
}

impl ApiConfig {
    /// Listens on `127.0.0.1:port` (loopback only).
    pub fn local(port: u16, token: Option<String>) -> Self {
        Self {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            token,
        }
    }
}

impl ApiError {
    fn bind(addr: SocketAddr, source: io::Error) -> Self {
        match source.kind() {
            io::ErrorKind::AddrInUse => Self::AddressInUse {
                addr,
                owner: super::port_owner::describe(addr.port()),
            },
            _ => Self::Listen { addr, source },
        }
    }
}

/// A running API server. Dropping it (or calling [`ApiServer::shutdown`]) stops accepting
/// connections at once; calls already in flight run to their end.
#[derive(Debug)]
pub struct ApiServer {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// The address actually bound (with the real port when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting connections, closes idle ones and waits (up to 5 seconds) for calls in
    /// flight to answer. The work those calls started goes on regardless.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
        tracing::info!(addr = %self.local_addr, "Control API stopped.");
    }
}

/// Binds `config.addr` now and serves the API on the current tokio runtime until the returned
/// handle is shut down or dropped.
///
/// Must be called from within a tokio runtime with I/O enabled; connections and mutating
/// calls are spawned on that runtime.
///
/// # Errors
/// [`ApiError::AddressInUse`] when something already listens there, [`ApiError::Listen`] for
/// any other bind failure.
pub async fn serve(control: Arc<dyn JobControl>, config: ApiConfig) -> Result<ApiServer, ApiError> {
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| ApiError::bind(config.addr, e))?;
    let local_addr = listener
        .local_addr()
        .map_err(|e| ApiError::bind(config.addr, e))?;
    let auth = config.token.is_some();
    let app = router(AppState {
        control,
        token: config.token.map(Arc::from),
        port: local_addr.port(),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        // Dropping the sender (the handle dropped) also shuts the server down.
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::warn!(error = %e, "Control API stopped with an error.");
        }
    });
    tracing::debug!(addr = %local_addr, auth, "Control API listening.");
    Ok(ApiServer {
        local_addr,
        stop: Some(stop),
        task: Some(task),
    })
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    control: Arc<dyn JobControl>,
    token: Option<Arc<str>>,
    /// The port the API listens on (its own origin is `http://127.0.0.1:<port>`).
    port: u16,
}

#[cfg(test)]
impl AppState {
    /// The state of a router over `control` (tests drive it without a socket).
    pub(crate) fn new(control: Arc<dyn JobControl>, token: Option<String>, port: u16) -> Self {
        Self {
            control,
            token: token.map(Arc::from),
            port,
        }
    }
}

/// The whole API as an axum router: routes, the request checks, the body limit.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route(page::SCRIPT_PATH, get(page::script))
        .route(page::STYLE_PATH, get(page::style))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .route(
            "/v1/pipelines/{id}/checkpoints",
            get(checkpoints).post(trigger_checkpoint),
        )
        .route("/v1/pipelines/{id}/savepoints", post(savepoint))
        .route("/v1/pipelines/{id}/stop", post(stop))
        .route("/v1/pipelines/{id}/tap/{operator}", get(tap))
        .route("/v1/reload", post(reload))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize))
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(state.clone(), screen))
        .layer(middleware::map_response(redact_secrets))
        .with_state(state)
}

/// Hides every `${secret:...}` value this process loaded from an answer's body (an error
/// message or a status may quote a path or a description built from one). A tap's stream
/// (NDJSON) carries records, which are data, and is passed through as it streams.
async fn redact_secrets(response: Response) -> Response {
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/x-ndjson"));
    if streamed {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, axum::body::Body::empty());
    };
    let text = String::from_utf8_lossy(&bytes);
    let redacted = weir_schema::interpolate::redact(&text);
    let mut parts = parts;
    if redacted != text {
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, axum::body::Body::from(redacted));
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// The JSON body of every error answer: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    /// The error, in its serde form.
    pub(crate) error: ControlError,
}

/// The HTTP status of each [`ControlError`] variant.
pub(crate) fn status_code(error: &ControlError) -> StatusCode {
    match error {
        ControlError::NoSuchPipeline(_) => StatusCode::NOT_FOUND,
        ControlError::Busy(_) => StatusCode::CONFLICT,
        ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
        ControlError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        ControlError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        ControlError::Forbidden(_) => StatusCode::FORBIDDEN,
    }
}

/// An error answer: the variant's own status unless overridden (unknown routes, wrong
/// methods, oversized bodies).
struct Failure {
    status: StatusCode,
    error: ControlError,
}

impl From<ControlError> for Failure {
    fn from(error: ControlError) -> Self {
        Self {
            status: status_code(&error),
            error,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let unauthorized = matches!(self.error, ControlError::Unauthorized(_));
        let mut response = (self.status, Json(ErrorBody { error: self.error })).into_response();
        if unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"weir\""),
            );
        }
        response
    }
}

async fn status(State(s): State<AppState>) -> Json<JobStatus> {
    Json(s.control.status())
}

/// The job's figures in the Prometheus (OpenMetrics) text format; open like every `GET`.
async fn metrics(State(s): State<AppState>) -> Response {
    let text = super::metrics::render(&s.control.status());
    ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text).into_response()
}

async fn checkpoints(
    State(s): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Vec<CheckpointInfo>>, Failure> {
    let id = pipeline_id(id)?;
    s.control.checkpoints(&id).map(Json).map_err(Failure::from)
}

/// The body of a checkpoint trigger: nothing (`{}` or empty); anything else is refused rather
/// than ignored.
#[derive(Debug, Default, Serialize, Deserialize)]
struct CheckpointRequest {}

async fn trigger_checkpoint(
    State(s): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CheckpointInfo>, Failure> {
    let id = pipeline_id(id)?;
    let CheckpointRequest {} = parse_body(body, "checkpoint request (no fields: `{}`)")?;
    tracing::info!(pipeline = %id, "API: checkpoint requested.");
    let control = Arc::clone(&s.control);
    detached("checkpoint", async move {
        control.trigger_checkpoint(&id).await
    })
    .await
    .map(Json)
}

async fn savepoint(
    State(s): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<SavepointInfo>, Failure> {
    let id = pipeline_id(id)?;
    let request: SavepointRequest = parse_body(body, "savepoint request ({\"dir\": PATH})")?;
    tracing::info!(pipeline = %id, dir = %crate::base::human::Maybe::or(request.dir.as_ref().map(|d| d.display()), "the default"), "API: savepoint requested.");
    let control = Arc::clone(&s.control);
    detached(
        "savepoint",
        async move { control.savepoint(&id, request).await },
    )
    .await
    .map(Json)
}

async fn stop(
    State(s): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<StopOutcome>, Failure> {
    let id = pipeline_id(id)?;
    let request: StopRequest = parse_body(
        body,
        "stop request ({\"savepoint\": BOOL, \"drain\": BOOL, \"dir\": PATH})",
    )?;
    tracing::info!(
        pipeline = %id,
        savepoint = request.savepoint,
        drain = request.drain,
        "API: stop requested."
    );
    let control = Arc::clone(&s.control);
    detached("stop", async move { control.stop(&id, request).await })
        .await
        .map(Json)
}

async fn reload(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ReloadOutcome>, Failure> {
    let request: ReloadRequest = parse_body(
        body,
        "reload request ({\"file\": PATH, \"plan_only\": BOOL, \"allow_non_restored_state\": BOOL})",
    )?;
    tracing::info!(plan_only = request.plan_only, file = %crate::base::human::Maybe::or(request.file.as_ref().map(|d| d.display()), "the running file"), "API: reload requested.");
    let control = Arc::clone(&s.control);
    detached("reload", async move { control.reload(request).await })
        .await
        .map(Json)
}

/// `GET /v1/pipelines/{id}/tap/{operator}?side=input|output&sample=RATE&limit=N`: the tap's
/// events as newline-delimited JSON, streamed (chunked) until the tap ends or the client
/// hangs up, which closes the tap.
async fn tap(
    State(s): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    uri: Uri,
) -> Result<Response, Failure> {
    let (id, operator) = path.map(|Path(p)| p).map_err(|e| {
        Failure::from(ControlError::Invalid(format!(
            "the pipeline or operator id in the path is not valid: {e}"
        )))
    })?;
    let request = tap_request(operator, uri.query().unwrap_or_default())?;
    let stream = s.control.tap(&id, request)?;
    let lines = futures_util::stream::unfold(stream, |mut stream: TapStream| async move {
        let event = stream.next().await?;
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), stream))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(lines),
    )
        .into_response())
}

/// The tap request of a query string (`side`, `sample`, `limit`; each optional); an unknown
/// or malformed parameter is refused, not ignored.
fn tap_request(operator: String, query: &str) -> Result<TapRequest, Failure> {
    let invalid = |message: String| Failure::from(ControlError::Invalid(message));
    let mut request = TapRequest {
        operator,
        ..TapRequest::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "side" => {
                request.side = match value {
                    "input" => TapSide::Input,
                    "output" => TapSide::Output,
                    _ => {
                        return Err(invalid(format!(
                            "side `{value}` is neither `input` nor `output`"
                        )));
                    }
                }
            }
            "sample" => {
                request.sample = value
                    .parse()
                    .map_err(|_| invalid(format!("sample `{value}` is not a number in (0, 1]")))?;
            }
            "limit" => {
                request.limit = Some(value.parse().map_err(|_| {
                    invalid(format!("limit `{value}` is not a whole number of records"))
                })?);
            }
            other => {
                return Err(invalid(format!(
                    "unknown query parameter `{other}`; a tap takes side, sample and limit"
                )));
            }
        }
    }
    Ok(request)
}

async fn unknown_route(method: Method, uri: Uri) -> Failure {
    Failure {
        status: StatusCode::NOT_FOUND,
        error: ControlError::Invalid(format!(
            "no route `{method} {}`; the API serves {ROUTES}",
            uri.path()
        )),
    }
}

async fn wrong_method(method: Method, uri: Uri) -> Failure {
    Failure {
        status: StatusCode::METHOD_NOT_ALLOWED,
        error: ControlError::Invalid(format!(
            "`{}` does not answer to {method}; the API serves {ROUTES}",
            uri.path()
        )),
    }
}

/// Refuses, before any route, what only a browser tricked by another site (or a confused
/// client) sends: a `Host` that is not a loopback name or an IP address (DNS rebinding); and
/// for mutating calls, an `Origin` other than the API's own, or a body that is not declared
/// `application/json`.
async fn screen(State(s): State<AppState>, request: Request, next: Next) -> Response {
    let refusal = check_host(request.headers()).and_then(|()| {
        let open = request.method() == Method::GET || request.method() == Method::HEAD;
        if open {
            return Ok(());
        }
        check_origin(request.headers(), s.port)?;
        check_content_type(request.headers())
    });
    match refusal {
        Ok(()) => next.run(request).await,
        Err(failure) => {
            tracing::warn!(
                method = %request.method(),
                path = request.uri().path(),
                reason = %failure.error,
                "API: refused a request."
            );
            failure.into_response()
        }
    }
}

/// `Ok` without a `Host` header, or with one naming `localhost` (or `*.localhost`) or an IP
/// address: names that a web page cannot rebind to this machine.
fn check_host(headers: &HeaderMap) -> Result<(), Failure> {
    let Some(value) = headers.get(header::HOST) else {
        return Ok(());
    };
    let host = value.to_str().ok().map(|v| split_authority(v).0);
    match host {
        Some(h) if is_local_name(h) || h.parse::<std::net::IpAddr>().is_ok() => Ok(()),
        _ => Err(Failure {
            status: StatusCode::FORBIDDEN,
            error: ControlError::Forbidden(format!(
                "the request is addressed to host `{}`, not to this machine's loopback \
                 address: the control API answers only to `127.0.0.1`, `[::1]` or \
                 `localhost` (a web page that points its own domain at 127.0.0.1 must not \
                 reach it); call it as http://127.0.0.1:<port>",
                String::from_utf8_lossy(value.as_bytes())
            )),
        }),
    }
}

/// An authority (`Host` header, or an origin without its scheme) split into its host and
/// port: `[::1]:8642` → (`::1`, `8642`), `localhost` → (`localhost`, none).
fn split_authority(authority: &str) -> (&str, Option<&str>) {
    let authority = authority.trim();
    if let Some(rest) = authority.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => (rest, None),
        };
    }
    match authority.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    }
}

fn is_local_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost")
}

/// `Ok` without an `Origin` header (any non-browser client), or with the API's own origin:
/// `http://` + a loopback address or `localhost` + `:` + its port.
fn check_origin(headers: &HeaderMap, port: u16) -> Result<(), Failure> {
    let Some(value) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let own = value
        .to_str()
        .ok()
        .and_then(|o| o.strip_prefix("http://"))
        .is_some_and(|authority| {
            let (host, given_port) = split_authority(authority);
            let loopback = is_local_name(host)
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            let same_port = match given_port {
                Some(p) => p.parse::<u16>() == Ok(port),
                None => port == 80,
            };
            loopback && same_port
        });
    if own {
        return Ok(());
    }
    Err(Failure {
        status: StatusCode::FORBIDDEN,
        error: ControlError::Forbidden(format!(
            "cross-origin request refused: `Origin: {}` is not this API's own origin \
             (http://127.0.0.1:{port}); a web page must not stop, reload or savepoint \
             pipelines. Call the API from `weir` or a tool that sends no `Origin` header",
            String::from_utf8_lossy(value.as_bytes())
        )),
    })
}

/// `Ok` when the request declares `Content-Type: application/json` (parameters such as
/// `charset` allowed), as every mutating call must, with or without a body.
fn check_content_type(headers: &HeaderMap) -> Result<(), Failure> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim());
    if declared.is_some_and(|t| t.eq_ignore_ascii_case("application/json")) {
        return Ok(());
    }
    let given = match headers.get(header::CONTENT_TYPE) {
        Some(v) => format!("`{}`", String::from_utf8_lossy(v.as_bytes())),
        None => "none".to_owned(),
    };
    Err(Failure {
        status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        error: ControlError::Invalid(format!(
            "a mutating call must declare `Content-Type: application/json` (given: {given}), \
             even with an empty body; with curl: -H 'Content-Type: application/json'"
        )),
    })
}

/// Checks the bearer token of every request that is not a `GET` (or `HEAD`).
async fn authorize(State(s): State<AppState>, request: Request, next: Next) -> Response {
    // Reads are open to local processes, except a tap: it streams the records themselves.
    let open = (request.method() == Method::GET || request.method() == Method::HEAD)
        && !is_tap(request.uri().path());
    match &s.token {
        Some(token) if !open => match check_bearer(request.headers(), token) {
            Ok(()) => next.run(request).await,
            Err(message) => {
                tracing::warn!(
                    method = %request.method(),
                    path = request.uri().path(),
                    "API: refused a call without the right bearer token."
                );
                Failure::from(ControlError::Unauthorized(message)).into_response()
            }
        },
        _ => next.run(request).await,
    }
}

/// Whether `path` opens a tap (`/v1/pipelines/{id}/tap/{operator}`).
fn is_tap(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    matches!(parts.as_slice(), ["", "v1", "pipelines", _, "tap", _])
}

/// `Ok` when the request carries `Authorization: Bearer <token>`; otherwise says what is
/// wrong and how to pass the token.
fn check_bearer(headers: &HeaderMap, token: &str) -> Result<(), String> {
    const HOW: &str = "pass the token `weir run` was started with (its --api-token or \
                       WEIR_API_TOKEN) with --token or the WEIR_API_TOKEN environment variable";
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(format!(
            "missing bearer token: this API requires `Authorization: Bearer <token>` on every \
             POST and on taps; {HOW}"
        ));
    };
    let given = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    match given {
        None => Err(format!(
            "the Authorization header is not `Bearer <token>`; {HOW}"
        )),
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(format!(
            "wrong bearer token: it is not the one this `weir run` was started with; {HOW}"
        )),
    }
}

/// Compares `given` with `expected` in a time that depends only on `expected`'s length.
fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, &e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(g ^ e);
    }
    diff == 0
}

fn pipeline_id(id: Result<Path<String>, PathRejection>) -> Result<String, Failure> {
    id.map(|Path(id)| id).map_err(|e| {
        Failure::from(ControlError::Invalid(format!(
            "the pipeline id in the path is not valid: {e}"
        )))
    })
}

/// The request body as `T`: an empty body is `T::default()`, and so is every field the body
/// leaves out; a field `T` does not have is an error (a typo must not be ignored silently).
fn parse_body<T: DeserializeOwned + Serialize + Default>(
    body: Result<Bytes, BytesRejection>,
    expected: &str,
) -> Result<T, Failure> {
    let invalid = |message: String| Failure::from(ControlError::Invalid(message));
    let body = body.map_err(|e| Failure {
        status: e.status(),
        error: ControlError::Invalid(format!("cannot read the request body: {e}")),
    })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let given: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        invalid(format!(
            "malformed JSON body: {e}; expected a {expected} or an empty body"
        ))
    })?;
    let serde_json::Value::Object(given) = given else {
        return Err(invalid(format!(
            "the JSON body is not an object; expected a {expected} or an empty body"
        )));
    };
    let mut merged = match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    for (field, value) in given {
        if !merged.contains_key(&field) {
            let mut known: Vec<&str> = merged.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(invalid(format!(
                "unknown field `{field}` in the JSON body; expected a {expected} (fields: {})",
                known.join(", ")
            )));
        }
        merged.insert(field, value);
    }
    serde_path_to_error::deserialize(serde_json::Value::Object(merged)).map_err(|e| {
        invalid(format!(
            "malformed JSON body: field `{}`: {}; expected a {expected}",
            e.path(),
            e.inner()
        ))
    })
}

/// Runs a mutating call on its own task, so that it completes even if the client hangs up.
async fn detached<T: Send + 'static>(
    what: &str,
    work: impl Future<Output = Result<T, ControlError>> + Send + 'static,
) -> Result<T, Failure> {
    match tokio::spawn(work).await {
        Ok(answer) => answer.map_err(Failure::from),
        Err(e) => Err(Failure::from(ControlError::Failed(format!(
            "the {what} call ended abnormally ({e}); this is a bug in Weir: the `weir run` log \
             has the details"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_tokens() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"secret!", b"secret"));
        assert!(!constant_time_eq(b"Secret", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn bearer_header_forms() {
        let mut h = HeaderMap::new();
        assert!(check_bearer(&h, "t").is_err_and(|m| m.starts_with("missing")));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dDp0"),
        );
        assert!(check_bearer(&h, "t").is_err_and(|m| m.contains("not `Bearer")));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer t"));
        assert!(check_bearer(&h, "t").is_ok());
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer u"));
        assert!(check_bearer(&h, "t").is_err_and(|m| m.starts_with("wrong")));
    }

    #[test]
    fn every_error_code_has_its_status() {
        let s = |e: ControlError| status_code(&e).as_u16();
        assert_eq!(s(ControlError::NoSuchPipeline("p".into())), 404);
        assert_eq!(s(ControlError::Busy(String::new())), 409);
        assert_eq!(s(ControlError::Invalid(String::new())), 400);
        assert_eq!(s(ControlError::Failed(String::new())), 500);
        assert_eq!(s(ControlError::Unauthorized(String::new())), 401);
    }
}
