//! JSON text to records, on the per-record path: a direct parser for the lines every source
//! reads ([`parse`]), a shortcut past serde's visitor machinery. The sink writes with serde_json
//! (`super::write_json`).
//!
//! It must give exactly what serde_json gives: the same record as `serde_json` driving
//! [`RecordSeed`](super::RecordSeed), or it declines (`None`) and leaves the text to that path,
//! which then makes the value or the error message. It declines on anything invalid and on what
//! it does not decide itself, handing that one token to serde_json instead: numbers other than
//! plain integers of at most 18 digits (floats, exponents, `-0`, big integers) and strings with
//! escapes. Nothing here does I/O.

use rhai::{Dynamic, ImmutableString, Map};

/// Nesting deeper than this is left to serde_json (whose own limit is 128 levels).
const MAX_DEPTH: u32 = 100;

/// Parses a JSON text into a record, or `None` when the text is not valid JSON or needs what
/// only the serde path decides (see the module docs); the caller then parses it with serde.
pub(super) fn parse(line: &[u8]) -> Option<Dynamic> {
    // One validation of the whole text; non-ASCII bytes are then only ever inside strings
    // (anywhere else they are a syntax error, which declines).
    let text = std::str::from_utf8(line).ok()?;
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
        depth: 0,
    };
    let value = p.value()?;
    p.skip_ws();
    (p.at == p.bytes.len()).then_some(value)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    depth: u32,
}

/// A string token: borrowed from the text when it has no escapes.
enum Text<'a> {
    Borrowed(&'a str),
    Owned(String),
}

impl Text<'_> {
    fn as_str(&self) -> &str {
        match self {
            Self::Borrowed(s) => s,
            Self::Owned(s) => s,
        }
    }
}

/// Bytes that end the plain run of a string: the closing quote, a backslash, and the control
/// characters JSON forbids unescaped.
static STRING_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// Skips JSON whitespace (space, tab, newline, carriage return: serde_json's set).
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn value(&mut self) -> Option<Dynamic> {
        self.skip_ws();
        match self.peek()? {
            b'{' => self.object(),
            b'[' => self.array(),
            b'"' => {
                let s = self.string()?;
                Some(Dynamic::from(match s {
                    Text::Borrowed(s) => ImmutableString::from(s),
                    Text::Owned(s) => ImmutableString::from(s),
                }))
            }
            b't' => self.literal(b"true", Dynamic::from_bool(true)),
            b'f' => self.literal(b"false", Dynamic::from_bool(false)),
            b'n' => self.literal(b"null", Dynamic::UNIT),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8], value: Dynamic) -> Option<Dynamic> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| {
            self.at = end;
            value
        })
    }

    /// A number: a plain integer of at most 18 digits here (it fits an `i64` exactly);
    /// anything else is handed to serde_json as one token.
    fn number(&mut self) -> Option<Dynamic> {
        let start = self.at;
        let negative = self.bytes[start] == b'-';
        let first = start + usize::from(negative);
        let mut end = first;
        let mut n = 0_i64;
        while let Some(&d @ b'0'..=b'9') = self.bytes.get(end) {
            if end - first < 18 {
                n = n * 10 + i64::from(d - b'0');
            }
            end += 1;
        }
        let digits = end - first;
        let plain = (1..=18).contains(&digits)
            && (self.bytes[first] != b'0' || (digits == 1 && !negative))
            && !matches!(
                self.bytes.get(end),
                Some(b'.' | b'e' | b'E' | b'+' | b'-')
            );
        if plain {
            self.at = end;
            return Some(Dynamic::from_int(if negative { -n } else { n }));
        }
        // Floats, exponents, `-0` (a float in serde_json), longer integers and invalid numbers:
        // serde_json decides, on this token alone (a number parses the same out of context;
        // characters it would not take make it fail, and the whole text then declines).
        while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.bytes.get(end) {
            end += 1;
        }
        self.at = end;
        super::parse_with_serde(&self.bytes[start..end]).ok()
    }

    /// A string token, the opening quote under the cursor.
    fn string(&mut self) -> Option<Text<'a>> {
        let start = self.at + 1;
        let run = self
            .bytes
            .get(start..)?
            .iter()
            .position(|&b| STRING_STOP[usize::from(b)])?;
        let end = start + run;
        match self.bytes[end] {
            b'"' => {
                self.at = end + 1;
                Some(Text::Borrowed(self.text.get(start..end)?))
            }
            b'\\' => self.escaped_string(),
            // An unescaped control character.
            _ => None,
        }
    }

    /// A string with escapes: find its end, then let serde_json unescape it (escapes, surrogate
    /// pairs and their errors exactly as it reads them).
    fn escaped_string(&mut self) -> Option<Text<'a>> {
        let start = self.at;
        let mut i = start + 1;
        loop {
            match *self.bytes.get(i)? {
                b'"' => break,
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
        self.at = i + 1;
        let token = self.text.get(start..=i)?;
        serde_json::from_str::<String>(token).ok().map(Text::Owned)
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    fn object(&mut self) -> Option<Dynamic> {
        self.enter()?;
        self.at += 1;
        let mut map = Map::new();
        self.skip_ws();
        if self.peek()? == b'}' {
            self.at += 1;
        } else {
            loop {
                self.skip_ws();
                if self.peek()? != b'"' {
                    return None;
                }
                let name = self.string()?;
                self.skip_ws();
                if self.peek()? != b':' {
                    return None;
                }
                self.at += 1;
                let value = self.value()?;
                // A repeated name: the last value wins, as in serde's map visitor.
                map.insert(name.as_str().into(), value);
                self.skip_ws();
                match self.peek()? {
                    b',' => self.at += 1,
                    b'}' => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(Dynamic::from_map(map))
    }

    fn array(&mut self) -> Option<Dynamic> {
        self.enter()?;
        self.at += 1;
        let mut items = rhai::Array::new();
        self.skip_ws();
        if self.peek()? == b']' {
            self.at += 1;
        } else {
            loop {
                items.push(self.value()?);
                self.skip_ws();
                match self.peek()? {
                    b',' => self.at += 1,
                    b']' => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(Dynamic::from_array(items))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

    use super::*;
    use crate::record::parse_with_serde;

    /// Whether two records are the same value: same kinds, same text, floats bit for bit.
    fn same(a: &Dynamic, b: &Dynamic) -> bool {
        if a.type_name() != b.type_name() {
            return false;
        }
        if let (Ok(x), Ok(y)) = (a.as_float(), b.as_float()) {
            return x.to_bits() == y.to_bits();
        }
        if let (Ok(x), Ok(y)) = (a.as_map_ref(), b.as_map_ref()) {
            return x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|((kx, vx), (ky, vy))| kx == ky && same(vx, vy));
        }
        if let (Ok(x), Ok(y)) = (a.as_array_ref(), b.as_array_ref()) {
            return x.len() == y.len() && x.iter().zip(y.iter()).all(|(vx, vy)| same(vx, vy));
        }
        a.to_string() == b.to_string()
    }

    /// The direct parser either declines or agrees with serde, and declines whatever serde
    /// refuses.
    fn agrees(text: &[u8]) -> std::result::Result<Option<Dynamic>, String> {
        let ours = parse(text);
        match (&ours, parse_with_serde(text)) {
            (Some(v), Ok(s)) if !same(v, &s) => {
                return Err(format!("{v:?} != serde's {s:?}"));
            }
            (Some(v), Err(e)) => return Err(format!("took {v:?}, serde refused: {e}")),
            _ => {}
        }
        Ok(ours)
    }

    #[test]
    fn common_lines_take_the_direct_path_and_agree_with_serde() {
        for text in [
            r#"{"user":"u1","amount":3,"ts":1700000000000}"#,
            r#" { "a" : [ 1 , -2 , true , false , null , { } , [ ] ] , "b" : "" } "#,
            "{\"é\":\"ü😀\",\"t\":\"x\"}",
            r#"{"b":1,"a":2,"b":3}"#,
            r#"{"esc":"q\"b\\s\/n\nr\rt\tu\u00e9\ud83d\ude00","k\u0041":1}"#,
            r#"{"f":1.5,"e":1e3,"E":-2.5E-3,"z":-0,"zero":0,"neg":-7}"#,
            r#"{"big":18446744073709551615,"bigger":123456789012345678901234567890,"min":-9223372036854775808,"max":9223372036854775807}"#,
            r#"{"d18":999999999999999999,"d19":1000000000000000000,"n18":-999999999999999999}"#,
            r#"{"tiny":5e-324,"huge":1.7976931348623157e308}"#,
            "[1,\"two\",3.0,null]",
            "\"just a string\"",
            "42",
            "{\"a\":1}\r\n",
        ] {
            let v = agrees(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(v.is_some(), "{text}: declined");
        }
    }

    #[test]
    fn invalid_text_is_left_to_serde_and_fails_there() {
        for text in [
            "",
            "   ",
            "{",
            r#"{"a":1"#,
            r#"{"a":1,}"#,
            "[1,]",
            "[1 2]",
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            r#"{"a":01}"#,
            r#"{"a":-}"#,
            r#"{"a":1.}"#,
            r#"{"a":1.5.5}"#,
            r#"{"a":1e400}"#,
            r#"{"a":+1}"#,
            r#"{"a":1x}"#,
            r#"{"a":tru}"#,
            r#"{"a":nul}"#,
            r#"{"a":1} x"#,
            "{\"a\":\"ctl\u{1}\"}",
            r#"{"a":"bad \x escape"}"#,
            r#"{"a":"lone \ud800 surrogate"}"#,
            r#"{"a":"unterminated}"#,
            "\u{feff}{\"a\":1}",
            "{\"a\":1}\u{c}",
        ] {
            assert!(parse(text.as_bytes()).is_none(), "{text:?}: taken");
            assert!(parse_with_serde(text.as_bytes()).is_err(), "{text:?}: serde took it");
        }
        assert!(parse(b"{\"a\":\"\xff\"}").is_none(), "invalid UTF-8");
        let deep = format!("{}{}", "[".repeat(120), "]".repeat(120));
        assert!(parse(deep.as_bytes()).is_none(), "deep nesting goes to serde");
        assert!(parse_with_serde(deep.as_bytes()).is_ok());
    }

    /// JSON text of any shape: every value kind, numbers of every form and size, strings with
    /// any characters (escaped as serde_json escapes, or every character as `\u` escapes),
    /// repeated names, random whitespace.
    fn json_text() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", "", "", " ", "\n", "\t", " \r\n "]);
        let string = prop_oneof![
            4 => any::<String>().prop_map(|s| serde_json::to_string(&s).expect("string")),
            1 => any::<String>().prop_map(|s| {
                let mut out = String::from("\"");
                for unit in s.encode_utf16() {
                    out.push_str(&format!("\\u{unit:04X}"));
                }
                out.push('"');
                out
            }),
            2 => prop::sample::select(vec!["\"a\"", "\"user\"", "\"\"", "\"é\"", "\"a\\\"b\""])
                .prop_map(str::to_owned),
        ];
        let number = "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?";
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            any::<i64>().prop_map(|i| i.to_string()),
            any::<u64>().prop_map(|i| i.to_string()),
            any::<f64>().prop_map(|x| serde_json::to_string(&x).expect("float")),
            number.prop_map(|n| n),
            string.clone(),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            let ws = ws.clone();
            let item = (ws.clone(), inner.clone(), ws.clone());
            let member = (string.clone(), ws.clone(), inner, ws.clone());
            prop_oneof![
                prop::collection::vec(item, 0..6).prop_map(|items| {
                    let parts: Vec<String> =
                        items.into_iter().map(|(a, v, b)| format!("{a}{v}{b}")).collect();
                    format!("[{}]", parts.join(","))
                }),
                prop::collection::vec(member, 0..6).prop_map(|members| {
                    let parts: Vec<String> = members
                        .into_iter()
                        .map(|(k, a, v, b)| format!("{a}{k}{b}:{a}{v}{b}"))
                        .collect();
                    format!("{{{}}}", parts.join(","))
                }),
            ]
        })
    }

    #[test]
    fn generated_text_parses_as_serde_parses() {
        let mut runner = TestRunner::new(Config {
            cases: 10_000,
            failure_persistence: None,
            rng_seed: RngSeed::Fixed(0x0029_0050),
            ..Config::default()
        });
        // Valid text, and the same text cut, with a byte dropped or one inserted.
        let case = (json_text(), any::<prop::sample::Index>(), 0..4_u8, any::<u8>());
        let taken = std::cell::Cell::new(0_u32);
        runner
            .run(&case, |(text, at, edit, byte)| {
                let mut bytes = text.into_bytes();
                let i = at.index(bytes.len() + 1);
                match edit {
                    1 => bytes.truncate(i),
                    2 if i < bytes.len() => {
                        bytes.remove(i);
                    }
                    3 => bytes.insert(i, byte),
                    _ => {}
                }
                let ours = agrees(&bytes).map_err(TestCaseError::fail)?;
                if edit == 0 && parse_with_serde(&bytes).is_ok() {
                    // Valid text of at most a few levels: the direct parser takes all of it.
                    prop_assert!(ours.is_some(), "declined valid text");
                    taken.set(taken.get() + 1);
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(taken.get() > 2000, "the direct parser took {} generated texts", taken.get());
    }
}
