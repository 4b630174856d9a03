//! The `weir test` file format (`*.test.yaml`): which pipeline file a test runs, the records
//! fed to its sources, the steps between them (checkpoint, crash, savepoint, restore, reload,
//! advance_time) and what its sinks and dead letters must hold. Loading goes through the same
//! parser, JSON Schema check and located diagnostics as pipeline files
//! ([`load_test_file`]); running a test is the engine's business (`weir_engine::testing`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::diagnostic::{Diagnostic, Diagnostics, codes};
use crate::span::{SourceFile, SpanIndex};
use crate::units::DurationSpec;

/// A `weir test` file: tests of one pipeline file.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TestFileSpec {
    /// The pipeline file under test, relative to this test file.
    pub pipeline: PathBuf,
    /// Run only this pipeline of the file. Default: every pipeline of the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_id: Option<String>,
    /// The tests, run in order, each on a fresh copy of the pipeline.
    #[schemars(length(min = 1))]
    pub tests: Vec<TestSpec>,
}

/// One test: inputs, optional steps, expectations.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TestSpec {
    /// The test's name, as the summary and JUnit report show it.
    pub name: String,
    /// Records for sources, by source id: each named source is replaced by one that reads
    /// exactly these records (in order, then more from `input` steps). A source not named here
    /// keeps its configuration and must be bounded (a `file` source without `follow`, a
    /// `generator` with `count`).
    #[serde(default)]
    pub inputs: IndexMap<String, Vec<Value>>,
    /// What happens after `inputs` are fed, in order: more input, checkpoints, crashes,
    /// savepoints and restores, reloads. A test with steps also runs its inputs without the
    /// steps and checks that every sink received the same records (exactly-once equivalence).
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// What each sink (by id) must have received by the end. A sink not named here is not
    /// checked.
    #[serde(default)]
    pub expect: IndexMap<String, SinkExpectation>,
    /// The records each operator (by id) sent to its dead-letter sink, as the record the
    /// operator failed on (the `record` field of the dead letter), compared as a multiset.
    /// `[]` asserts that the operator dead-lettered nothing.
    #[serde(default)]
    pub dead_letters: IndexMap<String, Vec<Value>>,
}

/// A step between inputs.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StepSpec {
    /// Feed more records: by source id, appended after what the sources received so far.
    Input(IndexMap<String, Vec<Value>>),
    /// Take a checkpoint once every record fed so far has been read by its source, and wait
    /// until it completed.
    Checkpoint,
    /// Every task dies at once (the whole job, as a killed process); the job restarts from
    /// the latest completed checkpoint (from the beginning when there is none).
    Crash,
    /// Stop every pipeline with a savepoint once every record fed so far has been read. The
    /// next `restore` starts from it (with changes, if asked); inputs fed in between wait.
    Savepoint,
    /// Start again from the last `savepoint`, optionally at another parallelism or state
    /// backend. `restore: {}` changes nothing.
    Restore(#[serde(default)] RestoreSpec),
    /// Apply another version of the pipeline file (relative to the test file) to the running
    /// job, as `weir run --watch` does when the file changes; its sources are replaced and
    /// its sinks captured as the original's were.
    Reload(PathBuf),
    /// Let processing time pass. A test runs on a manual clock that starts at 0 (the Unix
    /// epoch) and moves only here: once every record fed so far went through the pipeline,
    /// the clock moves forward by this much, and the processing-time timers and windows now
    /// due fire; see `weir test --help`.
    AdvanceTime(DurationSpec),
}

/// Changes applied by a `restore` step.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RestoreSpec {
    /// The pipeline's new `parallelism` (elements with their own keep theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<u32>,
    /// The new state backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendChoice>,
}

/// A state backend to restore into.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// Heap state (run as `fs` in tests, see `weir test --help`).
    Memory,
    /// Heap state with full snapshots on disk.
    Fs,
    /// Embedded RocksDB.
    Rocksdb,
}

/// What one sink must have received. Every assertion given must hold.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SinkExpectation {
    /// Exactly these records, in any order (a multiset: duplicates count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<Vec<Value>>,
    /// Exactly these records, in this order (meaningful for a sink of parallelism 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordered: Option<Vec<Value>>,
    /// The last record received per value of a key field equals these records (one per key,
    /// any order): for sinks fed by `emit: every` aggregates, whose latest value per key is
    /// the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_per_key: Option<LastPerKey>,
    /// Rhai boolean expressions that must be `true` for every record, which is `r`
    /// (e.g. `r.total > 0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<String>,
    /// The number of records received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// `true`: the sink must receive nothing.
    #[serde(default)]
    pub empty: bool,
}

/// A per-key last-value expectation.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LastPerKey {
    /// The key field (top-level field name).
    pub field: String,
    /// The expected last record of every key.
    pub records: Vec<Value>,
}

/// The JSON Schema of test files (draft 2020-12), as a JSON value.
pub fn test_json_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
        let schema = generator.into_root_schema_for::<TestFileSpec>();
        serde_json::to_value(schema).unwrap_or(Value::Null)
    })
}

fn test_validator() -> Option<&'static jsonschema::Validator> {
    static VALIDATOR: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| jsonschema::validator_for(test_json_schema()).ok())
        .as_ref()
}

/// A loaded test file: its text, whatever could be read, every problem found.
#[derive(Debug)]
pub struct LoadedTestFile {
    /// The file's text and name.
    pub source: Arc<SourceFile>,
    /// Spans of every node, when the YAML parsed.
    pub spans: Option<SpanIndex>,
    /// The typed test file, when it matched the schema.
    pub spec: Option<TestFileSpec>,
    /// Problems found while loading (syntax, schema, types).
    pub diagnostics: Diagnostics,
}

/// Reads and checks a test file.
pub fn load_test_file(path: &Path) -> LoadedTestFile {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_test_str(&name, &text),
        Err(e) => {
            let source = Arc::new(SourceFile::new(&name, ""));
            let mut diagnostics = Diagnostics::new();
            diagnostics.push(
                Diagnostic::error(codes::INVALID_VALUE, format!("cannot read {name}: {e}"))
                    .help("check the path"),
            );
            LoadedTestFile {
                source,
                spans: None,
                spec: None,
                diagnostics,
            }
        }
    }
}

/// Checks a test file's text.
pub fn load_test_str(name: &str, text: &str) -> LoadedTestFile {
    let source = Arc::new(SourceFile::new(name, text));
    let (spans, spec, diagnostics) =
        crate::load::load_document::<TestFileSpec>(&source, |value, spans| {
            crate::schema::check_against(
                test_json_schema(),
                test_validator(),
                value,
                spans,
                &source,
            )
        });
    LoadedTestFile {
        source,
        spans,
        spec,
        diagnostics,
    }
}
