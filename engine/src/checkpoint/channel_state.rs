//! Channel state of unaligned checkpoints (ARCHITECTURE.md 5.2 and 6, "Unaligned
//! checkpoints"): the in-flight records a barrier overtook, recorded by the receiving subtask,
//! stored beside its snapshot and replayed, before any new input, when it restores.
//!
//! A subtask that snapshots checkpoint *n* unaligned (at the first barrier *n* it sees, which
//! overtook the records queued in front of it) records, per input, every record and watermark
//! it reads after the snapshot and before that input's in-band barrier *n* (or its end of
//! stream): exactly the messages its upstream sent before its own snapshot that this snapshot
//! has not seen. [`ChannelLog`] does that counting; [`encode`] and [`decode`] give the bytes a
//! checkpoint stores (versioned); [`share`] picks what one subtask replays after a change of
//! parallelism (keyed records by key group, as keyed state; other records old subtask `j` to
//! new subtask `j % parallelism`, as operator list state; watermarks are dropped then, the
//! restored operators start from their recorded watermarks).
//!
//! The sender's side has no channel state of its own. A task snapshots only between two
//! batches (never with records half-way through its chain), and what its outputs still queue
//! for full channels then (`runtime::exchange`, the output's overdraft) was produced before
//! its snapshot: it goes downstream *before* the in-band barrier, while the barrier itself
//! overtakes it on the priority lanes. So the receiver records those records as its input
//! channel state, exactly like the records already in the channel, and the sender neither
//! stores nor resends them: each record is either before the in-band barrier (reflected in
//! the sender's snapshot and recorded by the receiver, or processed by the receiver before
//! its own snapshot) or after it (produced again by the restored sender), never both.
//!
//! This module is pure: it never reads channels, files or operators.

use rhai::Dynamic;
use serde::{Deserialize, Serialize};

use super::CheckpointId;
use crate::base::error::{Result, RunError};
use crate::base::message::{Batch, Message, Watermark};
use crate::record::{Key, KeyGroupRange, decode as decode_value, encode as encode_value};

/// The version of the channel-state encoding written by this build.
pub const CHANNEL_STATE_VERSION: u32 = 1;

/// One message a barrier overtook on input `input`.
#[derive(Clone, Debug)]
pub enum ChannelEntry {
    /// Records (with their keys when the input is keyed).
    Records {
        /// The input channel they came on.
        input: u32,
        /// The records.
        batch: Batch,
    },
    /// A watermark, kept in order with the records around it.
    Watermark {
        /// The input channel it came on.
        input: u32,
        /// The watermark.
        watermark: Watermark,
    },
}

/// What an unaligned snapshot still records: the inputs whose in-band barrier has not come
/// yet, and the messages read from them since the snapshot.
///
/// Call order: [`record`](Self::record) for every message read while the log is open, then
/// [`on_barrier`](Self::on_barrier) / [`on_end`](Self::on_end) as inputs deliver their barrier
/// or end; the log is complete when [`is_complete`](Self::is_complete) says so.
#[derive(Debug)]
pub struct ChannelLog {
    checkpoint: CheckpointId,
    /// `waiting[i]`: input `i` still logs.
    waiting: Vec<bool>,
    entries: Vec<ChannelEntry>,
}

impl ChannelLog {
    /// A log for checkpoint `checkpoint`, recording the inputs for which `waiting` is true.
    pub fn new(checkpoint: CheckpointId, waiting: Vec<bool>) -> Self {
        Self {
            checkpoint,
            waiting,
            entries: Vec::new(),
        }
    }

    /// The checkpoint it records for.
    pub fn checkpoint(&self) -> CheckpointId {
        self.checkpoint
    }

    /// Whether messages from `input` are recorded.
    pub fn is_logging(&self, input: u32) -> bool {
        self.waiting.get(input as usize).copied().unwrap_or(false)
    }

    /// Records a message read from `input` (records and watermarks; anything else is not
    /// channel state). Inputs that no longer log are ignored.
    pub fn record(&mut self, input: u32, message: &Message) {
        if !self.is_logging(input) {
            return;
        }
        match message {
            Message::Records(batch) if !batch.is_empty() => {
                self.entries.push(ChannelEntry::Records {
                    input,
                    batch: batch.clone(),
                });
            }
            Message::Watermark(w) => self.entries.push(ChannelEntry::Watermark {
                input,
                watermark: *w,
            }),
            _ => {}
        }
    }

    /// Input `input` delivered in-band barrier `id`: at or past this log's checkpoint, the
    /// input's channel state is complete.
    pub fn on_barrier(&mut self, input: u32, id: CheckpointId) {
        if id >= self.checkpoint
            && let Some(w) = self.waiting.get_mut(input as usize)
        {
            *w = false;
        }
    }

    /// Input `input` ended: nothing more comes on it, its channel state is complete.
    pub fn on_end(&mut self, input: u32) {
        if let Some(w) = self.waiting.get_mut(input as usize) {
            *w = false;
        }
    }

    /// Whether every input's channel state is complete.
    pub fn is_complete(&self) -> bool {
        !self.waiting.iter().any(|&w| w)
    }

    /// The recorded messages, in the order they were read.
    pub fn into_entries(self) -> Vec<ChannelEntry> {
        self.entries
    }
}

#[derive(Serialize, Deserialize)]
struct Encoded {
    version: u32,
    entries: Vec<EncodedEntry>,
}

#[derive(Serialize, Deserialize)]
enum EncodedEntry {
    /// Records and their keys (as values; empty when unkeyed).
    Records {
        input: u32,
        records: Vec<Dynamic>,
        keys: Vec<Dynamic>,
    },
    /// A watermark: `None` for idle.
    Watermark { input: u32, at: Option<i64> },
}

/// The bytes a checkpoint stores for one subtask's channel state.
///
/// # Errors
/// A record that cannot be serialized.
pub fn encode(entries: &[ChannelEntry]) -> Result<Vec<u8>> {
    let entries = entries
        .iter()
        .map(|e| match e {
            ChannelEntry::Records { input, batch } => EncodedEntry::Records {
                input: *input,
                records: batch.records.clone(),
                keys: batch.keys.iter().map(Key::to_dynamic).collect(),
            },
            ChannelEntry::Watermark { input, watermark } => EncodedEntry::Watermark {
                input: *input,
                at: match watermark {
                    Watermark::At(t) => Some(*t),
                    Watermark::Idle => None,
                },
            },
        })
        .collect();
    encode_value(&Encoded {
        version: CHANNEL_STATE_VERSION,
        entries,
    })
    .map_err(|e| RunError::State(format!("cannot encode channel state: {e}")))
}

/// Reads bytes written by [`encode`].
///
/// # Errors
/// [`RunError::StateCorrupt`] for bytes that do not decode or another version.
pub fn decode(bytes: &[u8]) -> Result<Vec<ChannelEntry>> {
    let encoded: Encoded = decode_value(bytes)
        .map_err(|e| RunError::StateCorrupt(format!("cannot decode channel state: {e}")))?;
    if encoded.version != CHANNEL_STATE_VERSION {
        return Err(RunError::StateCorrupt(format!(
            "channel state version {} (this build reads {CHANNEL_STATE_VERSION})",
            encoded.version
        )));
    }
    Ok(encoded
        .entries
        .into_iter()
        .map(|e| match e {
            EncodedEntry::Records {
                input,
                records,
                keys,
            } => ChannelEntry::Records {
                input,
                batch: Batch {
                    records,
                    keys: keys.iter().map(Key::from_dynamic).collect(),
                    // Not stored: a window reads a replayed record's time from its field.
                    times: Vec::new(),
                },
            },
            EncodedEntry::Watermark { input, at } => ChannelEntry::Watermark {
                input,
                watermark: at.map_or(Watermark::Idle, Watermark::At),
            },
        })
        .collect())
}

/// What new subtask `subtask` of `parallelism` replays from the channel state of the old
/// subtasks (`(old subtask, entries)`, in old-subtask order) after a change of parallelism:
/// keyed records whose key group it owns, unkeyed records of old subtasks `j` with
/// `j % parallelism == subtask`. Watermarks are dropped (the restored operators start from
/// their recorded watermarks). The input index of a kept entry is 0: after a rescale the
/// inputs are numbered anew, and records reach the chain whatever input they came on.
pub fn share(
    old: Vec<(u32, Vec<ChannelEntry>)>,
    subtask: u32,
    parallelism: u32,
    max_parallelism: u32,
) -> Vec<ChannelEntry> {
    let range = KeyGroupRange::for_subtask(max_parallelism, parallelism, subtask);
    let mut out = Vec::new();
    for (j, entries) in old {
        for e in entries {
            let ChannelEntry::Records { batch, .. } = e else {
                continue;
            };
            let batch = if batch.is_keyed() {
                let mut kept = Batch::default();
                for (r, k) in batch.records.into_iter().zip(batch.keys) {
                    if range.contains(k.key_group(max_parallelism)) {
                        kept.records.push(r);
                        kept.keys.push(k);
                    }
                }
                kept
            } else if j % parallelism.max(1) == subtask {
                batch
            } else {
                continue;
            };
            if !batch.is_empty() {
                out.push(ChannelEntry::Records { input: 0, batch });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(values: &[i64]) -> Message {
        Message::Records(Batch::new(values.iter().map(|&v| Dynamic::from(v)).collect()))
    }

    fn keyed(values: &[&str]) -> Batch {
        Batch {
            times: Vec::new(),
            records: values.iter().map(|&v| Dynamic::from(v.to_owned())).collect(),
            keys: values
                .iter()
                .map(|&v| Key::from_dynamic(&Dynamic::from(v.to_owned())))
                .collect(),
        }
    }

    fn ints(entries: &[ChannelEntry]) -> Vec<i64> {
        entries
            .iter()
            .filter_map(|e| match e {
                ChannelEntry::Records { batch, .. } => Some(batch),
                ChannelEntry::Watermark { .. } => None,
            })
            .flat_map(|b| b.records.iter().map(|r| r.as_int().expect("int")))
            .collect()
    }

    #[test]
    fn a_log_records_each_input_until_its_barrier_or_end() {
        let mut log = ChannelLog::new(5, vec![false, true, true]);
        log.record(0, &records(&[1]));
        log.record(1, &records(&[2]));
        log.record(2, &Message::Watermark(Watermark::At(10)));
        log.on_barrier(1, 4);
        assert!(log.is_logging(1), "an older barrier does not close the input");
        log.record(1, &records(&[3]));
        log.on_barrier(1, 5);
        log.record(1, &records(&[4]));
        assert!(!log.is_complete());
        log.record(2, &records(&[5]));
        log.on_end(2);
        log.record(2, &records(&[6]));
        assert!(log.is_complete());
        let entries = log.into_entries();
        assert_eq!(ints(&entries), vec![2, 3, 5]);
        assert!(matches!(
            entries[1],
            ChannelEntry::Watermark {
                input: 2,
                watermark: Watermark::At(10)
            }
        ));
    }

    #[test]
    fn a_log_without_waiting_inputs_is_complete_at_once() {
        let log = ChannelLog::new(1, vec![false, false]);
        assert!(log.is_complete());
        assert!(ChannelLog::new(1, Vec::new()).is_complete());
    }

    #[test]
    fn channel_state_round_trips_with_keys_and_watermarks() {
        let entries = vec![
            ChannelEntry::Records {
                input: 1,
                batch: keyed(&["a", "b"]),
            },
            ChannelEntry::Watermark {
                input: 0,
                watermark: Watermark::Idle,
            },
            ChannelEntry::Watermark {
                input: 1,
                watermark: Watermark::At(-3),
            },
        ];
        let back = decode(&encode(&entries).expect("encode")).expect("decode");
        assert_eq!(back.len(), 3);
        let ChannelEntry::Records { input, batch } = &back[0] else {
            panic!("records first");
        };
        assert_eq!(*input, 1);
        assert_eq!(batch.keys, keyed(&["a", "b"]).keys);
        assert_eq!(batch.records[1].clone().into_string().ok().as_deref(), Some("b"));
        assert!(matches!(
            back[1],
            ChannelEntry::Watermark {
                watermark: Watermark::Idle,
                ..
            }
        ));
        assert!(matches!(
            back[2],
            ChannelEntry::Watermark {
                watermark: Watermark::At(-3),
                ..
            }
        ));
        assert!(decode(b"nonsense").is_err());
    }

    #[test]
    fn rescaling_sends_keyed_records_by_key_group_and_the_rest_by_subtask_number() {
        let max = 128;
        let words: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        let old = |s: u32| {
            vec![
                (
                    0,
                    vec![
                        ChannelEntry::Records {
                            input: 0,
                            batch: keyed(&refs),
                        },
                        ChannelEntry::Watermark {
                            input: 0,
                            watermark: Watermark::At(1),
                        },
                    ],
                ),
                (
                    1,
                    vec![ChannelEntry::Records {
                        input: 2,
                        batch: Batch::new(vec![Dynamic::from(s as i64)]),
                    }],
                ),
                (
                    2,
                    vec![ChannelEntry::Records {
                        input: 1,
                        batch: Batch::new(vec![Dynamic::from(10 + s as i64)]),
                    }],
                ),
            ]
        };
        let p = 2;
        let mut keyed_seen = 0;
        let mut unkeyed = Vec::new();
        for s in 0..p {
            let mine = share(old(s), s, p, max);
            let range = KeyGroupRange::for_subtask(max, p, s);
            for e in &mine {
                let ChannelEntry::Records { input, batch } = e else {
                    panic!("watermarks are dropped on rescale");
                };
                assert_eq!(*input, 0);
                if batch.is_keyed() {
                    assert!(batch.keys.iter().all(|k| range.contains(k.key_group(max))));
                    keyed_seen += batch.len();
                } else {
                    unkeyed.extend(batch.records.iter().map(|r| r.as_int().expect("int")));
                }
            }
        }
        assert_eq!(keyed_seen, 200, "every keyed record goes to exactly one subtask");
        // Old subtask 1 goes to new subtask 1, old subtask 2 to new subtask 0.
        assert_eq!(unkeyed, vec![10, 1]);
    }
}
