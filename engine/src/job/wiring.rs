//! How a pipeline's tasks are connected: which input index of which task every
//! (edge, upstream subtask, downstream subtask) uses, and the channels themselves. Channels
//! belong to the pipeline, not to tasks: the supervisor keeps every sender and every input
//! set, so a task that dies does not close its neighbours' channels, a task restarted alone
//! (failover `individual`) reads the same channels, and a restarted region gets fresh ones.
//! With unaligned checkpoints every channel also has a priority lane for barriers.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use weir_schema::CheckpointMode;

use crate::base::message::CHANNEL_CAPACITY;
use crate::checkpoint::TaskId;
use crate::plan::{NodeKind, Partitioning, PipelinePlan};
use crate::runtime::exchange::Target;
use crate::runtime::input::{InputSet, InputSlot};

/// One edge leaving one upstream subtask.
#[derive(Clone, Debug)]
pub struct Route {
    /// The partitioning actually used (forward between different parallelisms becomes
    /// rebalance).
    pub partitioning: Partitioning,
    /// Downstream `(task, input index)`, in downstream subtask order.
    pub targets: Vec<(TaskId, u32)>,
}

/// The static shape of a pipeline's task graph.
#[derive(Debug, Default)]
pub struct Topology {
    /// `(edge index, upstream subtask)` → its route.
    pub routes: HashMap<(usize, u32), Route>,
    /// Number of inputs of every non-source task.
    pub inputs: HashMap<TaskId, u32>,
    /// Tasks whose chain starts with a source.
    pub sources: BTreeSet<TaskId>,
    /// Unaligned checkpoints: every channel gets a priority lane for barriers.
    pub unaligned: bool,
}

impl Topology {
    /// Numbers every channel of the plan.
    pub fn of(plan: &PipelinePlan) -> Self {
        let ck = &plan.spec.checkpoints;
        let mut t = Topology {
            unaligned: ck.enabled && ck.unaligned && ck.mode == CheckpointMode::ExactlyOnce,
            ..Topology::default()
        };
        for (ci, chain) in plan.chains.iter().enumerate() {
            let is_source = chain
                .nodes
                .first()
                .is_some_and(|n| matches!(plan.nodes[n.0].kind, NodeKind::Source(_)));
            for s in 0..chain.parallelism {
                let id = TaskId::new(ci as u32, s);
                if is_source {
                    t.sources.insert(id);
                } else {
                    t.inputs.insert(id, 0);
                }
            }
        }
        for chain in &plan.chains {
            let p = chain.parallelism;
            for s in 0..p {
                for (pos, &nid) in chain.nodes.iter().enumerate() {
                    let next_in_chain = chain.nodes.get(pos + 1).copied();
                    for (ei, edge) in plan.edges.iter().enumerate() {
                        if edge.from != nid || (Some(edge.to) == next_in_chain && !edge.dead_letter)
                        {
                            continue;
                        }
                        let Some(tc) = plan.chain_of(edge.to) else {
                            continue;
                        };
                        let tp = plan.chains[tc].parallelism;
                        let partitioning = match edge.partitioning {
                            Partitioning::Forward if tp != p => Partitioning::Rebalance,
                            other => other,
                        };
                        let subtasks: Vec<u32> = if partitioning == Partitioning::Forward {
                            vec![s]
                        } else {
                            (0..tp).collect()
                        };
                        let mut targets = Vec::new();
                        for ts in subtasks {
                            let to = TaskId::new(tc as u32, ts);
                            let n = t.inputs.entry(to).or_insert(0);
                            targets.push((to, *n));
                            *n += 1;
                        }
                        t.routes.insert(
                            (ei, s),
                            Route {
                                partitioning,
                                targets,
                            },
                        );
                    }
                }
            }
        }
        t
    }
}

/// The channels of a pipeline: every input's sender, and every task's input set.
#[derive(Debug, Default)]
pub struct Channels {
    senders: HashMap<TaskId, Vec<Target>>,
    slots: HashMap<TaskId, InputSlot>,
}

impl Channels {
    /// Fresh channels into every task of `tasks` (dropping the old ones).
    pub fn renew(&mut self, topology: &Topology, tasks: &BTreeSet<TaskId>) {
        for task in tasks {
            let Some(&n) = topology.inputs.get(task) else {
                continue;
            };
            let (mut tx, mut rx, mut lanes) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..n {
                let (t, r) = mpsc::channel(CHANNEL_CAPACITY);
                let mut target = Target::new(t);
                if topology.unaligned {
                    // Unbounded, but it holds at most one barrier per checkpoint in flight.
                    let (p, l) = mpsc::unbounded_channel();
                    target.priority = Some(p);
                    lanes.push(l);
                }
                tx.push(target);
                rx.push(r);
            }
            self.senders.insert(*task, tx);
            let inputs = InputSet::new(rx).with_priority(lanes);
            self.slots.insert(*task, Arc::new(Mutex::new(Some(inputs))));
        }
    }

    /// The sender of input `input` of `task` (with its priority lane, if any).
    pub fn sender(&self, task: TaskId, input: u32) -> Option<Target> {
        self.senders.get(&task)?.get(input as usize).cloned()
    }

    /// The input slot of `task`.
    pub fn slot(&self, task: TaskId) -> Option<InputSlot> {
        self.slots.get(&task).cloned()
    }
}
