//! Hot reload, the two self-contained halves: noticing that the pipeline file (or a script file
//! it references) changed, and deciding what a new version of the file means for the running
//! one.
//!
//! - `watch` owns the [`FileWatcher`]: it watches the directories holding the files (never the
//!   files themselves), follows symlinks, and reports a debounced [`Changed`] only when a
//!   file's content really changed.
//! - `plan` owns [`diff`]: a pure comparison of two compiled [`FilePlan`](crate::plan::FilePlan)s
//!   into one [`PipelineDiff`] per pipeline (a typed [`Change`], with the reasons a plan cannot
//!   be applied), turned into the wire form
//!   ([`PipelineReloadPlan`](crate::control::PipelineReloadPlan)) only for the API.
//!
//! Neither half validates files, takes savepoints or restarts pipelines: the job drives a
//! reload (validate, diff, savepoint, stop, start the new version, roll back on failure) and
//! uses these two as building blocks.

pub mod plan;
pub mod watch;

#[cfg(any(test, feature = "testkit"))]
pub use plan::{Change, PipelineDiff, diff, is_applicable};
#[cfg(any(test, feature = "testkit"))]
pub use watch::{Changed, FileWatcher, WatchError, referenced_files};
