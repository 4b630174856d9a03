//! The pipeline-file target: what `weir validate`, `weir graph`, `weir run` and every reload
//! do with a file (load within limits, schema, semantic checks, Rhai compilation, planning,
//! graph rendering, diagnostic rendering), fed with structure-aware mutants of every YAML
//! file in the repository plus raw bytes.
//!
//! A seed file is read into a [`Tree`] and mutated as a tree (scalars replaced by odd ones,
//! entries deleted, duplicated or renamed, nodes nested hundreds deep, anchors and alias
//! fans, subtrees grafted from other files, `type:` values swapped), then written back as
//! YAML in block or flow style, and sometimes damaged byte by byte afterwards.
//!
//! An input may start with the comment `# base: DIR` (a path relative to the repository),
//! the directory its relative paths (`script_file:`) resolve against; being a YAML comment,
//! it is also part of the file validated.

use std::path::{Path, PathBuf};

use miette::{GraphicalReportHandler, GraphicalTheme};
use weir_schema::span::{Node, NodeValue};

use crate::{Rng, Target, bytes};

/// A YAML document as the mutator sees it.
#[derive(Clone, Debug)]
pub enum Tree {
    /// A scalar written as it is (a number, a boolean, a plain word).
    Plain(String),
    /// A string, written quoted or as a block scalar as its content needs.
    Str(String),
    /// A sequence.
    Seq(Vec<Tree>),
    /// A mapping.
    Map(Vec<(String, Tree)>),
    /// `&name` before a node.
    Anchored(String, Box<Tree>),
    /// `*name`.
    Alias(String),
    /// A node inside `levels` flow sequences (`[[[x]]]`) or mappings (`{a: {a: x}}`), written
    /// without recursion, so that the mutator itself stays stack-safe however deep it goes.
    Deep {
        /// Nesting levels.
        levels: usize,
        /// Sequences, or mappings.
        seq: bool,
        /// The innermost node.
        inner: Box<Tree>,
    },
}

impl Tree {
    /// The tree of a loaded document.
    pub fn from_node(node: &Node) -> Self {
        match &node.value {
            NodeValue::Scalar(serde_json::Value::String(s)) => Self::Str(s.clone()),
            NodeValue::Scalar(v) => Self::Plain(v.to_string()),
            NodeValue::Seq(items) => Self::Seq(items.iter().map(Self::from_node).collect()),
            NodeValue::Map(entries) => Self::Map(
                entries
                    .iter()
                    .map(|(k, _, v)| (k.clone(), Self::from_node(v)))
                    .collect(),
            ),
        }
    }

    /// How many nodes the tree has.
    fn count(&self) -> usize {
        match self {
            Self::Seq(items) => 1 + items.iter().map(Self::count).sum::<usize>(),
            Self::Map(entries) => 1 + entries.iter().map(|(_, v)| v.count()).sum::<usize>(),
            Self::Anchored(_, t) => t.count(),
            Self::Deep { inner, .. } => 1 + inner.count(),
            _ => 1,
        }
    }

    /// The `n`-th node in pre-order (wrapping).
    fn nth_mut(&mut self, n: usize) -> &mut Tree {
        let total = self.count();
        let mut left = n % total.max(1);
        self.find_mut(&mut left).expect("n is below the node count")
    }

    fn find_mut(&mut self, left: &mut usize) -> Option<&mut Tree> {
        if let Self::Anchored(_, t) = self {
            return t.find_mut(left);
        }
        if *left == 0 {
            return Some(self);
        }
        *left -= 1;
        match self {
            Self::Seq(items) => items.iter_mut().find_map(|t| t.find_mut(left)),
            Self::Map(entries) => entries.iter_mut().find_map(|(_, t)| t.find_mut(left)),
            Self::Deep { inner, .. } => inner.find_mut(left),
            _ => None,
        }
    }

    /// Every mapping key in the tree.
    fn keys(&self, out: &mut Vec<String>) {
        match self {
            Self::Seq(items) => items.iter().for_each(|t| t.keys(out)),
            Self::Map(entries) => {
                for (k, v) in entries {
                    out.push(k.clone());
                    v.keys(out);
                }
            }
            Self::Anchored(_, t) | Self::Deep { inner: t, .. } => t.keys(out),
            _ => {}
        }
    }

    /// Every scalar in the tree (as text).
    fn scalars(&self, out: &mut Vec<String>) {
        match self {
            Self::Plain(s) | Self::Str(s) => out.push(s.clone()),
            Self::Seq(items) => items.iter().for_each(|t| t.scalars(out)),
            Self::Map(entries) => entries.iter().for_each(|(_, v)| v.scalars(out)),
            Self::Anchored(_, t) | Self::Deep { inner: t, .. } => t.scalars(out),
            Self::Alias(_) => {}
        }
    }
}

/// Writes a tree as YAML.
pub fn emit(tree: &Tree, rng: &mut Rng) -> String {
    let mut out = String::new();
    let flow_below = if rng.chance(20) {
        0
    } else {
        rng.between(1, 12)
    };
    Emitter { rng, flow_below }.block(tree, 0, &mut out);
    out
}

struct Emitter<'a> {
    rng: &'a mut Rng,
    /// Collections deeper than this are written in flow style.
    flow_below: usize,
}

impl Emitter<'_> {
    fn block(&mut self, tree: &Tree, depth: usize, out: &mut String) {
        let indent = "  ".repeat(depth);
        match tree {
            Tree::Map(entries) if !entries.is_empty() && depth < self.flow_below => {
                for (k, v) in entries {
                    out.push_str(&indent);
                    out.push_str(&key(k));
                    out.push(':');
                    self.after_indicator(v, depth, out);
                }
            }
            Tree::Seq(items) if !items.is_empty() && depth < self.flow_below => {
                for v in items {
                    out.push_str(&indent);
                    out.push('-');
                    self.after_indicator(v, depth, out);
                }
            }
            other => {
                out.push_str(&indent);
                self.inline(other, out);
                out.push('\n');
            }
        }
    }

    /// A value after `key:` or `-`: inline, a block scalar, or a block collection below.
    fn after_indicator(&mut self, v: &Tree, depth: usize, out: &mut String) {
        match v {
            Tree::Anchored(name, inner) if is_block(inner, depth + 1, self.flow_below) => {
                out.push_str(&format!(" &{name}\n"));
                self.block(inner, depth + 1, out);
            }
            t if is_block(t, depth + 1, self.flow_below) => {
                out.push('\n');
                self.block(t, depth + 1, out);
            }
            Tree::Deep {
                levels,
                seq: true,
                inner,
            } if self.rng.chance(50) => {
                // Block sequences on one line: `- - - x`.
                out.push('\n');
                out.push_str(&"  ".repeat(depth + 1));
                out.push_str(&"- ".repeat(*levels));
                self.inline(inner, out);
                out.push('\n');
            }
            Tree::Str(s) if s.contains('\n') && literal_ok(s) && !self.rng.chance(20) => {
                out.push_str(&literal(s, depth + 1));
            }
            t => {
                out.push(' ');
                self.inline(t, out);
                out.push('\n');
            }
        }
    }

    /// A flow-style node on one line.
    fn inline(&mut self, tree: &Tree, out: &mut String) {
        match tree {
            Tree::Plain(s) => out.push_str(s),
            Tree::Str(s) => out.push_str(&scalar(s)),
            Tree::Alias(name) => {
                out.push('*');
                out.push_str(name);
                // An alias directly before `:` would read the colon as part of its name.
                out.push(' ');
            }
            Tree::Anchored(name, inner) => {
                out.push_str(&format!("&{name} "));
                self.inline(inner, out);
            }
            Tree::Seq(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.inline(v, out);
                }
                out.push(']');
            }
            Tree::Map(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&key(k));
                    out.push_str(": ");
                    self.inline(v, out);
                }
                out.push('}');
            }
            Tree::Deep { levels, seq, inner } => {
                let (open, close) = if *seq { ("[", "]") } else { ("{a: ", "}") };
                out.push_str(&open.repeat(*levels));
                self.inline(inner, out);
                out.push_str(&close.repeat(*levels));
            }
        }
    }
}

fn is_block(tree: &Tree, depth: usize, flow_below: usize) -> bool {
    match tree {
        Tree::Map(e) => !e.is_empty() && depth < flow_below,
        Tree::Seq(i) => !i.is_empty() && depth < flow_below,
        _ => false,
    }
}

/// A key as YAML: plain when safe, otherwise double-quoted.
fn key(k: &str) -> String {
    if plain_ok(k) { k.to_owned() } else { quoted(k) }
}

/// A string scalar: plain when it would read back as the same string, else double-quoted.
fn scalar(s: &str) -> String {
    if plain_ok(s) && !looks_typed(s) {
        s.to_owned()
    } else {
        quoted(s)
    }
}

fn plain_ok(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !s.starts_with(['-', '.'])
}

/// Whether a plain scalar would resolve to something other than a string.
fn looks_typed(s: &str) -> bool {
    s.parse::<f64>().is_ok()
        || matches!(
            s.to_ascii_lowercase().as_str(),
            "null" | "true" | "false" | "~" | ".inf" | ".nan"
        )
        || s.starts_with("0x")
        || s.starts_with("0o")
}

/// JSON string syntax, which YAML's double-quoted style reads the same way.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// Whether a string can be written as a `|` block scalar and read back the same.
fn literal_ok(s: &str) -> bool {
    let first = s.lines().find(|l| !l.is_empty());
    first.is_some_and(|l| !l.starts_with(' '))
        && !s.starts_with('\n')
        && s.chars()
            .all(|c| c == '\n' || (!c.is_control() && c != '\u{feff}'))
        && s.lines().all(|l| !l.ends_with(' '))
}

fn literal(s: &str, depth: usize) -> String {
    let indent = "  ".repeat(depth.max(1));
    let trailing = s.len() - s.trim_end_matches('\n').len();
    let chomp = match trailing {
        0 => "-",
        1 => "",
        _ => "+",
    };
    let mut out = format!(" |{chomp}\n");
    for line in s.trim_end_matches('\n').split('\n') {
        if !line.is_empty() {
            out.push_str(&indent);
        }
        out.push_str(line);
        out.push('\n');
    }
    for _ in 1..trailing {
        out.push('\n');
    }
    out
}

/// Scalars that probe number, duration, size and id parsing, and YAML's type resolution.
const ODD_SCALARS: &[&str] = &[
    "0",
    "-1",
    "-0",
    "1e400",
    "-1e400",
    "99999999999999999999999999",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "4294967296",
    "65536",
    "0x7fffffffffffffff",
    "0o777",
    ".nan",
    ".inf",
    "-.inf",
    "~",
    "null",
    "true",
    "yes",
    "1_000",
    "0s",
    "-1s",
    "1ns",
    "18446744073709551615s",
    "100000000000000000h",
    "1 parsecs",
    "0B",
    "1B",
    "18446744073709551615B",
    "99999999999TiB",
    "1.5.5MiB",
    "",
    " ",
    "é✓😀",
    "\u{202e}abc",
    "a\u{0}b",
    "../../../etc/passwd",
    "/dev/zero",
    "/etc/passwd",
    "a/b",
    "CON",
    ".",
    "..",
    "fn map(r) { r }",
    "fn map(r) { map(r) }",
    "fn filter(r) { loop {} }",
    "fn map(r) { let x = []; for i in 0..100000000 { x.push(i) } r }",
    "fn map(r",
    "fn key(r) { r.id }",
    "fn reduce(acc, r) { acc }",
    "fn process(r, ctx) { emit(r) }",
    "file:///tmp/x",
    "s3://bucket/x",
    "exactly_once",
    "at_least_once",
    "rocksdb",
    "memory",
    "individual",
];

/// Raw pieces for byte-level insertion and random inputs.
const TOKENS: &[&[u8]] = &[
    b"- ",
    b": ",
    b"\n",
    b"\n  ",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b"&a ",
    b"*a",
    b"! ",
    b"!!str ",
    b"!!int ",
    b"? ",
    b"|",
    b">",
    b"|-",
    b"'",
    b"\"",
    b"#",
    b"---\n",
    b"...\n",
    b"%YAML 1.2\n",
    b"%TAG ! tag:x,1:\n",
    b"\t",
    b"version: 1\n",
    b"pipelines:\n",
    b"id: p\n",
    b"type: map\n",
    b"script: |\n  fn map(r) { r }\n",
    b"\\",
    b"\\u0000",
    b"\\x",
    b"<<: *a\n",
    b"@",
    b"`",
];

/// The pipeline-file target.
pub struct PipelineFile {
    root: PathBuf,
    seeds: Vec<Seed>,
    keys: Vec<String>,
    scalars: Vec<String>,
}

struct Seed {
    /// Directory relative to the repository root.
    dir: String,
    text: String,
    tree: Option<Tree>,
}

impl PipelineFile {
    /// Seeds from every YAML file under `pipelines/`, `examples/` and `tests/`.
    pub fn from_repository() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        Self::from_dirs(&root, &["pipelines", "examples", "tests"])
    }

    /// Seeds from every YAML file under `dirs` of `root`.
    pub fn from_dirs(root: &Path, dirs: &[&str]) -> Self {
        let mut files = Vec::new();
        let mut pending: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    if !matches!(
                        name.as_str(),
                        "data" | "expected" | "out" | ".weir" | "target"
                    ) {
                        pending.push(path);
                    }
                } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                    files.push(path);
                }
            }
        }
        files.sort();
        let mut seeds = Vec::new();
        let (mut keys, mut scalars) = (Vec::new(), Vec::new());
        for path in files {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let loaded = weir_schema::load_str("seed.yaml", &text);
            let tree = loaded.spans.map(|s| Tree::from_node(s.root()));
            if let Some(t) = &tree {
                t.keys(&mut keys);
                t.scalars(&mut scalars);
            }
            let dir = path
                .parent()
                .and_then(|d| d.strip_prefix(root).ok())
                .map_or_else(String::new, |d| d.display().to_string());
            seeds.push(Seed { dir, text, tree });
        }
        keys.sort();
        keys.dedup();
        scalars.sort();
        scalars.dedup();
        scalars.retain(|s| s.len() < 2000);
        Self {
            root: root.to_path_buf(),
            seeds,
            keys,
            scalars,
        }
    }

    /// How many seed files were found.
    pub fn seeds(&self) -> usize {
        self.seeds.len()
    }

    /// One structural mutation of `tree`.
    fn mutate(&self, rng: &mut Rng, tree: &mut Tree) {
        let total = tree.count();
        let at = rng.below(total);
        match rng.below(12) {
            // An odd scalar, or one from another file.
            0 | 1 => {
                let s = if rng.chance(60) {
                    (*rng.pick(ODD_SCALARS)).to_owned()
                } else if self.scalars.is_empty() {
                    String::new()
                } else {
                    rng.pick(&self.scalars).clone()
                };
                *tree.nth_mut(at) = match rng.below(3) {
                    // Unquoted, whatever it holds (it may well break the syntax).
                    0 if !s.is_empty() => Tree::Plain(s),
                    1 => Tree::Plain(if s.is_empty() {
                        "''".into()
                    } else {
                        scalar(&s)
                    }),
                    _ => Tree::Str(s),
                };
            }
            // Delete an entry or an item.
            2 => match tree.nth_mut(at) {
                Tree::Map(e) if !e.is_empty() => {
                    let i = rng.below(e.len());
                    e.remove(i);
                }
                Tree::Seq(v) if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v.remove(i);
                }
                _ => {}
            },
            // Duplicate an entry (a duplicate key) or an item, sometimes many times.
            3 => {
                let times = if rng.chance(10) {
                    rng.between(2, 500)
                } else {
                    1
                };
                match tree.nth_mut(at) {
                    Tree::Map(e) if !e.is_empty() => {
                        let i = rng.below(e.len());
                        for _ in 0..times {
                            e.insert(i, e[i].clone());
                        }
                    }
                    Tree::Seq(v) if !v.is_empty() => {
                        let i = rng.below(v.len());
                        for _ in 0..times {
                            v.insert(i, v[i].clone());
                        }
                    }
                    _ => {}
                }
            }
            // Rename a key (misplaced, unknown or empty keys).
            4 => {
                if let Tree::Map(e) = tree.nth_mut(at)
                    && !e.is_empty()
                {
                    let i = rng.below(e.len());
                    e[i].0 = if rng.chance(80) && !self.keys.is_empty() {
                        rng.pick(&self.keys).clone()
                    } else {
                        (*rng.pick(ODD_SCALARS)).to_owned()
                    };
                }
            }
            // Nest a node, a little or far beyond the depth limit.
            5 => {
                let levels = match rng.below(4) {
                    0 => rng.between(240, 270),
                    1 => rng.between(1000, 6000),
                    _ => rng.between(1, 8),
                };
                let seq = rng.chance(50);
                let node = tree.nth_mut(at);
                let inner = std::mem::replace(node, Tree::Plain("x".into()));
                *node = Tree::Deep {
                    levels,
                    seq,
                    inner: Box::new(inner),
                };
            }
            // Anchor a node and alias it from elsewhere (after it, so that most resolve).
            6 => {
                let name = format!("a{}", rng.below(4));
                let node = tree.nth_mut(at);
                let inner = std::mem::replace(node, Tree::Plain("x".into()));
                *node = Tree::Anchored(name.clone(), Box::new(inner));
                for _ in 0..rng.between(1, 12) {
                    let later = at + 1 + rng.below(total.max(1));
                    if later < tree.count() {
                        *tree.nth_mut(later) = Tree::Alias(name.clone());
                    }
                }
            }
            // A fan of aliases: each level references the previous one `fan` times.
            7 => {
                let fan = rng.between(2, 12);
                let levels = rng.between(1, 8);
                let mut entries = vec![(
                    "l0".to_owned(),
                    Tree::Anchored(
                        "l0".into(),
                        Box::new(Tree::Str("x".repeat(rng.small(100_000)))),
                    ),
                )];
                for l in 1..=levels {
                    let refs = vec![Tree::Alias(format!("l{}", l - 1)); fan];
                    entries.push((
                        format!("l{l}"),
                        Tree::Anchored(format!("l{l}"), Box::new(Tree::Seq(refs))),
                    ));
                }
                if let Tree::Map(root) = tree {
                    root.extend(entries);
                } else {
                    *tree.nth_mut(at) = Tree::Map(entries);
                }
            }
            // Graft a subtree of another seed.
            8 => {
                let other = rng.pick(&self.seeds);
                if let Some(t) = &other.tree {
                    let mut donor = t.clone();
                    let n = rng.below(donor.count());
                    let piece = donor.nth_mut(n).clone();
                    *tree.nth_mut(at) = piece;
                }
            }
            // A large collection.
            9 => {
                let n = rng.between(100, 20_000);
                *tree.nth_mut(at) = if rng.chance(50) {
                    Tree::Seq((0..n).map(|i| Tree::Plain(i.to_string())).collect())
                } else {
                    Tree::Map(
                        (0..n)
                            .map(|i| (format!("k{i}"), Tree::Plain("1".into())))
                            .collect(),
                    )
                };
            }
            // A number where a count is expected.
            10 => {
                let n = *rng.pick(&[
                    "0",
                    "-1",
                    "1",
                    "4294967295",
                    "4294967296",
                    "32768",
                    "32769",
                    "9223372036854775807",
                    "1e19",
                    "1.5",
                ]);
                *tree.nth_mut(at) = Tree::Plain(n.to_owned());
            }
            // A deep Rhai expression (the script compiler's own limits).
            _ => {
                let depth = rng.between(10, 3000);
                let body = format!(
                    "fn map(r) {{ {}1{} }}",
                    "(".repeat(depth),
                    ")".repeat(depth)
                );
                *tree.nth_mut(at) = Tree::Str(body);
            }
        }
    }
}

impl Target for PipelineFile {
    fn name(&self) -> &'static str {
        "pipeline-file"
    }

    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        if self.seeds.is_empty() || rng.chance(5) {
            return bytes::random(rng, 4096, TOKENS);
        }
        let seed = rng.pick(&self.seeds);
        let mut out = format!("# base: {}\n", seed.dir).into_bytes();
        match &seed.tree {
            Some(tree) if rng.chance(80) => {
                let mut tree = tree.clone();
                for _ in 0..rng.between(1, 4) {
                    self.mutate(rng, &mut tree);
                }
                out.extend_from_slice(emit(&tree, rng).as_bytes());
                if rng.chance(20) {
                    bytes::mutate(rng, &mut out, TOKENS);
                }
            }
            _ => {
                out.extend_from_slice(seed.text.as_bytes());
                bytes::mutate(rng, &mut out, TOKENS);
            }
        }
        out
    }

    fn run(&self, input: &[u8]) {
        let base = input
            .strip_prefix(b"# base: ")
            .and_then(|rest| rest.split(|&b| b == b'\n').next())
            .and_then(|dir| std::str::from_utf8(dir).ok())
            .filter(|dir| !dir.contains(".."))
            .map_or_else(|| self.root.clone(), |dir| self.root.join(dir));
        let validation = weir_engine::validate::validate_bytes("fuzz.yaml", input.to_vec(), &base);
        // What `weir validate` prints, both ways.
        let handler = GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
            .with_context_lines(2);
        let mut text = String::new();
        for d in validation.diagnostics.iter() {
            let _ = handler.render_report(&mut text, d);
            let _ = serde_json::to_string(&d.to_json());
        }
        // What `weir graph` and `weir run` do next.
        if let Some(Ok(plan)) = validation.plan() {
            let _ = weir_engine::plan::render::text(&plan);
            let _ = weir_engine::plan::render::dot(&plan);
            let _ = weir_engine::plan::render::mermaid(&plan);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_round_trip_through_the_emitter() {
        let target = PipelineFile::from_repository();
        assert!(target.seeds() >= 20, "{} seeds", target.seeds());
        let mut rng = Rng::for_input(3, 0);
        let mut checked = 0;
        for seed in &target.seeds {
            let Some(tree) = &seed.tree else { continue };
            let text = emit(tree, &mut rng);
            let again = weir_schema::load_str("again.yaml", &text);
            let original = weir_schema::load_str("seed.yaml", &seed.text);
            let (Some(a), Some(b)) = (again.spans, original.spans) else {
                panic!(
                    "the emitted seed does not parse:\n{text}\n{:#?}",
                    again.diagnostics
                );
            };
            assert_eq!(a.root().to_json(), b.root().to_json(), "{text}");
            checked += 1;
        }
        assert!(checked >= 20);
    }
}
