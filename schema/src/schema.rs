//! The JSON Schema of the pipeline file: generated from the model by schemars, and used to
//! check a loaded file before the typed parse, with each failure turned into a located,
//! friendly diagnostic.
//!
//! jsonschema reports every failing branch of a `oneOf`; this module prunes the branches whose
//! discriminator (`type`, `backend`, `strategy`, `kind`) does not match, so that a user who
//! wrote `type: file` hears about the file source's fields only.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::diagnostic::{Diagnostic, Diagnostics, codes, did_you_mean};
use crate::model::FileSpec;
use crate::span::{PathSeg, SourceFile, SpanIndex, YamlPath};

/// The JSON Schema of the pipeline file (draft 2020-12), as a JSON value.
pub fn json_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
        let schema = generator.into_root_schema_for::<FileSpec>();
        let mut value = serde_json::to_value(schema).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("$id".into(), Value::from("https://weir.dev/schema/weir.schema.json"));
            map.insert(
                "description".into(),
                Value::from(
                    "A Weir pipeline file: pipelines of sources, Rhai-scripted operators and sinks, \
                     with state, checkpoints, restart and failover declared per pipeline.",
                ),
            );
        }
        value
    })
}

/// The schema as pretty-printed JSON with a trailing newline (what `weir schema` prints and
/// what `schema/weir.schema.json` holds).
pub fn json_schema_string() -> String {
    let mut s = serde_json::to_string_pretty(json_schema()).unwrap_or_default();
    s.push('\n');
    s
}

fn validator() -> Option<&'static jsonschema::Validator> {
    static VALIDATOR: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| jsonschema::validator_for(json_schema()).ok())
        .as_ref()
}

struct Failure {
    schema_loc: String,
    instance: YamlPath,
    keyword: String,
    message: String,
}

const DISCRIMINATORS: [&str; 4] = ["type", "backend", "strategy", "kind"];

/// Schema failures explained per file (see [`check`]).
const MAX_FAILURES: usize = 1000;

/// Checks a file's JSON value against the schema; every failure becomes a located diagnostic.
pub fn check(value: &Value, spans: &SpanIndex, file: &Arc<SourceFile>) -> Diagnostics {
    check_against(json_schema(), validator(), value, spans, file)
}

/// As [`check`], against another document's schema (`schema`, compiled as `validator`): how
/// `weir test` files get the same located diagnostics as pipeline files.
pub fn check_against(
    schema: &Value,
    validator: Option<&jsonschema::Validator>,
    value: &Value,
    spans: &SpanIndex,
    file: &Arc<SourceFile>,
) -> Diagnostics {
    let mut out = Diagnostics::new();
    let Some(validator) = validator else {
        out.push(Diagnostic::error(
            codes::INVALID_VALUE,
            "internal error: the built-in JSON Schema does not compile",
        ));
        return out;
    };
    let evaluation = validator.evaluate(value);
    let mut failures: Vec<Failure> = evaluation
        .iter_errors()
        .take(MAX_FAILURES + 1)
        .map(|e| Failure {
            schema_loc: e
                .schema_location
                .rsplit_once('#')
                .map_or(e.schema_location, |(_, frag)| frag)
                .to_owned(),
            instance: YamlPath::from_json_pointer(e.instance_location.as_str()),
            keyword: e.error.keyword().to_owned(),
            message: e.error.message().to_owned(),
        })
        .collect();
    // Grouping the failures below compares them pairwise; a file with thousands of broken
    // nodes gets the first ones explained, and a note.
    if failures.len() > MAX_FAILURES {
        failures.truncate(MAX_FAILURES);
        out.push(
            Diagnostic::error(
                codes::INVALID_VALUE,
                format!(
                    "the file breaks the schema in more than {MAX_FAILURES} places; only the first are reported"
                ),
            )
            .at(file, 0..0)
            .help("fix the problems reported, then validate again"),
        );
    }
    if std::env::var_os("WEIR_DEBUG_SCHEMA").is_some() {
        for f in &failures {
            eprintln!(
                "{} | {} | {} | {}",
                f.schema_loc, f.instance, f.keyword, f.message
            );
        }
    }

    // Branches of a oneOf whose discriminator did not match: (branch schema prefix, object).
    let dead: Vec<(String, YamlPath)> = failures
        .iter()
        .filter_map(|f| {
            let disc = DISCRIMINATORS.iter().find(|d| {
                (f.keyword == "const" || f.keyword == "enum")
                    && f.schema_loc
                        .ends_with(&format!("/properties/{d}/{}", f.keyword))
                    || f.keyword == "required" && f.message.starts_with(&format!("\"{d}\""))
            })?;
            let cut = f
                .schema_loc
                .find(&format!("/properties/{disc}/"))
                .or_else(|| f.schema_loc.rfind("/required"))?;
            let prefix = &f.schema_loc[..cut];
            prefix
                .rsplit('/')
                .nth(1)
                .filter(|s| *s == "oneOf" || *s == "anyOf")?;
            let object = if f.keyword == "required" {
                f.instance.clone()
            } else {
                f.instance.parent()
            };
            Some((prefix.to_owned(), object))
        })
        .collect();
    let is_dead = |f: &Failure| {
        dead.iter().any(|(p, o)| {
            f.schema_loc
                .strip_prefix(p.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
                && f.instance.0.starts_with(&o.0)
        })
    };

    let mut seen = HashSet::new();
    // Objects for which every branch's discriminator failed: an unknown `type:`.
    let mut groups: Vec<(String, YamlPath, HashSet<String>)> = Vec::new();
    for (prefix, object) in &dead {
        let Some((of, n)) = prefix.rsplit_once('/') else {
            continue;
        };
        match groups.iter_mut().find(|(g, o, _)| g == of && o == object) {
            Some((_, _, ns)) => {
                ns.insert(n.to_owned());
            }
            None => groups.push((of.to_owned(), object.clone(), HashSet::from([n.to_owned()]))),
        }
    }
    for (of, object, branches) in &groups {
        let total = resolve(schema, of)
            .and_then(Value::as_array)
            .map_or(usize::MAX, Vec::len);
        if branches.len() >= total {
            let f = Failure {
                schema_loc: of.clone(),
                instance: object.clone(),
                keyword: "oneOf".into(),
                message: String::new(),
            };
            push_unique(
                &mut out,
                &mut seen,
                no_branch_matched(schema, &f, value, spans, file),
            );
        }
    }

    // Failures of several branches of a non-discriminated oneOf at one node: one diagnostic.
    let live: Vec<&Failure> = failures.iter().filter(|f| !is_dead(f)).collect();
    let branch_of = |f: &Failure| -> Option<(String, String)> {
        let i = f
            .schema_loc
            .rfind("/oneOf/")
            .or_else(|| f.schema_loc.rfind("/anyOf/"))?;
        let rest = &f.schema_loc[i + 7..];
        let n = rest.split('/').next()?;
        Some((f.schema_loc[..i + 6].to_owned(), n.to_owned()))
    };
    let mut collapsed: HashSet<(String, YamlPath)> = HashSet::new();
    for f in &live {
        let Some((of, n)) = branch_of(f) else {
            continue;
        };
        let other_branch = live.iter().any(|g| {
            g.instance == f.instance && branch_of(g).is_some_and(|(gof, gn)| gof == of && gn != n)
        });
        if other_branch && collapsed.insert((of.clone(), f.instance.clone())) {
            let g = Failure {
                schema_loc: of,
                instance: f.instance.clone(),
                keyword: "oneOf".into(),
                message: String::new(),
            };
            push_unique(
                &mut out,
                &mut seen,
                no_branch_matched(schema, &g, value, spans, file),
            );
        }
    }
    for f in &live {
        if branch_of(f).is_some_and(|(of, _)| collapsed.contains(&(of, f.instance.clone()))) {
            continue;
        }
        for d in translate(schema, f, value, spans, file) {
            push_unique(&mut out, &mut seen, d);
        }
    }
    out
}

fn push_unique(out: &mut Diagnostics, seen: &mut HashSet<(String, Option<usize>)>, d: Diagnostic) {
    if seen.insert((d.message.clone(), d.span.as_ref().map(|s| s.start))) {
        out.push(d);
    }
}

/// Resolves an evaluation path (which may pass through `$ref`) to the schema node it names.
fn resolve<'a>(root: &'a Value, schema_loc: &str) -> Option<&'a Value> {
    let mut node = root;
    for seg in schema_loc.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if seg == "$ref" {
            let target = node.get("$ref")?.as_str()?;
            node = root.pointer(target.strip_prefix('#')?)?;
            continue;
        }
        node = match node {
            Value::Object(m) => m.get(&seg)?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    if let Some(target) = node.get("$ref").and_then(Value::as_str) {
        return root.pointer(target.strip_prefix('#')?);
    }
    Some(node)
}

fn description_of(node: Option<&Value>) -> Option<String> {
    let text = node?.get("description")?.as_str()?.replace('\n', " ");
    let first = text
        .split(". ")
        .next()
        .unwrap_or(&text)
        .trim_end_matches('.');
    Some(format!("{first}."))
}

/// `min to max` (or `at least min`, `at most max`) of a numeric schema.
fn range_of(node: Option<&Value>) -> Option<String> {
    let node = node?;
    match (node.get("minimum"), node.get("maximum")) {
        (Some(min), Some(max)) => Some(format!("{min} to {max}")),
        (Some(min), None) => Some(format!("at least {min}")),
        (None, Some(max)) => Some(format!("at most {max}")),
        (None, None) => None,
    }
}

fn instance_value<'a>(value: &'a Value, path: &YamlPath) -> Option<&'a Value> {
    path.0.iter().try_fold(value, |v, seg| match seg {
        PathSeg::Key(k) => v.get(k),
        PathSeg::Index(i) => v.get(i),
    })
}

fn quoted(message: &str) -> Option<&str> {
    let start = message.find(['"', '\''])? + 1;
    let quote = message[start - 1..].chars().next()?;
    let len = message[start..].find(quote)?;
    Some(&message[start..start + len])
}

fn no_branch_matched(
    schema: &Value,
    f: &Failure,
    value: &Value,
    spans: &SpanIndex,
    file: &Arc<SourceFile>,
) -> Diagnostic {
    let branches = resolve(schema, &f.schema_loc).and_then(Value::as_array);
    let obj = instance_value(value, &f.instance);
    // A tagged enum: find the discriminator and its allowed values.
    if let (Some(branches), Some(Value::Object(fields))) = (branches, obj) {
        for disc in DISCRIMINATORS {
            let allowed: Vec<&str> = branches
                .iter()
                .filter_map(|b| {
                    let b = b
                        .get("$ref")
                        .and_then(Value::as_str)
                        .and_then(|r| schema.pointer(r.strip_prefix('#')?))
                        .unwrap_or(b);
                    b.pointer(&format!("/properties/{disc}/const"))
                        .and_then(Value::as_str)
                })
                .collect();
            if allowed.is_empty() {
                continue;
            }
            let list = allowed
                .iter()
                .map(|a| format!("`{a}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let path = f.instance.join(disc);
            return match fields.get(disc) {
                Some(Value::String(given)) => {
                    let help = match did_you_mean(given, allowed.iter().copied()) {
                        Some(s) => format!("did you mean `{s}`? The known values are {list}"),
                        None => format!("the known values are {list}"),
                    };
                    Diagnostic::error(
                        codes::UNKNOWN_TYPE,
                        format!("{path}: unknown {disc} `{given}`"),
                    )
                    .at(file, spans.span(&path))
                    .label(format!("unknown {disc}"))
                    .help(help)
                    .with_path(path)
                }
                Some(_) => Diagnostic::error(
                    codes::INVALID_VALUE,
                    format!("{path}: `{disc}` must be a string"),
                )
                .at(file, spans.span(&path))
                .label("expected a string")
                .help(format!("write one of {list}"))
                .with_path(path),
                None => Diagnostic::error(
                    codes::MISSING_FIELD,
                    format!("{}: missing `{disc}`", f.instance),
                )
                .at(file, head_span(spans, &f.instance))
                .label(format!("no `{disc}` here"))
                .help(format!("add `{disc}:` with one of {list}"))
                .with_path(f.instance.clone()),
            };
        }
    }
    let parent = resolve(schema, f.schema_loc.rsplit_once('/').map_or("", |(p, _)| p));
    let help = description_of(parent)
        .unwrap_or_else(|| "see `weir schema` for the allowed forms".to_owned());
    let shown = obj.map(short_json).unwrap_or_default();
    Diagnostic::error(
        codes::INVALID_VALUE,
        format!("{}: {shown} is not a valid value here", f.instance),
    )
    .at(file, spans.span(&f.instance))
    .label("invalid value")
    .help(help)
    .with_path(f.instance.clone())
}

/// The span to underline for a whole mapping: its key in the parent if it has one, otherwise
/// its first line.
fn head_span(spans: &SpanIndex, path: &YamlPath) -> std::ops::Range<usize> {
    if matches!(path.last(), Some(PathSeg::Key(_))) {
        return spans.key_span(path);
    }
    let span = spans.span(path);
    if let Some(crate::span::NodeValue::Map(entries)) = spans.node(path).map(|n| &n.value)
        && let Some((_, k, v)) = entries.first()
    {
        return k.start..v.span.end;
    }
    span
}

fn short_json(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

/// Fields users put at the wrong level, with where they belong.
fn misplaced(key: &str, at: &YamlPath) -> Option<&'static str> {
    let in_pipeline = at.0.len() == 2 && at.0[0] == PathSeg::Key("pipelines".into());
    let top = at.0.is_empty();
    if in_pipeline || top {
        return match key {
            "interval"
            | "mode"
            | "storage"
            | "timeout"
            | "min_pause"
            | "max_concurrent"
            | "tolerable_failures"
            | "retain"
            | "unaligned"
            | "aligned_timeout"
            | "checkpoint_interval"
            | "exactly_once" => Some("move this under `checkpoints:`"),
            "backend" | "incremental" | "block_cache_size" | "write_buffer_size"
            | "state_backend" => Some("move this under `state:`"),
            "attempts" | "delay" | "strategy" | "max_failures" | "multiplier" | "jitter"
            | "restart_strategy" => Some("move this under `restart:`"),
            "max_operations" | "max_call_levels" | "max_string_size" | "max_array_size"
            | "max_map_size" => Some("move this under `limits:`"),
            "id" | "sources" | "operators" | "sinks" | "parallelism" if top => {
                Some("pipelines are listed under `pipelines:`; put this inside a `- id: ...` entry")
            }
            _ => None,
        };
    }
    None
}

fn translate(
    schema: &Value,
    f: &Failure,
    value: &Value,
    spans: &SpanIndex,
    file: &Arc<SourceFile>,
) -> Vec<Diagnostic> {
    let path = &f.instance;
    let keyword_parent = f.schema_loc.rsplit_once('/').map_or("", |(p, _)| p);
    let node_schema = resolve(schema, keyword_parent);
    let span = spans.span(path);
    match f.keyword.as_str() {
        "additionalProperties" | "unevaluatedProperties" => {
            let allowed: Vec<&str> = node_schema
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object)
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let Some(Value::Object(fields)) = instance_value(value, path) else {
                return Vec::new();
            };
            fields
                .keys()
                .filter(|k| !allowed.contains(&k.as_str()))
                // More than a report shows would only cost time (each looks its key up).
                .take(crate::diagnostic::MAX_REPORTED + 1)
                .map(|k| {
                    let key_path = path.join(k.as_str());
                    let help = misplaced(k, path)
                        .map(str::to_owned)
                        .or_else(|| {
                            did_you_mean(k, allowed.iter().copied())
                                .map(|s| format!("did you mean `{s}`?"))
                        })
                        .unwrap_or_else(|| {
                            let mut known = allowed.clone();
                            known.sort_unstable();
                            format!(
                                "remove it; the fields allowed here are: {}",
                                known.join(", ")
                            )
                        });
                    Diagnostic::error(codes::UNKNOWN_FIELD, format!("{path}: unknown field `{k}`"))
                        .at(file, spans.key_span(&key_path))
                        .label("unknown field")
                        .help(help)
                        .with_path(key_path)
                })
                .collect()
        }
        "required" => {
            let field = quoted(&f.message).unwrap_or("?").to_owned();
            let field_schema = node_schema.and_then(|s| s.pointer(&format!("/properties/{field}")));
            let help = description_of(field_schema.and_then(|s| {
                s.get("$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| schema.pointer(r.strip_prefix('#')?))
                    .or(Some(s))
            }))
            .map_or_else(
                || format!("add `{field}:`"),
                |d| format!("add `{field}:`: {d}"),
            );
            vec![
                Diagnostic::error(
                    codes::MISSING_FIELD,
                    format!("{path}: missing required field `{field}`"),
                )
                .at(file, head_span(spans, path))
                .label(format!("`{field}` is missing here"))
                .help(help)
                .with_path(path.clone()),
            ]
        }
        "pattern" => {
            let (code, what, help) =
                if f.schema_loc.contains("Duration") || is_ref_to(node_schema, "Duration") {
                    (
                        codes::INVALID_DURATION,
                        "a duration",
                        "write a number with a unit, such as `500ms`, `1s` or `10m`",
                    )
                } else if f.schema_loc.contains("Size") || is_ref_to(node_schema, "Size") {
                    (
                        codes::INVALID_SIZE,
                        "a size",
                        "write a number with a unit, such as `64MiB`, `512KiB` or `1GB`",
                    )
                } else {
                    (
                        codes::INVALID_ID,
                        "a valid id",
                        "use letters, digits, `_` and `-`, starting with a letter or `_`",
                    )
                };
            let shown = instance_value(value, path)
                .map(short_json)
                .unwrap_or_default();
            vec![
                Diagnostic::error(code, format!("{path}: {shown} is not {what}"))
                    .at(file, span)
                    .label(format!("not {what}"))
                    .help(help)
                    .with_path(path.clone()),
            ]
        }
        "type"
            if node_schema.and_then(|s| s.get("pattern")).is_some()
                && is_duration_schema(node_schema) =>
        {
            let shown = instance_value(value, path)
                .map(short_json)
                .unwrap_or_default();
            vec![
                Diagnostic::error(
                    codes::INVALID_DURATION,
                    format!("{path}: {shown} is not a duration"),
                )
                .at(file, span)
                .label("needs a unit")
                .help(format!(
                    "durations need a unit: write `{shown}ms` or `{shown}s`"
                ))
                .with_path(path.clone()),
            ]
        }
        "enum" | "const" => {
            let allowed: Vec<String> = node_schema
                .and_then(|s| {
                    s.get("enum")
                        .and_then(Value::as_array)
                        .cloned()
                        .or_else(|| s.get("const").map(|c| vec![c.clone()]))
                })
                .unwrap_or_default()
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            let given = instance_value(value, path);
            let list = allowed
                .iter()
                .map(|a| format!("`{a}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let help = match given
                .and_then(Value::as_str)
                .and_then(|g| did_you_mean(g, allowed.iter().map(String::as_str)))
            {
                Some(s) => format!("did you mean `{s}`? Allowed: {list}"),
                None if list.is_empty() => "see `weir schema` for the allowed values".to_owned(),
                None => format!("allowed: {list}"),
            };
            vec![
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    format!(
                        "{path}: {} is not an allowed value",
                        given.map(short_json).unwrap_or_default()
                    ),
                )
                .at(file, span)
                .label("not allowed here")
                .help(help)
                .with_path(path.clone()),
            ]
        }
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
            let code = if path.0 == [PathSeg::Key("version".into())] {
                codes::UNSUPPORTED_VERSION
            } else {
                codes::INVALID_VALUE
            };
            let help = if code == codes::UNSUPPORTED_VERSION {
                "this build reads `version: 1`".to_owned()
            } else {
                let what =
                    description_of(node_schema).unwrap_or_else(|| "see `weir schema`".to_owned());
                match range_of(node_schema) {
                    Some(range) => format!("{what} Allowed: {range}."),
                    None => what,
                }
            };
            vec![
                Diagnostic::error(code, format!("{path}: {}", f.message))
                    .at(file, span)
                    .label("out of range")
                    .help(help)
                    .with_path(path.clone()),
            ]
        }
        "minItems" | "minProperties" => vec![
            Diagnostic::error(
                codes::MISSING_FIELD,
                format!("{path}: needs at least one entry"),
            )
            .at(file, head_or_span(spans, path))
            .label("empty")
            .help(description_of(node_schema).unwrap_or_else(|| "add an entry".to_owned()))
            .with_path(path.clone()),
        ],
        _ => {
            let expected = node_schema.and_then(|s| s.get("type")).map(|t| match t {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            let shown = instance_value(value, path)
                .map(short_json)
                .unwrap_or_default();
            let message = match (&*f.keyword, expected) {
                ("type", Some(t)) => format!("{path}: expected {}, found {shown}", article(&t)),
                ("type", None) => format!("{path}: {shown} has the wrong type"),
                _ => format!("{path}: {}", f.message),
            };
            vec![
                Diagnostic::error(codes::INVALID_VALUE, message)
                    .at(file, span)
                    .label("invalid value")
                    .help(
                        description_of(node_schema)
                            .unwrap_or_else(|| "see `weir schema`".to_owned()),
                    )
                    .with_path(path.clone()),
            ]
        }
    }
}

fn head_or_span(spans: &SpanIndex, path: &YamlPath) -> std::ops::Range<usize> {
    let s = spans.span(path);
    if s.is_empty() {
        spans.key_span(path)
    } else {
        s
    }
}

fn is_ref_to(node: Option<&Value>, name: &str) -> bool {
    node.and_then(|n| n.get("$ref"))
        .and_then(Value::as_str)
        .is_some_and(|r| r.ends_with(name))
}

fn is_duration_schema(node: Option<&Value>) -> bool {
    node.and_then(|n| n.get("description"))
        .and_then(Value::as_str)
        .is_some_and(|d| d.starts_with("A duration"))
}

fn article(t: &str) -> String {
    match t {
        "integer" => "an integer".to_owned(),
        "object" => "a mapping".to_owned(),
        "array" => "a list".to_owned(),
        other => format!("a {other}"),
    }
}
