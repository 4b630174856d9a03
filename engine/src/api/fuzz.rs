//! Property test of the API's request handling, through the real axum router in process
//! (every layer: the screening of `Host`, `Origin` and `Content-Type`, the body limit, the
//! token, routing, body parsing) over the recording job of `tests`: random methods, routes,
//! headers and bodies (random JSON, request-shaped objects with hostile values, nesting far
//! deeper than any parser should recurse, raw bytes, bodies over the limit) must each get an
//! answer, never a panic, with the status the request deserves and a small JSON body; and
//! only requests that pass every check reach the job.
//!
//! `WEIR_API_FUZZ_CASES` sets the number of cases (default 3000, a few seconds in a debug
//! build) and `WEIR_API_FUZZ_SEED` the seed (default a fixed one, so that every test run,
//! CI's included, sends the same requests; a failure names its seed to replay it). The long
//! run is `WEIR_API_FUZZ_CASES=1000000 WEIR_API_FUZZ_SEED=$RANDOM ./cargo.sh test --release
//! -p weir-engine --lib api::fuzz::any_request` (README, "Development").
//! A second test sends raw byte streams over a real socket, for the HTTP parser in front.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use tower::ServiceExt;

use super::server::{AppState, ErrorBody, MAX_BODY, router};
use super::tests::{Call, Fake};
use crate::control::JobControl;

/// Cases unless `WEIR_API_FUZZ_CASES` says otherwise.
const DEFAULT_CASES: u32 = 3000;

/// The seed unless `WEIR_API_FUZZ_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x00a9_1e57;

/// The port the router believes it listens on (its own origin).
const PORT: u16 = 8642;

const TOKEN: &str = "s3cret";

/// One generated request.
#[derive(Clone, Debug)]
struct Case {
    method: &'static str,
    path: String,
    host: Option<&'static str>,
    origin: Option<String>,
    content_type: Option<String>,
    auth: Option<&'static str>,
    body: Vec<u8>,
}

/// The routes, with and without bodies, plus near misses.
fn path() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        Just("p".to_owned()),
        Just("busy".to_owned()),
        Just("bad".to_owned()),
        Just("boom".to_owned()),
        Just("%2e%2e%2fetc".to_owned()),
        Just("a%20b".to_owned()),
        "[a-zA-Z0-9_%.-]{0,20}",
    ];
    prop_oneof![
        Just("/v1/status".to_owned()),
        Just("/v1/reload".to_owned()),
        Just("/".to_owned()),
        Just("/ui/app.js".to_owned()),
        id.clone()
            .prop_map(|i| format!("/v1/pipelines/{i}/checkpoints")),
        id.clone()
            .prop_map(|i| format!("/v1/pipelines/{i}/savepoints")),
        id.prop_map(|i| format!("/v1/pipelines/{i}/stop")),
        "/[a-z0-9/._%-]{0,30}",
    ]
}

/// Strings a hostile client would put in a path or id field.
fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/etc/passwd".to_owned()),
        Just("../../../../etc".to_owned()),
        Just("/".to_owned()),
        Just(String::new()),
        Just("a\u{0}b".to_owned()),
        Just("busy.yaml".to_owned()),
        Just("\u{202e}evil".to_owned()),
        "\\PC{0,30}",
    ]
}

/// Random JSON, shallow but wide, with the request types' field names likely.
fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        hostile_string().prop_map(Value::String),
    ];
    let key = prop_oneof![
        Just("dir".to_owned()),
        Just("file".to_owned()),
        Just("plan_only".to_owned()),
        Just("savepoint".to_owned()),
        Just("drain".to_owned()),
        "\\PC{0,8}",
    ];
    leaf.prop_recursive(6, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Request bodies: JSON (random or request-shaped), deep nesting, raw bytes, oversized.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let shaped = (
        prop::option::of(hostile_string()),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(path, a, b)| {
            let mut m = serde_json::Map::new();
            if let Some(p) = path {
                m.insert("dir".into(), p.clone().into());
                m.insert("file".into(), p.into());
            }
            if let Some(a) = a {
                m.insert("plan_only".into(), a.into());
                m.insert("savepoint".into(), a.into());
            }
            if let Some(b) = b {
                m.insert("drain".into(), b.into());
            }
            serde_json::Value::Object(m)
        });
    prop_oneof![
        3 => json().prop_map(|v| v.to_string().into_bytes()),
        3 => shaped.prop_map(|v| v.to_string().into_bytes()),
        1 => (1usize..40_000, prop_oneof![Just(b'['), Just(b'{')]).prop_map(|(depth, open)| {
            let close = if open == b'[' { b']' } else { b'}' };
            let mut b = vec![open; depth];
            b.extend(std::iter::repeat_n(close, depth));
            b
        }),
        1 => (1usize..40_000).prop_map(|depth| {
            // `{"dir":{"dir":...` without the closing half.
            b"{\"dir\":".repeat(depth)
        }),
        2 => prop::collection::vec(any::<u8>(), 0..256),
        1 => (MAX_BODY - 2..MAX_BODY + 4096, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
        1 => Just(Vec::new()),
        1 => Just(b" \n\t".to_vec()),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let method = prop_oneof![
        3 => Just("POST"),
        2 => Just("GET"),
        1 => Just("HEAD"),
        1 => Just("PUT"),
        1 => Just("DELETE"),
        1 => Just("OPTIONS"),
    ];
    let host = prop_oneof![
        4 => Just(Some("127.0.0.1:8642")),
        1 => Just(Some("localhost:8642")),
        1 => Just(Some("[::1]:8642")),
        1 => Just(Some("evil.example:8642")),
        1 => Just(Some("127.0.0.1.nip.io")),
        1 => Just(None),
    ];
    let origin = prop_oneof![
        4 => Just(None),
        1 => Just(Some(format!("http://127.0.0.1:{PORT}"))),
        1 => Just(Some(format!("http://localhost:{PORT}"))),
        1 => Just(Some("http://evil.example".to_owned())),
        1 => Just(Some("null".to_owned())),
        1 => Just(Some("http://127.0.0.1:1".to_owned())),
        1 => "\\PC{0,20}".prop_map(Some),
    ];
    let content_type = prop_oneof![
        5 => Just(Some("application/json".to_owned())),
        1 => Just(Some("Application/JSON; charset=utf-8".to_owned())),
        1 => Just(Some("text/plain".to_owned())),
        1 => Just(Some("application/x-www-form-urlencoded".to_owned())),
        1 => Just(None),
        1 => "[ -~]{0,24}".prop_map(Some),
    ];
    let auth = prop_oneof![
        3 => Just(Some("Bearer s3cret")),
        1 => Just(Some("Bearer wrong")),
        1 => Just(Some("Basic czNjcmV0")),
        1 => Just(None),
    ];
    (method, path(), host, origin, content_type, auth, body()).prop_map(
        |(method, path, host, origin, content_type, auth, body)| Case {
            method,
            path,
            host,
            origin,
            content_type,
            auth,
            body,
        },
    )
}

/// Whether the request reaches a route that reads its body, and which.
fn route_of(method: &str, path: &str) -> Option<&'static str> {
    let parts: Vec<&str> = path.split('/').collect();
    match (method, parts.as_slice()) {
        ("GET" | "HEAD", ["", "v1", "status"]) => Some("status"),
        ("GET" | "HEAD", ["", "v1", "pipelines", _, "checkpoints"]) => Some("checkpoints"),
        ("POST", ["", "v1", "pipelines", _, "checkpoints"]) => Some("trigger"),
        ("POST", ["", "v1", "pipelines", _, "savepoints"]) => Some("savepoint"),
        ("POST", ["", "v1", "pipelines", _, "stop"]) => Some("stop"),
        ("POST", ["", "v1", "reload"]) => Some("reload"),
        _ => None,
    }
}

/// Sends `case` through the router and checks the answer against what the request deserves.
async fn check(app: axum::Router, fake: &Fake, case: &Case) -> Result<(), TestCaseError> {
    let mut request = Request::builder().method(case.method).uri(&case.path);
    if let Some(h) = case.host {
        request = request.header("host", h);
    }
    if let Some(o) = &case.origin {
        request = request.header("origin", o.as_str());
    }
    if let Some(t) = &case.content_type {
        request = request.header("content-type", t.as_str());
    }
    if let Some(a) = case.auth {
        request = request.header("authorization", a);
    }
    // Header values a client cannot send (control characters) are not requests at all.
    let Ok(request) = request.body(Body::from(case.body.clone())) else {
        return Ok(());
    };
    let calls_before = fake.calls().len();
    let response = app
        .oneshot(request)
        .await
        .map_err(|e| TestCaseError::fail(format!("the router failed: {e}")))?;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1024 * 1024)
        .await
        .map_err(|e| TestCaseError::fail(format!("unreadable answer: {e}")))?;
    prop_assert!(bytes.len() < 64 * 1024, "answer of {} bytes", bytes.len());
    let allowed = [200, 400, 401, 403, 404, 405, 409, 413, 415, 500];
    prop_assert!(allowed.contains(&status.as_u16()), "status {status}");
    // The web page's files are the only answers that are not JSON.
    let page = matches!(case.method, "GET" | "HEAD")
        && matches!(case.path.as_str(), "/" | "/ui/app.js" | "/ui/app.css")
        && status.is_success();
    if case.method != "HEAD" && !page {
        let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&bytes);
        prop_assert!(
            parsed.is_ok(),
            "not JSON: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        if !status.is_success() {
            prop_assert!(
                serde_json::from_slice::<ErrorBody>(&bytes).is_ok(),
                "not an error body: {:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }

    let mutating = !matches!(case.method, "GET" | "HEAD");
    let host_ok = match case.host {
        None => true,
        Some(h) => {
            h.starts_with("127.0.0.1:") || h.starts_with("localhost") || h.starts_with("[::1]")
        }
    };
    let origin_ok = case.origin.as_deref().is_none_or(|o| {
        o == format!("http://127.0.0.1:{PORT}") || o == format!("http://localhost:{PORT}")
    });
    let json = case.content_type.as_deref().is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    let route = route_of(case.method, &case.path);
    let reached = fake.calls().len() > calls_before;
    if !host_ok {
        prop_assert_eq!(status, StatusCode::FORBIDDEN);
    } else if mutating && !origin_ok {
        prop_assert_eq!(status, StatusCode::FORBIDDEN);
    } else if mutating && !json {
        prop_assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    } else if route.is_some() && mutating && case.auth != Some("Bearer s3cret") {
        prop_assert_eq!(status, StatusCode::UNAUTHORIZED);
    } else if matches!(route, Some("trigger" | "savepoint" | "stop" | "reload"))
        && case.body.len() > MAX_BODY
    {
        // A pipeline id that does not decode (`%a0`) is refused first, with 400.
        let bad_id = case.path.contains('%') && status == StatusCode::BAD_REQUEST;
        prop_assert!(
            status == StatusCode::PAYLOAD_TOO_LARGE || bad_id,
            "status {status}"
        );
    }
    if reached {
        // Only requests that passed every check reach the job.
        prop_assert!(host_ok && route.is_some(), "{case:?}");
        if mutating {
            prop_assert!(
                origin_ok && json && case.auth == Some("Bearer s3cret"),
                "{case:?}"
            );
            prop_assert!(case.body.len() <= MAX_BODY);
        }
    }
    if status.is_success() && mutating {
        prop_assert!(reached, "a 200 without reaching the job: {case:?}");
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("WEIR_API_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn seed() -> u64 {
    std::env::var("WEIR_API_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

#[test]
fn any_request_gets_the_answer_it_deserves_and_never_a_panic() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fake = Arc::new(Fake::default());
    let control: Arc<dyn JobControl> = fake.clone();
    let app = router(AppState::new(control, Some(TOKEN.to_owned()), PORT));
    let (total, seed) = (cases(), seed());
    let mut runner = TestRunner::new(Config {
        cases: total,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let result = runner.run(&case(), |c| {
        // Keep the recording bounded over a long run.
        fake.clear();
        rt.block_on(check(app.clone(), &fake, &c))
    });
    if let Err(e) = result {
        panic!("{e}\n(replay with WEIR_API_FUZZ_SEED={seed} WEIR_API_FUZZ_CASES={total})");
    }
    eprintln!(
        "API property test: {total} requests (seed {seed}) through the router in {:.1} s, no \
         failure",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn only_checked_requests_reach_the_job_in_a_fixed_sample() {
    // A deterministic complement to the random run: one request of each kind.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fake = Arc::new(Fake::default());
    let control: Arc<dyn JobControl> = fake.clone();
    let app = router(AppState::new(control, Some(TOKEN.to_owned()), PORT));
    let good = Case {
        method: "POST",
        path: "/v1/pipelines/p/stop".into(),
        host: Some("127.0.0.1:8642"),
        origin: None,
        content_type: Some("application/json".into()),
        auth: Some("Bearer s3cret"),
        body: b"{\"savepoint\": true}".to_vec(),
    };
    let deep = Case {
        body: [vec![b'['; 30_000], vec![b']'; 30_000]].concat(),
        ..good.clone()
    };
    for c in [&good, &deep] {
        rt.block_on(check(app.clone(), &fake, c))
            .expect("as deserved");
    }
    assert_eq!(
        fake.calls(),
        vec![Call::Stop(
            "p".into(),
            crate::control::StopRequest {
                savepoint: true,
                ..Default::default()
            }
        )]
    );
}

#[test]
fn raw_bytes_on_the_socket_never_take_the_server_down() {
    use std::io::{Read, Write};
    let h = super::tests::Harness::start(None);
    let addr = h.addr();
    let mut seed = seed();
    let total = (cases() / 10).max(200);
    for i in 0..total {
        seed = crate::connectors::generator::splitmix64(seed.wrapping_add(u64::from(i)));
        let len = (seed % 2048) as usize;
        let mut bytes: Vec<u8> = (0..len)
            .map(|j| crate::connectors::generator::splitmix64(seed ^ j as u64) as u8)
            .collect();
        if i % 3 == 0 {
            // A plausible request line first, then garbage, so hyper parses further.
            let mut head = b"POST /v1/reload HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
            head.append(&mut bytes);
            bytes = head;
        }
        let Ok(mut stream) = std::net::TcpStream::connect(&addr) else {
            panic!("the server stopped accepting after {i} garbage connections");
        };
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let _ = stream.write_all(&bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
    }
    // Still serving, and nothing reached the job.
    assert!(h.client(None).status().is_ok());
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
}
