//! `weir-engine`: turns a validated pipeline spec into an operator graph and runs it.
//!
//! Module map (one concern each), from the ground floor up:
//! - `base` is the ground floor: the vocabulary every layer shares (`Batch`, `Message`,
//!   `Barrier`, the node metrics) and the one error type `RunError` with its classes (I/O,
//!   data, config, internal). It imports no other layer; `record` (values, keys, key groups)
//!   sits beside it.
//! - `validate` runs every check on a file (schema, semantic rules, Rhai scripts) and returns
//!   all diagnostics; `script` owns the Rhai engine, its sandbox and the functions scripts call;
//!   `plan` compiles specs into logical and physical graphs and renders them.
//! - `checkpoint` (aligner, coordinator, metadata, storage, retention) and `recovery` (restart
//!   and failover strategies) are the fault-tolerance protocol as pure logic, driven by the job.
//!   `state` holds the keyed state backends and `state::snapshot_files`, the layout of a
//!   subtask's snapshot files and their redistribution on rescale.
//! - `element` is the interface records flow through (the `Operator` trait and its context);
//!   `operators` (built-ins) and `connectors` (sources and sinks) implement it and never import
//!   each other; `registry`, above both, builds them from the plan.
//! - `runtime` (the task loop, input channels, exchanges) and `job` run a plan; they build on
//!   `plan` and never re-read YAML.
//! - `control` is the surface a running job answers to (status, checkpoints, savepoints, stop,
//!   reload), shared by the HTTP API and the CLI verbs; `api` serves it over HTTP for `weir run`
//!   (axum), holds the blocking client of the CLI verbs and renders their answers as text.
//! - `reload` holds the two self-contained halves of hot reload: the file watcher (debounced
//!   content changes of the pipeline and script files) and the reload plan (a pure diff of two
//!   compiled files); the job drives the reload itself.
//!
//! The import directions are checked by a test (`layers`, tests only).

pub mod api;
pub mod base;
pub mod checkpoint;
pub mod connectors;
pub mod control;
pub mod element;
pub mod job;
pub mod operators;
pub mod plan;
pub mod record;
pub mod recovery;
pub mod registry;
pub mod reload;
pub mod runtime;
pub mod script;
pub mod state;
pub mod validate;

#[cfg(test)]
mod layers;
