//! A tolerant outline of a YAML text: every key and sequence item with its parent, and the
//! byte ranges of its key and inline value.
//!
//! The editor features (hover, completion, definition) need to know where the cursor is in the
//! config while the user types, when the file often does not parse: `ty` half-typed on a new
//! line, a key without its value. So this outline reads lines and indentation only, in one
//! pass (the parent of a line is found by climbing from the previous entry, at most the
//! nesting depth), and never fails; diagnostics still come from the real loader. It
//! understands block mappings and sequences (also indentless ones), `- key: value` items,
//! block scalars (their lines belong to their key), comments, quoted keys and values, and
//! one-line flow mappings (`- {id: a, type: map}`: their keys become the item's children); a
//! flow sequence (`[a, b]`) is an inline value whose items [`flow_items`] splits. Flow
//! collections spread over several lines are not followed.

use std::ops::Range;

/// One step of a config path, as the schema and `weir_schema::YamlPath` use them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// A key or a sequence item found in the text.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The entry it belongs to (`None`: the document's root mapping).
    pub parent: Option<usize>,
    /// Its key, or its index in the parent sequence.
    pub seg: Seg,
    /// Byte column of the key's first character, or of the dash.
    pub col: usize,
    /// Byte range of the key as written (with quotes); the dash for an item.
    pub key_range: Range<usize>,
    /// Whether a `:` follows the key (a half-typed key has none).
    pub colon: bool,
    /// Byte range of the inline value (trimmed, without a trailing comment), if any.
    pub value: Option<Range<usize>>,
    /// The value is a block scalar (`|`, `>`); its content lines follow.
    pub block: bool,
    /// Byte offset just after the key's `:` (or the item's dash): where a value starts.
    pub after_colon: usize,
    /// A key inside a flow mapping (`{id: a, type: map}`): it never holds block children.
    pub flow: bool,
}

/// The outline of one text.
#[derive(Debug)]
pub struct Outline<'a> {
    text: &'a str,
    /// Every entry, in text order.
    pub entries: Vec<Entry>,
    /// Byte offset of each line's start.
    line_starts: Vec<usize>,
    /// Per line: the entries starting on it (`a..b` into `entries`).
    line_entries: Vec<Range<usize>>,
    /// Per line: the block-scalar entry whose content it is.
    block_owner: Vec<Option<usize>>,
    /// Per entry: its children, in order.
    children: Vec<Vec<usize>>,
}

/// How deep one-line flow mappings are read (`{a: {b: {c: 1}}}`).
const MAX_FLOW_DEPTH: u32 = 16;

/// A line split into indentation, dashes and a key/value.
struct Parsed {
    /// Dash columns (bytes from the line's start), outermost first.
    dashes: Vec<usize>,
    /// Column where the content after the dashes starts.
    content: usize,
    /// Key (unquoted), its range in the line, whether a colon follows, and the offset after it.
    key: Option<(String, Range<usize>, bool, usize)>,
    /// Inline value range in the line.
    value: Option<Range<usize>>,
    block: bool,
}

impl<'a> Outline<'a> {
    /// Reads the outline of `text`.
    pub fn new(text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(
            text.bytes()
                .enumerate()
                .filter(|(_, b)| *b == b'\n')
                .map(|(i, _)| i + 1),
        );
        let n = line_starts.len();
        let mut out = Self {
            text,
            entries: Vec::new(),
            line_starts,
            line_entries: vec![0..0; n],
            block_owner: vec![None; n],
            children: Vec::new(),
        };
        let mut item_counts: Vec<usize> = Vec::new();
        let mut root_items = 0usize;
        let mut open_block: Option<usize> = None;
        for line in 0..n {
            let raw = out.line_text(line);
            // A byte order mark takes no column: columns count from after it.
            let bom = if line == 0 && raw.starts_with('\u{feff}') {
                '\u{feff}'.len_utf8()
            } else {
                0
            };
            let indent = raw.len() - raw[bom..].trim_start_matches([' ', '\t']).len();
            let rest = raw[indent..].trim_end();
            if let Some(b) = open_block {
                if rest.is_empty() || indent > out.entries[b].col {
                    out.block_owner[line] = Some(b);
                    continue;
                }
                open_block = None;
            }
            if rest.is_empty()
                || rest.starts_with('#')
                || rest.starts_with("---")
                || rest.starts_with("...")
                || rest.starts_with('%')
            {
                continue;
            }
            let Some(p) = parse_line(raw, indent) else {
                continue;
            };
            let first = out.entries.len();
            let start = out.line_starts[line];
            let mut parent: Option<usize> = None;
            for (i, &dash) in p.dashes.iter().enumerate() {
                parent = if i == 0 {
                    out.parent_for(dash - bom, true)
                } else {
                    parent
                };
                let counter = match parent {
                    Some(pi) => &mut item_counts[pi],
                    None => &mut root_items,
                };
                let index = *counter;
                *counter += 1;
                let last = i + 1 == p.dashes.len();
                let inline = last && p.key.is_none();
                out.entries.push(Entry {
                    parent,
                    seg: Seg::Index(index),
                    col: dash - bom,
                    key_range: start + dash..start + dash + 1,
                    colon: true,
                    value: if inline {
                        p.value.as_ref().map(|v| start + v.start..start + v.end)
                    } else {
                        None
                    },
                    block: inline && p.block,
                    after_colon: start + dash + 1,
                    flow: false,
                });
                item_counts.push(0);
                parent = Some(out.entries.len() - 1);
            }
            if let Some((key, range, colon, after)) = &p.key {
                if p.dashes.is_empty() {
                    parent = out.parent_for(p.content - bom, false);
                }
                out.entries.push(Entry {
                    parent,
                    seg: Seg::Key(key.clone()),
                    col: p.content - bom,
                    key_range: start + range.start..start + range.end,
                    colon: *colon,
                    value: p.value.as_ref().map(|v| start + v.start..start + v.end),
                    block: p.block,
                    after_colon: start + after,
                    flow: false,
                });
                item_counts.push(0);
            }
            out.add_flow_children(first, start, &mut item_counts);
            out.line_entries[line] = first..out.entries.len();
            if let Some(last) = out.entries.last()
                && out.entries.len() > first
                && last.block
            {
                open_block = Some(out.entries.len() - 1);
            }
        }
        out.children = vec![Vec::new(); out.entries.len()];
        for (i, e) in out.entries.iter().enumerate() {
            if let Some(p) = e.parent {
                out.children[p].push(i);
            }
        }
        out
    }

    /// The text of a line, without its line break.
    fn line_text(&self, line: usize) -> &'a str {
        let start = self.line_starts[line];
        let end = self
            .line_starts
            .get(line + 1)
            .map_or(self.text.len(), |&n| n - 1);
        self.text[start..end.max(start)].trim_end_matches('\r')
    }

    /// Adds the keys of the one-line flow mappings (`{id: a, type: map}`) written as values of
    /// the entries from `first` on, as their children (nested ones too, to a bounded depth).
    fn add_flow_children(&mut self, first: usize, line_start: usize, item_counts: &mut Vec<usize>) {
        let is_map = |o: &Self, i: usize| {
            o.entries[i]
                .value
                .as_ref()
                .is_some_and(|r| o.text[r.clone()].starts_with('{'))
        };
        let mut work: Vec<(usize, u32)> = (first..self.entries.len())
            .filter(|&i| is_map(self, i))
            .map(|i| (i, 0))
            .collect();
        while let Some((parent, depth)) = work.pop() {
            let Some(r) = self.entries[parent].value.clone() else {
                continue;
            };
            if depth >= MAX_FLOW_DEPTH {
                continue;
            }
            let s = &self.text[r.clone()];
            let inner_end = if s.len() >= 2 && s.ends_with('}') {
                r.end - 1
            } else {
                r.end
            };
            let inner_start = r.start + 1;
            for part in split_top(&self.text[inner_start..inner_end]) {
                let at = inner_start + part.start..inner_start + part.end;
                let piece = &self.text[at.clone()];
                if piece.is_empty() {
                    continue;
                }
                let (key, key_len, colon, after, value) = match key_end(piece) {
                    Some((key_len, colon_at)) => {
                        let v = &piece[colon_at + 1..];
                        let lead = v.len() - v.trim_start().len();
                        let vs = at.start + colon_at + 1 + lead;
                        let value = (!v.trim().is_empty()).then(|| vs..vs + v.trim().len());
                        let after = at.start + colon_at + 1;
                        (unquote(&piece[..key_len]), key_len, true, after, value)
                    }
                    None => (piece.to_owned(), piece.len(), false, at.end, None),
                };
                self.entries.push(Entry {
                    parent: Some(parent),
                    seg: Seg::Key(key),
                    col: at.start - line_start,
                    key_range: at.start..at.start + key_len,
                    colon,
                    value,
                    block: false,
                    after_colon: after,
                    flow: true,
                });
                item_counts.push(0);
                let i = self.entries.len() - 1;
                if is_map(self, i) {
                    work.push((i, depth + 1));
                }
            }
        }
    }

    /// The entry that a node starting at `col` on the next line belongs to.
    fn parent_for(&self, col: usize, dash: bool) -> Option<usize> {
        self.climb(self.entries.len().checked_sub(1), col, dash)
    }

    /// Climbing from entry `at`, the first one left of `col` that can hold children. A dash
    /// may sit at its parent key's own column (an indentless sequence).
    fn climb(&self, mut at: Option<usize>, col: usize, dash: bool) -> Option<usize> {
        while let Some(i) = at {
            let e = &self.entries[i];
            let open = e.value.is_none() && !e.block && !e.flow;
            let holds = match e.seg {
                Seg::Key(_) => e.colon && open && (e.col < col || (dash && e.col == col)),
                Seg::Index(_) => open && e.col < col,
            };
            if holds {
                return Some(i);
            }
            at = e.parent;
        }
        None
    }

    /// The config path of an entry.
    #[cfg(test)]
    pub fn path(&self, entry: usize) -> Vec<Seg> {
        let mut segs = Vec::new();
        let mut at = Some(entry);
        while let Some(i) = at {
            segs.push(self.entries[i].seg.clone());
            at = self.entries[i].parent;
        }
        segs.reverse();
        segs
    }

    /// The config path of an optional entry (`None`: the root).
    #[cfg(test)]
    pub fn path_of(&self, entry: Option<usize>) -> Vec<Seg> {
        entry.map_or_else(Vec::new, |e| self.path(e))
    }

    /// The children of an entry (`None`: the root's).
    pub fn children(&self, entry: Option<usize>) -> Vec<usize> {
        match entry {
            Some(e) => self.children.get(e).cloned().unwrap_or_default(),
            None => (0..self.entries.len())
                .filter(|&i| self.entries[i].parent.is_none())
                .collect(),
        }
    }

    /// The child of `entry` under `key`.
    pub fn child(&self, entry: Option<usize>, key: &str) -> Option<usize> {
        self.children(entry)
            .into_iter()
            .find(|&c| matches!(&self.entries[c].seg, Seg::Key(k) if k == key))
    }

    /// The scalar value of `entry`, unquoted.
    pub fn value(&self, entry: usize) -> Option<String> {
        let r = self.entries[entry].value.clone()?;
        Some(unquote(&self.text[r]))
    }

    /// The scalar value of `entry`'s child `key`, unquoted.
    pub fn child_value(&self, entry: Option<usize>, key: &str) -> Option<String> {
        self.value(self.child(entry, key)?)
    }

    /// Where the cursor at byte `offset` is.
    pub fn context(&self, offset: usize) -> Context {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let bom = if line == 0 && self.text.starts_with('\u{feff}') {
            '\u{feff}'.len_utf8()
        } else {
            0
        };
        let col = (offset - start).saturating_sub(bom);
        if let Some(owner) = self.block_owner[line] {
            let blank = self.line_text(line).trim().is_empty();
            if !blank || col > self.entries[owner].col {
                return Context::Block { entry: owner };
            }
        }
        let on_line = self.line_entries[line].clone();
        if on_line.is_empty() {
            // A blank line (or a comment): a new key of the mapping the column opens.
            let word = word_before(self.text, offset);
            return Context::Key {
                mapping: self.parent_before(line, col.saturating_sub(offset - word.start), false),
                entry: None,
                range: word.start..offset,
            };
        }
        // The innermost entry of the line that starts at or before the cursor.
        let Some(e) = on_line
            .filter(|&i| {
                let en = &self.entries[i];
                en.key_range.start <= offset || matches!(en.seg, Seg::Index(_))
            })
            .max_by_key(|&i| (self.entries[i].key_range.start.min(offset), i))
        else {
            return Context::None;
        };
        let en = &self.entries[e];
        match en.seg {
            Seg::Key(_) if offset <= en.key_range.end || !en.colon => Context::Key {
                mapping: en.parent,
                entry: Some(e),
                range: en.key_range.start..offset.max(en.key_range.start),
            },
            _ if offset >= en.after_colon => {
                if en.block {
                    return Context::Block { entry: e };
                }
                match en.value.clone() {
                    // Right after the `{` of a flow mapping: its first key.
                    Some(r) if offset > r.start && self.text[r.clone()].starts_with('{') => {
                        Context::Key {
                            mapping: Some(e),
                            entry: None,
                            range: offset..offset,
                        }
                    }
                    // After a `,` in a flow mapping: its next key.
                    Some(r)
                        if en.flow && offset > r.end && self.text[r.end..offset].contains(',') =>
                    {
                        Context::Key {
                            mapping: en.parent,
                            entry: None,
                            range: offset..offset,
                        }
                    }
                    Some(range) => Context::Value { entry: e, range },
                    None => Context::Value {
                        entry: e,
                        range: offset..offset,
                    },
                }
            }
            _ => Context::None,
        }
    }

    /// The entry a node at `col` on `line` would belong to, from the entries above `line`.
    fn parent_before(&self, line: usize, col: usize, dash: bool) -> Option<usize> {
        let last = self.line_entries[..line]
            .iter()
            .rev()
            .find(|r| !r.is_empty())
            .map(|r| r.end - 1);
        self.climb(last, col, dash)
    }
}

/// Where the cursor is, for completion and hover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Context {
    /// On a key (or typing a new one) of the mapping `mapping` (`None`: the root).
    Key {
        /// The entry holding the mapping.
        mapping: Option<usize>,
        /// The key's entry, when one is written there.
        entry: Option<usize>,
        /// What is typed of the key up to the cursor.
        range: Range<usize>,
    },
    /// In the inline value of `entry` (its range; empty at the cursor when none is written).
    Value {
        /// The key or item.
        entry: usize,
        /// The value's byte range.
        range: Range<usize>,
    },
    /// Inside the block scalar of `entry`.
    Block {
        /// The key or item.
        entry: usize,
    },
    /// Nowhere in particular.
    None,
}

fn parse_line(raw: &str, indent: usize) -> Option<Parsed> {
    let bytes = raw.as_bytes();
    let mut pos = indent;
    let mut dashes = Vec::new();
    while pos < bytes.len()
        && bytes[pos] == b'-'
        && (pos + 1 == bytes.len() || bytes[pos + 1] == b' ' || bytes[pos + 1] == b'\t')
    {
        dashes.push(pos);
        pos += 1;
        while pos < bytes.len() && (bytes[pos] == b' ' || bytes[pos] == b'\t') {
            pos += 1;
        }
    }
    let content = pos;
    let rest = &raw[content..];
    let mut p = Parsed {
        dashes,
        content,
        key: None,
        value: None,
        block: false,
    };
    if rest.trim().is_empty() || rest.starts_with('#') {
        return Some(p);
    }
    let value_from = |start: usize, p: &mut Parsed| {
        let v = strip_comment(&raw[start..]);
        let lead = v.len() - v.trim_start().len();
        let v = v.trim();
        if v.is_empty() {
            return;
        }
        let s = start + lead;
        if is_block_indicator(v) {
            p.block = true;
        } else {
            p.value = Some(s..s + v.len());
        }
    };
    match key_end(rest) {
        Some((key_len, colon_at)) => {
            let key = unquote(&rest[..key_len]);
            p.key = Some((
                key,
                content..content + key_len,
                true,
                content + colon_at + 1,
            ));
            value_from(content + colon_at + 1, &mut p);
        }
        None if p.dashes.is_empty() && !rest.starts_with(['{', '[', '"', '\'']) => {
            // A half-typed key: the word(s) before the cursor, no colon yet.
            let k = strip_comment(rest).trim_end();
            p.key = Some((
                k.to_owned(),
                content..content + k.len(),
                false,
                content + k.len(),
            ));
        }
        None => value_from(content, &mut p),
    }
    Some(p)
}

/// The length of a mapping key at the start of `s` and the index of its `:` (followed by a
/// space or the line's end), if `s` starts with one.
fn key_end(s: &str) -> Option<(usize, usize)> {
    let b = s.as_bytes();
    if b.first().is_some_and(|c| matches!(c, b'"' | b'\'')) {
        let q = b[0];
        let close = s[1..].find(q as char)? + 1;
        let after = &s[close + 1..];
        let t = after.trim_start();
        if t.starts_with(':') && (t.len() == 1 || t[1..].starts_with([' ', '\t'])) {
            return Some((close + 1, close + 1 + (after.len() - t.len())));
        }
        return None;
    }
    if b.first()
        .is_some_and(|c| matches!(c, b'{' | b'[' | b'#' | b'&' | b'*' | b'!'))
    {
        return None;
    }
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'#' && i > 0 && (b[i - 1] == b' ' || b[i - 1] == b'\t') {
            return None;
        }
        if b[i] == b':' && (i + 1 == b.len() || b[i + 1] == b' ' || b[i + 1] == b'\t') {
            let key_len = s[..i].trim_end().len();
            return Some((key_len, i));
        }
        i += 1;
    }
    None
}

fn is_block_indicator(v: &str) -> bool {
    let mut c = v.chars();
    matches!(c.next(), Some('|' | '>')) && c.all(|c| c.is_ascii_digit() || c == '+' || c == '-')
}

/// `s` without a trailing ` # comment` (outside quotes).
fn strip_comment(s: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for (i, c) in s.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if (c == '"' || c == '\'') && (prev == ' ' || i == 0) => quote = Some(c),
            None if c == '#' && (prev == ' ' || prev == '\t' || i == 0) => return &s[..i],
            None => {}
        }
        prev = c;
    }
    s
}

/// A scalar's text without its quotes.
pub fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].to_owned();
        }
    }
    s.to_owned()
}

/// The identifier-like word that ends at `offset`.
pub fn word_before(text: &str, offset: usize) -> Range<usize> {
    let before = &text[..offset];
    let start = before
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_alphanumeric() || *c == '_' || *c == '-')
        .last()
        .map_or(offset, |(i, _)| i);
    start..offset
}

/// The identifier (letters, digits, `_`) around `offset`.
pub fn word_at(text: &str, offset: usize) -> Range<usize> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let offset = offset.min(text.len());
    let start = text[..offset]
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_word(*c))
        .last()
        .map_or(offset, |(i, _)| i);
    let end = text[offset..]
        .char_indices()
        .find(|(_, c)| !is_word(*c))
        .map_or(text.len(), |(i, _)| offset + i);
    start..end
}

/// The items of a flow sequence (`[a, "b"]`) written at `range`, each unquoted with its byte
/// range; a plain scalar is one item.
pub fn flow_items(text: &str, range: Range<usize>) -> Vec<(String, Range<usize>)> {
    let s = &text[range.clone()];
    let Some(inner) = s.strip_prefix('[') else {
        return vec![(unquote(s), range)];
    };
    let inner = inner.strip_suffix(']').unwrap_or(inner);
    let at = range.start + 1;
    split_top(inner)
        .into_iter()
        .map(|r| (unquote(&inner[r.clone()]), at + r.start..at + r.end))
        .collect()
}

/// The comma-separated parts of a flow collection's inside, trimmed: commas inside quotes or
/// nested brackets do not split. Relative byte ranges.
fn split_top(s: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut start = 0;
    let push = |a: usize, b: usize, out: &mut Vec<Range<usize>>| {
        let part = &s[a..b];
        let lead = part.len() - part.trim_start().len();
        let t = part.trim();
        out.push(a + lead..a + lead + t.len());
    };
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            (None, ',') if depth == 0 => {
                push(start, i, &mut out);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(start, s.len(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
version: 1
pipelines:
  - id: p   # the pipeline
    sources:
    - id: src
      type: file
    operators:
      - id: m
        type: map
        input: src
        script: |
          fn map(r) { #{a: r.x} }

      - id: \"k\"
        inputs: [m, src]
";

    fn paths(o: &Outline<'_>) -> Vec<String> {
        (0..o.entries.len())
            .map(|i| {
                o.path(i)
                    .iter()
                    .map(|s| match s {
                        Seg::Key(k) => k.clone(),
                        Seg::Index(n) => n.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect()
    }

    #[test]
    fn paths_follow_indentation_and_items() {
        let o = Outline::new(TEXT);
        assert_eq!(
            paths(&o),
            [
                "version",
                "pipelines",
                "pipelines.0",
                "pipelines.0.id",
                "pipelines.0.sources",
                "pipelines.0.sources.0",
                "pipelines.0.sources.0.id",
                "pipelines.0.sources.0.type",
                "pipelines.0.operators",
                "pipelines.0.operators.0",
                "pipelines.0.operators.0.id",
                "pipelines.0.operators.0.type",
                "pipelines.0.operators.0.input",
                "pipelines.0.operators.0.script",
                "pipelines.0.operators.1",
                "pipelines.0.operators.1.id",
                "pipelines.0.operators.1.inputs",
            ]
        );
        assert_eq!(o.value(3).as_deref(), Some("p"));
        assert_eq!(o.value(15).as_deref(), Some("k"));
        let ops = o.child(Some(2), "operators");
        let first = o.children(ops)[0];
        assert_eq!(o.child_value(Some(first), "type").as_deref(), Some("map"));
        let inputs = o.entries[16].value.clone().unwrap_or_default();
        let items = flow_items(TEXT, inputs);
        assert_eq!(
            items.iter().map(|i| i.0.as_str()).collect::<Vec<_>>(),
            ["m", "src"]
        );
        assert_eq!(&TEXT[items[1].1.clone()], "src");
    }

    #[test]
    fn contexts_of_keys_values_blocks_and_new_lines() {
        let o = Outline::new(TEXT);
        let at = |needle: &str, plus: usize| TEXT.find(needle).unwrap_or_default() + plus;
        // On `type` of the source.
        assert!(matches!(
            o.context(at("type: file", 2)),
            Context::Key { entry: Some(7), .. }
        ));
        // In its value.
        assert!(matches!(
            o.context(at("file\n", 1)),
            Context::Value { entry: 7, .. }
        ));
        // In the script.
        assert_eq!(o.context(at("fn map", 3)), Context::Block { entry: 13 });
        // The empty line after the script, at column 0: a new key of the root mapping.
        let blank = at("\n\n", 1);
        assert_eq!(
            o.context(blank),
            Context::Key {
                mapping: None,
                entry: None,
                range: blank..blank
            }
        );
        // A new line at the operator's key column: a new key of the operator.
        let text = TEXT.replace("\n\n", "\n        \n");
        let o = Outline::new(&text);
        let blank = text.find("\n        \n").unwrap_or_default() + 9;
        assert_eq!(
            o.context(blank),
            Context::Key {
                mapping: Some(9),
                entry: None,
                range: blank..blank
            }
        );
    }

    #[test]
    fn half_typed_lines_still_have_a_place() {
        let text = "pipelines:\n  - id: p\n    sour\n    sources:\n      - type: \n";
        let o = Outline::new(text);
        let at = text.find("sour").unwrap_or_default() + 4;
        match o.context(at) {
            Context::Key { mapping, range, .. } => {
                assert_eq!(
                    o.path_of(mapping),
                    [Seg::Key("pipelines".into()), Seg::Index(0)]
                );
                assert_eq!(&text[range], "sour");
            }
            other => panic!("unexpected {other:?}"),
        }
        let at = text.find("type: ").unwrap_or_default() + 6;
        match o.context(at) {
            Context::Value { entry, range } => {
                assert_eq!(range, at..at);
                assert_eq!(o.path(entry).len(), 5);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn flow_mappings_hold_their_keys() {
        let text = "pipelines:\n  - id: p\n    operators:\n      - {id: k, type: key_by, input: src, inputs: [a, \"b,c\"], x: {y: 1}}\n";
        let o = Outline::new(text);
        let item = 4;
        assert_eq!(o.child_value(Some(item), "id").as_deref(), Some("k"));
        assert_eq!(o.child_value(Some(item), "type").as_deref(), Some("key_by"));
        let inputs = o
            .child(Some(item), "inputs")
            .and_then(|i| o.entries[i].value.clone());
        let items = flow_items(text, inputs.unwrap_or_default());
        assert_eq!(
            items.iter().map(|i| i.0.as_str()).collect::<Vec<_>>(),
            ["a", "b,c"]
        );
        let x = o.child(Some(item), "x");
        assert_eq!(o.child_value(x, "y").as_deref(), Some("1"));
        let at = |needle: &str, plus: usize| text.find(needle).unwrap_or_default() + plus;
        match o.context(at("src", 1)) {
            Context::Value { entry, .. } => {
                assert_eq!(o.path(entry).last(), Some(&Seg::Key("input".into())))
            }
            other => panic!("unexpected {other:?}"),
        }
        match o.context(at("type", 2)) {
            Context::Key { mapping, .. } => assert_eq!(mapping, Some(item)),
            other => panic!("unexpected {other:?}"),
        }
        // Right after `{`, and after a `,`: a new key of the flow mapping.
        let text = "a:\n  - {\n  - {id: k, \n";
        let o = Outline::new(text);
        assert!(matches!(
            o.context(text.find('{').unwrap_or_default() + 1),
            Context::Key {
                mapping: Some(1),
                entry: None,
                ..
            }
        ));
        assert!(matches!(
            o.context(text.find("k, ").unwrap_or_default() + 3),
            Context::Key {
                mapping: Some(2),
                entry: None,
                ..
            }
        ));
    }

    #[test]
    fn a_byte_order_mark_takes_no_column() {
        let text = "\u{feff}pipelines:\n  - id: p\n";
        let o = Outline::new(text);
        assert_eq!(o.value(2).as_deref(), Some("p"));
        assert_eq!(
            o.path(2),
            [
                Seg::Key("pipelines".into()),
                Seg::Index(0),
                Seg::Key("id".into())
            ]
        );
    }

    #[test]
    fn any_text_gives_an_outline() {
        for text in [
            "",
            "\u{0}\u{1}: -",
            "- - - x",
            ": :",
            "\"a",
            "key: 'x",
            "a:\n\tb: 1\n  - c",
            "|\n x",
        ] {
            let o = Outline::new(text);
            for off in 0..=text.len() {
                if text.is_char_boundary(off) {
                    let _ = o.context(off);
                }
            }
        }
    }
}
