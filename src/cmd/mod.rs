//! One module per `weir` subcommand.

pub mod graph;
pub mod run;
pub mod schema;
pub mod validate;
