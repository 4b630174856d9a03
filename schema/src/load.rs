//! Loading a pipeline file: YAML text → span-indexed node tree → JSON Schema check → typed
//! [`FileSpec`].
//!
//! One YAML parser (saphyr's event parser, driven by [`crate::yaml`] within fixed limits) reads
//! the file into a tree that gives every node a byte span, and the same tree is converted to
//! the JSON value that the schema check and serde both see, so the two can never disagree
//! about what the file says. Each stage collects every problem it
//! finds; a later stage runs only if the earlier ones found no error (a typed parse of a file
//! that fails the schema would only repeat the schema's findings, worse).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::diagnostic::{Diagnostic, Diagnostics, codes};
use crate::interpolate::{Env, Secrets};
use crate::model::FileSpec;
use crate::span::{Node, NodeValue, PathSeg, SourceFile, SpanIndex, YamlPath};
use crate::yaml::{Document, MAX_FILE_BYTES};

/// The result of loading one file: whatever could be read, plus every problem found.
#[derive(Debug)]
pub struct LoadedFile {
    /// The file's text and name.
    pub source: Arc<SourceFile>,
    /// Spans of every node, when the YAML parsed.
    pub spans: Option<SpanIndex>,
    /// The typed model, when the YAML parsed and matched the schema.
    pub spec: Option<FileSpec>,
    /// Problems found while loading (syntax, `${VAR}` references, schema, types).
    pub diagnostics: Diagnostics,
    /// Values that came from `${secret:...}` references, to redact wherever they would be
    /// shown (already done in `diagnostics`).
    pub secrets: Secrets,
}

/// Reads and loads a pipeline file from disk: a regular file of at most
/// [`MAX_FILE_BYTES`](crate::yaml::MAX_FILE_BYTES), read without ever holding more than that
/// (a device such as `/dev/zero` or a growing file is refused, not read until memory runs
/// out).
pub fn load_file(path: &Path) -> LoadedFile {
    let name = path.display().to_string();
    match read_bounded(path) {
        Ok(bytes) => load_bytes_from(&name, bytes, Some(path)),
        Err((code, message, help)) => {
            let mut diagnostics = Diagnostics::new();
            diagnostics.push(Diagnostic::error(code, message).help(help));
            unread(SourceFile::new(name, ""), diagnostics)
        }
    }
}

/// Why a file Weir reads (a pipeline file, a script file) could not be read: a diagnostic
/// code, the message and a help line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    /// [`codes::IO`] or [`codes::YAML_TOO_LARGE`] (or [`codes::YAML_ENCODING`] from
    /// [`read_text`]).
    pub code: &'static str,
    /// What went wrong, naming the file.
    pub message: String,
    /// How to fix it.
    pub help: String,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ReadError {}

impl From<(&'static str, String, String)> for ReadError {
    fn from((code, message, help): (&'static str, String, String)) -> Self {
        Self {
            code,
            message,
            help,
        }
    }
}

/// Reads a UTF-8 text file that a pipeline file references (a `script_file:`) within the
/// same limits as a pipeline file: a regular file of at most
/// [`MAX_FILE_BYTES`](crate::yaml::MAX_FILE_BYTES), never read further than that, so that a
/// reference to a device or a huge file is an error, not a runaway allocation.
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = read_bounded(path).map_err(ReadError::from)?;
    String::from_utf8(bytes).map_err(|e| ReadError {
        code: codes::YAML_ENCODING,
        message: format!(
            "`{}` is not UTF-8 text: byte {} is not valid UTF-8",
            path.display(),
            e.utf8_error().valid_up_to()
        ),
        help: "save the file as UTF-8".to_owned(),
    })
}

/// Reads at most [`MAX_FILE_BYTES`](crate::yaml::MAX_FILE_BYTES) + 1 bytes of a regular file.
fn read_bounded(path: &Path) -> Result<Vec<u8>, (&'static str, String, String)> {
    let name = path.display();
    let unreadable = |e: std::io::Error| {
        (
            codes::IO,
            format!("cannot read `{name}`: {e}"),
            "check the path and that the file is readable".to_owned(),
        )
    };
    // Looked at before opening: opening a FIFO would block until something writes to it.
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    check_file_type(path, &meta)?;
    let file = std::fs::File::open(path).map_err(unreadable)?;
    check_file_type(path, &file.metadata().map_err(unreadable)?)?;
    let limit = MAX_FILE_BYTES as u64;
    let too_large = |size: String| {
        (
            codes::YAML_TOO_LARGE,
            format!(
                "`{name}` is {size}; pipeline files may be at most {} ({limit} bytes)",
                crate::yaml::human_bytes(MAX_FILE_BYTES)
            ),
            "split the file, or check that the path names the right file".to_owned(),
        )
    };
    if meta.len() > limit {
        return Err(too_large(format!("{} bytes", meta.len())));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(
            "larger than that (it grew while being read)".to_owned(),
        ));
    }
    Ok(bytes)
}

fn check_file_type(
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<(), (&'static str, String, String)> {
    if meta.is_file() {
        return Ok(());
    }
    let what = if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file (a device, pipe or socket)"
    };
    Err((
        codes::IO,
        format!("`{}` is {what}", path.display()),
        "pass the path of a regular file (a pipeline YAML file, a Rhai script)".to_owned(),
    ))
}

fn unread(source: SourceFile, diagnostics: Diagnostics) -> LoadedFile {
    LoadedFile {
        source: Arc::new(source),
        spans: None,
        spec: None,
        diagnostics,
        secrets: Secrets::default(),
    }
}

/// Loads a pipeline file from its bytes: bytes that are not UTF-8 are reported at the first
/// bad byte, a text longer than [`MAX_FILE_BYTES`](crate::yaml::MAX_FILE_BYTES) is refused.
pub fn load_bytes(name: &str, bytes: Vec<u8>) -> LoadedFile {
    load_bytes_from(name, bytes, None)
}

fn load_bytes_from(name: &str, bytes: Vec<u8>, path: Option<&Path>) -> LoadedFile {
    let source = |text: String| {
        let mut source = SourceFile::new(name, text);
        source.path = path.map(Path::to_path_buf);
        Arc::new(source)
    };
    match String::from_utf8(bytes) {
        Ok(text) => load_source(source(text)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            // The lossy text keeps every byte offset up to the bad byte, which becomes U+FFFD.
            let source = source(String::from_utf8_lossy(e.as_bytes()).into_owned());
            let mut diagnostics = Diagnostics::new();
            diagnostics.push(
                Diagnostic::error(
                    codes::YAML_ENCODING,
                    format!("the file is not UTF-8 text: byte {at} is not valid UTF-8"),
                )
                .at(&source, at..crate::yaml::next_char_end(&source.text, at))
                .label("not UTF-8")
                .help("save the file as UTF-8 (YAML files are UTF-8 text)"),
            );
            LoadedFile {
                source,
                spans: None,
                spec: None,
                diagnostics,
                secrets: Secrets::default(),
            }
        }
    }
}

/// Loads a pipeline file from text (for tests and editors).
pub fn load_str(name: &str, text: &str) -> LoadedFile {
    load_source(Arc::new(SourceFile::new(name, text)))
}

/// Loads an already-read source file, expanding `${VAR}` references from the process
/// environment. Every path that loads a pipeline file ends here, so the limits of
/// [`crate::yaml`] and the expansion of [`crate::interpolate`] hold for all of them.
pub fn load_source(source: Arc<SourceFile>) -> LoadedFile {
    let loaded = load_source_with_env(source, &crate::interpolate::process_env);
    crate::interpolate::remember(&loaded.secrets);
    loaded
}

/// [`load_source`] with `${VAR}` references looked up in `env` instead of the process
/// environment.
pub fn load_source_with_env(source: Arc<SourceFile>, env: Env<'_>) -> LoadedFile {
    let mut loaded = load_expanded(source, env);
    let secrets = std::mem::take(&mut loaded.secrets);
    secrets.redact_diagnostics(&mut loaded.diagnostics);
    loaded.secrets = secrets;
    loaded
}

fn load_expanded(source: Arc<SourceFile>, env: Env<'_>) -> LoadedFile {
    let mut diagnostics = Diagnostics::new();
    if source.text.len() > MAX_FILE_BYTES {
        diagnostics.push(
            Diagnostic::error(
                codes::YAML_TOO_LARGE,
                format!(
                    "the file is {} bytes; pipeline files may be at most {} ({MAX_FILE_BYTES} bytes)",
                    source.text.len(),
                    crate::yaml::human_bytes(MAX_FILE_BYTES)
                ),
            )
            .at(&source, MAX_FILE_BYTES..MAX_FILE_BYTES)
            .label("the limit is reached here")
            .help("split the file, or check that the path names the pipeline file"),
        );
        return LoadedFile {
            source,
            spans: None,
            spec: None,
            diagnostics,
            secrets: Secrets::default(),
        };
    }
    let mut spans = parse_yaml(&source, &mut diagnostics);
    let mut secrets = Secrets::default();
    if let Some(spans) = &mut spans
        && !diagnostics.has_errors()
    {
        secrets = crate::interpolate::expand_tree(spans.root_mut(), &source, env, &mut diagnostics);
    }
    let (spec, diagnostics) = typed(&source, spans.as_ref(), diagnostics, |value, spans| {
        crate::schema::check(value, spans, &source)
    });
    LoadedFile {
        source,
        spans,
        spec,
        diagnostics,
        secrets,
    }
}

/// Loads another kind of YAML document (a `weir test` file) the way pipeline files are
/// loaded: the same parser and limits, then `check` (its schema), then serde into `T`, each
/// problem a located diagnostic. Returns the spans (when the YAML parsed), the typed value
/// (when everything matched) and the diagnostics.
pub fn load_document<T: serde::de::DeserializeOwned>(
    source: &Arc<SourceFile>,
    check: impl FnOnce(&serde_json::Value, &SpanIndex) -> Diagnostics,
) -> (Option<SpanIndex>, Option<T>, Diagnostics) {
    let mut diagnostics = Diagnostics::new();
    if source.text.len() > MAX_FILE_BYTES {
        diagnostics.push(
            Diagnostic::error(codes::YAML_TOO_LARGE, "the file is too large")
                .at(source, MAX_FILE_BYTES..MAX_FILE_BYTES)
                .help("split the file"),
        );
        return (None, None, diagnostics);
    }
    let spans = parse_yaml(source, &mut diagnostics);
    let (value, diagnostics) = typed(source, spans.as_ref(), diagnostics, check);
    (spans, value, diagnostics)
}

/// The schema and serde stages of loading: nothing when the YAML did not parse or had errors.
fn typed<T: serde::de::DeserializeOwned>(
    source: &Arc<SourceFile>,
    spans: Option<&SpanIndex>,
    diagnostics: Diagnostics,
    check: impl FnOnce(&serde_json::Value, &SpanIndex) -> Diagnostics,
) -> (Option<T>, Diagnostics) {
    struct Loaded<'a, T> {
        source: &'a Arc<SourceFile>,
        spec: Option<T>,
        diagnostics: Diagnostics,
    }
    let mut loaded = Loaded {
        source,
        spec: None,
        diagnostics,
    };
    let Some(spans) = spans else {
        return (None, loaded.diagnostics);
    };
    // A YAML error, or a `${VAR}` that could not be expanded: the values are not known, so a
    // schema check would only report the same places again, worse.
    if loaded.diagnostics.has_errors() {
        return (None, loaded.diagnostics);
    }
    let mut value = spans.root().to_json();
    let schema_problems = check(&value, spans);
    // Unknown fields (typos, misplaced keys) do not stop the semantic checks: they are reported,
    // then left out, so that one pass also finds dangling inputs, cycles and script errors.
    let only_unknown_fields = schema_problems
        .iter()
        .filter(|d| d.is_error())
        .all(|d| d.code == codes::UNKNOWN_FIELD);
    if only_unknown_fields {
        for d in schema_problems
            .iter()
            .filter(|d| d.code == codes::UNKNOWN_FIELD)
        {
            if let Some(path) = &d.path {
                remove_at(&mut value, path);
            }
        }
    }
    let failed = schema_problems.has_errors();
    loaded.diagnostics.extend(schema_problems);
    if failed && !only_unknown_fields {
        return (None, loaded.diagnostics);
    }
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(spec) => loaded.spec = Some(spec),
        Err(e) => {
            let message = e.inner().to_string();
            // Inside a tagged enum serde loses the path below the element; find the offending
            // value (quoted in the message) among the element's scalars.
            let path = serde_path(e.path());
            let path = offending_value(&message)
                .and_then(|v| find_scalar(spans, &path, v))
                .unwrap_or(path);
            let code = if message.contains("duration") {
                codes::INVALID_DURATION
            } else if message.contains("size") {
                codes::INVALID_SIZE
            } else {
                codes::INVALID_VALUE
            };
            let (headline, help) = match message.split_once("; ") {
                Some((a, b)) => (a.to_owned(), b.to_owned()),
                None => (
                    message.clone(),
                    "see `weir schema` for the allowed values".to_owned(),
                ),
            };
            loaded.diagnostics.push(
                Diagnostic::error(code, format!("{path}: {headline}"))
                    .at(loaded.source, spans.span(&path))
                    .label("invalid value")
                    .help(help)
                    .with_path(path),
            );
        }
    }
    (loaded.spec, loaded.diagnostics)
}

/// Removes the mapping entry at `path` from a JSON value, if it exists.
fn remove_at(value: &mut serde_json::Value, path: &YamlPath) {
    let Some((PathSeg::Key(last), parent)) = path.0.split_last() else {
        return;
    };
    let target = parent.iter().try_fold(value, |v, seg| match seg {
        PathSeg::Key(k) => v.get_mut(k),
        PathSeg::Index(i) => v.get_mut(*i),
    });
    if let Some(serde_json::Value::Object(map)) = target {
        map.remove(last);
    }
}

/// The first backquoted value in a message, such as `10 parsecs`.
fn offending_value(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

/// The path of the first scalar below `at` whose text is `value`.
fn find_scalar(spans: &SpanIndex, at: &YamlPath, value: &str) -> Option<YamlPath> {
    fn walk(node: &Node, path: &YamlPath, value: &str) -> Option<YamlPath> {
        match &node.value {
            NodeValue::Scalar(serde_json::Value::String(s)) if s == value => Some(path.clone()),
            NodeValue::Scalar(_) => None,
            NodeValue::Seq(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, n)| walk(n, &path.join(i), value)),
            NodeValue::Map(entries) => entries
                .iter()
                .find_map(|(k, _, n)| walk(n, &path.join(k.as_str()), value)),
        }
    }
    walk(spans.node(at)?, at, value)
}

fn serde_path(p: &serde_path_to_error::Path) -> YamlPath {
    use serde_path_to_error::Segment;
    YamlPath(
        p.iter()
            .filter_map(|s| match s {
                Segment::Seq { index } => Some(PathSeg::Index(*index)),
                Segment::Map { key } => Some(PathSeg::Key(key.clone())),
                Segment::Enum { .. } | Segment::Unknown => None,
            })
            .collect(),
    )
}

/// Parses YAML into a span-indexed tree, reporting syntax and document-shape problems.
fn parse_yaml(source: &Arc<SourceFile>, diagnostics: &mut Diagnostics) -> Option<SpanIndex> {
    let root = match crate::yaml::read(source, diagnostics) {
        Document::One(root) => root,
        Document::Empty => {
            diagnostics.push(
                Diagnostic::error(codes::YAML_DOCUMENT, "the file is empty")
                    .at(source, 0..0)
                    .help("start with `version: 1` and a `pipelines:` list; `weir schema` prints the full format"),
            );
            return None;
        }
        Document::Stopped => return None,
    };
    if !matches!(root.value, NodeValue::Map(_)) {
        diagnostics.push(
            Diagnostic::error(
                codes::YAML_DOCUMENT,
                "the file must be a mapping with `version` and `pipelines`",
            )
            .at(source, root.span.clone())
            .label("expected a mapping")
            .help("start with `version: 1` and a `pipelines:` list"),
        );
    }
    Some(SpanIndex::new(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_point_at_nodes_in_bytes() {
        let text = "# ördérs ✓\nversion: 1\npipelines:\n  - id: p\n";
        let loaded = load_str("t.yaml", text);
        let spans = loaded.spans.expect("parses");
        let path = YamlPath::root().join("pipelines").join(0).join("id");
        assert_eq!(&text[spans.span(&path)], "p");
        assert_eq!(
            &text[spans.key_span(&YamlPath::root().join("version"))],
            "version"
        );
    }

    #[test]
    fn syntax_error_is_located() {
        let loaded = load_str("t.yaml", "version: 1\npipelines: [\n");
        let d = &loaded.diagnostics.0[0];
        assert_eq!(d.code, codes::YAML_SYNTAX);
        assert!(d.span.is_some());
    }

    use crate::yaml::{MAX_DEPTH, MAX_NODES};

    /// Runs `f` on a thread with a 256 KiB stack: a file too deep is refused before any
    /// recursion, so even a stack 8 times smaller than any thread Weir loads files on (tokio's
    /// blocking threads have 2 MiB, the main thread 8 MiB) never overflows.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        on_stack(256 * 1024, f)
    }

    fn on_stack<T: Send + 'static>(bytes: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(bytes)
            .spawn(f)
            .expect("spawn")
            .join()
            .expect("loading must not overflow or panic")
    }

    fn codes_of(loaded: &LoadedFile) -> Vec<&'static str> {
        loaded.diagnostics.iter().map(|d| d.code).collect()
    }

    /// The one diagnostic with `code`, with its 1-based line and column.
    fn only(loaded: &LoadedFile, code: &str) -> (Diagnostic, (usize, usize)) {
        let found: Vec<&Diagnostic> = loaded
            .diagnostics
            .iter()
            .filter(|d| d.code == code)
            .collect();
        assert_eq!(found.len(), 1, "{:#?}", loaded.diagnostics);
        let d = found[0].clone();
        assert!(d.help.is_some(), "{d:#?}");
        let at = d.line_col().expect("located");
        (d, at)
    }

    #[test]
    fn deep_block_sequences_are_a_depth_diagnostic_on_a_small_stack() {
        // The reproduction: 40 KB, 20 000 nested block sequences.
        let text = format!("x:\n{}z\n", "- ".repeat(20_000));
        let loaded = on_small_stack(move || load_str("deep.yaml", &text));
        let (d, at) = only(&loaded, codes::YAML_DEPTH);
        // The root mapping is level 1, the first `- ` level 2: level 257 is the 256th `- `.
        assert_eq!(at, (2, 2 * (MAX_DEPTH - 1) + 1), "{d:#?}");
        assert!(
            d.message.contains("deeper than 256 levels"),
            "{}",
            d.message
        );
        assert!(loaded.spans.is_none() && loaded.spec.is_none());
    }

    #[test]
    fn deep_flow_collections_and_mappings_are_depth_diagnostics_on_a_small_stack() {
        let cases = [
            format!("x: {}{}\n", "[".repeat(20_000), "]".repeat(20_000)),
            format!("x: {}1{}\n", "{a: ".repeat(20_000), "}".repeat(20_000)),
            format!("x: {}1{}\n", "[{a: ".repeat(10_000), "}]".repeat(10_000)),
            // Block mappings, each indented one more space.
            (0..2_000).fold(String::new(), |mut s, i| {
                s.push_str(&" ".repeat(i));
                s.push_str("a:\n");
                s
            }),
            // A flow sequence inside 200 block levels: saphyr's own flow bound and ours meet.
            format!(
                "x:\n{}{}{}\n",
                "- ".repeat(200),
                "[".repeat(300),
                "]".repeat(300)
            ),
        ];
        for text in cases {
            let shown = text[..60.min(text.len())].to_owned();
            let loaded = on_small_stack(move || load_str("deep.yaml", &text));
            assert_eq!(
                codes_of(&loaded),
                vec![codes::YAML_DEPTH],
                "{shown}…: {:#?}",
                loaded.diagnostics
            );
        }
    }

    #[test]
    fn a_file_at_the_depth_limit_loads_on_a_small_stack() {
        // Root mapping (level 1), then 255 flow levels: exactly the limit. The unknown field
        // takes the whole tree through JSON conversion, the schema check and serde.
        let text = format!(
            "version: 1\npipelines: []\nx: {}1{}\n",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        let loaded = on_stack(512 * 1024, move || load_str("limit.yaml", &text));
        assert!(
            !codes_of(&loaded).contains(&codes::YAML_DEPTH),
            "{:#?}",
            loaded.diagnostics
        );
        assert!(loaded.spans.is_some());
        assert!(codes_of(&loaded).contains(&codes::UNKNOWN_FIELD));
        // Block nesting to the limit, through a sequence of mappings.
        let mut text = String::from("version: 1\npipelines: []\nx:\n");
        for i in 0..MAX_DEPTH - 2 {
            text.push_str(&"  ".repeat(i + 1));
            text.push_str("- \n");
        }
        text.push_str(&"  ".repeat(MAX_DEPTH));
        text.push_str("1\n");
        let loaded = on_stack(512 * 1024, move || load_str("limit.yaml", &text));
        assert!(
            !codes_of(&loaded).contains(&codes::YAML_DEPTH),
            "{:#?}",
            loaded.diagnostics
        );
    }

    #[test]
    fn aliases_count_towards_the_depth() {
        // Each anchor wraps the previous alias one level deeper: 240 + 20 levels.
        let mut text = format!("a0: &a0 {}1{}\n", "[".repeat(240), "]".repeat(240));
        for i in 1..=20 {
            text.push_str(&format!("a{i}: &a{i} [*a{}]\n", i - 1));
        }
        let loaded = on_stack(512 * 1024, move || load_str("alias.yaml", &text));
        let (d, (line, _)) = only(&loaded, codes::YAML_DEPTH);
        // a15 would nest 1 (root) + 15 + 240 = 256 levels, a16 257.
        assert_eq!(line, 17, "{d:#?}");
    }

    #[test]
    fn alias_expansion_is_bounded_in_bytes() {
        // The reproduction: a 100 KB string through 4 levels of 10 aliases (4 GB).
        let mut text = format!("s: &s \"{}\"\n", "x".repeat(100_000));
        let mut prev = "s".to_owned();
        for level in 1..=4 {
            let refs = vec![format!("*{prev}"); 10].join(", ");
            text.push_str(&format!("l{level}: &l{level} [{refs}]\n"));
            prev = format!("l{level}");
        }
        let loaded = on_small_stack(move || load_str("bomb.yaml", &text));
        let (d, (line, _)) = only(&loaded, codes::YAML_ALIAS_BUDGET);
        // Level 1 copies 1 MB, level 2 would copy 10 MB: the budget runs out on line 3.
        assert_eq!(line, 3, "{d:#?}");
        assert!(d.message.contains("4 MiB"), "{}", d.message);
        assert!(loaded.spans.is_none());

        // Many small nodes weigh too: the budget counts each node's size, not only text.
        let mut text = String::from("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n");
        for level in 0..6 {
            let prev = if level == 0 {
                "a".to_owned()
            } else {
                format!("b{}", level - 1)
            };
            let refs = vec![format!("*{prev}"); 10].join(", ");
            text.push_str(&format!("b{level}: &b{level} [{refs}]\n"));
        }
        // Under 1 KiB of text, with no string longer than two characters.
        assert!(text.len() < 1024, "{}", text.len());
        let loaded = load_str("laughs.yaml", &text);
        only(&loaded, codes::YAML_ALIAS_BUDGET);
    }

    #[test]
    fn aliases_within_the_budget_copy_their_anchor() {
        let text = "base: &b {x: 1, y: [a, b]}\nitems: [&s one, *s, *b]\nother: *b\nk: {*s : v}\n";
        let loaded = load_str("t.yaml", text);
        assert!(
            loaded
                .diagnostics
                .iter()
                .all(|d| d.code == codes::YAML_DOCUMENT
                    || d.code == codes::UNKNOWN_FIELD
                    || d.code == codes::MISSING_FIELD),
            "{:#?}",
            loaded.diagnostics
        );
        let spans = loaded.spans.expect("parses");
        let json = spans.root().to_json();
        assert_eq!(json["other"], serde_json::json!({"x": 1, "y": ["a", "b"]}));
        assert_eq!(
            json["items"],
            serde_json::json!(["one", "one", {"x": 1, "y": ["a", "b"]}])
        );
        assert_eq!(json["k"], serde_json::json!({"one": "v"}));
        // The copy is located at the alias.
        let other = YamlPath::root().join("other");
        assert_eq!(&text[spans.span(&other)], "*b");
        // Anchors nested in anchors resolve to their own node.
        let text = "a: &outer [&inner [&deep [1]], 2]\nb: [*inner, *deep, *outer]\n";
        let json = load_str("t.yaml", text)
            .spans
            .expect("parses")
            .root()
            .to_json();
        assert_eq!(json["b"], serde_json::json!([[[1]], [1], [[[1]], 2]]));
    }

    #[test]
    fn values_past_the_limit_are_a_diagnostic_at_the_first_one_too_many() {
        // Two bytes per value: a 2 MB file, far under the size limit, would otherwise take
        // about a hundred bytes per value once loaded.
        let text = format!("x: [{}0]\n", "0,".repeat(MAX_NODES));
        assert!(text.len() < MAX_FILE_BYTES / 4);
        let loaded = load_str("many.yaml", &text);
        let (d, at) = only(&loaded, codes::YAML_NODES);
        // Values 1..3 are the root mapping, the key `x` and the sequence; the scalars follow.
        assert_eq!(at, (1, 5 + 2 * (MAX_NODES - 3)), "{}", d.message);
        assert!(
            d.message.contains("more than 1000000 values"),
            "{}",
            d.message
        );
        assert!(loaded.spans.is_none());
        // One value fewer: the file loads (and fails only on its content).
        let text = format!("x: [{}0]\n", "0,".repeat(MAX_NODES - 4));
        let loaded = load_str("many.yaml", &text);
        assert!(!codes_of(&loaded).contains(&codes::YAML_NODES));
        assert!(loaded.spans.is_some());
    }

    #[test]
    fn every_duplicate_key_is_reported_with_the_first() {
        let text = "version: 1\npipelines: []\nx: {a: 1, b: 2, a: 3}\ny:\n  b: 1\n  b: 2\n";
        let loaded = load_str("t.yaml", text);
        let dups: Vec<&Diagnostic> = loaded
            .diagnostics
            .iter()
            .filter(|d| d.code == codes::YAML_SYNTAX)
            .collect();
        assert_eq!(dups.len(), 2, "{:#?}", loaded.diagnostics);
        assert_eq!(dups[0].line_col(), Some((3, 17)));
        assert_eq!(
            dups[0].related[0].0,
            text.find("a: 1").expect("a")..text.find("a: 1").expect("a") + 1
        );
        assert_eq!(dups[1].line_col(), Some((6, 3)));
        assert!(loaded.spec.is_none());
    }

    #[test]
    fn bytes_that_are_not_utf8_are_located() {
        let mut bytes = b"version: 1\npipelines:\n  - id: caf".to_vec();
        bytes.extend_from_slice(&[0xe9, b'\n']);
        let loaded = load_bytes("t.yaml", bytes);
        let (d, at) = only(&loaded, codes::YAML_ENCODING);
        assert_eq!(at, (3, 12), "{d:#?}");
        assert!(d.message.contains("byte 33"), "{}", d.message);
    }

    #[test]
    fn oversized_text_is_refused_before_parsing() {
        let text = format!("x: [{}]\n", "1,".repeat(MAX_FILE_BYTES / 2));
        let loaded = load_str("big.yaml", &text);
        let (d, _) = only(&loaded, codes::YAML_TOO_LARGE);
        assert_eq!(d.span, Some(MAX_FILE_BYTES..MAX_FILE_BYTES));
        assert!(d.message.contains("16 MiB"), "{}", d.message);
    }

    #[test]
    fn files_are_read_within_the_limit_and_only_when_regular() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A directory.
        let loaded = load_file(dir.path());
        let d = &loaded.diagnostics.0[0];
        assert_eq!(d.code, codes::IO);
        assert!(d.message.contains("is a directory"), "{}", d.message);
        // A device that never ends: refused without reading.
        let loaded = load_file(Path::new("/dev/zero"));
        let d = &loaded.diagnostics.0[0];
        assert_eq!(d.code, codes::IO);
        assert!(d.message.contains("not a regular file"), "{}", d.message);
        // One byte over the limit.
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES + 1]).expect("write");
        let loaded = load_file(&big);
        let d = &loaded.diagnostics.0[0];
        assert_eq!(d.code, codes::YAML_TOO_LARGE, "{d:#?}");
        assert!(d.message.contains("16 MiB"), "{}", d.message);
        // A missing file.
        let loaded = load_file(&dir.path().join("missing.yaml"));
        assert_eq!(loaded.diagnostics.0[0].code, codes::IO);
        // A readable one keeps its path for relative references.
        let ok = dir.path().join("ok.yaml");
        std::fs::write(&ok, "version: 1\npipelines: []\n").expect("write");
        let loaded = load_file(&ok);
        assert_eq!(loaded.source.path.as_deref(), Some(ok.as_path()));
    }
}
