//! Strict data semantics for scripts: what makes a missing field or a type mix an error
//! instead of a silent `()`, `false` or string concatenation.
//!
//! Rhai's own options do most of it: `fail_on_invalid_map_property` makes reading a missing
//! property an error (assigning a new one still works), and turning off its fast operators lets
//! registered operators take precedence over the built-in fallbacks that compare mismatched
//! types as `false` and append anything to a string. This module registers those strict
//! operators for every mismatched pair of scalar types, and `get(map, name, default)` for
//! fields that may be absent. Errors raised here use [`MISMATCH`] so that the runtime can
//! recognise them; it adds the help line and the position.
//!
//! Same-type operations, `int`/`float` mixes, `string`/`char` mixes and `==`/`!=` against `()`
//! (the idiom for "no state yet") keep Rhai's meaning. The native fast path
//! (`script::fast`) only ever answers for same-type operands, so it never disagrees.

use rhai::{Dynamic, Engine, EvalAltResult, ImmutableString, Map, Position, Variant};

/// The start of every type-mismatch error message raised here.
pub const MISMATCH: &str = "type mismatch: ";

/// The operand kinds strictness covers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Float,
    Bool,
    Str,
    Char,
    Unit,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Int => "int",
            Self::Float => "float",
            Self::Bool => "bool",
            Self::Str => "string",
            Self::Char => "char",
            Self::Unit => "() (nothing: a missing value)",
        }
    }

    fn numeric(self) -> bool {
        matches!(self, Self::Int | Self::Float)
    }

    fn textual(self) -> bool {
        matches!(self, Self::Str | Self::Char)
    }
}

const COMPARISONS: [&str; 6] = ["==", "!=", "<", "<=", ">", ">="];
const ARITHMETIC: [&str; 6] = ["+", "-", "*", "/", "%", "**"];

/// Makes `engine` strict (see the module docs).
pub fn install(engine: &mut Engine) {
    engine.set_fail_on_invalid_map_property(true);
    engine.set_fast_operators(false);
    left::<rhai::INT>(engine, Kind::Int);
    left::<rhai::FLOAT>(engine, Kind::Float);
    left::<bool>(engine, Kind::Bool);
    left::<ImmutableString>(engine, Kind::Str);
    left::<char>(engine, Kind::Char);
    left::<()>(engine, Kind::Unit);
    for kind in [Kind::Int, Kind::Float, Kind::Bool, Kind::Unit] {
        append_rejected(engine, kind);
    }
    engine.register_fn("get", get);
}

fn left<A: Variant + Clone>(engine: &mut Engine, a: Kind) {
    pair::<A, rhai::INT>(engine, a, Kind::Int);
    pair::<A, rhai::FLOAT>(engine, a, Kind::Float);
    pair::<A, bool>(engine, a, Kind::Bool);
    pair::<A, ImmutableString>(engine, a, Kind::Str);
    pair::<A, char>(engine, a, Kind::Char);
    pair::<A, ()>(engine, a, Kind::Unit);
}

/// Registers the rejecting operators for `a op b`, where Rhai's meaning is not kept.
fn pair<A: Variant + Clone, B: Variant + Clone>(engine: &mut Engine, a: Kind, b: Kind) {
    let same = a == b || (a.numeric() && b.numeric()) || (a.textual() && b.textual());
    if same {
        // `() op ()` is still wrong for everything but equality.
        if a == Kind::Unit && b == Kind::Unit {
            for op in ["<", "<=", ">", ">="].into_iter().chain(ARITHMETIC) {
                reject::<A, B>(engine, op, a, b);
            }
        }
        return;
    }
    for op in COMPARISONS.into_iter().chain(ARITHMETIC) {
        let unit_equality = matches!(op, "==" | "!=") && (a == Kind::Unit || b == Kind::Unit);
        if !unit_equality {
            reject::<A, B>(engine, op, a, b);
        }
    }
}

fn reject<A: Variant + Clone, B: Variant + Clone>(
    engine: &mut Engine,
    op: &'static str,
    a: Kind,
    b: Kind,
) {
    engine.register_fn(op, move |_: A, _: B| -> Result<Dynamic, Box<EvalAltResult>> {
        Err(mismatch(op, a, b))
    });
}

/// `s += x` appends anything to a string in Rhai; here only strings and chars.
fn append_rejected(engine: &mut Engine, b: Kind) {
    fn register<B: Variant + Clone>(engine: &mut Engine, b: Kind) {
        engine.register_fn(
            "+=",
            move |_: &mut ImmutableString, _: B| -> Result<(), Box<EvalAltResult>> {
                Err(mismatch("+=", Kind::Str, b))
            },
        );
    }
    match b {
        Kind::Int => register::<rhai::INT>(engine, b),
        Kind::Float => register::<rhai::FLOAT>(engine, b),
        Kind::Bool => register::<bool>(engine, b),
        Kind::Unit => register::<()>(engine, b),
        Kind::Str | Kind::Char => {}
    }
}

fn mismatch(op: &str, a: Kind, b: Kind) -> Box<EvalAltResult> {
    let what = if COMPARISONS.contains(&op) {
        format!("cannot compare {} with {} (`{op}`)", a.name(), b.name())
    } else {
        format!("cannot apply `{op}` to {} and {}", a.name(), b.name())
    };
    Box::new(EvalAltResult::ErrorArithmetic(
        format!("{MISMATCH}{what}"),
        Position::NONE,
    ))
}

/// `get(map, name, default)`: the field `name` of `map`, or `default` when the map has no such
/// field or holds `()` (a JSON `null`) in it.
fn get(map: &mut Map, name: &str, default: Dynamic) -> Dynamic {
    match map.get(name) {
        Some(v) if !v.is_unit() => v.clone(),
        _ => default,
    }
}

#[cfg(test)]
mod tests {
    use weir_schema::ScriptLimitsSpec;

    use super::*;

    fn eval(text: &str) -> Result<Dynamic, String> {
        let engine = crate::script::build_engine(&ScriptLimitsSpec::default());
        engine
            .eval::<Dynamic>(text)
            .map_err(|e| e.to_string())
    }

    fn fails(text: &str, needle: &str) {
        match eval(text) {
            Ok(v) => panic!("{text} gave {v:?}, not an error"),
            Err(e) => assert!(e.contains(needle), "{text}: {e}"),
        }
    }

    fn gives(text: &str, want: &str) {
        match eval(text) {
            Ok(v) => assert_eq!(v.to_string(), want, "{text}"),
            Err(e) => panic!("{text} failed: {e}"),
        }
    }

    #[test]
    fn missing_fields_are_errors_and_new_fields_can_be_set() {
        fails("let r = #{a: 1}; r.b", "Property not found: b");
        fails("let r = #{a: #{}}; r.a.b + 1", "Property not found: b");
        fails("let r = #{a: 1}; r.b += 1", MISMATCH);
        gives("let r = #{a: 1}; r.b = 2; r.b", "2");
        gives("let r = #{a: 1}; \"a\" in r", "true");
        gives("let r = #{a: 1}; \"b\" in r", "false");
        gives("let r = #{a: 1}; get(r, \"b\", 7)", "7");
        gives("let r = #{a: 1}; get(r, \"a\", 7)", "1");
        gives("let r = #{a: ()}; r.get(\"a\", \"none\")", "none");
        gives("let r = #{a: 1}; r.get(\"a\")", "1");
    }

    #[test]
    fn mismatched_types_are_errors() {
        fails("let u = \"u1\"; (u + 1) > 0", "cannot apply `+` to string and int");
        fails("\"u1\" > 0", "cannot compare string with int");
        fails("let x = 1; x == \"1\"", "cannot compare int with string");
        fails("let x = (); x + 1", "cannot apply `+` to ()");
        fails("let x = (); \"a\" + x", "cannot apply `+` to string and ()");
        fails("let x = (); x < 1", "cannot compare ()");
        fails("let s = \"a\"; s += 1; s", "cannot apply `+=` to string and int");
        fails("true + 1", MISMATCH);
        fails("let x = (); x < ()", MISMATCH);
    }

    #[test]
    fn matching_types_keep_their_meaning() {
        gives("1 + 2", "3");
        gives("1 + 0.5", "1.5");
        gives("2 > 1.5", "true");
        gives("\"a\" + \"b\"", "ab");
        gives("\"a\" + 'b'", "ab");
        gives("'a' == \"a\"", "true");
        gives("let x = (); x == ()", "true");
        gives("let x = (); x != 1", "true");
        gives("let x = 5; x == ()", "false");
        gives("let s = \"a\"; s += \"b\"; s += 'c'; s", "abc");
        gives("`n=${1}`", "n=1");
        gives("\"n=\" + 1.to_string()", "n=1");
        gives("[1] + [2]", "[1, 2]");
        gives("let a = [1]; a += 2; a", "[1, 2]");
        gives("true == false", "false");
    }
}
