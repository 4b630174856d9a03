//! The pipeline file a test actually runs: the file under test with the named sources
//! replaced by `file` sources over the test's input files, every sink replaced by a `jsonl`
//! file sink in the test's output directory, and everything a run writes (checkpoints,
//! savepoints, RocksDB's working directory) moved into the test's temporary directory.
//! Relative paths left (script files, bounded input files) are made absolute, so the
//! rewritten file can live anywhere. Pure: spec in, JSON text out.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use weir_schema::{FileSpec, SourceSpec};

use super::ScenarioError;

/// Where a test's run reads and writes.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    /// Input files: `<inputs>/<pipeline>/<source>.jsonl`.
    pub inputs: PathBuf,
    /// Sink directories: `<outputs>/<pipeline>/<sink>/`.
    pub outputs: PathBuf,
    /// Checkpoints, savepoints and local state.
    pub work: PathBuf,
}

impl Layout {
    pub(super) fn input_file(&self, pipeline: &str, source: &str) -> PathBuf {
        self.inputs.join(pipeline).join(format!("{source}.jsonl"))
    }

    pub(super) fn sink_dir(&self, pipeline: &str, sink: &str) -> PathBuf {
        self.outputs.join(pipeline).join(sink)
    }
}

/// How to rewrite.
pub(super) struct Rewrite<'a> {
    pub layout: &'a Layout,
    /// The sources fed by the test, by `(pipeline, source)`.
    pub fed: &'a BTreeSet<(String, String)>,
    /// Only this pipeline, if set.
    pub pipeline: Option<&'a str>,
    /// Replaced sources keep reading as inputs arrive (a run with steps).
    pub follow: bool,
    /// A new pipeline parallelism.
    pub parallelism: Option<u32>,
    /// A new state backend: `memory`, `fs` or `rocksdb`.
    pub backend: Option<&'a str>,
}

/// The sources of `spec` (filtered to `pipeline`) that a test may feed: `(pipeline, source)`.
pub(super) fn sources(spec: &FileSpec, pipeline: Option<&str>) -> Vec<(String, String)> {
    spec.pipelines
        .iter()
        .filter(|p| pipeline.is_none_or(|id| p.id == id))
        .flat_map(|p| p.sources.iter().map(|s| (p.id.clone(), s.id().to_owned())))
        .collect()
}

/// The sinks of `spec` (filtered to `pipeline`): `(pipeline, sink)`.
pub(super) fn sinks(spec: &FileSpec, pipeline: Option<&str>) -> Vec<(String, String)> {
    spec.pipelines
        .iter()
        .filter(|p| pipeline.is_none_or(|id| p.id == id))
        .flat_map(|p| p.sinks.iter().map(|s| (p.id.clone(), s.id().to_owned())))
        .collect()
}

/// The raw JSON of a pipeline file, as the loader reads it.
///
/// # Errors
/// A file that does not parse.
pub(super) fn raw_json(file: &Path) -> Result<Value, ScenarioError> {
    let loaded = weir_schema::load_file(file);
    loaded
        .spans
        .map(|s| s.root().to_json())
        .ok_or_else(|| ScenarioError::Setup(format!("{} does not parse", file.display())))
}

/// The file as written (`raw`, the loader's JSON of it, with `spec` its typed form),
/// rewritten, as JSON text (valid YAML). Starting from what was written, not from `spec`,
/// keeps serialized defaults out of the file.
///
/// # Errors
/// A source neither fed nor bounded; a `pipeline_id` the file does not have.
pub(super) fn rewrite(
    spec: &FileSpec,
    raw: &Value,
    base_dir: &Path,
    how: &Rewrite<'_>,
) -> Result<String, ScenarioError> {
    if let Some(id) = how.pipeline
        && !spec.pipelines.iter().any(|p| p.id == id)
    {
        return Err(ScenarioError::Setup(format!(
            "the pipeline file has no pipeline `{id}`"
        )));
    }
    let mut file = raw.clone();
    let abs = |p: &str| crate::plan::resolve_path(base_dir, p).display().to_string();
    let abs = |p: &str| {
        let resolved = abs(p);
        std::path::absolute(&resolved).map_or(resolved, |a| a.display().to_string())
    };
    if let Some(api) = file.get_mut("api") {
        *api = json!({ "enabled": false });
    }
    let pipelines = file
        .get_mut("pipelines")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| ScenarioError::Setup("the pipeline file has no pipelines".into()))?;
    pipelines.retain(|p| {
        how.pipeline
            .is_none_or(|id| p.get("id").and_then(Value::as_str) == Some(id))
    });
    for (p, typed) in pipelines.iter_mut().zip(
        spec.pipelines
            .iter()
            .filter(|p| how.pipeline.is_none_or(|id| p.id == id)),
    ) {
        let id = typed.id.clone();
        let work = how.layout.work.join(&id);
        let obj = p
            .as_object_mut()
            .ok_or_else(|| ScenarioError::Setup("a pipeline is not a mapping".into()))?;
        // Sources: fed ones read the test's input file; the others must end by themselves.
        let mut sources = Vec::new();
        for (s, typed_source) in obj
            .get("sources")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .zip(&typed.sources)
        {
            let sid = typed_source.id().to_owned();
            if how.fed.contains(&(id.clone(), sid.clone())) {
                let mut replaced = json!({
                    "type": "file",
                    "id": sid,
                    "path": how.layout.input_file(&id, &sid).display().to_string(),
                    "format": "jsonl",
                    "follow": how.follow,
                });
                if how.follow {
                    // Records appended by a step are picked up at once, not up to 100ms later
                    // (the default), which would make every step wait that long.
                    replaced["poll_interval"] = Value::from("1ms");
                }
                if let Some(n) = s.get("parallelism") {
                    replaced["parallelism"] = n.clone();
                }
                // Event time is read from the fed records as from the real ones; a record
                // without one goes where the source's `on_error` says.
                if let Some(et) = s.get("event_time") {
                    replaced["event_time"] = et.clone();
                    if let Some(on_error) = s.get("on_error") {
                        replaced["on_error"] = on_error.clone();
                    }
                }
                sources.push(replaced);
                continue;
            }
            let bounded = match typed_source {
                SourceSpec::File(f) => !f.follow,
                SourceSpec::Generator(g) => g.count.is_some(),
                SourceSpec::Stdin(_) => false,
                SourceSpec::Kafka(k) => k.stop_at.is_some(),
            };
            if !bounded {
                return Err(ScenarioError::Setup(format!(
                    "source `{sid}` of pipeline `{id}` never ends and the test gives it no \
                     records: name it under `inputs:` (a `file` source without `follow` or a \
                     `generator` with `count` may run as configured)"
                )));
            }
            let mut kept = s;
            if let SourceSpec::File(f) = typed_source {
                kept["path"] = Value::from(abs(&f.path));
            }
            sources.push(kept);
        }
        obj.insert("sources".into(), Value::Array(sources));
        // Sinks: every one a jsonl file sink in the test's output directory.
        if let Some(sinks) = obj.get_mut("sinks").and_then(Value::as_array_mut) {
            for s in sinks.iter_mut() {
                let sid = s.get("id").and_then(Value::as_str).unwrap_or("").to_owned();
                let mut replaced = json!({
                    "type": "file",
                    "id": sid,
                    "path": how.layout.sink_dir(&id, &sid).display().to_string(),
                    "format": "jsonl",
                });
                for key in ["input", "inputs", "parallelism", "partitioning"] {
                    if let Some(v) = s.get(key) {
                        replaced[key] = v.clone();
                    }
                }
                *s = replaced;
            }
        }
        // Scripts in files: absolute paths.
        if let Some(ops) = obj.get_mut("operators").and_then(Value::as_array_mut) {
            for op in ops.iter_mut() {
                if let Some(f) = op.get("script_file").and_then(Value::as_str) {
                    let f = abs(f);
                    op["script_file"] = Value::from(f);
                }
            }
        }
        // Checkpoints on (only at `checkpoint` steps and at the end), into the work dir.
        let mut checkpoints = obj.get("checkpoints").cloned().unwrap_or_else(|| json!({}));
        checkpoints["enabled"] = Value::Bool(true);
        checkpoints["interval"] = Value::from("1d");
        checkpoints["storage"] = Value::from(work.join("checkpoints").display().to_string());
        obj.insert("checkpoints".into(), checkpoints);
        obj.insert(
            "savepoints".into(),
            json!({ "dir": work.join("savepoints").display().to_string() }),
        );
        // A failure ends the run (and fails the test) instead of restarting for ever.
        obj.insert("restart".into(), json!({ "strategy": "none" }));
        if let Some(n) = how.parallelism {
            obj.insert("parallelism".into(), Value::from(n));
        }
        let backend = how.backend.map_or_else(
            || {
                obj.get("state")
                    .and_then(|s| s.get("backend"))
                    .and_then(Value::as_str)
                    .unwrap_or("memory")
                    .to_owned()
            },
            str::to_owned,
        );
        // Heap state runs on `fs`: the same state, with checkpoints on disk, so that a
        // `crash` (the whole job dies, as a killed process) can restore them.
        let state = match backend.as_str() {
            "rocksdb" => {
                let mut s = match obj.get("state") {
                    Some(s) if s.get("backend").and_then(Value::as_str) == Some("rocksdb") => {
                        s.clone()
                    }
                    _ => json!({ "backend": "rocksdb" }),
                };
                s["path"] = Value::from(work.join("rocksdb").display().to_string());
                s
            }
            _ => json!({ "backend": "fs" }),
        };
        obj.insert("state".into(), state);
    }
    serde_json::to_string_pretty(&file)
        .map_err(|e| ScenarioError::Setup(format!("cannot encode the rewritten file: {e}")))
}
