//! Golden runs: every reference pipeline in `pipelines/` runs straight through (in a copy of
//! the folder, so nothing is written into the repository) and each sink with an expected file
//! under `pipelines/expected/<name>/<pipeline-id>/<sink-id>.jsonl` must produce exactly those
//! records, compared as multisets of canonical JSON lines.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::in_process::{
    assert_ok, copy_reference_pipelines, file_sinks, golden_path, plan_of, reference_dir,
    reference_files,
};
use common::output::{canonical_lines, committed};

use weir_engine::job::{self, JobOptions};

#[test]
fn reference_pipelines_match_their_golden_output() {
    if !reference_dir().join("expected").is_dir() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The copy of `pipelines/`: every file's `pipelines` run, each sink checked.
    let pipelines = copy_reference_pipelines(tmp.path());
    let mut compared = 0;
    for yaml in reference_files(&pipelines) {
        let name = yaml.file_stem().unwrap().to_string_lossy().into_owned();
        let plan = plan_of(&yaml);
        let sinks = file_sinks(&plan);
        let summary = job::run(plan, JobOptions::default()).unwrap();
        assert_ok(&summary, &name);
        for (pipeline, sink, dir) in sinks {
            let Ok(text) =
                std::fs::read_to_string(golden_path(&pipelines, &name, &pipeline, &sink))
            else {
                continue;
            };
            let got = committed(&dir);
            assert_eq!(got, canonical_lines(&text), "{name}/{pipeline}/{sink}");
            compared += 1;
        }
    }
    assert!(compared > 0, "no golden output was compared");
}
