//! The scenario tests' kit, one module per concern: [`binary`] (the `weir` binary and its
//! environments), [`run`] (the running harness: a background `weir run` with its API and
//! log, runs to the end, runs killed at a log line), [`running`] (a typed view of a run for
//! reload scenarios), [`output`] (committed sink output, canonical lines, exactly-once
//! comparison), [`files`] (copying pipelines, saving like an editor, growing inputs),
//! [`in_process`] (plans, file sinks and failures of runs in this process; the reference
//! pipelines and their golden output), [`kill`] (SIGKILL loops over `weir run` and their
//! exactly-once check), [`control`] (a recording fake
//! `JobControl` behind the real API server), [`memory`] (peak RSS from `/proc`),
//! [`browser`] (headless Chromium through chromedriver, for the web page), [`services`]
//! (real Kafka-API, PostgreSQL and S3-compatible servers, started by `scripts/services/`),
//! [`kafka`] (topics, producing and reading back, a private broker that can go down) and
//! [`pg`] (databases, `psql`, a run stopped once its table is complete).
//!
//! Each test binary compiles the whole kit and uses part of it, hence `dead_code`.
#![allow(clippy::unwrap_used, dead_code)]

pub mod binary;
pub mod browser;
pub mod control;
pub mod files;
pub mod in_process;
pub mod kafka;
#[cfg(unix)]
pub mod kill;
pub mod memory;
pub mod output;
#[cfg(unix)]
pub mod pg;
pub mod run;
pub mod running;
pub mod services;
