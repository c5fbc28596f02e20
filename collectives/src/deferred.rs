//! Persistent rounds small enough for the caller's direct path are not
//! handed to the engine at `start`, but run by the caller at `wait`.
//!
//! A blocking small all-reduce runs straight through on the calling thread
//! (`engine/direct.rs`): a few hundred nanoseconds over shared memory. A
//! persistent round queued to the engine at `start` instead pays the
//! engine's general path and, usually, a wake-up of the engine thread: it
//! measured 4–25× slower than the ordinary call it is meant to beat. MPI
//! libraries without a progress thread do little at `MPI_Start` and the
//! work at `MPI_Wait`; for a round of a few microseconds nothing is lost to
//! compute overlap by doing the same.
//!
//! So `start` of such a round only marks it started and leaves it with the
//! communicator. `wait` runs it on the direct path (or, if the engine is
//! busy, queues and drives it). Anything else that would reach the engine
//! first — another operation on the communicator, `test`, a timed wait,
//! closing the communicator — hands the round to the engine ahead of
//! itself ([`Communicator::flush_deferred`]), so operations still reach the
//! engine in the order they were started and every rank numbers them alike.
//! Small collectives on the host region (`host_coll.rs`) draw from the same
//! numbers, so they flush a deferred round too: a round started before one
//! of them then runs on the engine's general path, not on `wait`'s direct
//! one (a cost only where a persistent round too large for host rounds and
//! a small ordinary collective meet between a `start` and its `wait`).
//! The direct path's frames are the rd schedule's, so a rank that ran the
//! round directly and one whose engine ran it still meet.
//!
//! A program may block elsewhere between `start` and `wait` (in a call on
//! another communicator, say) while its peers wait for this round. MPI's
//! progress rule asks that the round still complete. So the engine thread,
//! when nothing has needed it for its parking time (`PARK_MAX`, 1 s),
//! takes a deferred round over and runs it ([`take_over`]).

use crate::communicator::{Communicator, Handle, RawOp};
use crate::drive::Driver;
use crate::engine::{Completion, DirectOp, DirectShape, OpDesc, Plan, Ptr};
use crate::op::Fingerprint;
use crate::reduce::Kernel;
use gw_transport::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A persistent request's round: the handle of the one running (or done
/// and not yet looked at), or `deferred` while it waits to be run.
#[derive(Default)]
pub(crate) struct Round {
    pub handle: Option<Handle>,
    pub deferred: bool,
}

impl Round {
    /// Started and not finished.
    pub fn running(&self) -> bool {
        self.deferred || self.handle.as_ref().is_some_and(|h| !h.done.is_ready())
    }
}

pub(crate) type RoundSlot = Arc<Mutex<Round>>;

pub(crate) fn lock(slot: &Mutex<Round>) -> MutexGuard<'_, Round> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// What it takes to run a deferred round, on the direct path or the engine.
pub(crate) struct Deferrable {
    pub id: u64,
    pub fp: Fingerprint,
    pub kernel: Kernel,
    pub op: RawOp,
    pub send_bytes: usize,
    pub recv_bytes: usize,
    /// Elements, bytes and recursive-doubling rounds of the direct path.
    pub count: usize,
    pub bytes: usize,
    pub rounds: u32,
    pub round: RoundSlot,
    /// The communicator's collective sequence, for the engine thread.
    pub seq: Arc<AtomicU64>,
}

// SAFETY: the raw pointers in `op` are only handed to the engine or the
// direct path, under the promises `RawPersistent::start` took from its
// caller; nothing here dereferences them.
unsafe impl Send for Deferrable {}
// SAFETY: as above; the mutable state is behind `round`'s mutex.
unsafe impl Sync for Deferrable {}

impl Communicator {
    fn deferred_slot(&self) -> MutexGuard<'_, Option<Arc<Deferrable>>> {
        slot(&self.driver)
    }

    /// Leaves `d`'s round with the communicator, to run at its `wait` (see
    /// the module comment). The caller has checked that it is not running.
    pub(crate) fn defer(&self, d: &Arc<Deferrable>) -> Result<()> {
        // A round deferred earlier (another request's) comes first.
        self.flush_deferred()?;
        let mut slot = self.deferred_slot();
        let mut round = lock(&d.round);
        round.handle = None;
        round.deferred = true;
        *slot = Some(d.clone());
        self.driver.has_deferred.store(true, Ordering::Release);
        Ok(())
    }

    /// Takes `d`'s round back if it is still deferred here: the caller runs it.
    fn take_deferred(&self, d: &Arc<Deferrable>) -> bool {
        if !self.driver.has_deferred.load(Ordering::Acquire) {
            return false;
        }
        let mut slot = self.deferred_slot();
        if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, d)) {
            *slot = None;
            self.driver.has_deferred.store(false, Ordering::Release);
            true
        } else {
            false
        }
    }

    /// Hands a deferred round, if any, to the engine: called before
    /// anything else reaches the engine, so it stays ahead of it.
    pub(crate) fn flush_deferred(&self) -> Result<()> {
        if !self.driver.has_deferred.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut slot = self.deferred_slot();
        let Some(d) = slot.take() else {
            return Ok(());
        };
        // Queued under the slot's lock, and the flag dropped only after:
        // nothing submitted meanwhile can pass it.
        let queued = self.queue_round(&d);
        self.driver.has_deferred.store(false, Ordering::Release);
        drop(slot);
        queued
    }

    /// Queues `d`'s round to the engine without waking its thread (whoever
    /// waits drives it) and records its handle; a refusal is recorded as the
    /// round's result too.
    fn queue_round(&self, d: &Deferrable) -> Result<()> {
        let queued = self.enqueue_round(d);
        let mut round = lock(&d.round);
        round.deferred = false;
        match queued {
            Ok(h) => {
                round.handle = Some(h);
                Ok(())
            }
            Err(e) => {
                let h = self.finished(Err(e.clone()));
                round.handle = Some(h);
                Err(e)
            }
        }
    }

    /// Numbers `d`'s round and queues it without waking the engine thread.
    fn enqueue_round(&self, d: &Deferrable) -> Result<Handle> {
        let fp = Fingerprint {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            ..d.fp
        };
        self.enqueue(
            fp,
            Plan::Prepared(d.id),
            d.kernel,
            &d.op,
            d.send_bytes,
            d.recv_bytes,
            false,
        )
    }

    /// For `test` and timed waits, which must not block: a round still
    /// deferred goes to the engine now.
    pub(crate) fn release_deferred(&self, d: &Arc<Deferrable>) {
        if self.take_deferred(d) {
            // A refusal is the round's result, which the caller reads next.
            let _ = self.queue_round(d);
        }
    }

    /// For `wait`: runs a round still deferred on this thread, on the direct
    /// path when the engine is idle, else queued and driven to the end, and
    /// returns its result; `None` if it was not deferred here. The round
    /// stays marked deferred while it runs, so that another thread's `test`
    /// sees it running (and another `wait` waits for the flag to drop).
    pub(crate) fn run_deferred(&self, d: &Arc<Deferrable>) -> Option<Result<()>> {
        if !self.take_deferred(d) {
            return None;
        }
        let mut op = DirectOp {
            shape: DirectShape::AllReduce,
            fp: d.fp,
            kernel: d.kernel,
            send: Ptr(d.op.send as *mut u8),
            recv: Ptr(d.op.recv),
            count: d.count,
            bytes: d.bytes,
            rounds: d.rounds,
        };
        let t0 = if crate::trace::enabled() {
            crate::trace::now_us()
        } else {
            0.0
        };
        let res = match self.driver.run_direct(&mut op, &self.seq) {
            Some(r) => {
                // On the timeline like the engine's operations (the
                // engine records those it runs itself).
                if t0 > 0.0 {
                    let seq = self.seq.load(Ordering::Relaxed).wrapping_sub(1);
                    crate::trace::record(
                        d.fp.op.name(),
                        crate::trace::Lane::Collective,
                        t0,
                        seq,
                        d.bytes as u64,
                        None,
                    );
                }
                r
            }
            None => self.enqueue_round(d).and_then(|h| h.wait()),
        };
        lock(&d.round).deferred = false;
        Some(res)
    }
}

fn slot(driver: &Driver) -> MutexGuard<'_, Option<Arc<Deferrable>>> {
    driver.deferred.lock().unwrap_or_else(|p| p.into_inner())
}

/// The engine thread's part (see the module comment): queues a round still
/// deferred behind everything submitted before it, where the engine thread
/// runs it, and gives the request the handle to it.
pub(crate) fn take_over(driver: &Arc<Driver>) {
    if !driver.has_deferred.load(Ordering::Acquire) {
        return;
    }
    let mut slot = slot(driver);
    let Some(d) = slot.take() else {
        return;
    };
    // A waiter after this long has time to spare: no spinning.
    let done = Arc::new(Completion::new(std::time::Duration::ZERO));
    let op = OpDesc {
        fp: Fingerprint {
            seq: d.seq.fetch_add(1, Ordering::Relaxed),
            ..d.fp
        },
        plan: Plan::Prepared(d.id),
        kernel: d.kernel,
        weight: d.op.weight,
        send: Ptr(d.op.send as *mut u8),
        send_bytes: d.send_bytes,
        recv: Ptr(d.op.recv),
        recv_bytes: d.recv_bytes,
        done: done.clone(),
    };
    driver.queue_after_submitted(op);
    {
        let mut round = lock(&d.round);
        round.deferred = false;
        round.handle = Some(Handle {
            done,
            driver: driver.clone(),
            host: None,
        });
    }
    // Dropped only now: a submission that saw the flag waited for the slot.
    driver.has_deferred.store(false, Ordering::Release);
    drop(slot);
    tracing::debug!(
        "a persistent round was started a while ago and not waited for: the engine runs it"
    );
}
