//! The savepoint target: every decoder a restore runs over bytes read from a checkpoint or
//! savepoint directory, fed with snapshots written by the engine's own writers and then
//! damaged (truncated frames, lying counts and lengths, flipped bytes), plus raw bytes.
//!
//! The first byte of an input picks the decoder: the canonical keyed-state snapshot (read
//! entry by entry, then restored into the memory backend), one encoded state value, the
//! `_metadata` record, and a generator source's `.op` state.

use indexmap::IndexMap;
use rhai::Dynamic;
use weir_engine::base::message::BarrierKind;
use weir_engine::checkpoint::TaskId;
use weir_engine::checkpoint::metadata::{
    BackendKind, CheckpointMetadata, FileRef, KeyGroups, METADATA_FORMAT_VERSION, NodeType,
    OperatorInfo, Section, SubtaskState,
};
use weir_engine::connectors::Source;
use weir_engine::connectors::generator::GeneratorSource;
use weir_engine::record::{Key, KeyGroupRange};
use weir_engine::state::StateBackend;
use weir_engine::state::canonical::{SnapshotItem, SnapshotWriter, decode_value, read_snapshot};
use weir_engine::state::memory::MemoryBackend;
use weir_schema::StateKind;

use crate::{Rng, Target, bytes};

/// Key-group counts a pipeline may have (`max_parallelism`).
const GROUPS: &[u16] = &[1, 2, 16, 128, 1024, 32768];

const SNAPSHOT: u8 = 0;
const VALUE: u8 = 1;
const METADATA: u8 = 2;
const GENERATOR: u8 = 3;
const KINDS: u8 = 4;

/// The savepoint target.
#[derive(Default)]
pub struct Savepoint;

impl Savepoint {
    /// The target.
    pub fn new() -> Self {
        Self
    }
}

/// A random state value, sometimes nested deeper than the direct decoder goes.
fn value(rng: &mut Rng, depth: usize) -> Dynamic {
    match rng.below(if depth > 40 { 6 } else { 9 }) {
        0 => Dynamic::from_int(rng.next_u64() as i64),
        1 => Dynamic::from_int(rng.below(300) as i64 - 150),
        2 => Dynamic::from_float(f64::from_bits(rng.next_u64())),
        3 => Dynamic::from("é✓x".repeat(rng.small(200))),
        4 => Dynamic::from_bool(rng.chance(50)),
        5 => Dynamic::from_blob((0..rng.small(64)).map(|i| i as u8).collect()),
        6 | 7 => Dynamic::from_array(
            (0..rng.small(6))
                .map(|_| {
                    let deeper = depth + 1 + rng.below(8);
                    value(rng, deeper)
                })
                .collect(),
        ),
        _ => {
            let mut m = rhai::Map::new();
            for i in 0..rng.small(6) {
                let deeper = depth + 1 + rng.below(8);
                m.insert(format!("k{i}").into(), value(rng, deeper));
            }
            Dynamic::from_map(m)
        }
    }
}

fn snapshot(rng: &mut Rng, groups: u32) -> Vec<u8> {
    let states = rng.small(4) as u32;
    let mut w = SnapshotWriter::new(groups, states);
    for s in 0..states {
        let kind = *rng.pick(&[StateKind::Value, StateKind::List, StateKind::Map]);
        let name = if rng.chance(90) {
            format!("s{s}")
        } else {
            "é".repeat(rng.small(40))
        };
        if w.begin_state(&name, kind).is_err() {
            break;
        }
        for _ in 0..rng.small(40) {
            let key = Key::from_dynamic(&value(rng, 30));
            let kg = if rng.chance(95) {
                key.key_group(groups)
            } else {
                rng.next_u64() as u32
            };
            let _ = w.entry(kg, &key, &value(rng, 0));
        }
    }
    w.finish().unwrap_or_default()
}

fn metadata(rng: &mut Rng) -> Vec<u8> {
    let subtasks = (0..rng.small(4) as u32)
        .map(|i| SubtaskState {
            operator: format!("op{i}"),
            subtask: i,
            key_groups: KeyGroups { start: 0, end: 128 },
            files: (0..rng.small(3))
                .map(|f| FileRef::of(format!("chk-4/op{i}-{f}.op"), b"state"))
                .collect(),
            watermark: None,
        })
        .collect();
    let meta = CheckpointMetadata {
        format_version: METADATA_FORMAT_VERSION,
        pipeline: "p".into(),
        checkpoint: 4,
        kind: BarrierKind::Savepoint,
        config_hash: "0123456789abcdef".into(),
        max_parallelism: 128,
        backend: Some(BackendKind::Fs),
        operators: vec![OperatorInfo {
            id: "op0".into(),
            parallelism: 1,
            script_hash: None,
            node: Some(NodeType {
                section: Section::Operator,
                type_name: "process".into(),
            }),
            keyed_state: Some([("cnt".to_owned(), StateKind::Value)].into()),
            local_state: Some(false),
        }],
        subtasks,
        finished_tasks: vec![TaskId::new(0, 0)],
        finished_operators: vec![("op0".into(), 0)],
    };
    let mut bytes = meta.encode().unwrap_or_default();
    if rng.chance(50) {
        // Damage the JSON but keep the header true, so that the JSON decoder sees it.
        let newline = bytes.iter().position(|&b| b == b'\n').unwrap_or(0);
        let mut body = bytes.split_off(newline + 1);
        bytes::mutate(rng, &mut body, JSON_TOKENS);
        let header = format!(
            "weir-checkpoint-metadata v{METADATA_FORMAT_VERSION} len={} crc32={:08x}\n",
            body.len(),
            weir_engine::checkpoint::metadata::checksum(&body)
        );
        bytes = header.into_bytes();
        bytes.extend(body);
    } else {
        bytes::mutate(rng, &mut bytes, JSON_TOKENS);
    }
    bytes
}

const JSON_TOKENS: &[&[u8]] = &[
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b"\"",
    b":",
    b"null",
    b"1e999",
    b"-1",
    b"18446744073709551616",
    b"\"../../etc/passwd\"",
    b"\"/abs\"",
    b"\"shared/x\"",
    b"\\u0000",
    b"[[[[[[[[[[",
];

fn generator(groups: u8) -> Option<GeneratorSource> {
    let parallelism = u32::from(groups % 4) + 1;
    GeneratorSource::new(
        7,
        Some(1000),
        None,
        &IndexMap::new(),
        u32::from(groups / 4 % 4).min(parallelism - 1),
        parallelism,
    )
    .ok()
}

impl Target for Savepoint {
    fn name(&self) -> &'static str {
        "savepoint"
    }

    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let kind = rng.below(KINDS as usize) as u8;
        let groups = *rng.pick(GROUPS);
        let mut out = vec![kind];
        out.extend_from_slice(&groups.to_be_bytes());
        let mut body = match kind {
            SNAPSHOT => snapshot(rng, u32::from(groups)),
            VALUE => weir_engine::record::encode(&value(rng, 0)).unwrap_or_default(),
            METADATA => return [out, metadata(rng)].concat(),
            GENERATOR => {
                let mut g = generator(groups as u8);
                g.as_mut()
                    .and_then(|g| g.snapshot().ok())
                    .unwrap_or_default()
            }
            _ => Vec::new(),
        };
        if rng.chance(85) {
            bytes::mutate(rng, &mut body, &[]);
        } else if rng.chance(30) {
            body = bytes::random(rng, 512, &[]);
        }
        out.extend(body);
        out
    }

    fn run(&self, input: &[u8]) {
        let (Some(&kind), Some(groups)) = (input.first(), input.get(1..3)) else {
            return;
        };
        let groups = u32::from(u16::from_be_bytes([groups[0], groups[1]])).clamp(1, 32768);
        let body = &input[3..];
        match kind % KINDS {
            SNAPSHOT => {
                let _ = read_snapshot(body, groups, |item| {
                    if let SnapshotItem::Entry { value, .. } = item {
                        let _decoded = decode_value(value)?;
                    }
                    Ok(())
                });
                let mut memory = MemoryBackend::new(groups, KeyGroupRange::all(groups));
                let _ = memory.restore(&[body]);
                // A restored backend must snapshot again.
                let _ = memory.snapshot(KeyGroupRange::all(groups));
            }
            VALUE => {
                let _ = decode_value(body);
                let _ = weir_engine::record::decode::<Dynamic>(body);
            }
            METADATA => {
                let _ = CheckpointMetadata::decode("chk-4/_metadata", body);
            }
            _ => {
                if let Some(mut g) = generator(groups as u8) {
                    let _ = g.restore(body);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undamaged_inputs_decode() {
        let mut rng = Rng::for_input(5, 0);
        let bytes = snapshot(&mut rng, 128);
        assert!(read_snapshot(&bytes, 128, |_| Ok(())).is_ok());
        let meta = CheckpointMetadata {
            format_version: METADATA_FORMAT_VERSION,
            pipeline: "p".into(),
            checkpoint: 4,
            kind: BarrierKind::Savepoint,
            config_hash: "h".into(),
            max_parallelism: 128,
            backend: None,
            operators: Vec::new(),
            subtasks: Vec::new(),
            finished_tasks: Vec::new(),
            finished_operators: Vec::new(),
        };
        let encoded = meta.encode().expect("encodes");
        assert!(CheckpointMetadata::decode("chk-4/_metadata", &encoded).is_ok());
        let mut g = generator(0).expect("a generator");
        let state = g.snapshot().expect("a snapshot");
        assert!(generator(0).expect("a generator").restore(&state).is_ok());
    }
}
