//! Every reference pipeline and example validates against the checked-in JSON Schema, read by
//! an independent YAML parser (serde-saphyr) and an independent validator (boon) — neither is
//! what `weir validate` uses — so the schema and the serde model cannot drift apart unnoticed.

use std::path::{Path, PathBuf};

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if !matches!(
                path.file_name().and_then(|n| n.to_str()),
                Some("out" | ".weir" | "data" | "expected")
            ) {
                yaml_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            // Test files of `weir test` have a schema of their own.
            && !path.to_string_lossy().ends_with(".test.yaml")
        {
            out.push(path);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The checked-in schema, compiled by boon.
fn compiled_schema() -> (boon::Schemas, boon::SchemaIndex) {
    let schema_path = root().join("schema/weir.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("read schema"))
            .expect("schema is JSON");
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler
        .add_resource("weir.schema.json", schema)
        .expect("add schema");
    let id = compiler
        .compile("weir.schema.json", &mut schemas)
        .expect("schema compiles in boon");
    (schemas, id)
}

#[test]
fn reference_pipelines_match_the_checked_in_schema() {
    let (schemas, id) = compiled_schema();
    let mut files = Vec::new();
    yaml_files(&root().join("pipelines"), &mut files);
    yaml_files(&root().join("examples"), &mut files);
    files.sort();
    assert!(
        files.len() >= 5,
        "expected the reference pipelines, found {files:?}"
    );
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read pipeline");
        let value: serde_json::Value = match serde_saphyr::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{}: YAML: {e}", file.display()));
                continue;
            }
        };
        if let Err(e) = schemas.validate(&value, id) {
            failures.push(format!("{}: {e:#}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "files not matching the schema:\n{}",
        failures.join("\n")
    );
}

/// Shapes the schema must refuse: an empty pipeline list, an unknown version, a field of another
/// connector, and an option on a backend that has none (serde alone accepts that last one for a
/// unit variant of a tagged enum, which is why Weir checks the schema first).
#[test]
fn schema_rejects_invalid_shapes() {
    let (schemas, id) = compiled_schema();
    for bad in [
        r#"{"version": 1, "pipelines": []}"#,
        r#"{"version": 2, "pipelines": [{"id": "p", "sources": [{"id": "s", "type": "stdin"}], "sinks": [{"id": "o", "type": "stdout", "input": "s"}]}]}"#,
        r#"{"version": 1, "pipelines": [{"id": "p", "sources": [{"id": "s", "type": "stdin", "path": "x"}], "sinks": [{"id": "o", "type": "stdout", "input": "s"}]}]}"#,
        r#"{"version": 1, "pipelines": [{"id": "p", "state": {"backend": "memory", "incremental": true}, "sources": [{"id": "s", "type": "stdin"}], "sinks": [{"id": "o", "type": "stdout", "input": "s"}]}]}"#,
    ] {
        let value: serde_json::Value = serde_json::from_str(bad).expect("test JSON");
        assert!(
            schemas.validate(&value, id).is_err(),
            "schema accepted {bad}"
        );
    }
}
