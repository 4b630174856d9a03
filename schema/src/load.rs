//! Loading a pipeline file: YAML text → span-indexed node tree → JSON Schema check → typed
//! [`FileSpec`].
//!
//! One YAML parser (saphyr) reads the file; its marked tree gives every node a byte span, and
//! the same tree is converted to the JSON value that the schema check and serde both see, so
//! the two can never disagree about what the file says. Each stage collects every problem it
//! finds; a later stage runs only if the earlier ones found no error (a typed parse of a file
//! that fails the schema would only repeat the schema's findings, worse).

use std::path::Path;
use std::sync::Arc;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use crate::diagnostic::{Diagnostic, Diagnostics, codes};
use crate::model::FileSpec;
use crate::span::{Node, NodeValue, PathSeg, SourceFile, SpanIndex, YamlPath};

/// The result of loading one file: whatever could be read, plus every problem found.
#[derive(Debug)]
pub struct LoadedFile {
    /// The file's text and name.
    pub source: Arc<SourceFile>,
    /// Spans of every node, when the YAML parsed.
    pub spans: Option<SpanIndex>,
    /// The typed model, when the YAML parsed and matched the schema.
    pub spec: Option<FileSpec>,
    /// Problems found while loading (syntax, schema, types).
    pub diagnostics: Diagnostics,
}

/// Reads and loads a pipeline file from disk.
pub fn load_file(path: &Path) -> LoadedFile {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mut source = SourceFile::new(name, text);
            source.path = Some(path.to_path_buf());
            load_source(Arc::new(source))
        }
        Err(e) => {
            let source = Arc::new(SourceFile::new(name.clone(), ""));
            let mut diagnostics = Diagnostics::new();
            diagnostics.push(
                Diagnostic::error(codes::IO, format!("cannot read `{name}`: {e}"))
                    .help("check the path and that the file is readable"),
            );
            LoadedFile {
                source,
                spans: None,
                spec: None,
                diagnostics,
            }
        }
    }
}

/// Loads a pipeline file from text (for tests and editors).
pub fn load_str(name: &str, text: &str) -> LoadedFile {
    load_source(Arc::new(SourceFile::new(name, text)))
}

/// Loads an already-read source file.
pub fn load_source(source: Arc<SourceFile>) -> LoadedFile {
    let mut diagnostics = Diagnostics::new();
    let spans = parse_yaml(&source, &mut diagnostics);
    let mut loaded = LoadedFile {
        source,
        spans,
        spec: None,
        diagnostics,
    };
    let Some(spans) = &loaded.spans else {
        return loaded;
    };
    if loaded.diagnostics.has_errors() {
        return loaded;
    }
    let mut value = spans.root().to_json();
    let schema_problems = crate::schema::check(&value, spans, &loaded.source);
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
        return loaded;
    }
    match serde_path_to_error::deserialize::<_, FileSpec>(value) {
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
                    .at(&loaded.source, spans.span(&path))
                    .label("invalid value")
                    .help(help)
                    .with_path(path),
            );
        }
    }
    loaded
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
    let text = &source.text;
    let docs = match MarkedYaml::load_from_str(text) {
        Ok(docs) => docs,
        Err(e) => {
            let offsets = CharOffsets::new(text);
            let mut at = offsets.byte(e.marker().index());
            // saphyr marks where it started scanning the token; point at the tab itself.
            if e.info().contains("tab")
                && let Some(tab) = text[at..]
                    .find('\t')
                    .map(|i| at + i)
                    .or_else(|| text.find('\t'))
            {
                at = tab;
            }
            let end = next_char_end(text, at);
            diagnostics.push(
                Diagnostic::error(
                    codes::YAML_SYNTAX,
                    format!("YAML syntax error: {}", e.info()),
                )
                .at(source, at..end)
                .label(e.info().to_owned())
                .help(syntax_help(e.info())),
            );
            return None;
        }
    };
    match docs.len() {
        0 => {
            diagnostics.push(
                Diagnostic::error(codes::YAML_DOCUMENT, "the file is empty")
                    .at(source, 0..0)
                    .help("start with `version: 1` and a `pipelines:` list; `weir schema` prints the full format"),
            );
            return None;
        }
        1 => {}
        n => {
            let offsets = CharOffsets::new(text);
            let second = offsets.byte(docs[1].span.start.index());
            diagnostics.push(
                Diagnostic::error(
                    codes::YAML_DOCUMENT,
                    format!("the file holds {n} YAML documents; Weir reads one"),
                )
                .at(source, second..next_char_end(text, second))
                .label("a second document starts here")
                .help("put every pipeline under one `pipelines:` list, or split the file"),
            );
            return None;
        }
    }
    let offsets = CharOffsets::new(text);
    let root = convert(&docs[0], &offsets, source, diagnostics);
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

fn syntax_help(info: &str) -> String {
    if info.contains("tab") {
        "YAML indents with spaces only; replace the tab characters".to_owned()
    } else if info.contains("duplicated key") {
        "each key may appear once per mapping; remove or rename one of them".to_owned()
    } else if info.contains("':'")
        || info.contains("indentation")
        || info.contains("mapping values")
    {
        "check the indentation and that every `[`, `{` and quote opened before this point is closed"
            .to_owned()
    } else {
        "fix the YAML syntax at this point; `weir validate` checks the rest once it parses"
            .to_owned()
    }
}

fn next_char_end(text: &str, at: usize) -> usize {
    text[at.min(text.len())..]
        .chars()
        .next()
        .map_or(at, |c| at + c.len_utf8())
}

/// Maps saphyr's character indices to byte offsets.
struct CharOffsets {
    bytes: Vec<usize>,
}

impl CharOffsets {
    fn new(text: &str) -> Self {
        let mut bytes: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
        bytes.push(text.len());
        Self { bytes }
    }

    fn byte(&self, char_index: usize) -> usize {
        self.bytes
            .get(char_index)
            .copied()
            .unwrap_or_else(|| self.bytes.last().copied().unwrap_or(0))
    }
}

fn convert(
    node: &MarkedYaml<'_>,
    offsets: &CharOffsets,
    source: &Arc<SourceFile>,
    diagnostics: &mut Diagnostics,
) -> Node {
    let mut span = offsets.byte(node.span.start.index())..offsets.byte(node.span.end.index());
    let value = match &node.data {
        YamlData::Value(s) => NodeValue::Scalar(scalar_to_json(s)),
        YamlData::Representation(text, _, _) => {
            NodeValue::Scalar(serde_json::Value::String(text.to_string()))
        }
        YamlData::Sequence(items) => NodeValue::Seq(
            items
                .iter()
                .map(|i| convert(i, offsets, source, diagnostics))
                .collect(),
        ),
        YamlData::Mapping(map) => {
            let mut entries = Vec::with_capacity(map.len());
            for (k, v) in map.iter() {
                let key_span = offsets.byte(k.span.start.index())..offsets.byte(k.span.end.index());
                let key = match &k.data {
                    YamlData::Value(Scalar::String(s)) => s.to_string(),
                    YamlData::Value(other) => {
                        // Numbers and booleans as keys are legal YAML; use their text.
                        match scalar_to_json(other) {
                            serde_json::Value::String(s) => s,
                            j => j.to_string(),
                        }
                    }
                    _ => {
                        diagnostics.push(
                            Diagnostic::error(
                                codes::YAML_KEY,
                                "mapping keys must be plain strings",
                            )
                            .at(source, key_span.clone())
                            .label("complex key")
                            .help("write the key as a plain word, such as `id:`"),
                        );
                        continue;
                    }
                };
                entries.push((key, key_span, convert(v, offsets, source, diagnostics)));
            }
            NodeValue::Map(entries)
        }
        YamlData::Tagged(_, inner) => return convert(inner, offsets, source, diagnostics),
        YamlData::Alias(_) | YamlData::BadValue => {
            diagnostics.push(
                Diagnostic::error(codes::YAML_SYNTAX, "this value cannot be read")
                    .at(source, span.clone())
                    .label("unresolved alias or malformed value")
                    .help("write the value out in full"),
            );
            NodeValue::Scalar(serde_json::Value::Null)
        }
    };
    if span.end < span.start {
        span.end = span.start;
    }
    // Trim trailing whitespace and newlines so labels sit on the text, not on the next line.
    let text = &source.text;
    while span.end > span.start
        && text
            .as_bytes()
            .get(span.end - 1)
            .is_some_and(|b| b.is_ascii_whitespace())
    {
        span.end -= 1;
    }
    Node { span, value }
}

fn scalar_to_json(s: &Scalar<'_>) -> serde_json::Value {
    match s {
        Scalar::Null => serde_json::Value::Null,
        Scalar::Boolean(b) => serde_json::Value::Bool(*b),
        Scalar::Integer(i) => serde_json::Value::from(*i),
        Scalar::FloatingPoint(f) => serde_json::Number::from_f64(f.into_inner())
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Scalar::String(s) => serde_json::Value::String(s.to_string()),
    }
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
}
