//! Walking a JSON Schema along a config path (the pipeline file's,
//! `weir_schema::schema::json_schema`, what `weir schema` prints; any other generated the same
//! way): the descriptions hover shows, the keys and values completion offers.
//!
//! The schema is schemars' draft 2020-12 output: `$ref`s into `$defs`, `anyOf` for optional
//! values, `oneOf` for the kinds a `type:` (or `backend:`, `strategy:`, `kind:`) selects.
//! At a mapping whose discriminator is written, only the branches it names count.

use serde_json::Value;

use super::outline::Seg;

/// The keys whose value selects a `oneOf` branch.
const DISCRIMINATORS: [&str; 4] = ["type", "backend", "strategy", "kind"];

/// The schemas that may describe one node, within one root schema (whose `$defs` the
/// `$ref`s name).
#[derive(Clone, Debug)]
pub struct Candidates<'s> {
    root: &'s Value,
    schemas: Vec<&'s Value>,
}

/// A key a mapping may hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// The key.
    pub name: String,
    /// Its description, when the schema has one.
    pub description: Option<String>,
}

/// A value a node may take, with the description of its branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueInfo {
    /// The value as written in YAML.
    pub value: String,
    /// What it means.
    pub description: Option<String>,
}

fn resolve<'s>(root: &'s Value, schema: &'s Value) -> &'s Value {
    let mut s = schema;
    // Bounded: the generated schema has no `$ref` chains; a cycle cannot hang us.
    for _ in 0..16 {
        let Some(r) = s.get("$ref").and_then(Value::as_str) else {
            return s;
        };
        let Some(target) = r
            .strip_prefix("#/$defs/")
            .and_then(|name| root.get("$defs")?.get(name))
        else {
            return s;
        };
        s = target;
    }
    s
}

impl<'s> Candidates<'s> {
    /// The document root of `schema`.
    pub fn root(schema: &'s Value) -> Self {
        Self {
            root: schema,
            schemas: vec![schema],
        }
    }

    /// Every alternative, `$ref`s resolved and `anyOf`/`oneOf` flattened (each branch keeps
    /// its own description).
    pub fn flatten(&self) -> Vec<&'s Value> {
        let mut out = Vec::new();
        let mut stack: Vec<&'s Value> = self.schemas.iter().rev().copied().collect();
        while let Some(s) = stack.pop() {
            if out.len() > 256 {
                break;
            }
            let s = resolve(self.root, s);
            let alts = s
                .get("oneOf")
                .or_else(|| s.get("anyOf"))
                .and_then(Value::as_array);
            match alts {
                Some(alts) => stack.extend(alts.iter().rev()),
                None => out.push(s),
            }
        }
        out
    }

    /// The object alternatives that fit a mapping whose discriminators have the values
    /// `written` gives (all of them when none is written or none matches).
    pub fn objects(&self, written: &dyn Fn(&str) -> Option<String>) -> Vec<&'s Value> {
        let objects: Vec<&'s Value> = self
            .flatten()
            .into_iter()
            .filter(|s| s.get("properties").is_some() || s.get("additionalProperties").is_some())
            .collect();
        for d in DISCRIMINATORS {
            let Some(v) = written(d) else { continue };
            let matching: Vec<&'s Value> = objects
                .iter()
                .copied()
                .filter(|s| const_of(s.get("properties").and_then(|p| p.get(d))) == Some(v.clone()))
                .collect();
            if !matching.is_empty() {
                return matching;
            }
        }
        objects
    }

    /// The schemas of the child `seg` of a node described by `self`.
    pub fn child(&self, seg: &Seg, written: &dyn Fn(&str) -> Option<String>) -> Candidates<'s> {
        let mut out = Vec::new();
        match seg {
            Seg::Key(k) => {
                for s in self.objects(written) {
                    if let Some(p) = s.get("properties").and_then(|p| p.get(k)) {
                        out.push(p);
                    } else if let Some(a) = s.get("additionalProperties").filter(|a| a.is_object())
                    {
                        out.push(a);
                    }
                }
            }
            Seg::Index(_) => {
                for s in self.flatten() {
                    if let Some(items) = s.get("items") {
                        out.push(items);
                    }
                }
            }
        }
        Candidates {
            root: self.root,
            schemas: out,
        }
    }

    /// The keys the mapping may hold.
    pub fn keys(&self, written: &dyn Fn(&str) -> Option<String>) -> Vec<KeyInfo> {
        let mut out: Vec<KeyInfo> = Vec::new();
        for s in self.objects(written) {
            let Some(props) = s.get("properties").and_then(Value::as_object) else {
                continue;
            };
            for (name, p) in props {
                if out.iter().any(|k| &k.name == name) {
                    continue;
                }
                out.push(KeyInfo {
                    name: name.clone(),
                    description: description(p),
                });
            }
        }
        out
    }

    /// The values a scalar here may take: `const`s and `enum`s (with their branch's
    /// description), and `true`/`false` for a boolean.
    pub fn values(&self) -> Vec<ValueInfo> {
        let mut out: Vec<ValueInfo> = Vec::new();
        let mut push = |value: String, description: Option<String>| {
            if !out.iter().any(|v| v.value == value) {
                out.push(ValueInfo { value, description });
            }
        };
        for s in self.flatten() {
            if let Some(c) = s.get("const") {
                push(scalar_text(c), description(s));
            }
            for e in s
                .get("enum")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                push(scalar_text(e), None);
            }
            if has_type(s, "boolean") {
                push("true".into(), None);
                push("false".into(), None);
            }
        }
        out
    }

    /// The values of discriminator `key` over the branches (`type: map`, `type: filter`, ...),
    /// each with its branch's description.
    pub fn discriminator_values(&self, key: &str) -> Vec<ValueInfo> {
        let mut out: Vec<ValueInfo> = Vec::new();
        for s in self.flatten() {
            if let Some(v) = const_of(s.get("properties").and_then(|p| p.get(key)))
                && !out.iter().any(|o| o.value == v)
            {
                out.push(ValueInfo {
                    value: v,
                    description: description(s),
                });
            }
        }
        out
    }

    /// The first description any alternative gives (the property's own comes first).
    pub fn description(&self) -> Option<String> {
        self.schemas
            .iter()
            .find_map(|s| description(s))
            .or_else(|| self.flatten().into_iter().find_map(description))
    }

    /// Whether the node holds a mapping.
    pub fn is_object(&self) -> bool {
        self.flatten().iter().any(|s| has_type(s, "object"))
    }
}

fn description(s: &Value) -> Option<String> {
    s.get("description")
        .and_then(Value::as_str)
        .map(|d| d.replace('\n', " "))
}

fn has_type(s: &Value, t: &str) -> bool {
    match s.get("type") {
        Some(Value::String(x)) => x == t,
        Some(Value::Array(xs)) => xs.iter().any(|x| x == t),
        _ => false,
    }
}

fn const_of(s: Option<&Value>) -> Option<String> {
    s.and_then(|s| s.get("const")).map(scalar_text)
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    fn operator() -> Candidates<'static> {
        let p = Candidates::root(weir_schema::schema::json_schema())
            .child(&Seg::Key("pipelines".into()), &none)
            .child(&Seg::Index(0), &none);
        p.child(&Seg::Key("operators".into()), &none)
            .child(&Seg::Index(0), &none)
    }

    #[test]
    fn operator_types_and_keys_come_from_the_schema() {
        let op = operator();
        let types: Vec<String> = op
            .discriminator_values("type")
            .into_iter()
            .map(|v| v.value)
            .collect();
        assert!(types.contains(&"map".to_owned()) && types.contains(&"aggregate".to_owned()));
        let map_keys: Vec<String> = op
            .keys(&|k| (k == "type").then(|| "map".to_owned()))
            .into_iter()
            .map(|k| k.name)
            .collect();
        assert!(map_keys.contains(&"script".to_owned()));
        assert!(!map_keys.contains(&"aggregations".to_owned()));
        let script = op.child(&Seg::Key("script".into()), &|k| {
            (k == "type").then(|| "map".to_owned())
        });
        assert!(script.description().unwrap_or_default().contains("Rhai"));
        let on_error = op.child(&Seg::Key("on_error".into()), &none);
        let values: Vec<String> = on_error.values().into_iter().map(|v| v.value).collect();
        assert_eq!(values, ["fail", "skip"]);
    }
}
