//! The restore plan: what a restore does to each node's state, decided in one place for
//! `weir reload --plan`, the live reload (`weir reload`, `weir run --watch`),
//! `--from-savepoint`, `--from-checkpoint` and the resume of a killed run, so that what the
//! plan shows and what the restore does cannot disagree.
//!
//! Pure decisions over two [`PipelineShape`]s: the restored side (read from a checkpoint's or
//! savepoint's metadata with [`PipelineShape::of_metadata`], or, when a reload is only being
//! planned, derived from the running plan with [`PipelineShape::of_plan`]: exactly what its
//! savepoint will record) and the new side (always [`PipelineShape::of_plan`]). No I/O.
//!
//! The rules (Flink's savepoint compatibility, per named state):
//! - state maps by node `id`; a node of another section or `type:` under the same id cannot
//!   take the old state over ([`Problem::TypeChanged`]);
//! - keyed state maps by state name: a name the new version still declares with the same
//!   kind is kept (or migrated, see below); a name it no longer declares (a removed or
//!   renamed state) is dropped, which needs `--allow-non-restored-state`
//!   ([`Problem::StateGone`]); a name it declares for the first time starts empty. A renamed
//!   state is therefore "dropped + new": its values are not carried over, and they never come
//!   back under the old name later (the restore removes them);
//! - a state whose kind changed (`cnt: value` → `cnt: list`) is incompatible
//!   ([`Problem::KindChanged`]) unless the new script defines `fn migrate(old)` or
//!   `fn migrate(name, old)`: its values are then restored under the new kind and every one
//!   goes through `migrate`, which must return a value of the new kind;
//! - `migrate` runs when the script changed since the snapshot (the metadata records a hash
//!   of each script) or a state's kind changed, and never otherwise;
//! - a node the new version does not have loses its state: needs the switch
//!   ([`Problem::NodeGone`]);
//! - `max_parallelism` cannot change ([`Problem::MaxParallelism`]); a generator source cannot
//!   change its parallelism ([`Problem::CannotRescale`]);
//! - a change of state backend is shown; a savepoint (canonical format) restores into any
//!   backend, a periodic RocksDB checkpoint (native format) only into `rocksdb`
//!   ([`Problem::NativeFormat`]), and it cannot drop or retype single states
//!   ([`Problem::NativeStateChange`]);
//! - a checkpoint (not a savepoint) restores only into the pipeline that took it.
//!
//! Metadata written before the state declarations were recorded is read conservatively:
//! the node's type and its state names and kinds are not compared (the plan says so), and
//! the restore itself refuses a state the node no longer declares unless the switch is given.

use std::collections::BTreeMap;
use std::fmt;

use weir_schema::{OperatorSpec, SinkSpec, SourceSpec, StateKind};

use super::metadata::{
    BackendKind, CheckpointMetadata, NodeType, OperatorInfo, Section, is_keyed_file, is_local_file,
};
pub use crate::plan::declared::keyed_state_of;
use crate::plan::{NodeKind, PipelinePlan, PlanNode};

/// What is restored: the rules differ only in what may change (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreKind {
    /// A savepoint (or a reload's, which is one): canonical format, any backend, may be
    /// restored by another pipeline id.
    Savepoint,
    /// A checkpoint: the backend's own format, only the pipeline that took it.
    Checkpoint,
}

/// What a restore needs to know about one pipeline version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineShape {
    /// The pipeline's id.
    pub pipeline: String,
    /// Its number of key groups.
    pub max_parallelism: u32,
    /// `max_parallelism` is derived from the parallelism (not set in the YAML): only known
    /// for a plan, used in the help of [`Problem::MaxParallelism`].
    pub max_parallelism_derived: bool,
    /// Its state backend (`None`: not recorded).
    pub backend: Option<BackendKind>,
    /// Its keyed state is in RocksDB's native format (a periodic checkpoint of the rocksdb
    /// backend): only `rocksdb` reads it back, whole.
    pub native_keyed: bool,
    /// Every node, in declaration order (sources, operators, sinks) for a plan, in recorded
    /// order for metadata.
    pub nodes: Vec<NodeShape>,
}

/// What a restore needs to know about one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeShape {
    /// Its id.
    pub id: String,
    /// Its section and type (`None`: not recorded).
    pub node: Option<NodeType>,
    /// Its parallelism.
    pub parallelism: u32,
    /// Hash of its script, if it has one.
    pub script_hash: Option<String>,
    /// Declared keyed states (`None`: not recorded).
    pub keyed: Option<BTreeMap<String, StateKind>>,
    /// Keeps operator-local state: positions, pending parts (`None`: not recorded).
    pub local: Option<bool>,
    /// Metadata only: some subtask of it has an operator-local snapshot file (`.op`): what
    /// tells that it held local state when the declarations were not recorded.
    pub local_files: bool,
    /// Metadata only: some subtask of it has keyed-state files.
    pub keyed_files: bool,
    /// Plan only: its script defines `migrate(old)` or `migrate(name, old)`.
    pub migrate: bool,
}

impl NodeShape {
    /// Every keyed state it declares, each with the same fate (a node added or dropped whole).
    fn every_state(&self, change: fn(StateKind) -> StateChange) -> Vec<StateDecision> {
        self.keyed
            .iter()
            .flatten()
            .map(|(name, k)| StateDecision {
                name: name.clone(),
                change: change(*k),
            })
            .collect()
    }

    /// Whether it holds (or, for a plan, will hold) state a restore carries.
    fn holds_state(&self) -> bool {
        self.has_keyed() || self.has_local()
    }

    fn has_keyed(&self) -> bool {
        match &self.keyed {
            Some(k) => !k.is_empty(),
            None => self.keyed_files,
        }
    }

    fn has_local(&self) -> bool {
        self.local.unwrap_or(self.local_files)
    }

    fn is_generator(&self) -> bool {
        self.node
            .as_ref()
            .is_some_and(|n| n.section == Section::Source && n.type_name == "generator")
    }

    fn label(&self) -> String {
        match &self.node {
            Some(n) => format!("{} `{}` ({})", n.section.as_str(), self.id, n.type_name),
            None => format!("`{}`", self.id),
        }
    }
}

impl PipelineShape {
    /// The shape of a compiled plan: what a snapshot of it records.
    pub fn of_plan(plan: &PipelinePlan) -> Self {
        let nodes = declared(plan)
            .map(|node| {
                let info = operator_info(plan, node);
                NodeShape {
                    id: info.id,
                    node: info.node,
                    parallelism: info.parallelism,
                    script_hash: info.script_hash,
                    keyed: info.keyed_state,
                    local: info.local_state,
                    local_files: false,
                    keyed_files: false,
                    migrate: defines_migrate(node, plan),
                }
            })
            .collect();
        Self {
            pipeline: plan.id.clone(),
            max_parallelism: plan.max_parallelism,
            max_parallelism_derived: plan.spec.max_parallelism.is_none(),
            backend: Some(BackendKind::of(&plan.spec.state)),
            native_keyed: false,
            nodes,
        }
    }

    /// The shape a checkpoint's or savepoint's metadata records.
    pub fn of_metadata(meta: &CheckpointMetadata) -> Self {
        let nodes =
            meta.operators
                .iter()
                .map(|o| NodeShape {
                    id: o.id.clone(),
                    node: o.node.clone(),
                    parallelism: o.parallelism,
                    script_hash: o.script_hash.clone(),
                    keyed: o.keyed_state.clone(),
                    local: o.local_state,
                    local_files: meta.subtasks.iter().any(|s| {
                        s.operator == o.id && s.files.iter().any(|f| is_local_file(&f.path))
                    }),
                    keyed_files: meta.subtasks.iter().any(|s| {
                        s.operator == o.id && s.files.iter().any(|f| is_keyed_file(&f.path))
                    }),
                    migrate: false,
                })
                .collect();
        Self {
            pipeline: meta.pipeline.clone(),
            max_parallelism: meta.max_parallelism,
            max_parallelism_derived: false,
            backend: meta.backend,
            native_keyed: meta
                .files()
                .any(|f| f.path.ends_with(crate::state::rocksdb::NATIVE_SUFFIX)),
            nodes,
        }
    }

    fn node(&self, id: &str) -> Option<&NodeShape> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// The metadata record of one node of a plan (see [`OperatorInfo`]).
pub fn operator_info(plan: &PipelinePlan, node: &PlanNode) -> OperatorInfo {
    let (section, keyed, local) = match &node.kind {
        NodeKind::Source(_) => (Section::Source, BTreeMap::new(), true),
        NodeKind::Operator(op) => (Section::Operator, keyed_state_of(op), false),
        NodeKind::Sink(SinkSpec::File(_)) => (
            Section::Sink,
            BTreeMap::new(),
            crate::plan::guarantee::file_sink_commits_in_two_phases(&plan.spec.checkpoints),
        ),
        NodeKind::Sink(SinkSpec::Stdout(_) | SinkSpec::Kafka(_)) => {
            (Section::Sink, BTreeMap::new(), false)
        }
        // Its snapshot lists its prepared transactions in every mode.
        NodeKind::Sink(SinkSpec::Postgres(_)) => (Section::Sink, BTreeMap::new(), true),
    };
    OperatorInfo {
        id: node.id.clone(),
        parallelism: node.parallelism,
        script_hash: node.script.as_deref().map(super::metadata::script_hash),
        node: Some(NodeType {
            section,
            type_name: node.type_name().to_owned(),
        }),
        keyed_state: Some(keyed),
        local_state: Some(local),
    }
}

/// The nodes in declaration order: sources, operators, sinks, each as written.
fn declared(plan: &PipelinePlan) -> impl Iterator<Item = &PlanNode> {
    let spec = &plan.spec;
    spec.sources
        .iter()
        .map(SourceSpec::id)
        .chain(spec.operators.iter().map(OperatorSpec::id))
        .chain(spec.sinks.iter().map(SinkSpec::id))
        .filter_map(|id| plan.node_by_id(id))
}

/// Whether the node's script defines the `migrate` hook (`migrate(old)` or
/// `migrate(name, old)`), compiled with the pipeline's sandboxed engine; a script that does
/// not compile (validation rejects it first) defines nothing. Only keyed operators run it.
fn defines_migrate(node: &PlanNode, plan: &PipelinePlan) -> bool {
    let NodeKind::Operator(op) = &node.kind else {
        return false;
    };
    let Some(script) = node.script.as_deref().filter(|_| op.is_keyed()) else {
        return false;
    };
    let engine = crate::script::build_engine(&plan.spec.limits);
    crate::script::compile(&engine, script).is_ok_and(|ast| {
        crate::script::defines(&ast, "migrate", 1) || crate::script::defines(&ast, "migrate", 2)
    })
}

/// What happens to a node's state as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Holds no state, before or after.
    Stateless,
    /// Restored as it was.
    Kept,
    /// Restored, then every keyed value goes through the new script's `migrate`.
    Migrated,
    /// Starts empty: a new node, one that held no state before, or one none of whose old
    /// state carries over (renamed states, a changed type).
    New,
    /// The node is gone from the new version: its state is not restored.
    Dropped,
}

impl Fate {
    /// `stateless`, `kept`, `migrated`, `new` or `dropped` (the reload plan's wire form).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stateless => "stateless",
            Self::Kept => "kept",
            Self::Migrated => "migrated",
            Self::New => "new",
            Self::Dropped => "dropped",
        }
    }
}

/// What happens to one named keyed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateChange {
    /// Restored as is.
    Kept(StateKind),
    /// Restored, then rewritten by `migrate`.
    Migrated(StateKind),
    /// Declared for the first time: starts empty.
    New(StateKind),
    /// No longer declared: not restored (needs the switch).
    Dropped(StateKind),
    /// Its kind changed and `migrate` rewrites every value into the new kind.
    Retyped {
        /// The recorded kind.
        from: StateKind,
        /// The declared kind.
        to: StateKind,
    },
    /// Its kind changed and nothing converts the values: the restore is refused.
    Incompatible {
        /// The recorded kind.
        from: StateKind,
        /// The declared kind.
        to: StateKind,
    },
}

impl StateChange {
    /// `kept`, `migrated`, `new`, `dropped`, `retyped` or `incompatible` (wire form).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kept(_) => "kept",
            Self::Migrated(_) => "migrated",
            Self::New(_) => "new",
            Self::Dropped(_) => "dropped",
            Self::Retyped { .. } => "retyped",
            Self::Incompatible { .. } => "incompatible",
        }
    }

    /// Whether values of the snapshot are restored into it.
    fn restores(self) -> bool {
        matches!(
            self,
            Self::Kept(_) | Self::Migrated(_) | Self::Retyped { .. }
        )
    }
}

/// One named keyed state of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDecision {
    /// Its name.
    pub name: String,
    /// What happens to it.
    pub change: StateChange,
}

/// What a restore does with one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDecision {
    /// The node's id.
    pub id: String,
    /// What happens to its state as a whole.
    pub fate: Fate,
    /// Its script differs from the recorded one.
    pub script_changed: bool,
    /// `(old, new)` when its parallelism changed.
    pub parallelism: Option<(u32, u32)>,
    /// Its keyed state moves between subtasks by key-group range (it has keyed state and
    /// its parallelism changed).
    pub key_groups_redistributed: bool,
    /// Its named keyed states (declared now or recorded then), by name.
    pub states: Vec<StateDecision>,
    /// The restored metadata does not record its declared states: names and kinds were not
    /// compared (the restore refuses an undeclared state unless the switch is given).
    pub unrecorded: bool,
    /// The restore runs its `migrate` hook over the restored keyed values.
    pub migrate: bool,
}

impl NodeDecision {
    /// Whether the restored keyed state must be filtered (states dropped or retyped, or
    /// names not recorded) rather than loaded as it is.
    pub fn filters_keyed_state(&self) -> bool {
        self.unrecorded
            || self.states.iter().any(|s| {
                matches!(
                    s.change,
                    StateChange::Dropped(_) | StateChange::Retyped { .. }
                )
            })
    }

    /// The keyed states the restore loads, each under its declared kind; every other state
    /// in the snapshot is dropped (or, when [`unrecorded`](Self::unrecorded), refused unless
    /// the switch was given).
    pub fn restored_states(&self) -> BTreeMap<String, StateKind> {
        self.states
            .iter()
            .filter(|s| s.change.restores())
            .map(|s| {
                let kind = match s.change {
                    StateChange::Kept(k) | StateChange::Migrated(k) => k,
                    StateChange::Retyped { to, .. } => to,
                    _ => StateKind::Value,
                };
                (s.name.clone(), kind)
            })
            .collect()
    }
}

/// Why a restore cannot go ahead as planned. Each reads as a sentence with the way out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A checkpoint of another pipeline.
    OtherPipeline {
        /// The pipeline that took it.
        recorded: String,
        /// The pipeline restoring it.
        pipeline: String,
    },
    /// `max_parallelism` changed.
    MaxParallelism {
        /// Recorded.
        from: u32,
        /// Now.
        to: u32,
        /// Now derived from the parallelism.
        derived: bool,
    },
    /// A native RocksDB checkpoint restored into another backend.
    NativeFormat {
        /// The backend now.
        to: BackendKind,
    },
    /// A native RocksDB checkpoint whose named states would have to be dropped or retyped.
    NativeStateChange {
        /// The node.
        node: String,
    },
    /// A node that held state changed its section or type.
    TypeChanged {
        /// The node.
        node: String,
        /// Recorded.
        from: NodeType,
        /// Now.
        to: NodeType,
    },
    /// A generator source changed its parallelism.
    CannotRescale {
        /// The node.
        node: String,
        /// Recorded.
        from: u32,
        /// Now.
        to: u32,
    },
    /// A node that held state is gone (waived by the switch).
    NodeGone {
        /// How the node is named (`operator \`sum\` (reduce)`).
        node: String,
    },
    /// A named keyed state is no longer declared (waived by the switch).
    StateGone {
        /// The node.
        node: String,
        /// The state.
        state: String,
        /// Its kind.
        kind: StateKind,
        /// States the node declares now that the snapshot does not hold (rename candidates).
        new_states: Vec<String>,
    },
    /// A named keyed state changed its kind and no `migrate` converts it.
    KindChanged {
        /// The node.
        node: String,
        /// The state.
        state: String,
        /// Recorded.
        from: StateKind,
        /// Now.
        to: StateKind,
    },
}

/// The switch that lets a restore drop state, as every help line names it.
pub const ALLOW_SWITCH: &str = "--allow-non-restored-state";

impl Problem {
    /// Whether `--allow-non-restored-state` waives it (the state is then dropped).
    pub fn waivable(&self) -> bool {
        matches!(self, Self::NodeGone { .. } | Self::StateGone { .. })
    }
}

fn kind_name(kind: StateKind) -> &'static str {
    match kind {
        StateKind::Value => "value",
        StateKind::List => "list",
        StateKind::Map => "map",
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let allow = format!(
            "`weir reload {ALLOW_SWITCH}`, or `weir run {ALLOW_SWITCH}` (for `--watch` and \
             `--from-savepoint`/`--from-checkpoint`)"
        );
        match self {
            Self::OtherPipeline { recorded, pipeline } => write!(
                f,
                "the checkpoint belongs to pipeline `{recorded}`, not `{pipeline}`; only a \
                 savepoint can be restored by another pipeline (`weir run --from-savepoint`)"
            ),
            Self::MaxParallelism { from, to, derived } => {
                write!(
                    f,
                    "the snapshot was taken with max_parallelism {from}, the pipeline now has \
                     {to}: keyed state is split into max_parallelism key groups, and key groups \
                     cannot be remapped. Keep max_parallelism {from}"
                )?;
                if *derived {
                    write!(
                        f,
                        " (it is derived from `parallelism` when not set: add \
                         `max_parallelism: {from}` to change the parallelism and keep the key \
                         groups)"
                    )?;
                }
                write!(f, ", or give the pipeline a new id to start it empty")
            }
            Self::NativeFormat { to } => write!(
                f,
                "the checkpoint holds keyed state in the rocksdb backend's native format, \
                 which the {} backend cannot read; restore it with `state: {{backend: \
                 rocksdb}}` and take a savepoint (`weir savepoint`), which restores into any \
                 backend",
                to.as_str()
            ),
            Self::NativeStateChange { node } => write!(
                f,
                "operator `{node}`: its keyed states changed (dropped, renamed or of another \
                 kind), but the checkpoint holds them in the rocksdb backend's native format, \
                 which is restored whole; restore it into the previous version, take a \
                 savepoint (`weir savepoint`) and restore that instead"
            ),
            Self::TypeChanged { node, from, to } => write!(
                f,
                "`{node}` changed from {from} to {to}: its state cannot be carried over; give \
                 it a new id to start it empty, or keep the type"
            ),
            Self::CannotRescale { node, from, to } => write!(
                f,
                "source `{node}` (generator) changed parallelism from {from} to {to}, but a \
                 generator cannot change its parallelism: subtask s of p produces records s, \
                 s+p, s+2p, ..., so the positions saved at parallelism {from} mean nothing at \
                 {to}. Keep parallelism {from}, or give the source a new id to start it from \
                 the beginning"
            ),
            Self::NodeGone { node } => write!(
                f,
                "{node} held state, and the pipeline no longer has it: its state would be \
                 lost. Put it back (same `id`), or drop its state with {allow}"
            ),
            Self::StateGone {
                node,
                state,
                kind,
                new_states,
            } => {
                write!(
                    f,
                    "operator `{node}`: state `{state}` ({}) is not declared any more: its \
                     values would be lost",
                    kind_name(*kind)
                )?;
                if !new_states.is_empty() {
                    let list = new_states
                        .iter()
                        .map(|s| format!("`{s}`"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    write!(
                        f,
                        " (a renamed state is a new, empty state: {list} would start empty)"
                    )?;
                }
                write!(
                    f,
                    ". Keep the name `{state}`, or drop its values with {allow}"
                )
            }
            Self::KindChanged {
                node,
                state,
                from,
                to,
            } => write!(
                f,
                "operator `{node}`: state `{state}` changed kind from {} to {}: its values \
                 cannot be restored as they are. Keep the kind, define `fn migrate(name, old)` \
                 in the script to turn each old value into a {} (it runs once, on restore), or \
                 rename the state to start it empty (with {allow})",
                kind_name(*from),
                kind_name(*to),
                kind_name(*to)
            ),
        }
    }
}

/// The whole decision for one pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestorePlan {
    /// What is restored.
    pub kind: RestoreKind,
    /// `(recorded, now)` when the state backend changed.
    pub backend: Option<(BackendKind, BackendKind)>,
    /// The new version's nodes in its order, then the nodes only the restored side has.
    pub nodes: Vec<NodeDecision>,
    /// What refuses the restore.
    pub problems: Vec<Problem>,
    /// What `--allow-non-restored-state` waived: state dropped on purpose.
    pub waived: Vec<Problem>,
    /// The switch was given (the restore then also drops undeclared states it finds where
    /// the metadata did not record the declarations).
    pub allow_non_restored_state: bool,
}

impl RestorePlan {
    /// The decision for node `id`.
    pub fn node(&self, id: &str) -> Option<&NodeDecision> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Whether the restore can go ahead.
    #[cfg(any(test, feature = "testkit"))]
    pub fn is_applicable(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Decides what restoring `from` into `to` does to every node's state (the rules are in the
/// module docs). `allow_non_restored_state` turns the problems that only drop state into
/// [`RestorePlan::waived`].
pub fn decide(
    from: &PipelineShape,
    to: &PipelineShape,
    kind: RestoreKind,
    allow_non_restored_state: bool,
) -> RestorePlan {
    let mut problems = Vec::new();
    if kind == RestoreKind::Checkpoint && from.pipeline != to.pipeline {
        problems.push(Problem::OtherPipeline {
            recorded: from.pipeline.clone(),
            pipeline: to.pipeline.clone(),
        });
    }
    if from.max_parallelism != to.max_parallelism {
        problems.push(Problem::MaxParallelism {
            from: from.max_parallelism,
            to: to.max_parallelism,
            derived: to.max_parallelism_derived,
        });
    }
    let native = kind == RestoreKind::Checkpoint && from.native_keyed;
    if native && to.backend.is_some_and(|b| b != BackendKind::Rocksdb) {
        problems.push(Problem::NativeFormat {
            to: to.backend.unwrap_or(BackendKind::Memory),
        });
    }
    let backend = match (from.backend, to.backend) {
        (Some(a), Some(b)) if a != b => Some((a, b)),
        _ => None,
    };

    let mut nodes = Vec::with_capacity(to.nodes.len());
    for node in &to.nodes {
        let decision = match from.node(&node.id) {
            None => NodeDecision {
                id: node.id.clone(),
                fate: if node.holds_state() {
                    Fate::New
                } else {
                    Fate::Stateless
                },
                script_changed: false,
                parallelism: None,
                key_groups_redistributed: false,
                states: node.every_state(StateChange::New),
                unrecorded: false,
                migrate: false,
            },
            Some(before) => decide_node(before, node, native, &mut problems),
        };
        nodes.push(decision);
    }
    for before in &from.nodes {
        if to.node(&before.id).is_some() {
            continue;
        }
        let held = before.holds_state();
        if held {
            problems.push(Problem::NodeGone {
                node: before.label(),
            });
        }
        nodes.push(NodeDecision {
            id: before.id.clone(),
            fate: if held { Fate::Dropped } else { Fate::Stateless },
            script_changed: false,
            parallelism: None,
            key_groups_redistributed: false,
            states: before.every_state(StateChange::Dropped),
            unrecorded: false,
            migrate: false,
        });
    }

    let (waived, problems) = if allow_non_restored_state {
        problems.into_iter().partition(Problem::waivable)
    } else {
        (Vec::new(), problems)
    };
    RestorePlan {
        kind,
        backend,
        nodes,
        problems,
        waived,
        allow_non_restored_state,
    }
}

/// A node present (by id) on both sides.
fn decide_node(
    before: &NodeShape,
    node: &NodeShape,
    native: bool,
    problems: &mut Vec<Problem>,
) -> NodeDecision {
    let script_changed = before.script_hash != node.script_hash;
    let parallelism =
        (before.parallelism != node.parallelism).then_some((before.parallelism, node.parallelism));
    let held = before.holds_state();
    let mut decision = NodeDecision {
        id: node.id.clone(),
        fate: if node.holds_state() {
            Fate::New
        } else {
            Fate::Stateless
        },
        script_changed,
        parallelism,
        key_groups_redistributed: false,
        states: Vec::new(),
        unrecorded: false,
        migrate: false,
    };
    if let (Some(from), Some(to)) = (&before.node, &node.node)
        && from != to
    {
        if held {
            problems.push(Problem::TypeChanged {
                node: node.id.clone(),
                from: from.clone(),
                to: to.clone(),
            });
        }
        decision.states = node
            .keyed
            .iter()
            .flatten()
            .map(|(name, k)| StateDecision {
                name: name.clone(),
                change: StateChange::New(*k),
            })
            .collect();
        return decision;
    }
    if !held {
        decision.states = node
            .keyed
            .iter()
            .flatten()
            .map(|(name, k)| StateDecision {
                name: name.clone(),
                change: StateChange::New(*k),
            })
            .collect();
        return decision;
    }
    if let Some((from, to)) = parallelism
        && (before.is_generator() || node.is_generator())
    {
        problems.push(Problem::CannotRescale {
            node: node.id.clone(),
            from,
            to,
        });
    }

    // Named keyed state, by name.
    let declared = node.keyed.clone().unwrap_or_default();
    let mut kind_changed = false;
    let mut carried = false;
    match &before.keyed {
        None => {
            // Not recorded: every declared state is taken as restored (kinds unchecked).
            decision.unrecorded = before.keyed_files || !declared.is_empty();
            for (name, k) in &declared {
                decision.states.push(StateDecision {
                    name: name.clone(),
                    change: StateChange::Kept(*k),
                });
            }
            carried = true;
        }
        Some(recorded) => {
            // Internal states (`__timers.*`, `__ttl.*`) are never what a user renamed.
            let new_names: Vec<String> = declared
                .keys()
                .filter(|n| !recorded.contains_key(*n) && !n.starts_with("__"))
                .cloned()
                .collect();
            for (name, &k) in &declared {
                let change = match recorded.get(name) {
                    None => StateChange::New(k),
                    Some(&old) if old == k => {
                        carried = true;
                        StateChange::Kept(k)
                    }
                    Some(&old) if node.migrate => {
                        carried = true;
                        kind_changed = true;
                        StateChange::Retyped { from: old, to: k }
                    }
                    Some(&old) => {
                        problems.push(Problem::KindChanged {
                            node: node.id.clone(),
                            state: name.clone(),
                            from: old,
                            to: k,
                        });
                        StateChange::Incompatible { from: old, to: k }
                    }
                };
                decision.states.push(StateDecision {
                    name: name.clone(),
                    change,
                });
            }
            for (name, &old) in recorded {
                if declared.contains_key(name) {
                    continue;
                }
                problems.push(Problem::StateGone {
                    node: node.id.clone(),
                    state: name.clone(),
                    kind: old,
                    new_states: new_names.clone(),
                });
                decision.states.push(StateDecision {
                    name: name.clone(),
                    change: StateChange::Dropped(old),
                });
            }
        }
    }
    if native && decision.filters_keyed_state() && !decision.unrecorded {
        problems.push(Problem::NativeStateChange {
            node: node.id.clone(),
        });
    }

    decision.migrate = node.migrate && carried && (script_changed || kind_changed);
    if decision.migrate {
        for s in &mut decision.states {
            if let StateChange::Kept(k) = s.change {
                s.change = StateChange::Migrated(k);
            }
        }
    }
    let local_carried = before.has_local();
    decision.key_groups_redistributed = parallelism.is_some() && carried && before.has_keyed();
    decision.fate = if decision.migrate {
        Fate::Migrated
    } else if carried || local_carried {
        // Also when the new version holds no state of its own (a `file` sink that no longer
        // commits in two phases): it still restores, and commits, what the old one left.
        Fate::Kept
    } else if node.holds_state() {
        Fate::New
    } else {
        // Everything it held is dropped, and it holds nothing now.
        Fate::Dropped
    };
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(states: &[(&str, StateKind)]) -> Option<BTreeMap<String, StateKind>> {
        Some(states.iter().map(|(n, k)| ((*n).to_owned(), *k)).collect())
    }

    fn node(id: &str, section: Section, type_name: &str) -> NodeShape {
        NodeShape {
            id: id.into(),
            node: Some(NodeType {
                section,
                type_name: type_name.into(),
            }),
            parallelism: 2,
            script_hash: None,
            keyed: keyed(&[]),
            local: Some(section == Section::Source),
            local_files: false,
            keyed_files: false,
            migrate: false,
        }
    }

    fn process(states: &[(&str, StateKind)], script: &str) -> NodeShape {
        NodeShape {
            script_hash: Some(script.into()),
            keyed: keyed(states),
            ..node("count", Section::Operator, "process")
        }
    }

    fn shape(nodes: Vec<NodeShape>) -> PipelineShape {
        PipelineShape {
            pipeline: "p".into(),
            max_parallelism: 128,
            max_parallelism_derived: true,
            backend: Some(BackendKind::Fs),
            native_keyed: false,
            nodes,
        }
    }

    fn with(op: NodeShape) -> PipelineShape {
        shape(vec![
            node("src", Section::Source, "file"),
            node("by", Section::Operator, "key_by"),
            op,
            NodeShape {
                local: Some(true),
                ..node("out", Section::Sink, "file")
            },
        ])
    }

    fn changes(plan: &RestorePlan, id: &str) -> Vec<(String, StateChange)> {
        plan.node(id)
            .expect("the node")
            .states
            .iter()
            .map(|s| (s.name.clone(), s.change))
            .collect()
    }

    use StateKind::{List, Value};

    #[test]
    fn an_unchanged_pipeline_keeps_everything() {
        let p = with(process(&[("cnt", Value)], "a"));
        let plan = decide(&p, &p, RestoreKind::Checkpoint, false);
        assert!(plan.is_applicable(), "{:?}", plan.problems);
        let fates: Vec<(&str, Fate)> = plan.nodes.iter().map(|n| (n.id.as_str(), n.fate)).collect();
        assert_eq!(
            fates,
            vec![
                ("src", Fate::Kept),
                ("by", Fate::Stateless),
                ("count", Fate::Kept),
                ("out", Fate::Kept)
            ]
        );
        assert!(!plan.node("count").expect("count").migrate);
        assert!(!plan.node("count").expect("count").filters_keyed_state());
        assert_eq!(plan.backend, None);
    }

    #[test]
    fn a_renamed_state_is_dropped_and_new_and_needs_the_switch() {
        let old = with(process(&[("cnt", Value)], "a"));
        let new = with(process(&[("count", Value)], "b"));
        let plan = decide(&old, &new, RestoreKind::Savepoint, false);
        assert_eq!(
            plan.problems,
            vec![Problem::StateGone {
                node: "count".into(),
                state: "cnt".into(),
                kind: Value,
                new_states: vec!["count".into()],
            }]
        );
        let text = plan.problems[0].to_string();
        assert!(
            text.contains("`cnt` (value) is not declared any more"),
            "{text}"
        );
        assert!(
            text.contains("`weir reload --allow-non-restored-state`"),
            "{text}"
        );
        assert!(!text.contains("allow_non_restored_state:"), "{text}");
        assert_eq!(
            changes(&plan, "count"),
            vec![
                ("count".into(), StateChange::New(Value)),
                ("cnt".into(), StateChange::Dropped(Value))
            ]
        );
        let d = plan.node("count").expect("count");
        assert_eq!(d.fate, Fate::New, "nothing of the old state carries over");
        assert!(d.filters_keyed_state());
        assert!(d.restored_states().is_empty());

        let allowed = decide(&old, &new, RestoreKind::Savepoint, true);
        assert!(allowed.is_applicable());
        assert_eq!(allowed.waived.len(), 1);
        assert_eq!(allowed.nodes, plan.nodes);
    }

    #[test]
    fn a_kind_change_is_incompatible_unless_migrate_handles_it() {
        let old = with(process(&[("cnt", Value), ("seen", List)], "a"));
        let new = with(process(&[("cnt", List), ("seen", List)], "b"));
        let plan = decide(&old, &new, RestoreKind::Savepoint, true);
        assert_eq!(
            plan.problems,
            vec![Problem::KindChanged {
                node: "count".into(),
                state: "cnt".into(),
                from: Value,
                to: List
            }],
            "the switch does not waive a kind change"
        );
        assert!(
            plan.problems[0]
                .to_string()
                .contains("fn migrate(name, old)")
        );

        let mut migrating = new.clone();
        migrating.nodes[2].migrate = true;
        let plan = decide(&old, &migrating, RestoreKind::Savepoint, false);
        assert!(plan.is_applicable(), "{:?}", plan.problems);
        let d = plan.node("count").expect("count");
        assert!(d.migrate);
        assert_eq!(d.fate, Fate::Migrated);
        assert_eq!(
            changes(&plan, "count"),
            vec![
                (
                    "cnt".into(),
                    StateChange::Retyped {
                        from: Value,
                        to: List
                    }
                ),
                ("seen".into(), StateChange::Migrated(List)),
            ]
        );
        assert_eq!(
            d.restored_states(),
            BTreeMap::from([("cnt".into(), List), ("seen".into(), List)])
        );
        assert!(d.filters_keyed_state());
    }

    #[test]
    fn migrate_runs_only_when_the_script_or_a_kind_changed() {
        let mut old = with(process(&[("cnt", Value)], "a"));
        old.nodes[2].migrate = true;
        let plan = decide(&old, &old, RestoreKind::Savepoint, false);
        assert!(!plan.node("count").expect("count").migrate, "same script");
        let mut new = with(process(&[("cnt", Value)], "b"));
        new.nodes[2].migrate = true;
        let plan = decide(&old, &new, RestoreKind::Checkpoint, false);
        let d = plan.node("count").expect("count");
        assert!(d.migrate && d.script_changed);
        assert_eq!(d.fate, Fate::Migrated);
        assert!(
            !d.filters_keyed_state(),
            "nothing to filter: same names and kinds"
        );
    }

    #[test]
    fn a_parallelism_change_redistributes_key_groups_only_of_keyed_state() {
        let old = with(process(&[("cnt", Value)], "a"));
        let mut new = old.clone();
        for n in &mut new.nodes {
            n.parallelism = 3;
        }
        let plan = decide(&old, &new, RestoreKind::Savepoint, false);
        assert!(plan.is_applicable(), "{:?}", plan.problems);
        let redistributed: Vec<(&str, bool)> = plan
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.key_groups_redistributed))
            .collect();
        assert_eq!(
            redistributed,
            vec![
                ("src", false),
                ("by", false),
                ("count", true),
                ("out", false)
            ]
        );
        assert!(plan.nodes.iter().all(|n| n.parallelism == Some((2, 3))));
    }

    #[test]
    fn a_generator_cannot_rescale_and_max_parallelism_cannot_change() {
        let old = shape(vec![node("gen", Section::Source, "generator")]);
        let mut new = old.clone();
        new.nodes[0].parallelism = 1;
        new.max_parallelism = 256;
        let plan = decide(&old, &new, RestoreKind::Savepoint, true);
        assert_eq!(
            plan.problems,
            vec![
                Problem::MaxParallelism {
                    from: 128,
                    to: 256,
                    derived: true
                },
                Problem::CannotRescale {
                    node: "gen".into(),
                    from: 2,
                    to: 1
                }
            ]
        );
        assert!(
            plan.problems[0]
                .to_string()
                .contains("add `max_parallelism: 128`")
        );
    }

    #[test]
    fn a_removed_stateful_node_needs_the_switch_a_stateless_one_does_not() {
        let old = with(process(&[("cnt", Value)], "a"));
        let mut new = old.clone();
        new.nodes.retain(|n| n.id != "count" && n.id != "by");
        let plan = decide(&old, &new, RestoreKind::Savepoint, false);
        assert_eq!(
            plan.problems,
            vec![Problem::NodeGone {
                node: "operator `count` (process)".into()
            }]
        );
        assert_eq!(plan.node("count").expect("count").fate, Fate::Dropped);
        assert_eq!(plan.node("by").expect("by").fate, Fate::Stateless);
        assert!(decide(&old, &new, RestoreKind::Savepoint, true).is_applicable());
    }

    #[test]
    fn a_type_change_of_a_stateful_node_is_refused() {
        let old = with(process(&[("acc", Value)], "a"));
        let new = with(NodeShape {
            keyed: keyed(&[("acc", Value)]),
            ..node("count", Section::Operator, "reduce")
        });
        let plan = decide(&old, &new, RestoreKind::Savepoint, true);
        assert_eq!(plan.problems.len(), 1);
        assert!(matches!(plan.problems[0], Problem::TypeChanged { .. }));
        assert_eq!(
            plan.problems[0].to_string(),
            "`count` changed from process operator to reduce operator: its state cannot be \
             carried over; give it a new id to start it empty, or keep the type"
        );
    }

    #[test]
    fn backends_and_native_checkpoints() {
        let old = PipelineShape {
            backend: Some(BackendKind::Rocksdb),
            native_keyed: true,
            ..with(process(&[("cnt", Value)], "a"))
        };
        let new = PipelineShape {
            backend: Some(BackendKind::Fs),
            ..with(process(&[("cnt", Value)], "a"))
        };
        // A savepoint is canonical: any backend; the change is shown.
        let plan = decide(&old, &new, RestoreKind::Savepoint, false);
        assert!(plan.is_applicable(), "{:?}", plan.problems);
        assert_eq!(plan.backend, Some((BackendKind::Rocksdb, BackendKind::Fs)));
        // A native checkpoint only into rocksdb.
        let plan = decide(&old, &new, RestoreKind::Checkpoint, false);
        assert_eq!(
            plan.problems,
            vec![Problem::NativeFormat {
                to: BackendKind::Fs
            }]
        );
        // ... and whole: no state dropped or retyped.
        let renamed = PipelineShape {
            backend: Some(BackendKind::Rocksdb),
            ..with(process(&[("count", Value)], "a"))
        };
        let plan = decide(&old, &renamed, RestoreKind::Checkpoint, true);
        assert_eq!(
            plan.problems,
            vec![Problem::NativeStateChange {
                node: "count".into()
            }]
        );
        // A checkpoint of another pipeline is refused; a savepoint is not.
        let other = PipelineShape {
            pipeline: "q".into(),
            ..new.clone()
        };
        let fs_old = PipelineShape {
            backend: Some(BackendKind::Fs),
            native_keyed: false,
            ..old
        };
        assert!(decide(&fs_old, &other, RestoreKind::Savepoint, false).is_applicable());
        assert!(matches!(
            decide(&fs_old, &other, RestoreKind::Checkpoint, false).problems[..],
            [Problem::OtherPipeline { .. }]
        ));
    }

    #[test]
    fn unrecorded_declarations_are_not_compared_and_say_so() {
        let mut old = with(process(&[("cnt", Value)], "a"));
        for n in &mut old.nodes {
            n.node = None;
            n.keyed = None;
            n.local = None;
            n.local_files = n.id == "src" || n.id == "out";
            n.keyed_files = n.id == "count";
        }
        let new = with(process(&[("count", List)], "a"));
        let plan = decide(&old, &new, RestoreKind::Savepoint, false);
        assert!(plan.is_applicable(), "{:?}", plan.problems);
        let d = plan.node("count").expect("count");
        assert!(d.unrecorded);
        assert!(d.filters_keyed_state(), "the restore checks what it finds");
        assert_eq!(d.fate, Fate::Kept);
        assert_eq!(plan.node("by").expect("by").fate, Fate::Stateless);
        assert_eq!(plan.node("src").expect("src").fate, Fate::Kept);
        assert!(!plan.node("src").expect("src").unrecorded);
    }

    /// A plan's own metadata round-trips into the same shape, so that a reload's plan
    /// (running plan → new plan) and its restore (savepoint metadata → new plan) decide alike.
    #[test]
    fn the_shape_of_a_plan_equals_the_shape_its_metadata_records() {
        let yaml = r#"version: 1
pipelines:
  - id: p
    checkpoints: { interval: 1s }
    state: { backend: rocksdb }
    sources:
      - { id: src, type: file, path: in.jsonl }
    operators:
      - { id: by, type: key_by, input: src, field: k }
      - id: count
        type: process
        input: by
        state: { cnt: value, seen: list }
        script: |
          fn process(r) { state_set("cnt", 1); }
          fn migrate(name, old) { old }
    sinks:
      - { id: out, type: file, input: count, path: out }
"#;
        let plan = crate::plan::plan_test_yaml(yaml, std::path::Path::new("/jobs"));
        let shape = PipelineShape::of_plan(&plan);
        assert!(shape.node("count").expect("count").migrate);
        assert_eq!(
            shape.node("count").expect("count").keyed,
            keyed(&[("cnt", Value), ("seen", List)])
        );
        assert_eq!(shape.node("out").expect("out").local, Some(true));
        let cp = super::super::CheckpointPlan::from_plan(&plan);
        let meta = CheckpointMetadata {
            format_version: super::super::metadata::METADATA_FORMAT_VERSION,
            pipeline: cp.pipeline.clone(),
            checkpoint: 1,
            kind: crate::base::message::BarrierKind::Savepoint,
            config_hash: cp.config_hash.clone(),
            max_parallelism: cp.max_parallelism,
            backend: cp.backend,
            operators: cp.operators.clone(),
            subtasks: Vec::new(),
            finished_tasks: Vec::new(),
            finished_operators: Vec::new(),
        };
        let recorded = PipelineShape::of_metadata(&meta);
        let strip = |s: &PipelineShape| {
            let mut s = s.clone();
            s.max_parallelism_derived = false;
            for n in &mut s.nodes {
                n.migrate = false;
            }
            s.nodes.sort_by(|a, b| a.id.cmp(&b.id));
            s
        };
        assert_eq!(strip(&recorded), strip(&shape));
        assert_eq!(
            decide(&recorded, &shape, RestoreKind::Savepoint, false),
            decide(&shape, &shape, RestoreKind::Savepoint, false)
        );
    }
}
