//! Operators: the built-in and Rhai-backed operators, one file each, all implementing
//! [`crate::element::Operator`]. Operators never see channels, barriers or other tasks: the
//! runtime hands them batches and collects what they leave behind. They never import
//! `connectors` (the `registry` above both builds them from the plan).

pub mod aggregate;
pub mod filter;
pub mod flat_map;
pub mod key_by;
pub mod map;
pub mod process;
pub mod reduce;
pub mod union;
pub mod window;
