//! A pipeline's tasks: building one task's chain of operators (with its state backend,
//! handed-over state, outputs and faults) and spawning it on the worker runtime, the drainer
//! that stands in for a task left down by a `noop` failover, and the bookkeeping of which
//! attempt of which task runs, finished, or is being aborted. What to restore from and when
//! to spawn are decided elsewhere (`restore`, `failure`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::mpsc::{self, UnboundedSender};
use tokio::task::{AbortHandle, JoinError, JoinSet};
use weir_schema::StateSpec;

use crate::base::clock::Clock;
use crate::base::error::{Result, RunError};
use crate::base::message::{Barrier, Message, WATERMARK_MIN, Watermark};
use crate::base::metrics::NodeReport;
use crate::checkpoint::TaskId;
use crate::connectors::SourceContext;
use crate::element::{ErrorPolicy, Operator, OperatorContext};
use crate::operators::union::UnionOperator;
use crate::plan::{NodeId, NodeKind, PipelinePlan};
use crate::record::KeyGroupRange;
use crate::registry::NodeBuilder;
use crate::runtime::exchange::Output;
use crate::runtime::fault::Fault;
use crate::runtime::input::{InputLease, Received};
use crate::runtime::tap::TapRegistry;
use crate::runtime::task::{
    ChainNode, ChainTask, Checkpointing, Control, HandoverSlot, TaskCommand, TaskEnv, TaskEvent,
    TaskRestore, run_chain, run_source,
};
use crate::state::handover::{Handover, HandoverKey};
use crate::state::{MemoryBackend, StateBackend};

use super::super::wiring::{Channels, Topology};

/// One running attempt of a task.
pub(super) struct Running {
    abort: AbortHandle,
    commands: UnboundedSender<TaskCommand>,
    attempt: u64,
}

/// The tasks of one pipeline and what they are built from.
pub(super) struct Tasks {
    plan: Arc<PipelinePlan>,
    builders: Arc<Vec<NodeBuilder>>,
    pub topology: Topology,
    pub channels: Channels,
    reports: Arc<Vec<NodeReport>>,
    control: Arc<Control>,
    /// The runtime tasks run on (the supervisor itself runs on the control thread).
    workers: crate::runtime::workers::Workers,
    /// Faults to inject, by operator id.
    faults: HashMap<String, Arc<Fault>>,
    /// The job's hand-over of keyed state between versions, and this pipeline's
    /// state-backend configuration as it compares.
    pub handover: Option<Arc<Handover>>,
    backend: Arc<StateSpec>,
    /// The pipeline's taps, shared with its other generations (the job holds them).
    pub taps: Arc<TapRegistry>,
    /// Processing time for every operator (a manual clock under `weir test`).
    pub clock: Clock,
    /// Where tasks send their events.
    events: UnboundedSender<TaskEvent>,
    /// Checkpoint storage and alignment, when the pipeline takes checkpoints.
    checkpointing: Option<Checkpointing>,
    /// Every task of the pipeline.
    pub all: BTreeSet<TaskId>,
    running: HashMap<TaskId, Running>,
    attempts: HashMap<tokio::task::Id, (TaskId, u64)>,
    join: JoinSet<Result<()>>,
    next_attempt: u64,
    /// Tasks that ended by themselves.
    pub finished: BTreeSet<TaskId>,
    /// Tasks left down by a `noop` failover.
    pub degraded: BTreeSet<TaskId>,
    /// The tasks were told to stop ([`Tasks::stop_all`]): a task that ends from now on was
    /// stopped, not finished. Its state lives in the last completed checkpoint, so it must
    /// not be recorded as finished (stateless) in a later one.
    pub stopped: bool,
    /// Tasks aborted for a restart whose end has not been observed yet.
    aborting: BTreeSet<tokio::task::Id>,
}

/// What the supervisor learns from a task's end.
pub(super) enum Joined {
    /// The current attempt of `task` ended with `result`.
    Task(TaskId, Result<()>),
    /// Something else ended (an aborted or superseded attempt, a drainer).
    Other,
}

impl Tasks {
    /// The tasks of `plan`, none spawned yet.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        plan: Arc<PipelinePlan>,
        builders: Vec<NodeBuilder>,
        reports: Arc<Vec<NodeReport>>,
        control: Arc<Control>,
        workers: crate::runtime::workers::Workers,
        faults: Vec<(String, Arc<Fault>)>,
        events: UnboundedSender<TaskEvent>,
        checkpointing: Option<Checkpointing>,
    ) -> Self {
        Self {
            topology: Topology::of(&plan),
            all: crate::recovery::failover::all_tasks(&plan)
                .into_iter()
                .collect(),
            backend: Arc::new(plan.spec.state.clone()),
            plan,
            builders: Arc::new(builders),
            channels: Channels::default(),
            reports,
            control,
            workers,
            faults: faults.into_iter().collect(),
            handover: None,
            taps: Arc::default(),
            clock: Clock::System,
            events,
            checkpointing,
            running: HashMap::new(),
            attempts: HashMap::new(),
            join: JoinSet::new(),
            next_attempt: 0,
            finished: BTreeSet::new(),
            degraded: BTreeSet::new(),
            stopped: false,
            aborting: BTreeSet::new(),
        }
    }

    /// Whether no attempt runs.
    pub(super) fn none_running(&self) -> bool {
        self.running.is_empty()
    }

    /// Whether every task finished or stays down.
    pub(super) fn all_done(&self) -> bool {
        self.all
            .iter()
            .all(|t| self.finished.contains(t) || self.degraded.contains(t))
    }

    /// Whether tasks aborted for a restart have not ended yet.
    pub(super) fn aborting(&self) -> bool {
        !self.aborting.is_empty()
    }

    /// Sends `command` to every running task.
    pub(super) fn send_all(&self, command: TaskCommand) {
        for r in self.running.values() {
            let _ = r.commands.send(command);
        }
    }

    /// Tells every running task to stop (see [`Tasks::stopped`]).
    pub(super) fn stop_all(&mut self) {
        self.stopped = true;
        self.send_all(TaskCommand::Stop);
    }

    /// Sends `command` to every running source task.
    pub(super) fn send_sources(&self, command: TaskCommand) {
        for (task, r) in &self.running {
            if self.topology.sources.contains(task) {
                let _ = r.commands.send(command);
            }
        }
    }

    /// Sends `barrier` to every running source task.
    pub(super) fn inject(&self, barrier: Barrier) {
        self.send_sources(TaskCommand::Trigger(barrier));
    }

    /// Aborts every running task (their ends are not waited for).
    pub(super) fn abort_all(&mut self) {
        for (_, r) in self.running.drain() {
            r.abort.abort();
        }
    }

    /// Aborts the running attempts of `scope` for a restart (their ends are awaited before
    /// the restart) and forgets that they finished.
    pub(super) fn abort_for_restart(&mut self, scope: &BTreeSet<TaskId>) {
        for t in scope {
            if let Some(r) = self.running.remove(t) {
                r.abort.abort();
                self.aborting.insert(r.abort.id());
            }
            self.finished.remove(t);
        }
    }

    /// The next task that ends; pending forever while none runs.
    pub(super) async fn join_next(&mut self) -> Joined {
        let Some(joined) = self.join.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, result) = match joined {
            Ok((id, r)) => (id, r),
            Err(e) if e.is_cancelled() => {
                self.attempts.remove(&e.id());
                self.aborting.remove(&e.id());
                return Joined::Other;
            }
            Err(e) => {
                let id = e.id();
                let message = format!("task panicked: {}", panic_message(e));
                (id, Err(RunError::Internal(message)))
            }
        };
        self.aborting.remove(&id);
        let Some((task, attempt)) = self.attempts.remove(&id) else {
            return Joined::Other;
        };
        if self.running.get(&task).is_none_or(|r| r.attempt != attempt) {
            return Joined::Other;
        }
        self.running.remove(&task);
        Joined::Task(task, result)
    }

    /// Whether a task may end (the join set is not empty).
    pub(super) fn any_spawned(&self) -> bool {
        !self.join.is_empty()
    }

    /// `task`'s name for logs and status: the chain's head and the subtask.
    pub(super) fn task_name(&self, task: TaskId) -> String {
        let head = self
            .plan
            .chains
            .get(task.chain as usize)
            .and_then(|c| c.nodes.first())
            .map(|n| self.plan.nodes[n.0].id.clone())
            .unwrap_or_default();
        format!("{head}[{}]", task.subtask)
    }

    /// Keeps a `noop`-failed task's inputs flowing: records are dropped, barriers and the end
    /// of the stream are passed on so that downstream alignment and termination go on. It
    /// says it is idle first: it sends no record, so its watermark must not hold downstream
    /// back (the watermarks it reads are dropped with the records).
    pub(super) fn spawn_drainer(&mut self, task: TaskId) {
        let Some(slot) = self.channels.slot(task) else {
            return;
        };
        let Ok(mut outputs) = self.outputs_of_task(task) else {
            return;
        };
        self.workers.spawn(&mut self.join, async move {
            let Some(mut lease) = InputLease::take(&slot) else {
                return Ok(());
            };
            for o in &mut outputs {
                o.watermark(Watermark::Idle).await?;
            }
            let mut last = 0;
            while !lease.get().all_ended() {
                match lease.get().recv(|_| false).await {
                    Received::Message(_, Message::Barrier(b)) if b.checkpoint > last => {
                        last = b.checkpoint;
                        for o in &mut outputs {
                            o.barrier(b).await?;
                        }
                    }
                    _ => {}
                }
            }
            for o in &mut outputs {
                o.end().await?;
            }
            Ok(())
        });
    }

    /// Every output of every node of `task`'s chain (the drainer's view).
    fn outputs_of_task(&self, task: TaskId) -> Result<Vec<Output>> {
        let chain = &self.plan.chains[task.chain as usize];
        let mut outs = Vec::new();
        for (pos, &nid) in chain.nodes.iter().enumerate() {
            let (o, d, _) = self.node_outputs(task, pos, nid)?;
            outs.extend(o);
            outs.extend(d);
        }
        Ok(outs)
    }

    /// The outputs (data, side outputs) of node `nid`, at `pos` in `task`'s chain: every edge
    /// that leaves the chain. Side outputs list dead letters first, then late records; the
    /// third value is where the late ones start.
    fn node_outputs(
        &self,
        task: TaskId,
        pos: usize,
        nid: NodeId,
    ) -> Result<(Vec<Output>, Vec<Output>, usize)> {
        let plan = &*self.plan;
        let chain = &plan.chains[task.chain as usize];
        let next_in_chain = chain.nodes.get(pos + 1).copied();
        let pipeline: Arc<str> = plan.id.as_str().into();
        let node = &plan.nodes[nid.0];
        let (mut outputs, mut dead, mut late) = (Vec::new(), Vec::new(), Vec::new());
        for (ei, edge) in plan.edges.iter().enumerate() {
            if edge.from != nid || (Some(edge.to) == next_in_chain && !edge.dead_letter) {
                continue;
            }
            let route = self
                .topology
                .routes
                .get(&(ei, task.subtask))
                .ok_or_else(|| RunError::Internal(format!("no route for edge {ei} from {task}")))?;
            let mut targets = Vec::new();
            for &(to, input) in &route.targets {
                let target = self.channels.sender(to, input).ok_or_else(|| {
                    RunError::Internal(format!("no channel into {to} input {input}"))
                })?;
                targets.push(target);
            }
            let out = Output::new(
                route.partitioning,
                targets,
                plan.max_parallelism,
                Arc::clone(&pipeline),
                node.id.as_str().into(),
            );
            if edge.late {
                late.push(out);
            } else if edge.dead_letter {
                dead.push(out);
            } else {
                outputs.push(out);
            }
        }
        let late_from = dead.len();
        dead.append(&mut late);
        Ok((outputs, dead, late_from))
    }

    /// Opens a fresh state backend for `operator`'s `subtask` over `range`.
    fn open_state(
        &self,
        operator: &str,
        subtask: u32,
        range: KeyGroupRange,
    ) -> Result<Box<dyn StateBackend>> {
        let plan = &*self.plan;
        match &plan.spec.state {
            StateSpec::Memory | StateSpec::Fs => {
                Ok(Box::new(MemoryBackend::new(plan.max_parallelism, range)))
            }
            StateSpec::Rocksdb(spec) => {
                let dir = plan
                    .paths
                    .rocksdb
                    .as_ref()
                    .ok_or_else(|| RunError::Internal("no RocksDB directory planned".into()))?
                    .join(format!("{operator}-{subtask}"));
                Ok(Box::new(crate::state::rocksdb::RocksdbBackend::open(
                    &dir,
                    plan.max_parallelism,
                    range,
                    spec,
                )?))
            }
        }
    }

    /// The keyed state of node `nid` for `task`, restored from `restore`: the previous
    /// version's state handed over in memory when it fits (a reload), else a fresh backend
    /// the task restores into. The flag says whether it was handed over.
    fn keyed_state(
        &self,
        task: TaskId,
        nid: NodeId,
        key_groups: KeyGroupRange,
        restore: Option<&TaskRestore>,
    ) -> Result<(Box<dyn StateBackend>, bool)> {
        let node = &self.plan.nodes[nid.0];
        // A reload's new version takes the old version's state as it was at the savepoint
        // when it fits, instead of decoding the savepoint's files. Not when the restore must
        // leave some of its named states out or retype them: the old version's backend holds
        // them all, as they were.
        let handed = restore
            .filter(|r| r.savepoint)
            .filter(|r| {
                r.plan
                    .as_ref()
                    .and_then(|p| p.node(&node.id))
                    .is_none_or(|d| !d.filters_keyed_state())
            })
            .zip(self.handover.as_ref())
            .and_then(|(r, h)| {
                let key = HandoverKey {
                    pipeline: self.plan.id.as_str().into(),
                    operator: node.id.as_str().into(),
                    subtask: task.subtask,
                    checkpoint: r.metadata.checkpoint,
                };
                h.take(&key, key_groups, &self.backend)
            });
        match handed {
            Some(state) => Ok((state, true)),
            None => Ok((self.open_state(&node.id, task.subtask, key_groups)?, false)),
        }
    }

    /// Builds the chain of `task`: one node per operator with its context, state and
    /// outputs. Also says, per node, whether its state was handed over.
    fn build_chain(
        &self,
        task: TaskId,
        restore: Option<&TaskRestore>,
    ) -> Result<(ChainTask, Vec<bool>)> {
        let plan = &*self.plan;
        let chain = &plan.chains[task.chain as usize];
        let (s, p) = (task.subtask, chain.parallelism);
        let pipeline: Arc<str> = plan.id.as_str().into();
        let restored_finished = restore.is_some_and(|r| r.metadata.finished_tasks.contains(&task));
        let restored_from = restore.map(|r| r.metadata.checkpoint);
        let mut nodes = Vec::with_capacity(chain.nodes.len());
        let mut received = Vec::with_capacity(chain.nodes.len());
        for (pos, &nid) in chain.nodes.iter().enumerate() {
            let node = &plan.nodes[nid.0];
            let (operator, keyed, counts_output): (Box<dyn Operator>, bool, bool) =
                match &self.builders[nid.0] {
                    NodeBuilder::Source(_) => (Box::new(UnionOperator), false, true),
                    NodeBuilder::Operator { factory, keyed } => (factory(s, p)?, *keyed, true),
                    NodeBuilder::Sink(factory) => (factory(s, p)?, false, false),
                };
            let on_error = match &node.kind {
                NodeKind::Operator(o) => ErrorPolicy::from(o.on_error()),
                _ => ErrorPolicy::Fail,
            };
            let key_groups = KeyGroupRange::for_subtask(plan.max_parallelism, p, s);
            let state = if keyed && !restored_finished {
                let (state, handed) = self.keyed_state(task, nid, key_groups, restore)?;
                received.push(handed);
                Some(state)
            } else {
                received.push(false);
                None
            };
            let ctx = OperatorContext {
                pipeline: Arc::clone(&pipeline),
                operator: node.id.as_str().into(),
                subtask: s,
                parallelism: p,
                max_parallelism: plan.max_parallelism,
                key_groups,
                on_error,
                dead_letters: Vec::new(),
                errors: 0,
                late: Vec::new(),
                late_dropped: 0,
                state,
                restored_from,
                migrate: restore
                    .and_then(|r| r.plan.as_ref())
                    .and_then(|p| p.node(&node.id))
                    .is_some_and(|d| d.migrate),
                watermark: WATERMARK_MIN,
                clock: self.clock.clone(),
            };
            let (outputs, dead_letters, late_from) = self.node_outputs(task, pos, nid)?;
            nodes.push(ChainNode {
                operator,
                ctx,
                metrics: self.reports[nid.0].metrics.subtask(s),
                outputs,
                dead_letters,
                late_from,
                counts_output,
                fault: self.faults.get(&node.id).cloned(),
            });
        }
        Ok((
            ChainTask {
                nodes,
                taps: Arc::clone(&self.taps),
                tap_cursors: Vec::new(),
            },
            received,
        ))
    }

    /// Builds and spawns one task, restoring from `restore` when given.
    pub(super) fn spawn(&mut self, task: TaskId, restore: Option<TaskRestore>) -> Result<()> {
        let plan = Arc::clone(&self.plan);
        let chain = &plan.chains[task.chain as usize];
        let (s, p) = (task.subtask, chain.parallelism);
        let pipeline: Arc<str> = plan.id.as_str().into();
        let restored_finished = restore
            .as_ref()
            .is_some_and(|r| r.metadata.finished_tasks.contains(&task));
        let restored_from = restore.as_ref().map(|r| r.metadata.checkpoint);
        let (mut chain_task, received) = self.build_chain(task, restore.as_ref())?;
        let head = &plan.nodes[chain.nodes[0].0];
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let mut env = TaskEnv::new(
            task,
            Arc::clone(&pipeline),
            head.id.as_str().into(),
            cmd_rx,
            self.events.clone(),
            self.checkpointing.clone(),
            restore,
            Arc::clone(&self.control),
        );
        if received.iter().any(|&r| r) {
            tracing::debug!(pipeline = %plan.id, %task, "Keyed state handed over from the previous version.");
        }
        env.handover = self
            .handover
            .as_ref()
            .map(|h| HandoverSlot::new(Arc::clone(h), Arc::clone(&self.backend), received));
        let handle = if restored_finished {
            // Finished before the checkpoint: everything it produced is in downstream state,
            // and its upstream is finished too. It only ends its outputs.
            self.workers.spawn(
                &mut self.join,
                async move { chain_task.end_outputs().await },
            )
        } else {
            match &self.builders[head.index.0] {
                NodeBuilder::Source(factory) => {
                    let source = factory(s, p)?;
                    let mut sctx = SourceContext::new(&plan.id, &head.id, s, p, restored_from);
                    sctx.clock = self.clock.clone();
                    self.workers.spawn(&mut self.join, async move {
                        run_source(source, sctx, chain_task, env).await
                    })
                }
                _ => {
                    let slot = self
                        .channels
                        .slot(task)
                        .ok_or_else(|| RunError::Internal(format!("{task} has no inputs")))?;
                    let element = head.id.clone();
                    let pipeline_id = plan.id.clone();
                    self.workers.spawn(&mut self.join, async move {
                        let Some(lease) = InputLease::take(&slot) else {
                            return Err(RunError::Internal(format!(
                                "pipeline `{pipeline_id}`, `{element}`: inputs still held by a previous attempt"
                            )));
                        };
                        run_chain(lease, chain_task, env).await
                    })
                }
            }
        };
        self.next_attempt += 1;
        let attempt = self.next_attempt;
        self.attempts.insert(handle.id(), (task, attempt));
        self.running.insert(
            task,
            Running {
                abort: handle,
                commands: cmd_tx,
                attempt,
            },
        );
        Ok(())
    }
}

fn panic_message(e: JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into()),
        Err(e) => e.to_string(),
    }
}
