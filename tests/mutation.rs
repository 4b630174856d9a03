//! Property test: the validator never panics on a damaged pipeline file, and every diagnostic
//! it reports points inside the file it names.
//!
//! Each valid file in `pipelines/` and `examples/` is mutated at random (byte ranges deleted,
//! YAML-significant characters inserted, lines duplicated or deleted, numbers replaced by
//! strings) and the result goes through `validate_str` with the original file's directory as
//! base, so `script_file:` references still resolve. Each file gets a fixed number of cases
//! (`WEIR_MUTATION_CASES` overrides it), which keeps a debug run to a few seconds.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use weir_engine::validate::validate_str;
use weir_schema::Diagnostic;

/// Cases per file, unless `WEIR_MUTATION_CASES` says otherwise.
const DEFAULT_CASES_PER_FILE: u32 = 256;

/// One edit of the file's text. Positions are indices into the text's character boundaries or
/// lines, so every mutant is valid UTF-8 (`validate_str` takes `&str`).
#[derive(Clone, Debug)]
enum Mutation {
    /// Delete up to `len` characters starting at `at`.
    Delete { at: Index, len: usize },
    /// Insert `text` at `at`.
    Insert { at: Index, text: String },
    /// Repeat a line right after itself.
    DuplicateLine { line: Index },
    /// Remove a line.
    DeleteLine { line: Index },
    /// Replace the n-th run of digits with a string.
    NumberToString { which: Index, with: String },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Characters that matter to YAML and Rhai, plus multi-byte ones to test char boundaries.
    let noise = "[:\\-\\[\\]{}\"'\t\n |>#&*!%@`,?a-z0-9é✓]{1,12}";
    prop_oneof![
        (any::<Index>(), 1usize..40).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<Index>(), noise).prop_map(|(at, text)| Mutation::Insert { at, text }),
        any::<Index>().prop_map(|line| Mutation::DuplicateLine { line }),
        any::<Index>().prop_map(|line| Mutation::DeleteLine { line }),
        (
            any::<Index>(),
            prop_oneof![
                Just("\"two\"".to_owned()),
                Just("two".to_owned()),
                "[a-z]{0,6}"
            ]
        )
            .prop_map(|(which, with)| Mutation::NumberToString { which, with }),
    ]
}

fn apply(text: &str, m: &Mutation) -> String {
    let boundaries: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .collect();
    match m {
        Mutation::Delete { at, len } => {
            let i = at.index(boundaries.len());
            let end = boundaries[(i + len).min(boundaries.len() - 1)];
            format!("{}{}", &text[..boundaries[i]], &text[end..])
        }
        Mutation::Insert { at, text: noise } => {
            let b = boundaries[at.index(boundaries.len())];
            format!("{}{noise}{}", &text[..b], &text[b..])
        }
        Mutation::DuplicateLine { line } | Mutation::DeleteLine { line } => {
            let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
            if lines.is_empty() {
                return text.to_owned();
            }
            let i = line.index(lines.len());
            if matches!(m, Mutation::DuplicateLine { .. }) {
                lines.insert(i, lines[i]);
            } else {
                lines.remove(i);
            }
            lines.concat()
        }
        Mutation::NumberToString { which, with } => {
            let mut runs = Vec::new();
            let bytes = text.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i].is_ascii_digit() {
                    let start = i;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                    runs.push(start..i);
                } else {
                    i += 1;
                }
            }
            if runs.is_empty() {
                return text.to_owned();
            }
            let r = &runs[which.index(runs.len())];
            format!("{}{with}{}", &text[..r.start], &text[r.end..])
        }
    }
}

/// Every valid file the mutations start from: the reference pipelines and the examples.
fn seed_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut pending = vec![root.join("pipelines"), root.join("examples")];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                // Inputs, expected outputs and run artefacts hold no pipeline files.
                if !matches!(name.as_ref(), "data" | "expected" | "out" | ".weir") {
                    pending.push(path);
                }
            } else if (name.ends_with(".yaml") || name.ends_with(".yml"))
                // Test files of `weir test` are not pipeline files.
                && !name.ends_with(".test.yaml")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn span_problem(d: &Diagnostic) -> Option<String> {
    let spans = d.span.iter().chain(d.related.iter().map(|(s, _)| s));
    for span in spans {
        let Some(file) = &d.file else {
            return Some(format!("`{}` has a span {span:?} but no file", d.code));
        };
        let text = &file.text;
        if span.start > span.end || span.end > text.len() {
            return Some(format!(
                "`{}` span {span:?} outside {} ({} bytes)",
                d.code,
                file.name,
                text.len()
            ));
        }
        if !text.is_char_boundary(span.start) || !text.is_char_boundary(span.end) {
            return Some(format!(
                "`{}` span {span:?} splits a character in {}",
                d.code, file.name
            ));
        }
    }
    None
}

#[test]
fn mutated_files_never_panic_and_spans_stay_inside() {
    let files = seed_files();
    assert!(
        files.len() >= 5,
        "expected the reference pipelines and examples, found {files:?}"
    );
    let per_file = std::env::var("WEIR_MUTATION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES_PER_FILE);

    let mut failures = Vec::new();
    for path in &files {
        let original = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = path.display().to_string();
        let config = Config {
            cases: per_file,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        let result = runner.run(&prop::collection::vec(mutation(), 1..4), |mutations| {
            let mutant = mutations
                .iter()
                .fold(original.clone(), |text, m| apply(&text, m));
            let validation = catch_unwind(AssertUnwindSafe(|| validate_str(&name, &mutant, &base)))
                .map_err(|_| TestCaseError::fail(format!("validate_str panicked on:\n{mutant}")))?;
            for d in validation.diagnostics.iter() {
                if let Some(problem) = span_problem(d) {
                    return Err(TestCaseError::fail(format!("{problem}\nin:\n{mutant}")));
                }
            }
            Ok(())
        });
        if let Err(e) = result {
            failures.push(format!("{}: {e}", path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} files failed:\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

#[test]
fn unmutated_files_are_clean() {
    // The starting points themselves validate without any diagnostic; otherwise mutations would
    // mostly exercise an already-broken file.
    let mut report = Vec::new();
    for path in seed_files() {
        let validation = weir_engine::validate::validate_file(&path);
        for d in validation.diagnostics.iter() {
            let at = d
                .line_col()
                .map_or_else(String::new, |(l, c)| format!(":{l}:{c}"));
            report.push(format!("{}{at}: {} {}", path.display(), d.code, d.message));
        }
    }
    assert!(
        report.is_empty(),
        "valid files have diagnostics:\n{}",
        report.join("\n")
    );
}
