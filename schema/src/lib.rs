//! `weir-schema`: the YAML data model of a Weir pipeline file and everything needed to read it
//! well: loading with source spans, JSON Schema generation and checking, semantic validation
//! that collects every problem in one pass, and miette diagnostics that point into the YAML.
//!
//! This crate must not know about the runtime (tasks, channels, state backends); the engine
//! depends on it, never the other way round. Script compilation is the engine's business: it
//! reports through the same [`Diagnostic`] type.

pub mod diagnostic;
pub mod interpolate;
pub mod load;
pub mod model;
pub mod registry;
pub mod schema;
pub mod span;
pub mod test_file;
pub mod units;
pub mod validate;
pub mod yaml;

pub use diagnostic::{Diagnostic, Diagnostics, Severity};
pub use interpolate::Secrets;
pub use load::{LoadedFile, ReadError, load_bytes, load_file, load_str, read_text};
pub use model::*;
pub use span::{PathSeg, PathSuffix, SourceFile, SpanIndex, YamlPath};
