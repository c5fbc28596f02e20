//! An operation on its way from a caller to the engine: what was asked
//! ([`OpDesc`], with its schedule's origin, [`Plan`]), the message that
//! carries it ([`Msg`]), and the [`Completion`] the caller waits on.
//!
//! These are what the communicator, the mailbox and the engine share; they
//! live here, apart from all three, so that none of them imports another
//! for them.

use crate::algo::{Algo, OpSpec, Schedule};
use crate::op::Fingerprint;
use crate::reduce::Kernel;
use gw_transport::Result;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Caller memory that whoever turns the engine may use: valid until the
/// operation's completion is signalled, and touched meanwhile only by the
/// thread turning the engine (one at a time, under its lock).
pub(crate) use gw_transport::MemPtr as Ptr;

/// Completion state shared between the engine and a waiting caller.
///
/// A waiter first spins on `ready` for `spin` (the engine usually finishes
/// a small operation within microseconds, while a futex sleep and wake costs
/// tens of microseconds on a VM), then blocks on the condition variable.
#[derive(Default)]
pub(crate) struct Completion {
    state: Mutex<Option<Result<()>>>,
    cv: Condvar,
    ready: AtomicBool,
    /// Callers blocked on `cv` (changed under `state`'s lock): a finished
    /// operation nobody sleeps on costs no futex wake.
    sleepers: AtomicU32,
    spin: Duration,
    /// Someone waits for it (`Handle::wait`, `wait_timeout`; a test does
    /// not count): a point-to-point message's timeout counts from then,
    /// as Gloo's does, so a receive posted long before its send is not a
    /// failure.
    waited: AtomicBool,
}

impl Completion {
    pub fn new(spin: Duration) -> Completion {
        Completion {
            spin,
            ..Completion::default()
        }
    }

    /// Makes a finished completion ready for another operation. Taking
    /// `&mut self` (from `Arc::get_mut`) proves that neither the engine nor a
    /// caller's handle still refers to it.
    pub fn reset(&mut self) {
        *self.state.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        *self.ready.get_mut() = false;
        *self.waited.get_mut() = false;
    }

    /// Records that a caller waits for the operation.
    pub fn mark_waited(&self) {
        self.waited.store(true, Ordering::Relaxed);
    }

    /// Whether a caller has waited for the operation.
    pub fn is_waited(&self) -> bool {
        self.waited.load(Ordering::Relaxed)
    }

    pub fn finish(&self, r: Result<()>) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(r);
        }
        self.ready.store(true, Ordering::Release);
        // Read under the lock: a waiter registers under it before it sleeps.
        let wake = self.sleepers.load(Ordering::Relaxed) > 0;
        drop(g);
        if wake {
            self.cv.notify_all();
        }
    }

    /// Spins until finished or the spin budget (capped by `deadline`) is spent.
    fn spin_until_ready(&self, deadline: Option<Instant>) {
        if self.spin.is_zero() {
            return;
        }
        let start = Instant::now();
        let mut end = start + self.spin;
        if let Some(d) = deadline {
            end = end.min(d);
        }
        let mut n = 0u32;
        while !self.ready.load(Ordering::Acquire) {
            n = n.wrapping_add(1);
            if n.is_multiple_of(64) && Instant::now() >= end {
                return;
            }
            std::hint::spin_loop();
        }
    }

    /// Whether the operation finished (without taking the lock).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The result if the operation finished.
    pub fn peek(&self) -> Option<Result<()>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Blocks until finished or `timeout` passes (`None` if it did).
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.spin_until_ready(deadline);
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        let result = loop {
            if let Some(r) = g.as_ref() {
                break Some(r.clone());
            }
            match deadline {
                None => g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break None;
                    }
                    g = self
                        .cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        };
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        result
    }
}

/// Where an operation's schedule comes from.
pub(crate) enum Plan {
    /// A collective: the engine rewinds the schedule of an earlier identical
    /// call from its cache, or builds one (see `sched_cache`). The caller has
    /// already checked the arguments with `algo::check`.
    Collective(OpSpec, Algo),
    /// A schedule the caller built, run once.
    Built(Box<dyn Schedule>),
    /// A point-to-point message, whose schedule the engine runs by value
    /// (nothing to allocate per message).
    Message(crate::algo::p2p::P2p),
    /// Plan a persistent operation once (`engine/prepared.rs`): keep its
    /// schedule (built by the caller, rewound) under `id`, make room in
    /// scratch and register the operation's buffers with every transport.
    /// Runs nothing.
    ///
    /// With `one_sided`, a one-sided schedule of the same operation: the
    /// engine keeps that one instead when every peer it talks to is reached
    /// by a transport with one-sided writes (done in hardware, with
    /// `offloaded_only`), registers and publishes its window, and says so
    /// in `out`. Without a two-sided `sched` to fall back on (a put), not
    /// being able to is an error naming the peer.
    Prepare {
        id: u64,
        sched: Option<Box<dyn Schedule>>,
        one_sided: Option<Box<dyn Schedule>>,
        offloaded_only: bool,
        out: Arc<Mutex<Published>>,
    },
    /// Gives the persistent operation `id` its peers' published regions
    /// (per peer, as [`Published`] encodes them), after `Prepare` chose
    /// its one-sided schedule.
    Attach { id: u64, remotes: Vec<[u64; 8]> },
    /// One round of the persistent operation `id`, on what `Prepare` made.
    Prepared(u64),
    /// Forget the persistent operation `id` (deregister its buffers).
    Unprepare(u64),
    /// Register the operation's receive buffer with every transport under
    /// `id`, for later operations on memory inside it
    /// (`engine/user_regs.rs`). Runs nothing, and runs when the engine takes
    /// it from the mailbox, never queued.
    Register { id: u64 },
    /// Withdraw registration `id`.
    Deregister(u64),
    /// The schedule moved into the running operation.
    Started,
}

/// What `Plan::Prepare` chose and published.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// Whether the one-sided schedule was kept.
    pub one_sided: bool,
    /// Per peer: the regions this rank publishes to it (its `Recv` buffer,
    /// then its window), each as `[rank, key, addr, len]`; zeros for peers
    /// the schedule does not talk to.
    pub regions: Vec<[u64; 8]>,
}

/// One operation as submitted by a caller.
pub(crate) struct OpDesc {
    pub fp: Fingerprint,
    pub plan: Plan,
    pub kernel: Kernel,
    pub weight: Option<f64>,
    pub send: Ptr,
    pub send_bytes: usize,
    pub recv: Ptr,
    pub recv_bytes: usize,
    pub done: Arc<Completion>,
}

impl OpDesc {
    /// Whether `self` and `other` touch the same bytes and at least one of
    /// them writes them (a send buffer is read, a receive buffer written):
    /// then the later of the two must not start before the earlier ends,
    /// whatever kinds of operation they are. Point-to-point messages run
    /// out of posting order only where this says they may.
    pub fn conflicts(&self, other: &OpDesc) -> bool {
        let spans = |o: &OpDesc| {
            [
                (o.send.0 as usize, o.send_bytes, false),
                (o.recv.0 as usize, o.recv_bytes, true),
            ]
        };
        spans(self).iter().any(|&(a, n, wa)| {
            spans(other).iter().any(|&(b, m, wb)| {
                (wa || wb) && n > 0 && m > 0 && a < b.saturating_add(m) && b < a.saturating_add(n)
            })
        })
    }
}

pub(crate) enum Msg {
    Op(OpDesc),
    Shutdown,
}
