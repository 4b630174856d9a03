//! Exchanges: how one upstream subtask sends batches along one plan edge to the downstream
//! subtasks (forward, hash by key group, rebalance, broadcast). Barriers, watermarks and
//! end-of-stream go to every downstream subtask, whatever the partitioning. An output also
//! notes how long it waited for room in a full channel (backpressure), which the task reads
//! once per batch. With unaligned checkpoints, a checkpoint barrier also goes on each
//! channel's priority lane, ahead of the queued records.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::{Sender, UnboundedSender};
use tokio::sync::mpsc::error::TrySendError;

use crate::base::error::{Result, RunError};
use crate::base::message::{BATCH_SIZE, Barrier, BarrierKind, Batch, Message, Pending, Watermark};
use crate::plan::Partitioning;
use crate::record::subtask_for_key_group;

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
        }
    }

    /// Sends `message` to target `t`; when its channel is full, waits for room and adds the
    /// wait to the blocked time (the clock is read only then).
    async fn send_to(&mut self, t: usize, message: Message) -> Result<()> {
        let sender = &self.targets[t].sender;
        let message = match sender.try_send(message) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(message)) => message,
            Err(TrySendError::Closed(_)) => return Err(self.disconnected()),
        };
        let waiting = Instant::now();
        let sent = sender.send(message).await;
        self.blocked += waiting.elapsed();
        sent.map_err(|_| self.disconnected())
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

    /// Sends a batch, waiting while the receiving channel is full (backpressure). A batch
    /// of more than [`BATCH_SIZE`] records goes in pieces of that size, so that a channel's
    /// capacity bounds the records it holds.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn send(&mut self, batch: Batch) -> Result<()> {
        if batch.is_empty() || self.targets.is_empty() {
            return Ok(());
        }
        if batch.len() <= BATCH_SIZE {
            return self.send_batch(batch).await;
        }
        let mut rest = Pending::new(batch);
        while !rest.is_empty() {
            self.send_batch(rest.take(BATCH_SIZE)).await?;
        }
        Ok(())
    }

    async fn send_batch(&mut self, batch: Batch) -> Result<()> {
        let n = self.targets.len();
        match self.partitioning {
            _ if n == 1 => self.send_to(0, Message::Records(batch)).await,
            Partitioning::Forward => self.send_to(0, Message::Records(batch)).await,
            Partitioning::Rebalance => {
                let t = self.next;
                self.next = (self.next + 1) % n;
                self.send_to(t, Message::Records(batch)).await
            }
            Partitioning::Broadcast => {
                for t in 0..n - 1 {
                    self.send_to(t, Message::Records(batch.clone())).await?;
                }
                self.send_to(n - 1, Message::Records(batch)).await
            }
            Partitioning::Hash if !batch.is_keyed() => {
                // Not keyed (a wiring bug upstream): keep the stream flowing evenly.
                let t = self.next;
                self.next = (self.next + 1) % n;
                self.send_to(t, Message::Records(batch)).await
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
                        self.send_to(t, Message::Records(part)).await?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Sends a barrier to every target (after every record sent before it). A checkpoint
    /// barrier (not a savepoint's) is first announced on every target's priority lane, when
    /// it has one: it reaches the receiver ahead of the records queued in the channel, which
    /// then become channel state of the checkpoint (unaligned checkpoints).
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn barrier(&mut self, barrier: Barrier) -> Result<()> {
        if barrier.kind == BarrierKind::Checkpoint {
            for t in &self.targets {
                if let Some(p) = &t.priority {
                    // A closed lane means a stopped receiver; the in-band send below says so.
                    let _ = p.send(barrier);
                }
            }
        }
        for t in 0..self.targets.len() {
            self.send_to(t, Message::Barrier(barrier)).await?;
        }
        Ok(())
    }

    /// Sends a watermark to every target, whatever the partitioning (after every record
    /// sent before it): each downstream subtask combines the watermarks of all its inputs.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn watermark(&mut self, watermark: Watermark) -> Result<()> {
        for t in 0..self.targets.len() {
            self.send_to(t, Message::Watermark(watermark)).await?;
        }
        Ok(())
    }

    /// Sends end-of-stream to every target.
    ///
    /// # Errors
    /// [`RunError::Disconnected`] when a receiver has stopped.
    pub async fn end(&mut self) -> Result<()> {
        for t in 0..self.targets.len() {
            self.send_to(t, Message::EndOfStream).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}

