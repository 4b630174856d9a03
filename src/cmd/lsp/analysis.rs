//! What `weir lsp` answers about one open document: its diagnostics (exactly `weir
//! validate`'s, from the same function), hover text, completions and the definition of an
//! input id. Functions of the document's URI and text (and of the files it names: script
//! files, a CSV source's header), so the server loop stays a dispatcher and these are
//! unit-tested without a client.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lsp_types::{
    CompletionItem, CompletionItemKind, CompletionTextEdit, DiagnosticRelatedInformation,
    DiagnosticSeverity, Documentation, Hover, HoverContents, Location, MarkupContent, MarkupKind,
    NumberOrString, Range, TextEdit, Uri,
};
use serde_json::Value;
use weir_engine::script_api::{ENTRY_POINTS, HOST_FUNCTIONS};
use weir_engine::validate::validate_str;
use weir_schema::{Diagnostic, Severity, SourceFile, SpanIndex};

use super::outline::{Context, Outline, Seg, flow_items, word_at, word_before};
use super::schema_nav::{Candidates, ValueInfo};
use super::text::LineIndex;

/// What a document is, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A pipeline file: everything `weir validate` checks, and the editor features.
    Pipeline,
    /// A test file (`*.test.yaml`): YAML syntax only, until the test-file validator exists.
    Test,
    /// Not YAML (a `.rhai` script a client sent along, ...): nothing to say about it.
    Other,
}

/// An open document: its URI and text.
#[derive(Clone, Copy, Debug)]
pub struct Doc<'a> {
    /// The document's URI.
    pub uri: &'a Uri,
    /// Its current text.
    pub text: &'a str,
}

impl Doc<'_> {
    /// The file's path, for a `file:` URI.
    fn path(&self) -> Option<PathBuf> {
        file_path(self.uri)
    }

    /// The name diagnostics use: the path, or the URI.
    fn name(&self) -> String {
        self.path()
            .map_or_else(|| self.uri.as_str().to_owned(), |p| p.display().to_string())
    }

    /// Where relative paths (`script_file`, source paths) resolve: the file's directory.
    fn base_dir(&self) -> PathBuf {
        self.path()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// Pipeline, test file, or neither: by the name's ending; a name without an extension
    /// (an unsaved buffer) counts as a pipeline file.
    pub fn kind(&self) -> Kind {
        let name = self.uri.as_str();
        let name = name.split(['?', '#']).next().unwrap_or(name);
        let file = name.rsplit('/').next().unwrap_or(name);
        if file.ends_with(".test.yaml") || file.ends_with(".test.yml") {
            Kind::Test
        } else if file.ends_with(".yaml") || file.ends_with(".yml") || !file.contains('.') {
            Kind::Pipeline
        } else {
            Kind::Other
        }
    }
}

/// The local path of a `file:` URI (percent-decoded), if it is one.
pub fn file_path(uri: &Uri) -> Option<PathBuf> {
    let s = uri.as_str();
    let rest = s.strip_prefix("file://")?;
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    // `file://host/path`: only the local host (empty or `localhost`) names a local file.
    let path = match rest.find('/') {
        Some(0) => rest,
        Some(i) if &rest[..i] == "localhost" => &rest[i..],
        _ => return None,
    };
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out).into_owned()))
}

/// A `file:` URI for a local path (what related information about a script file points to).
fn file_uri(path: &Path) -> Option<Uri> {
    let mut s = String::from("file://");
    for b in path.display().to_string().bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s.parse().ok()
}

// ---- diagnostics ---------------------------------------------------------------------------

/// The document's diagnostics: for a pipeline file exactly those of `weir validate` (same
/// function, codes and messages), each help line and related label carried into the message.
pub fn diagnostics(doc: Doc<'_>) -> Vec<lsp_types::Diagnostic> {
    match doc.kind() {
        Kind::Pipeline => {
            let v = validate_str(&doc.name(), doc.text, &doc.base_dir());
            let index = LineIndex::new(doc.text);
            v.diagnostics
                .iter()
                .map(|d| to_lsp(d, doc, &v.source, v.spans.as_ref(), &index))
                .collect()
        }
        Kind::Other => Vec::new(),
        Kind::Test => {
            let index = LineIndex::new(doc.text);
            let source = Arc::new(SourceFile::new(doc.name(), doc.text));
            test_file_diagnostics(doc)
                .iter()
                .map(|d| to_lsp(d, doc, &source, None, &index))
                .collect()
        }
    }
}

/// The diagnostics of a test file: those of `weir test`'s loader (YAML, the test-file
/// schema, types), at their places in the file. Whether the names it uses exist in the
/// pipeline file under test is checked by `weir test` itself, which reads that file.
fn test_file_diagnostics(doc: Doc<'_>) -> Vec<Diagnostic> {
    weir_schema::test_file::load_test_str(&doc.name(), doc.text)
        .diagnostics
        .into_iter()
        .collect()
}

/// The JSON Schema that hover and completion walk for a document of this kind.
fn schema_of(kind: Kind) -> Option<&'static Value> {
    match kind {
        Kind::Pipeline => Some(weir_schema::schema::json_schema()),
        Kind::Test => Some(weir_schema::test_file::test_json_schema()),
        Kind::Other => None,
    }
}

fn to_lsp(
    d: &Diagnostic,
    doc: Doc<'_>,
    source: &Arc<SourceFile>,
    spans: Option<&SpanIndex>,
    index: &LineIndex<'_>,
) -> lsp_types::Diagnostic {
    let here = d
        .file
        .as_ref()
        .is_none_or(|f| Arc::ptr_eq(f, source) || f.name == source.name);
    let mut message = d.message.clone();
    let mut related = Vec::new();
    let range = if here {
        d.span
            .as_ref()
            .map_or_else(Range::default, |s| index.range(s))
    } else {
        // In a script file: shown at the `script_file:` that names it, pointing there too.
        if let (Some(f), Some(s)) = (&d.file, &d.span) {
            let (line, col) = f.line_col(s.start);
            message = format!("{}:{line}:{col}: {message}", f.name);
            let other = LineIndex::new(&f.text);
            if let Some(uri) = f.path.as_deref().and_then(file_uri) {
                related.push(DiagnosticRelatedInformation {
                    location: Location::new(uri, other.range(s)),
                    message: if d.label.is_empty() {
                        d.message.clone()
                    } else {
                        d.label.clone()
                    },
                });
            }
        }
        match (spans, &d.path) {
            (Some(spans), Some(path)) => index.range(&spans.span(path)),
            _ => Range::default(),
        }
    };
    if let Some(help) = &d.help {
        message.push_str("\nhelp: ");
        message.push_str(help);
    }
    for (span, label) in &d.related {
        let at = index.range(span);
        message.push_str(&format!(
            "\n{label}: line {}, column {}",
            at.start.line + 1,
            at.start.character + 1
        ));
        related.push(DiagnosticRelatedInformation {
            location: Location::new(doc.uri.clone(), at),
            message: label.clone(),
        });
    }
    lsp_types::Diagnostic {
        range,
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
        }),
        code: Some(NumberOrString::String(d.code.to_owned())),
        source: Some("weir".to_owned()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        ..lsp_types::Diagnostic::default()
    }
}

// ---- schema at a place in the outline ------------------------------------------------------

/// The schemas describing the node of `entry` (`None`: the root), walking from the root
/// with each mapping's written `type:` selecting its branch.
fn candidates_for(
    o: &Outline<'_>,
    schema: &'static Value,
    entry: Option<usize>,
) -> Candidates<'static> {
    let mut chain = Vec::new();
    let mut at = entry;
    while let Some(i) = at {
        chain.push(i);
        at = o.entries[i].parent;
    }
    let mut c = Candidates::root(schema);
    for &i in chain.iter().rev() {
        let parent = o.entries[i].parent;
        c = c.child(&o.entries[i].seg, &|k| o.child_value(parent, k));
    }
    c
}

/// The children of an entry that is there; none for one that is not (never the root's).
fn below(o: &Outline<'_>, entry: Option<usize>) -> Vec<usize> {
    entry.map(|e| o.children(Some(e))).unwrap_or_default()
}

fn key_of<'o>(o: &'o Outline<'_>, entry: usize) -> Option<&'o str> {
    match &o.entries[entry].seg {
        Seg::Key(k) => Some(k),
        Seg::Index(_) => None,
    }
}

/// Whether the value of `entry` names an upstream element (`input:`, an item of `inputs:`).
fn is_input(o: &Outline<'_>, entry: usize) -> bool {
    match &o.entries[entry].seg {
        Seg::Key(k) => k == "input" || k == "inputs",
        Seg::Index(_) => o.entries[entry]
            .parent
            .and_then(|p| key_of(o, p))
            .is_some_and(|k| k == "inputs"),
    }
}

/// The `pipelines[i]` item an entry sits in.
fn pipeline_of(o: &Outline<'_>, entry: usize) -> Option<usize> {
    let mut at = Some(entry);
    while let Some(i) = at {
        let parent = o.entries[i].parent;
        if let Some(p) = parent
            && o.entries[p].parent.is_none()
            && key_of(o, p) == Some("pipelines")
        {
            return Some(i);
        }
        at = parent;
    }
    None
}

/// An element (source, operator, sink) of a pipeline: its section, id and the id's range.
struct Element {
    section: &'static str,
    id: String,
    id_range: std::ops::Range<usize>,
    entry: usize,
}

fn elements(o: &Outline<'_>, pipeline: usize) -> Vec<Element> {
    let mut out = Vec::new();
    for section in ["sources", "operators", "sinks"] {
        for item in below(o, o.child(Some(pipeline), section)) {
            if let Some(id) = o.child(Some(item), "id")
                && let (Some(v), Some(r)) = (o.value(id), o.entries[id].value.clone())
            {
                out.push(Element {
                    section,
                    id: v,
                    id_range: r,
                    entry: item,
                });
            }
        }
    }
    out
}

/// The element item (a `sources`/`operators`/`sinks` entry) an entry sits in.
fn element_of(o: &Outline<'_>, entry: usize) -> Option<usize> {
    let pipeline = pipeline_of(o, entry)?;
    let mut at = Some(entry);
    while let Some(i) = at {
        if let Some(p) = o.entries[i].parent
            && o.entries[p].parent == Some(pipeline)
        {
            return Some(i);
        }
        at = o.entries[i].parent;
    }
    None
}

/// The input id under the cursor: its text and range (an `input:` value, an `inputs` item,
/// an item of a flow `inputs: [a, b]`, or a `dead_letter:` target).
fn reference_at(
    o: &Outline<'_>,
    text: &str,
    offset: usize,
) -> Option<(usize, String, std::ops::Range<usize>)> {
    let Context::Value { entry, range } = o.context(offset) else {
        return None;
    };
    let dead_letter = key_of(o, entry) == Some("dead_letter");
    if !(is_input(o, entry) || dead_letter) || range.is_empty() {
        return None;
    }
    flow_items(text, range)
        .into_iter()
        .find(|(_, r)| r.start <= offset && offset <= r.end)
        .map(|(id, r)| (entry, id, r))
}

// ---- hover ---------------------------------------------------------------------------------

fn markdown(value: String, range: Range) -> Hover {
    Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value,
        }),
        range: Some(range),
    }
}

/// The hover at byte `offset`: the schema's description of the key (or of the chosen
/// `type:`/enum value), or the script API entry of a function name in a script.
pub fn hover(doc: Doc<'_>, offset: usize) -> Option<Hover> {
    let schema = schema_of(doc.kind())?;
    let pipeline = doc.kind() == Kind::Pipeline;
    let text = doc.text;
    let o = Outline::new(text);
    let index = LineIndex::new(text);
    match o.context(offset) {
        Context::Key {
            entry: Some(e),
            mapping,
            ..
        } => {
            let key = key_of(&o, e)?.to_owned();
            let c = candidates_for(&o, schema, Some(e));
            let described = c.description().or_else(|| {
                // A discriminator: the description of the branch it selects.
                let value = o.value(e)?;
                branch_description(&o, schema, mapping, &key, &value)
            })?;
            Some(markdown(
                format!("**`{key}`**\n\n{described}"),
                index.range(&o.entries[e].key_range),
            ))
        }
        Context::Value { entry, range } => {
            if pipeline && key_of(&o, entry) == Some("script") {
                return script_hover(&o, text, entry, offset, &index);
            }
            if pipeline
                && let Some((_, id, r)) = reference_at(&o, text, offset)
                && let Some(target) = pipeline_of(&o, entry)
                    .and_then(|p| elements(&o, p).into_iter().find(|e| e.id == id))
            {
                let kind = target.section.trim_end_matches('s');
                let ty = o
                    .child_value(Some(target.entry), "type")
                    .map_or_else(String::new, |t| format!(" (`{t}`)"));
                let line = index.position(target.id_range.start).line + 1;
                return Some(markdown(
                    format!("**`{id}`**: the {kind}{ty} defined on line {line}"),
                    index.range(&r),
                ));
            }
            let value = o.value(entry)?;
            let key = key_of(&o, entry).map(str::to_owned);
            let parent = o.entries[entry].parent;
            let described = key
                .as_deref()
                .and_then(|k| branch_description(&o, schema, parent, k, &value))
                .or_else(|| {
                    candidates_for(&o, schema, Some(entry))
                        .values()
                        .into_iter()
                        .find(|v| v.value == value)
                        .and_then(|v| v.description)
                })
                .or_else(|| candidates_for(&o, schema, Some(entry)).description())?;
            Some(markdown(
                format!("**`{value}`**\n\n{described}"),
                index.range(&range),
            ))
        }
        Context::Block { entry } if pipeline => script_hover(&o, text, entry, offset, &index),
        _ => None,
    }
}

/// The description of the `oneOf` branch that `key: value` selects in the mapping `mapping`.
fn branch_description(
    o: &Outline<'_>,
    schema: &'static Value,
    mapping: Option<usize>,
    key: &str,
    value: &str,
) -> Option<String> {
    candidates_for(o, schema, mapping)
        .discriminator_values(key)
        .into_iter()
        .find(|v| v.value == value)
        .and_then(|v| v.description)
}

fn script_hover(
    o: &Outline<'_>,
    text: &str,
    entry: usize,
    offset: usize,
    index: &LineIndex<'_>,
) -> Option<Hover> {
    let word = word_at(text, offset);
    let name = &text[word.clone()];
    if name.is_empty() {
        return None;
    }
    let operator = o.child_value(o.entries[entry].parent, "type");
    // `fn key(r)` defines the entry point; `key()` elsewhere calls the host function.
    let defined = text[..word.start].trim_end().ends_with("fn");
    let host = HOST_FUNCTIONS.iter().find(|f| {
        f.name == name
            && !defined
            && operator.as_deref().is_none_or(|op| {
                f.operators.contains(&op) || !ENTRY_POINTS.iter().any(|e| e.name == name)
            })
    });
    let doc = if let Some(f) = host {
        format!(
            "```rhai\n{}({}) -> {}\n```\n{}\n\n**Errors:** {}\n\n**Operators:** {}\n\n```rhai\n{}\n```",
            f.name,
            f.params.join(", "),
            f.returns,
            f.meaning,
            f.errors,
            f.operators.join(", "),
            f.example
        )
    } else {
        let mut entries = ENTRY_POINTS.iter().filter(|e| e.name == name);
        let e = match &operator {
            Some(op) => ENTRY_POINTS
                .iter()
                .find(|e| e.name == name && e.operator == op)
                .or_else(|| entries.next()),
            None => entries.next(),
        }?;
        format!(
            "```rhai\nfn {}({})\n```\n{} ({} of `{}`)\n\n**Errors:** {}\n\n```rhai\n{}\n```",
            e.name,
            e.params.join(", "),
            e.meaning,
            if e.required { "required" } else { "optional" },
            e.operator,
            e.errors,
            e.example
        )
    };
    Some(markdown(doc, index.range(&word)))
}

// ---- completion ----------------------------------------------------------------------------

fn item(
    label: String,
    kind: CompletionItemKind,
    description: Option<String>,
    insert: String,
    range: Range,
) -> CompletionItem {
    CompletionItem {
        label,
        kind: Some(kind),
        documentation: description.map(|d| {
            Documentation::MarkupContent(MarkupContent {
                kind: MarkupKind::Markdown,
                value: d,
            })
        }),
        text_edit: Some(CompletionTextEdit::Edit(TextEdit::new(range, insert))),
        ..CompletionItem::default()
    }
}

/// The completions at byte `offset`: keys the schema allows in the mapping there, values of a
/// `type:` (and of other enumerated fields), input ids, record field names, and the script
/// API in scripts. `trigger` is the character whose typing asked (`:`, `.`, `[`), if any: each
/// asks only where it starts something (a value, a field, a list of ids), so that typing it
/// elsewhere (a `:` in a script's map literal) opens no list.
pub fn completion(doc: Doc<'_>, offset: usize, trigger: Option<&str>) -> Vec<CompletionItem> {
    let Some(schema) = schema_of(doc.kind()) else {
        return Vec::new();
    };
    let text = doc.text;
    let o = Outline::new(text);
    let index = LineIndex::new(text);
    let context = o.context(offset);
    let script = match &context {
        Context::Block { .. } => true,
        Context::Value { entry, .. } => key_of(&o, *entry) == Some("script"),
        _ => false,
    };
    let wanted = match trigger {
        None => true,
        Some(".") => script,
        Some(":" | "[") => matches!(context, Context::Value { .. }) && !script,
        Some(_) => false,
    };
    if !wanted {
        return Vec::new();
    }
    match context {
        Context::Key {
            mapping,
            entry,
            range,
        } => {
            let range = index.range(&range);
            let colon = entry.is_some_and(|e| o.entries[e].colon);
            key_items(&o, schema, mapping, entry, range, colon)
        }
        Context::Value { entry, range } => {
            value_items(&o, schema, doc, entry, range, offset, &index)
        }
        Context::Block { entry } if doc.kind() == Kind::Pipeline => {
            script_items(&o, doc, entry, offset, &index)
        }
        Context::Block { .. } | Context::None => Vec::new(),
    }
}

fn key_items(
    o: &Outline<'_>,
    schema: &'static Value,
    mapping: Option<usize>,
    entry: Option<usize>,
    range: Range,
    colon: bool,
) -> Vec<CompletionItem> {
    let present: Vec<usize> = o.children(mapping);
    candidates_for(o, schema, mapping)
        .keys(&|k| o.child_value(mapping, k))
        .into_iter()
        .filter(|k| {
            !present.iter().any(|&c| {
                Some(c) != entry
                    && o.entries[c].colon
                    && matches!(&o.entries[c].seg, Seg::Key(x) if *x == k.name)
            })
        })
        .map(|k| {
            let insert = if colon {
                k.name.clone()
            } else {
                format!("{}: ", k.name)
            };
            item(
                k.name,
                CompletionItemKind::PROPERTY,
                k.description,
                insert,
                range,
            )
        })
        .collect()
}

fn value_items(
    o: &Outline<'_>,
    schema: &'static Value,
    doc: Doc<'_>,
    entry: usize,
    range: std::ops::Range<usize>,
    offset: usize,
    index: &LineIndex<'_>,
) -> Vec<CompletionItem> {
    let text = doc.text;
    let key = key_of(o, entry).map(str::to_owned);
    let parent = o.entries[entry].parent;
    let pipeline = doc.kind() == Kind::Pipeline;
    if pipeline && key.as_deref() == Some("script") {
        return script_items(o, doc, entry, offset, index);
    }
    // The item of a flow sequence under the cursor, or the whole value.
    let range = if range.is_empty() {
        range
    } else {
        flow_items(text, range.clone())
            .into_iter()
            .map(|(_, r)| r)
            .find(|r| r.start <= offset && offset <= r.end)
            .unwrap_or_else(|| {
                let w = word_before(text, offset);
                if w.is_empty() { offset..offset } else { w }
            })
    };
    let lsp_range = index.range(&range);
    // Right after `key:` a value needs a space before it.
    let pad = if range.is_empty() && text[..offset].ends_with(':') {
        " "
    } else {
        ""
    };
    let value_item = |label: String, kind, description, detail: Option<String>| {
        let mut it = item(
            label.clone(),
            kind,
            description,
            format!("{pad}{label}"),
            lsp_range,
        );
        it.detail = detail;
        it
    };
    if pipeline && (is_input(o, entry) || key.as_deref() == Some("dead_letter")) {
        let Some(pipeline) = pipeline_of(o, entry) else {
            return Vec::new();
        };
        let own = element_of(o, entry);
        let sinks = key.as_deref() == Some("dead_letter");
        return elements(o, pipeline)
            .into_iter()
            .filter(|e| Some(e.entry) != own)
            .filter(|e| (e.section == "sinks") == sinks)
            .map(|e| {
                let kind = e.section.trim_end_matches('s');
                let detail = match o.child_value(Some(e.entry), "type") {
                    Some(t) => format!("{kind} ({t})"),
                    None => kind.to_owned(),
                };
                value_item(e.id, CompletionItemKind::REFERENCE, None, Some(detail))
            })
            .collect();
    }
    if pipeline
        && matches!(key.as_deref(), Some("field" | "key_field"))
        && let Some(pipeline) = pipeline_of(o, entry)
    {
        return known_fields(o, doc, pipeline)
            .into_iter()
            .map(|f| value_item(f, CompletionItemKind::FIELD, None, None))
            .collect();
    }
    let mut values: Vec<ValueInfo> = match key.as_deref() {
        Some(k @ ("type" | "backend" | "strategy" | "kind")) => {
            candidates_for(o, schema, parent).discriminator_values(k)
        }
        _ => Vec::new(),
    };
    let here = candidates_for(o, schema, Some(entry));
    if values.is_empty() {
        values = here.values();
    }
    let mut out: Vec<CompletionItem> = values
        .into_iter()
        .map(|v| {
            value_item(
                v.value,
                CompletionItemKind::ENUM_MEMBER,
                v.description,
                None,
            )
        })
        .collect();
    // `- ` in a sequence of mappings: the item's first key.
    if key.is_none() && here.is_object() {
        out.extend(key_items(o, schema, Some(entry), None, lsp_range, false));
    }
    out
}

fn script_items(
    o: &Outline<'_>,
    doc: Doc<'_>,
    entry: usize,
    offset: usize,
    index: &LineIndex<'_>,
) -> Vec<CompletionItem> {
    let text = doc.text;
    let word = word_before(text, offset);
    let range = index.range(&word);
    if text[..word.start].ends_with('.') {
        let Some(pipeline) = pipeline_of(o, entry) else {
            return Vec::new();
        };
        return known_fields(o, doc, pipeline)
            .into_iter()
            .map(|f| item(f.clone(), CompletionItemKind::FIELD, None, f, range))
            .collect();
    }
    let operator = o.child_value(o.entries[entry].parent, "type");
    let mut out: Vec<CompletionItem> = HOST_FUNCTIONS
        .iter()
        .filter(|f| {
            operator
                .as_deref()
                .is_none_or(|op| f.operators.contains(&op))
        })
        .map(|f| {
            let mut it = item(
                f.name.to_owned(),
                CompletionItemKind::FUNCTION,
                Some(f.meaning.to_owned()),
                f.name.to_owned(),
                range,
            );
            it.detail = Some(format!(
                "{}({}) -> {}",
                f.name,
                f.params.join(", "),
                f.returns
            ));
            it
        })
        .collect();
    out.extend(
        ENTRY_POINTS
            .iter()
            .filter(|e| operator.as_deref().is_none_or(|op| e.operator == op))
            .map(|e| {
                let mut it = item(
                    e.name.to_owned(),
                    CompletionItemKind::FUNCTION,
                    Some(e.meaning.to_owned()),
                    format!("fn {}({})", e.name, e.params.join(", ")),
                    range,
                );
                it.detail = Some(format!(
                    "fn {}({}) (entry point)",
                    e.name,
                    e.params.join(", ")
                ));
                it
            }),
    );
    out
}

/// Record field names the pipeline can know without running: a generator's `fields:`, the
/// header (CSV) or first object (JSON lines) of a file source's file, keys of `#{...}`
/// literals and fields assigned (`r.f = ...`) in its scripts, and aggregation outputs.
fn known_fields(o: &Outline<'_>, doc: Doc<'_>, pipeline: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |f: String| {
        if !f.is_empty() && !out.contains(&f) {
            out.push(f);
        }
    };
    for source in below(o, o.child(Some(pipeline), "sources")) {
        for f in below(o, o.child(Some(source), "fields")) {
            if let Some(k) = key_of(o, f) {
                add(k.to_owned());
            }
        }
        if o.child_value(Some(source), "type").as_deref() == Some("file")
            && let Some(path) = o.child_value(Some(source), "path")
        {
            let csv = o.child_value(Some(source), "format").as_deref() == Some("csv");
            let csv_options = o.child(Some(source), "csv");
            let header = csv_options
                .and_then(|c| o.child_value(Some(c), "header"))
                .as_deref()
                != Some("false");
            let delimiter = csv_options
                .and_then(|c| o.child_value(Some(c), "delimiter"))
                .and_then(|d| d.chars().next())
                .unwrap_or(',');
            for f in first_line_fields(&doc.base_dir().join(path), csv, header, delimiter) {
                add(f);
            }
        }
    }
    for op in below(o, o.child(Some(pipeline), "operators")) {
        if let Some(script) = o.child(Some(op), "script") {
            for f in script_fields(script_text(o, doc.text, script)) {
                add(f);
            }
        }
        for agg in below(o, o.child(Some(op), "aggregations")) {
            if let Some(name) = o
                .child_value(Some(agg), "as")
                .or_else(|| o.child_value(Some(agg), "fn"))
            {
                add(name);
            }
        }
    }
    out
}

/// The text of a `script:` entry: its inline value, or its block's lines.
fn script_text<'t>(o: &Outline<'_>, text: &'t str, entry: usize) -> &'t str {
    let e = &o.entries[entry];
    if let Some(v) = &e.value {
        return &text[v.clone()];
    }
    let start = e.after_colon;
    let col = e.col;
    let mut end = text[start..]
        .find('\n')
        .map_or(text.len(), |i| start + i + 1);
    for line in text[end..].split_inclusive('\n') {
        let indent = line.len() - line.trim_start_matches(' ').len();
        if !line.trim().is_empty() && indent <= col {
            break;
        }
        end += line.len();
    }
    &text[start..end]
}

/// Field names a script writes: `#{name: ...}` keys and `x.name = ...` assignments.
fn script_fields(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in script.match_indices("#{") {
        let body = &script[i + 2..];
        let body = &body[..body.find('}').unwrap_or(body.len())];
        for part in body.split(',') {
            let part = part.trim_start();
            let name = ident(part);
            if !name.is_empty() && part[name.len()..].trim_start().starts_with(':') {
                out.push(name);
            }
        }
    }
    for (i, _) in script.match_indices('.') {
        let name = ident(&script[i + 1..]);
        let rest = script[i + 1 + name.len()..].trim_start();
        if !name.is_empty() && rest.starts_with('=') && !rest.starts_with("==") {
            out.push(name);
        }
    }
    out
}

/// Field names from the first line of a source's file (a plain path, not a glob or a
/// directory): the CSV header, or the keys of the first JSON object. Reads at most 64 KiB.
fn first_line_fields(path: &Path, csv: bool, header: bool, delimiter: char) -> Vec<String> {
    use std::io::Read;
    if path.to_string_lossy().contains(['*', '?', '[']) || !path.is_file() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let Ok(file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    if file.take(64 * 1024).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let first = text
        .trim_start_matches('\u{feff}')
        .lines()
        .next()
        .unwrap_or("");
    if csv {
        let n = first.split(delimiter).count();
        if !header {
            return (0..n).map(|i| format!("c{i}")).collect();
        }
        return first
            .split(delimiter)
            .map(|f| f.trim().trim_matches('"').to_owned())
            .collect();
    }
    match serde_json::from_str::<serde_json::Value>(first) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

// ---- definition ----------------------------------------------------------------------------

/// The definition of the input id (or dead-letter sink) under the cursor: the `id:` value of
/// the source, operator or sink of the same pipeline; from a `script_file:`, the file.
pub fn definition(doc: Doc<'_>, offset: usize) -> Option<Location> {
    if doc.kind() != Kind::Pipeline {
        return None;
    }
    let o = Outline::new(doc.text);
    if let Context::Value { entry, .. } = o.context(offset)
        && key_of(&o, entry) == Some("script_file")
    {
        // The script file itself.
        let path = doc.base_dir().join(o.value(entry)?);
        return path
            .is_file()
            .then(|| file_uri(&path))
            .flatten()
            .map(|uri| Location::new(uri, Range::default()));
    }
    let (entry, id, _) = reference_at(&o, doc.text, offset)?;
    let pipeline = pipeline_of(&o, entry)?;
    let target = elements(&o, pipeline).into_iter().find(|e| e.id == id)?;
    let index = LineIndex::new(doc.text);
    Some(Location::new(
        doc.uri.clone(),
        index.range(&target.id_range),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIPE: &str = "\
version: 1
pipelines:
  - id: p
    sources:
      - id: gen
        type: generator
        count: 3
        fields:
          user: {kind: sequence}
    operators:
      - id: m
        type: map
        input: gen
        script: |
          fn map(r) { #{user: r.user, total: 1} }
    sinks:
      - id: out
        type: stdout
        inputs: [m]
";

    fn uri() -> Uri {
        "file:///tmp/weir-lsp-unit/p.yaml".parse().expect("uri")
    }

    fn doc<'a>(uri: &'a Uri, text: &'a str) -> Doc<'a> {
        Doc { uri, text }
    }

    fn at(text: &str, needle: &str, plus: usize) -> usize {
        text.find(needle).expect("needle") + plus
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Pipeline-like text with random edits: every feature answers at every offset.
        #[test]
        fn any_text_at_any_offset_is_answered(
            cut in 0usize..600,
            bom in proptest::bool::ANY,
            insert in "[\u{feff} -~\n\t{}\\[\\],:#|>é😀-]{0,40}",
            step in 1usize..7,
        ) {
            let mut text = PIPE.to_owned();
            let mut cut = cut.min(text.len());
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.insert_str(cut, &insert);
            if bom {
                text.insert(0, '\u{feff}');
            }
            let u = uri();
            let d = doc(&u, &text);
            let _ = diagnostics(d);
            for offset in (0..=text.len()).step_by(step).filter(|&o| text.is_char_boundary(o)) {
                let _ = hover(d, offset);
                let _ = completion(d, offset, None);
                let _ = completion(d, offset, Some(":"));
                let _ = definition(d, offset);
            }
        }
    }

    #[test]
    fn fields_come_from_a_csv_header_and_triggers_open_lists_only_where_they_start_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("orders.csv"),
            "\u{feff}user;amount;\"note\"\n1;2;x\n",
        )
        .expect("write");
        let text = "\
pipelines:
  - id: p
    sources:
      - {id: src, type: file, path: orders.csv, format: csv, csv: {delimiter: \";\"}}
    operators:
      - id: k
        type: key_by
        input: src
        field:
        script: |
          fn key(r) { #{a: 1} }
";
        let u: Uri = format!("file://{}/p.yaml", dir.path().display())
            .parse()
            .expect("uri");
        let d = doc(&u, text);
        let labels = |items: Vec<CompletionItem>| -> Vec<String> {
            items.into_iter().map(|i| i.label).collect()
        };
        let field = at(text, "field:", 6);
        let items = completion(d, field, Some(":"));
        assert_eq!(labels(items.clone()), ["user", "amount", "note", "a"]);
        // Right after the colon, the value comes with its space.
        let Some(CompletionTextEdit::Edit(edit)) = &items[0].text_edit else {
            panic!("an edit")
        };
        assert_eq!(edit.new_text, " user");
        // A `:` in a script, a `.` in a YAML key, a `[` on a key: no list.
        assert_eq!(completion(d, at(text, "a: 1", 2), Some(":")), Vec::new());
        assert_eq!(completion(d, at(text, "input", 2), Some(".")), Vec::new());
        // An entry point in a script: its reference entry.
        let h = hover(d, at(text, "key(r)", 1)).expect("hover");
        let HoverContents::Markup(m) = h.contents else {
            panic!("markup")
        };
        assert!(m.value.starts_with("```rhai\nfn key(r)"), "{}", m.value);
    }

    #[test]
    fn dead_letter_targets_complete_and_resolve_to_sinks() {
        let text = PIPE.replace(
            "        input: gen\n",
            "        input: gen\n        on_error: {dead_letter: out}\n",
        );
        let u = uri();
        let d = doc(&u, &text);
        let labels: Vec<String> = completion(d, at(&text, "out}", 1), None)
            .into_iter()
            .map(|i| i.label)
            .collect();
        assert_eq!(labels, ["out"]);
        let def = definition(d, at(&text, "out}", 1)).expect("definition");
        let line = text
            .lines()
            .position(|l| l.contains("- id: out"))
            .expect("line");
        assert_eq!(def.range.start.line as usize, line);
    }

    #[test]
    fn uris_become_paths() {
        let u: Uri = "file:///a%20b/c.yaml".parse().expect("uri");
        assert_eq!(file_path(&u), Some(PathBuf::from("/a b/c.yaml")));
        let u: Uri = "untitled:Untitled-1".parse().expect("uri");
        assert_eq!(file_path(&u), None);
        let t: Uri = "file:///x/orders.test.yaml".parse().expect("uri");
        assert_eq!(doc(&t, "").kind(), Kind::Test);
        let r: Uri = "file:///x/scripts/parse.rhai".parse().expect("uri");
        assert_eq!(doc(&r, "fn map(r) { r }").kind(), Kind::Other);
        assert_eq!(diagnostics(doc(&r, "fn map(r) { r }")), Vec::new());
        let untitled: Uri = "untitled:Untitled-1".parse().expect("uri");
        assert_eq!(doc(&untitled, "").kind(), Kind::Pipeline);
    }

    #[test]
    fn valid_pipeline_has_no_diagnostics_and_a_typo_has_one() {
        let u = uri();
        assert_eq!(diagnostics(doc(&u, PIPE)), Vec::new());
        let bad = PIPE.replace("type: map", "type: mapp");
        let d = diagnostics(doc(&u, &bad));
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            d[0].code,
            Some(NumberOrString::String("weir::config::unknown_type".into()))
        );
        let line = bad.lines().position(|l| l.contains("mapp")).expect("line");
        assert_eq!(d[0].range.start.line as usize, line);
    }

    #[test]
    fn hover_and_completion_read_the_schema() {
        let u = uri();
        let d = doc(&u, PIPE);
        let h = hover(d, at(PIPE, "count", 1)).expect("hover");
        let HoverContents::Markup(m) = h.contents else {
            panic!("markup")
        };
        assert!(m.value.contains("Number of records"), "{}", m.value);
        let h = hover(d, at(PIPE, "map\n", 1)).expect("hover");
        let HoverContents::Markup(m) = h.contents else {
            panic!("markup")
        };
        assert!(
            m.value.contains("One record in, one record out"),
            "{}",
            m.value
        );
        let labels = |items: Vec<CompletionItem>| -> Vec<String> {
            items.into_iter().map(|i| i.label).collect()
        };
        let types = labels(completion(d, at(PIPE, "map\n", 0), None));
        assert!(types.contains(&"filter".to_owned()) && types.contains(&"aggregate".to_owned()));
        let ids = labels(completion(d, at(PIPE, "[m]", 1), None));
        assert_eq!(ids, ["gen", "m"]);
        let fields = labels(completion(d, at(PIPE, "r.user", 2), Some(".")));
        assert!(fields.contains(&"user".to_owned()) && fields.contains(&"total".to_owned()));
        let h = hover(d, at(PIPE, "input: gen", 8)).expect("hover");
        let HoverContents::Markup(m) = h.contents else {
            panic!("markup")
        };
        assert_eq!(
            m.value,
            "**`gen`**: the source (`generator`) defined on line 5"
        );
        let def = definition(d, at(PIPE, "input: gen", 8)).expect("definition");
        let line = PIPE
            .lines()
            .position(|l| l.contains("id: gen"))
            .expect("line");
        assert_eq!(def.range.start.line as usize, line);
    }
}
