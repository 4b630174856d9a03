//! Recovery decisions after a failure, as pure functions of the failure's class, its history
//! and the plan: whether and when to restart ([`restart`]) and which tasks restart
//! ([`failover`]).
//!
//! This module owns no task and no timer: the job layer reports each failure with the current
//! time, sleeps for the returned delay itself, and restarts the tasks in the returned scope
//! from the checkpoint `checkpoint::storage::latest_valid` picks. It must not touch the
//! runtime's tasks, channels or state.

pub mod failover;
pub mod restart;

#[cfg(any(test, feature = "testkit"))]
pub use failover::{FailoverAction, RestartFrom, failover_scope, regions};
#[cfg(any(test, feature = "testkit"))]
pub use restart::{Decision, Failure, RestartStrategy};
