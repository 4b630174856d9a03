//! `weir-engine`: turns a validated pipeline spec into an operator graph and runs it.
//!
//! Module map (one concern each):
//! - `validate` runs every check on a file (schema, semantic rules, Rhai scripts) and returns
//!   all diagnostics; `script` owns the Rhai engine, its sandbox and the functions scripts call;
//!   `plan` compiles specs into logical and physical graphs and renders them.
//! - `runtime` (tasks, channels, exchanges), `operators`, `connectors`, `record`, `state` and
//!   `job` run a plan; they build on `plan` and never re-read YAML.
//! - `control` is the surface a running job answers to (status, checkpoints, savepoints, stop,
//!   reload), shared by the HTTP API and the CLI verbs; `api` serves it over HTTP for `weir run`
//!   (axum), holds the blocking client of the CLI verbs and renders their answers as text.
//! - `reload` holds the two self-contained halves of hot reload: the file watcher (debounced
//!   content changes of the pipeline and script files) and the reload plan (a pure diff of two
//!   compiled files); the job drives the reload itself.
//! - `checkpoint` (aligner, coordinator, metadata, storage, retention) and `recovery` (restart
//!   and failover strategies) are the fault-tolerance protocol as pure logic, driven by the job.

pub mod api;
pub mod base;
pub mod checkpoint;
pub mod connectors;
pub mod control;
pub mod job;
pub mod operators;
pub mod plan;
pub mod record;
pub mod recovery;
pub mod reload;
pub mod runtime;
pub mod script;
pub mod state;
pub mod validate;
