//! The control HTTP API of `weir run`: a small JSON-over-HTTP/1.1 server that translates
//! requests into [`JobControl`](crate::control::JobControl) calls (`server`), the blocking
//! client the CLI verbs (`weir status`, `savepoint`, `stop`, `reload`) use to call it
//! (`client`), the text rendering of answers shared by the CLI and `weir run`'s logs
//! (`render`), the Prometheus text of `GET /metrics` (`metrics`), how flags, environment and
//! the file's `api:` section combine into where it listens and its token (`settings`), who
//! holds a port that is taken (`port_owner`), and the web page served at `/` (`page`).
//!
//! This module owns the wire: routes, status codes, the error body, the request screening
//! (`Host`, `Origin`, `Content-Type`, body size) and the bearer-token check.
//! It owns no job behaviour: what a call does is entirely the `JobControl` implementation's,
//! and the request and answer types are `control`'s, unchanged on the wire.
//!
//! Routes (JSON in and out; every error is `{"error": {"code": ..., "message": ...}}`, the
//! serde form of [`ControlError`](crate::control::ControlError)):
//!
//! | method and path                      | body                | answer                |
//! |--------------------------------------|---------------------|-----------------------|
//! | `GET /v1/status`                     |                     | `JobStatus`           |
//! | `GET /metrics`                       |                     | OpenMetrics text      |
//! | `GET /v1/pipelines/{id}/checkpoints` |                     | `Vec<CheckpointInfo>` |
//! | `POST /v1/pipelines/{id}/checkpoints`| empty or `{}`      | `CheckpointInfo`      |
//! | `POST /v1/pipelines/{id}/savepoints` | `SavepointRequest`  | `SavepointInfo`       |
//! | `POST /v1/pipelines/{id}/stop`       | `StopRequest`       | `StopOutcome`         |
//! | `POST /v1/reload`                    | `ReloadRequest`     | `ReloadOutcome`       |
//! | `GET /v1/pipelines/{id}/tap/{op}`    | query: `side`, `sample`, `limit` | `TapEvent`s, one JSON per line, streamed |
//! | `GET /` (and `/ui/app.js`, `.css`)   |                     | the web page          |
//!
//! An empty request body stands for the request type's default. Status codes: 404
//! `no_such_pipeline` (and unknown routes, with code `invalid`), 405 for a known path with the
//! wrong method, 409 `busy`, 400 `invalid` (and malformed bodies), 500 `failed`, 401
//! `unauthorized`, 403 `forbidden` (foreign `Host` or `Origin`, a path outside what the API
//! may touch), 413 for a body over 64 KiB and 415 for a mutating call not declared
//! `application/json` (both with code `invalid`).

pub mod client;
pub mod metrics;
mod page;
pub mod port_owner;
pub mod render;
pub mod server;
pub mod settings;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

pub use client::{ApiClient, ClientError};
pub use render::render_reload;
pub use server::{ApiConfig, ApiServer, serve};

/// The port `weir run` serves the API on unless told otherwise.
pub const DEFAULT_PORT: u16 = 8642;

/// The address the CLI verbs call unless told otherwise (`127.0.0.1:`[`DEFAULT_PORT`]).
pub const DEFAULT_ADDR: &str = "127.0.0.1:8642";

/// The environment variable holding the API address for the CLI verbs.
pub const ADDR_ENV: &str = "WEIR_API";

/// The environment variable holding the bearer token, for `weir run` and the CLI verbs.
pub const TOKEN_ENV: &str = "WEIR_API_TOKEN";
