//! `${VAR}` interpolation in pipeline files, and the secrets it brings in.
//!
//! Expansion runs on the loaded tree, scalar by scalar, after the YAML parsed and before the
//! schema check: the text of the file never changes, so every diagnostic (an undefined
//! variable included) points at the exact bytes of the file. The forms:
//!
//! - `${VAR}`: the variable's value; an error when it is not set.
//! - `${VAR:-default}`: the value, or `default` when the variable is unset or empty.
//! - `${VAR:?message}`: the value; an error saying `message` when it is unset or empty.
//! - `${secret:VAR}` (with the same `:-` and `:?` forms): as above, and the scalar becomes a
//!   secret: its value is redacted (`***`) wherever Weir would print it ([`Secrets`]).
//! - `$$`: a literal `$`. Any other `$` stays as written.
//!
//! Only values are expanded, never mapping keys, and never a `script:` (Rhai code has its own
//! `${...}` in template strings). A plain scalar whose text changed is resolved again as YAML
//! would resolve it, so `port: ${PORT}` is a number; a quoted one stays a string.

use std::ops::Range;
use std::sync::Arc;

use crate::diagnostic::{Diagnostic, Diagnostics, codes};
use crate::span::{Node, NodeValue, SourceFile};

/// Looks up an environment variable by name.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, as [`Env`]: a variable whose value is not UTF-8 counts as unset.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The mapping key whose values are never expanded: Rhai code.
const SCRIPT_KEY: &str = "script";

/// One scalar after expansion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expanded {
    /// The text with every reference replaced.
    pub text: String,
    /// Whether the text differs from the input (a reference or `$$` was found).
    pub changed: bool,
    /// Values of the `${secret:...}` references (empty when none).
    pub secrets: Vec<String>,
}

/// A reference that could not be expanded, located in the scanned text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// [`codes::ENV_UNDEFINED`] or [`codes::ENV_SYNTAX`].
    pub code: &'static str,
    /// Byte range of the reference (`${` to `}`) in the scanned text.
    pub range: Range<usize>,
    /// What is wrong.
    pub message: String,
    /// The label under the reference.
    pub label: String,
    /// What to do about it.
    pub help: String,
}

/// Expands every reference in `text`, collecting every problem.
pub fn expand(text: &str, env: Env<'_>) -> Result<Expanded, Vec<Problem>> {
    let mut out = Expanded {
        text: String::with_capacity(text.len()),
        ..Expanded::default()
    };
    let mut problems = Vec::new();
    let mut rest = 0;
    for token in tokens(text) {
        out.text.push_str(&text[rest..token.range.start]);
        rest = token.range.end;
        out.changed = true;
        match token.kind {
            TokenKind::Dollar => out.text.push('$'),
            TokenKind::Unclosed => problems.push(Problem {
                code: codes::ENV_SYNTAX,
                range: token.range,
                message: "`${` is not closed".to_owned(),
                label: "no `}` after this".to_owned(),
                help: "write `${NAME}`, or `$${` for a literal `${`".to_owned(),
            }),
            TokenKind::Reference(body) => match reference(text, &token.range, body, env) {
                Ok((value, secret)) => {
                    if secret && !value.is_empty() {
                        out.secrets.push(value.clone());
                    }
                    out.text.push_str(&value);
                }
                Err(p) => problems.push(p),
            },
        }
    }
    out.text.push_str(&text[rest..]);
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The value of one `${body}` and whether it is secret.
fn reference(
    text: &str,
    range: &Range<usize>,
    body: Range<usize>,
    env: Env<'_>,
) -> Result<(String, bool), Problem> {
    let written = &text[range.clone()];
    let body = &text[body];
    let (secret, body) = match body.strip_prefix("secret:") {
        Some(b) => (true, b),
        None => (false, body),
    };
    let name_len = body
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(body.len());
    let (name, op) = body.split_at(name_len);
    let syntax = |message: String| Problem {
        code: codes::ENV_SYNTAX,
        range: range.clone(),
        message,
        label: "not a variable reference".to_owned(),
        help: "write `${NAME}`, `${NAME:-default}`, `${NAME:?message}` or `${secret:NAME}`; \
               `$$` is a literal `$`"
            .to_owned(),
    };
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(syntax(format!(
            "`{written}`: a variable name is letters, digits and `_`, not starting with a digit"
        )));
    }
    let value = env(name);
    let set = value.as_deref().filter(|v| !v.is_empty());
    let undefined = |message: String, help: String| Problem {
        code: codes::ENV_UNDEFINED,
        range: range.clone(),
        message,
        label: format!("`{name}` is not set"),
        help,
    };
    let value = if op.is_empty() {
        value.ok_or_else(|| {
            undefined(
                format!("environment variable `{name}` is not set"),
                format!(
                    "set `{name}` in the environment Weir runs in, or give a default: \
                     `${{{name}:-default}}`"
                ),
            )
        })?
    } else if let Some(default) = op.strip_prefix(":-") {
        set.unwrap_or(default).to_owned()
    } else if let Some(message) = op.strip_prefix(":?") {
        let message = if message.is_empty() {
            format!("environment variable `{name}` is not set or empty")
        } else {
            format!("environment variable `{name}` is not set or empty: {message}")
        };
        set.map(str::to_owned).ok_or_else(|| {
            undefined(
                message,
                format!("set `{name}` in the environment Weir runs in"),
            )
        })?
    } else {
        return Err(syntax(format!(
            "`{written}`: after the name comes `}}`, `:-default` or `:?message`"
        )));
    };
    Ok((value, secret))
}

/// Something special in a scalar's text.
struct Token {
    range: Range<usize>,
    kind: TokenKind,
}

enum TokenKind {
    /// `$$`.
    Dollar,
    /// `${...}`, with the range of what is between the braces.
    Reference(Range<usize>),
    /// `${` without a `}`: the rest of the text.
    Unclosed,
}

/// The `$$`, `${...}` and unclosed `${` of a text, in order.
fn tokens(text: &str) -> Vec<Token> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find('$').map(|d| i + d) {
        match bytes.get(at + 1) {
            Some(b'$') => {
                found.push(Token {
                    range: at..at + 2,
                    kind: TokenKind::Dollar,
                });
                i = at + 2;
            }
            Some(b'{') => match text[at + 2..].find('}') {
                Some(len) => {
                    let end = at + 2 + len;
                    found.push(Token {
                        range: at..end + 1,
                        kind: TokenKind::Reference(at + 2..end),
                    });
                    i = end + 1;
                }
                None => {
                    found.push(Token {
                        range: at..text.len(),
                        kind: TokenKind::Unclosed,
                    });
                    break;
                }
            },
            _ => i = at + 1,
        }
    }
    found
}

/// Expands every string scalar of a loaded tree in place (except under `script:`), reporting
/// every problem at the reference in the file, and returns the secrets it brought in.
pub(crate) fn expand_tree(
    root: &mut Node,
    source: &Arc<SourceFile>,
    env: Env<'_>,
    diagnostics: &mut Diagnostics,
) -> Secrets {
    let mut secrets = Secrets::default();
    let mut pending = vec![root];
    while let Some(node) = pending.pop() {
        if let NodeValue::Scalar(serde_json::Value::String(s)) = &node.value {
            if s.contains('$')
                && let Some(value) =
                    expand_scalar(s, &node.span, source, env, diagnostics, &mut secrets)
            {
                node.value = NodeValue::Scalar(value);
            }
            continue;
        }
        match &mut node.value {
            NodeValue::Map(entries) => pending.extend(
                entries
                    .iter_mut()
                    .filter(|(k, _, _)| k != SCRIPT_KEY)
                    .map(|(_, _, v)| v),
            ),
            NodeValue::Seq(items) => pending.extend(items.iter_mut()),
            NodeValue::Scalar(_) => {}
        }
    }
    secrets
}

/// The new value of one string scalar, when expansion changed it; problems go to
/// `diagnostics`, secrets to `secrets`.
fn expand_scalar(
    s: &str,
    span: &Range<usize>,
    source: &Arc<SourceFile>,
    env: Env<'_>,
    diagnostics: &mut Diagnostics,
    secrets: &mut Secrets,
) -> Option<serde_json::Value> {
    let raw = source.text.get(span.clone()).unwrap_or("");
    match expand(s, env) {
        Ok(e) if e.changed => {
            if !e.secrets.is_empty() {
                secrets.add(&e.text);
                for v in &e.secrets {
                    secrets.add(v);
                }
            }
            let plain = raw == s && !raw.starts_with(['"', '\'']);
            Some(if plain {
                crate::yaml::resolve_plain(&e.text)
            } else {
                serde_json::Value::String(e.text)
            })
        }
        Ok(_) => None,
        Err(problems) => {
            for p in problems {
                let at = locate(raw, span.clone(), s, &p.range);
                diagnostics.push(
                    Diagnostic::error(p.code, p.message)
                        .at(source, at)
                        .label(p.label)
                        .help(p.help),
                );
            }
            None
        }
    }
}

/// Where in the file a reference found in a scalar's value is: the same reference (by order)
/// in the scalar's text as written, or the whole scalar when the two differ (escapes in a
/// quoted scalar, an alias).
fn locate(raw: &str, span: Range<usize>, value: &str, in_value: &Range<usize>) -> Range<usize> {
    let refs = |t: &str| -> Vec<Range<usize>> {
        tokens(t)
            .into_iter()
            .filter(|t| !matches!(t.kind, TokenKind::Dollar))
            .map(|t| t.range)
            .collect()
    };
    let written = refs(raw);
    let parsed = refs(value);
    match parsed.iter().position(|r| r == in_value) {
        Some(k) if written.len() == parsed.len() => {
            let r = &written[k];
            span.start + r.start..span.start + r.end
        }
        _ => span,
    }
}

/// Values that came from `${secret:...}` references: the whole scalars they are part of and
/// the variables' values. [`Secrets::redact`] replaces each with `***` in any text Weir is
/// about to show (diagnostics, plans, status answers, logs, metadata).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Secrets(Vec<String>);

impl Secrets {
    /// The text shown instead of a secret.
    pub const MASK: &'static str = "***";

    /// Adds a value to hide (an empty one hides nothing and is ignored).
    pub fn add(&mut self, value: &str) {
        if value.is_empty() || self.0.iter().any(|s| s == value) {
            return;
        }
        self.0.push(value.to_owned());
        // Longest first, so that a scalar is hidden whole before a part of it is.
        self.0.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    /// Adds every secret of `other`.
    pub fn extend(&mut self, other: &Secrets) {
        for s in &other.0 {
            self.add(s);
        }
    }

    /// Whether there is nothing to hide.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every secret replaced by [`Secrets::MASK`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.0 {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), Self::MASK);
            }
        }
        out
    }

    /// Redacts the message, label, help and related labels of every diagnostic.
    pub fn redact_diagnostics(&self, diagnostics: &mut Diagnostics) {
        if self.is_empty() {
            return;
        }
        for d in &mut diagnostics.0 {
            d.message = self.redact(&d.message);
            d.label = self.redact(&d.label);
            d.help = d.help.as_deref().map(|h| self.redact(h));
            for (_, label) in &mut d.related {
                *label = self.redact(label);
            }
        }
    }
}

/// Every secret of every file this process loaded from its environment ([`remember`]).
static REMEMBERED: std::sync::RwLock<Secrets> = std::sync::RwLock::new(Secrets(Vec::new()));

/// Adds secrets to the process-wide set that [`redact`] hides: the loader does it for every
/// file it expands from the process environment, so that output not tied to one file (the
/// log, control API answers) can be redacted too.
pub fn remember(secrets: &Secrets) {
    if secrets.is_empty() {
        return;
    }
    let mut all = REMEMBERED
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.extend(secrets);
}

/// `text` with every secret this process has loaded ([`remember`]) replaced by `***`.
pub fn redact(text: &str) -> String {
    let all = REMEMBERED
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.redact(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("kafka:9092".to_owned()),
            "PORT" => Some("9092".to_owned()),
            "EMPTY" => Some(String::new()),
            "PW" => Some("hunter2".to_owned()),
            _ => None,
        }
    }

    fn ok(text: &str) -> Expanded {
        expand(text, &env).unwrap_or_else(|p| panic!("{text}: {p:#?}"))
    }

    fn problems(text: &str) -> Vec<Problem> {
        expand(text, &env).expect_err(text)
    }

    #[test]
    fn every_form_expands() {
        assert_eq!(ok("${HOST}").text, "kafka:9092");
        assert_eq!(ok("tcp://${HOST}/x").text, "tcp://kafka:9092/x");
        assert_eq!(ok("${HOST}${PORT}").text, "kafka:90929092");
        assert_eq!(ok("${MISSING:-local}").text, "local");
        assert_eq!(ok("${EMPTY:-local}").text, "local");
        assert_eq!(ok("${PORT:-1}").text, "9092");
        assert_eq!(ok("${MISSING:-}").text, "");
        assert_eq!(ok("${EMPTY}").text, "", "set but empty is defined");
        assert_eq!(ok("${PORT:?need a port}").text, "9092");
        assert_eq!(ok("a ${HOST:-x y} b").text, "a kafka:9092 b");
        assert!(ok("${HOST}").secrets.is_empty());
    }

    #[test]
    fn dollars_escape_and_stray_dollars_stay() {
        assert_eq!(ok("$$").text, "$");
        assert_eq!(ok("$${HOST}").text, "${HOST}");
        assert_eq!(ok("$$$${HOST}").text, "$${HOST}");
        assert_eq!(ok("$$${HOST}").text, "$kafka:9092");
        let e = ok("cost: 5$ or $HOST or $");
        assert_eq!(e.text, "cost: 5$ or $HOST or $");
        assert!(!e.changed);
        assert!(ok("$$").changed);
        assert!(!ok("no references").changed);
    }

    #[test]
    fn secrets_are_marked() {
        let e = ok("user:${secret:PW}@${HOST}");
        assert_eq!(e.text, "user:hunter2@kafka:9092");
        assert_eq!(e.secrets, vec!["hunter2".to_owned()]);
        assert_eq!(
            ok("${secret:MISSING:-dflt}").secrets,
            vec!["dflt".to_owned()]
        );
        assert_eq!(ok("${secret:PW:?set it}").text, "hunter2");
        // An empty secret hides nothing.
        assert!(ok("${secret:EMPTY}").secrets.is_empty());
    }

    #[test]
    fn undefined_variables_are_problems_at_the_reference() {
        let p = problems("a ${MISSING} b");
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].code, codes::ENV_UNDEFINED);
        assert_eq!(p[0].range, 2..12);
        assert!(p[0].help.contains("`MISSING`"), "{}", p[0].help);
        assert!(p[0].help.contains("${MISSING:-default}"), "{}", p[0].help);

        let p = problems("${EMPTY:?the broker list} ${MISSING:?}");
        assert_eq!(p.len(), 2, "every problem is collected");
        assert_eq!(p[0].range, 0..25);
        assert!(
            p[0].message.ends_with(": the broker list"),
            "{}",
            p[0].message
        );
        assert_eq!(p[1].code, codes::ENV_UNDEFINED);
        assert_eq!(p[1].range, 26..38);

        let p = problems("${secret:MISSING}");
        assert_eq!(p[0].code, codes::ENV_UNDEFINED);
        assert!(p[0].message.contains("`MISSING`"), "{}", p[0].message);
    }

    #[test]
    fn malformed_references_are_syntax_problems() {
        for (text, range) in [
            ("x ${", 2..4),
            ("${HOST", 0..6),
            ("${}", 0..3),
            ("${1A}", 0..5),
            ("${A-B}", 0..6),
            ("${A:x}", 0..6),
            ("${secret:}", 0..10),
            ("${ HOST }", 0..9),
        ] {
            let p = problems(text);
            assert_eq!(p.len(), 1, "{text}: {p:#?}");
            assert_eq!(p[0].code, codes::ENV_SYNTAX, "{text}");
            assert_eq!(p[0].range, range, "{text}");
            assert!(!p[0].help.is_empty());
        }
    }

    #[test]
    fn redaction_hides_the_longest_match_first() {
        let mut s = Secrets::default();
        s.add("pw");
        s.add("user:pw@host");
        s.add("");
        assert_eq!(s.redact("url user:pw@host and pw"), "url *** and ***");
        assert_eq!(s.redact("nothing"), "nothing");
        assert!(Secrets::default().is_empty());
    }

    fn load(text: &str) -> (Node, Diagnostics, Secrets) {
        let source = Arc::new(SourceFile::new("t.yaml", text));
        let mut diagnostics = Diagnostics::new();
        let crate::yaml::Document::One(mut root) = crate::yaml::read(&source, &mut diagnostics)
        else {
            panic!("parses")
        };
        let secrets = expand_tree(&mut root, &source, &env, &mut diagnostics);
        (root, diagnostics, secrets)
    }

    #[test]
    fn a_tree_expands_values_only_and_types_plain_scalars() {
        let text = "\
a: ${PORT}
b: \"${PORT}\"
c: '${PORT}'
${HOST}: key
script: |
  `x ${y}`
d: [\"${HOST}\", \"$$\"]
e: ${MISSING:-true}
";
        let (root, diagnostics, secrets) = load(text);
        assert!(diagnostics.0.is_empty(), "{diagnostics:#?}");
        assert!(secrets.is_empty());
        let json = root.to_json();
        assert_eq!(json["a"], serde_json::json!(9092));
        assert_eq!(json["b"], serde_json::json!("9092"));
        assert_eq!(json["c"], serde_json::json!("9092"));
        assert_eq!(json["${HOST}"], serde_json::json!("key"));
        assert_eq!(json["script"], serde_json::json!("`x ${y}`\n"));
        assert_eq!(json["d"], serde_json::json!(["kafka:9092", "$"]));
        assert_eq!(json["e"], serde_json::json!(true));
    }

    #[test]
    fn tree_problems_point_at_the_reference_in_the_file() {
        let text = "a: x ${MISSING} y\nb: \"q ${1A}\"\nc: |\n  line\n  ${NOPE}\n";
        let (_, diagnostics, _) = load(text);
        let found: Vec<(&str, &str)> = diagnostics
            .0
            .iter()
            .map(|d| (d.code, &text[d.span.clone().expect("located")]))
            .collect();
        assert_eq!(found.len(), 3, "{diagnostics:#?}");
        assert!(found.contains(&(codes::ENV_UNDEFINED, "${MISSING}")));
        assert!(found.contains(&(codes::ENV_SYNTAX, "${1A}")));
        assert!(found.contains(&(codes::ENV_UNDEFINED, "${NOPE}")));
    }

    #[test]
    fn secret_scalars_are_collected_whole() {
        let (root, diagnostics, secrets) = load("url: \"u:${secret:PW}@h\"\n");
        assert!(diagnostics.0.is_empty());
        assert_eq!(root.to_json()["url"], serde_json::json!("u:hunter2@h"));
        assert_eq!(secrets.redact("at u:hunter2@h, hunter2"), "at ***, ***");
    }
}
