//! Human-friendly durations (`500ms`, `1s`, `10m`) and sizes (`64MiB`) for the YAML model.
//!
//! Parsing is delegated to `humantime` and `bytesize`; this module only adapts them to serde and
//! schemars. It owns no validation beyond "does it parse": range rules live in `validate`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A duration written as text with a unit, such as `500ms`, `1s`, `1m 30s` or `10m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurationSpec(pub Duration);

impl DurationSpec {
    /// Builds a duration of whole milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// Builds a duration of whole seconds.
    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }

    /// The wrapped [`Duration`].
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Display for DurationSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl FromStr for DurationSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s.trim()).map(Self).map_err(|e| {
            format!("`{s}` is not a duration ({e}); write a number with a unit, such as `500ms`, `1s` or `10m`")
        })
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

impl JsonSchema for DurationSpec {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A duration: a number followed by a unit (ns, us, ms, s, m, h, d), for example `500ms`, `1s`, `1m 30s`, `10m`.",
            "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*[a-zA-Zµ]+(\\s*[0-9]+(\\.[0-9]+)?\\s*[a-zA-Zµ]+)*\\s*$",
            "examples": ["500ms", "1s", "10m"]
        })
    }
}

/// A size in bytes written with a unit, such as `64MiB`, `512KiB` or `1GB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SizeSpec(pub u64);

impl SizeSpec {
    /// Builds a size of `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n * 1024 * 1024)
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for SizeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", bytesize::ByteSize(self.0).display().iec())
    }
}

impl FromStr for SizeSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim()
            .parse::<bytesize::ByteSize>()
            .map(|b| Self(b.as_u64()))
            .map_err(|e| {
                format!("`{s}` is not a size ({e}); write a number with a unit, such as `64MiB`, `512KiB` or `1GB`")
            })
    }
}

impl Serialize for SizeSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SizeSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

impl JsonSchema for SizeSpec {
    fn schema_name() -> Cow<'static, str> {
        "Size".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A size in bytes with a unit: B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), for example `64MiB`.",
            "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*[a-zA-Z]*\\s*$",
            "examples": ["64MiB", "512KiB", "1GB"]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            "500ms".parse::<DurationSpec>().ok(),
            Some(DurationSpec::from_millis(500))
        );
        assert_eq!(
            "1s".parse::<DurationSpec>().ok(),
            Some(DurationSpec::from_secs(1))
        );
        assert_eq!(
            "10m".parse::<DurationSpec>().ok(),
            Some(DurationSpec::from_secs(600))
        );
        assert!("10".parse::<DurationSpec>().is_err());
        assert!("ten seconds".parse::<DurationSpec>().is_err());
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!("64MiB".parse::<SizeSpec>().ok(), Some(SizeSpec::mib(64)));
        assert_eq!("1KB".parse::<SizeSpec>().ok(), Some(SizeSpec(1000)));
        assert!("lots".parse::<SizeSpec>().is_err());
    }
}
