//! Cache prefetch hints for [`super::StateBackend::prefetch`] and for the records a keyed
//! operator is about to process ([`record`]): asking the processor to start loading the memory
//! a state value or a record lives in, without waiting for it. A hint never reads an address
//! into the program, so a wrong one costs a wasted load and nothing else; on processors other
//! than x86_64 the hints do nothing. A key's state is hinted in stages ([`Reach`],
//! [`prefetch_ahead`]), each reading only what the one before brought in, so that no hint waits
//! on a line it has to read to find the next.
//!
//! Records need it as much as state does: a source parses each record on one worker thread
//! and a keyed subtask on another reads it, so its first field access misses the cache (W4:
//! about 7 % of the cycles, at that one read).

use rhai::Dynamic;

use super::StateBackend;
use crate::record::Key;

/// Gives the keys ahead of a keyed operator's next record every stage of
/// [`StateBackend::prefetch`], `step` records apart: [`Reach::Contents`] for the key `step`
/// places after the next record's, [`Reach::Values`] for the one `2 * step` after, and
/// [`Reach::Row`] for the one `3 * step` after. `ahead(n)` is the key `n` places after the
/// next record's, if there is one.
pub fn prefetch_ahead<'k>(
    state: &dyn StateBackend,
    step: usize,
    ahead: impl Fn(usize) -> Option<&'k Key>,
) {
    for (reach, n) in [(Reach::Row, 3), (Reach::Values, 2), (Reach::Contents, 1)] {
        if let Some(key) = ahead(n * step) {
            state.prefetch(key, reach);
        }
    }
}

/// How far into a key's state a [`StateBackend::prefetch`] hint reaches. A keyed operator
/// gives each key every stage in turn, the first furthest ahead of the record that needs it:
/// each stage reads only what the stage before brought into the cache, so that no hint itself
/// waits on memory (a hint that has to read a missing line stalls the operator as the access
/// would have).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Where the key's values are kept (found without reading anything of the key's own).
    Row,
    /// The values, and the first line (the header) of each map's and list's heap block.
    Values,
    /// What an access to a map or a list reads after its header: its entries or items.
    Contents,
}

/// Asks the processor to start loading the cache line at `p`.
#[inline(always)]
#[allow(unsafe_code)]
pub fn line<T>(p: *const T) {
    // SAFETY: a prefetch instruction cannot fault or change memory, whatever the address;
    // SSE is part of every x86_64 processor.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Starts loading the first line of a map's or list's heap block (its header, which every
/// access reads first); a scalar lives inside the value itself and needs nothing.
#[inline(always)]
pub fn value(v: &Dynamic) {
    if v.is_map()
        && let Ok(map) = v.as_map_ref()
    {
        line(&raw const *map);
    } else if v.is_array()
        && let Ok(list) = v.as_array_ref()
    {
        line(&raw const *list);
    }
}

/// Starts loading what an access to a map or a list reads after its header: a map's keys and
/// values (up to a node's worth), a list's items (up to eight lines). Reads the header, so
/// call it when that is likely in the cache already (after [`value`]).
#[inline]
pub fn contents(v: &Dynamic) {
    if v.is_map()
        && let Ok(map) = v.as_map_ref()
    {
        if let (Some((word, key, val)), Some(words)) = (map_layout(), header_words(&map))
            && words[word] != 0
        {
            let n = map.len().min(NODE_CAPACITY);
            let node = words[word];
            span(node.wrapping_add(key), n * std::mem::size_of::<rhai::Identifier>());
            span(node.wrapping_add(val), n * std::mem::size_of::<Dynamic>());
        }
    } else if v.is_array()
        && let Ok(list) = v.as_array_ref()
    {
        span(list.as_ptr().addr(), list.len() * std::mem::size_of::<Dynamic>());
    }
}

/// What [`Reach::Values`] and [`Reach::Contents`] load of one value of a key: its heap block's
/// header ([`value`]) or what follows it ([`contents`]); a scalar needs nothing.
#[inline]
pub fn reach(v: &Dynamic, reach: Reach) {
    if reach == Reach::Contents {
        contents(v);
    } else {
        value(v);
    }
}

/// Starts loading every line of `*r` (up to eight), without reading it.
#[inline(always)]
pub fn object<T>(r: &T) {
    span((&raw const *r).addr(), std::mem::size_of::<T>());
}

/// The most entries a B-tree node holds.
const NODE_CAPACITY: usize = 11;

/// Prefetches the lines of `bytes` bytes from address `at`, at most eight.
#[inline(always)]
fn span(at: usize, bytes: usize) {
    let mut a = at & !63;
    let end = at.wrapping_add(bytes.min(8 * 64));
    while a < end {
        line(std::ptr::without_provenance::<u8>(a));
        a += 64;
    }
}

/// Where the entries of a map live, relative to its root node: the offsets of the first key and
/// the first value from the node address held in the map's header, and the header word that
/// holds it. Learnt once from a map made for the purpose, since the standard library does not
/// expose its B-tree's layout; `None` when the header does not look as expected.
fn map_layout() -> Option<(usize, usize, usize)> {
    static LAYOUT: std::sync::OnceLock<Option<(usize, usize, usize)>> = std::sync::OnceLock::new();
    *LAYOUT.get_or_init(|| {
        let mut m = rhai::Map::new();
        m.insert("a".into(), Dynamic::UNIT);
        let key = std::ptr::from_ref(m.keys().next()?).addr();
        let value = std::ptr::from_ref(m.values().next()?).addr();
        let words = header_words(&m)?;
        // The word holding the node's address: the nearest one at or below both entries.
        words.iter().enumerate().find_map(|(i, &w)| {
            let (k, v) = (key.checked_sub(w)?, value.checked_sub(w)?);
            (k < 1024 && v < 1024).then_some((i, k, v))
        })
    })
}

/// The words of a map's header (the `BTreeMap` value itself), when it is three words long.
fn header_words(m: &rhai::Map) -> Option<[usize; 3]> {
    if std::mem::size_of::<rhai::Map>() != std::mem::size_of::<[usize; 3]>() {
        return None;
    }
    // SAFETY: the header is three fully initialised words (a node pointer and two counts, no
    // padding), read as plain integers; nothing is ever read through them, they only become
    // prefetch hints.
    #[allow(unsafe_code)]
    Some(unsafe { std::ptr::read_unaligned(std::ptr::from_ref(m).cast::<[usize; 3]>()) })
}

/// Starts loading the records a task is about to work on, when they are maps (see
/// [`ahead`](Self::ahead)). Made once per batch: it holds the map layout.
pub struct RecordPrefetch {
    layout: Option<(usize, usize, usize)>,
}

impl RecordPrefetch {
    /// A prefetcher with the map layout (learnt at the first call in the process).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self {
            layout: map_layout(),
        }
    }

    /// The map's header of record `far` (a few records ahead), and the first keys and values
    /// (read by every field access) of record `near` (closer), whose header an earlier call
    /// brought in.
    #[inline]
    pub fn ahead(&self, far: Option<&Dynamic>, near: Option<&Dynamic>) {
        if let Some(v) = far.filter(|v| v.is_map()) {
            value(v);
        }
        let Some((word, key, val)) = self.layout else {
            return;
        };
        let Some(m) = near.filter(|v| v.is_map()).and_then(|v| v.as_map_ref().ok()) else {
            return;
        };
        let Some(words) = header_words(&m) else {
            return;
        };
        let node = words[word];
        if node != 0 {
            line(std::ptr::without_provenance::<u8>(node.wrapping_add(key)));
            line(std::ptr::without_provenance::<u8>(node.wrapping_add(val)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_layout_points_at_the_first_key_and_value_of_any_small_map() {
        let (word, key, val) = map_layout().expect("a three-word B-tree map header");
        for n in [1_usize, 3, 11] {
            let mut m = rhai::Map::new();
            for i in 0..n {
                m.insert(format!("f{i}").into(), Dynamic::from_int(i as i64));
            }
            let node = header_words(&m).expect("header")[word];
            assert_eq!(node + key, std::ptr::from_ref(m.keys().next().expect("a key")).addr());
            assert_eq!(node + val, std::ptr::from_ref(m.values().next().expect("a value")).addr());
        }
        // Hints for anything else are harmless: they are never read through.
        let p = RecordPrefetch::new();
        p.ahead(Some(&Dynamic::from_int(1)), Some(&Dynamic::UNIT));
        p.ahead(None, Some(&Dynamic::from_map(rhai::Map::new())));
    }
}
