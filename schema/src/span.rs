//! Source text and the span index: every YAML node's byte range, addressable by config path.
//!
//! The YAML is read once, from saphyr's parser events, into an owned tree of [`Node`]s with
//! byte spans (saphyr counts characters; miette wants bytes) by [`crate::yaml`], within its
//! depth and alias limits; this module holds that tree, from which the loader derives the JSON
//! value that serde and the JSON Schema see. Diagnostics then ask for the span of a path such
//! as `pipelines[0].operators[2].inputs[0]`.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use miette::{NamedSource, SourceSpan};

/// A pipeline file's text and name, shared by every diagnostic about it.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Display name (the path as the user gave it).
    pub name: String,
    /// The file's path on disk, if it came from disk; relative paths inside it resolve against
    /// its directory.
    pub path: Option<PathBuf>,
    /// The full text.
    pub text: Arc<str>,
}

impl SourceFile {
    /// A source file from a name and text.
    pub fn new(name: impl Into<String>, text: impl Into<Arc<str>>) -> Self {
        Self {
            name: name.into(),
            path: None,
            text: text.into(),
        }
    }

    /// A miette source for labels.
    pub fn named_source(&self) -> NamedSource<String> {
        NamedSource::new(&self.name, self.text.to_string()).with_language("yaml")
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..floor_char_boundary(&self.text, offset)];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, col)
    }

    /// The byte offset of a 1-based line and column (in characters), clamped to the text.
    pub fn offset_of(&self, line: usize, col: usize) -> usize {
        offset_of(&self.text, line, col)
    }
}

/// The byte offset in `text` of a 1-based line and column (in characters), clamped to the
/// text: a column past its line's end gives the line's end, a line past the text its end.
pub fn offset_of(text: &str, line: usize, col: usize) -> usize {
    let mut offset = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            let within: usize = l
                .char_indices()
                .nth(col.saturating_sub(1))
                .map_or(l.trim_end_matches('\n').len(), |(b, _)| b);
            return offset + within;
        }
        offset += l.len();
    }
    text.len()
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One step of a config path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PathSeg {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

impl From<&str> for PathSeg {
    fn from(s: &str) -> Self {
        Self::Key(s.to_owned())
    }
}

impl From<String> for PathSeg {
    fn from(s: String) -> Self {
        Self::Key(s)
    }
}

impl From<usize> for PathSeg {
    fn from(i: usize) -> Self {
        Self::Index(i)
    }
}

/// A path from the document root to a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct YamlPath(pub Vec<PathSeg>);

impl YamlPath {
    /// The root.
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// This path extended by one segment.
    pub fn join(&self, seg: impl Into<PathSeg>) -> Self {
        let mut v = self.0.clone();
        v.push(seg.into());
        Self(v)
    }

    /// This path extended by a suffix.
    pub fn with(&self, suffix: PathSuffix) -> Self {
        match suffix {
            PathSuffix::Key(k) => self.join(k),
            PathSuffix::Index(k, i) => self.join(k).join(i),
        }
    }

    /// Parses a JSON pointer (`/pipelines/0/id`); numeric segments become indices.
    pub fn from_json_pointer(ptr: &str) -> Self {
        Self(
            ptr.split('/')
                .skip(1)
                .map(|s| {
                    let s = s.replace("~1", "/").replace("~0", "~");
                    s.parse::<usize>().map_or(PathSeg::Key(s), PathSeg::Index)
                })
                .collect(),
        )
    }

    /// The parent path (the root's parent is the root).
    pub fn parent(&self) -> Self {
        let mut v = self.0.clone();
        v.pop();
        Self(v)
    }

    /// The last segment, if any.
    pub fn last(&self) -> Option<&PathSeg> {
        self.0.last()
    }
}

impl fmt::Display for YamlPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(root)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                PathSeg::Key(k) if i == 0 => write!(f, "{k}")?,
                PathSeg::Key(k) => write!(f, ".{k}")?,
                PathSeg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A path suffix naming where an input reference sits inside an element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathSuffix {
    /// `input:`
    Key(&'static str),
    /// `inputs[i]`
    Index(&'static str, usize),
}

/// A YAML node with its byte span.
#[derive(Clone, Debug)]
pub struct Node {
    /// Byte range of the node's text (for a block scalar: its content lines).
    pub span: Range<usize>,
    /// The node's content.
    pub value: NodeValue,
}

/// The content of a [`Node`].
#[derive(Clone, Debug)]
pub enum NodeValue {
    /// A mapping, in document order: key text, key span, value.
    Map(Vec<(String, Range<usize>, Node)>),
    /// A sequence.
    Seq(Vec<Node>),
    /// A scalar, already resolved to a JSON value.
    Scalar(serde_json::Value),
}

impl Node {
    /// The JSON value of this subtree.
    pub fn to_json(&self) -> serde_json::Value {
        match &self.value {
            NodeValue::Scalar(v) => v.clone(),
            NodeValue::Seq(items) => {
                serde_json::Value::Array(items.iter().map(Node::to_json).collect())
            }
            NodeValue::Map(entries) => serde_json::Value::Object(
                entries
                    .iter()
                    .map(|(k, _, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The child at one path segment.
    pub fn child(&self, seg: &PathSeg) -> Option<&Node> {
        match (&self.value, seg) {
            (NodeValue::Map(entries), PathSeg::Key(k)) => {
                entries.iter().find(|(ek, _, _)| ek == k).map(|(_, _, v)| v)
            }
            (NodeValue::Seq(items), PathSeg::Index(i)) => items.get(*i),
            _ => None,
        }
    }
}

/// Spans of every node of one YAML document, addressable by path.
#[derive(Clone, Debug)]
pub struct SpanIndex {
    root: Node,
}

impl SpanIndex {
    /// Wraps a converted document.
    pub fn new(root: Node) -> Self {
        Self { root }
    }

    /// The document root.
    pub fn root(&self) -> &Node {
        &self.root
    }

    /// The document root, to change in place while loading (`${VAR}` expansion).
    pub(crate) fn root_mut(&mut self) -> &mut Node {
        &mut self.root
    }

    /// The node at a path.
    pub fn node(&self, path: &YamlPath) -> Option<&Node> {
        path.0.iter().try_fold(&self.root, |n, seg| n.child(seg))
    }

    /// The span of the node at `path`, or of its nearest existing ancestor.
    pub fn span(&self, path: &YamlPath) -> Range<usize> {
        let mut node = &self.root;
        for seg in &path.0 {
            match node.child(seg) {
                Some(n) => node = n,
                None => break,
            }
        }
        node.span.clone()
    }

    /// Whether the exact path exists.
    pub fn exists(&self, path: &YamlPath) -> bool {
        self.node(path).is_some()
    }

    /// The span of a mapping key at `path` (its last segment must be a key); falls back to the
    /// value's or the nearest ancestor's span.
    pub fn key_span(&self, path: &YamlPath) -> Range<usize> {
        if let (Some(PathSeg::Key(k)), Some(parent)) = (path.last(), self.node(&path.parent()))
            && let NodeValue::Map(entries) = &parent.value
            && let Some((_, ks, _)) = entries.iter().find(|(ek, _, _)| ek == k)
        {
            return ks.clone();
        }
        self.span(path)
    }
}

/// Converts a byte range into a miette span.
pub fn to_source_span(r: &Range<usize>) -> SourceSpan {
    SourceSpan::new(r.start.into(), r.end.saturating_sub(r.start))
}
