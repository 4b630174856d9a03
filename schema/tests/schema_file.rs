//! The checked-in JSON Schema (`schema/weir.schema.json`) must equal the generated one, and
//! every field and enum value in it must carry a description.
//!
//! Regenerate after changing the model: `WEIR_BLESS=1 cargo test -p weir-schema --test schema_file`.

use std::path::Path;

use serde_json::Value;

fn checked_in() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("weir.schema.json")
}

#[test]
fn checked_in_schema_is_current() {
    let generated = weir_schema::schema::json_schema_string();
    let path = checked_in();
    if std::env::var_os("WEIR_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write schema");
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "schema/weir.schema.json is stale: run `WEIR_BLESS=1 cargo test -p weir-schema --test schema_file` and commit it"
    );
}

/// Walks every property schema and every `oneOf` branch; each must have a description.
fn undocumented(node: &Value, at: &str, out: &mut Vec<String>) {
    let Value::Object(map) = node else { return };
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, prop) in props {
            let here = format!("{at}.{name}");
            let documented = prop.get("description").is_some()
                || prop.get("$ref").is_some() && prop.get("description").is_some()
                || name == "type" && prop.get("const").is_some()
                || ["backend", "strategy", "kind"].contains(&name.as_str())
                    && prop.get("const").is_some();
            // An externally tagged variant (`{dead_letter: <sink>}`) is documented by its branch.
            let tagged_variant = props.len() == 1 && map.get("description").is_some();
            if !documented && !tagged_variant {
                out.push(here.clone());
            }
            undocumented(prop, &here, out);
        }
    }
    // Enum variants are `oneOf` branches; `anyOf` only wraps optional values (`T | null`),
    // which the property's own description covers.
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(branches)) = map.get(key) {
            for (i, b) in branches.iter().enumerate() {
                if key == "oneOf" && b.get("description").is_none() {
                    out.push(format!("{at}.{key}[{i}]"));
                }
                undocumented(b, &format!("{at}.{key}[{i}]"), out);
            }
        }
    }
    for key in ["$defs", "items", "additionalProperties"] {
        match map.get(key) {
            Some(Value::Object(defs)) if key == "$defs" => {
                for (name, d) in defs {
                    undocumented(d, &format!("$defs.{name}"), out);
                }
            }
            Some(v @ Value::Object(_)) => undocumented(v, &format!("{at}.{key}"), out),
            _ => {}
        }
    }
}

#[test]
fn every_field_and_variant_is_described() {
    let mut missing = Vec::new();
    undocumented(weir_schema::schema::json_schema(), "", &mut missing);
    assert!(
        missing.is_empty(),
        "schema nodes without description: {missing:#?}"
    );
}
