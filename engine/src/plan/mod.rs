//! Planning: a validated [`FileSpec`] becomes a [`FilePlan`], one [`PipelinePlan`] per
//! pipeline: nodes (sources, operators, sinks) with resolved ids and parallelism, edges with
//! their partitioning, and chains of forward-connected nodes that run in one task.
//!
//! The planner trusts validation (run `validate` first) but never panics on a bad spec: it
//! returns an error instead. Rendering lives in `render`; the delivery guarantee a pipeline's
//! spec gives, in `guarantee`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_schema::{FileSpec, OperatorSpec, PipelineSpec, SinkSpec, SourceSpec};

pub mod compile;
pub mod declared;
pub mod guarantee;
pub mod render;

pub use crate::base::metrics::Role;
use crate::checkpoint::s3::S3Location;
pub use compile::compile;

/// Index of a node in [`PipelinePlan::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

/// A whole file, planned.
#[derive(Clone, Debug)]
pub struct FilePlan {
    /// One plan per pipeline, in file order.
    pub pipelines: Vec<PipelinePlan>,
}

/// One pipeline's operator graph.
#[derive(Clone, Debug)]
pub struct PipelinePlan {
    /// The pipeline's id.
    pub id: String,
    /// The spec it was compiled from (state, checkpoints, restart, failover, limits).
    pub spec: PipelineSpec,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Directory that relative paths in the spec resolve against (the YAML file's).
    pub base_dir: PathBuf,
    /// Sources, operators and sinks, in topological order (every edge goes from a lower to a
    /// higher index).
    pub nodes: Vec<PlanNode>,
    /// Data edges, plus dead-letter edges.
    pub edges: Vec<PlanEdge>,
    /// Forward-connected runs of nodes that execute in one task per subtask, in topological
    /// order; every node is in exactly one chain.
    pub chains: Vec<Chain>,
    /// Where the pipeline keeps its files, resolved.
    pub paths: PipelinePaths,
}

/// Where a pipeline keeps its files: the spec's paths resolved against the pipeline file's
/// directory when the plan is compiled, so that the runtime only uses them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelinePaths {
    /// The checkpoint storage root (`checkpoints.storage`); the pipeline's checkpoints are in
    /// `<root>/<pipeline>/`.
    pub checkpoint_root: CheckpointRoot,
    /// The savepoint root (`savepoints.dir`, default `.weir/savepoints`), absolute, or an
    /// `s3://bucket/prefix` URL kept as written: where savepoints go by default, and under
    /// which control requests must name theirs.
    pub savepoints: PathBuf,
    /// The local working directory of the pipeline's RocksDB instances
    /// (`<state.path or .weir/rocksdb>/<pipeline>`), when its state backend is RocksDB.
    pub rocksdb: Option<PathBuf>,
}

impl PipelinePaths {
    /// The paths of `spec`, resolved against `base_dir`.
    pub fn resolve(spec: &PipelineSpec, base_dir: &Path) -> Self {
        let savepoints = match S3Location::parse(&spec.savepoints.dir) {
            Some(Ok(location)) => PathBuf::from(location.to_string()),
            _ => {
                let dir = resolve_path(base_dir, &spec.savepoints.dir);
                std::path::absolute(&dir).unwrap_or(dir)
            }
        };
        let rocksdb = match &spec.state {
            weir_schema::StateSpec::Rocksdb(r) => {
                let base = r.path.as_deref().unwrap_or(Path::new(".weir/rocksdb"));
                Some(resolve_path(base_dir, base).join(&spec.id))
            }
            _ => None,
        };
        Self {
            checkpoint_root: CheckpointRoot::resolve(base_dir, &spec.checkpoints.storage),
            savepoints,
            rocksdb,
        }
    }
}

/// Where checkpoint storage is: a local directory or an object-store location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointRoot {
    /// A directory, resolved against the pipeline file's directory.
    Local(PathBuf),
    /// `s3://bucket/prefix`.
    S3(S3Location),
}

impl CheckpointRoot {
    /// The root `storage` names: an `s3://` URL (validation has checked its form; a bad one
    /// keeps its text as a local path, which the store then refuses), else a path resolved
    /// against `base_dir`.
    pub fn resolve(base_dir: &Path, storage: &str) -> Self {
        match S3Location::parse(storage) {
            Some(Ok(location)) => Self::S3(location),
            _ => Self::Local(resolve_path(base_dir, storage)),
        }
    }

    /// The storage of pipeline `pipeline` under this root, for messages
    /// (`<dir>/<pipeline>` or `s3://bucket/prefix/<pipeline>`).
    pub fn display_for(&self, pipeline: &str) -> String {
        match self {
            Self::Local(dir) => dir.join(pipeline).display().to_string(),
            Self::S3(location) => location.join(pipeline).to_string(),
        }
    }
}

/// Resolves a path from a spec against the pipeline file's directory `base_dir`.
pub fn resolve_path(base_dir: &Path, p: impl AsRef<Path>) -> PathBuf {
    let p = p.as_ref();
    if p.is_absolute() {
        p.to_path_buf()
    } else if base_dir.as_os_str().is_empty() {
        // A file named without a directory: its paths are relative to `.`, spelled out so
        // that every resolved path has a parent.
        Path::new(".").join(p)
    } else {
        base_dir.join(p)
    }
}

/// What a node is.
#[derive(Clone, Debug)]
pub enum NodeKind {
    /// A source.
    Source(SourceSpec),
    /// An operator.
    Operator(OperatorSpec),
    /// A sink.
    Sink(SinkSpec),
}

impl NodeKind {
    /// The part a node of this kind plays.
    pub fn role(&self) -> Role {
        match self {
            NodeKind::Source(_) => Role::Source,
            NodeKind::Operator(_) => Role::Operator,
            NodeKind::Sink(_) => Role::Sink,
        }
    }
}

/// A node of the logical graph.
#[derive(Clone, Debug)]
pub struct PlanNode {
    /// Its index.
    pub index: NodeId,
    /// The element's stable id from the YAML.
    pub id: String,
    /// The element's spec.
    pub kind: NodeKind,
    /// Resolved parallelism (override or pipeline default).
    pub parallelism: u32,
    /// The Rhai script text, loaded (inline or from `script_file`), if the node has one.
    pub script: Option<Arc<str>>,
    /// Where that text sits in its file, for run-time errors at a file position; set by
    /// [`crate::validate::Validation::plan`], which knows the file's spans (`None` otherwise:
    /// errors then give the script's own line and column).
    pub script_origin: Option<Arc<crate::script::errors::ScriptOrigin>>,
}

impl PlanNode {
    /// The YAML `type:` of the node.
    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            NodeKind::Source(s) => s.type_name(),
            NodeKind::Operator(o) => o.type_name(),
            NodeKind::Sink(s) => s.type_name(),
        }
    }
}

/// How records travel along an edge between the subtasks of two nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Partitioning {
    /// Subtask i feeds subtask i (equal parallelism).
    Forward,
    /// By key: key → stable hash → key group in `[0, max_parallelism)` → subtask
    /// `kg * parallelism / max_parallelism`.
    Hash,
    /// Round-robin over all downstream subtasks.
    Rebalance,
    /// Every downstream subtask receives every record.
    Broadcast,
}

impl Partitioning {
    /// Lower-case name for output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Hash => "hash",
            Self::Rebalance => "rebalance",
            Self::Broadcast => "broadcast",
        }
    }
}

/// A directed edge of the logical graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanEdge {
    /// Upstream node.
    pub from: NodeId,
    /// Downstream node.
    pub to: NodeId,
    /// How records are distributed.
    pub partitioning: Partitioning,
    /// Whether this edge is a side output (dead letters, or late records) rather than data.
    pub dead_letter: bool,
    /// Whether this side output carries a `window`'s late records (with `dead_letter` set)
    /// rather than failed records.
    pub late: bool,
}

/// Nodes chained into one task: each consecutive pair is joined by a forward edge of equal
/// parallelism, with no other edge into or out of the middle of the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// The chained nodes, upstream first.
    pub nodes: Vec<NodeId>,
    /// Parallelism shared by every node of the chain.
    pub parallelism: u32,
}

impl PipelinePlan {
    /// The node with a given YAML id.
    pub fn node_by_id(&self, id: &str) -> Option<&PlanNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Edges into a node.
    pub fn inputs_of(&self, node: NodeId) -> impl Iterator<Item = &PlanEdge> {
        self.edges.iter().filter(move |e| e.to == node)
    }

    /// Edges out of a node.
    pub fn outputs_of(&self, node: NodeId) -> impl Iterator<Item = &PlanEdge> {
        self.edges.iter().filter(move |e| e.from == node)
    }

    /// The chain holding a node.
    pub fn chain_of(&self, node: NodeId) -> Option<usize> {
        self.chains.iter().position(|c| c.nodes.contains(&node))
    }

    /// Resolves a path from the spec against the pipeline file's directory.
    pub fn resolve_path(&self, p: impl AsRef<Path>) -> PathBuf {
        resolve_path(&self.base_dir, p)
    }
}

/// A one-pipeline file with checkpoints into `ck` (unit tests across the engine).
#[cfg(test)]
pub(crate) const TEST_JOB: &str = r#"version: 1
pipelines:
  - id: p
    checkpoints: { interval: 1s, storage: ck }
    sources:
      - { id: gen, type: generator, count: 1, fields: { seq: { kind: sequence } } }
    sinks:
      - { id: out, type: stdout, input: gen }
"#;

/// Loads a YAML text and plans its first pipeline; panics with the diagnostics when the text
/// does not load or plan (unit tests across the engine).
#[cfg(test)]
pub(crate) fn plan_test_yaml(yaml: &str, base_dir: &Path) -> PipelinePlan {
    let loaded = weir_schema::load_str("test.yaml", yaml);
    let spec = loaded
        .spec
        .unwrap_or_else(|| panic!("invalid YAML: {:?}", loaded.diagnostics));
    compile(&spec.pipelines[0], base_dir).expect("compiles")
}

/// Plans every pipeline of a spec (convenience wrapper over [`compile`] for a whole file).
pub fn compile_file(spec: &FileSpec, base_dir: &Path) -> Result<FilePlan, PlanError> {
    let pipelines = spec
        .pipelines
        .iter()
        .map(|p| compile(p, base_dir))
        .collect::<Result<_, _>>()?;
    Ok(FilePlan { pipelines })
}

/// Why a spec could not be planned. Validation reports these as diagnostics first, so the
/// planner meets them only when called on an unvalidated spec.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// An input names no element.
    #[error("pipeline `{pipeline}`: `{element}` reads from `{input}`, which does not exist")]
    UnknownInput {
        /// Pipeline id.
        pipeline: String,
        /// Element id.
        element: String,
        /// The dangling name.
        input: String,
    },
    /// The graph has a cycle.
    #[error("pipeline `{pipeline}`: the operators form a cycle through `{element}`")]
    Cycle {
        /// Pipeline id.
        pipeline: String,
        /// An element on the cycle.
        element: String,
    },
    /// A script file could not be read.
    #[error("pipeline `{pipeline}`: cannot read script file `{path}` of `{element}`: {source}")]
    ScriptFile {
        /// Pipeline id.
        pipeline: String,
        /// Element id.
        element: String,
        /// The file.
        path: PathBuf,
        /// Why it could not be read (missing, not a regular file, too large, not UTF-8).
        source: Box<weir_schema::ReadError>,
    },
    /// Anything else validation should have caught.
    #[error("pipeline `{pipeline}`: {message}")]
    Invalid {
        /// Pipeline id.
        pipeline: String,
        /// What is wrong.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn paths(yaml: &str) -> PipelinePaths {
        plan_test_yaml(yaml, Path::new("/jobs")).paths
    }

    #[test]
    fn savepoints_go_to_the_configured_dir_else_under_checkpoint_storage() {
        assert_eq!(
            paths(TEST_JOB).savepoints,
            Path::new("/jobs/.weir/savepoints")
        );
        let configured = TEST_JOB.replace(
            "    sources:",
            "    savepoints: { dir: backups/sp }\n    sources:",
        );
        assert_eq!(paths(&configured).savepoints, Path::new("/jobs/backups/sp"));
        let remote = TEST_JOB.replace(
            "    sources:",
            "    savepoints: { dir: 's3://bucket/sp/' }\n    sources:",
        );
        assert_eq!(
            paths(&remote).savepoints.to_string_lossy(),
            "s3://bucket/sp"
        );
    }

    #[test]
    fn storage_and_local_state_resolve_against_the_file_s_directory() {
        let p = paths(TEST_JOB);
        assert_eq!(
            p.checkpoint_root,
            CheckpointRoot::Local(PathBuf::from("/jobs/ck"))
        );
        assert_eq!(
            p.rocksdb, None,
            "only a RocksDB backend has a local directory"
        );
        let rocksdb = TEST_JOB.replace(
            "    sources:",
            "    state: { backend: rocksdb }\n    sources:",
        );
        assert_eq!(
            paths(&rocksdb).rocksdb.as_deref(),
            Some(Path::new("/jobs/.weir/rocksdb/p"))
        );
    }
}
