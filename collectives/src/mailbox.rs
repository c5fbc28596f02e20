//! The queue that carries callers' operations to the engine thread.
//!
//! It replaces `std::sync::mpsc`, whose unbounded channel allocates a new block
//! of slots every few dozen messages for as long as messages flow, so a
//! training loop would allocate in every steady-state step sooner or later.
//! Here the messages live in one `VecDeque` with capacity reserved at
//! creation (it grows only if more operations are ever outstanding at once,
//! and then keeps that size). Waking the engine is the caller's, through the
//! engine's `mio::Waker`.
//!
//! The semantics the engine relies on are those of mpsc: `try_recv` reports
//! `Disconnected` once the sender is gone and the queue is empty, and a send
//! fails once the engine's receiver is gone.

use crate::operation::Msg;
use gw_transport::Error;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::{Arc, Mutex};

struct Mailbox {
    queue: Mutex<VecDeque<Msg>>,
    /// Whether `queue` may hold messages, so that the engine's spin loop,
    /// which looks for messages between every two progress calls, does not
    /// take the lock (and contend with a submitting caller) to find none.
    /// Written only under the lock.
    nonempty: AtomicBool,
    sender_gone: AtomicBool,
    receiver_gone: AtomicBool,
}

/// The callers' end (one per communicator; it is `Sync`).
pub(crate) struct Sender(Arc<Mailbox>);

/// The engine's end.
pub(crate) struct Receiver(Arc<Mailbox>);

/// A queue with room for `capacity` outstanding messages before it grows.
pub(crate) fn channel(capacity: usize) -> (Sender, Receiver) {
    let m = Arc::new(Mailbox {
        queue: Mutex::new(VecDeque::with_capacity(capacity)),
        nonempty: AtomicBool::new(false),
        sender_gone: AtomicBool::new(false),
        receiver_gone: AtomicBool::new(false),
    });
    (Sender(m.clone()), Receiver(m))
}

impl Sender {
    /// Queues `msg`; fails (dropping it) if the engine is gone.
    pub fn send(&self, msg: Msg) -> gw_transport::Result<()> {
        let mut q = self.0.queue.lock().unwrap_or_else(|p| p.into_inner());
        // Checked under the lock: the receiver sets it under the lock before
        // draining, so no message can slip in after the drain.
        if self.0.receiver_gone.load(Ordering::Acquire) {
            drop(q);
            drop(msg);
            return Err(Error::InvalidUsage(
                "the communicator's engine has stopped".into(),
            ));
        }
        q.push_back(msg);
        self.0.nonempty.store(true, Ordering::Release);
        Ok(())
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.sender_gone.store(true, Ordering::Release);
    }
}

impl Receiver {
    pub fn try_recv(&self) -> Result<Msg, TryRecvError> {
        if self.0.nonempty.load(Ordering::Acquire) {
            let mut q = self.0.queue.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(m) = q.pop_front() {
                if q.is_empty() {
                    self.0.nonempty.store(false, Ordering::Release);
                }
                return Ok(m);
            }
            self.0.nonempty.store(false, Ordering::Release);
        }
        if self.0.sender_gone.load(Ordering::Acquire) {
            Err(TryRecvError::Disconnected)
        } else {
            Err(TryRecvError::Empty)
        }
    }
}

impl Drop for Receiver {
    /// The engine thread ended: later sends fail, and operations that were
    /// queued but never started fail instead of leaving their callers waiting.
    fn drop(&mut self) {
        let mut q = self.0.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.0.receiver_gone.store(true, Ordering::Release);
        for m in q.drain(..) {
            if let Msg::Op(op) = m {
                op.done.finish(Err(Error::Aborted(
                    "the communicator's engine stopped before running this operation".into(),
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_in_order_and_disconnection_is_seen() {
        let (tx, rx) = channel(2);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        for _ in 0..5 {
            assert!(tx.send(Msg::Shutdown).is_ok());
        }
        for _ in 0..5 {
            assert!(matches!(rx.try_recv(), Ok(Msg::Shutdown)));
        }
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        drop(tx);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
    }

    #[test]
    fn sending_to_a_stopped_engine_fails() {
        let (tx, rx) = channel(1);
        drop(rx);
        assert!(tx.send(Msg::Shutdown).is_err());
    }
}
