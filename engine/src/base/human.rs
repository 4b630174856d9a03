//! Values as the log shows them to people: durations (`250ms`, `1.2s`, `2m5s`), byte sizes
//! (`85 B`, `3.4 MiB`), optional values (the value, or a word for its absence: never
//! `Some(54)`), and errors on one line with their cause chain. Each is a `Display` wrapper to
//! pass as a `tracing` field with `%`; nothing here formats for machines (the JSON log keeps
//! the same text).

use std::fmt;
use std::time::Duration;

/// A duration: `250ms` below a second, `1.2s` below a minute, `2m5s` beyond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed(pub Duration);

impl Elapsed {
    /// `ms` milliseconds.
    pub fn ms(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            write!(f, "{ms}ms")
        } else if ms < 60_000 {
            write!(f, "{:.1}s", self.0.as_secs_f64())
        } else {
            write!(f, "{}m{}s", ms / 60_000, (ms % 60_000) / 1000)
        }
    }
}

/// A size in bytes: `85 B`, then binary units with one decimal (`3.4 KiB`, `1.0 GiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

/// An optional value: the value's text, or `none` (`fresh`, `-`, ... with [`Maybe::or`]).
pub struct Maybe<T>(pub Option<T>, pub &'static str);

impl<T> Maybe<T> {
    /// `value`, shown as `absent` when it is `None`.
    pub fn or(value: Option<T>, absent: &'static str) -> Self {
        Self(value, absent)
    }
}

impl<T: fmt::Display> fmt::Display for Maybe<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str(self.1),
        }
    }
}

/// An error on one line: its message, then each `source()` whose text the message does not
/// already contain (`; cause: ...`), with the message's own line breaks (an error's `record:`
/// line) turned into `; `, so that one failure is one log line and a JSON excerpt in it stays
/// whole.
pub struct OneLine<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut seen = self.0.to_string();
        let mut text = flatten(&seen);
        let mut source = self.0.source();
        while let Some(s) = source {
            let more = s.to_string();
            if !seen.contains(&more) {
                text.push_str("; cause: ");
                text.push_str(&flatten(&more));
                seen.push_str(&more);
            }
            source = s.source();
        }
        f.write_str(&text)
    }
}

/// `text` with its lines trimmed and joined by `; ` (blank lines dropped).
pub fn flatten(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_read_as_people_write_them() {
        assert_eq!(Elapsed::ms(0).to_string(), "0ms");
        assert_eq!(Elapsed::ms(999).to_string(), "999ms");
        assert_eq!(Elapsed::ms(1_234).to_string(), "1.2s");
        assert_eq!(Elapsed::ms(125_000).to_string(), "2m5s");
        assert_eq!(Bytes(85).to_string(), "85 B");
        assert_eq!(Bytes(2048).to_string(), "2.0 KiB");
        assert_eq!(Bytes(3 * 1024 * 1024 + 400 * 1024).to_string(), "3.4 MiB");
        assert_eq!(Maybe::or(Some(54), "nothing").to_string(), "54");
        assert_eq!(Maybe::<u64>::or(None, "nothing").to_string(), "nothing");
    }

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_is_one_line_with_its_causes_once() {
        let e = E(
            "operator `boom`: bad value\n  record: {\"v\": \"a b\"}",
            Some(Box::new(E(
                "bad value",
                Some(Box::new(E("disk full", None))),
            ))),
        );
        assert_eq!(
            OneLine(&e).to_string(),
            "operator `boom`: bad value; record: {\"v\": \"a b\"}; cause: disk full"
        );
    }
}
