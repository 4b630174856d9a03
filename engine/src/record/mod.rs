//! Records and keys: what flows between operators and what keyed state is partitioned by.
//!
//! A record is a [`rhai::Dynamic`] (usually an object map), parsed straight from JSON (a direct
//! parser in `json`, with serde behind it for what it leaves and for error messages) so that no
//! intermediate `serde_json::Value` is built and scripts receive it without conversion. A [`Key`]
//! is the value a `key_by` extracted plus its stable 64-bit hash, from which the key group
//! follows. State snapshots encode values with MessagePack ([`encode`]/[`decode`]);
//! [`event_time`] reads a record's event time. This module owns no
//! I/O and knows nothing of tasks or channels.

use std::hash::{BuildHasherDefault, Hash, Hasher};

use rhai::{Dynamic, ImmutableString, Map};

pub mod event_time;
mod json;

/// A record: a JSON-like value, normally an object map.
pub type Record = Dynamic;

/// Parses one JSON text (a jsonl line) straight into a record.
///
/// # Errors
/// The serde_json error when the text is not valid JSON.
pub fn parse_json(line: &[u8]) -> Result<Record, serde_json::Error> {
    match json::parse(line) {
        Some(value) => Ok(value),
        None => parse_with_serde(line),
    }
}

/// [`parse_json`] through serde: what the direct parser (`json::parse`) must agree with, and
/// what makes the value of whatever it leaves to serde, and every error message.
fn parse_with_serde(line: &[u8]) -> Result<Record, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_slice(line);
    let value = RecordSeed.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Deserializes a record exactly as `rhai::Dynamic`'s own `Deserialize` does for JSON input,
/// but builds each object map once: Rhai's visitor collects a `Map` and then converts it into
/// a `Dynamic` through `From<BTreeMap>`, which rebuilds the whole map (a second allocation
/// and a sort per object, the largest single cost of parsing a jsonl line).
struct RecordSeed;

impl<'de> serde::de::DeserializeSeed<'de> for RecordSeed {
    type Value = Dynamic;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Dynamic, D::Error> {
        d.deserialize_any(RecordVisitor)
    }
}

struct RecordVisitor;

impl<'de> serde::de::Visitor<'de> for RecordVisitor {
    type Value = Dynamic;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any type that can be converted into a Dynamic")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Dynamic, E> {
        Ok(Dynamic::from_bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Dynamic, E> {
        Ok(Dynamic::from_int(v))
    }
    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Dynamic, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Dynamic::from_int(i),
            Err(_) => Dynamic::from_float(v as f64),
        })
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Dynamic, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Dynamic::from_int(i),
            Err(_) => Dynamic::from_float(v as f64),
        })
    }
    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Dynamic, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Dynamic::from_int(i),
            Err(_) => Dynamic::from_float(v as f64),
        })
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Dynamic, E> {
        Ok(Dynamic::from_float(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Dynamic, E> {
        Ok(Dynamic::from(ImmutableString::from(v)))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Dynamic, E> {
        Ok(Dynamic::from(ImmutableString::from(v)))
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Dynamic, E> {
        Ok(Dynamic::from_blob(v.to_vec()))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Dynamic, E> {
        Ok(Dynamic::UNIT)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Dynamic, E> {
        Ok(Dynamic::UNIT)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Dynamic, D::Error> {
        d.deserialize_any(RecordVisitor)
    }
    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<Dynamic, D::Error> {
        d.deserialize_any(RecordVisitor)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Dynamic, A::Error> {
        let mut arr = rhai::Array::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(v) = seq.next_element_seed(RecordSeed)? {
            arr.push(v);
        }
        Ok(Dynamic::from_array(arr))
    }
    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Dynamic, M::Error> {
        let mut m = Map::new();
        while let Some(k) = map.next_key_seed(FieldNameSeed)? {
            let v = map.next_value_seed(RecordSeed)?;
            m.insert(k.as_str().into(), v);
        }
        Ok(Dynamic::from_map(m))
    }
}

/// An object key, borrowed from the line when it has no escapes.
enum FieldName<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl FieldName<'_> {
    fn as_str(&self) -> &str {
        match self {
            Self::Borrowed(s) => s,
            Self::Owned(s) => s,
        }
    }
}

struct FieldNameSeed;

impl<'de> serde::de::DeserializeSeed<'de> for FieldNameSeed {
    type Value = FieldName<'de>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for FieldNameSeed {
    type Value = FieldName<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(FieldName::Borrowed(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(FieldName::Owned(v.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(FieldName::Owned(v))
    }
}

/// Appends the JSON text of a record to `out` (no newline).
///
/// # Errors
/// When the record holds a value JSON cannot represent.
pub fn write_json(out: &mut Vec<u8>, record: &Record) -> Result<(), serde_json::Error> {
    serde_json::to_writer(out, record)
}

/// A short, single-line JSON excerpt of a record for error messages (at most ~200 bytes).
pub fn excerpt(record: &Record) -> String {
    let mut text = serde_json::to_string(record).unwrap_or_else(|_| record.to_string());
    if text.len() > 200 {
        let mut cut = 200;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// Encodes a value in the compact binary state format (MessagePack).
///
/// # Errors
/// When the value holds something that cannot be serialized (a function pointer, a custom type).
pub fn encode<T: serde::Serialize + ?Sized>(
    value: &T,
) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    rmp_serde::to_vec(value)
}

/// Decodes a value written by [`encode`].
///
/// # Errors
/// When the bytes are not a valid encoding of `T`.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, rmp_serde::decode::Error> {
    rmp_serde::from_slice(bytes)
}

/// A pre-split dotted field path such as `customer.id`, resolved against records.
#[derive(Clone, Debug)]
pub struct FieldPath {
    parts: Vec<String>,
    text: String,
}

impl FieldPath {
    /// Splits `customer.id` into its parts.
    pub fn new(text: &str) -> Self {
        Self {
            parts: text.split('.').map(str::to_owned).collect(),
            text: text.to_owned(),
        }
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Applies `f` to the value at the path, without cloning it; `None` when a part is missing
    /// or a non-map sits in the middle.
    pub fn with<R>(&self, record: &Record, f: impl FnOnce(&Dynamic) -> R) -> Option<R> {
        let (last, init) = self.parts.split_last()?;
        fn step<R>(
            v: &Dynamic,
            rest: &[String],
            last: &str,
            f: impl FnOnce(&Dynamic) -> R,
        ) -> Option<R> {
            let map = v.as_map_ref().ok()?;
            match rest.split_first() {
                None => map.get(last).map(f),
                Some((head, tail)) => step(map.get(head.as_str())?, tail, last, f),
            }
        }
        step(record, init, last, f)
    }

    /// A copy of the value at the path.
    pub fn get(&self, record: &Record) -> Option<Dynamic> {
        self.with(record, Dynamic::clone)
    }
}

/// The value of a key, as extracted by `key_by`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue {
    /// A string key (the common case; cloning shares the text).
    Str(ImmutableString),
    /// An integer key.
    Int(i64),
    /// A boolean key.
    Bool(bool),
    /// A missing field or unit: all such records share one key.
    Unit,
    /// Any other value, keyed by its JSON text.
    Other(ImmutableString),
}

/// A key with its stable hash. Equal keys have equal hashes on every run and machine, so the
/// key group of a key never changes (state restored elsewhere finds its key group).
#[derive(Clone, Debug)]
pub struct Key {
    value: KeyValue,
    hash: u64,
    /// A string key of at most 15 bytes packed inline (bytes, then `len + 1` in the last
    /// byte), or [`NOT_SMALL`]. Lets hash-table probes compare keys without dereferencing the
    /// shared string, which for a table of many keys is a cache miss per lookup. Two words
    /// rather than a `u128`, whose 16-byte alignment would pad every key to 48 bytes.
    small: [u64; 2],
}

/// [`Key::small`] of a key that is not a short string.
const NOT_SMALL: [u64; 2] = [0, 0];

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        if self.hash != other.hash {
            return false;
        }
        match (self.small == NOT_SMALL, other.small == NOT_SMALL) {
            (true, true) => self.value == other.value,
            // A short string against a long string or a non-string.
            (true, false) | (false, true) => false,
            // Both short strings: the packed bytes decide.
            (false, false) => self.small == other.small,
        }
    }
}

/// Packs a string of at most 15 bytes into two words, not both zero (see [`Key::small`]).
fn pack_small(bytes: &[u8]) -> [u64; 2] {
    if bytes.len() > 15 {
        return NOT_SMALL;
    }
    let mut buf = [0u8; 16];
    buf[..bytes.len()].copy_from_slice(bytes);
    buf[15] = bytes.len() as u8 + 1;
    let v = u128::from_le_bytes(buf);
    [v as u64, (v >> 64) as u64]
}
impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// FNV-1a over bytes with a type tag, then the murmur3 64-bit finaliser: stable and cheap.
fn stable_hash(tag: u8, bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(tag);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    fmix64(h)
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

impl Key {
    /// Builds a key from a value (a field's value or a `key` script's result).
    pub fn from_dynamic(v: &Dynamic) -> Self {
        if let Ok(s) = v.as_immutable_string_ref() {
            return Self::from_str_value(s.clone());
        }
        if let Ok(i) = v.as_int() {
            return Self {
                hash: stable_hash(2, &i.to_le_bytes()),
                value: KeyValue::Int(i),
                small: NOT_SMALL,
            };
        }
        if let Ok(b) = v.as_bool() {
            return Self {
                hash: stable_hash(3, &[u8::from(b)]),
                value: KeyValue::Bool(b),
                small: NOT_SMALL,
            };
        }
        if v.is_unit() {
            return Self {
                hash: stable_hash(4, &[]),
                value: KeyValue::Unit,
                small: NOT_SMALL,
            };
        }
        let text: ImmutableString = serde_json::to_string(v)
            .unwrap_or_else(|_| v.to_string())
            .into();
        Self {
            hash: stable_hash(5, text.as_bytes()),
            value: KeyValue::Other(text),
            small: NOT_SMALL,
        }
    }

    /// A string key.
    pub fn from_str_value(s: ImmutableString) -> Self {
        // One dereference of the shared string (it is not inlined) for both.
        let bytes = s.as_bytes();
        let (hash, small) = (stable_hash(1, bytes), pack_small(bytes));
        Self {
            hash,
            small,
            value: KeyValue::Str(s),
        }
    }

    /// The key's value.
    pub fn value(&self) -> &KeyValue {
        &self.value
    }

    /// The stable hash.
    pub fn hash_code(&self) -> u64 {
        self.hash
    }

    /// The key group in `[0, max_parallelism)`: the hash modulo `max_parallelism`, by a mask
    /// when that is a power of two (the default, 128; a 64-bit division costs tens of cycles,
    /// and state backends ask several times per record).
    #[inline]
    pub fn key_group(&self, max_parallelism: u32) -> u32 {
        let m = max_parallelism.max(1);
        if m.is_power_of_two() {
            (self.hash & u64::from(m - 1)) as u32
        } else {
            (self.hash % u64::from(m)) as u32
        }
    }

    /// The key as a record value (for output fields and scripts).
    pub fn to_dynamic(&self) -> Dynamic {
        match &self.value {
            KeyValue::Str(s) => Dynamic::from(s.clone()),
            KeyValue::Int(i) => Dynamic::from(*i),
            KeyValue::Bool(b) => Dynamic::from(*b),
            KeyValue::Unit => Dynamic::UNIT,
            KeyValue::Other(text) => serde_json::from_str::<Dynamic>(text)
                .unwrap_or_else(|_| Dynamic::from(text.clone())),
        }
    }
}

/// A hasher that passes a [`Key`]'s precomputed hash through.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, i: u64) {
        // The key group is `hash % max_parallelism` (low bits), so every key of one key group
        // shares its low bits; hash tables index by low bits and tag by high ones, so rotate
        // the well-mixed high half down.
        self.0 = i.rotate_left(32);
    }
}

/// Build-hasher for maps keyed by [`Key`].
pub type KeyBuildHasher = BuildHasherDefault<KeyHasher>;

/// Which subtask of an operator with `parallelism` subtasks owns a key group (Flink's rule).
/// A power-of-two `max_parallelism` divides by a shift, as [`Key::key_group`] does.
#[inline]
pub fn subtask_for_key_group(key_group: u32, parallelism: u32, max_parallelism: u32) -> u32 {
    let m = max_parallelism.max(1);
    let scaled = u64::from(key_group) * u64::from(parallelism);
    if m.is_power_of_two() {
        (scaled >> m.trailing_zeros()) as u32
    } else {
        (scaled / u64::from(m)) as u32
    }
}

/// A contiguous range of key groups `[start, end)`, the unit in which a subtask owns state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: u32,
    /// One past the last key group.
    pub end: u32,
}

impl KeyGroupRange {
    /// Every key group.
    #[cfg(any(test, feature = "testkit"))]
    pub fn all(max_parallelism: u32) -> Self {
        Self {
            start: 0,
            end: max_parallelism,
        }
    }

    /// The key groups owned by `subtask` (Flink's `computeKeyGroupRangeForOperatorIndex`),
    /// consistent with [`subtask_for_key_group`].
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, subtask: u32) -> Self {
        let (m, p, s) = (
            u64::from(max_parallelism),
            u64::from(parallelism.max(1)),
            u64::from(subtask),
        );
        let start = (s * m).div_ceil(p);
        let end = ((s + 1) * m - 1) / p + 1;
        Self {
            start: start as u32,
            end: end as u32,
        }
    }

    /// Whether `kg` is in the range.
    pub fn contains(&self, kg: u32) -> bool {
        (self.start..self.end).contains(&kg)
    }

    /// Number of key groups.
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Builds an object map record from `(name, value)` pairs.
#[cfg(any(test, feature = "testkit"))]
pub fn map_of<'a>(fields: impl IntoIterator<Item = (&'a str, Dynamic)>) -> Record {
    let mut m = Map::new();
    for (k, v) in fields {
        m.insert(k.into(), v);
    }
    Dynamic::from_map(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_by_value_whatever_their_length_and_kind() {
        let s = |t: &str| Key::from_str_value(t.into());
        let long = "a string key longer than fifteen bytes";
        // Short strings (packed) and long ones (compared through the shared text).
        for t in ["", "a", "u8421", "fifteen bytes!!", "sixteen bytes!!!", long] {
            assert_eq!(s(t), s(t), "{t:?}");
        }
        assert_ne!(s("u1"), s("u2"));
        assert_ne!(s("ab"), s("ab\0"));
        assert_ne!(s("fifteen bytes!!"), s("fifteen bytes!?"));
        assert_ne!(s(long), s(&long.replace('a', "b")));
        // A string against an integer or unit of the same text.
        let int = Key::from_dynamic(&Dynamic::from(1_i64));
        assert_ne!(s("1"), int);
        assert_eq!(int, Key::from_dynamic(&Dynamic::from(1_i64)));
        assert_ne!(s(""), Key::from_dynamic(&Dynamic::UNIT));
        // Two words, not a 16-byte-aligned u128: a key is five words.
        #[cfg(target_pointer_width = "64")]
        assert_eq!(std::mem::size_of::<Key>(), 40);
    }

    #[test]
    fn json_round_trips_through_dynamic() {
        let r = parse_json(br#"{"user":"u1","amount":3,"nested":{"x":[1,2.5,true,null]}}"#)
            .expect("parse");
        let mut out = Vec::new();
        write_json(&mut out, &r).expect("write");
        let back: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(back["nested"]["x"][1], serde_json::json!(2.5));
        assert_eq!(
            FieldPath::new("nested.x").get(&r).map(|v| v.is_array()),
            Some(true)
        );
        assert!(FieldPath::new("nested.y").get(&r).is_none());
    }

    #[test]
    fn parse_json_matches_rhai_deserialize() {
        for text in [
            r#"{"user":"u1","amount":3,"ts":1700000000000}"#,
            r#"{"b":1,"a":2,"b":3,"e\u00e9\"":"x\ny","n":null,"t":true,"f":-1.5e3}"#,
            r#"{"big":18446744073709551615,"neg":-9223372036854775808,"arr":[1,[2,{"z":{}}],[]]}"#,
            r#"[1,"two",3.0,null]"#,
            r#""just a string""#,
            "42",
        ] {
            let ours = parse_json(text.as_bytes()).expect("ours");
            let rhai: Dynamic = serde_json::from_str(text).expect("rhai");
            assert_eq!(ours.type_name(), rhai.type_name(), "{text}");
            assert_eq!(ours.to_string(), rhai.to_string(), "{text}");
        }
        assert!(parse_json(br#"{"a":1} x"#).is_err());
        assert!(parse_json(br#"{"a":1"#).is_err());
    }

    #[test]
    fn short_and_long_string_keys_compare_by_value() {
        let long = "a-key-longer-than-fifteen-bytes";
        for (x, y, equal) in [
            ("u1", "u1", true),
            ("u1", "u2", false),
            ("", "", true),
            ("exactly15bytes!", "exactly15bytes!", true),
            (long, long, true),
            (long, "short", false),
        ] {
            let a = Key::from_str_value(x.into());
            let b = Key::from_dynamic(&Dynamic::from(y));
            assert_eq!(a == b, equal, "{x} vs {y}");
        }
        let s = Key::from_str_value("1".into());
        let i = Key::from_dynamic(&Dynamic::from(1_i64));
        assert_ne!(s, i);
        assert_eq!(
            Key::from_dynamic(&Dynamic::UNIT),
            Key::from_dynamic(&Dynamic::UNIT)
        );
    }

    #[test]
    fn key_groups_and_owners_by_mask_equal_the_division() {
        for i in 0..2000_u32 {
            let k = Key::from_str_value(format!("user-{i}").into());
            for m in [1_u32, 2, 7, 64, 100, 128, 1000, 1024, 32_768] {
                let kg = k.key_group(m);
                assert_eq!(u64::from(kg), k.hash_code() % u64::from(m));
                for p in [1_u32, 2, 3, 5, 64] {
                    let owner = u64::from(kg) * u64::from(p) / u64::from(m);
                    assert_eq!(u64::from(subtask_for_key_group(kg, p, m)), owner);
                }
            }
        }
    }

    #[test]
    fn key_groups_partition_like_flink() {
        for (m, p) in [(128u32, 1u32), (128, 2), (128, 3), (128, 4), (7, 3)] {
            let mut seen = 0;
            for s in 0..p {
                let r = KeyGroupRange::for_subtask(m, p, s);
                for kg in r.start..r.end {
                    assert_eq!(subtask_for_key_group(kg, p, m), s);
                }
                seen += r.len();
            }
            assert_eq!(seen, m as usize);
        }
    }

    #[test]
    fn equal_keys_hash_equal_and_types_differ() {
        let a = Key::from_dynamic(&Dynamic::from("7"));
        let b = Key::from_str_value("7".into());
        let c = Key::from_dynamic(&Dynamic::from(7_i64));
        assert_eq!(a, b);
        assert_eq!(a.hash_code(), b.hash_code());
        assert_ne!(a, c);
        assert_eq!(c.to_dynamic().as_int(), Ok(7));
    }

    #[test]
    fn state_encoding_round_trips() {
        let r = parse_json(br#"{"a":1,"b":"x","c":[1.5]}"#).expect("parse");
        let bytes = encode(&r).expect("encode");
        let back: Dynamic = decode(&bytes).expect("decode");
        assert_eq!(back.to_string(), r.to_string());
    }
}
