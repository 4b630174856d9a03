//! Checks the import directions between the engine's modules on the source itself, so that a
//! new `use` that points back up the layers fails a test instead of growing a cycle. Only
//! compiled for tests; it reads `src/` and touches nothing.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/<dir>` (or the file `src/<dir>.rs`).
fn sources(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut todo = vec![root.join(dir)];
    let file = root.join(format!("{dir}.rs"));
    if file.is_file() {
        out.push(file);
    }
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The places in `dir` that name `crate::<m>` for any `m` of `forbidden`.
fn offences(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let files = sources(dir);
    assert!(!files.is_empty(), "no sources under src/{dir}");
    let mut found = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).expect("read a source file");
        for (n, line) in text.lines().enumerate() {
            for m in forbidden {
                let path = format!("crate::{m}");
                let hit = line.match_indices(&path).any(|(i, _)| {
                    let rest = &line[i + path.len()..];
                    rest.starts_with("::") || rest.starts_with(';') || rest.starts_with(' ')
                });
                if hit {
                    found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn the_ground_floor_imports_no_layer_above_it() {
    let above = [
        "runtime",
        "checkpoint",
        "state",
        "operators",
        "connectors",
        "element",
        "registry",
        "job",
        "api",
        "control",
        "plan",
        "recovery",
        "reload",
        "script",
        "validate",
    ];
    let found = offences("base", &above);
    assert!(
        found.is_empty(),
        "base/ imports upwards:\n{}",
        found.join("\n")
    );
}

#[test]
fn checkpoint_and_state_do_not_import_the_runtime() {
    for dir in ["checkpoint", "state"] {
        let found = offences(
            dir,
            &["runtime", "job", "operators", "connectors", "registry"],
        );
        assert!(
            found.is_empty(),
            "{dir}/ imports the runtime:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn operators_and_connectors_do_not_import_each_other() {
    let found = offences("connectors", &["operators", "registry"]);
    assert!(
        found.is_empty(),
        "connectors/ imports operators:\n{}",
        found.join("\n")
    );
    let found = offences("operators", &["connectors", "registry"]);
    assert!(
        found.is_empty(),
        "operators/ imports connectors:\n{}",
        found.join("\n")
    );
    let found = offences(
        "element",
        &["operators", "connectors", "runtime", "registry"],
    );
    assert!(
        found.is_empty(),
        "element/ imports what implements it:\n{}",
        found.join("\n")
    );
}
