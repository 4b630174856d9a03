//! The receiving side of a task: one bounded channel per upstream sender, read round-robin,
//! skipping inputs that the barrier aligner parked and inputs that ended. Keeping inputs
//! apart is what lets exactly-once alignment stop reading one input (its sender then blocks
//! on the full channel: backpressure, not buffering) while the others catch up. With
//! unaligned checkpoints each input also has a priority lane, read before any channel, on
//! which checkpoint barriers arrive ahead of the queued records; and while an unaligned
//! snapshot records an input's channel state, [`InputSet::recv_logging`] takes what arrives on
//! that input at once (to be recorded and buffered), even while the task reads no records.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use tokio::sync::mpsc::{Receiver, UnboundedReceiver};

use crate::base::message::{Barrier, Message};

/// Every input channel of one task.
#[derive(Debug)]
pub struct InputSet {
    receivers: Vec<Receiver<Message>>,
    /// Priority lanes, one per input (empty without unaligned checkpoints).
    priority: Vec<UnboundedReceiver<Barrier>>,
    /// Messages taken out of a channel ahead of time ([`InputSet::prefetch`]), served before
    /// the channel's own.
    buffered: Vec<VecDeque<Message>>,
    ended: Vec<bool>,
    next: usize,
}

/// What [`InputSet::recv`] produced.
#[derive(Debug)]
pub enum Received {
    /// A message from input `.0`.
    Message(u32, Message),
    /// A checkpoint barrier announced on an input's priority lane, ahead of the records
    /// queued in its channel (unaligned checkpoints).
    Priority(Barrier),
    /// A message from input `.0` that [`InputSet::prefetch`] took out of its channel earlier
    /// (and showed to its caller then).
    Prefetched(u32, Message),
    /// A message that arrived on input `.0`, which the caller records as channel state:
    /// taken out of the channel ahead of time, the caller keeps it with
    /// [`InputSet::buffer`] (it is served again later as [`Received::Prefetched`]).
    Logged(u32, Message),
    /// Input `.0`'s sender vanished without end-of-stream (its task died).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    Closed(u32),
}

impl InputSet {
    /// Inputs over these receivers, indexed as given.
    pub fn new(receivers: Vec<Receiver<Message>>) -> Self {
        let n = receivers.len();
        Self {
            receivers,
            priority: Vec::new(),
            buffered: (0..n).map(|_| VecDeque::new()).collect(),
            ended: vec![false; n],
            next: 0,
        }
    }

    /// The same inputs with priority lanes, indexed as the receivers.
    pub fn with_priority(mut self, lanes: Vec<UnboundedReceiver<Barrier>>) -> Self {
        self.priority = lanes;
        self
    }

    /// Number of inputs.
    pub fn len(&self) -> usize {
        self.receivers.len()
    }

    /// Whether the task has no inputs.
    #[cfg(any(test, feature = "testkit"))]
    pub fn is_empty(&self) -> bool {
        self.receivers.is_empty()
    }

    /// How full the input channels are together: messages queued over capacity, 0.0 to 1.0.
    pub fn fill(&self) -> f64 {
        let (queued, capacity) = self
            .receivers
            .iter()
            .fold((0usize, 0usize), |(q, c), r| (q + r.len(), c + r.max_capacity()));
        if capacity == 0 {
            0.0
        } else {
            queued as f64 / capacity as f64
        }
    }

    /// Whether every input delivered end-of-stream.
    pub fn all_ended(&self) -> bool {
        self.ended.iter().all(|&e| e)
    }

    /// Whether input `i` delivered end-of-stream (also in an earlier attempt of the task).
    pub fn ended(&self, i: usize) -> bool {
        self.ended.get(i).copied().unwrap_or(true)
    }

    /// Takes every message queued in input `i`'s channel into the task's own buffer for that
    /// input, without waiting, showing each to `keep_going` in order; stops after the first
    /// for which it returns false. The buffered messages are served by [`Self::recv`] (as
    /// [`Received::Prefetched`]) before anything newer of the input. Emptying the channel
    /// lets a sender blocked on it go on: an unaligned snapshot records the records its
    /// barrier overtook this way, without waiting for the task to process them.
    pub fn prefetch(&mut self, i: u32, mut keep_going: impl FnMut(&Message) -> bool) {
        let i = i as usize;
        if self.ended.get(i).copied().unwrap_or(true) {
            return;
        }
        // Empty or disconnected: `recv` reports a disconnection when it gets there.
        while let Ok(message) = self.receivers[i].try_recv() {
            let go = keep_going(&message);
            self.buffered[i].push_back(message);
            if !go {
                return;
            }
        }
    }

    /// The messages of input `i` taken out of its channel by [`Self::prefetch`] and not served
    /// yet, oldest first.
    pub fn buffered(&self, i: u32) -> impl Iterator<Item = &Message> {
        self.buffered.get(i as usize).into_iter().flatten()
    }

    /// Puts a message of input `i` that [`Received::Logged`] handed out back in front of the
    /// input's channel, behind what is buffered already.
    pub fn buffer(&mut self, i: u32, message: Message) {
        if let Some(b) = self.buffered.get_mut(i as usize) {
            b.push_back(message);
        }
    }

    /// Waits for the next message from an input that is neither ended nor `blocked`, taking
    /// inputs in turn so that none starves; a barrier on a priority lane of an input that has
    /// not ended comes first, blocked or not. An end-of-stream marks its input ended.
    /// Pending forever when every input is ended or blocked (the caller checks first).
    pub async fn recv(&mut self, blocked: impl Fn(u32) -> bool) -> Received {
        self.recv_logging(blocked, |_| false).await
    }

    /// [`Self::recv`], and, right after the priority lanes, a message that arrives on an
    /// input for which `logging` is true (blocked or not) comes out as [`Received::Logged`],
    /// to be recorded and then [buffered](Self::buffer) behind what is buffered already.
    pub async fn recv_logging(
        &mut self,
        blocked: impl Fn(u32) -> bool,
        logging: impl Fn(u32) -> bool,
    ) -> Received {
        poll_fn(|cx| {
            let n = self.receivers.len();
            for k in 0..self.priority.len() {
                let i = (self.next + k) % self.priority.len();
                if self.ended.get(i).copied().unwrap_or(true) {
                    continue;
                }
                if let Poll::Ready(Some(barrier)) = self.priority[i].poll_recv(cx) {
                    return Poll::Ready(Received::Priority(barrier));
                }
            }
            for i in 0..n {
                if self.ended[i] || !logging(i as u32) {
                    continue;
                }
                // A disconnection is reported by the ordinary read below.
                if let Poll::Ready(Some(message)) = self.receivers[i].poll_recv(cx) {
                    return Poll::Ready(Received::Logged(i as u32, message));
                }
            }
            for k in 0..n {
                let i = (self.next + k) % n;
                if self.ended[i] || blocked(i as u32) {
                    continue;
                }
                if let Some(message) = self.buffered[i].pop_front() {
                    self.next = (i + 1) % n;
                    if matches!(message, Message::EndOfStream) {
                        self.ended[i] = true;
                    }
                    return Poll::Ready(Received::Prefetched(i as u32, message));
                }
                match self.receivers[i].poll_recv(cx) {
                    Poll::Ready(Some(message)) => {
                        self.next = (i + 1) % n;
                        if matches!(message, Message::EndOfStream) {
                            self.ended[i] = true;
                        }
                        return Poll::Ready(Received::Message(i as u32, message));
                    }
                    Poll::Ready(None) => {
                        self.ended[i] = true;
                        return Poll::Ready(Received::Closed(i as u32));
                    }
                    Poll::Pending => {}
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Where a task's inputs live between attempts: a task takes them when it starts and a
/// [`InputLease`] puts them back when the task ends, panics or is aborted, so a restarted
/// task (failover `individual`) reads the same channels.
pub type InputSlot = Arc<Mutex<Option<InputSet>>>;

/// Inputs borrowed from an [`InputSlot`] for one task attempt.
#[derive(Debug)]
pub struct InputLease {
    inputs: Option<InputSet>,
    slot: InputSlot,
}

impl InputLease {
    /// Takes the inputs out of the slot; `None` when another attempt holds them.
    pub fn take(slot: &InputSlot) -> Option<Self> {
        let inputs = slot.lock().ok()?.take()?;
        Some(Self {
            inputs: Some(inputs),
            slot: Arc::clone(slot),
        })
    }

    /// The inputs.
    ///
    /// # Panics
    /// Never: the inputs are present until drop.
    pub fn get(&mut self) -> &mut InputSet {
        #[allow(clippy::expect_used)]
        self.inputs.as_mut().expect("inputs present until drop")
    }
}

impl Drop for InputLease {
    fn drop(&mut self) {
        if let (Some(inputs), Ok(mut slot)) = (self.inputs.take(), self.slot.lock()) {
            *slot = Some(inputs);
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::base::message::Batch;

    #[tokio::test]
    async fn blocked_inputs_are_not_read_and_ends_are_tracked() {
        let (t0, r0) = mpsc::channel(4);
        let (t1, r1) = mpsc::channel(4);
        let mut inputs = InputSet::new(vec![r0, r1]);
        t0.send(Message::Records(Batch::default()))
            .await
            .expect("send");
        t1.send(Message::EndOfStream).await.expect("send");
        // Input 0 is blocked: only input 1's end-of-stream comes out.
        match inputs.recv(|i| i == 0).await {
            Received::Message(1, Message::EndOfStream) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(!inputs.all_ended());
        match inputs.recv(|_| false).await {
            Received::Message(0, Message::Records(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
        drop(t0);
        assert!(matches!(inputs.recv(|_| false).await, Received::Closed(0)));
        assert!(inputs.all_ended());
    }

    #[tokio::test]
    async fn priority_lanes_come_before_queued_records_even_when_blocked() {
        use crate::base::message::BarrierKind;
        let (t0, r0) = mpsc::channel(4);
        let (p0, l0) = mpsc::unbounded_channel();
        let mut inputs = InputSet::new(vec![r0]).with_priority(vec![l0]);
        t0.send(Message::Records(Batch::default()))
            .await
            .expect("send");
        let b = Barrier {
            checkpoint: 3,
            kind: BarrierKind::Checkpoint,
        };
        p0.send(b).expect("send");
        assert!(matches!(
            inputs.recv(|_| true).await,
            Received::Priority(got) if got == b
        ));
        assert!(matches!(
            inputs.recv(|_| false).await,
            Received::Message(0, Message::Records(_))
        ));
    }

    #[tokio::test]
    async fn prefetched_messages_come_first_in_order_and_free_the_channel() {
        let (t0, r0) = mpsc::channel(2);
        let mut inputs = InputSet::new(vec![r0]);
        t0.send(batch_of(1)).await.expect("send");
        t0.send(batch_of(2)).await.expect("send");
        let mut seen = 0;
        inputs.prefetch(0, |_| {
            seen += 1;
            seen < 1
        });
        assert_eq!(seen, 1, "stops where told");
        inputs.prefetch(0, |_| {
            seen += 1;
            true
        });
        assert_eq!(seen, 2);
        // The channel has room again: a sender blocked on it goes on.
        t0.try_send(batch_of(3)).expect("room");
        t0.try_send(Message::EndOfStream).expect("room");
        for want in [1, 2] {
            match inputs.recv(|_| false).await {
                Received::Prefetched(0, Message::Records(b)) => assert_eq!(b.len(), want),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(matches!(
            inputs.recv(|_| false).await,
            Received::Message(0, Message::Records(_))
        ));
        assert!(matches!(
            inputs.recv(|_| false).await,
            Received::Message(0, Message::EndOfStream)
        ));
        assert!(inputs.all_ended());
    }

    fn batch_of(n: usize) -> Message {
        Message::Records(Batch::new(vec![rhai::Dynamic::UNIT; n]))
    }

    #[test]
    fn a_lease_returns_the_inputs_when_dropped() {
        let (_t, r) = mpsc::channel::<Message>(1);
        let slot: InputSlot = Arc::new(Mutex::new(Some(InputSet::new(vec![r]))));
        let lease = InputLease::take(&slot).expect("free");
        assert!(InputLease::take(&slot).is_none());
        drop(lease);
        assert!(InputLease::take(&slot).is_some());
    }
}
