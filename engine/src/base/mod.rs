//! The ground floor: the vocabulary every layer of the engine shares and that depends on none
//! of them.
//!
//! - [`clock`]: processing time (wall clock, or a manual one in tests and `weir test`).
//! - [`message`]: [`Batch`](message::Batch), [`Pending`](message::Pending),
//!   [`Message`](message::Message), [`Barrier`](message::Barrier) and
//!   [`BarrierKind`](message::BarrierKind), the batch and channel sizes.
//! - [`metrics`]: the per-node counters and their report identity.
//! - [`error`]: the engine's one error type, [`RunError`](error::RunError), with its
//!   [`ErrorClass`](error::ErrorClass) (I/O, data, config, internal) and `Result` alias; the
//!   checkpoint storage and API listen errors it wraps.
//! - [`dispose`]: dropping large values off the hot path (during a reload).
//! - [`human`]: durations, sizes, optional values and errors as the log shows them.
//!
//! This module builds only on `record` (keys) and external crates. It must never import
//! `runtime`, `checkpoint`, `state`, `operators`, `connectors`, `element`, `job` or anything
//! above them: every one of those imports from here (a test in this module checks it).

pub mod clock;
pub mod dispose;
pub mod error;
pub mod human;
pub mod message;
pub mod metrics;
