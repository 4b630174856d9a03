//! One module per `weir` subcommand; `api_args` holds what the verbs that call a running
//! `weir run` share.

pub mod api_args;
pub mod checkpoints;
pub mod graph;
pub mod inspect;
pub mod lsp;
pub mod reload;
pub mod run;
pub mod savepoint;
pub mod schema;
pub mod status;
pub mod stop;
pub mod tap;
pub mod test;
pub mod top;
pub mod validate;
