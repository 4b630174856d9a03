//! Failover strategies: which tasks restart when one task fails, computed from the plan's
//! topology.
//!
//! - `full`: every task of the pipeline, from the latest completed checkpoint.
//! - `region`: the failed task's *region*, from the latest completed checkpoint. Regions are
//!   the connected components of the task graph: tasks joined by any exchange edge. A forward
//!   edge between chains of equal parallelism joins subtask *i* to subtask *i* only; hash,
//!   rebalance and broadcast edges join every upstream subtask to every downstream one. So
//!   disconnected parts of a pipeline, and the independent lanes of an all-forward pipeline,
//!   keep running. (Other pipelines of the file are never in scope.)
//! - `individual`: only the failed task, from its latest state; its in-flight records may be
//!   lost or duplicated.
//! - `noop`: nothing restarts; the pipeline runs degraded.
//!
//! Pure functions over a [`PipelinePlan`]; starting and stopping tasks is the job layer's.

use std::collections::BTreeMap;

use weir_schema::FailoverSpec;

#[cfg(any(test, feature = "testkit"))]
use crate::base::error::ErrorClass;
use crate::checkpoint::TaskId;
use crate::plan::{Partitioning, PipelinePlan};

/// What state the restarted tasks resume from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartFrom {
    /// The latest completed checkpoint (consistent: exactly-once holds).
    LatestCheckpoint,
    /// The task's latest state, with no rewind of its neighbours (approximate: in-flight
    /// records may be lost or duplicated).
    LatestLocalState,
}

/// The outcome of a failover decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailoverAction {
    /// Stop and restart these tasks (sorted), restoring them as `from` says; every other task
    /// keeps running.
    Restart {
        /// The tasks to restart.
        tasks: Vec<TaskId>,
        /// Where their state comes from.
        from: RestartFrom,
    },
    /// Restart nothing: `down` stays down and the pipeline reports itself degraded.
    Degrade {
        /// The failed task.
        down: TaskId,
    },
}

/// A failover request naming a task the plan does not have (a bug in the caller).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pipeline `{pipeline}` has no task {task}")]
pub struct UnknownTask {
    /// The pipeline.
    pub pipeline: String,
    /// The task asked about.
    pub task: TaskId,
}

impl UnknownTask {
    /// Always [`ErrorClass::Internal`].
    #[cfg(any(test, feature = "testkit"))]
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Internal
    }
}

/// Every task of a plan, sorted: one per chain and subtask.
pub fn all_tasks(plan: &PipelinePlan) -> Vec<TaskId> {
    plan.chains
        .iter()
        .enumerate()
        .flat_map(|(c, chain)| (0..chain.parallelism).map(move |s| TaskId::new(c as u32, s)))
        .collect()
}

/// The plan's failover regions: the connected components of its task graph (see the module
/// docs), each sorted, ordered by their first task.
pub fn regions(plan: &PipelinePlan) -> Vec<Vec<TaskId>> {
    let tasks = all_tasks(plan);
    let index: BTreeMap<TaskId, usize> = tasks.iter().enumerate().map(|(i, &t)| (t, i)).collect();
    let mut sets = DisjointSets::new(tasks.len());
    let task_index = |chain: usize, subtask: u32| index.get(&TaskId::new(chain as u32, subtask));

    for edge in &plan.edges {
        let (Some(from), Some(to)) = (plan.chain_of(edge.from), plan.chain_of(edge.to)) else {
            continue;
        };
        if from == to {
            continue; // chained: one task already
        }
        let (Some(up), Some(down)) = (plan.chains.get(from), plan.chains.get(to)) else {
            continue;
        };
        if edge.partitioning == Partitioning::Forward && up.parallelism == down.parallelism {
            for s in 0..up.parallelism {
                if let (Some(&a), Some(&b)) = (task_index(from, s), task_index(to, s)) {
                    sets.union(a, b);
                }
            }
        } else {
            let ups = (0..up.parallelism).filter_map(|s| task_index(from, s));
            let downs = (0..down.parallelism).filter_map(|s| task_index(to, s));
            let mut all = ups.chain(downs).copied();
            if let Some(first) = all.next() {
                for other in all {
                    sets.union(first, other);
                }
            }
        }
    }

    let mut groups: BTreeMap<usize, Vec<TaskId>> = BTreeMap::new();
    for (i, &task) in tasks.iter().enumerate() {
        groups.entry(sets.find(i)).or_default().push(task);
    }
    let mut out: Vec<Vec<TaskId>> = groups.into_values().collect();
    out.sort();
    out
}

/// Decides which tasks restart when `failed` fails, under `strategy`.
///
/// # Errors
/// [`UnknownTask`] when `failed` is not a task of `plan`.
pub fn failover_scope(
    plan: &PipelinePlan,
    strategy: FailoverSpec,
    failed: TaskId,
) -> Result<FailoverAction, UnknownTask> {
    let exists = plan
        .chains
        .get(failed.chain as usize)
        .is_some_and(|c| failed.subtask < c.parallelism);
    if !exists {
        return Err(UnknownTask {
            pipeline: plan.id.clone(),
            task: failed,
        });
    }
    Ok(match strategy {
        FailoverSpec::Full => FailoverAction::Restart {
            tasks: all_tasks(plan),
            from: RestartFrom::LatestCheckpoint,
        },
        FailoverSpec::Region => FailoverAction::Restart {
            tasks: regions(plan)
                .into_iter()
                .find(|r| r.contains(&failed))
                .unwrap_or_else(|| vec![failed]),
            from: RestartFrom::LatestCheckpoint,
        },
        FailoverSpec::Individual => FailoverAction::Restart {
            tasks: vec![failed],
            from: RestartFrom::LatestLocalState,
        },
        FailoverSpec::Noop => FailoverAction::Degrade { down: failed },
    })
}

/// Union-find over `0..n` with path halving.
struct DisjointSets {
    parent: Vec<usize>,
}

impl DisjointSets {
    fn new(n: usize) -> Self {
        Self {
            parent: (0..n).collect(),
        }
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent[ra.max(rb)] = ra.min(rb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn plan(yaml: &str) -> PipelinePlan {
        crate::plan::plan_test_yaml(yaml, Path::new("."))
    }

    fn chain_of(plan: &PipelinePlan, id: &str) -> u32 {
        let node = plan.node_by_id(id).expect("node").index;
        plan.chain_of(node).expect("chained") as u32
    }

    /// Two unconnected flows in one pipeline, each source → map → sink, parallelism 1.
    const TWO_FLOWS: &str = r#"
version: 1
pipelines:
  - id: two
    sources:
      - { id: a, type: generator, count: 10, fields: { v: { kind: int, min: 1, max: 9 } } }
      - { id: b, type: generator, count: 10, fields: { v: { kind: int, min: 1, max: 9 } } }
    operators:
      - { id: ma, type: map, input: a, script: "fn map(r) { r }" }
      - { id: mb, type: map, input: b, script: "fn map(r) { r }" }
    sinks:
      - { id: outa, type: stdout, input: ma }
      - { id: outb, type: stdout, input: mb }
"#;

    /// Parallelism 2, a keyed exchange in the middle: source+map lanes, then hash to a
    /// keyed process and its sink.
    const KEYED: &str = r#"
version: 1
pipelines:
  - id: keyed
    parallelism: 2
    sources:
      - id: gen
        type: generator
        count: 10
        fields:
          user: { kind: key, prefix: u, cardinality: 3 }
    operators:
      - { id: pass, type: map, input: gen, script: "fn map(r) { r }" }
      - { id: by_user, type: key_by, input: pass, field: user }
      - id: count
        type: process
        input: by_user
        state: { n: value }
        script: "fn process(r) { emit(r); }"
    sinks:
      - { id: out, type: stdout, input: count }
"#;

    /// Parallelism 2, forward all the way, but with a fan-out so that the source is a
    /// chain of its own joined to two downstream chains by forward edges.
    const LANES: &str = r#"
version: 1
pipelines:
  - id: lanes
    parallelism: 2
    sources:
      - { id: gen, type: generator, count: 10, fields: { v: { kind: int, min: 1, max: 9 } } }
    operators:
      - { id: left, type: map, input: gen, script: "fn map(r) { r }" }
      - { id: right, type: map, input: gen, script: "fn map(r) { r }" }
    sinks:
      - { id: l_out, type: file, path: out/l, input: left }
      - { id: r_out, type: file, path: out/r, input: right }
"#;

    #[test]
    fn full_restarts_every_task() {
        let p = plan(TWO_FLOWS);
        let failed = TaskId::new(chain_of(&p, "ma"), 0);
        let action = failover_scope(&p, FailoverSpec::Full, failed).expect("scope");
        assert_eq!(
            action,
            FailoverAction::Restart {
                tasks: all_tasks(&p),
                from: RestartFrom::LatestCheckpoint
            }
        );
        assert_eq!(all_tasks(&p).len(), p.chains.len());
    }

    #[test]
    fn region_restarts_only_the_connected_part_of_the_pipeline() {
        let p = plan(TWO_FLOWS);
        assert_eq!(regions(&p).len(), 2);
        let failed = TaskId::new(chain_of(&p, "mb"), 0);
        let FailoverAction::Restart { tasks, from } =
            failover_scope(&p, FailoverSpec::Region, failed).expect("scope")
        else {
            panic!("expected a restart");
        };
        assert_eq!(from, RestartFrom::LatestCheckpoint);
        let chains: Vec<u32> = tasks.iter().map(|t| t.chain).collect();
        assert!(chains.contains(&chain_of(&p, "b")));
        assert!(chains.contains(&chain_of(&p, "outb")));
        assert!(!chains.contains(&chain_of(&p, "a")));
        assert!(!chains.contains(&chain_of(&p, "outa")));
    }

    #[test]
    fn a_keyed_exchange_joins_every_subtask_into_one_region() {
        let p = plan(KEYED);
        let regions = regions(&p);
        assert_eq!(regions.len(), 1, "{regions:?}");
        assert_eq!(regions[0], all_tasks(&p));
        assert!(all_tasks(&p).len() >= 4);
    }

    #[test]
    fn forward_lanes_are_separate_regions() {
        let p = plan(LANES);
        let src = chain_of(&p, "gen");
        let left = chain_of(&p, "left");
        let right = chain_of(&p, "right");
        assert!(src != left && src != right, "fan-out breaks the chain");
        let regions = regions(&p);
        assert_eq!(regions.len(), 2, "{regions:?}");
        let FailoverAction::Restart { tasks, .. } =
            failover_scope(&p, FailoverSpec::Region, TaskId::new(right, 1)).expect("scope")
        else {
            panic!("expected a restart");
        };
        assert!(tasks.iter().all(|t| t.subtask == 1), "{tasks:?}");
        assert!(tasks.contains(&TaskId::new(src, 1)));
        assert!(tasks.contains(&TaskId::new(left, 1)));
    }

    #[test]
    fn individual_restarts_only_the_failed_task_and_noop_nothing() {
        let p = plan(KEYED);
        let failed = TaskId::new(chain_of(&p, "count"), 1);
        assert_eq!(
            failover_scope(&p, FailoverSpec::Individual, failed),
            Ok(FailoverAction::Restart {
                tasks: vec![failed],
                from: RestartFrom::LatestLocalState
            })
        );
        assert_eq!(
            failover_scope(&p, FailoverSpec::Noop, failed),
            Ok(FailoverAction::Degrade { down: failed })
        );
    }

    #[test]
    fn an_unknown_task_is_an_error() {
        let p = plan(TWO_FLOWS);
        let err = failover_scope(&p, FailoverSpec::Full, TaskId::new(99, 0)).expect_err("bad");
        assert_eq!(err.class(), ErrorClass::Internal);
        let chain = chain_of(&p, "a");
        assert!(failover_scope(&p, FailoverSpec::Region, TaskId::new(chain, 5)).is_err());
    }
}
