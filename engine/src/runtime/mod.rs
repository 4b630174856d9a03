//! The runtime: tasks, input channels and exchanges.
//!
//! A pipeline runs as one tokio task per (chain, subtask), placed on one of the job's worker
//! threads for good ([`workers`]). Records travel in
//! [`Batch`](crate::base::message::Batch)es on bounded channels; data and control share one
//! channel ([`Message`](crate::base::message::Message)), so barriers, watermarks and
//! end-of-stream stay in order with the records. A full channel suspends the sender, which is
//! how a slow sink backpressures the sources. Forward-connected operators of equal parallelism
//! run chained in one task and pass batches by value, with no channel.
//!
//! This module owns the task loop and the exchanges. It never interprets records (operators
//! do), never reads YAML (the plan and `registry` did) and never lays out checkpoint files
//! (`state::snapshot_files` does); the vocabulary it speaks lives in `base`.

pub mod exchange;
pub mod fault;
pub mod input;
pub mod tap;
pub mod task;
pub mod watermark;
pub mod workers;
