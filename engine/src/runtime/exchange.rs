//! Exchanges: how one upstream subtask sends batches along one plan edge to the downstream
//! subtasks (forward, hash by key group, rebalance, broadcast). Barriers, watermarks and
//! end-of-stream go to every downstream subtask, whatever the partitioning. An output also
//! notes how long it waited for room in a full channel (backpressure), which the task reads
//! once per batch. With unaligned checkpoints, a barrier also goes on each channel's priority
//! lane, ahead of the queued records (a savepoint's only as a notice: it is aligned in band).
//!
//! An output has a small queue of its own in front of its channels (Flink's "overdraft"):
//! what does not fit into a full channel waits there, in order. The blocking methods
//! ([`Output::send`], [`Output::barrier`], [`Output::watermark`], [`Output::end`]) return once
//! everything queued is in the channels. The task loop uses the others:
//! [`Output::send_overdraft`] waits only while the queue holds more than
//! [`OVERDRAFT`] messages per target, [`Output::queue_barrier`] and
//! [`Output::queue_watermark`] never wait, and the loop empties the queue with
//! [`Output::flush`] before it reads new input, while still reading its priority lanes and
//! commands. So a task under backpressure waits between two batches, not in the middle of
//! one, and can take an unaligned checkpoint while it waits: its state then covers every
//! record it processed, and what its outputs still queue goes downstream before the in-band
//! barrier, where the receivers record it as channel state.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{Sender, UnboundedSender};
use tokio::sync::mpsc::error::TrySendError;

use crate::base::error::{Result, RunError};
use crate::base::message::{BATCH_SIZE, Barrier, Batch, Message, Pending, Watermark};
use crate::plan::Partitioning;
use crate::record::subtask_for_key_group;

/// Messages per target an output may queue beyond its full channels before
/// [`Output::send_overdraft`] waits: room for one batch's output, so that a task waits for
/// room between batches rather than in the middle of one (except when a batch expands).
pub const OVERDRAFT: usize = 2;

/// One downstream subtask's input channel (owned by this sender alone).
#[derive(Clone, Debug)]
pub struct Target {
    /// The channel.
    pub sender: Sender<Message>,
    /// With unaligned checkpoints, the channel's priority lane: a checkpoint barrier is
    /// announced there first, ahead of the records queued in the channel.
    pub priority: Option<UnboundedSender<Barrier>>,
}

impl Target {
    /// A target without a priority lane (aligned checkpoints).
    pub fn new(sender: Sender<Message>) -> Self {
        Self {
            sender,
            priority: None,
        }
    }
}

/// The sending side of one edge for one upstream subtask.
pub struct Output {
    partitioning: Partitioning,
    targets: Vec<Target>,
    max_parallelism: u32,
    next: usize,
    pipeline: std::sync::Arc<str>,
    element: std::sync::Arc<str>,
    /// Time spent waiting for room in a full channel since the last [`Output::take_blocked`].
    blocked: Duration,
    /// Messages (and their target) that did not fit into their channel yet, oldest first.
    queue: VecDeque<(usize, Message)>,
}

impl Output {
    /// An output over `targets` (all downstream subtasks, or the one forward partner).
    pub fn new(
        partitioning: Partitioning,
        targets: Vec<Target>,
        max_parallelism: u32,
        pipeline: std::sync::Arc<str>,
        element: std::sync::Arc<str>,
    ) -> Self {
        Self {
            partitioning,
            targets,
            max_parallelism,
            next: 0,
            pipeline,
            element,
            blocked: Duration::ZERO,
            queue: VecDeque::new(),
        }
    }

    /// Puts `message` for target `t` into its channel when nothing is queued before it and
    /// the channel has room, else at the end of the queue. Never waits.
    fn enqueue(&mut self, t: usize, message: Message) -> Result<()> {
        if !self.queue.is_empty() {
            self.queue.push_back((t, message));
            return Ok(());
        }
        match self.targets[t].sender.try_send(message) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(message)) => {
                self.queue.push_back((t, message));
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(self.disconnected()),
        }
    }

    /// Moves the oldest queued message into its channel, waiting for room (the wait is added
    /// to the blocked time), and then every following one that fits without waiting.
    /// Cancel-safe: dropped while it waits, it leaves the queue as it was.
    async fn flush_front(&mut self) -> Result<()> {
        let Some(&(t, _)) = self.queue.front() else {
            return Ok(());
        };
        let waiting = Instant::now();
        let reserved = self.targets[t].sender.reserve().await;
        self.blocked += waiting.elapsed();
        match reserved {
            Ok(permit) => {
                if let Some((_, message)) = self.queue.pop_front() {
                    permit.send(message);
                }
            }
            Err(_) => return Err(self.disconnected()),
        }
        while let Some((t, message)) = self.queue.pop_front() {
            match self.targets[t].sender.try_send(message) {
                Ok(()) => {}
                Err(TrySendError::Full(message)) => {
                    self.queue.push_front((t, message));
                    break;
                }
                Err(TrySendError::Closed(_)) => return Err(self.disconnected()),
            }
        }
        Ok(())
    }

    /// Waits until everything queued is in the channels. Cancel-safe (see
    /// [`Self::flush_front`]): what is not sent stays queued, in order.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn flush(&mut self) -> Result<()> {
        while !self.queue.is_empty() {
            self.flush_front().await?;
        }
        Ok(())
    }

    /// Whether messages wait in the output's own queue for room in a channel.
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Waits until the queue holds at most [`OVERDRAFT`] messages per target.
    async fn flush_to_overdraft(&mut self) -> Result<()> {
        let limit = OVERDRAFT * self.targets.len().max(1);
        while self.queue.len() > limit {
            self.flush_front().await?;
        }
        Ok(())
    }

    fn disconnected(&self) -> RunError {
        RunError::Disconnected {
            pipeline: self.pipeline.to_string(),
            element: self.element.to_string(),
        }
    }

    /// The time spent waiting for room downstream since the last call.
    pub fn take_blocked(&mut self) -> Duration {
        std::mem::take(&mut self.blocked)
    }

    /// Sends a batch, waiting while the receiving channel is full (backpressure), until it
    /// and everything queued before it are in the channels. A batch of more than
    /// [`BATCH_SIZE`] records goes in pieces of that size, so that a channel's capacity bounds
    /// the records it holds.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn send(&mut self, batch: Batch) -> Result<()> {
        self.send_overdraft(batch).await?;
        self.flush().await
    }

    /// Sends a batch like [`Self::send`], but returns as soon as at most [`OVERDRAFT`]
    /// messages per target wait in the output's queue; the caller empties it later with
    /// [`Self::flush`]. Memory stays bounded: a batch of more than [`BATCH_SIZE`] records
    /// goes in pieces, each waiting for the queue to shrink to the overdraft first.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn send_overdraft(&mut self, batch: Batch) -> Result<()> {
        if batch.is_empty() || self.targets.is_empty() {
            return Ok(());
        }
        if batch.len() <= BATCH_SIZE {
            self.route(batch)?;
            return self.flush_to_overdraft().await;
        }
        let mut rest = Pending::new(batch);
        while !rest.is_empty() {
            self.route(rest.take(BATCH_SIZE))?;
            self.flush_to_overdraft().await?;
        }
        Ok(())
    }

    /// Splits a batch of at most [`BATCH_SIZE`] records among the targets as the
    /// partitioning says and queues the pieces (never waits).
    fn route(&mut self, batch: Batch) -> Result<()> {
        let n = self.targets.len();
        match self.partitioning {
            _ if n == 1 => self.enqueue(0, Message::Records(batch)),
            Partitioning::Forward => self.enqueue(0, Message::Records(batch)),
            Partitioning::Rebalance => {
                let t = self.next;
                self.next = (self.next + 1) % n;
                self.enqueue(t, Message::Records(batch))
            }
            Partitioning::Broadcast => {
                for t in 0..n - 1 {
                    self.enqueue(t, Message::Records(batch.clone()))?;
                }
                self.enqueue(n - 1, Message::Records(batch))
            }
            Partitioning::Hash if !batch.is_keyed() => {
                // Not keyed (a wiring bug upstream): keep the stream flowing evenly.
                let t = self.next;
                self.next = (self.next + 1) % n;
                self.enqueue(t, Message::Records(batch))
            }
            Partitioning::Hash => {
                let per = batch.len() / n + 16;
                let timed = batch.has_times();
                let mut parts: Vec<Batch> = (0..n)
                    .map(|_| Batch {
                        records: Vec::with_capacity(per),
                        keys: Vec::with_capacity(per),
                        times: Vec::with_capacity(if timed { per } else { 0 }),
                    })
                    .collect();
                let p = n as u32;
                let mut times = batch.times.into_iter().filter(|_| timed);
                for (r, k) in batch.records.into_iter().zip(batch.keys) {
                    let kg = k.key_group(self.max_parallelism);
                    let t = subtask_for_key_group(kg, p, self.max_parallelism) as usize;
                    parts[t].records.push(r);
                    parts[t].keys.push(k);
                    if let Some(time) = times.next() {
                        parts[t].times.push(time);
                    }
                }
                for (t, part) in parts.into_iter().enumerate() {
                    if !part.is_empty() {
                        self.enqueue(t, Message::Records(part))?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Sends a barrier to every target (after every record sent before it) and waits until
    /// it is in every channel. A barrier is first announced on every target's priority lane,
    /// when it has one: a checkpoint's reaches the receiver ahead of the records queued in
    /// the channel, which then become channel state of the checkpoint (unaligned
    /// checkpoints); a savepoint's is only a notice (a savepoint is aligned in band), which
    /// keeps the receiver from taking a newer checkpoint unaligned ahead of it.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn barrier(&mut self, barrier: Barrier) -> Result<()> {
        self.queue_barrier(barrier)?;
        self.flush().await
    }

    /// [`Self::barrier`] without waiting: the priority lanes get it now, the channels after
    /// what is queued before it (see [`Self::flush`]).
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub fn queue_barrier(&mut self, barrier: Barrier) -> Result<()> {
        for t in &self.targets {
            if let Some(p) = &t.priority {
                // A closed lane means a stopped receiver; the in-band send says so.
                let _ = p.send(barrier);
            }
        }
        for t in 0..self.targets.len() {
            self.enqueue(t, Message::Barrier(barrier))?;
        }
        Ok(())
    }

    /// Sends a watermark to every target, whatever the partitioning (after every record
    /// sent before it), and waits until it is in every channel: each downstream subtask
    /// combines the watermarks of all its inputs.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn watermark(&mut self, watermark: Watermark) -> Result<()> {
        self.queue_watermark(watermark)?;
        self.flush().await
    }

    /// [`Self::watermark`] without waiting (see [`Self::flush`]).
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub fn queue_watermark(&mut self, watermark: Watermark) -> Result<()> {
        for t in 0..self.targets.len() {
            self.enqueue(t, Message::Watermark(watermark))?;
        }
        Ok(())
    }

    /// Sends end-of-stream to every target, after everything queued.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn end(&mut self) -> Result<()> {
        for t in 0..self.targets.len() {
            self.enqueue(t, Message::EndOfStream)?;
        }
        self.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::message::BarrierKind;
    use crate::record::Key;
    use rhai::Dynamic;

    #[tokio::test]
    async fn a_hash_exchange_routes_each_event_time_with_its_record() {
        let (senders, mut receivers): (Vec<_>, Vec<_>) =
            (0..3).map(|_| tokio::sync::mpsc::channel(4)).unzip();
        let targets = senders
            .into_iter()
            .map(|sender| Target {
                sender,
                priority: None,
            })
            .collect();
        let mut out = Output::new(Partitioning::Hash, targets, 128, "p".into(), "e".into());
        let mut batch = Batch::new((0..200_i64).map(Dynamic::from).collect());
        batch.keys = (0..200_i64).map(|i| Key::from_dynamic(&Dynamic::from(i))).collect();
        batch.times = (0..200_i64).map(|i| 5000 + i).collect();
        out.send(batch).await.expect("send");
        let mut seen = 0;
        for r in &mut receivers {
            while let Ok(Message::Records(part)) = r.try_recv() {
                assert!(part.has_times());
                for (record, time) in part.records.iter().zip(&part.times) {
                    assert_eq!(record.as_int().expect("int") + 5000, *time);
                    seen += 1;
                }
            }
        }
        assert_eq!(seen, 200);
    }

    #[tokio::test]
    async fn a_full_channel_queues_in_the_overdraft_and_a_barrier_still_goes_ahead() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let (lane_tx, mut lane_rx) = tokio::sync::mpsc::unbounded_channel();
        let target = Target {
            sender: tx,
            priority: Some(lane_tx),
        };
        let mut out = Output::new(Partitioning::Forward, vec![target], 128, "p".into(), "e".into());
        let batch = |v: i64| Batch::new(vec![Dynamic::from(v)]);
        // The channel takes one; the overdraft holds OVERDRAFT more without waiting.
        for v in 0..=OVERDRAFT as i64 {
            out.send_overdraft(batch(v)).await.expect("no wait");
        }
        assert!(out.has_queued());
        let b = Barrier {
            checkpoint: 7,
            kind: BarrierKind::Checkpoint,
        };
        out.queue_barrier(b).expect("queued");
        assert_eq!(lane_rx.try_recv().ok(), Some(b), "announced at once");
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(m) = rx.recv().await {
                got.push(match m {
                    Message::Records(b) => b.records[0].as_int().expect("int"),
                    Message::Barrier(b) => -(b.checkpoint as i64),
                    _ => break,
                });
            }
            got
        });
        out.end().await.expect("flushed");
        assert!(!out.has_queued());
        drop(out);
        let mut want: Vec<i64> = (0..=OVERDRAFT as i64).collect();
        want.push(-7);
        assert_eq!(reader.await.expect("reader"), want, "in band, in order, barrier last");
    }
}
