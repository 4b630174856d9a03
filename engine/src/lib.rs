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
//! - `inspect` reads a checkpoint or savepoint for people (`weir inspect`): metadata, keyed
//!   state in every backend's format, sources' positions; it sits above `registry` (which
//!   names the connectors whose local state it can describe) and is imported by nothing.
//! - `reload` holds the two self-contained halves of hot reload: the file watcher (debounced
//!   content changes of the pipeline and script files) and the reload plan (a pure diff of two
//!   compiled files); the job drives the reload itself.
//!
//! - `testing` runs a pipeline file against test inputs with steps (`weir test`): it drives
//!   `job` through `control` and imports nothing below them but `validate`, `plan`, `script`
//!   and `record`.
//!
//! The import directions are checked by a test (`layers`, tests only).

//! # Public surface
//!
//! Only a facade is public; every other module is crate-private:
//! - [`validate`]: check a pipeline file (`validate_file`, `validate_bytes`, `validate_str`) and
//!   get every diagnostic;
//! - [`plan`]: the compiled [`plan::FilePlan`], its rendering (`plan::render`) and the
//!   end-to-end guarantee each pipeline gives (`plan::guarantee`);
//! - [`job`]: run a plan (`job::run` with `job::JobOptions`) and its summary;
//! - [`control`]: what a running job answers to, as data (status, checkpoints, savepoints,
//!   stop, reload);
//! - [`api`]: the control API's server, its blocking client, its settings and text rendering;
//! - [`inspect`]: read a checkpoint or savepoint without running it (`weir inspect`);
//! - [`testing`]: run a pipeline against in-memory inputs with steps (`weir test`);
//! - [`error`]: the error a run ends with, and its class; [`savepoint_pipeline`]: which
//!   pipeline a savepoint was taken of.
//!
//! With the `testkit` feature (Weir's own tests, fuzzer and benchmarks; never in a release
//! `weir`, and not a stable interface), the internal modules are public too, and test
//! machinery compiles in: fault injection (`runtime::fault`) and the operator harness
//! (`element::Harness`).

pub mod api;
pub mod control;
pub mod inspect;
pub mod job;
pub mod plan;
pub mod testing;
pub mod validate;

/// The error a run ends with, and its classes.
pub mod error {
    pub use crate::base::error::{CheckpointError, ErrorClass, Result, RunError};
    pub use crate::recovery::restart::class_name;
}

pub use checkpoint::savepoint::savepoint_pipeline;

/// The script API reference: every function Weir registers for Rhai scripts and every entry
/// point per operator type, with signature, meaning, errors and an example (the source of
/// `docs/SCRIPT_API.md`, for tools such as editors that show it).
pub mod script_api {
    pub use crate::script::api::{
        ENTRY_POINTS, EntryPoint, HOST_FUNCTIONS, HostFn, render_markdown,
    };
}

/// Declares internal modules: crate-private, and public with the `testkit` feature.
macro_rules! internal {
    ($($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = "testkit")]
            pub mod $name;
            #[cfg(not(feature = "testkit"))]
            pub(crate) mod $name;
        )*
    };
}

internal!(
    base, checkpoint, connectors, element, operators, record, recovery, registry, reload, runtime,
    script, state,
);

#[cfg(test)]
mod layers;
