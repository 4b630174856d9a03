//! The canonical keyed-state snapshot format: what [`StateBackend::snapshot`] writes and
//! [`StateBackend::restore`] reads on every backend, so that a snapshot taken by one backend
//! restores into any other (memory ⇄ rocksdb) and at any parallelism.
//!
//! **Format.** One MessagePack value, `[version, max_parallelism, states]`, where `states` is
//! an array of `[name, kind, entries]` and `entries` an array of `[key group, key, value]`
//! (the key as [`Key::to_dynamic`] gives it, the value as [`crate::record::encode`] writes a
//! Rhai value). This is exactly what `rmp_serde` writes for the equivalent structs, so files
//! from earlier builds read unchanged.
//!
//! **Streaming.** A savepoint of a million keys must not pause a reload for seconds, so this
//! module does not build an intermediate list of entries: [`SnapshotWriter`] appends entries
//! straight from a backend's live values (or from bytes already encoded, as RocksDB stores
//! them), and [`read_snapshot`] hands each entry's key and still-encoded value to a callback
//! (the memory backend decodes it into its tables; RocksDB writes the bytes as they are).
//!
//! This module owns only the format (its encoding, its version check and its validation); it
//! holds no state and does no I/O.
//!
//! [`StateBackend::snapshot`]: super::StateBackend::snapshot
//! [`StateBackend::restore`]: super::StateBackend::restore

use rhai::{Dynamic, ImmutableString};
use weir_schema::StateKind;

use super::SNAPSHOT_VERSION;
use crate::base::error::{Result, RunError};
use crate::record::{Key, KeyValue, decode};

/// The code of a state kind in snapshots.
pub fn kind_code(kind: StateKind) -> u8 {
    match kind {
        StateKind::Value => 0,
        StateKind::List => 1,
        StateKind::Map => 2,
    }
}

/// The state kind of a snapshot code, if known.
pub fn kind_of(code: u8) -> Option<StateKind> {
    match code {
        0 => Some(StateKind::Value),
        1 => Some(StateKind::List),
        2 => Some(StateKind::Map),
        _ => None,
    }
}

/// MessagePack `array 32` marker: entry counts are written as a fixed-width placeholder and
/// patched when the state is finished (a valid, if not minimal, encoding).
const ARRAY32: u8 = 0xdd;

fn encode_err(e: impl std::fmt::Display) -> RunError {
    RunError::State(format!("cannot encode snapshot: {e}"))
}

/// Appends a canonical snapshot entry by entry: [`begin_state`](Self::begin_state) for each
/// state announced to [`new`](Self::new), then its entries, then [`finish`](Self::finish).
pub struct SnapshotWriter {
    out: Vec<u8>,
    states_left: u32,
    /// Offset of the open state's entry-count placeholder, and its entries so far.
    open: Option<(usize, u32)>,
}

impl SnapshotWriter {
    /// Starts a snapshot of `states` states out of `max_parallelism` key groups.
    pub fn new(max_parallelism: u32, states: u32) -> Self {
        let mut out = Vec::with_capacity(64);
        // The writes below go to a Vec and cannot fail.
        let _ = rmp::encode::write_array_len(&mut out, 3);
        let _ = rmp::encode::write_uint(&mut out, u64::from(SNAPSHOT_VERSION));
        let _ = rmp::encode::write_uint(&mut out, u64::from(max_parallelism));
        let _ = rmp::encode::write_array_len(&mut out, states);
        Self {
            out,
            states_left: states,
            open: None,
        }
    }

    /// Reserves room for about `bytes` more bytes.
    pub fn reserve(&mut self, bytes: usize) {
        self.out.reserve(bytes);
    }

    /// Starts the next state; its entries follow.
    ///
    /// # Errors
    /// More states than announced.
    pub fn begin_state(&mut self, name: &str, kind: StateKind) -> Result<()> {
        self.close_state();
        if self.states_left == 0 {
            return Err(encode_err("more states than announced"));
        }
        self.states_left -= 1;
        let _ = rmp::encode::write_array_len(&mut self.out, 3);
        rmp::encode::write_str(&mut self.out, name).map_err(encode_err)?;
        let _ = rmp::encode::write_uint(&mut self.out, u64::from(kind_code(kind)));
        self.open = Some((self.out.len(), 0));
        self.out.push(ARRAY32);
        self.out.extend_from_slice(&0u32.to_be_bytes());
        Ok(())
    }

    fn entry_head(&mut self, kg: u32) -> Result<()> {
        let Some((_, n)) = self.open.as_mut() else {
            return Err(encode_err("an entry outside a state"));
        };
        *n = n
            .checked_add(1)
            .ok_or_else(|| encode_err("more than 2^32 entries in one state"))?;
        let _ = rmp::encode::write_array_len(&mut self.out, 3);
        let _ = rmp::encode::write_uint(&mut self.out, u64::from(kg));
        Ok(())
    }

    fn write_key(&mut self, key: &KeyValue) -> Result<()> {
        match key {
            KeyValue::Str(s) => rmp::encode::write_str(&mut self.out, s).map_err(encode_err)?,
            KeyValue::Int(i) => {
                let _ = rmp::encode::write_sint(&mut self.out, *i);
            }
            KeyValue::Bool(b) => {
                let _ = rmp::encode::write_bool(&mut self.out, *b);
            }
            KeyValue::Unit => {
                let _ = rmp::encode::write_nil(&mut self.out);
            }
            // As `Key::to_dynamic` turns such a key back into a value.
            KeyValue::Other(text) => {
                let value = serde_json::from_str::<Dynamic>(text)
                    .unwrap_or_else(|_| Dynamic::from(text.clone()));
                rmp_serde::encode::write(&mut self.out, &value).map_err(encode_err)?;
            }
        }
        Ok(())
    }

    /// Appends an entry of the open state from a live value.
    ///
    /// # Errors
    /// No open state, or a value that cannot be encoded.
    pub fn entry(&mut self, kg: u32, key: &Key, value: &Dynamic) -> Result<()> {
        self.entry_head(kg)?;
        self.write_key(key.value())?;
        rmp_serde::encode::write(&mut self.out, value).map_err(encode_err)
    }

    /// Appends an entry of the open state whose value is already encoded (one complete
    /// MessagePack value, as [`crate::record::encode`] writes it).
    ///
    /// # Errors
    /// No open state.
    pub fn entry_encoded(&mut self, kg: u32, key: &KeyValue, value: &[u8]) -> Result<()> {
        self.entry_head(kg)?;
        self.write_key(key)?;
        self.out.extend_from_slice(value);
        Ok(())
    }

    fn close_state(&mut self) {
        if let Some((at, n)) = self.open.take() {
            self.out[at + 1..at + 5].copy_from_slice(&n.to_be_bytes());
        }
    }

    /// The encoded snapshot.
    ///
    /// # Errors
    /// Fewer states than announced.
    pub fn finish(mut self) -> Result<Vec<u8>> {
        self.close_state();
        if self.states_left != 0 {
            return Err(encode_err(format!(
                "{} announced state(s) missing",
                self.states_left
            )));
        }
        Ok(self.out)
    }
}

/// What [`read_snapshot`] hands to its callback, in file order: a state, then its entries.
pub enum SnapshotItem<'a> {
    /// The entries that follow belong to this state.
    State {
        /// The state's name.
        name: &'a str,
        /// Its kind.
        kind: StateKind,
        /// How many entries follow (in every key group of the snapshot).
        entries: u32,
    },
    /// One entry of the last announced state.
    Entry {
        /// Its key group.
        kg: u32,
        /// Its key.
        key: Key,
        /// Its value, still encoded (decode with [`decode_value`]).
        value: &'a [u8],
    },
}

/// Decodes an entry value handed out by [`read_snapshot`] (or stored by a backend): the same
/// value [`crate::record::decode`] gives, decoded directly for the common types (scalars,
/// strings, arrays, maps with string keys) and through serde otherwise.
///
/// # Errors
/// Bytes that are not one encoded value.
pub fn decode_value(bytes: &[u8]) -> Result<Dynamic> {
    let mut rd = Reader { buf: bytes, pos: 0 };
    let value = match rd.value(0)? {
        Some(v) => v,
        None => return decode_with_serde(bytes),
    };
    if rd.pos != bytes.len() {
        return Err(rd.malformed("trailing bytes after a value"));
    }
    Ok(value)
}

fn decode_with_serde(bytes: &[u8]) -> Result<Dynamic> {
    decode(bytes).map_err(|e| RunError::StateCorrupt(format!("cannot decode state value: {e}")))
}

/// Nesting beyond which [`Reader::value`] leaves a value to serde (which has its own limit).
const DIRECT_DEPTH: u32 = 32;

/// Reads a snapshot, checking that this build reads its version and that it has
/// `max_parallelism` key groups, and calls `f` for every state and entry in order. Every
/// entry value is checked to be one complete MessagePack value (its bytes are not decoded).
///
/// # Errors
/// A malformed snapshot, an unknown version, another number of key groups, an unknown state
/// kind, or the callback's error.
pub fn read_snapshot(
    bytes: &[u8],
    max_parallelism: u32,
    mut f: impl FnMut(SnapshotItem<'_>) -> Result<()>,
) -> Result<()> {
    let mut rd = Reader { buf: bytes, pos: 0 };
    rd.expect_array(3, "snapshot")?;
    let version = rd.uint("version")?;
    if version != u64::from(SNAPSHOT_VERSION) {
        return Err(RunError::StateMismatch(format!(
            "snapshot version {version} is not supported (expected {SNAPSHOT_VERSION})"
        )));
    }
    let groups = rd.uint("max_parallelism")?;
    if groups != u64::from(max_parallelism) {
        return Err(RunError::StateMismatch(format!(
            "snapshot has {groups} key groups but the pipeline has {max_parallelism}; max_parallelism cannot change"
        )));
    }
    let states = rd.array("states")?;
    rd.fits(states, MIN_STATE_BYTES, "states")?;
    for _ in 0..states {
        rd.expect_array(3, "state")?;
        let name = rd.str("state name")?;
        let code = rd.uint("state kind")?;
        let kind = u8::try_from(code)
            .ok()
            .and_then(kind_of)
            .ok_or_else(|| RunError::StateCorrupt(format!("unknown state kind {code}")))?;
        let entries = rd.array("entries")?;
        // Checked before the callback sees the count (a backend may reserve room for it).
        rd.fits(entries, MIN_ENTRY_BYTES, "entries")?;
        f(SnapshotItem::State {
            name,
            kind,
            entries,
        })?;
        for _ in 0..entries {
            rd.expect_array(3, "entry")?;
            let kg = u32::try_from(rd.uint("key group")?)
                .map_err(|_| rd.malformed("key group out of range"))?;
            let key = rd.key()?;
            let value = rd.skip_value()?;
            f(SnapshotItem::Entry { kg, key, value })?;
        }
    }
    if rd.pos != bytes.len() {
        return Err(rd.malformed("trailing bytes"));
    }
    Ok(())
}

/// The fewest bytes a state takes: its array marker, name, kind and entry array.
const MIN_STATE_BYTES: usize = 4;

/// The fewest bytes an entry takes: its array marker, key group, key and value.
const MIN_ENTRY_BYTES: usize = 4;

/// What [`filter_snapshot`] does with one state of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    /// Keep its entries, under this kind (the declared one; values of another kind are
    /// rewritten by `migrate` after the restore).
    Keep(StateKind),
    /// Leave the state and its entries out.
    Drop,
}

/// Rewrites a snapshot keeping only the states `decide` keeps, each under the kind it says;
/// entries are copied as encoded (nothing is decoded). `decide` sees each state's name and
/// recorded kind once, in file order.
///
/// # Errors
/// A malformed snapshot (as [`read_snapshot`]), or `decide`'s error.
pub fn filter_snapshot(
    bytes: &[u8],
    max_parallelism: u32,
    mut decide: impl FnMut(&str, StateKind) -> Result<StateFilter>,
) -> Result<Vec<u8>> {
    let mut decisions = Vec::new();
    read_snapshot(bytes, max_parallelism, |item| {
        if let SnapshotItem::State { name, kind, .. } = item {
            decisions.push(decide(name, kind)?);
        }
        Ok(())
    })?;
    let kept = decisions
        .iter()
        .filter(|d| matches!(d, StateFilter::Keep(_)))
        .count();
    let mut w = SnapshotWriter::new(
        max_parallelism,
        u32::try_from(kept).map_err(|_| encode_err("too many states"))?,
    );
    w.reserve(bytes.len());
    let mut next = decisions.iter();
    let mut keep = false;
    read_snapshot(bytes, max_parallelism, |item| {
        match item {
            SnapshotItem::State { name, .. } => match next.next() {
                Some(StateFilter::Keep(kind)) => {
                    w.begin_state(name, *kind)?;
                    keep = true;
                }
                Some(StateFilter::Drop) => keep = false,
                None => return Err(encode_err("the snapshot changed while filtering")),
            },
            SnapshotItem::Entry { kg, key, value } if keep => {
                w.entry_encoded(kg, key.value(), value)?;
            }
            SnapshotItem::Entry { .. } => {}
        }
        Ok(())
    })?;
    w.finish()
}

/// A bounds-checked cursor over MessagePack bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn malformed(&self, what: &str) -> RunError {
        RunError::StateCorrupt(format!("malformed snapshot: {what} at byte {}", self.pos))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.malformed("unexpected end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// Checks that `count` items of at least `min_bytes` each fit in the bytes left, so that a
    /// crafted count can never size an allocation beyond what the snapshot could hold.
    fn fits(&self, count: u32, min_bytes: usize, what: &str) -> Result<()> {
        let left = self.buf.len() - self.pos;
        if (count as usize).saturating_mul(min_bytes) > left {
            return Err(self.malformed(&format!(
                "{count} {what} announced but only {left} bytes left"
            )));
        }
        Ok(())
    }

    fn be(&mut self, n: usize) -> Result<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn array(&mut self, what: &str) -> Result<u32> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok(u32::from(m & 0x0f)),
            0xdc => Ok(self.be(2)? as u32),
            0xdd => Ok(self.be(4)? as u32),
            _ => {
                self.pos -= 1;
                Err(self.malformed(&format!("{what}: expected an array")))
            }
        }
    }

    fn expect_array(&mut self, len: u32, what: &str) -> Result<()> {
        let n = self.array(what)?;
        if n == len {
            Ok(())
        } else {
            Err(self.malformed(&format!("{what}: expected {len} fields, found {n}")))
        }
    }

    fn uint(&mut self, what: &str) -> Result<u64> {
        match self.byte()? {
            m @ 0x00..=0x7f => Ok(u64::from(m)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            // Non-negative values written with a signed marker.
            m @ 0xd0..=0xd3 => {
                let v = self.signed(m)?;
                u64::try_from(v).map_err(|_| self.malformed(&format!("{what}: negative")))
            }
            _ => {
                self.pos -= 1;
                Err(self.malformed(&format!("{what}: expected an unsigned integer")))
            }
        }
    }

    fn signed(&mut self, marker: u8) -> Result<i64> {
        Ok(match marker {
            0xd0 => i64::from(self.be(1)? as u8 as i8),
            0xd1 => i64::from(self.be(2)? as u16 as i16),
            0xd2 => i64::from(self.be(4)? as u32 as i32),
            _ => self.be(8)? as i64,
        })
    }

    fn str_len(&mut self, marker: u8) -> Result<Option<usize>> {
        Ok(Some(match marker {
            0xa0..=0xbf => usize::from(marker & 0x1f),
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            _ => return Ok(None),
        }))
    }

    fn str(&mut self, what: &str) -> Result<&'a str> {
        let marker = self.byte()?;
        let Some(len) = self.str_len(marker)? else {
            self.pos -= 1;
            return Err(self.malformed(&format!("{what}: expected a string")));
        };
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|_| self.malformed(&format!("{what}: not UTF-8")))
    }

    /// A key, as [`Key::to_dynamic`] wrote it: strings, integers, booleans and nil directly;
    /// anything else through a decoded value.
    fn key(&mut self) -> Result<Key> {
        let start = self.pos;
        let marker = self.byte()?;
        if let Some(len) = self.str_len(marker)? {
            let bytes = self.take(len)?;
            let s = std::str::from_utf8(bytes).map_err(|_| self.malformed("key: not UTF-8"))?;
            return Ok(Key::from_str_value(ImmutableString::from(s)));
        }
        let int = match marker {
            0x00..=0x7f => Some(i64::from(marker)),
            0xe0..=0xff => Some(i64::from(marker as i8)),
            0xcc => Some(self.be(1)? as i64),
            0xcd => Some(self.be(2)? as i64),
            0xce => Some(self.be(4)? as i64),
            0xcf => Some(
                i64::try_from(self.be(8)?).map_err(|_| self.malformed("key: integer too large"))?,
            ),
            0xd0..=0xd3 => Some(self.signed(marker)?),
            _ => None,
        };
        if let Some(i) = int {
            return Ok(Key::from_dynamic(&Dynamic::from_int(i)));
        }
        match marker {
            0xc0 => Ok(Key::from_dynamic(&Dynamic::UNIT)),
            0xc2 | 0xc3 => Ok(Key::from_dynamic(&Dynamic::from_bool(marker == 0xc3))),
            _ => {
                self.pos = start;
                let span = self.skip_value()?;
                let value = decode_value(span)?;
                Ok(Key::from_dynamic(&value))
            }
        }
    }

    /// Decodes one value; `None` (with the position unspecified) when it holds something
    /// only serde decodes (an extension type, a map with non-string keys, deep nesting).
    fn value(&mut self, depth: u32) -> Result<Option<Dynamic>> {
        if depth > DIRECT_DEPTH {
            return Ok(None);
        }
        let marker = self.byte()?;
        if let Some(len) = self.str_len(marker)? {
            let bytes = self.take(len)?;
            let s = std::str::from_utf8(bytes).map_err(|_| self.malformed("string: not UTF-8"))?;
            return Ok(Some(Dynamic::from(ImmutableString::from(s))));
        }
        let v = match marker {
            0x00..=0x7f => Dynamic::from_int(i64::from(marker)),
            0xe0..=0xff => Dynamic::from_int(i64::from(marker as i8)),
            0xc0 => Dynamic::UNIT,
            0xc2 => Dynamic::FALSE,
            0xc3 => Dynamic::TRUE,
            0xcc => Dynamic::from_int(self.be(1)? as i64),
            0xcd => Dynamic::from_int(self.be(2)? as i64),
            0xce => Dynamic::from_int(self.be(4)? as i64),
            // As Rhai's deserializer: beyond i64, a float.
            0xcf => {
                let u = self.be(8)?;
                i64::try_from(u).map_or_else(|_| Dynamic::from_float(u as f64), Dynamic::from_int)
            }
            0xd0..=0xd3 => Dynamic::from_int(self.signed(marker)?),
            0xca => Dynamic::from_float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Dynamic::from_float(f64::from_bits(self.be(8)?)),
            0xc4..=0xc6 => {
                let len = self.be(1 << (marker - 0xc4))? as usize;
                Dynamic::from_blob(self.take(len)?.to_vec())
            }
            0x90..=0x9f | 0xdc | 0xdd => {
                self.pos -= 1;
                let n = self.array("array")? as usize;
                let mut items = rhai::Array::with_capacity(n.min(self.buf.len() - self.pos));
                for _ in 0..n {
                    match self.value(depth + 1)? {
                        Some(v) => items.push(v),
                        None => return Ok(None),
                    }
                }
                Dynamic::from_array(items)
            }
            0x80..=0x8f | 0xde | 0xdf => {
                let n = match marker {
                    0xde => self.be(2)?,
                    0xdf => self.be(4)?,
                    _ => u64::from(marker & 0x0f),
                };
                let mut map = rhai::Map::new();
                for _ in 0..n {
                    let m = self.byte()?;
                    let Some(len) = self.str_len(m)? else {
                        return Ok(None);
                    };
                    let bytes = self.take(len)?;
                    let k = std::str::from_utf8(bytes)
                        .map_err(|_| self.malformed("map key: not UTF-8"))?;
                    match self.value(depth + 1)? {
                        Some(v) => {
                            map.insert(k.into(), v);
                        }
                        None => return Ok(None),
                    }
                }
                Dynamic::from_map(map)
            }
            0xc1 => {
                self.pos -= 1;
                return Err(self.malformed("invalid marker"));
            }
            // Extension types.
            _ => return Ok(None),
        };
        Ok(Some(v))
    }

    /// Skips one complete value (however nested) and returns its bytes.
    fn skip_value(&mut self) -> Result<&'a [u8]> {
        let start = self.pos;
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let marker = self.byte()?;
            let (skip, children): (u64, u64) = match marker {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
                0x80..=0x8f => (0, 2 * u64::from(marker & 0x0f)),
                0x90..=0x9f => (0, u64::from(marker & 0x0f)),
                0xa0..=0xbf => (u64::from(marker & 0x1f), 0),
                0xc4 | 0xd9 => (self.be(1)?, 0),
                0xc5 | 0xda => (self.be(2)?, 0),
                0xc6 | 0xdb => (self.be(4)?, 0),
                0xc7 => (self.be(1)? + 1, 0),
                0xc8 => (self.be(2)? + 1, 0),
                0xc9 => (self.be(4)? + 1, 0),
                0xca => (4, 0),
                0xcb => (8, 0),
                0xcc | 0xd0 => (1, 0),
                0xcd | 0xd1 => (2, 0),
                0xce | 0xd2 => (4, 0),
                0xcf | 0xd3 => (8, 0),
                0xd4 => (2, 0),
                0xd5 => (3, 0),
                0xd6 => (5, 0),
                0xd7 => (9, 0),
                0xd8 => (17, 0),
                0xdc => (0, self.be(2)?),
                0xdd => (0, self.be(4)?),
                0xde => (0, 2 * self.be(2)?),
                0xdf => (0, 2 * self.be(4)?),
                _ => {
                    self.pos -= 1;
                    return Err(self.malformed("invalid marker"));
                }
            };
            let skip = usize::try_from(skip).map_err(|_| self.malformed("length"))?;
            self.take(skip)?;
            // Each child takes at least one byte: a count beyond the rest is malformed, and
            // this bounds `pending`.
            if children > (self.buf.len() - self.pos) as u64 {
                return Err(self.malformed("more elements than bytes"));
            }
            pending += children;
        }
        Ok(&self.buf[start..self.pos])
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use rhai::Map;
    use serde::Serialize;

    /// The structs earlier builds serialised with `rmp_serde` (the format's definition).
    #[derive(Serialize)]
    struct File {
        version: u32,
        max_parallelism: u32,
        states: Vec<State>,
    }
    #[derive(Serialize)]
    struct State {
        name: String,
        kind: u8,
        entries: Vec<(u32, Dynamic, Dynamic)>,
    }

    /// Dropping one state and retyping another: the restored backend holds exactly the
    /// kept states under the new kinds, with their values, and nothing of the dropped one.
    #[test]
    fn filtering_drops_and_retypes_states() {
        use crate::record::KeyGroupRange;
        use crate::state::{MemoryBackend, StateBackend};
        let all = KeyGroupRange::all(128);
        let mut b = MemoryBackend::new(128, all);
        let cnt = b.register("cnt", StateKind::Value).unwrap();
        let old = b.register("old", StateKind::Value).unwrap();
        let seen = b.register("seen", StateKind::List).unwrap();
        let k = Key::from_dynamic(&Dynamic::from("u"));
        b.put(cnt, &k, Dynamic::from_int(7)).unwrap();
        b.put(old, &k, Dynamic::from_int(99)).unwrap();
        b.put(seen, &k, Dynamic::from_array(vec![Dynamic::from_int(1)]))
            .unwrap();
        let snap = b.snapshot(all).unwrap();

        let mut seen_states = Vec::new();
        let filtered = filter_snapshot(&snap, 128, |name, kind| {
            seen_states.push((name.to_owned(), kind));
            Ok(match name {
                "cnt" => StateFilter::Keep(StateKind::List),
                "seen" => StateFilter::Keep(StateKind::List),
                _ => StateFilter::Drop,
            })
        })
        .unwrap();
        assert_eq!(
            seen_states,
            vec![
                ("cnt".to_owned(), StateKind::Value),
                ("old".to_owned(), StateKind::Value),
                ("seen".to_owned(), StateKind::List)
            ]
        );
        let mut names = Vec::new();
        read_snapshot(&filtered, 128, |item| {
            if let SnapshotItem::State {
                name,
                kind,
                entries,
            } = item
            {
                names.push((name.to_owned(), kind, entries));
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(
            names,
            vec![
                ("cnt".to_owned(), StateKind::List, 1),
                ("seen".to_owned(), StateKind::List, 1)
            ]
        );

        // The new version declares `cnt` as a list and `seen`; `old` is gone.
        let mut back = MemoryBackend::new(128, all);
        let cnt = back.register("cnt", StateKind::List).unwrap();
        let seen = back.register("seen", StateKind::List).unwrap();
        back.restore(&[filtered.as_slice()]).unwrap();
        assert_eq!(
            back.get(cnt, &k).unwrap().map(|v| v.as_int().unwrap()),
            Some(7)
        );
        assert_eq!(
            back.get(seen, &k)
                .unwrap()
                .map(|v| v.into_array().unwrap().len()),
            Some(1)
        );
        let again = back.snapshot(all).unwrap();
        let mut states = Vec::new();
        read_snapshot(&again, 128, |item| {
            if let SnapshotItem::State { name, .. } = item {
                states.push(name.to_owned());
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(
            states,
            vec!["cnt", "seen"],
            "the dropped state never comes back"
        );

        // An error of the callback stops the filter.
        assert!(filter_snapshot(&snap, 128, |_, _| Err(RunError::State("no".into()))).is_err());
    }

    fn value(n: i64) -> Dynamic {
        let mut m = Map::new();
        m.insert("n".into(), Dynamic::from_int(n));
        m.insert("s".into(), Dynamic::from("x".repeat(n as usize % 40)));
        m.insert(
            "l".into(),
            Dynamic::from_array(vec![Dynamic::from_float(0.5), Dynamic::UNIT]),
        );
        Dynamic::from_map(m)
    }

    fn keys() -> Vec<Key> {
        let mut other = Map::new();
        other.insert("a".into(), Dynamic::from_int(1));
        vec![
            Key::from_dynamic(&Dynamic::from("short")),
            Key::from_dynamic(&Dynamic::from("a key longer than fifteen bytes")),
            Key::from_dynamic(&Dynamic::from_int(-3)),
            Key::from_dynamic(&Dynamic::from_int(200)),
            Key::from_dynamic(&Dynamic::from_int(i64::MIN)),
            Key::from_dynamic(&Dynamic::from_int(70_000)),
            Key::from_dynamic(&Dynamic::from_bool(true)),
            Key::from_dynamic(&Dynamic::UNIT),
            Key::from_dynamic(&Dynamic::from_map(other)),
        ]
    }

    type States = Vec<(String, Vec<(u32, Key, Dynamic)>)>;

    fn read_all(bytes: &[u8], groups: u32) -> Result<States> {
        let mut out: States = Vec::new();
        read_snapshot(bytes, groups, |item| {
            match item {
                SnapshotItem::State { name, .. } => out.push((name.to_owned(), Vec::new())),
                SnapshotItem::Entry { kg, key, value } => {
                    out.last_mut()
                        .expect("state first")
                        .1
                        .push((kg, key, decode_value(value)?));
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn writer_output_equals_the_serde_encoding_of_the_format() {
        let keys = keys();
        let mut w = SnapshotWriter::new(128, 2);
        w.begin_state("sums", StateKind::Value).unwrap();
        for (i, k) in keys.iter().enumerate() {
            w.entry(i as u32 * 7, k, &value(i as i64)).unwrap();
        }
        w.begin_state("empty", StateKind::Map).unwrap();
        let ours = w.finish().unwrap();
        let theirs = rmp_serde::to_vec(&File {
            version: SNAPSHOT_VERSION,
            max_parallelism: 128,
            states: vec![
                State {
                    name: "sums".into(),
                    kind: 0,
                    entries: keys
                        .iter()
                        .enumerate()
                        .map(|(i, k)| (i as u32 * 7, k.to_dynamic(), value(i as i64)))
                        .collect(),
                },
                State {
                    name: "empty".into(),
                    kind: 2,
                    entries: Vec::new(),
                },
            ],
        })
        .unwrap();
        // Same content; only the entry counts' width differs (fixed 32-bit placeholders).
        let a = read_all(&ours, 128).unwrap();
        let b = read_all(&theirs, 128).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].1.len(), keys.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.0, y.0);
            assert_eq!(x.1.len(), y.1.len());
            for ((kg1, k1, v1), (kg2, k2, v2)) in x.1.iter().zip(&y.1) {
                assert_eq!(kg1, kg2);
                assert_eq!(k1, k2);
                assert_eq!(v1.to_string(), v2.to_string());
            }
        }
        for ((_, k, v), (i, orig)) in a[0].1.iter().zip(keys.iter().enumerate()) {
            assert_eq!(k, orig);
            assert_eq!(v.to_string(), value(i as i64).to_string());
        }
    }

    #[test]
    fn encoded_entries_equal_live_entries() {
        let key = Key::from_dynamic(&Dynamic::from("k"));
        let v = value(9);
        let mut live = SnapshotWriter::new(16, 1);
        live.begin_state("s", StateKind::List).unwrap();
        live.entry(3, &key, &v).unwrap();
        let mut raw = SnapshotWriter::new(16, 1);
        raw.begin_state("s", StateKind::List).unwrap();
        raw.entry_encoded(3, key.value(), &crate::record::encode(&v).unwrap())
            .unwrap();
        assert_eq!(live.finish().unwrap(), raw.finish().unwrap());
    }

    #[test]
    fn direct_decoding_equals_serde_decoding() {
        let mut deep = Dynamic::from_int(1);
        for _ in 0..40 {
            deep = Dynamic::from_array(vec![deep]);
        }
        let mut odd = Map::new();
        odd.insert("blob".into(), Dynamic::from_blob(vec![1, 2, 3]));
        odd.insert("big".into(), Dynamic::from_float(1e300));
        odd.insert("neg".into(), Dynamic::from_int(-70_000));
        odd.insert("min".into(), Dynamic::from_int(i64::MIN));
        odd.insert("t".into(), Dynamic::TRUE);
        odd.insert("s".into(), Dynamic::from("é".repeat(40)));
        let values = [
            value(3),
            value(39),
            deep,
            Dynamic::from_map(odd),
            Dynamic::UNIT,
        ];
        for v in values {
            let bytes = crate::record::encode(&v).unwrap();
            let direct = decode_value(&bytes).unwrap();
            let serde = decode_with_serde(&bytes).unwrap();
            assert_eq!(format!("{direct:?}"), format!("{serde:?}"));
            assert_eq!(format!("{direct:?}"), format!("{v:?}"));
        }
        // u64 beyond i64 becomes a float, as through serde.
        let big = [0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            format!("{:?}", decode_value(&big).unwrap()),
            format!("{:?}", decode_with_serde(&big).unwrap())
        );
        // A map with an integer key is left to serde, which refuses it like before.
        let int_key = [0x81, 0x01, 0x02];
        assert!(decode_value(&int_key).is_err());
        assert!(decode_value(&[0x01, 0x02]).is_err());
    }

    #[test]
    fn bad_snapshots_are_errors_not_panics() {
        let mut w = SnapshotWriter::new(16, 1);
        w.begin_state("s", StateKind::Value).unwrap();
        for i in 0..50 {
            w.entry(
                i % 16,
                &Key::from_dynamic(&Dynamic::from_int(i64::from(i))),
                &value(i64::from(i)),
            )
            .unwrap();
        }
        let good = w.finish().unwrap();
        assert!(read_all(&good, 16).is_ok());
        let err = read_all(&good, 32).unwrap_err().to_string();
        assert!(err.contains("max_parallelism cannot change"), "{err}");
        // Every truncation and every single-byte corruption is an error or a clean read.
        for cut in 0..good.len() {
            assert!(read_all(&good[..cut], 16).is_err(), "truncated at {cut}");
        }
        for at in 0..good.len() {
            for b in [0x00u8, 0xc1, 0xdd, 0xdf, 0xff] {
                let mut bad = good.clone();
                bad[at] = b;
                let _ = read_all(&bad, 16);
            }
        }
        let mut w = SnapshotWriter::new(16, 2);
        w.begin_state("s", StateKind::Value).unwrap();
        assert!(w.finish().is_err());
        let mut w = SnapshotWriter::new(16, 0);
        assert!(w.begin_state("s", StateKind::Value).is_err());
    }

    /// A snapshot whose entry count is patched to `count` (the writer's fixed-width
    /// placeholder sits right after the state's name and kind).
    fn with_entry_count(count: u32) -> Vec<u8> {
        let mut w = SnapshotWriter::new(128, 1);
        w.begin_state("s", StateKind::Value).unwrap();
        w.entry(0, &Key::from_dynamic(&Dynamic::from_int(1)), &value(1))
            .unwrap();
        let mut bytes = w.finish().unwrap();
        let at = bytes
            .iter()
            .position(|&b| b == ARRAY32)
            .expect("placeholder");
        bytes[at + 1..at + 5].copy_from_slice(&count.to_be_bytes());
        bytes
    }

    #[test]
    fn huge_counts_are_refused_before_anything_is_sized_by_them() {
        // 4 billion entries announced in a 40-byte snapshot.
        let bytes = with_entry_count(u32::MAX);
        let mut announced = None;
        let err = read_snapshot(&bytes, 128, |item| {
            if let SnapshotItem::State { entries, .. } = item {
                announced = Some(entries);
            }
            Ok(())
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("4294967295 entries announced"), "{err}");
        assert_eq!(announced, None, "the callback never saw the count");
        // A backend that reserves room for the announced entries gets a clear error, not a
        // multi-gigabyte allocation.
        let mut memory =
            crate::state::memory::MemoryBackend::new(128, crate::record::KeyGroupRange::all(128));
        let err = crate::state::StateBackend::restore(&mut memory, &[&bytes])
            .unwrap_err()
            .to_string();
        assert!(err.contains("malformed snapshot"), "{err}");
        // As many states as bytes allow, no more.
        let mut w = SnapshotWriter::new(16, 1);
        w.begin_state("s", StateKind::Value).unwrap();
        let mut bytes = w.finish().unwrap();
        let at = bytes.iter().position(|&b| b == 0x91).expect("one state");
        bytes.splice(at..at + 1, [0xdd, 0xff, 0xff, 0xff, 0xff]);
        let err = read_all(&bytes, 16).unwrap_err().to_string();
        assert!(err.contains("states announced"), "{err}");
        // Huge array, map, string and blob lengths inside a value.
        for value in [
            vec![0xdd, 0xff, 0xff, 0xff, 0xff, 0x01],
            vec![0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, b'a', 0x01],
            vec![0xdb, 0xff, 0xff, 0xff, 0xff, b'a'],
            vec![0xc6, 0xff, 0xff, 0xff, 0xff, 0x00],
        ] {
            assert!(decode_value(&value).is_err(), "{value:x?}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_on_every_backend_restore() {
        let good = with_entry_count(1);
        let mut memory =
            crate::state::memory::MemoryBackend::new(128, crate::record::KeyGroupRange::all(128));
        crate::state::StateBackend::restore(&mut memory, &[&good]).unwrap();
        for cut in 0..good.len() {
            let mut memory = crate::state::memory::MemoryBackend::new(
                128,
                crate::record::KeyGroupRange::all(128),
            );
            let err = crate::state::StateBackend::restore(&mut memory, &[&good[..cut]])
                .expect_err("a truncated snapshot is refused");
            assert!(err.to_string().contains("snapshot"), "cut at {cut}: {err}");
        }
    }
}
