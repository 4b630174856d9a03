//! The web page `weir run` serves at `/` on the control API: the operator graph of every
//! pipeline, live per-operator rates and backpressure, the checkpoint history and the reload
//! history. Its three files (`page/index.html`, `page/app.js`, `page/app.css`: plain HTML,
//! JavaScript and CSS, no framework, no build step) are compiled into the binary.
//!
//! This module owns only serving those files and the headers that keep the page to itself:
//! a content security policy that allows nothing but its own script, stylesheet and fetches
//! to this API (no inline script, no other origin), no framing, no `Referer`, no caching. The
//! page reads the API like any client: `GET /v1/status` and `GET
//! /v1/pipelines/{id}/checkpoints` once a second. It changes nothing.
//!
//! The requests for the page pass the same screening as every API request (`server`): a
//! `Host` that is not a loopback name or an IP address is refused. The bearer token, when the
//! API has one, cannot travel with a page load; the page takes it from the URL fragment
//! (`http://127.0.0.1:8642/#token=...`), which a browser never sends to a server (so it is in
//! no request and no log), and sends it as `Authorization: Bearer` with every fetch.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The page's paths besides `/`, for the route list in error messages.
pub(crate) const SCRIPT_PATH: &str = "/ui/app.js";
/// The stylesheet's path.
pub(crate) const STYLE_PATH: &str = "/ui/app.css";

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const APP_CSS: &str = include_str!("page/app.css");

/// Its own script, stylesheet and fetches; nothing inline, nothing from elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the page.
pub(crate) async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

/// `GET /ui/app.js`: its script.
pub(crate) async fn script() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

/// `GET /ui/app.css`: its stylesheet.
pub(crate) async fn style() -> Response {
    asset(APP_CSS, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    let mut set = |name: HeaderName, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(header::CONTENT_TYPE, content_type);
    set(header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY);
    set(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(header::X_FRAME_OPTIONS, "DENY");
    set(header::REFERRER_POLICY, "no-referrer");
    set(header::CACHE_CONTROL, "no-store");
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::api::server::{AppState, router};
    use crate::api::tests::Fake;

    /// `GET path` with `host` through the whole router (a token set): status, headers, body.
    async fn get(path: &str, host: &str) -> (StatusCode, axum::http::HeaderMap, String) {
        let app = router(AppState::new(
            Arc::new(Fake::default()),
            Some("s3cret".into()),
            8642,
        ));
        let request = Request::builder()
            .uri(path)
            .header("host", host)
            .body(Body::empty())
            .expect("a request");
        let response = app.oneshot(request).await.expect("an answer");
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), 1024 * 1024)
            .await
            .expect("a body");
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_page_and_its_files_are_served_with_their_types_and_policy() {
        for (path, kind, start) in [
            ("/", "text/html", "<!doctype html>"),
            (SCRIPT_PATH, "text/javascript", "// The web page"),
            (STYLE_PATH, "text/css", "/* The web page"),
        ] {
            let (status, headers, body) = get(path, "127.0.0.1:8642").await;
            assert_eq!(status, StatusCode::OK, "{path}");
            let header = |name: HeaderName| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            assert!(header(header::CONTENT_TYPE).starts_with(kind), "{path}");
            assert_eq!(
                header(header::CONTENT_SECURITY_POLICY),
                CONTENT_SECURITY_POLICY
            );
            assert_eq!(header(header::X_FRAME_OPTIONS), "DENY");
            assert!(body.starts_with(start), "{path}: {body:.80}");
        }
    }

    #[tokio::test]
    async fn the_page_is_refused_to_a_foreign_host() {
        let (status, _, body) = get("/", "evil.example:8642").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("forbidden"), "{body}");
    }

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(INDEX_HTML.contains(&format!("src=\"{SCRIPT_PATH}\"")));
        assert!(INDEX_HTML.contains(&format!("href=\"{STYLE_PATH}\"")));
        // No inline script or style: the content security policy would block them.
        assert!(!INDEX_HTML.contains("<script>") && !INDEX_HTML.contains("style="));
        assert!(!INDEX_HTML.contains("<style"));
        assert!(!APP_JS.contains("innerHTML") && !APP_JS.contains("eval("));
    }
}
