//! Run-time script errors in Weir's terms. A Rhai error becomes one message: what went wrong
//! (Rhai's wording, with a missing field named together with the fields the record has), where
//! (the pipeline file's line and column of the failing expression, or the script file's), a
//! stable code of the `weir::script::*` family that `weir validate` uses, and a help line that
//! says what Rhai's words mean for a pipeline (`()` is a missing value; a function that is not
//! found for some argument types asks for an explicit conversion).
//!
//! It owns the wording only: positions come from the plan ([`ScriptOrigin`]), and the operator
//! decides what the message is for (`on_error`).

use rhai::{EvalAltResult, Position};
use weir_schema::diagnostic::codes;

/// Where a script's text sits in a file, to turn a position in the script into one in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptOrigin {
    /// The file as the user named it: the pipeline file, or the `script_file:`.
    pub file: String,
    /// Line (1-based) of the script's first character in the file.
    pub line: usize,
    /// Column (1-based, in characters) of the script's first character in the file.
    pub column: usize,
    /// Whether every script line starts at `column` (a `|` block scalar: its indentation; a
    /// script file: column 1). Otherwise (a quoted or plain scalar) only the first line is
    /// shifted.
    pub block: bool,
}

impl ScriptOrigin {
    /// A script that is a whole file of its own.
    pub fn file(file: String) -> Self {
        Self {
            file,
            line: 1,
            column: 1,
            block: true,
        }
    }

    /// The file's line and column of script line `line`, column `column` (both 1-based).
    pub fn position(&self, line: usize, column: usize) -> (usize, usize) {
        let line_in_file = self.line + line.saturating_sub(1);
        if line <= 1 || self.block {
            (line_in_file, self.column + column.saturating_sub(1))
        } else {
            (line_in_file, column)
        }
    }
}

/// A failure's message, code and help, before the position is added.
pub(crate) struct Explained {
    /// What went wrong.
    pub what: String,
    /// A code from [`codes`].
    pub code: &'static str,
    /// What it means and what to do.
    pub help: String,
}

/// The error that actually failed: calls into script functions wrap it.
pub(crate) fn innermost(e: &EvalAltResult) -> &EvalAltResult {
    let mut e = e;
    while let EvalAltResult::ErrorInFunctionCall(_, _, inner, _) = e {
        e = inner;
    }
    e
}

/// Rhai's text of `e` without its position.
pub(crate) fn bare_text(e: &EvalAltResult) -> String {
    let text = e.to_string();
    let pos = e.position();
    if pos.is_none() {
        return text;
    }
    let suffix = format!(" ({pos})");
    match text.strip_suffix(&suffix) {
        Some(bare) => bare.to_owned(),
        None => text,
    }
}

/// The full message: `what`, then the file position and code, then the help line.
pub(crate) fn render(x: &Explained, pos: Position, origin: Option<&ScriptOrigin>) -> String {
    let at = match (pos.line(), pos.position(), origin) {
        (Some(l), Some(c), Some(o)) => {
            let (l, c) = o.position(l, c);
            format!("{}:{l}:{c}", o.file)
        }
        (Some(l), Some(c), None) => format!("script line {l}, column {c}"),
        (_, _, Some(o)) => o.file.clone(),
        _ => "the script".to_owned(),
    };
    format!("{}\n  at {at} [{}]\n  help: {}", x.what, x.code, x.help)
}

/// The help for an error that [`super::strict`] raised (`type mismatch: ...`).
pub(crate) fn mismatch(what: String) -> Explained {
    let help = conversion_help(&what);
    Explained {
        what,
        code: codes::SCRIPT_TYPE_MISMATCH,
        help,
    }
}

/// The help for a missing field `name`.
pub(crate) fn missing_field(what: String, name: &str) -> Explained {
    Explained {
        what,
        code: codes::SCRIPT_MISSING_FIELD,
        help: format!(
            "the record has no field `{name}`; for a field that may be absent, read it with \
             `get(r, \"{name}\", default)` or test `\"{name}\" in r` first"
        ),
    }
}

/// Explains every other error by its kind.
pub(crate) fn other(e: &EvalAltResult, described: String) -> Explained {
    use EvalAltResult as E;
    let (code, help) = match e {
        E::ErrorFunctionNotFound(signature, _) => {
            let (name, args) = weir_signature(signature);
            return Explained {
                what: format!("no function `{name}` takes ({args})"),
                code: codes::SCRIPT_FUNCTION_NOT_FOUND,
                help: format!(
                    "Rhai looked for `{name}` taking ({args}) and found none; {}",
                    conversion_help(&args)
                ),
            };
        }
        E::ErrorTooManyOperations(_) | E::ErrorDataTooLarge(..) | E::ErrorStackOverflow(_) => (
            codes::SCRIPT_LIMIT,
            "the script reached a sandbox limit on this record; raise it under `limits:` if the \
             work is meant, or bound the loop"
                .to_owned(),
        ),
        E::ErrorVariableNotFound(..) => (
            codes::SCRIPT_RUNTIME,
            "a variable used before it is set: only the function's parameters (the record) and \
             `let` variables exist"
                .to_owned(),
        ),
        E::ErrorArrayBounds(..) | E::ErrorStringBounds(..) | E::ErrorBitFieldBounds(..) => (
            codes::SCRIPT_RUNTIME,
            "an index outside the array or string: check `len()` first".to_owned(),
        ),
        E::ErrorIndexNotFound(..) => (
            codes::SCRIPT_RUNTIME,
            "no value at this index; for a map field that may be absent use \
             `get(r, \"field\", default)`"
                .to_owned(),
        ),
        E::ErrorArithmetic(..) => (
            codes::SCRIPT_RUNTIME,
            "arithmetic failed on this record's values (a division by zero or an overflow): \
             check the operands first"
                .to_owned(),
        ),
        E::ErrorRuntime(..) => (
            codes::SCRIPT_RUNTIME,
            "the script gave up on this record with `throw`".to_owned(),
        ),
        E::ErrorMismatchDataType(..) | E::ErrorMismatchOutputType(..) => (
            codes::SCRIPT_TYPE_MISMATCH,
            conversion_help(&described),
        ),
        _ => (
            codes::SCRIPT_RUNTIME,
            "the script failed on this record; `on_error` decides what happens to it (fail, \
             skip or dead_letter)"
                .to_owned(),
        ),
    };
    Explained {
        what: described,
        code,
        help,
    }
}

/// Rhai's signature `name (type, type)` in Weir's words: the function name and its argument
/// types as `int`, `float`, `string`, `()` ...
fn weir_signature(signature: &str) -> (String, String) {
    let (name, args) = match signature.find(" (") {
        Some(i) => (&signature[..i], &signature[i + 2..]),
        None => (signature, ""),
    };
    let args = args.strip_suffix(')').unwrap_or(args);
    let types: Vec<&str> = split_top(args).into_iter().map(type_word).collect();
    (name.trim().to_owned(), types.join(", "))
}

/// Splits Rhai's argument list at the commas outside brackets.
fn split_top(args: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in args.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(args[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = args[start..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

/// One Rust type name of Rhai's in Weir's words.
fn type_word(t: &str) -> &str {
    let t = t.trim().trim_start_matches("&mut ");
    if t.contains("ImmutableString") || t.contains("&str") || t == "String" {
        return "string";
    }
    match t {
        "i64" | "i32" | "u64" | "u32" | "usize" | "INT" => "int",
        "f64" | "f32" | "FLOAT" => "float",
        "bool" => "bool",
        "char" => "char",
        "()" => "()",
        _ if t.ends_with("Array") || t.starts_with("Vec<") => "array",
        _ if t.ends_with("Map") => "map",
        _ => t,
    }
}

/// What to do when values of the types named in `text` do not go together.
fn conversion_help(text: &str) -> String {
    let has = |w: &str| {
        text.split(|c: char| !(c.is_alphanumeric() || c == '(' || c == ')'))
            .any(|t| t == w)
    };
    let mut parts = Vec::new();
    if has("()") {
        parts.push(
            "`()` means a missing value (a JSON null, or state not set yet): test `x == ()` \
             first, or read an optional field with `get(r, \"f\", default)`",
        );
    }
    let number = has("int") || has("float");
    if has("string") && number {
        parts.push(
            "Weir does not convert between strings and numbers by itself: `parse_int(s)` or \
             `parse_float(s)` turn a string into a number, `to_string(x)` (or `` `${x}` ``) a \
             number into a string",
        );
    } else if has("int") && has("float") {
        parts.push("convert with `to_float(i)` or `to_int(f)`");
    }
    if parts.is_empty() {
        parts.push(
            "the values do not have the types this needs; `type_of(x)` tells a value's type, \
             and `to_int`, `to_float`, `to_string`, `parse_int`, `parse_float` convert",
        );
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_scalar_keeps_its_indentation_and_a_quoted_one_only_its_first_line() {
        let block = ScriptOrigin {
            file: "p.yaml".into(),
            line: 10,
            column: 11,
            block: true,
        };
        assert_eq!(block.position(1, 1), (10, 11));
        assert_eq!(block.position(3, 20), (12, 30));
        let quoted = ScriptOrigin {
            block: false,
            ..block
        };
        assert_eq!(quoted.position(1, 5), (10, 15));
        assert_eq!(quoted.position(2, 5), (11, 5));
        assert_eq!(ScriptOrigin::file("s.rhai".into()).position(4, 2), (4, 2));
    }

    #[test]
    fn rhai_signatures_read_in_weir_types() {
        assert_eq!(
            weir_signature("- (i64, &str | ImmutableString | String)"),
            ("-".to_owned(), "int, string".to_owned())
        );
        assert_eq!(
            weir_signature("+ (i64, ())"),
            ("+".to_owned(), "int, ()".to_owned())
        );
        assert_eq!(
            weir_signature("foo (rhai::Map, f64)"),
            ("foo".to_owned(), "map, float".to_owned())
        );
        let help = conversion_help("int, string");
        assert!(help.contains("parse_int") && help.contains("to_string"), "{help}");
        assert!(conversion_help("int, ()").contains("missing value"));
    }
}
