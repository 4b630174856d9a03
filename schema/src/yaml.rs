//! Reading YAML text into the span-indexed [`Node`] tree, within fixed limits, without
//! recursion: whatever the file holds and whatever thread reads it, loading ends in a tree or
//! in diagnostics, never in a stack overflow or a runaway allocation.
//!
//! saphyr's parser is a state machine, but its own loaders recurse once per nesting level
//! (`Parser::load` → `load_node` → `load_sequence` → …), so 20 000 nested `- ` overflow any
//! thread's stack before a tree exists. This module pulls the parser's events one by one and
//! builds the tree on an explicit stack whose height is checked at every collection start
//! ([`MAX_DEPTH`]). Aliases are resolved here too, charged by the bytes their copies add
//! ([`MAX_ALIAS_BYTES`]), and their nesting counts towards the depth. The values a file holds
//! are counted too ([`MAX_NODES`]), so that the memory a file takes once loaded stays bounded
//! however small each value is. Every later stage
//! (the JSON value, the schema check, serde, dropping the tree) recurses over a tree no
//! deeper than [`MAX_DEPTH`], which a small thread stack holds.
//!
//! The limits are here, in one place; the file-size limit ([`MAX_FILE_BYTES`]) is enforced by
//! the loader before any parsing (`crate::load`). This module does no I/O.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use saphyr::Scalar;
use saphyr_parser::{Event, Parser, ScanError, Span, Tag};

use crate::diagnostic::{Diagnostic, Diagnostics, codes};
use crate::span::{Node, NodeValue, SourceFile};

/// The largest pipeline file Weir reads: 16 MiB. Real pipeline files are a few kilobytes; the
/// limit only stops a device, a runaway generator or a wrong path from filling memory.
pub const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;

/// The deepest nesting of mappings and sequences (the document's root counts as 1): 256.
/// Weir's own format nests about 6 deep; the limit keeps every recursive stage after
/// loading within a few tens of kilobytes of stack.
pub const MAX_DEPTH: usize = 256;

/// The most bytes that alias copies may add to a document: 4 MiB, counted as the memory the
/// copied nodes take (each node's size plus its text), so that a few anchors referencing each
/// other cannot expand into gigabytes ("billion laughs").
pub const MAX_ALIAS_BYTES: usize = 4 * 1024 * 1024;

/// The most values (mappings, sequences, scalars and aliases, as written) a file may hold:
/// 1 000 000. Each costs about a hundred bytes once loaded (tree node, JSON value, schema
/// check), so without this bound a 16 MiB file of `[1,1,1,…]` would take most of a gigabyte;
/// within it, loading a file stays near a hundred megabytes. Real pipeline files hold hundreds.
pub const MAX_NODES: usize = 1_000_000;

/// Bytes one tree node takes, charged for every node an alias copies.
const NODE_BYTES: usize = std::mem::size_of::<Node>();

/// Bytes one mapping entry takes beyond its value node (the key string and its span).
const ENTRY_BYTES: usize = std::mem::size_of::<(String, Range<usize>)>();

/// The result of reading a YAML stream.
pub(crate) enum Document {
    /// One document, read into a tree; `diagnostics` may still hold errors found on the way
    /// (complex keys, unreadable values, duplicate keys).
    One(Node),
    /// No document at all (an empty file, or only comments).
    Empty,
    /// Reading stopped: a syntax error, a limit, or a second document (reported).
    Stopped,
}

/// Reads `source` into a tree, reporting every problem into `diagnostics`.
pub(crate) fn read(source: &Arc<SourceFile>, diagnostics: &mut Diagnostics) -> Document {
    let mut reader = Reader::new(source, diagnostics);
    match reader.run() {
        Ok(()) => match reader.root.take() {
            Some(root) => Document::One(root),
            None => Document::Empty,
        },
        Err(Stop) => Document::Stopped,
    }
}

/// Reading ended early; the reason is already among the diagnostics.
struct Stop;

/// An anchored node, as an alias finds it.
struct Anchor {
    place: Place,
    /// Bytes a copy takes (see [`MAX_ALIAS_BYTES`]).
    cost: usize,
    /// Nesting levels inside the node (0 for a scalar).
    height: usize,
}

enum Place {
    /// A scalar, kept as it is (its copy costs no more than the text it came from).
    Scalar(Node),
    /// A collection, found by its child indices from the root: it stays in the tree under
    /// construction, so anchoring never copies (nested anchors would copy quadratically).
    Path(Vec<usize>),
    /// Inside a key that is not a plain scalar, which the tree leaves out.
    Dropped,
}

/// What a mapping under construction expects next.
enum KeyState {
    Key,
    Value(String, Range<usize>),
    /// The key was not usable (reported); its value is dropped.
    SkipValue,
}

enum Content {
    Seq(Vec<Node>),
    Map {
        entries: Vec<(String, Range<usize>, Node)>,
        next: KeyState,
    },
}

/// A collection under construction.
struct Frame {
    start: usize,
    content: Content,
    anchor: usize,
    /// Its nodes are left out of the tree (it sits inside an unusable key).
    dropped: bool,
    /// Bytes its children take so far.
    cost: usize,
    /// The greatest height among its children so far.
    height: usize,
}

impl Frame {
    fn len(&self) -> usize {
        match &self.content {
            Content::Seq(items) => items.len(),
            Content::Map { entries, .. } => entries.len(),
        }
    }
}

struct Reader<'a> {
    source: &'a Arc<SourceFile>,
    text: &'a str,
    offsets: CharOffsets,
    diagnostics: &'a mut Diagnostics,
    stack: Vec<Frame>,
    root: Option<Node>,
    anchors: HashMap<usize, Anchor>,
    alias_bytes: usize,
    /// Values read so far (see [`MAX_NODES`]).
    nodes: usize,
    documents: usize,
}

impl<'a> Reader<'a> {
    fn new(source: &'a Arc<SourceFile>, diagnostics: &'a mut Diagnostics) -> Self {
        Self {
            source,
            text: &source.text,
            offsets: CharOffsets::new(&source.text),
            diagnostics,
            stack: Vec::new(),
            root: None,
            anchors: HashMap::new(),
            alias_bytes: 0,
            nodes: 0,
            documents: 0,
        }
    }

    fn run(&mut self) -> Result<(), Stop> {
        let text = self.text;
        let mut parser = Parser::new_from_str(text);
        while let Some(next) = parser.next_event() {
            let (event, span) = next.map_err(|e| self.syntax_error(&e))?;
            self.event(event, span)?;
        }
        Ok(())
    }

    fn event(&mut self, event: Event<'_>, span: Span) -> Result<(), Stop> {
        if self.documents > 1 {
            // Reported at the second document's first node (or its end, when empty).
            let at = self.byte(span.start.index());
            let n = self.count_documents();
            self.diagnostics.push(
                Diagnostic::error(
                    codes::YAML_DOCUMENT,
                    format!("the file holds {n} YAML documents; Weir reads one"),
                )
                .at(self.source, at..next_char_end(self.text, at))
                .label("a second document starts here")
                .help("put every pipeline under one `pipelines:` list, or split the file"),
            );
            return Err(Stop);
        }
        if matches!(
            event,
            Event::Scalar(..)
                | Event::SequenceStart(..)
                | Event::MappingStart(..)
                | Event::Alias(_)
        ) {
            self.nodes += 1;
            if self.nodes > MAX_NODES {
                return Err(self.too_many_nodes(&span));
            }
        }
        match event {
            Event::DocumentStart(_) => self.documents += 1,
            Event::Scalar(value, style, anchor, tag) => {
                let range = self.range(&span);
                let node = self.scalar(value, style, tag.as_ref(), range);
                let cost = NODE_BYTES + scalar_bytes(&node);
                if anchor > 0 {
                    let place = if self.drops_next() {
                        Place::Dropped
                    } else {
                        Place::Scalar(node.clone())
                    };
                    self.anchors.insert(
                        anchor,
                        Anchor {
                            place,
                            cost,
                            height: 0,
                        },
                    );
                }
                self.add(node, cost, 0);
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                let start = self.byte(span.start.index());
                if self.stack.len() >= MAX_DEPTH {
                    return Err(self.too_deep(start, Some(self.stack.len() + 1)));
                }
                let content = if matches!(event, Event::SequenceStart(..)) {
                    Content::Seq(Vec::new())
                } else {
                    Content::Map {
                        entries: Vec::new(),
                        next: KeyState::Key,
                    }
                };
                let dropped = self.drops_next() || self.awaits_key();
                self.stack.push(Frame {
                    start,
                    content,
                    anchor,
                    dropped,
                    cost: 0,
                    height: 0,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = self.stack.pop() else {
                    return Ok(());
                };
                let end = self.byte(span.start.index());
                let value = match frame.content {
                    Content::Seq(items) => NodeValue::Seq(items),
                    Content::Map { entries, .. } => {
                        self.report_duplicates(&entries);
                        NodeValue::Map(entries)
                    }
                };
                let node = Node {
                    span: self.trimmed(frame.start..end),
                    value,
                };
                let cost = NODE_BYTES + frame.cost;
                let height = frame.height + 1;
                if frame.anchor > 0 {
                    let place = if frame.dropped || self.drops_next() || self.awaits_key() {
                        Place::Dropped
                    } else {
                        Place::Path(self.next_path())
                    };
                    self.anchors.insert(
                        frame.anchor,
                        Anchor {
                            place,
                            cost,
                            height,
                        },
                    );
                }
                self.add(node, cost, height);
            }
            Event::Alias(id) => self.alias(id, &span)?,
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
        }
        Ok(())
    }

    /// Whether the innermost mapping waits for a key (a collection arriving now is a key).
    fn awaits_key(&self) -> bool {
        matches!(
            self.stack.last(),
            Some(Frame {
                content: Content::Map {
                    next: KeyState::Key,
                    ..
                },
                ..
            })
        )
    }

    /// Whether a node arriving now is left out of the tree.
    fn drops_next(&self) -> bool {
        self.stack.last().is_some_and(|f| {
            f.dropped
                || matches!(
                    f.content,
                    Content::Map {
                        next: KeyState::SkipValue,
                        ..
                    }
                )
        })
    }

    /// The child indices from the root to where the next completed node goes.
    fn next_path(&self) -> Vec<usize> {
        self.stack.iter().map(Frame::len).collect()
    }

    /// Adds a completed node to the innermost collection (or makes it the root).
    fn add(&mut self, node: Node, cost: usize, height: usize) {
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(node);
            return;
        };
        let mut complex_key = None;
        match &mut frame.content {
            Content::Seq(items) => {
                if !frame.dropped {
                    items.push(node);
                }
                frame.cost += cost;
            }
            Content::Map { entries, next } => match std::mem::replace(next, KeyState::Key) {
                KeyState::Key => match &node.value {
                    NodeValue::Scalar(v) => {
                        let key = match v {
                            serde_json::Value::String(s) => s.clone(),
                            // Numbers, booleans and null as keys are legal YAML; use their text.
                            other => other.to_string(),
                        };
                        frame.cost += ENTRY_BYTES + key.len();
                        *next = KeyState::Value(key, node.span);
                    }
                    _ => {
                        complex_key = Some(node.span);
                        *next = KeyState::SkipValue;
                    }
                },
                KeyState::Value(key, key_span) => {
                    if !frame.dropped {
                        entries.push((key, key_span, node));
                    }
                    frame.cost += cost;
                }
                KeyState::SkipValue => {}
            },
        }
        frame.height = frame.height.max(height);
        if let Some(span) = complex_key
            && !frame.dropped
        {
            self.diagnostics.push(
                Diagnostic::error(codes::YAML_KEY, "mapping keys must be plain strings")
                    .at(self.source, span)
                    .label("complex key")
                    .help("write the key as a plain word, such as `id:`"),
            );
        }
    }

    fn alias(&mut self, id: usize, span: &Span) -> Result<(), Stop> {
        let range = self.range(span);
        let Some(anchor) = self.anchors.get(&id) else {
            self.unreadable(range.clone(), "unresolved alias");
            self.add(null(range), NODE_BYTES, 0);
            return Ok(());
        };
        let (cost, height) = (anchor.cost, anchor.height);
        let depth = self.stack.len() + height;
        if depth > MAX_DEPTH {
            return Err(self.too_deep(range.start, Some(depth)));
        }
        self.alias_bytes = self.alias_bytes.saturating_add(cost);
        if self.alias_bytes > MAX_ALIAS_BYTES {
            self.diagnostics.push(
                Diagnostic::error(
                    codes::YAML_ALIAS_BUDGET,
                    format!(
                        "aliases expand this file by more than {}: copying this one brings the \
                         copies to {}",
                        human_bytes(MAX_ALIAS_BYTES),
                        human_bytes(self.alias_bytes)
                    ),
                )
                .at(self.source, range)
                .label("alias expansion limit reached here")
                .help(format!(
                    "aliases may add at most {} to a pipeline file; write repeated parts out, \
                     or reference smaller anchors",
                    human_bytes(MAX_ALIAS_BYTES)
                )),
            );
            return Err(Stop);
        }
        let copy = match &anchor.place {
            Place::Scalar(node) => Some(node.clone()),
            Place::Path(path) => self.find(path).cloned(),
            Place::Dropped => None,
        };
        match copy {
            Some(mut node) => {
                node.span = range;
                self.add(node, cost, height);
            }
            None => {
                self.unreadable(range.clone(), "alias of an anchor inside a complex key");
                self.add(null(range), NODE_BYTES, 0);
            }
        }
        Ok(())
    }

    /// The completed node at `path` (child indices from the root) in the tree under
    /// construction.
    fn find(&self, path: &[usize]) -> Option<&Node> {
        let mut level = 0;
        loop {
            let frame = self.stack.get(level)?;
            let index = *path.get(level)?;
            if index < frame.len() {
                let mut node = match &frame.content {
                    Content::Seq(items) => &items[index],
                    Content::Map { entries, .. } => &entries[index].2,
                };
                for &i in &path[level + 1..] {
                    node = match &node.value {
                        NodeValue::Seq(items) => items.get(i)?,
                        NodeValue::Map(entries) => &entries.get(i)?.2,
                        NodeValue::Scalar(_) => return None,
                    };
                }
                return Some(node);
            }
            // The path goes into the collection still open one level down.
            level += 1;
        }
    }

    fn scalar(
        &mut self,
        value: Cow<'_, str>,
        style: saphyr_parser::ScalarStyle,
        tag: Option<&Cow<'_, Tag>>,
        range: Range<usize>,
    ) -> Node {
        match Scalar::parse_from_cow_and_metadata(value, style, tag) {
            Some(s) => Node {
                span: range,
                value: NodeValue::Scalar(scalar_to_json(&s)),
            },
            None => {
                self.unreadable(range.clone(), "malformed value");
                null(range)
            }
        }
    }

    fn unreadable(&mut self, range: Range<usize>, label: &str) {
        if self.drops_next() {
            return;
        }
        self.diagnostics.push(
            Diagnostic::error(codes::YAML_SYNTAX, "this value cannot be read")
                .at(self.source, range)
                .label(label)
                .help("write the value out in full"),
        );
    }

    /// Reports every key that repeats an earlier key of the same mapping.
    fn report_duplicates(&mut self, entries: &[(String, Range<usize>, Node)]) {
        if entries.len() < 2 {
            return;
        }
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0).then(a.cmp(&b)));
        for pair in order.windows(2) {
            let (first, again) = (&entries[pair[0]], &entries[pair[1]]);
            if first.0 == again.0 {
                self.diagnostics.push(
                    Diagnostic::error(
                        codes::YAML_SYNTAX,
                        format!("YAML syntax error: the key `{}` appears twice", again.0),
                    )
                    .at(self.source, again.1.clone())
                    .label("duplicated key in mapping")
                    .related(first.1.clone(), "first here")
                    .help("each key may appear once per mapping; remove or rename one of them"),
                );
            }
        }
    }

    fn too_deep(&mut self, at: usize, depth: Option<usize>) -> Stop {
        let end = next_char_end(self.text, at);
        let (message, label) = match depth {
            Some(d) => (
                format!("the YAML nests deeper than {MAX_DEPTH} levels (level {d} starts here)"),
                format!("nesting level {d}"),
            ),
            None => (
                format!("the YAML nests deeper than {MAX_DEPTH} levels"),
                "too deeply nested".to_owned(),
            ),
        };
        self.diagnostics.push(
            Diagnostic::error(codes::YAML_DEPTH, message)
            .at(self.source, at..end)
            .label(label)
            .help(format!(
                "pipeline files may nest mappings and sequences at most {MAX_DEPTH} levels deep; \
                 flatten the structure"
            )),
        );
        Stop
    }

    fn too_many_nodes(&mut self, span: &Span) -> Stop {
        let at = self.byte(span.start.index());
        self.diagnostics.push(
            Diagnostic::error(
                codes::YAML_NODES,
                format!(
                    "the file holds more than {MAX_NODES} values (mappings, sequences, scalars); \
                     value {} starts here",
                    MAX_NODES + 1
                ),
            )
            .at(self.source, at..next_char_end(self.text, at))
            .label("value limit reached here")
            .help(format!(
                "pipeline files may hold at most {MAX_NODES} values; split the file, or move \
                 data out of it (a source reads data, the pipeline file describes the pipeline)"
            )),
        );
        Stop
    }

    fn syntax_error(&mut self, e: &ScanError) -> Stop {
        let text = self.text;
        let mut at = self.byte(e.marker().index());
        let info = e.info();
        if info == "recursion limit exceeded" {
            // saphyr's own bound on flow nesting (255 levels of `[[[…`), which its scanner may
            // reach before the parser hands out the collections.
            return self.too_deep(at, None);
        }
        // saphyr marks where it started scanning the token; point at the tab itself.
        if info.contains("tab")
            && let Some(tab) = text[at..]
                .find('\t')
                .map(|i| at + i)
                .or_else(|| text.find('\t'))
        {
            at = tab;
        }
        let end = next_char_end(text, at);
        self.diagnostics.push(
            Diagnostic::error(codes::YAML_SYNTAX, format!("YAML syntax error: {info}"))
                .at(self.source, at..end)
                .label(info.to_owned())
                .help(syntax_help(info)),
        );
        Stop
    }

    /// How many documents the stream holds (for the message), counted with a fresh parser
    /// that stops at the first error.
    fn count_documents(&self) -> usize {
        let mut n = 0;
        let mut parser = Parser::new_from_str(self.text);
        while let Some(Ok((event, _))) = parser.next_event() {
            if matches!(event, Event::DocumentStart(_)) {
                n += 1;
            }
        }
        n.max(2)
    }

    fn byte(&self, char_index: usize) -> usize {
        self.offsets.byte(self.text, char_index)
    }

    /// The byte range of an event's span, trimmed like every node's.
    fn range(&self, span: &Span) -> Range<usize> {
        let start = self.byte(span.start.index());
        let end = self.byte(span.end.index()).max(start);
        self.trimmed(start..end)
    }

    /// Trims trailing whitespace so that labels sit on the text, not on the next line.
    fn trimmed(&self, mut span: Range<usize>) -> Range<usize> {
        span.end = span.end.max(span.start);
        let bytes = self.text.as_bytes();
        while span.end > span.start && bytes.get(span.end - 1).is_some_and(u8::is_ascii_whitespace)
        {
            span.end -= 1;
        }
        span
    }
}

fn null(span: Range<usize>) -> Node {
    Node {
        span,
        value: NodeValue::Scalar(serde_json::Value::Null),
    }
}

fn scalar_bytes(node: &Node) -> usize {
    match &node.value {
        NodeValue::Scalar(serde_json::Value::String(s)) => s.len(),
        _ => 0,
    }
}

/// The value a plain (unquoted) scalar with this text has: a number, a boolean, null or a
/// string, as YAML resolves it. Used after `${VAR}` expansion, so that `port: ${PORT}` is a
/// number when `PORT=9092`.
pub(crate) fn resolve_plain(text: &str) -> serde_json::Value {
    match Scalar::parse_from_cow_and_metadata(
        Cow::Borrowed(text),
        saphyr_parser::ScalarStyle::Plain,
        None,
    ) {
        Some(s) => scalar_to_json(&s),
        None => serde_json::Value::String(text.to_owned()),
    }
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

/// `4 MiB`, `4.8 MiB`, `512 KiB`, `100 bytes`: exact for the limits, which are whole MiB.
pub(crate) fn human_bytes(n: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;
    if n >= MIB {
        if n.is_multiple_of(MIB) {
            format!("{} MiB", n / MIB)
        } else {
            format!("{:.1} MiB", n as f64 / MIB as f64)
        }
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} bytes")
    }
}

fn syntax_help(info: &str) -> String {
    if info.contains("tab") {
        "YAML indents with spaces only; replace the tab characters".to_owned()
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

/// The end of the character starting at byte `at` (or `at` at the end of the text).
pub(crate) fn next_char_end(text: &str, at: usize) -> usize {
    text[at.min(text.len())..]
        .chars()
        .next()
        .map_or(at, |c| at + c.len_utf8())
}

/// Maps saphyr's character indices to byte offsets: a byte offset every
/// [`CharOffsets::STRIDE`] characters, then a short walk (a plain identity for ASCII text).
struct CharOffsets {
    ascii: bool,
    marks: Vec<usize>,
}

impl CharOffsets {
    const STRIDE: usize = 64;

    fn new(text: &str) -> Self {
        let ascii = text.is_ascii();
        let marks = if ascii {
            Vec::new()
        } else {
            text.char_indices()
                .step_by(Self::STRIDE)
                .map(|(b, _)| b)
                .collect()
        };
        Self { ascii, marks }
    }

    fn byte(&self, text: &str, char_index: usize) -> usize {
        if self.ascii {
            return char_index.min(text.len());
        }
        let Some(&from) = self.marks.get(char_index / Self::STRIDE) else {
            return text.len();
        };
        text[from..]
            .char_indices()
            .nth(char_index % Self::STRIDE)
            .map_or(text.len(), |(b, _)| from + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_offsets_map_characters_to_bytes() {
        let text = format!("{}é✓x", "a".repeat(130));
        let offsets = CharOffsets::new(&text);
        for (i, (b, _)) in text.char_indices().enumerate() {
            assert_eq!(offsets.byte(&text, i), b, "char {i}");
        }
        assert_eq!(offsets.byte(&text, text.chars().count()), text.len());
        assert_eq!(offsets.byte(&text, 10_000), text.len());
    }
}
