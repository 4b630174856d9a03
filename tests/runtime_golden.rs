//! Golden runs: every reference pipeline in `pipelines/` runs straight through (in a copy of
//! the folder, so nothing is written into the repository) and each sink with an expected file
//! under `pipelines/expected/<name>/<pipeline-id>/<sink-id>.jsonl` must produce exactly those
//! records, compared as multisets of canonical JSON lines.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;
use common::{canonical_lines, copy_dir};

use std::path::{Path, PathBuf};

use weir_engine::job::{self, JobOptions};
use weir_engine::plan::NodeKind;
use weir_schema::SinkSpec;

fn read_sink(dir: &Path) -> String {
    let mut text = String::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return text;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.file_name()
            .is_some_and(|n| !n.to_string_lossy().starts_with('.'))
        {
            text.push_str(&std::fs::read_to_string(p).unwrap());
        }
    }
    text
}

#[test]
fn reference_pipelines_match_their_golden_output() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    if !src.join("expected").is_dir() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("pipelines");
    copy_dir(&src, &root);
    let mut yamls: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    yamls.sort();
    let mut compared = 0;
    for yaml in yamls {
        let name = yaml.file_stem().unwrap().to_string_lossy().into_owned();
        let v = weir_engine::validate::validate_file(&yaml);
        let plan = v
            .plan()
            .unwrap_or_else(|| panic!("{name} does not validate"))
            .unwrap();
        let sinks: Vec<(String, String, PathBuf)> = plan
            .pipelines
            .iter()
            .flat_map(|p| {
                p.nodes.iter().filter_map(move |n| match &n.kind {
                    NodeKind::Sink(SinkSpec::File(f)) => {
                        Some((p.id.clone(), n.id.clone(), p.resolve_path(&f.path)))
                    }
                    _ => None,
                })
            })
            .collect();
        let summary = job::run(plan, JobOptions::default()).unwrap();
        for p in &summary.pipelines {
            assert!(
                p.error.is_none(),
                "{name}/{}: {}",
                p.id,
                p.error.as_ref().unwrap()
            );
        }
        for (pipeline, sink, dir) in sinks {
            let expected = root
                .join("expected")
                .join(&name)
                .join(&pipeline)
                .join(format!("{sink}.jsonl"));
            let Ok(text) = std::fs::read_to_string(&expected) else {
                continue;
            };
            let got = canonical_lines(&read_sink(&dir));
            assert_eq!(got, canonical_lines(&text), "{name}/{pipeline}/{sink}");
            compared += 1;
        }
    }
    assert!(compared > 0, "no golden output was compared");
}
