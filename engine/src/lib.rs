//! `weir-engine`: turns a validated pipeline spec into an operator graph and runs it.
//!
//! Module map (one concern each): `validate` runs every check on a file (schema, semantic
//! rules, Rhai scripts) and returns all diagnostics; `script` owns the Rhai engine and its
//! sandbox; `plan` compiles specs into logical and physical graphs and renders them. The
//! runtime modules build on `plan` and never re-read YAML.

pub mod plan;
pub mod script;
pub mod validate;
pub mod connectors;
pub mod job;
pub mod operators;
pub mod record;
pub mod runtime;
pub mod state;
