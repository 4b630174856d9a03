//! Pipelines run in this process through the engine (no binary): a file's plan, its file
//! sinks, failed pipelines; and the reference pipelines (`pipelines/*.yaml`) with their
//! golden outputs (`pipelines/expected/<name>/<pipeline-id>/<sink-id>.jsonl`): a copy of the
//! folder to run in (so nothing is written into the repository) and the golden lines of a
//! sink.

use std::path::{Path, PathBuf};

use weir_engine::job::JobSummary;
use weir_engine::plan::{FilePlan, NodeKind};
use weir_schema::SinkSpec;

use super::files::copy_dir;
use super::output::canonical_lines;

/// The repository's `pipelines/` folder.
pub fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines")
}

/// Copies the reference pipelines (without run output) to `<into>/pipelines`; returns it.
pub fn copy_reference_pipelines(into: &Path) -> PathBuf {
    let root = into.join("pipelines");
    copy_dir(&reference_dir(), &root);
    root
}

/// The pipeline files (`*.yaml`, not the `*.test.yaml` test files of `weir test`) directly
/// in `root`, sorted.
pub fn reference_files(root: &Path) -> Vec<PathBuf> {
    let mut yamls: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter(|p| !p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    yamls.sort();
    yamls
}

/// Where the golden output of sink `sink` of pipeline `pipeline` in file `name` (its stem)
/// lives under `root`.
pub fn golden_path(root: &Path, name: &str, pipeline: &str, sink: &str) -> PathBuf {
    root.join("expected")
        .join(name)
        .join(pipeline)
        .join(format!("{sink}.jsonl"))
}

/// The golden output of a sink as sorted canonical lines; `None` when it has none.
pub fn golden(root: &Path, name: &str, pipeline: &str, sink: &str) -> Option<Vec<String>> {
    std::fs::read_to_string(golden_path(root, name, pipeline, sink))
        .ok()
        .map(|t| canonical_lines(&t))
}

/// The plan of a valid pipeline file.
pub fn plan_of(yaml: &Path) -> FilePlan {
    let v = weir_engine::validate::validate_file(yaml);
    v.plan()
        .unwrap_or_else(|| panic!("{} does not validate", yaml.display()))
        .unwrap()
}

/// Every file sink of a plan: `(pipeline, sink, directory)`.
pub fn file_sinks(plan: &FilePlan) -> Vec<(String, String, PathBuf)> {
    plan.pipelines
        .iter()
        .flat_map(|p| {
            p.nodes.iter().filter_map(move |n| match &n.kind {
                NodeKind::Sink(SinkSpec::File(f)) => {
                    Some((p.id.clone(), n.id.clone(), p.resolve_path(&f.path)))
                }
                _ => None,
            })
        })
        .collect()
}

/// Asserts that no pipeline of an in-process run failed (`what` names the run).
pub fn assert_ok(summary: &JobSummary, what: &str) {
    for p in &summary.pipelines {
        assert!(
            p.error.is_none(),
            "{what}/{}: {}",
            p.id,
            p.error.as_ref().unwrap()
        );
    }
}
