//! Diagnostics: one problem in a pipeline file, with a stable code, a severity, a labelled
//! span in the YAML (or in a script file) and a help line saying how to fix it.
//!
//! Validation never stops at the first problem: every stage pushes into a [`Diagnostics`]
//! list. Rendering is miette's (graphical) or JSON (`weir validate --format json`).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use miette::{LabeledSpan, SourceCode};
use serde::Serialize;

use crate::span::{SourceFile, YamlPath, to_source_span};

/// Every stable diagnostic code, so that editors, CI rules and docs can rely on them.
pub mod codes {
    /// The YAML does not parse.
    pub const YAML_SYNTAX: &str = "weir::yaml::syntax";
    /// The file could not be read.
    pub const IO: &str = "weir::io";
    /// More problems than a report shows; counts the rest.
    pub const TOO_MANY: &str = "weir::too_many";
    /// The file is empty or holds several documents.
    pub const YAML_DOCUMENT: &str = "weir::yaml::document";
    /// A mapping key is not a string.
    pub const YAML_KEY: &str = "weir::yaml::key";
    /// The file is larger than `weir_schema::yaml::MAX_FILE_BYTES`.
    pub const YAML_TOO_LARGE: &str = "weir::yaml::too_large";
    /// The file is not UTF-8 text.
    pub const YAML_ENCODING: &str = "weir::yaml::encoding";
    /// Mappings and sequences nest deeper than `weir_schema::yaml::MAX_DEPTH`.
    pub const YAML_DEPTH: &str = "weir::yaml::depth";
    /// The file holds more values than `weir_schema::yaml::MAX_NODES`.
    pub const YAML_NODES: &str = "weir::yaml::nodes";
    /// Aliases copy more than `weir_schema::yaml::MAX_ALIAS_BYTES`.
    pub const YAML_ALIAS_BUDGET: &str = "weir::yaml::alias_budget";
    /// A field the model does not know.
    pub const UNKNOWN_FIELD: &str = "weir::config::unknown_field";
    /// A required field is missing.
    pub const MISSING_FIELD: &str = "weir::config::missing_field";
    /// A value of the wrong type or outside its allowed values.
    pub const INVALID_VALUE: &str = "weir::config::invalid_value";
    /// An unknown `type:` (or `backend:`, `strategy:`, `kind:`).
    pub const UNKNOWN_TYPE: &str = "weir::config::unknown_type";
    /// A duration that does not parse or is not positive.
    pub const INVALID_DURATION: &str = "weir::config::invalid_duration";
    /// A size that does not parse.
    pub const INVALID_SIZE: &str = "weir::config::invalid_size";
    /// An unsupported file-format version.
    pub const UNSUPPORTED_VERSION: &str = "weir::config::unsupported_version";
    /// Two elements share an id.
    pub const DUPLICATE_ID: &str = "weir::config::duplicate_id";
    /// An id with characters that cannot name directories and state.
    pub const INVALID_ID: &str = "weir::config::invalid_id";
    /// `input`/`inputs` names nothing.
    pub const UNKNOWN_INPUT: &str = "weir::config::unknown_input";
    /// An operator or sink without inputs, or with both `input` and `inputs`.
    pub const BAD_WIRING: &str = "weir::config::bad_wiring";
    /// The operators form a cycle.
    pub const CYCLE: &str = "weir::config::cycle";
    /// A sink that no source reaches.
    pub const UNREACHABLE_SINK: &str = "weir::config::unreachable_sink";
    /// A source or operator whose records reach no sink (warning).
    pub const DEAD_END: &str = "weir::config::dead_end";
    /// A keyed operator not directly after a `key_by`.
    pub const KEYED_WITHOUT_KEY_BY: &str = "weir::config::keyed_without_key_by";
    /// A parallelism above `max_parallelism`, or otherwise impossible.
    pub const PARALLELISM: &str = "weir::config::parallelism";
    /// `exactly_once` with a source that cannot replay.
    pub const NOT_REPLAYABLE: &str = "weir::config::not_replayable";
    /// `exactly_once` with a sink that cannot commit transactionally.
    pub const NOT_TRANSACTIONAL: &str = "weir::config::not_transactional";
    /// A strategy or checkpoint parameter outside its sane range.
    pub const BAD_PARAMETER: &str = "weir::config::bad_parameter";
    /// `failover: individual` (warning).
    pub const LOSSY_FAILOVER: &str = "weir::config::lossy_failover";
    /// `memory` state with crash-recovery expectations (warning).
    pub const VOLATILE_STATE: &str = "weir::config::volatile_state";
    /// An operator kind that needs a script has none, or has both forms.
    pub const SCRIPT_MISSING: &str = "weir::config::script_missing";
    /// A script in a file that cannot be read.
    pub const SCRIPT_FILE: &str = "weir::config::script_file";
    /// A dead-letter target that is not an input-less sink.
    pub const DEAD_LETTER: &str = "weir::config::dead_letter";
    /// A checkpoint storage URL scheme not supported yet.
    pub const UNSUPPORTED_STORAGE: &str = "weir::config::unsupported_storage";
    /// A setting that would have no effect where it is written (`csv:` without `format: csv`,
    /// ...): rejected rather than silently ignored.
    pub const NO_EFFECT: &str = "weir::config::no_effect";
    /// A Rhai script does not compile.
    pub const SCRIPT_SYNTAX: &str = "weir::script::syntax";
    /// A Rhai script lacks the function its operator needs.
    pub const SCRIPT_MISSING_FUNCTION: &str = "weir::script::missing_function";
    /// A Rhai script defines an entry point its operator never calls (`fn on_timer` outside a
    /// `process`), or one with the wrong number of parameters.
    pub const SCRIPT_MISPLACED_FUNCTION: &str = "weir::script::misplaced_function";
    /// At run time: a script read a field the record does not have.
    pub const SCRIPT_MISSING_FIELD: &str = "weir::script::missing_field";
    /// At run time: an operator or function applied to values of types that do not go
    /// together (`"u1" + 1`, `x < ()`).
    pub const SCRIPT_TYPE_MISMATCH: &str = "weir::script::type_mismatch";
    /// At run time: no function of that name takes arguments of these types.
    pub const SCRIPT_FUNCTION_NOT_FOUND: &str = "weir::script::function_not_found";
    /// At run time: a script reached a sandbox limit (`limits:`).
    pub const SCRIPT_LIMIT: &str = "weir::script::limit";
    /// At run time: any other script failure (`throw`, an index out of range, a division by
    /// zero).
    pub const SCRIPT_RUNTIME: &str = "weir::script::runtime";
    /// An operator option that does not fit its kind (aggregations without field, ...).
    pub const OPERATOR_OPTION: &str = "weir::config::operator_option";
    /// An event-time `window` downstream of sources without `event_time`: no watermark would
    /// ever close its windows.
    pub const NO_EVENT_TIME: &str = "weir::config::no_event_time";
    /// A `${VAR}` names an environment variable that is not set (and has no default), or a
    /// `${VAR:?message}` found it unset or empty.
    pub const ENV_UNDEFINED: &str = "weir::env::undefined";
    /// A `${...}` reference that is not well formed (`${`, `${1A}`, `${VAR:x}`).
    pub const ENV_SYNTAX: &str = "weir::env::syntax";
}

/// How bad a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The file may run, but probably not as meant. Fails `validate` only with
    /// `--deny-warnings`.
    Warning,
    /// The file cannot run.
    Error,
}

/// One problem, located in a source file.
#[derive(Clone, Debug)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// A stable code from [`codes`].
    pub code: &'static str,
    /// One sentence: what is wrong.
    pub message: String,
    /// The file the span points into (the pipeline YAML or a script file).
    pub file: Option<Arc<SourceFile>>,
    /// Byte range of the offending text.
    pub span: Option<Range<usize>>,
    /// Text under the span.
    pub label: String,
    /// How to fix it.
    pub help: Option<String>,
    /// The config path of the offending node, when it has one.
    pub path: Option<YamlPath>,
    /// Secondary labels (for example where a duplicate id was first defined).
    pub related: Vec<(Range<usize>, String)>,
}

impl Diagnostic {
    /// A new error.
    pub fn error(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, message)
    }

    /// A new warning.
    pub fn warning(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, code, message)
    }

    fn new(severity: Severity, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            severity,
            code,
            message: message.into(),
            file: None,
            span: None,
            label: String::new(),
            help: None,
            path: None,
            related: Vec::new(),
        }
    }

    /// Points the diagnostic at a byte range of a file.
    pub fn at(mut self, file: &Arc<SourceFile>, span: Range<usize>) -> Self {
        let len = file.text.len();
        let start = span.start.min(len);
        self.span = Some(start..span.end.clamp(start, len));
        self.file = Some(Arc::clone(file));
        self
    }

    /// Records the config path.
    pub fn with_path(mut self, path: YamlPath) -> Self {
        self.path = Some(path);
        self
    }

    /// Sets the label under the span.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Sets the help line.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds a secondary label in the same file.
    pub fn related(mut self, span: Range<usize>, label: impl Into<String>) -> Self {
        self.related.push((span, label.into()));
        self
    }

    /// Whether this is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// 1-based line and column of the span start, if located.
    pub fn line_col(&self) -> Option<(usize, usize)> {
        match (&self.file, &self.span) {
            (Some(f), Some(s)) => Some(f.line_col(s.start)),
            _ => None,
        }
    }

    /// The machine-readable form printed by `weir validate --format json`.
    pub fn to_json(&self) -> JsonDiagnostic {
        let (line, column) = self.line_col().unzip();
        let (end_line, end_column) = match (&self.file, &self.span) {
            (Some(f), Some(s)) => {
                let (l, c) = f.line_col(s.end);
                (Some(l), Some(c))
            }
            _ => (None, None),
        };
        JsonDiagnostic {
            severity: self.severity,
            code: self.code,
            message: self.message.clone(),
            file: self.file.as_ref().map(|f| f.name.clone()),
            line,
            column,
            end_line,
            end_column,
            offset: self.span.as_ref().map(|s| s.start),
            length: self.span.as_ref().map(|s| s.end - s.start),
            label: (!self.label.is_empty()).then(|| self.label.clone()),
            help: self.help.clone(),
            path: self.path.as_ref().map(ToString::to_string),
        }
    }
}

/// The JSON shape of a diagnostic (stable; editors and CI parse it).
#[derive(Clone, Debug, Serialize)]
pub struct JsonDiagnostic {
    /// `error` or `warning`.
    pub severity: Severity,
    /// Stable code.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
    /// File name.
    pub file: Option<String>,
    /// 1-based start line.
    pub line: Option<usize>,
    /// 1-based start column (characters).
    pub column: Option<usize>,
    /// 1-based end line.
    pub end_line: Option<usize>,
    /// 1-based end column.
    pub end_column: Option<usize>,
    /// Byte offset of the span.
    pub offset: Option<usize>,
    /// Byte length of the span.
    pub length: Option<usize>,
    /// Label under the span.
    pub label: Option<String>,
    /// How to fix it.
    pub help: Option<String>,
    /// Config path (`pipelines[0].operators[2].inputs[0]`).
    pub path: Option<String>,
}

/// The longest line a rendered snippet may show (in characters). miette pads labels with
/// `{:width$}`, which panics beyond 65 535 columns, and a megabyte line helps nobody: a
/// diagnostic whose snippet would hold a longer line is rendered without its snippet, its
/// position written into the message instead.
const MAX_SNIPPET_LINE: usize = 4096;

/// Context lines the renderers show around a label (`with_context_lines(2)`), plus a margin.
const SNIPPET_CONTEXT_LINES: usize = 3;

impl Diagnostic {
    /// Whether every line a rendered snippet would show is short enough to render.
    fn snippet_fits(&self) -> bool {
        let Some(file) = &self.file else {
            return true;
        };
        let text: &str = &file.text;
        let spans = self.span.iter().chain(self.related.iter().map(|(s, _)| s));
        spans.into_iter().all(|span| {
            let start = floor_boundary(text, span.start.min(text.len()));
            let end = floor_boundary(text, span.end.clamp(start, text.len()));
            // From the start of the first context line to the end of the last one.
            let mut from = start;
            for _ in 0..=SNIPPET_CONTEXT_LINES {
                from = text[..from].rfind('\n').unwrap_or(0);
            }
            let mut to = end;
            for _ in 0..=SNIPPET_CONTEXT_LINES {
                to = text[to..].find('\n').map_or(text.len(), |i| to + i + 1);
            }
            text[from..to].split('\n').all(|line| {
                line.len() <= MAX_SNIPPET_LINE || line.chars().count() <= MAX_SNIPPET_LINE
            })
        })
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if !self.snippet_fits()
            && let (Some(file), Some((line, col))) = (&self.file, self.line_col())
        {
            write!(
                f,
                " (at {}:{line}:{col}; the line is too long to show)",
                file.name
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

impl miette::Diagnostic for Diagnostic {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        if !self.snippet_fits() {
            return None;
        }
        self.file.as_ref().map(|f| &**f as &dyn SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if !self.snippet_fits() {
            return None;
        }
        let span = self.span.as_ref()?;
        let primary = LabeledSpan::new_primary_with_span(
            (!self.label.is_empty()).then(|| self.label.clone()),
            to_source_span(span),
        );
        let related = self
            .related
            .iter()
            .map(|(s, l)| LabeledSpan::new_with_span(Some(l.clone()), to_source_span(s)));
        Some(Box::new(std::iter::once(primary).chain(related)))
    }
}

impl SourceCode for SourceFile {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let inner =
            self.text
                .as_ref()
                .read_span(span, context_lines_before, context_lines_after)?;
        Ok(Box::new(
            miette::MietteSpanContents::new_named(
                self.name.clone(),
                inner.data(),
                *inner.span(),
                inner.line(),
                inner.column(),
                inner.line_count(),
            )
            .with_language("yaml"),
        ))
    }
}

/// Every diagnostic found in one validation pass.
#[derive(Clone, Debug, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one.
    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }

    /// Whether any is an error.
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }

    /// Number of errors.
    pub fn error_count(&self) -> usize {
        self.0.iter().filter(|d| d.is_error()).count()
    }

    /// Number of warnings.
    pub fn warning_count(&self) -> usize {
        self.0.len() - self.error_count()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterates in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }

    /// Sorts by file position (errors and warnings interleaved as they appear in the file).
    pub fn sort(&mut self) {
        self.0.sort_by_key(|d| {
            (
                d.file.as_ref().map(|f| f.name.clone()),
                d.span.as_ref().map_or(0, |s| s.start),
                d.severity,
            )
        });
    }

    /// Moves every diagnostic of `other` in.
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }

    /// Keeps the first `max` diagnostics and replaces the rest by one that counts them (an
    /// error when any of them was). Rendering a diagnostic reads the file up to its span, so
    /// a hostile file with tens of thousands of problems would take minutes to report.
    pub fn truncate_to(&mut self, max: usize) {
        if self.0.len() <= max {
            return;
        }
        let rest = self.0.split_off(max);
        let errors = rest.iter().filter(|d| d.is_error()).count();
        let warnings = rest.len() - errors;
        let message = format!(
            "{} more problems are not shown ({errors} errors, {warnings} warnings)",
            rest.len()
        );
        let summary = if errors > 0 {
            Diagnostic::error(codes::TOO_MANY, message)
        } else {
            Diagnostic::warning(codes::TOO_MANY, message)
        };
        let summary = match rest.iter().find_map(|d| d.file.clone().zip(d.span.clone())) {
            Some((file, span)) => summary.at(&file, span).label("the first one not shown"),
            None => summary,
        };
        self.0
            .push(summary.help("fix the problems shown, then validate again"));
    }
}

/// The most diagnostics a file reports (see [`Diagnostics::truncate_to`]).
pub const MAX_REPORTED: usize = 200;

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Suggests the closest candidate to `word` (Jaro-Winkler ≥ 0.8), for "did you mean" help.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(d: &Diagnostic) -> String {
        let handler =
            miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
                .with_context_lines(2);
        let mut out = String::new();
        handler.render_report(&mut out, d).expect("renders");
        out
    }

    #[test]
    fn a_label_far_along_a_long_line_renders_without_its_snippet() {
        // miette's label padding panics past 65 535 columns.
        let text = format!("version: 1\nx: [{}oops]\n", "1, ".repeat(30_000));
        let file = Arc::new(SourceFile::new("long.yaml", text.clone()));
        let at = text.find("oops").expect("oops");
        let d = Diagnostic::error(codes::INVALID_VALUE, "bad value")
            .at(&file, at..at + 4)
            .label("here")
            .help("fix it");
        let out = render(&d);
        assert!(out.contains("bad value (at long.yaml:2:90005"), "{out}");
        assert!(out.contains("fix it"), "{out}");
        assert!(out.len() < 1000, "{out}");
        // A short line keeps its snippet and its plain message.
        let file = Arc::new(SourceFile::new("short.yaml", "version: 1\nx: oops\n"));
        let d = Diagnostic::error(codes::INVALID_VALUE, "bad value")
            .at(&file, 14..18)
            .label("here");
        let out = render(&d);
        assert!(out.contains("x: oops") && out.contains("here"), "{out}");
        assert_eq!(d.to_string(), "bad value");
    }

    #[test]
    fn a_long_report_is_cut_with_a_count_of_the_rest() {
        let file = Arc::new(SourceFile::new("t.yaml", "a: 1\n".repeat(500)));
        let mut all = Diagnostics::new();
        for i in 0..300 {
            let d = if i % 3 == 0 {
                Diagnostic::warning(codes::DEAD_END, format!("w{i}"))
            } else {
                Diagnostic::error(codes::INVALID_VALUE, format!("e{i}"))
            };
            all.push(d.at(&file, i * 5..i * 5 + 1));
        }
        all.truncate_to(MAX_REPORTED);
        assert_eq!(all.0.len(), MAX_REPORTED + 1);
        let last = all.0.last().expect("a summary");
        assert_eq!(last.code, codes::TOO_MANY);
        assert!(last.is_error());
        assert_eq!(
            last.message,
            "100 more problems are not shown (67 errors, 33 warnings)"
        );
        assert_eq!(last.line_col(), Some((201, 1)));
    }
}
