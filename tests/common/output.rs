//! Reading what a run wrote and comparing it: the committed part files of a file sink
//! (hidden in-progress and pending parts left out), records as canonical JSON lines, and
//! multiset comparison with a failure-free run ([`OutputDiff`], [`assert_exactly_once`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The non-blank lines of `text` as canonical JSON (keys sorted), sorted. A line that is not
/// JSON fails the test.
pub fn canonical_lines(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// As [`canonical_lines`], but a line that is not JSON is kept, marked `NOT JSON: `, so that
/// a torn line shows up in a comparison instead of aborting it.
pub fn canonical_lines_marking_torn(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v) => v.to_string(),
            Err(_) => format!("NOT JSON: {l}"),
        })
        .collect();
    v.sort();
    v
}

/// The committed part files of a file sink directory: every file whose name does not start
/// with a dot. A missing directory has none.
pub fn part_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|e| e.expect("list the sink directory").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| !n.to_string_lossy().starts_with('.'))
        })
        .collect()
}

/// The committed part files of a sink directory, concatenated (a newline after each).
pub fn committed_text(dir: &Path) -> String {
    let mut text = String::new();
    for part in part_files(dir) {
        text.push_str(&std::fs::read_to_string(part).expect("read a part file"));
        text.push('\n');
    }
    text
}

/// The committed output of a file sink directory as sorted canonical JSON lines.
pub fn committed(dir: &Path) -> Vec<String> {
    canonical_lines(&committed_text(dir))
}

/// As [`committed`], keeping torn (non-JSON) lines marked (see
/// [`canonical_lines_marking_torn`]).
pub fn committed_marking_torn(dir: &Path) -> Vec<String> {
    canonical_lines_marking_torn(&committed_text(dir))
}

/// Hidden files (in-progress or pending parts) left in a sink directory.
pub fn hidden_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .count()
    })
}

/// Lines of `a` not matched by a line of `b` (multisets; lines of `b` that `a` lacks are
/// ignored).
pub fn minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for l in b {
        *counts.entry(l).or_default() += 1;
    }
    a.iter()
        .filter(|l| {
            let c = counts.entry(l).or_default();
            *c -= 1;
            *c < 0
        })
        .cloned()
        .collect()
}

/// How a run's output differs from the failure-free run's: records lost and duplicated (or
/// otherwise unexpected), as multisets.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OutputDiff {
    /// In the failure-free output, not (or not as often) in this one.
    pub lost: Vec<String>,
    /// In this output, not (or not as often) in the failure-free one.
    pub extra: Vec<String>,
}

impl OutputDiff {
    /// Compares two outputs (sorted canonical lines or not).
    pub fn of(got: &[String], want: &[String]) -> Self {
        Self {
            lost: minus(want, got),
            extra: minus(got, want),
        }
    }

    /// Whether they are equal.
    pub fn is_empty(&self) -> bool {
        self.lost.is_empty() && self.extra.is_empty()
    }

    /// `N lost (first: ...), M duplicated or unexpected (first: ...)`.
    pub fn describe(&self) -> String {
        format!(
            "{} lost (first: {:?}), {} duplicated or unexpected (first: {:?})",
            self.lost.len(),
            self.lost.iter().take(3).collect::<Vec<_>>(),
            self.extra.len(),
            self.extra.iter().take(3).collect::<Vec<_>>()
        )
    }
}

/// Lines with how often each stands, sorted by line.
pub type Counted = Vec<(String, usize)>;

fn count(lines: &[String]) -> Counted {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for l in lines {
        *counts.entry(l).or_default() += 1;
    }
    counts.into_iter().map(|(l, c)| (l.to_owned(), c)).collect()
}

impl OutputDiff {
    /// `(lost, extra)`, each line with how often it is lost or extra.
    pub fn counted(&self) -> (Counted, Counted) {
        (count(&self.lost), count(&self.extra))
    }
}

/// A long report of counted differences: the totals, then up to 12 lines of each with their
/// counts.
pub fn describe_counted(missing: &[(String, usize)], extra: &[(String, usize)]) -> String {
    use std::fmt::Write as _;
    let total = |v: &[(String, usize)]| v.iter().map(|(_, c)| c).sum::<usize>();
    let mut s = format!(
        "{} records missing ({} distinct), {} records too many ({} distinct)\n",
        total(missing),
        missing.len(),
        total(extra),
        extra.len()
    );
    for (what, v) in [("missing", missing), ("too many", extra)] {
        for (l, c) in v.iter().take(12) {
            let _ = writeln!(s, "  {what} ×{c}: {l}");
        }
        if v.len() > 12 {
            let _ = writeln!(s, "  ... and {} more {what}", v.len() - 12);
        }
    }
    s
}

/// Asserts that `got` equals the failure-free `want` as multisets: 0 lost, 0 duplicated.
pub fn assert_exactly_once(got: &[String], want: &[String], what: &str) {
    let diff = OutputDiff::of(got, want);
    assert!(
        diff.is_empty(),
        "{what}: {} lines, the failure-free run has {}; {}",
        got.len(),
        want.len(),
        diff.describe()
    );
}
