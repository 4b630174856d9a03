//! What keyed state each node of a plan declares, by name and kind: the fact a restore
//! compares against a checkpoint's metadata, and the names the operators register. It lives
//! in the plan so that the checkpoint layer can read it without importing the operators.

use std::collections::BTreeMap;

use weir_schema::{OperatorSpec, StateKind};

/// The name of the accumulator state of `reduce` (and `aggregate`), as `migrate(name, old)`
/// sees it.
pub const ACC: &str = "acc";

/// The name of the map state of a `window`: a key's open windows (field = start).
pub const WINDOWS: &str = "windows";

/// The named keyed states an operator declares: `acc: value` for the keyed `reduce` and
/// `aggregate`, the `state:` map of a `process`, the open windows and timers of a `window`.
/// A process's internal states (timers, TTL expiry) are not declared: they follow the
/// operator's restore (see `state::snapshot_files`).
pub fn keyed_state_of(op: &OperatorSpec) -> BTreeMap<String, StateKind> {
    match op {
        OperatorSpec::Reduce(_) | OperatorSpec::Aggregate(_) => {
            BTreeMap::from([(ACC.to_owned(), StateKind::Value)])
        }
        OperatorSpec::Window(_) => {
            use crate::state::timers::{TimeDomain, state_name};
            BTreeMap::from([
                (WINDOWS.to_owned(), StateKind::Map),
                (state_name(TimeDomain::Event).to_owned(), StateKind::Map),
                (
                    state_name(TimeDomain::Processing).to_owned(),
                    StateKind::Map,
                ),
            ])
        }
        OperatorSpec::Process(p) => p.state.iter().map(|(n, d)| (n.clone(), d.kind())).collect(),
        _ => BTreeMap::new(),
    }
}
