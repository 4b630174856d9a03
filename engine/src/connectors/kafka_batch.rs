//! Batch reads for the `kafka` source: the messages of the partitions a consumer reads, routed
//! to a queue of their own and taken off it up to a batch per call
//! (`rd_kafka_consume_batch_queue`), where `rdkafka`'s `BaseConsumer::poll` takes one event
//! per call (a lock, a wake-up check, three clock reads and an `Arc` per message). The
//! consumer's own queue keeps librdkafka's events (statistics, errors), served by
//! `BaseConsumer::poll` as before.
//!
//! This is the only `unsafe` code of Weir: a few calls into librdkafka's C API, which the
//! `rdkafka` crate does not wrap. Each block states why it is sound; the invariants are:
//! - the queue handles are created from, and never outlive, the consumer they belong to
//!   ([`MessageQueue`] holds an `Arc` of it and destroys its handles first);
//! - a message pointer comes from `rd_kafka_consume_batch_queue`, is read only while its
//!   [`Taken`] batch is alive (borrows end with it) and destroyed exactly once, when it drops.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// A librdkafka queue the messages of some partitions of one consumer are forwarded to.
pub struct MessageQueue<C: ConsumerContext + 'static> {
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// The partition queues forwarded here (un-forwarded and released on drop).
    routed: Vec<NonNull<rd::rd_kafka_queue_t>>,
    /// The pointers of the last batch taken (reused; empty between batches).
    buffer: Vec<*mut rd::rd_kafka_message_t>,
    /// Keeps the client alive as long as any handle of it.
    consumer: Arc<BaseConsumer<C>>,
}

// SAFETY: librdkafka's queues are thread-safe (every operation takes the queue's lock), and
// the handles are only used through `&mut self` or `&self` calls that librdkafka documents as
// callable from any thread. Nothing here is tied to the thread that created it.
unsafe impl<C: ConsumerContext + 'static> Send for MessageQueue<C> {}

impl<C: ConsumerContext + 'static> MessageQueue<C> {
    /// A new, empty queue of `consumer`.
    pub fn new(consumer: Arc<BaseConsumer<C>>) -> Option<Self> {
        // SAFETY: the client pointer is valid while `consumer` lives, and the new queue is
        // destroyed (in `drop`) before this struct releases its `Arc` of the consumer.
        let queue = NonNull::new(unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) })?;
        Some(Self {
            queue,
            routed: Vec::new(),
            buffer: Vec::new(),
            consumer,
        })
    }

    /// The consumer.
    pub fn consumer(&self) -> &BaseConsumer<C> {
        &self.consumer
    }

    /// Routes the messages of `topic` partition `partition` to this queue. Call it before the
    /// partition is assigned: librdkafka keeps an application's forwarding when it starts
    /// fetching. Returns false if librdkafka has no queue for it (its messages then arrive
    /// through `BaseConsumer::poll` as before).
    pub fn route(&mut self, topic: &str, partition: i32) -> bool {
        let Ok(name) = CString::new(topic) else {
            return false;
        };
        // SAFETY: the client pointer is valid (see `new`); `name` is a NUL-terminated string
        // that outlives the call. The returned handle is ours to destroy (in `drop`).
        let pq = unsafe {
            rd::rd_kafka_queue_get_partition(
                self.consumer.client().native_ptr(),
                name.as_ptr(),
                partition,
            )
        };
        let Some(pq) = NonNull::new(pq) else {
            return false;
        };
        // SAFETY: both handles are valid; forwarding takes its own reference on the target.
        unsafe { rd::rd_kafka_queue_forward(pq.as_ptr(), self.queue.as_ptr()) };
        self.routed.push(pq);
        true
    }

    /// Takes at most `max` messages that are ready now (never waits).
    pub fn take(&mut self, max: usize) -> Taken<'_> {
        let buffer = &mut self.buffer;
        buffer.clear();
        buffer.reserve(max);
        // SAFETY: the queue is valid; librdkafka writes at most `max` pointers into the
        // buffer's spare capacity (at least `max`) and returns how many, or -1 on error.
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(self.queue.as_ptr(), 0, buffer.as_mut_ptr(), max)
        };
        let n = usize::try_from(n).unwrap_or(0).min(max);
        // SAFETY: librdkafka initialised the first `n` elements (valid message pointers).
        unsafe { buffer.set_len(n) };
        Taken { messages: buffer }
    }
}

impl<C: ConsumerContext + 'static> Drop for MessageQueue<C> {
    fn drop(&mut self) {
        for pq in self.routed.drain(..) {
            // SAFETY: `pq` is a valid handle we own; un-forwarding first leaves the
            // partition's messages with librdkafka, which the consumer's close then drops.
            unsafe {
                rd::rd_kafka_queue_forward(pq.as_ptr(), std::ptr::null_mut());
                rd::rd_kafka_queue_destroy(pq.as_ptr());
            }
        }
        // SAFETY: the handle is valid and destroyed once; the consumer is still alive (our
        // `Arc` is released after this).
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) };
    }
}

/// Messages taken off a [`MessageQueue`], destroyed when this drops.
pub struct Taken<'q> {
    messages: &'q mut Vec<*mut rd::rd_kafka_message_t>,
}

impl Taken<'_> {
    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The messages, in the order librdkafka queued them (per partition, by offset).
    pub fn iter(&self) -> impl Iterator<Item = RawMessage<'_>> {
        self.messages.iter().map(|m| {
            // SAFETY: every pointer is a live message from `take`, destroyed only when `self`
            // drops, which the returned borrow cannot outlive.
            RawMessage(unsafe { &**m })
        })
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        for m in self.messages.drain(..) {
            // SAFETY: each message was returned by `rd_kafka_consume_batch_queue` and is
            // destroyed exactly once, here; no borrow of it outlives `self`.
            unsafe { rd::rd_kafka_message_destroy(m) };
        }
    }
}

/// One message of a [`Taken`] batch.
#[derive(Clone, Copy)]
pub struct RawMessage<'a>(&'a rd::rd_kafka_message_t);

/// A `(pointer, length)` of librdkafka as a slice (`None` for a null pointer).
///
/// # Safety
/// `ptr` must be null or point at `len` readable bytes that live at least as long as `'a`.
unsafe fn bytes<'a>(ptr: *const c_void, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: the caller's contract.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
    }
}

impl<'a> RawMessage<'a> {
    /// The error librdkafka reports in place of a message, if this is one.
    pub fn error(&self) -> Option<KafkaError> {
        if self.0.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        let code = RDKafkaErrorCode::from(self.0.err);
        (code != RDKafkaErrorCode::NoError).then_some(KafkaError::MessageConsumption(code))
    }

    /// An identity of the message's topic handle: equal for messages of the same topic of
    /// one consumer (to skip looking the name up again).
    pub fn topic_id(&self) -> usize {
        self.0.rkt as usize
    }
}

/// What a source reads of a consumed message: one of a [`Taken`] batch, or `rdkafka`'s own
/// (from the consumer's poll; implemented where that is used).
pub trait Incoming {
    /// The topic's name (empty if librdkafka gave none).
    fn topic(&self) -> &str;
    /// The partition.
    fn partition(&self) -> i32;
    /// The offset.
    fn offset(&self) -> i64;
    /// The value (`None`: a tombstone).
    fn payload(&self) -> Option<&[u8]>;
    /// The key.
    fn key(&self) -> Option<&[u8]>;
    /// The timestamp in milliseconds since the epoch, if the message has one.
    fn timestamp_ms(&self) -> Option<i64>;
    /// The headers, in order (a header without a value has `None`).
    fn headers(&self) -> Vec<(&str, Option<&[u8]>)>;
}

impl Incoming for RawMessage<'_> {
    fn topic(&self) -> &str {
        if self.0.rkt.is_null() {
            return "";
        }
        // SAFETY: a message holds a reference on its topic, whose name is a NUL-terminated
        // string that lives as long as the topic.
        let name: *const c_char = unsafe { rd::rd_kafka_topic_name(self.0.rkt) };
        if name.is_null() {
            return "";
        }
        // SAFETY: as above.
        unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("")
    }

    fn partition(&self) -> i32 {
        self.0.partition
    }

    fn offset(&self) -> i64 {
        self.0.offset
    }

    fn payload(&self) -> Option<&[u8]> {
        // SAFETY: librdkafka's message owns `len` bytes at `payload` while it lives.
        unsafe { bytes(self.0.payload, self.0.len) }
    }

    fn key(&self) -> Option<&[u8]> {
        // SAFETY: as for the payload.
        unsafe { bytes(self.0.key, self.0.key_len) }
    }

    fn timestamp_ms(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: the message is valid; `kind` is a valid place to write the type to.
        let ms = unsafe { rd::rd_kafka_message_timestamp(self.0, &raw mut kind) };
        (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && ms >= 0)
            .then_some(ms)
    }

    fn headers(&self) -> Vec<(&str, Option<&[u8]>)> {
        let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: the message is valid; librdkafka parses its headers (once, kept in the
        // message) and writes a pointer owned by the message.
        let err = unsafe { rd::rd_kafka_message_headers(self.0, &raw mut hdrs) };
        let mut out = Vec::new();
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || hdrs.is_null() {
            return out;
        }
        for idx in 0.. {
            let mut name: *const c_char = std::ptr::null();
            let mut value: *const c_void = std::ptr::null();
            let mut size = 0usize;
            // SAFETY: `hdrs` is the message's header list; the out-pointers are valid places.
            // Names and values stay owned by the message.
            let err = unsafe {
                rd::rd_kafka_header_get_all(hdrs, idx, &raw mut name, &raw mut value, &raw mut size)
            };
            if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
                break;
            }
            // SAFETY: a NUL-terminated name and `size` value bytes, owned by the message.
            let key = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
            out.push((key, unsafe { bytes(value, size) }));
        }
        out
    }
}
