//! Who turns the engine: its own thread, or a caller blocked on an operation.
//!
//! With only an engine thread, every blocking operation crosses threads
//! twice: the caller queues it and sleeps, the engine thread runs it and
//! wakes the caller. On this kind of machine each crossing costs a futex wake
//! and a context switch (tens of microseconds, most of an 8-byte
//! all-reduce), and with more ranks than cores the two threads of a rank
//! fight for the same core. So a caller that blocks on its operation turns
//! the engine itself, as an MPI library does in `MPI_Wait`, for as long as
//! something moves; the engine thread stays parked meanwhile. When nothing
//! has moved for a while (`spin_us`, or [`CALLER_SPIN`] where each rank has
//! a core) the caller hands over (kicks the engine thread, which sleeps in
//! the poller until the peers send) and waits.
//!
//! The [`Engine`] sits behind one mutex; whoever holds it turns the engine,
//! so collectives still run one at a time in submission order (and
//! point-to-point messages beside them) whichever thread runs them. The
//! engine thread never holds the lock while it sleeps in the poller, and
//! parks (off the poller) while a caller drives.
//! `GW_INLINE=0` turns caller driving off.
//!
//! Waking the parked engine thread is itself a thread crossing, and a
//! caller that posts non-blocking operations and waits for them one by one
//! (a window of sends, as MPI benchmarks and pipeline code do) would wake
//! it twice per message: at each post, and at the end of each wait that
//! leaves work behind. Where every rank has a core, the engine thread
//! therefore naps instead of parking when a caller drives right after it
//! ran or was kicked: it looks again by itself within [`HANDOVER_NAP`], so
//! those two kicks become [`Driver::nudge`]s, which wake nobody while it
//! naps. It naps again only while nudges find it napping (the next wait
//! usually comes first, and the engine thread never runs at all); a
//! caller that only blocks parks it until kicked, as before.

use crate::deferred::Deferrable;
use crate::engine::{Completion, DirectOp, Engine, Turn, TurnState};
use mio::{Events, Poll, Waker};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The longest the parked engine thread waits before it looks again by
/// itself. Everything that gives it work kicks it (a non-blocking
/// submission, a caller handing over, abort, shutdown), so this is only a
/// safety net; a caller that drove to the end of its operation does not wake
/// it, so blocking calls never pay for a wake-up.
const PARK_MAX: Duration = Duration::from_secs(1);

/// How long the engine thread naps while a caller drives, where every rank
/// has a core: the longest a non-blocking operation posted meanwhile, or
/// left behind by a caller's wait, waits for the engine thread (a caller
/// that waits sooner runs it itself). It is [`CALLER_SPIN`], the time a
/// caller polls without progress before handing over, so neither thread
/// leaves the other's work longer than the other would. Each nap's end
/// wakes the thread to look, and where a rank's two threads share a core
/// that wake preempts the caller: on this 2-core VM (2 ranks), one-way
/// shared-memory streams of 64 KiB-1 MiB messages (`gwrun -n 2 gwbench
/// p2p -T 0.3`) ran at 11/23/13 GB/s with 200 µs naps and 15/26/18 with
/// 1 ms, against 3-6/7-12/13-15 when every post and wait woke the thread.
pub(crate) const HANDOVER_NAP: Duration = CALLER_SPIN;

/// How long a blocked caller keeps polling without progress before it hands
/// over, where every rank of the host has a core of its own (and
/// `GW_SPIN_US` is left at its default): the core has nothing else to do, and
/// a hand-over costs two thread crossings. On this 2-core VM a 2-rank 1 MiB
/// all-reduce over TCP went from a median of 405 to 365 µs (5 interleaved
/// rounds, each faster or equal) with callers polling for 1 ms instead of
/// 100 µs. Where ranks outnumber cores the polling would take a core from a
/// peer, so callers hand over after `GW_SPIN_US` there.
pub(crate) const CALLER_SPIN: Duration = Duration::from_millis(1);

/// How long a blocked caller polls without progress before it hands over:
/// [`CALLER_SPIN`] where every rank has a core and `GW_SPIN_US` (`spin`) was
/// not `chosen`, else `spin`.
pub(crate) fn drive_spin(spin: Duration, chosen: bool, oversubscribed: bool) -> Duration {
    if chosen || oversubscribed {
        spin
    } else {
        spin.max(CALLER_SPIN)
    }
}

/// The engine and what its drivers share.
pub(crate) struct Driver {
    engine: Mutex<Engine>,
    /// Callers driving right now; the engine thread parks while any are.
    driving: AtomicUsize,
    /// Set by [`Driver::kick`]; the parked engine thread waits on `unpark`.
    kicked: Mutex<bool>,
    unpark: Condvar,
    /// How long the engine thread naps while a caller drives; `None`
    /// parks it until kicked (where ranks outnumber cores, a thread
    /// waking on a timer would take a core from a peer).
    nap: Option<Duration>,
    /// The engine thread is napping: it looks at the engine again within
    /// `nap` by itself, so a [`Driver::nudge`] need not wake it.
    napping: AtomicBool,
    /// A nudge found the engine thread napping since it last looked.
    owed: AtomicBool,
    waker: Arc<Waker>,
    /// Callers drive their blocking operations (`GW_INLINE`).
    inline: bool,
    /// How long a driving caller polls without progress before it hands
    /// over (at least the engine's `spin_us`; see [`CALLER_SPIN`]).
    drive_spin: Duration,
    /// A persistent round started but left for its `wait` to run
    /// (`deferred.rs`), and whether there is one (looked at without the
    /// lock by every submission). Here rather than in the communicator so
    /// that the engine thread can take it over.
    pub(crate) deferred: Mutex<Option<Arc<Deferrable>>>,
    pub(crate) has_deferred: AtomicBool,
    /// The communicator's span: whoever turns the engine is inside it, so
    /// the engine's log lines carry the rank and communicator id.
    span: tracing::Span,
}

impl Driver {
    pub fn new(
        engine: Engine,
        waker: Arc<Waker>,
        inline: bool,
        drive_spin: Duration,
        nap: Option<Duration>,
        span: tracing::Span,
    ) -> Arc<Driver> {
        Arc::new(Driver {
            engine: Mutex::new(engine),
            driving: AtomicUsize::new(0),
            kicked: Mutex::new(false),
            unpark: Condvar::new(),
            nap,
            napping: AtomicBool::new(false),
            owed: AtomicBool::new(false),
            waker,
            inline,
            drive_spin,
            deferred: Mutex::new(None),
            has_deferred: AtomicBool::new(false),
            span,
        })
    }

    /// Hands the engine the communicator's host region of small
    /// collectives, whose queued calls its turns post.
    pub(crate) fn set_host_coll(&self, h: std::sync::Arc<crate::host_coll::HostColl>) {
        self.lock().set_host_coll(h);
    }

    /// Whether callers drive their blocking operations (`GW_INLINE`).
    pub fn inline(&self) -> bool {
        self.inline
    }

    fn lock(&self) -> MutexGuard<'_, Engine> {
        // A panic while turning leaves the engine as consistent as any
        // failure does; the next turn reports errors through completions.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the engine thread look at the engine now: out of the poller
    /// (its waker) and out of its parking spot.
    pub fn kick(&self) {
        *self.kicked.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.unpark.notify_one();
        // Only fails if the poller is gone, which the engine reports itself.
        let _ = self.waker.wake();
    }

    /// Makes the engine thread look at the engine soon: now, unless it
    /// naps (then within its nap). For work that a caller may well run
    /// itself first: a non-blocking submission, or what a finished wait
    /// leaves behind.
    pub fn nudge(&self) {
        // Pairs with the fence in `nap`: the work this nudge is about was
        // queued before it, so either the napping flag read here is the
        // thread's "awake" store, or the thread sees that work once awake.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.napping.load(Ordering::SeqCst) {
            self.owed.store(true, Ordering::SeqCst);
        } else {
            self.kick();
        }
    }

    /// Turns the engine from the calling thread until `done` is ready, for
    /// as long as something keeps moving. Returns whether `done` is ready;
    /// if not, the engine thread has been told to carry on.
    pub fn drive(&self, done: &Completion) -> bool {
        if done.is_ready() {
            return true;
        }
        if !self.inline {
            self.kick();
            return false;
        }
        // Lines from inside name the rank; see `gw_logging::enter` for why
        // not `self.span.enter()` on this path.
        let _in_comm = gw_logging::enter(&self.span);
        self.driving.fetch_add(1, Ordering::AcqRel);
        let mut st = TurnState::new();
        let mut first = true;
        let finished = loop {
            if done.is_ready() {
                break true;
            }
            let mut e = self.lock();
            if first {
                // The engine thread may have armed the doorbells before it
                // slept; peers need not ring them while we poll.
                e.finish_sleep();
                first = false;
            }
            e.poke();
            let turn = e.turn(&mut st);
            let oversubscribed = e.oversubscribed();
            drop(e);
            match turn {
                Turn::Moved => {}
                Turn::Spin if oversubscribed => std::thread::yield_now(),
                Turn::Spin => std::hint::spin_loop(),
                Turn::Sleep { .. } if st.idle_for() < self.drive_spin => std::hint::spin_loop(),
                Turn::Sleep { .. } | Turn::Exit => break done.is_ready(),
            }
        };
        self.driving.fetch_sub(1, Ordering::AcqRel);
        // Work left behind (the operation stalled, or others were queued
        // after it) is the engine thread's from here: at once if this
        // caller is about to sleep, else within its nap.
        if !finished {
            self.kick();
        } else if !self.lock().is_idle() {
            self.nudge();
        }
        finished
    }

    /// Runs a small all-reduce from the calling thread, start to end, if the
    /// engine is idle (see `engine/direct.rs`); `None` if it is not, or if
    /// callers do not drive (`GW_INLINE=0`): then the caller submits it.
    pub fn run_direct(&self, op: &mut DirectOp, seq: &AtomicU64) -> Option<crate::Result<()>> {
        self.direct_with(|e| e.run_direct(op, seq))
    }

    /// Moves what of a small blocking transfer the transports can move at
    /// once, from the calling thread, if the engine is idle (see
    /// `Engine::run_direct_message`); `None` if it is not, or if callers do
    /// not drive (`GW_INLINE=0`).
    pub(crate) fn run_direct_message(
        &self,
        m: &crate::engine::DirectMessage,
    ) -> Option<crate::Result<crate::engine::Left>> {
        self.direct_with(|e| e.run_direct_message(m))
    }

    /// Runs `f` on the engine from the calling thread, as a caller driving
    /// it; `None` without running it where callers do not drive.
    fn direct_with<R>(&self, f: impl FnOnce(&mut Engine) -> Option<R>) -> Option<R> {
        if !self.inline {
            return None;
        }
        let _in_comm = gw_logging::enter(&self.span);
        self.driving.fetch_add(1, Ordering::AcqRel);
        let mut e = self.lock();
        // The engine thread may have armed the doorbells before it parked.
        e.finish_sleep();
        let res = f(&mut e);
        drop(e);
        self.driving.fetch_sub(1, Ordering::AcqRel);
        // Submissions that came in meanwhile are the engine thread's. Looked
        // at after `driving` dropped: a kick before that may have found the
        // engine thread about to park again.
        if !self.lock().is_idle() {
            self.nudge();
        }
        res
    }

    /// Queues `op` behind everything already submitted (see
    /// `deferred::take_over`).
    pub(crate) fn queue_after_submitted(&self, op: crate::engine::OpDesc) {
        self.lock().queue_after_submitted(op);
    }

    /// Waits until kicked, or until `PARK_MAX` passed; whether kicked.
    fn park(&self) -> bool {
        self.park_for(PARK_MAX)
    }

    /// Waits until kicked, or until `limit` passed; whether kicked.
    fn park_for(&self, limit: Duration) -> bool {
        let mut k = self.kicked.lock().unwrap_or_else(|p| p.into_inner());
        if !*k {
            k = self
                .unpark
                .wait_timeout(k, limit)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        std::mem::take(&mut *k)
    }

    /// Sleeps while a caller drives. With naps configured and `flowing`
    /// (this thread just ran, or was kicked), it naps, and returns whether
    /// to nap again: only if a nudge found it napping, so a caller that
    /// only blocks on its own operations is not woken every nap. Otherwise
    /// it parks until kicked, and returns whether it was.
    fn stand_by(&self, flowing: bool) -> bool {
        if flowing && self.nap() {
            return self.owed.swap(false, Ordering::SeqCst);
        }
        self.park() && self.nap.is_some()
    }

    /// Naps (see [`HANDOVER_NAP`]) if naps are configured; whether it did.
    fn nap(&self) -> bool {
        let Some(nap) = self.nap else {
            return false;
        };
        self.napping.store(true, Ordering::SeqCst);
        self.park_for(nap);
        self.napping.store(false, Ordering::SeqCst);
        // Pairs with the fence in `nudge`: what a nudge skipped because we
        // napped is visible to the turn that follows.
        std::sync::atomic::fence(Ordering::SeqCst);
        true
    }
}

/// The engine thread's body: turns the engine whenever no caller does.
/// It reports on `started` once its own start-up allocations are done (the
/// event buffer here, the thread's name and locals in the runtime), so
/// that the communicator's init returns only after them: a thread the
/// scheduler starts late would otherwise allocate in the middle of a
/// training step.
pub(crate) fn engine_thread(driver: Arc<Driver>, mut poll: Poll, started: SyncSender<()>) {
    let mut events = Events::with_capacity(64);
    let mut st = TurnState::new();
    driver.lock().prepare_thread();
    // Init is waiting on the other end; it cannot have gone.
    let _ = started.send(());
    drop(started);
    // A caller drove since the engine thread last parked: the caller is
    // likely to post and wait again within a nap.
    let mut caller_seen = false;
    // Work reaches the engine thread while a caller drives (see `stand_by`).
    let mut flowing = true;
    loop {
        if driver.driving.load(Ordering::SeqCst) > 0 {
            caller_seen = true;
            flowing = driver.stand_by(flowing);
            st.woke();
            continue;
        }
        flowing = true;
        let mut e = driver.lock();
        let turn = e.turn(&mut st);
        match turn {
            Turn::Moved => {}
            Turn::Exit => {
                e.close();
                return;
            }
            Turn::Spin => {
                let oversubscribed = e.oversubscribed();
                // Poll without the lock, so a caller can take over meanwhile.
                drop(e);
                if oversubscribed {
                    std::thread::yield_now();
                }
                match poll.poll(&mut events, Some(Duration::ZERO)) {
                    Ok(()) if events.is_empty() => {}
                    Ok(()) => driver.lock().dispatch(&events),
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(err) => driver.lock().poll_failed(err),
                }
            }
            Turn::Sleep { idle: true, .. } => {
                // Nothing to run: park rather than sleep in the poller, where
                // every frame a peer sends while a caller drives would wake
                // this thread to fight the caller for the lock. Whatever
                // needs the engine thread kicks it. Right after a caller
                // drove, nap once first: its next post then wakes nobody.
                drop(e);
                if std::mem::take(&mut caller_seen) && driver.nap() {
                    st.woke();
                    continue;
                }
                if !driver.park() {
                    // Nobody needed the engine for `PARK_MAX`: a persistent
                    // round left for a `wait` that has not come runs now,
                    // so peers waiting for it are not held up further.
                    crate::deferred::take_over(&driver);
                }
                st.woke();
            }
            Turn::Sleep { timeout, .. } => {
                let ready = e.prepare_sleep();
                let oversubscribed = e.oversubscribed();
                drop(e);
                // A transport that will not let us sleep (libfabric's shm
                // with work in flight: it has no wait object; or work
                // already waiting) leaves this loop polling: where ranks
                // outnumber cores, let whoever else is runnable go first.
                if !ready && oversubscribed {
                    std::thread::yield_now();
                }
                let res = poll.poll(
                    &mut events,
                    if ready { timeout } else { Some(Duration::ZERO) },
                );
                let mut e = driver.lock();
                e.finish_sleep();
                match res {
                    Ok(()) => e.dispatch(&events),
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(err) => e.poll_failed(err),
                }
                drop(e);
                // Waiting, not idle (a message posted long before its peer
                // sends keeps the engine from parking): a persistent round
                // left for a `wait` still runs once nothing has moved for
                // as long as a park, as it would from a park.
                if st.idle_for() >= PARK_MAX {
                    crate::deferred::take_over(&driver);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_poll_longer_only_on_a_core_of_their_own_and_by_default() {
        let us = Duration::from_micros;
        assert_eq!(drive_spin(us(100), false, false), CALLER_SPIN);
        assert_eq!(drive_spin(us(100), false, true), us(100));
        assert_eq!(drive_spin(us(100), true, false), us(100));
        assert_eq!(drive_spin(us(0), true, false), us(0));
        // A default longer than CALLER_SPIN is kept.
        assert_eq!(drive_spin(us(5000), false, false), us(5000));
    }
}
