//! Semantic validation: the rules a schema cannot express, checked over the typed spec with
//! every finding located through the span index.
//!
//! Rules run independently and all of them run: ids, wiring, cycles, reachability, keyed
//! operators, parallelism, delivery guarantees, durations and strategy parameters, operator
//! options. Script compilation is not here (the engine owns Rhai); this module only checks
//! that an operator that needs a script has exactly one.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::diagnostic::{Diagnostic, Diagnostics, codes, did_you_mean};
use crate::model::{
    AggregateSpec, CheckpointMode, EventTimeSpec, FailoverSpec, FileSpec, GeneratorFieldSpec,
    OnErrorSpec, OperatorSpec, PartitioningSpec, PipelineSpec, RestartSpec, SinkSpec, SourceSpec,
    StateSpec, WindowKindSpec, WindowSpec, WindowTimeSpec,
};
use crate::registry::Section;
use crate::registry::{ProcessSpec, StateDeclSpec};
use crate::span::{SourceFile, SpanIndex, YamlPath};
use crate::units::DurationSpec;

/// Runs every semantic rule over a loaded spec.
///
/// `base_dir` is the pipeline file's directory (relative paths resolve against it).
pub fn validate(
    spec: &FileSpec,
    spans: &SpanIndex,
    file: &Arc<SourceFile>,
    base_dir: &Path,
) -> Diagnostics {
    let _ = base_dir;
    let mut cx = Cx {
        spans,
        file,
        out: Diagnostics::new(),
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (pi, p) in spec.pipelines.iter().enumerate() {
        let path = YamlPath::root().join("pipelines").join(pi).join("id");
        if let Some(first) = seen.insert(&p.id, pi) {
            let first_span = spans.span(&YamlPath::root().join("pipelines").join(first).join("id"));
            cx.error(codes::DUPLICATE_ID, &path, format!("pipeline id `{}` is used twice", p.id), "duplicate pipeline id")
                .help("pipeline ids name checkpoint directories and API entries; give each pipeline its own")
                .related(first_span, "first used here")
                .push(&mut cx.out);
        }
        PipelineCheck::new(&mut cx, pi, p).run();
    }
    check_api(&mut cx, spec);
    cx.out
}

/// `api.token_env` must be a name an environment variable can have.
fn check_api(cx: &mut Cx<'_>, spec: &FileSpec) {
    let Some(name) = &spec.api.token_env else {
        return;
    };
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        let path = YamlPath::root().join("api").join("token_env");
        cx.error(
            codes::INVALID_VALUE,
            &path,
            format!("`{name}` is not an environment variable name"),
            "not a variable name",
        )
        .help("name the variable that holds the token, such as `WEIR_TOKEN` (letters, digits and `_`, not starting with a digit); not the token itself")
        .push(&mut cx.out);
    }
}

struct Cx<'a> {
    spans: &'a SpanIndex,
    file: &'a Arc<SourceFile>,
    out: Diagnostics,
}

/// A diagnostic under construction (so `push` reads last).
struct Pending(Diagnostic);

impl Pending {
    fn help(self, h: impl Into<String>) -> Self {
        Self(self.0.help(h))
    }
    fn related(self, span: std::ops::Range<usize>, l: impl Into<String>) -> Self {
        Self(self.0.related(span, l))
    }
    fn push(self, out: &mut Diagnostics) {
        out.push(self.0);
    }
}

impl Cx<'_> {
    fn make(&self, d: Diagnostic, path: &YamlPath, label: impl Into<String>) -> Pending {
        Pending(
            d.at(self.file, self.spans.span(path))
                .label(label)
                .with_path(path.clone()),
        )
    }
    fn error(
        &self,
        code: &'static str,
        path: &YamlPath,
        msg: impl Into<String>,
        label: impl Into<String>,
    ) -> Pending {
        self.make(Diagnostic::error(code, msg), path, label)
    }
    fn warning(
        &self,
        code: &'static str,
        path: &YamlPath,
        msg: impl Into<String>,
        label: impl Into<String>,
    ) -> Pending {
        self.make(Diagnostic::warning(code, msg), path, label)
    }
    /// The span of a key (for fields whose presence, not value, is the problem).
    fn key_error(
        &self,
        code: &'static str,
        path: &YamlPath,
        msg: impl Into<String>,
        label: impl Into<String>,
    ) -> Pending {
        Pending(
            Diagnostic::error(code, msg)
                .at(self.file, self.spans.key_span(path))
                .label(label)
                .with_path(path.clone()),
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Elem {
    section: Section,
    index: usize,
}

struct PipelineCheck<'a, 'c> {
    cx: &'c mut Cx<'a>,
    p: &'a PipelineSpec,
    base: YamlPath,
    ids: HashMap<&'a str, Elem>,
}

const ID_HELP: &str = "use letters, digits, `_` and `-`, starting with a letter or `_`";

/// What [`Validator::check_aggregations`] checks: an `aggregate`'s or a `window`'s
/// accumulator settings.
struct Aggregations<'x> {
    kind: &'static str,
    id: &'x str,
    aggregations: &'x [crate::model::AggregationSpec],
    has_script: bool,
    key_field: &'x str,
    /// Output names the operator writes itself.
    reserved: &'x [&'static str],
    path: &'x YamlPath,
}

/// Whether `name` can name an environment variable: letters, digits and `_`, not starting with
/// a digit.
fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl<'a, 'c> PipelineCheck<'a, 'c> {
    fn new(cx: &'c mut Cx<'a>, pi: usize, p: &'a PipelineSpec) -> Self {
        Self {
            cx,
            p,
            base: YamlPath::root().join("pipelines").join(pi),
            ids: HashMap::new(),
        }
    }

    fn elem_path(&self, e: Elem) -> YamlPath {
        self.base.join(e.section.key()).join(e.index)
    }

    fn elem_id(&self, e: Elem) -> &'a str {
        match e.section {
            Section::Sources => self.p.sources[e.index].id(),
            Section::Operators => self.p.operators[e.index].id(),
            Section::Sinks => self.p.sinks[e.index].id(),
        }
    }

    fn elements(&self) -> Vec<Elem> {
        let s = (0..self.p.sources.len()).map(|index| Elem {
            section: Section::Sources,
            index,
        });
        let o = (0..self.p.operators.len()).map(|index| Elem {
            section: Section::Operators,
            index,
        });
        let k = (0..self.p.sinks.len()).map(|index| Elem {
            section: Section::Sinks,
            index,
        });
        s.chain(o).chain(k).collect()
    }

    fn run(mut self) {
        self.check_ids();
        let dead_letter_targets = self.check_dead_letters();
        let edges = self.check_wiring(&dead_letter_targets);
        self.check_cycles(&edges);
        self.check_reachability(&edges, &dead_letter_targets);
        self.check_keyed();
        self.check_operator_options();
        self.check_sources();
        self.check_sinks();
        self.check_kafka_sinks();
        self.check_parallelism();
        self.check_delivery();
        self.check_checkpoints();
        self.check_savepoints();
        self.check_restart();
        self.check_state();
        self.check_no_effect();
        self.check_limits();
    }

    /// Settings that would have no effect where they are written: rejected, so that nothing
    /// a user writes is silently ignored.
    fn check_no_effect(&mut self) {
        use crate::model::{AggregateFunction, RecordFormat};
        for (si, s) in self.p.sources.iter().enumerate() {
            let (format, csv) = match s {
                SourceSpec::File(f) => (f.format, f.csv.is_some()),
                SourceSpec::Stdin(f) => (f.format, f.csv.is_some()),
                SourceSpec::Generator(_) | SourceSpec::Kafka(_) => continue,
            };
            if csv && format != RecordFormat::Csv {
                self.cx
                    .key_error(
                        codes::NO_EFFECT,
                        &self.base.join("sources").join(si).join("csv"),
                        format!(
                            "source `{}` has `csv:` options but reads `format: {}`",
                            s.id(),
                            serde_json::to_value(format)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_owned))
                                .unwrap_or_default()
                        ),
                        "ignored without format: csv",
                    )
                    .help("add `format: csv`, or remove `csv:`")
                    .push(&mut self.cx.out);
            }
        }
        for (oi, op) in self.p.operators.iter().enumerate() {
            let path = self.base.join("operators").join(oi);
            if let OperatorSpec::Union(u) = op
                && u.on_error != OnErrorSpec::Fail
            {
                let at = match u.on_error {
                    OnErrorSpec::DeadLetter(_) => path.join("on_error").join("dead_letter"),
                    _ => path.join("on_error"),
                };
                self.cx
                    .key_error(
                        codes::NO_EFFECT,
                        &at,
                        format!(
                            "union `{}` never fails a record, so `on_error` has no effect",
                            u.id
                        ),
                        "no effect on a union",
                    )
                    .help("remove `on_error`; set it on the operators whose scripts can fail")
                    .push(&mut self.cx.out);
            }
            let aggregations = match op {
                OperatorSpec::Aggregate(a) => a.aggregations.as_slice(),
                OperatorSpec::Window(w) => w.aggregations.as_slice(),
                _ => &[],
            };
            {
                for (i, agg) in aggregations.iter().enumerate() {
                    if agg.function == AggregateFunction::Count && agg.field.is_some() {
                        self.cx
                            .key_error(codes::NO_EFFECT, &path.join("aggregations").join(i).join("field"), "`count` counts records and reads no field", "ignored by count")
                            .help("remove `field`; to count only records that have the field, filter them first")
                            .push(&mut self.cx.out);
                    }
                }
            }
        }
        // After a `key_by`, records always travel by key hash.
        let key_bys: HashSet<&str> = self
            .p
            .operators
            .iter()
            .filter(|o| matches!(o, OperatorSpec::KeyBy(_)))
            .map(OperatorSpec::id)
            .collect();
        let declared = self
            .p
            .operators
            .iter()
            .enumerate()
            .filter_map(|(i, o)| {
                Some((
                    self.base.join("operators").join(i),
                    o.id(),
                    o.partitioning()?,
                    o.wiring(),
                ))
            })
            .chain(self.p.sinks.iter().enumerate().filter_map(|(i, s)| {
                Some((
                    self.base.join("sinks").join(i),
                    s.id(),
                    s.partitioning()?,
                    s.wiring(),
                ))
            }))
            .collect::<Vec<_>>();
        for (path, id, _, wiring) in declared {
            if let Some((from, _)) = wiring
                .names()
                .into_iter()
                .find(|(n, _)| key_bys.contains(n))
            {
                self.cx
                    .key_error(codes::NO_EFFECT, &path.join("partitioning"), format!("`{id}` reads from the key_by `{from}`, whose records always go by key hash, so `partitioning` has no effect"), "ignored after a key_by")
                    .help("remove `partitioning`; to spread records differently, read from an operator that is not a key_by")
                    .push(&mut self.cx.out);
            }
        }
    }

    fn check_ids(&mut self) {
        for e in self.elements() {
            let id = self.elem_id(e);
            let path = self.elem_path(e).join("id");
            if !valid_id(id) {
                self.cx
                    .error(
                        codes::INVALID_ID,
                        &path,
                        format!("`{id}` is not a valid id"),
                        "invalid id",
                    )
                    .help(ID_HELP)
                    .push(&mut self.cx.out);
            }
            if let Some(first) = self.ids.get(id) {
                let first_span = self.cx.spans.span(&self.elem_path(*first).join("id"));
                self.cx
                    .error(
                        codes::DUPLICATE_ID,
                        &path,
                        format!("id `{id}` is used twice in pipeline `{}`", self.p.id),
                        "duplicate id",
                    )
                    .help("ids name state in checkpoints and savepoints, so sources, operators and sinks each need their own; rename one")
                    .related(first_span, "first used here")
                    .push(&mut self.cx.out);
            } else {
                self.ids.insert(id, e);
            }
        }
    }

    /// Checks `on_error: {dead_letter: X}` targets and a `window`'s `late: X`; returns the
    /// sinks used as targets.
    fn check_dead_letters(&mut self) -> HashSet<usize> {
        let mut targets = HashSet::new();
        let mut named: Vec<(YamlPath, &str)> = Vec::new();
        for (si, src) in self.p.sources.iter().enumerate() {
            if let Some(target) = src.dead_letter() {
                let at = self.base.join("sources").join(si);
                named.push((at.join("on_error").join("dead_letter"), target));
            }
        }
        for (oi, op) in self.p.operators.iter().enumerate() {
            if let OnErrorSpec::DeadLetter(target) = op.on_error() {
                let at = self.base.join("operators").join(oi);
                named.push((at.join("on_error").join("dead_letter"), target.as_str()));
            }
        }
        let late_from = named.len();
        for (oi, op) in self.p.operators.iter().enumerate() {
            if let Some(target) = op.late_target() {
                named.push((self.base.join("operators").join(oi).join("late"), target));
            }
        }
        for (n, (path, target)) in named.into_iter().enumerate() {
            if n >= late_from {
                self.check_late_target(&path, target, &mut targets);
                continue;
            }
            match self.ids.get(target) {
                Some(Elem {
                    section: Section::Sinks,
                    index,
                }) => {
                    targets.insert(*index);
                    let sink = &self.p.sinks[*index];
                    let w = sink.wiring();
                    if w.input.is_some() || !w.inputs.is_empty() {
                        self.cx
                            .error(
                                codes::DEAD_LETTER,
                                &path,
                                format!("dead-letter sink `{target}` also has an input"),
                                "this sink also receives regular records",
                            )
                            .help(format!("give dead letters a sink of their own: remove `input` from `{target}` or add a new sink without `input`"))
                            .push(&mut self.cx.out);
                    }
                }
                Some(_) => {
                    self.cx
                        .error(
                            codes::DEAD_LETTER,
                            &path,
                            format!("dead-letter target `{target}` is not a sink"),
                            "not a sink",
                        )
                        .help(
                            "dead letters go to a sink declared under `sinks:` without an `input`",
                        )
                        .push(&mut self.cx.out);
                }
                None => {
                    let sinks: Vec<&str> = self.p.sinks.iter().map(SinkSpec::id).collect();
                    let help = match did_you_mean(target, sinks.iter().copied()) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None => "declare a sink without `input` under `sinks:` and name it here"
                            .to_owned(),
                    };
                    self.cx
                        .error(
                            codes::DEAD_LETTER,
                            &path,
                            format!("dead-letter sink `{target}` does not exist"),
                            "no sink with this id",
                        )
                        .help(help)
                        .push(&mut self.cx.out);
                }
            }
        }
        targets
    }

    /// A `window`'s `late: X` must name a sink without input.
    fn check_late_target(&mut self, path: &YamlPath, target: &str, targets: &mut HashSet<usize>) {
        let problem = match self.ids.get(target) {
            Some(Elem {
                section: Section::Sinks,
                index,
            }) => {
                targets.insert(*index);
                let w = self.p.sinks[*index].wiring();
                if w.input.is_none() && w.inputs.is_empty() {
                    return;
                }
                (
                    format!("late-record sink `{target}` also has an input"),
                    "this sink also receives regular records",
                    format!(
                        "give late records a sink of their own: remove `input` from `{target}` or add a new sink without `input`"
                    ),
                )
            }
            Some(_) => (
                format!("late-record target `{target}` is not a sink"),
                "not a sink",
                "late records go to a sink declared under `sinks:` without an `input`".to_owned(),
            ),
            None => {
                let sinks: Vec<&str> = self.p.sinks.iter().map(SinkSpec::id).collect();
                let help = match did_you_mean(target, sinks.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => "declare a sink without `input` under `sinks:` and name it here, or \
                             remove `late` to drop late records (they are counted)"
                        .to_owned(),
                };
                (
                    format!("late-record sink `{target}` does not exist"),
                    "no sink with this id",
                    help,
                )
            }
        };
        let (message, label, help) = problem;
        self.cx
            .error(codes::DEAD_LETTER, path, message, label)
            .help(help)
            .push(&mut self.cx.out);
    }

    /// Resolves inputs; returns edges (from, to) between elements that exist.
    fn check_wiring(&mut self, dead_letter_targets: &HashSet<usize>) -> Vec<(Elem, Elem)> {
        let mut edges = Vec::new();
        let upstream_ids: Vec<&str> = self
            .elements()
            .into_iter()
            .filter(|e| e.section != Section::Sinks)
            .map(|e| self.elem_id(e))
            .collect();
        let wirings: Vec<(Elem, crate::registry::Wiring<'a>, &'static str)> = self
            .p
            .operators
            .iter()
            .enumerate()
            .map(|(index, o)| {
                (
                    Elem {
                        section: Section::Operators,
                        index,
                    },
                    o.wiring(),
                    o.type_name(),
                )
            })
            .chain(self.p.sinks.iter().enumerate().map(|(index, s)| {
                (
                    Elem {
                        section: Section::Sinks,
                        index,
                    },
                    s.wiring(),
                    "sink",
                )
            }))
            .collect();
        for (e, wiring, kind) in wirings {
            let path = self.elem_path(e);
            let id = self.elem_id(e);
            if wiring.input.is_some() && !wiring.inputs.is_empty() {
                self.cx
                    .key_error(
                        codes::BAD_WIRING,
                        &path.join("inputs"),
                        format!("`{id}` has both `input` and `inputs`"),
                        "second way to name inputs",
                    )
                    .help(
                        "use `input: x` for one upstream or `inputs: [x, y]` for several, not both",
                    )
                    .push(&mut self.cx.out);
            }
            let names = wiring.names();
            if names.is_empty() {
                let is_dl = e.section == Section::Sinks && dead_letter_targets.contains(&e.index);
                if !is_dl {
                    let help = if e.section == Section::Sinks {
                        "add `input: <operator id>`; a sink without input is only valid as a dead-letter target (`on_error: {dead_letter: <sink id>}`)"
                    } else {
                        "add `input: <source or operator id>`"
                    };
                    self.cx
                        .key_error(
                            codes::BAD_WIRING,
                            &path.join("id"),
                            format!("`{id}` has no input"),
                            "nothing feeds this",
                        )
                        .help(help)
                        .push(&mut self.cx.out);
                }
                continue;
            }
            if kind == "union" && names.len() < 2 {
                self.cx
                    .key_error(codes::BAD_WIRING, &path.join("id"), format!("union `{id}` has a single input"), "union of one stream")
                    .help("a union merges two or more streams: list them under `inputs: [a, b]`, or remove the union")
                    .push(&mut self.cx.out);
            } else if e.section == Section::Operators && kind != "union" && names.len() > 1 {
                self.cx
                    .key_error(codes::BAD_WIRING, &path.join("inputs"), format!("`{kind}` operator `{id}` takes one input, not {}", names.len()), "several inputs")
                    .help("merge the streams first with a `union` operator, then feed the union to this operator")
                    .push(&mut self.cx.out);
            }
            let mut listed = HashSet::new();
            for (name, suffix) in names {
                let ipath = path.with(suffix);
                if !listed.insert(name) {
                    self.cx
                        .error(codes::BAD_WIRING, &ipath, format!("`{id}` lists input `{name}` twice"), "repeated input")
                        .help("each input is read once; remove the repetition (every record of it would arrive twice)")
                        .push(&mut self.cx.out);
                    continue;
                }
                match self.ids.get(name) {
                    Some(up) if up.section == Section::Sinks => {
                        self.cx
                            .error(
                                codes::UNKNOWN_INPUT,
                                &ipath,
                                format!(
                                    "`{id}` reads from sink `{name}`, which produces no records"
                                ),
                                "a sink",
                            )
                            .help("read from the operator that feeds the sink instead")
                            .push(&mut self.cx.out);
                    }
                    Some(up) => edges.push((*up, e)),
                    None => {
                        let help = match did_you_mean(name, upstream_ids.iter().copied()) {
                            Some(s) => format!("did you mean `{s}`?"),
                            None => format!(
                                "known sources and operators in `{}`: {}",
                                self.p.id,
                                upstream_ids.join(", ")
                            ),
                        };
                        self.cx
                            .error(
                                codes::UNKNOWN_INPUT,
                                &ipath,
                                format!("`{id}` reads from `{name}`, which does not exist"),
                                "no source or operator with this id",
                            )
                            .help(help)
                            .push(&mut self.cx.out);
                    }
                }
            }
        }
        edges
    }

    /// Reports each cycle once, at the input that closes it.
    fn check_cycles(&mut self, edges: &[(Elem, Elem)]) {
        let ops = self.p.operators.len();
        let mut adj: Vec<Vec<usize>> = vec![Vec::new(); ops];
        for (from, to) in edges {
            if from.section == Section::Operators && to.section == Section::Operators {
                adj[from.index].push(to.index);
            }
        }
        // Iterative DFS with colours; a back edge u -> v closes a cycle.
        let mut colour = vec![0u8; ops];
        for start in 0..ops {
            if colour[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            colour[start] = 1;
            while let Some((u, next)) = stack.last_mut() {
                let u = *u;
                if let Some(&v) = adj[u].get(*next) {
                    *next += 1;
                    match colour[v] {
                        0 => {
                            colour[v] = 1;
                            stack.push((v, 0));
                        }
                        1 => {
                            let pos = stack.iter().position(|(n, _)| *n == v).unwrap_or(0);
                            let mut names: Vec<&str> = stack[pos..]
                                .iter()
                                .map(|(n, _)| self.p.operators[*n].id())
                                .collect();
                            names.push(self.p.operators[v].id());
                            self.report_cycle(u, v, &names);
                        }
                        _ => {}
                    }
                } else {
                    colour[u] = 2;
                    stack.pop();
                }
            }
        }
    }

    fn report_cycle(&mut self, from: usize, to: usize, names: &[&str]) {
        let op = &self.p.operators[to];
        let from_id = self.p.operators[from].id();
        let suffix = op
            .wiring()
            .names()
            .into_iter()
            .find(|(n, _)| *n == from_id)
            .map(|(_, s)| s);
        let opath = self.base.join("operators").join(to);
        let path = suffix.map_or_else(|| opath.join("id"), |s| opath.with(s));
        self.cx
            .error(
                codes::CYCLE,
                &path,
                format!("the operators form a cycle: {}", names.join(" → ")),
                "this input closes the cycle",
            )
            .help("a pipeline is a directed acyclic graph; remove one of these inputs")
            .push(&mut self.cx.out);
    }

    fn check_reachability(&mut self, edges: &[(Elem, Elem)], dead_letter_targets: &HashSet<usize>) {
        let mut down: HashMap<Elem, Vec<Elem>> = HashMap::new();
        let mut up: HashMap<Elem, Vec<Elem>> = HashMap::new();
        for (a, b) in edges {
            down.entry(*a).or_default().push(*b);
            up.entry(*b).or_default().push(*a);
        }
        // Dead-letter and late-record edges count for reachability.
        for (si, src) in self.p.sources.iter().enumerate() {
            if let Some(t) = src.dead_letter()
                && let Some(
                    sink @ Elem {
                        section: Section::Sinks,
                        ..
                    },
                ) = self.ids.get(t)
            {
                let from = Elem {
                    section: Section::Sources,
                    index: si,
                };
                down.entry(from).or_default().push(*sink);
                up.entry(*sink).or_default().push(from);
            }
        }
        for (oi, op) in self.p.operators.iter().enumerate() {
            let dead_letter = match op.on_error() {
                OnErrorSpec::DeadLetter(t) => Some(t.as_str()),
                _ => None,
            };
            for t in dead_letter.into_iter().chain(op.late_target()) {
                if let Some(
                    sink @ Elem {
                        section: Section::Sinks,
                        ..
                    },
                ) = self.ids.get(t)
                {
                    let from = Elem {
                        section: Section::Operators,
                        index: oi,
                    };
                    down.entry(from).or_default().push(*sink);
                    up.entry(*sink).or_default().push(from);
                }
            }
        }
        let walk = |starts: Vec<Elem>, graph: &HashMap<Elem, Vec<Elem>>| {
            let mut seen: HashSet<Elem> = starts.iter().copied().collect();
            let mut stack = starts;
            while let Some(n) = stack.pop() {
                for m in graph.get(&n).into_iter().flatten() {
                    if seen.insert(*m) {
                        stack.push(*m);
                    }
                }
            }
            seen
        };
        let sources: Vec<Elem> = (0..self.p.sources.len())
            .map(|index| Elem {
                section: Section::Sources,
                index,
            })
            .collect();
        let sinks: Vec<Elem> = (0..self.p.sinks.len())
            .map(|index| Elem {
                section: Section::Sinks,
                index,
            })
            .collect();
        let from_sources = walk(sources.clone(), &down);
        let to_sinks = walk(sinks.clone(), &up);
        for s in sinks {
            let has_input = !self.p.sinks[s.index].wiring().names().is_empty();
            if !from_sources.contains(&s) && (has_input || dead_letter_targets.contains(&s.index)) {
                let id = self.elem_id(s);
                self.cx
                    .error(codes::UNREACHABLE_SINK, &self.elem_path(s).join("id"), format!("no source reaches sink `{id}`"), "never receives records")
                    .help("follow its `input` back: some operator on the way reads from nothing; connect it to a source")
                    .push(&mut self.cx.out);
            }
        }
        for e in sources
            .into_iter()
            .chain((0..self.p.operators.len()).map(|index| Elem {
                section: Section::Operators,
                index,
            }))
        {
            if to_sinks.contains(&e) {
                continue;
            }
            let id = self.elem_id(e);
            let what = if e.section == Section::Sources {
                "source"
            } else {
                "operator"
            };
            self.cx
                .warning(
                    codes::DEAD_END,
                    &self.elem_path(e).join("id"),
                    format!("{what} `{id}` reaches no sink; its records are dropped"),
                    "output goes nowhere",
                )
                .help(format!(
                    "add a sink with `input: {id}` (or one downstream of it), or remove it"
                ))
                .push(&mut self.cx.out);
        }
    }

    fn check_keyed(&mut self) {
        for (oi, op) in self.p.operators.iter().enumerate() {
            if !op.is_keyed() {
                continue;
            }
            let names = op.wiring().names();
            let path = self.base.join("operators").join(oi);
            for (name, suffix) in names {
                let Some(up) = self.ids.get(name) else {
                    continue;
                };
                let is_key_by = up.section == Section::Operators
                    && matches!(self.p.operators[up.index], OperatorSpec::KeyBy(_));
                if !is_key_by {
                    self.cx
                        .error(
                            codes::KEYED_WITHOUT_KEY_BY,
                            &path.with(suffix),
                            format!("keyed `{}` operator `{}` reads from `{name}`, which is not a `key_by`", op.type_name(), op.id()),
                            "not keyed",
                        )
                        .help(format!("insert `- {{id: by_key, type: key_by, input: {name}, field: <field>}}` and read from it"))
                        .push(&mut self.cx.out);
                }
            }
        }
    }

    fn check_operator_options(&mut self) {
        for (oi, op) in self.p.operators.iter().enumerate() {
            let path = self.base.join("operators").join(oi);
            if op.has_both_script_forms() {
                self.cx
                    .key_error(
                        codes::SCRIPT_MISSING,
                        &path.join("script_file"),
                        format!("`{}` has both `script` and `script_file`", op.id()),
                        "second script",
                    )
                    .help("keep one: an inline `script: |` block or a `script_file:` path")
                    .push(&mut self.cx.out);
            }
            match op {
                OperatorSpec::KeyBy(k) => {
                    let has_script = k.script.is_some() || k.script_file.is_some();
                    if k.field.is_some() == has_script {
                        let msg = if has_script {
                            "has both `field` and a script"
                        } else {
                            "needs `field` or a script"
                        };
                        self.cx
                            .key_error(codes::OPERATOR_OPTION, &path.join(if has_script { "field" } else { "id" }), format!("key_by `{}` {msg}", k.id), "how to key?")
                            .help("give `field: <path>` (such as `user` or `customer.id`), or a script defining `fn key(r)`")
                            .push(&mut self.cx.out);
                    }
                    if let Some(f) = &k.field {
                        self.check_field_path(f, &path.join("field"));
                    }
                }
                OperatorSpec::Aggregate(a) => self.check_aggregate(a, &path),
                OperatorSpec::Window(w) => self.check_window(w, &path, oi),
                OperatorSpec::Union(_) => {}
                _ if op.needs_script() && op.script().is_none() => {
                    let (name, arity) = op.required_functions()[0];
                    let params = ["", "r", "acc, r"][arity.min(2)];
                    self.cx
                        .key_error(codes::SCRIPT_MISSING, &path.join("id"), format!("`{}` operator `{}` has no script", op.type_name(), op.id()), "no script")
                        .help(format!("add `script: |` with `fn {name}({params}) {{ ... }}`, or `script_file: <path>.rhai`"))
                        .push(&mut self.cx.out);
                }
                _ => {}
            }
            if let OperatorSpec::Reduce(r) = op {
                self.check_field_path(&r.key_field, &path.join("key_field"));
            }
            if let OperatorSpec::Process(p) = op {
                self.check_state_ttl(p, &path);
            }
        }
    }

    /// State names are not reserved (`__`); a state's `ttl` is a positive duration;
    /// `ttl_update` without a `ttl` would do nothing.
    fn check_state_ttl(&mut self, p: &ProcessSpec, path: &YamlPath) {
        for (name, decl) in &p.state {
            let at = path.join("state").join(name.as_str());
            if name.starts_with("__") {
                self.cx
                    .key_error(
                        codes::OPERATOR_OPTION,
                        &at,
                        format!("state name `{name}` of `{}` starts with `__`", p.id),
                        "reserved",
                    )
                    .help("names starting with `__` are reserved for Weir's own state (timers, expiry times); rename it")
                    .push(&mut self.cx.out);
            }
            let StateDeclSpec::Options(o) = decl else {
                continue;
            };
            match o.ttl {
                Some(ttl) => {
                    self.positive(ttl, at.join("ttl"), &format!("the `ttl` of state `{name}`"))
                }
                None if o.ttl_update.is_some() => self
                    .cx
                    .key_error(
                        codes::OPERATOR_OPTION,
                        &at.join("ttl_update"),
                        format!("state `{name}` of `{}` has `ttl_update` but no `ttl`", p.id),
                        "no effect without `ttl`",
                    )
                    .help("add `ttl: <duration>` (such as `1h`), or remove `ttl_update`")
                    .push(&mut self.cx.out),
                None => {}
            }
        }
    }

    /// Options of sinks the schema cannot check: a `postgres` sink's connection variable,
    /// table, columns and upsert key.
    fn check_sinks(&mut self) {
        use crate::model::PostgresWriteMode;
        for (si, s) in self.p.sinks.iter().enumerate() {
            let SinkSpec::Postgres(pg) = s else {
                continue;
            };
            let path = self.base.join("sinks").join(si);
            let env = &pg.connection_env;
            if !valid_env_name(env) {
                let looks_like_url = env.contains("://") || env.contains('=');
                self.cx
                    .error(
                        codes::INVALID_VALUE,
                        &path.join("connection_env"),
                        format!("`{env}` is not an environment variable name"),
                        if looks_like_url { "a connection string, not a variable name" } else { "not a variable name" },
                    )
                    .help("name the variable that holds the connection string, such as `ORDERS_DB_URL` (letters, digits and `_`), and set it when running `weir`; the string itself does not belong in the file")
                    .push(&mut self.cx.out);
            }
            let parts: Vec<&str> = pg.table.split('.').collect();
            if parts.len() > 2 || parts.iter().any(|p| p.is_empty()) {
                self.cx
                    .error(
                        codes::INVALID_VALUE,
                        &path.join("table"),
                        format!("`{}` is not a table name", pg.table),
                        "not `name` or `schema.name`",
                    )
                    .help("write the table as `name` or `schema.name`, as it is spelled in the database")
                    .push(&mut self.cx.out);
            }
            for (column, field) in &pg.columns {
                let at = path.join("columns").join(column.as_str());
                if column.is_empty() {
                    self.cx
                        .error(codes::INVALID_VALUE, &at, "an empty column name", "empty")
                        .help("map each column name to the record field it is taken from, such as `amount: order.amount`")
                        .push(&mut self.cx.out);
                }
                self.check_field_path(field, &at);
            }
            match pg.mode {
                PostgresWriteMode::Upsert if pg.key.is_empty() => {
                    self.cx
                        .error(
                            codes::OPERATOR_OPTION,
                            &path.join("mode"),
                            format!("`upsert` into `{}` needs `key`", pg.table),
                            "no key columns",
                        )
                        .help("list the columns of the table's primary key or unique index, such as `key: [id]`")
                        .push(&mut self.cx.out);
                }
                PostgresWriteMode::Insert if !pg.key.is_empty() => {
                    self.cx
                        .error(
                            codes::NO_EFFECT,
                            &path.join("key"),
                            "`key` has no effect with `mode: insert`",
                            "ignored by insert",
                        )
                        .help(
                            "add `mode: upsert` to replace rows with the same key, or remove `key`",
                        )
                        .push(&mut self.cx.out);
                }
                _ => {}
            }
            for (ki, k) in pg.key.iter().enumerate() {
                if !pg.columns.contains_key(k) {
                    let names: Vec<&str> = pg.columns.keys().map(String::as_str).collect();
                    let mut d = self.cx.error(
                        codes::OPERATOR_OPTION,
                        &path.join("key").join(ki),
                        format!("key column `{k}` is not one of `columns`"),
                        "not a mapped column",
                    );
                    d = d.help(format!(
                        "a key column must also be written: add `{k}: <field>` to `columns` (mapped now: {})",
                        names.join(", ")
                    ));
                    d.push(&mut self.cx.out);
                }
            }
        }
    }

    fn check_field_path(&mut self, f: &str, path: &YamlPath) {
        if f.is_empty() || f.split('.').any(str::is_empty) {
            self.cx
                .error(
                    codes::OPERATOR_OPTION,
                    path,
                    format!("`{f}` is not a field path"),
                    "empty path segment",
                )
                .help("write field names joined by dots, such as `user` or `customer.id`")
                .push(&mut self.cx.out);
        }
    }

    fn check_aggregate(&mut self, a: &AggregateSpec, path: &YamlPath) {
        let has_script = a.script.is_some() || a.script_file.is_some();
        self.check_aggregations(Aggregations {
            kind: "aggregate",
            id: &a.id,
            aggregations: &a.aggregations,
            has_script,
            key_field: &a.key_field,
            reserved: &[],
            path,
        });
    }

    /// The `aggregations` (or script) of an `aggregate` or a `window`.
    fn check_aggregations(&mut self, x: Aggregations<'_>) {
        let Aggregations {
            kind,
            id,
            aggregations,
            has_script,
            key_field,
            reserved,
            path,
        } = x;
        if aggregations.is_empty() != has_script {
            let msg = if has_script {
                "has both `aggregations` and a script"
            } else {
                "needs `aggregations` or a script"
            };
            self.cx
                .key_error(codes::OPERATOR_OPTION, &path.join(if has_script { "aggregations" } else { "id" }), format!("{kind} `{id}` {msg}"), "how to aggregate?")
                .help("list built-ins such as `aggregations: [{fn: sum, field: amount, as: total}]`, or give a script defining `fn init()` and `fn add(acc, r)`")
                .push(&mut self.cx.out);
        }
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, agg) in aggregations.iter().enumerate() {
            let apath = path.join("aggregations").join(i);
            if agg.function.needs_field() && agg.field.is_none() {
                let f = agg.output_name();
                self.cx
                    .key_error(codes::OPERATOR_OPTION, &apath.join("fn"), format!("`{f}` needs a `field`"), "over which field?")
                    .help(format!("add `field: <path>` to this aggregation, such as `{{fn: {f}, field: amount}}`"))
                    .push(&mut self.cx.out);
            }
            if let Some(f) = &agg.field {
                self.check_field_path(f, &apath.join("field"));
            }
            let out = agg.output_name();
            if reserved.contains(&out.as_str()) {
                self.cx
                    .error(
                        codes::OPERATOR_OPTION,
                        &apath,
                        format!("aggregation output `{out}` collides with the window bounds"),
                        "a name the window writes",
                    )
                    .help("rename it with `as:`; every output record has `window_start` and `window_end`")
                    .push(&mut self.cx.out);
            } else if out == key_field {
                self.cx
                    .error(
                        codes::OPERATOR_OPTION,
                        &apath,
                        format!("aggregation output `{out}` collides with the key field"),
                        "same name as the key",
                    )
                    .help("rename it with `as:`, or change `key_field`")
                    .push(&mut self.cx.out);
            } else if let Some(first) = names.insert(out.clone(), i) {
                let first_span = self.cx.spans.span(&path.join("aggregations").join(first));
                self.cx
                    .error(
                        codes::OPERATOR_OPTION,
                        &apath,
                        format!("two aggregations write `{out}`"),
                        "same output name",
                    )
                    .help("give each aggregation its own name with `as:`")
                    .related(first_span, "first here")
                    .push(&mut self.cx.out);
            }
        }
    }

    fn check_window(&mut self, w: &WindowSpec, path: &YamlPath, oi: usize) {
        self.check_aggregations(Aggregations {
            kind: "window",
            id: &w.id,
            aggregations: &w.aggregations,
            has_script: w.script.is_some() || w.script_file.is_some(),
            key_field: &w.key_field,
            reserved: &["window_start", "window_end"],
            path,
        });
        self.check_field_path(&w.key_field, &path.join("key_field"));
        let at = path.join("window");
        match w.window {
            WindowKindSpec::Tumbling { size } => {
                self.positive(size, at.join("tumbling").join("size"), "the window size");
            }
            WindowKindSpec::Sliding { size, slide } => {
                let at = at.join("sliding");
                self.positive(size, at.join("size"), "the window size");
                self.positive(slide, at.join("slide"), "the slide");
                if slide > size {
                    self.cx
                        .error(
                            codes::OPERATOR_OPTION,
                            &at.join("slide"),
                            format!("window `{}` slides by {slide}, more than its size {size}", w.id),
                            "longer than `size`",
                        )
                        .help("a slide longer than the size leaves gaps in which records belong to no window; use at most the size (equal to it is a tumbling window)")
                        .push(&mut self.cx.out);
                }
            }
            WindowKindSpec::Session { gap } => {
                let gap_at = at.join("session").join("gap");
                self.positive(gap, gap_at, "the session gap");
                if w.lateness() > gap.0 {
                    self.cx
                        .warning(
                            codes::OPERATOR_OPTION,
                            &path.join("allowed_lateness"),
                            format!("window `{}` accepts records {} late, longer than its session gap {gap}", w.id, humantime::format_duration(w.lateness())),
                            "longer than the gap",
                        )
                        .help("a late record can then bridge sessions already emitted, which are emitted again merged, and closed sessions stay in state that long; a lateness under the gap is the usual choice")
                        .push(&mut self.cx.out);
                }
            }
        }
        if let Some(f) = &w.time_field {
            self.check_field_path(f, &path.join("time_field"));
        }
        if w.time == WindowTimeSpec::Processing {
            let no_effect = [
                (w.time_field.is_some(), "time_field"),
                (w.allowed_lateness.is_some(), "allowed_lateness"),
                (w.late.is_some(), "late"),
            ];
            for (set, key) in no_effect {
                if set {
                    self.cx
                        .key_error(
                            codes::NO_EFFECT,
                            &path.join(key),
                            format!("`{key}` has no effect on the processing-time window `{}`", w.id),
                            "no effect with `time: processing`",
                        )
                        .help("a processing-time window takes each record's arrival time, so no record is ever late; remove it, or use `time: event`")
                        .push(&mut self.cx.out);
                }
            }
            return;
        }
        self.check_window_event_time(w, path, oi);
    }

    /// An event-time window needs `event_time` on every source upstream (its watermarks close
    /// the windows) and, without `time_field`, their fields must agree.
    fn check_window_event_time(&mut self, w: &WindowSpec, path: &YamlPath, oi: usize) {
        let sources = self.p.upstream_sources(self.p.operators[oi].id());
        let mut fields: Vec<&str> = Vec::new();
        let mut without: Vec<&str> = Vec::new();
        for &si in &sources {
            let src = &self.p.sources[si];
            match src.event_time_field() {
                Some(f) => {
                    if !fields.contains(&f) {
                        fields.push(f);
                    }
                }
                None => without.push(src.id()),
            }
        }
        if !without.is_empty() {
            let list = without
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ");
            self.cx
                .key_error(
                    codes::NO_EVENT_TIME,
                    &path.join("id"),
                    format!("event-time window `{}` is downstream of {list}, which declare no `event_time`", w.id),
                    "no watermarks reach this window",
                )
                .help(format!(
                    "declare `event_time: {{field: {}}}` on {list} so that watermarks close the windows, or use `time: processing`",
                    w.time_field.as_deref().unwrap_or("<field>")
                ))
                .push(&mut self.cx.out);
            return;
        }
        if w.time_field.is_none() && fields.len() > 1 {
            self.cx
                .key_error(
                    codes::OPERATOR_OPTION,
                    &path.join("id"),
                    format!("the sources upstream of window `{}` take event time from different fields ({})", w.id, fields.join(", ")),
                    "which event time?",
                )
                .help("set `time_field:` on the window to the field its records carry the event time in")
                .push(&mut self.cx.out);
        }
    }

    fn check_sources(&mut self) {
        for (si, s) in self.p.sources.iter().enumerate() {
            let path = self.base.join("sources").join(si);
            let csv = match s {
                SourceSpec::File(f) => f.csv.as_ref(),
                SourceSpec::Stdin(f) => f.csv.as_ref(),
                SourceSpec::Kafka(k) => {
                    self.check_kafka_source(k, &path);
                    None
                }
                SourceSpec::Generator(g) => {
                    for (name, field) in &g.fields {
                        let fpath = path.join("fields").join(name.as_str());
                        let bad = match field {
                            GeneratorFieldSpec::Int { min, max } => min > max,
                            GeneratorFieldSpec::Float { min, max } => {
                                min >= max || !min.is_finite() || !max.is_finite()
                            }
                            _ => false,
                        };
                        if bad {
                            self.cx
                                .error(
                                    codes::INVALID_VALUE,
                                    &fpath,
                                    format!("generator field `{name}` has `min` above `max`"),
                                    "empty range",
                                )
                                .help("make `min` ≤ `max` (for floats, `min` < `max`)")
                                .push(&mut self.cx.out);
                        }
                    }
                    None
                }
            };
            if let Some(et) = s.event_time() {
                self.check_event_time(et, &path.join("event_time"));
            }
            if let Some(csv) = csv
                && (csv.delimiter.len() != 1 || !csv.delimiter.is_ascii())
            {
                self.cx
                    .error(
                        codes::INVALID_VALUE,
                        &path.join("csv").join("delimiter"),
                        format!("`{}` is not a single ASCII character", csv.delimiter),
                        "one character",
                    )
                    .help("use one ASCII character such as `,`, `;`, `|` or a tab (`\"\\t\"`)")
                    .push(&mut self.cx.out);
            }
        }
    }

    /// A `kafka` source: `topics` or `topic_pattern` (exactly one), and a positive
    /// `discovery_interval` that a bounded source (`stop_at`) does not take.
    fn check_kafka_source(&mut self, k: &crate::registry::KafkaSourceSpec, path: &YamlPath) {
        match (k.topics.is_empty(), &k.topic_pattern) {
            (true, None) => self
                .cx
                .error(
                    codes::MISSING_FIELD,
                    &path.join("type"),
                    format!("kafka source `{}` names no topic", k.id),
                    "no topics",
                )
                .help("add `topics: [name, ...]` or `topic_pattern: <regular expression>`")
                .push(&mut self.cx.out),
            (false, Some(_)) => self
                .cx
                .key_error(
                    codes::INVALID_VALUE,
                    &path.join("topic_pattern"),
                    format!(
                        "kafka source `{}` has both `topics` and `topic_pattern`",
                        k.id
                    ),
                    "exclusive with `topics`",
                )
                .help("keep one: a list of topics, or a regular expression their names match")
                .push(&mut self.cx.out),
            _ => {}
        }
        if let Some(t) = k.topics.iter().find(|t| t.is_empty()) {
            let i = k.topics.iter().position(|x| x == t).unwrap_or(0);
            self.cx
                .error(
                    codes::INVALID_VALUE,
                    &path.join("topics").join(i),
                    "an empty topic name",
                    "empty",
                )
                .help("name the topic")
                .push(&mut self.cx.out);
        }
        if let Some(d) = k.discovery_interval {
            self.positive(d, path.join("discovery_interval"), "`discovery_interval`");
            if k.stop_at.is_some() {
                self.cx
                    .key_error(
                        codes::NO_EFFECT,
                        &path.join("discovery_interval"),
                        "a source with `stop_at` reads the partitions it found at its start and discovers none later",
                        "no effect with `stop_at`",
                    )
                    .help("remove `discovery_interval`, or `stop_at` to keep reading")
                    .push(&mut self.cx.out);
            }
        }
    }

    /// Every `kafka` sink: `topic` or `topic_field` (exactly one), a positive `flush_timeout`.
    fn check_kafka_sinks(&mut self) {
        for (i, s) in self.p.sinks.iter().enumerate() {
            let SinkSpec::Kafka(k) = s else { continue };
            let path = self.base.join("sinks").join(i);
            match (&k.topic, &k.topic_field) {
                (None, None) => self
                    .cx
                    .error(
                        codes::MISSING_FIELD,
                        &path.join("type"),
                        format!("kafka sink `{}` names no topic", k.id),
                        "no topic",
                    )
                    .help("add `topic: <name>`, or `topic_field: <field>` to take it from each record")
                    .push(&mut self.cx.out),
                (Some(_), Some(_)) => self
                    .cx
                    .key_error(
                        codes::INVALID_VALUE,
                        &path.join("topic_field"),
                        format!("kafka sink `{}` has both `topic` and `topic_field`", k.id),
                        "exclusive with `topic`",
                    )
                    .help("keep one: a fixed topic, or the field that names each record's topic")
                    .push(&mut self.cx.out),
                _ => {}
            }
            if let Some(d) = k.flush_timeout {
                self.positive(d, path.join("flush_timeout"), "`flush_timeout`");
            }
        }
    }

    /// A source's `event_time`: a field path, `unit` or `format` (not both), a positive
    /// `idle_timeout`.
    fn check_event_time(&mut self, et: &EventTimeSpec, path: &YamlPath) {
        let f = &et.field;
        if f.is_empty() || f.split('.').any(str::is_empty) {
            self.cx
                .error(
                    codes::INVALID_VALUE,
                    &path.join("field"),
                    format!("`{f}` is not a field path"),
                    "empty path segment",
                )
                .help("name the field holding the event time, such as `ts` or `meta.time`")
                .push(&mut self.cx.out);
        }
        if et.unit.is_some() && et.format.is_some() {
            self.cx
                .error(
                    codes::INVALID_VALUE,
                    &path.join("format"),
                    "`event_time` has both `unit` and `format`",
                    "exclusive with `unit`",
                )
                .help("numbers take `unit: ms | s`, strings take `format: rfc3339`: keep the one that fits the field")
                .push(&mut self.cx.out);
        }
        if let Some(d) = et.idle_timeout {
            self.positive(d, path.join("idle_timeout"), "`idle_timeout`");
        }
    }

    fn check_parallelism(&mut self) {
        let max = self.p.effective_max_parallelism();
        let explicit = self.p.max_parallelism.is_some();
        let help = if explicit {
            format!(
                "lower the parallelism or raise `max_parallelism` (it is {max}; it cannot change once state exists)"
            )
        } else {
            format!(
                "lower the parallelism, or set `max_parallelism` above it (the default here is {max})"
            )
        };
        if self.p.parallelism > max {
            self.cx
                .error(
                    codes::PARALLELISM,
                    &self.base.join("parallelism"),
                    format!(
                        "parallelism {} is above max_parallelism {max}",
                        self.p.parallelism
                    ),
                    "too high",
                )
                .help(help.clone())
                .push(&mut self.cx.out);
        }
        let mut par: HashMap<&str, u32> = HashMap::new();
        for e in self.elements() {
            let declared = match e.section {
                Section::Sources => match &self.p.sources[e.index] {
                    SourceSpec::Stdin(_) => None,
                    s => s.parallelism(),
                },
                Section::Operators => self.p.operators[e.index].parallelism(),
                Section::Sinks => match &self.p.sinks[e.index] {
                    SinkSpec::Stdout(_) => None,
                    s => s.parallelism(),
                },
            };
            let effective = match e.section {
                Section::Sources => self.p.sources[e.index].parallelism(),
                Section::Operators => self.p.operators[e.index].parallelism(),
                Section::Sinks => self.p.sinks[e.index].parallelism(),
            }
            .unwrap_or(self.p.parallelism);
            par.insert(self.elem_id(e), effective);
            if let Some(n) = declared.filter(|n| *n > max) {
                self.cx
                    .error(
                        codes::PARALLELISM,
                        &self.elem_path(e).join("parallelism"),
                        format!("parallelism {n} is above max_parallelism {max}"),
                        "too high",
                    )
                    .help(help.clone())
                    .push(&mut self.cx.out);
            }
        }
        // Forward exchanges need equal parallelism.
        let forwards: Vec<(YamlPath, &'a str, crate::registry::Wiring<'a>)> = self
            .p
            .operators
            .iter()
            .enumerate()
            .filter(|(_, o)| o.partitioning() == Some(PartitioningSpec::Forward))
            .map(|(i, o)| (self.base.join("operators").join(i), o.id(), o.wiring()))
            .chain(
                self.p
                    .sinks
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.partitioning() == Some(PartitioningSpec::Forward))
                    .map(|(i, s)| (self.base.join("sinks").join(i), s.id(), s.wiring())),
            )
            .collect();
        for (path, id, wiring) in forwards {
            let mine = par.get(id).copied().unwrap_or(self.p.parallelism);
            for (name, _) in wiring.names() {
                if let Some(theirs) = par.get(name).filter(|t| **t != mine) {
                    self.cx
                        .error(
                            codes::PARALLELISM,
                            &path.join("partitioning"),
                            format!("`forward` from `{name}` (parallelism {theirs}) to `{id}` (parallelism {mine})"),
                            "forward needs equal parallelism",
                        )
                        .help("use `partitioning: rebalance`, or give both the same parallelism")
                        .push(&mut self.cx.out);
                }
            }
        }
    }

    fn exactly_once(&self) -> bool {
        self.p.checkpoints.enabled && self.p.checkpoints.mode == CheckpointMode::ExactlyOnce
    }

    fn check_delivery(&mut self) {
        if !self.exactly_once() {
            return;
        }
        let mode_path = self.base.join("checkpoints").join("mode");
        let mode_span = self
            .cx
            .spans
            .exists(&mode_path)
            .then(|| self.cx.spans.span(&mode_path));
        for (si, s) in self.p.sources.iter().enumerate() {
            if s.is_replayable() {
                continue;
            }
            let path = self.base.join("sources").join(si).join("type");
            let mut d = self
                .cx
                .error(
                    codes::NOT_REPLAYABLE,
                    &path,
                    format!("source `{}` (`{}`) cannot replay, so this pipeline cannot be exactly-once", s.id(), s.type_name()),
                    "not replayable",
                )
                .help("after a failure it cannot rewind to the checkpoint. Choose at-least-once with `checkpoints: {mode: at_least_once}` (or remove `checkpoints:`), or read from a `file` source");
            if let Some(span) = mode_span.clone() {
                d = d.related(span, "exactly-once chosen here");
            }
            d.push(&mut self.cx.out);
        }
        for (si, s) in self.p.sinks.iter().enumerate() {
            if s.is_transactional() {
                continue;
            }
            let path = self.base.join("sinks").join(si).join("type");
            let mut d = self
                .cx
                .error(
                    codes::NOT_TRANSACTIONAL,
                    &path,
                    format!("sink `{}` (`{}`) cannot commit transactionally, so this pipeline cannot be exactly-once", s.id(), s.type_name()),
                    "not transactional",
                )
                .help(if matches!(s, SinkSpec::Kafka(_)) {
                    "exactly-once into Kafka needs broker transactions, which Weir's Kafka sink does not use (the Kafka-API broker it is tested against has none): after a failure, messages sent since the last checkpoint are sent again. Choose `checkpoints: {mode: at_least_once}` and make consumers idempotent (the message key identifies a record), or write to a transactional sink (`file`)"
                } else {
                    "output written before a failure would be repeated after recovery. Choose at-least-once with `checkpoints: {mode: at_least_once}` (or remove `checkpoints:`), or write to a `file` sink"
                });
            if let Some(span) = mode_span.clone() {
                d = d.related(span, "exactly-once chosen here");
            }
            d.push(&mut self.cx.out);
        }
    }

    fn positive(&mut self, d: DurationSpec, path: YamlPath, what: &str) {
        if d.get().is_zero() {
            self.cx
                .error(
                    codes::INVALID_DURATION,
                    &path,
                    format!("{what} must be positive"),
                    "zero",
                )
                .help("write a positive duration such as `500ms` or `1s`")
                .push(&mut self.cx.out);
        }
    }

    /// `url` (`s3://` + `rest`) at `at` must name a bucket and a prefix without empty, `.`
    /// or `..` components.
    fn check_s3_location(&mut self, at: &YamlPath, url: &str, rest: &str) {
        let bucket = rest.split('/').next().unwrap_or_default();
        let prefix = rest
            .get(bucket.len()..)
            .unwrap_or_default()
            .trim_matches('/');
        let bad_prefix = !prefix.is_empty()
            && prefix
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..");
        if bucket.is_empty() || bad_prefix {
            self.cx
                .error(
                    codes::INVALID_VALUE,
                    at,
                    format!("`{url}` is not a valid S3 location"),
                    "invalid S3 location",
                )
                .help("write `s3://bucket/prefix`: a bucket, then a prefix without empty, `.` or `..` components")
                .push(&mut self.cx.out);
        }
    }

    /// `savepoints.dir`: a directory, or an `s3://` location checked as checkpoint storage's.
    fn check_savepoints(&mut self) {
        let at = self.base.join("savepoints").join("dir");
        let dir = self.p.savepoints.dir.trim().to_owned();
        if let Some((scheme, rest)) = dir.split_once("://") {
            if scheme == "s3" {
                self.check_s3_location(&at, &dir, rest);
            } else {
                self.cx
                    .error(
                        codes::UNSUPPORTED_STORAGE,
                        &at,
                        format!("`{scheme}://` savepoint directories are not supported"),
                        "unsupported scheme",
                    )
                    .help("use a local directory, or `s3://bucket/prefix`")
                    .push(&mut self.cx.out);
            }
        }
    }

    fn check_checkpoints(&mut self) {
        let c = &self.p.checkpoints;
        let base = self.base.join("checkpoints");
        if !self.cx.spans.exists(&base) {
            return;
        }
        self.positive(c.interval, base.join("interval"), "the checkpoint interval");
        self.positive(c.timeout, base.join("timeout"), "the checkpoint timeout");
        if !c.interval.get().is_zero() && c.interval.get() < Duration::from_millis(10) {
            self.cx
                .error(
                    codes::BAD_PARAMETER,
                    &base.join("interval"),
                    format!("a checkpoint interval of {} is too short", c.interval),
                    "below 10ms",
                )
                .help("checkpoints need at least `10ms` between them; `1s` to `1m` is usual")
                .push(&mut self.cx.out);
        }
        // Unaligned checkpoints are an exactly-once technique: at-least-once barriers never
        // park an input, so there is nothing for them to overtake.
        if c.unaligned && c.mode == CheckpointMode::AtLeastOnce {
            let mut d = self
                .cx
                .error(
                    codes::BAD_PARAMETER,
                    &base.join("unaligned"),
                    "unaligned checkpoints need `mode: exactly_once`",
                    "unaligned under at-least-once",
                )
                .help("at-least-once barriers never wait for each other, so there is nothing to overtake: remove `unaligned`, or choose `mode: exactly_once` to take exactly-once checkpoints that stay fast under backpressure");
            let mode = base.join("mode");
            if self.cx.spans.exists(&mode) {
                d = d.related(self.cx.spans.span(&mode), "at-least-once chosen here");
            }
            d.push(&mut self.cx.out);
        }
        if c.unaligned && c.max_concurrent > 1 {
            self.cx
                .error(
                    codes::BAD_PARAMETER,
                    &base.join("max_concurrent"),
                    format!("unaligned checkpoints are taken one at a time, not {} at once", c.max_concurrent),
                    "more than one",
                )
                .help("remove `max_concurrent` (or set it to 1): a subtask records the in-flight records of one unaligned checkpoint at a time")
                .push(&mut self.cx.out);
        }
        if !c.unaligned && self.cx.spans.exists(&base.join("aligned_timeout")) {
            self.cx
                .key_error(
                    codes::NO_EFFECT,
                    &base.join("aligned_timeout"),
                    "`aligned_timeout` applies only to unaligned checkpoints",
                    "no effect without `unaligned: true`",
                )
                .help("add `unaligned: true` (each checkpoint then starts aligned and goes unaligned after `aligned_timeout`), or remove `aligned_timeout`")
                .push(&mut self.cx.out);
        }
        let storage = c.storage.trim();
        if let Some((scheme, rest)) = storage.split_once("://") {
            if scheme == "s3" {
                self.check_s3_location(&base.join("storage"), storage, rest);
            } else if scheme != "file" {
                self.cx
                    .error(
                        codes::UNSUPPORTED_STORAGE,
                        &base.join("storage"),
                        format!("`{scheme}://` checkpoint storage is not supported yet"),
                        "unsupported scheme",
                    )
                    .help("use a local directory (or `file://` path), or `s3://bucket/prefix`")
                    .push(&mut self.cx.out);
            }
        } else if storage.is_empty() {
            self.cx
                .error(
                    codes::INVALID_VALUE,
                    &base.join("storage"),
                    "checkpoint storage is empty",
                    "empty",
                )
                .help("name a directory, such as `.weir/checkpoints`")
                .push(&mut self.cx.out);
        }
    }

    fn check_restart(&mut self) {
        let base = self.base.join("restart");
        match &self.p.restart {
            Some(RestartSpec::FailureRate(f)) => {
                self.positive(
                    f.interval,
                    base.join("interval"),
                    "the failure-rate interval",
                );
            }
            Some(RestartSpec::ExponentialDelay(e)) => {
                self.positive(e.initial, base.join("initial"), "the initial delay");
                self.positive(e.reset_after, base.join("reset_after"), "`reset_after`");
                if e.max < e.initial {
                    self.cx
                        .error(
                            codes::BAD_PARAMETER,
                            &base.join("max"),
                            format!("`max` ({}) is below `initial` ({})", e.max, e.initial),
                            "below initial",
                        )
                        .help("make `max` at least `initial`")
                        .push(&mut self.cx.out);
                }
                if !(e.multiplier.is_finite() && e.multiplier > 1.0) {
                    self.cx
                        .error(
                            codes::BAD_PARAMETER,
                            &base.join("multiplier"),
                            format!("multiplier {} would not grow the delay", e.multiplier),
                            "must be > 1",
                        )
                        .help("use a factor above 1, such as `1.5` (Flink's default) or `2`; for a constant delay use `strategy: fixed_delay`")
                        .push(&mut self.cx.out);
                }
                if !(0.0..=1.0).contains(&e.jitter) {
                    self.cx
                        .error(codes::BAD_PARAMETER, &base.join("jitter"), format!("jitter {} is outside [0, 1]", e.jitter), "out of range")
                        .help("jitter is a fraction of the delay: `0` for none, `0.1` (default) for ±10 %")
                        .push(&mut self.cx.out);
                }
            }
            _ => {}
        }
        if self.p.failover == FailoverSpec::Individual {
            let extra = if self.exactly_once() {
                " This breaks the pipeline's exactly-once guarantee."
            } else {
                ""
            };
            self.cx
                .warning(
                    codes::LOSSY_FAILOVER,
                    &self.base.join("failover"),
                    format!("`failover: individual` can lose or duplicate in-flight records when a subtask restarts.{extra}"),
                    "approximate recovery",
                )
                .help("use `failover: region` (the default) or `full` for exact recovery; keep `individual` only if approximate results are acceptable")
                .push(&mut self.cx.out);
        }
    }

    fn check_state(&mut self) {
        if !(self.exactly_once() && self.p.state == StateSpec::Memory) {
            return;
        }
        if !self.p.sinks.iter().any(SinkSpec::is_transactional) {
            return;
        }
        let state = self.base.join("state");
        let path = if self.cx.spans.exists(&state) {
            state.join("backend")
        } else {
            self.base.join("checkpoints").join("mode")
        };
        self.cx
            .warning(
                codes::VOLATILE_STATE,
                &path,
                "`memory` state keeps checkpoints in this process only: exactly-once output survives task failures but not a crash of `weir`",
                "checkpoints lost on crash",
            )
            .help("use `state: {backend: fs}` or `state: {backend: rocksdb}` to recover exactly-once after a crash")
            .push(&mut self.cx.out);
    }
}

impl PipelineCheck<'_, '_> {
    /// Script limits the schema cannot range-check: sizes are text (`1MiB`), and call levels
    /// and expression depth share one stack. A size of `0` would mean "no limit" to Rhai, so
    /// it is refused, as is anything above a ceiling.
    fn check_limits(&mut self) {
        let limits = &self.p.limits;
        let depth = u64::from(limits.max_call_levels) * (u64::from(limits.max_expr_depth) + 8);
        let budget = crate::model::SCRIPT_DEPTH_BUDGET;
        if depth > budget {
            let base = self.base.join("limits");
            let path = if self.cx.spans.exists(&base.join("max_call_levels")) {
                base.join("max_call_levels")
            } else {
                base.join("max_expr_depth")
            };
            let most_calls = budget / (u64::from(limits.max_expr_depth) + 8);
            let most_depth = (budget / u64::from(limits.max_call_levels.max(1))).saturating_sub(8);
            self.cx
                .error(
                    codes::INVALID_VALUE,
                    &path,
                    format!(
                        "`max_call_levels: {}` with `max_expr_depth: {}` could overflow the stack of a worker thread",
                        limits.max_call_levels, limits.max_expr_depth
                    ),
                    "too deep together",
                )
                .help(format!(
                    "`max_call_levels` × (`max_expr_depth` + 8) must be at most {budget} (it is {depth}): \
                     with this `max_expr_depth` use at most `max_call_levels: {most_calls}`, or with these \
                     call levels at most `max_expr_depth: {most_depth}`"
                ))
                .push(&mut self.cx.out);
        }
        let path = self.base.join("limits").join("max_string_size");
        let size = self.p.limits.max_string_size;
        let ceiling = format!("{}MiB", crate::model::MAX_STRING_SIZE_CEILING.bytes() >> 20);
        if size.bytes() == 0 {
            self.cx
                .error(
                    codes::INVALID_VALUE,
                    &path,
                    "a string size limit of 0 bytes would mean no limit at all",
                    "zero",
                )
                .help(format!(
                    "give a real bound, however large, up to `{ceiling}` (the default is `1MiB`)"
                ))
                .push(&mut self.cx.out);
        } else if size > crate::model::MAX_STRING_SIZE_CEILING {
            self.cx
                .error(codes::INVALID_VALUE, &path, format!("a string size limit of `{size}` is above the ceiling of `{ceiling}`"), "above the ceiling")
                .help(format!("use at most `{ceiling}`: one value a script holds (a record, a state value) lives in memory at once"))
                .push(&mut self.cx.out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::load_str;

    fn codes_of(text: &str) -> Vec<&'static str> {
        let loaded = load_str("t.yaml", text);
        let mut all: Vec<&'static str> = loaded.diagnostics.iter().map(|d| d.code).collect();
        if let (Some(spec), Some(spans)) = (&loaded.spec, &loaded.spans) {
            all.extend(
                validate(spec, spans, &loaded.source, Path::new("."))
                    .iter()
                    .map(|d| d.code),
            );
        }
        all
    }

    const OK: &str = "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: src, type: file, path: in.jsonl}\n    operators:\n      - {id: by, type: key_by, input: src, field: user}\n      - id: total\n        type: aggregate\n        input: by\n        aggregations: [{fn: sum, field: amount}]\n    sinks:\n      - {id: out, type: file, input: total, path: out}\n";

    const WINDOW: &str = "version: 1\npipelines:\n  - id: p\n    sources:\n      - {id: src, type: file, path: in.jsonl}\n    operators:\n      - {id: by, type: key_by, input: src, field: user}\n      - id: w\n        type: window\n        input: by\n        window: {tumbling: {size: 1m}}\n        time: processing\n        aggregations: [{fn: count, as: views}]\n    sinks:\n      - {id: out, type: file, input: w, path: out}\n";

    /// The diagnostics of `text`, with the text each points at.
    fn located(text: &str) -> Vec<(&'static str, String)> {
        let loaded = load_str("t.yaml", text);
        let spec = loaded
            .spec
            .as_ref()
            .unwrap_or_else(|| panic!("{:?}", loaded.diagnostics));
        validate(
            spec,
            loaded.spans.as_ref().expect("spans"),
            &loaded.source,
            Path::new("."),
        )
        .iter()
        .map(|d| {
            (
                d.code,
                d.span
                    .clone()
                    .map(|s| text[s].to_owned())
                    .unwrap_or_default(),
            )
        })
        .collect()
    }

    #[test]
    fn a_window_validates_its_kind_durations_and_accumulator() {
        assert_eq!(codes_of(WINDOW), Vec::<&str>::new());
        let text = WINDOW.replace(
            "{tumbling: {size: 1m}}",
            "{sliding: {size: 10s, slide: 20s}}",
        );
        assert_eq!(
            located(&text),
            vec![(codes::OPERATOR_OPTION, "20s".to_owned())]
        );
        let text = WINDOW.replace("{tumbling: {size: 1m}}", "{session: {gap: 0s}}");
        assert_eq!(
            located(&text),
            vec![(codes::INVALID_DURATION, "0s".to_owned())]
        );
        let text = WINDOW.replace("        aggregations: [{fn: count, as: views}]\n", "");
        assert_eq!(
            codes_of(&text),
            vec![codes::OPERATOR_OPTION],
            "needs one of them"
        );
        let text = WINDOW.replace(
            "        aggregations:",
            "        script: 'fn init() { 0 } fn add(a, r) { a + 1 }'\n        aggregations:",
        );
        assert_eq!(codes_of(&text), vec![codes::OPERATOR_OPTION], "not both");
        let text = WINDOW.replace("as: views", "as: window_end");
        assert_eq!(codes_of(&text), vec![codes::OPERATOR_OPTION]);
        let text = WINDOW.replace("input: by\n", "input: src\n");
        assert!(codes_of(&text).contains(&codes::KEYED_WITHOUT_KEY_BY));
    }

    #[test]
    fn an_event_time_window_needs_event_time_upstream_and_late_names_a_sink() {
        let event = WINDOW.replace("        time: processing\n", "");
        assert_eq!(
            located(&event),
            vec![(codes::NO_EVENT_TIME, "id".to_owned())]
        );
        let with_late = WINDOW.replace("        time: processing\n", "        late: late_out\n")
            + "      - {id: late_out, type: file, path: late}\n";
        assert_eq!(
            codes_of(&with_late),
            vec![codes::NO_EVENT_TIME],
            "a sink without input is a valid late target"
        );
        let missing = with_late.replace("late: late_out", "late: late_oot");
        let found = located(&missing);
        assert!(
            found.contains(&(codes::DEAD_LETTER, "late_oot".to_owned())),
            "{found:?}"
        );
        let fed = with_late.replace(
            "{id: late_out, type: file,",
            "{id: late_out, type: file, input: w,",
        );
        assert!(codes_of(&fed).contains(&codes::DEAD_LETTER));
        // Processing time has no late records, nor lateness, nor a time field.
        let text = WINDOW.replace(
            "        time: processing\n",
            "        time: processing\n        allowed_lateness: 1s\n        time_field: ts\n",
        );
        assert_eq!(codes_of(&text), vec![codes::NO_EFFECT, codes::NO_EFFECT]);
    }

    #[test]
    fn valid_file_has_no_findings() {
        assert_eq!(codes_of(OK), Vec::<&str>::new());
    }

    #[test]
    fn dangling_input_is_reported_with_suggestion() {
        let text = OK.replace("input: total", "input: totl");
        let loaded = load_str("t.yaml", &text);
        let d = validate(
            loaded
                .spec
                .as_ref()
                .unwrap_or_else(|| panic!("{:?}", loaded.diagnostics)),
            loaded.spans.as_ref().expect("spans"),
            &loaded.source,
            Path::new("."),
        );
        let unknown = d
            .iter()
            .find(|d| d.code == codes::UNKNOWN_INPUT)
            .expect("unknown input");
        assert_eq!(&text[unknown.span.clone().expect("span")], "totl");
        assert!(unknown.help.as_deref().unwrap_or("").contains("`total`"));
    }

    #[test]
    fn cycle_and_keyed_rules() {
        let text = OK.replace("input: src, field", "input: total, field");
        assert!(codes_of(&text).contains(&codes::CYCLE));
        let text = OK.replace("input: by\n", "input: src\n");
        assert!(codes_of(&text).contains(&codes::KEYED_WITHOUT_KEY_BY));
    }

    #[test]
    fn unknown_fields_do_not_hide_semantic_errors() {
        let text = OK
            .replace("input: total", "input: totl")
            .replace("    sources:", "    intervall: 1s\n    sources:");
        let found = codes_of(&text);
        assert!(found.contains(&codes::UNKNOWN_FIELD), "{found:?}");
        assert!(found.contains(&codes::UNKNOWN_INPUT), "{found:?}");
    }

    #[test]
    fn exactly_once_rejects_stdin() {
        let text = OK
            .replace(
                "{id: src, type: file, path: in.jsonl}",
                "{id: src, type: stdin}",
            )
            .replace(
                "    sources:",
                "    checkpoints: {interval: 1s}\n    state: {backend: fs}\n    sources:",
            );
        assert_eq!(codes_of(&text), vec![codes::NOT_REPLAYABLE]);
    }

    #[test]
    fn event_time_rules() {
        let with = |et: &str| {
            OK.replace(
                "{id: src, type: file, path: in.jsonl}",
                &format!("{{id: src, type: file, path: in.jsonl, event_time: {et}}}"),
            )
        };
        assert_eq!(
            codes_of(&with(
                "{field: ts, unit: s, max_out_of_orderness: 1s, idle_timeout: 30s}"
            )),
            Vec::<&str>::new()
        );
        assert_eq!(
            codes_of(&with("{field: meta.time, format: rfc3339}")),
            Vec::<&str>::new()
        );
        assert_eq!(
            codes_of(&with("{field: ts, unit: ms, format: rfc3339}")),
            vec![codes::INVALID_VALUE]
        );
        assert_eq!(
            codes_of(&with("{field: 'a..b'}")),
            vec![codes::INVALID_VALUE]
        );
        assert_eq!(
            codes_of(&with("{field: ts, idle_timeout: 0s}")),
            vec![codes::INVALID_DURATION]
        );
        assert!(
            !codes_of(&with("{unit: ms}")).is_empty(),
            "the field is required"
        );
        assert!(!codes_of(&with("{field: ts, unit: minutes}")).is_empty());
    }

    /// A process over `by` with the given `state:` block (flow style).
    fn with_state(state: &str) -> String {
        OK.replace(
            "      - id: total\n        type: aggregate\n        input: by\n        aggregations: [{fn: sum, field: amount}]\n",
            &format!("      - id: total\n        type: process\n        input: by\n        state: {state}\n        script: 'fn process(r) {{ }}'\n"),
        )
    }

    fn findings(text: &str) -> Vec<Diagnostic> {
        let loaded = load_str("t.yaml", text);
        let mut all: Vec<Diagnostic> = loaded.diagnostics.iter().cloned().collect();
        if let (Some(spec), Some(spans)) = (&loaded.spec, &loaded.spans) {
            all.extend(
                validate(spec, spans, &loaded.source, Path::new("."))
                    .iter()
                    .cloned(),
            );
        }
        all
    }

    #[test]
    fn state_entries_take_the_short_and_the_long_form() {
        let text = with_state(
            "{best: value, seen: {kind: map, ttl: 1h, ttl_update: on_read_and_write}, recent: {kind: list}}",
        );
        assert_eq!(codes_of(&text), Vec::<&str>::new());
        let loaded = load_str("t.yaml", &text);
        let spec = loaded.spec.expect("loads");
        let OperatorSpec::Process(p) = &spec.pipelines[0].operators[1] else {
            panic!("a process");
        };
        assert_eq!(
            p.state["best"],
            StateDeclSpec::Kind(crate::StateKind::Value)
        );
        assert_eq!(p.state["seen"].kind(), crate::StateKind::Map);
        assert_eq!(p.state["seen"].ttl(), Some(DurationSpec::from_secs(3600)));
        assert_eq!(
            p.state["seen"].ttl_update(),
            crate::TtlUpdate::OnReadAndWrite
        );
        assert_eq!(p.state["recent"].ttl(), None);
        assert_eq!(p.state["best"].ttl_update(), crate::TtlUpdate::OnWrite);
    }

    #[test]
    fn a_state_ttl_must_be_a_positive_duration_and_is_located() {
        let text = with_state("{seen: {kind: map, ttl: 0s}}");
        let found = findings(&text);
        let zero = found
            .iter()
            .find(|d| d.code == codes::INVALID_DURATION)
            .unwrap_or_else(|| panic!("{found:?}"));
        assert_eq!(&text[zero.span.clone().expect("span")], "0s");
        assert!(
            zero.message.contains("`ttl` of state `seen`"),
            "{}",
            zero.message
        );

        let text = with_state("{seen: {kind: map, ttl: soon}}");
        let found = findings(&text);
        let bad = found
            .iter()
            .find(|d| d.code == codes::INVALID_DURATION)
            .unwrap_or_else(|| panic!("{found:?}"));
        assert_eq!(&text[bad.span.clone().expect("span")], "soon");

        let text = with_state("{seen: {kind: map, ttl_update: on_write}}");
        let found = findings(&text);
        let idle = found
            .iter()
            .find(|d| d.code == codes::OPERATOR_OPTION)
            .unwrap_or_else(|| panic!("{found:?}"));
        assert_eq!(&text[idle.span.clone().expect("span")], "ttl_update");

        for wrong in [
            "{seen: {kind: bag}}",
            "{seen: {kind: map, tll: 1h}}",
            "{seen: sett}",
        ] {
            let found = findings(&with_state(wrong));
            assert!(
                found
                    .iter()
                    .any(|d| d.span.is_some() && d.severity == crate::Severity::Error),
                "{wrong}: {found:?}"
            );
        }
    }
}
