//! Helpers shared by the scenario tests: copying the reference pipelines into a temporary
//! folder and comparing outputs as multisets of canonical JSON lines; [`run`] drives the
//! `weir` binary (a background run with its API, runs to the end, committed sink output and
//! its exactly-once comparison with a failure-free run).
#![allow(clippy::unwrap_used, dead_code)]

pub mod run;

use std::path::Path;

pub mod running;

/// Copies a folder recursively, leaving out run output (`out/`, `.weir/`).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "out" || name == ".weir" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(&name));
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// The non-blank lines of `text` as canonical JSON (keys sorted), sorted.
pub fn canonical_lines(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap()
                .to_string()
        })
        .collect();
    v.sort();
    v
}
