//! Persistent all-reduce (MPI's `MPI_Allreduce_init` / `MPI_Start`): the
//! same all-reduce on the same buffers, planned once and started many times.
//!
//! A training loop all-reduces the same gradient buffers every step. An
//! ordinary call does, each time, what only the first needs: validate the
//! arguments and choose the algorithm, find (or build) the schedule in a
//! cache that may have evicted it, register both buffers with the transport
//! and deregister them at the end. A persistent request does all of that at
//! init ([`Communicator::all_reduce_init`], [`Communicator::prepare_raw`]):
//!
//! - the arguments are checked and the algorithm chosen (the cost model's
//!   choice for this size, or `GW_ALGO`), once;
//! - the schedule is built and handed to the engine, which keeps it for the
//!   request's life outside the evicting cache (`engine/prepared.rs`);
//! - the engine's scratch grows to what the schedule needs, and both
//!   buffers are registered with every transport;
//! - the ranks exchange one small message with every peer the schedule
//!   talks to, so connections (TCP dials and hellos, shared-memory
//!   segments) are up before the first round.
//!
//! Init is therefore collective: every rank calls it, in the same order
//! relative to its other collectives. Each [`RawPersistent::start`] then
//! draws a sequence number, takes a pooled completion and queues one
//! message; the engine rewinds the kept schedule and lends it the kept
//! registrations. Nothing is allocated, registered or built, and no store
//! or connection traffic happens (`tests/persistent_no_alloc.rs` counts).
//!
//! [`RawPersistent`] is the unsafe form over raw pointers, for the C ABI,
//! with `&self` methods so that one request can be tested from one thread
//! and waited on from another. [`PersistentAllReduce`] is the safe form: it
//! borrows the communicator and the buffers for its whole life, hands the
//! buffers out only between rounds, and waits for a running round (then
//! frees its plan) when dropped, so the engine never points at freed memory.

use crate::algo::{self, Action, ActionId, Algo, Buf, Loc, Schedule};
use crate::communicator::{Communicator, Handle, Planned, RawOp};
use crate::config::OneSided;
use crate::deferred::{self, Deferrable, Round, RoundSlot};
use crate::drive::Driver;
use crate::element::Element;
use crate::engine::{Plan, Published};
use crate::host_rounds::HostRounds;
use crate::op::{Fingerprint, OpKind, RedOp};
use crate::reduce::Kernel;
use gw_transport::rma::MAX_WINDOWS;
use gw_transport::{Error, Rank, Result};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Largest one-sided write of a persistent all-reduce: small enough that
/// the reduction of one segment overlaps the write of the next, large
/// enough that a 256 MiB buffer on 8 ranks stays within the chunks an
/// immediate can name.
const ONE_SIDED_SEGMENT_BYTES: usize = 256 << 10;

/// Rounds up to this size that the direct path cannot run are queued at
/// `start` without waking the engine thread: the caller's `wait` (or
/// `test`) drives them, as a blocking call would, and the wake-up (two
/// thread crossings, tens of microseconds on a VM) is saved. Larger rounds
/// wake it, so that they progress while the caller computes — where each
/// rank's engine thread has a core of its own. Where it has not, the
/// woken thread takes the core the caller (or a peer) computes on: 4 and
/// 16 MiB rounds over shm on the 2-core VM ran at 0.79-0.81x the blocking
/// call when woken, 0.99x when left to `wait` (`scripts/persistent-vs-
/// ordinary.sh -b 1M -e 16M -n 300`, 5 rounds). The engine thread still
/// takes a queued round over after its park time (1 s) if nobody waits.
const LAZY_START_BYTES: usize = 1 << 20;

/// Ids of persistent operations, process-wide (the engine looks them up).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A persistent operation on raw memory (see the module comment).
///
/// Its methods take the communicator it was made on; another one is an
/// `InvalidUsage` error. Dropping it without [`RawPersistent::free`] leaves
/// its plan (and its buffers' registrations) in the engine until the
/// communicator goes; a round still running then must still be waited for
/// by other means before the buffers go, so call `free`.
pub struct RawPersistent {
    id: u64,
    /// The engine it was prepared on, which also tells its communicator.
    driver: Arc<Driver>,
    fp: Fingerprint,
    kernel: Kernel,
    op: RawOp,
    send_bytes: usize,
    recv_bytes: usize,
    /// The round running, or finished and not yet tested or waited for,
    /// or deferred (shared with the communicator while it is).
    round: RoundSlot,
    /// Set where rounds are small enough for the caller's direct path:
    /// they are then run at `wait` (see `deferred.rs`).
    deferrable: Option<Arc<Deferrable>>,
    /// Rounds move by one-sided writes into published buffers (GDRAA).
    one_sided: bool,
    /// Rounds run through a region every rank of the host maps
    /// (`host_rounds.rs`), not on the engine.
    host: Option<Box<HostRounds>>,
    freed: AtomicBool,
}

// SAFETY: the raw pointers in `op` are only handed to the engine (whose
// callers promised, in `prepare_raw` and `start`, that the memory stays
// valid); the request itself never dereferences them.
unsafe impl Send for RawPersistent {}
// SAFETY: as above; the mutable state is behind `round`'s mutex and atomics.
unsafe impl Sync for RawPersistent {}

impl Communicator {
    /// Plans a persistent collective on raw memory (see the module comment):
    /// validates `op`, chooses the algorithm (unless `algo` names one),
    /// builds the schedule, registers both buffers with every transport and
    /// connects to every peer the schedule talks to. Collective: every rank
    /// calls it, in the same order relative to its other collectives. Only
    /// all-reduce (weighted or not) can be persistent so far.
    ///
    /// # Safety
    /// As for [`Communicator::submit_raw`], with "until the handle
    /// completes" read as "until [`RawPersistent::free`] returns": the
    /// request keeps the buffers registered for its whole life.
    pub unsafe fn prepare_raw(&self, op: RawOp, algo: Option<Algo>) -> Result<RawPersistent> {
        // One-sided rounds are a ring; any other algorithm asked for by name
        // runs two-sided.
        let asked = algo;
        let forced = algo.or(self.config().algo.value);
        if !matches!(
            op.kind,
            OpKind::AllReduce | OpKind::ReduceScatter | OpKind::AllGather
        ) {
            return Err(Error::InvalidArgument(format!(
                "only all_reduce, reduce_scatter and all_gather can be persistent, not {}",
                op.kind.name()
            )));
        }
        let Planned {
            kernel,
            redop,
            send_bytes,
            recv_bytes,
            algo,
            spec,
            fp,
            count,
            bytes,
            ..
        } = self.plan_collective(&op, algo)?;
        let op = RawOp { redop, ..op };
        if asked.is_none()
            && op.kind == OpKind::AllReduce
            && self.size() > 1
            && let Some(host) = self.host_rounds(&op, kernel, count, send_bytes)?
        {
            let parts = Parts {
                id: next_id(),
                fp,
                kernel,
                op,
                send_bytes,
                recv_bytes,
            };
            return Ok(RawPersistent::new(
                self.driver.clone(),
                parts,
                Some(Box::new(host)),
            ));
        }
        let mut sched = algo::build(&spec, algo)?;
        let id = next_id();
        // GDRAA: where the transports allow, data moves by one-sided writes
        // into buffers published once (`algo/onesided.rs`); the engine
        // decides, as only it knows which transport reaches which peer.
        let ring_ok = forced.is_none_or(|a| a == Algo::Ring);
        let mode = self.config().one_sided.value;
        let all_reduce = op.kind == OpKind::AllReduce;
        let mut one_sided = if mode != OneSided::Never && ring_ok && all_reduce && self.size() > 1 {
            let seg = (ONE_SIDED_SEGMENT_BYTES / kernel.dtype.size()).max(1);
            // Named the same on every rank: the collective sequence number
            // is, at init (the process-wide `id` is not).
            let window = (self.seq.load(Ordering::Relaxed) % MAX_WINDOWS as u64) as u8;
            match algo::onesided::allreduce(&spec, seg, window) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::debug!("persistent all-reduce stays two-sided: {e}");
                    None
                }
            }
        } else {
            None
        };
        let peers = peers_of(sched.as_mut())?;
        // Whom the one-sided schedule writes to and hears from: whom its
        // descriptors go to.
        let os_peers = match one_sided.as_mut() {
            Some(s) => Some(peers_of(s.as_mut())?),
            None => None,
        };
        tracing::debug!(
            "persistent {} of {} B: {} to {} peers",
            op.kind.name(),
            send_bytes,
            algo.name(),
            peers.len()
        );
        let parts = Parts {
            id,
            fp,
            kernel,
            op,
            send_bytes,
            recv_bytes,
        };
        let offloaded_only = mode == OneSided::Auto;
        let (mut p, published) =
            self.prepare_plan(parts, Some(sched), one_sided, offloaded_only)?;
        let shaken = if published.one_sided {
            tracing::debug!("persistent all-reduce {id}: one-sided ring");
            let os_peers = os_peers.unwrap_or_default();
            self.exchange_regions(&p, &published, &os_peers).map(|_| ())
        } else {
            self.handshake(&p, &peers)
        };
        if let Err(e) = shaken {
            let _ = p.free(self);
            return Err(e);
        }
        // Rounds the direct path can run are run by `wait` (`deferred.rs`).
        if algo == Algo::Rd
            && !published.one_sided
            && self.driver.inline()
            && let Some(rounds) = algo::direct_rounds(&spec)
        {
            p.deferrable = Some(Arc::new(Deferrable {
                id,
                fp,
                kernel,
                op,
                send_bytes,
                recv_bytes,
                count,
                bytes,
                rounds,
                round: p.round.clone(),
                seq: self.seq.clone(),
            }));
        }
        Ok(p)
    }

    /// Hands the plan of a persistent operation to the engine (see
    /// `Plan::Prepare`) and returns the request with what was published.
    pub(crate) fn prepare_plan(
        &self,
        parts: Parts,
        sched: Option<Box<dyn Schedule>>,
        one_sided: Option<Box<dyn Schedule>>,
        offloaded_only: bool,
    ) -> Result<(RawPersistent, Published)> {
        let Parts { id, fp, kernel, .. } = parts;
        let (op, send_bytes, recv_bytes) = (parts.op, parts.send_bytes, parts.recv_bytes);
        let out = Arc::new(Mutex::new(Published::default()));
        // Local to this rank: no sequence number (the other ranks' are not
        // drawn for it either).
        self.submit(
            fp,
            Plan::Prepare {
                id,
                sched,
                one_sided,
                offloaded_only,
                out: out.clone(),
            },
            kernel,
            &op,
            send_bytes,
            recv_bytes,
            false,
        )?
        .wait()?;
        let p = RawPersistent::new(self.driver.clone(), parts, None);
        let published = std::mem::take(&mut *out.lock().unwrap_or_else(|p| p.into_inner()));
        let p = RawPersistent {
            one_sided: published.one_sided,
            ..p
        };
        Ok((p, published))
    }

    /// Sends each of `peers` the regions this rank published to it and
    /// hands theirs to the engine (`Plan::Attach`): the one exchange of
    /// addresses and keys a one-sided persistent operation makes. Like the
    /// handshake, one operation of the collective sequence.
    /// Returns what the peers published (per rank, zeros for the others).
    pub(crate) fn exchange_regions(
        &self,
        p: &RawPersistent,
        published: &Published,
        peers: &[Rank],
    ) -> Result<Vec<[u64; 8]>> {
        let n = self.size();
        let es = p.kernel.dtype.size();
        // 64 bytes a peer, in whole elements.
        let epp = 64usize.div_ceil(es);
        let words = (epp * es).div_ceil(8);
        let mut send = vec![0u64; words * peers.len()];
        let mut recv = vec![0u64; words * peers.len()];
        for (i, &peer) in peers.iter().enumerate() {
            let d = published
                .regions
                .get(peer as usize)
                .copied()
                .unwrap_or([0; 8]);
            send[i * words..i * words + 8].copy_from_slice(&d);
        }
        let sched = Handshake::with_payload(peers, epp, words * 8 / es);
        let bytes = send.len() * 8;
        self.run_handshake(p, sched, &send, bytes, &mut recv, bytes)?;
        let mut remotes = vec![[0u64; 8]; n as usize];
        for (i, &peer) in peers.iter().enumerate() {
            remotes[peer as usize].copy_from_slice(&recv[i * words..i * words + 8]);
        }
        self.submit(
            p.fp,
            Plan::Attach {
                id: p.id,
                remotes: remotes.clone(),
            },
            p.kernel,
            &p.op,
            p.send_bytes,
            p.recv_bytes,
            false,
        )?
        .wait()?;
        Ok(remotes)
    }

    /// One small message to and from each of `peers`, all posted at once
    /// as one operation of the collective sequence (tagged as `p`'s call),
    /// so every connection a round needs is made now rather than by the
    /// first round.
    fn handshake(&self, p: &RawPersistent, peers: &[Rank]) -> Result<()> {
        if peers.is_empty() {
            return Ok(());
        }
        let es = p.kernel.dtype.size();
        let send = [0u64; 1];
        // Eight bytes per peer hold one element of any dtype.
        let mut recv = vec![0u64; peers.len()];
        let sched = Handshake::new(peers);
        self.run_handshake(p, sched, &send, es, &mut recv, es * peers.len())
    }

    /// Runs `sched` on the first `send_bytes` of `send` and `recv_bytes`
    /// of `recv` as one operation of the collective sequence, tagged as
    /// `p`'s call, and waits for it.
    fn run_handshake(
        &self,
        p: &RawPersistent,
        sched: Handshake,
        send: &[u64],
        send_bytes: usize,
        recv: &mut [u64],
        recv_bytes: usize,
    ) -> Result<()> {
        let fp = Fingerprint {
            seq: self.next_seq()?,
            ..p.fp
        };
        let op = RawOp {
            send: send.as_ptr().cast(),
            recv: recv.as_mut_ptr().cast(),
            weight: None,
            ..p.op
        };
        let plan = Plan::Built(Box::new(sched));
        self.submit(fp, plan, p.kernel, &op, send_bytes, recv_bytes, false)?
            .wait()
    }
}

/// What a persistent request is made of (see [`Communicator::prepare_plan`]).
pub(crate) struct Parts {
    pub id: u64,
    pub fp: Fingerprint,
    pub kernel: Kernel,
    pub op: RawOp,
    pub send_bytes: usize,
    pub recv_bytes: usize,
}

/// A new persistent operation's id, process-wide.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Every peer `sched` sends to or receives from, in rank order, found by
/// running it with every action completing at once, then rewinding it
/// (left run through, the next look would find no peers at all).
pub(crate) fn peers_of(sched: &mut dyn Schedule) -> Result<Vec<Rank>> {
    peers_and_readers(sched).map(|(peers, _)| peers)
}

/// As [`peers_of`], and beside them the peers `sched` reads from
/// one-sidedly ([`Action::Read`]), found in the same pass.
pub(crate) fn peers_and_readers(sched: &mut dyn Schedule) -> Result<(Vec<Rank>, Vec<Rank>)> {
    let (mut peers, mut reads) = (Vec::new(), Vec::new());
    while let Some(a) = sched.next_action() {
        match a {
            Action::Read { peer, .. } => {
                peers.push(peer);
                reads.push(peer);
            }
            Action::Send { peer, .. }
            | Action::Recv { peer, .. }
            | Action::Write { peer, .. }
            | Action::Landed { peer, .. } => peers.push(peer),
            Action::Reduce { .. } | Action::Copy { .. } => {}
        }
        sched.complete(a.id());
    }
    for v in [&mut peers, &mut reads] {
        v.sort_unstable();
        v.dedup();
    }
    if !sched.reset() {
        return Err(Error::Internal(format!(
            "a schedule waiting for {} cannot be rewound, so it cannot be persistent",
            sched.waiting_for()
        )));
    }
    Ok((peers, reads))
}

/// A send of element 0 of `Buf::Send` to each peer and a receive from each
/// into its own element of `Buf::Recv`, all at once (message step 0 with
/// every peer). The peer sets of a schedule are symmetric (every send has
/// its receive), so every rank's handshake matches its peers'.
struct Handshake {
    pending: Vec<Action>,
    outstanding: usize,
}

impl Handshake {
    fn new(peers: &[Rank]) -> Handshake {
        Handshake::build(peers, 1, None)
    }

    /// Sends each peer `i` its own `len` elements at `i * stride` of
    /// `Buf::Send`, and receives as much from it at the same place of
    /// `Buf::Recv`.
    fn with_payload(peers: &[Rank], len: usize, stride: usize) -> Handshake {
        Handshake::build(peers, len, Some(stride))
    }

    fn build(peers: &[Rank], len: usize, stride: Option<usize>) -> Handshake {
        let mut pending = Vec::with_capacity(2 * peers.len());
        for (i, &peer) in peers.iter().enumerate() {
            let at = stride.map_or(i, |s| i * s);
            pending.push(Action::Recv {
                id: 2 * i as ActionId,
                peer,
                step: 0,
                dst: Loc::new(Buf::Recv, at, len),
            });
            pending.push(Action::Send {
                id: 2 * i as ActionId + 1,
                peer,
                step: 0,
                src: Loc::new(Buf::Send, stride.map_or(0, |s| i * s), len),
            });
        }
        let outstanding = pending.len();
        Handshake {
            pending,
            outstanding,
        }
    }
}

impl Schedule for Handshake {
    fn next_action(&mut self) -> Option<Action> {
        self.pending.pop()
    }

    fn complete(&mut self, _id: ActionId) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    fn is_done(&self) -> bool {
        self.outstanding == 0
    }

    fn scratch_elems(&self) -> usize {
        0
    }

    fn waiting_for(&self) -> String {
        format!(
            "connecting a persistent request to its peers: {} of its messages outstanding",
            self.outstanding
        )
    }
}

impl RawPersistent {
    /// A request of `parts` that has run no round yet.
    fn new(driver: Arc<Driver>, parts: Parts, host: Option<Box<HostRounds>>) -> RawPersistent {
        let Parts {
            id,
            fp,
            kernel,
            op,
            send_bytes,
            recv_bytes,
        } = parts;
        RawPersistent {
            id,
            driver,
            fp,
            kernel,
            op,
            send_bytes,
            recv_bytes,
            round: RoundSlot::default(),
            deferrable: None,
            one_sided: false,
            host,
            freed: AtomicBool::new(false),
        }
    }

    fn check(&self, comm: &Communicator, what: &str) -> Result<()> {
        if !Arc::ptr_eq(&self.driver, &comm.driver) {
            return Err(Error::InvalidUsage(format!(
                "{what}: this persistent request belongs to another communicator"
            )));
        }
        if self.freed.load(Ordering::Acquire) {
            return Err(Error::InvalidUsage(format!(
                "{what}: this persistent request was freed"
            )));
        }
        Ok(())
    }

    fn round(&self) -> MutexGuard<'_, Round> {
        deferred::lock(&self.round)
    }

    /// Whether a round was started and has not finished yet.
    pub fn is_running(&self) -> bool {
        if let Some(h) = &self.host {
            return h.is_running();
        }
        self.round().running()
    }

    /// Whether rounds move by one-sided writes into the peers' published
    /// buffers (`GW_ONE_SIDED`), rather than by sends and receives.
    pub fn is_one_sided(&self) -> bool {
        self.one_sided
    }

    /// Whether rounds run through a region every rank of the host maps
    /// (`GW_HOST_ROUND_BYTES`), rather than on the engine.
    pub fn on_host(&self) -> bool {
        self.host.is_some()
    }

    /// Begins one round: reads the send buffer now, writes the receive
    /// buffer by the time the round completes. A round still running is an
    /// `InvalidUsage` error (and is left running). A finished round whose
    /// result nobody looked at is forgotten.
    ///
    /// # Safety
    /// The buffers given to [`Communicator::prepare_raw`] must still be
    /// valid, and must not be accessed by the caller until the round
    /// completes ([`RawPersistent::test`] or [`RawPersistent::wait`]).
    pub unsafe fn start(&self, comm: &Communicator) -> Result<()> {
        self.check(comm, "start")?;
        if let Some(h) = &self.host {
            // SAFETY: forwarded from the caller.
            return match unsafe { h.start() }? {
                true => Ok(()),
                false => Err(self.still_running()),
            };
        }
        if let Some(d) = &self.deferrable {
            if self.is_running() {
                return Err(self.still_running());
            }
            return comm.defer(d);
        }
        let mut round = self.round();
        if round.running() {
            return Err(self.still_running());
        }
        // The last handle goes first, so its completion can go back to the pool.
        round.handle = None;
        let fp = Fingerprint {
            seq: comm.next_seq()?,
            ..self.fp
        };
        let h = comm.submit(
            fp,
            Plan::Prepared(self.id),
            self.kernel,
            &self.op,
            self.send_bytes,
            self.recv_bytes,
            comm.engine_core && self.send_bytes.max(self.recv_bytes) > LAZY_START_BYTES,
        )?;
        round.handle = Some(h);
        Ok(())
    }

    fn still_running(&self) -> Error {
        Error::InvalidUsage(format!(
            "start: the previous round of this persistent {} is still running; \
             wait for it (or test it until done) before starting the next",
            self.fp.op.name()
        ))
    }

    /// Whether no round is running (true when none was started), without
    /// blocking; a finished round's error is returned once.
    pub fn test(&self, comm: &Communicator) -> Result<bool> {
        self.check(comm, "test")?;
        if let Some(h) = &self.host {
            return h.test();
        }
        if let Some(d) = &self.deferrable {
            comm.release_deferred(d);
        }
        let mut round = self.round();
        let Some(h) = round.handle.as_ref() else {
            return Ok(!round.deferred);
        };
        match h.test() {
            None => Ok(false),
            Some(r) => {
                round.handle = None;
                r.map(|_| true)
            }
        }
    }

    /// Blocks until the running round (if any) finishes; returns its result
    /// (once: a second wait returns `Ok` at once). The request stays valid.
    pub fn wait(&self, comm: &Communicator) -> Result<()> {
        self.wait_for(comm, None).map(|_| ())
    }

    /// As [`RawPersistent::wait`], at most `timeout`: `Ok(false)` if the
    /// round is still running then.
    pub fn wait_timeout(&self, comm: &Communicator, timeout: Duration) -> Result<bool> {
        self.wait_for(comm, Some(timeout))
    }

    fn wait_for(&self, comm: &Communicator, timeout: Option<Duration>) -> Result<bool> {
        self.check(comm, "wait")?;
        if let Some(h) = &self.host {
            return h.wait(timeout);
        }
        if let Some(d) = &self.deferrable {
            let deadline = timeout.map(|t| Instant::now() + t);
            match timeout {
                None => {
                    if let Some(r) = comm.run_deferred(d) {
                        return r.map(|_| true);
                    }
                }
                Some(_) => comm.release_deferred(d),
            }
            // Still marked deferred and not queued: another thread's wait is
            // running it on the direct path (and gets its result).
            while self.round().deferred {
                if deadline.is_some_and(|t| Instant::now() >= t) {
                    return Ok(false);
                }
                std::thread::yield_now();
            }
        }
        // Wait on a second handle to the round, without the lock, so that
        // `test` from another thread does not block behind the wait.
        let h = match self.round().handle.as_ref() {
            None => return Ok(true),
            Some(h) => Handle {
                done: h.done.clone(),
                driver: h.driver.clone(),
                host: None,
            },
        };
        let res = match timeout {
            None => Some(h.wait()),
            Some(t) => h.wait_timeout(t),
        };
        let Some(res) = res else {
            return Ok(false);
        };
        let mut round = self.round();
        if round
            .handle
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(&r.done, &h.done))
        {
            round.handle = None;
        }
        res.map(|_| true)
    }

    /// Waits for a running round, then forgets the plan (deregisters the
    /// buffers). Later calls are `InvalidUsage` errors. Returns the running
    /// round's error, if it failed, else the deregistration's result.
    pub fn free(&self, comm: &Communicator) -> Result<()> {
        self.check(comm, "free")?;
        let last = self.wait(comm);
        if self.freed.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidUsage(
                "free: this persistent request was freed".into(),
            ));
        }
        if self.host.is_some() {
            // Nothing of it is in the engine; the region goes with `self`.
            return last;
        }
        let gone = comm
            .submit(
                self.fp,
                Plan::Unprepare(self.id),
                self.kernel,
                &self.op,
                self.send_bytes,
                self.recv_bytes,
                false,
            )
            .and_then(|h| h.wait());
        last.and(gone)
    }
}

/// A persistent collective on borrowed buffers
/// ([`Communicator::all_reduce_init`], [`Communicator::reduce_scatter_init`],
/// [`Communicator::all_gather_init`]).
///
/// It borrows the communicator and the buffers for its whole life, so they
/// outlive every round, and nothing else can touch the buffers meanwhile:
/// between rounds they are reached through [`Persistent::send_mut`]
/// and [`Persistent::recv`], which refuse while a round runs.
/// Dropping it waits for a running round, then frees the plan.
pub struct Persistent<'a, T: Element> {
    comm: &'a Communicator,
    raw: RawPersistent,
    kind: OpKind,
    send: *mut T,
    recv: *mut T,
    send_len: usize,
    recv_len: usize,
    _bufs: PhantomData<&'a mut [T]>,
}

/// The persistent all-reduce (its first and commonest use).
pub type PersistentAllReduce<'a, T> = Persistent<'a, T>;

impl Communicator {
    /// A persistent `recv = ⊕ over ranks of send` (see [`crate::persistent`]):
    /// planned now, run by each [`PersistentAllReduce::start`]. Collective,
    /// like the all-reduce itself.
    ///
    /// `send` is borrowed mutably although rounds only read it: each round
    /// reads it anew, so the caller writes it between rounds, through
    /// [`PersistentAllReduce::send_mut`].
    pub fn all_reduce_init<'a, T: Element>(
        &'a self,
        send: &'a mut [T],
        recv: &'a mut [T],
        op: RedOp,
    ) -> Result<PersistentAllReduce<'a, T>> {
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument(format!(
                "all_reduce_init: buffers differ in length ({} vs {} elements)",
                send.len(),
                recv.len()
            )));
        }
        let (s, r, n) = (send.as_mut_ptr(), recv.as_mut_ptr(), send.len());
        // SAFETY: both borrows last as long as the request, which waits for
        // a running round and frees its plan when dropped.
        unsafe { self.persistent(OpKind::AllReduce, s, n, r, n, op) }
    }

    /// A persistent reduce-scatter: each round, `recv` (`count` elements)
    /// gets this rank's chunk of `⊕ over ranks of send` (`size() · count`).
    /// Collective. Out of place only.
    pub fn reduce_scatter_init<'a, T: Element>(
        &'a self,
        send: &'a mut [T],
        recv: &'a mut [T],
        op: RedOp,
    ) -> Result<Persistent<'a, T>> {
        let n = self.size() as usize;
        if send.len() != recv.len() * n {
            return Err(Error::InvalidArgument(format!(
                "reduce_scatter_init: the send buffer holds {} elements, {n} ranks × {} expected",
                send.len(),
                recv.len()
            )));
        }
        let (s, r) = (send.as_mut_ptr(), recv.as_mut_ptr());
        // SAFETY: as in all_reduce_init.
        unsafe { self.persistent(OpKind::ReduceScatter, s, send.len(), r, recv.len(), op) }
    }

    /// A persistent all-gather: each round, `recv` (`size() · count`)
    /// gets every rank's `send` (`count` elements), in rank order.
    /// Collective. Out of place only.
    pub fn all_gather_init<'a, T: Element>(
        &'a self,
        send: &'a mut [T],
        recv: &'a mut [T],
    ) -> Result<Persistent<'a, T>> {
        let n = self.size() as usize;
        if recv.len() != send.len() * n {
            return Err(Error::InvalidArgument(format!(
                "all_gather_init: the receive buffer holds {} elements, {n} ranks × {} expected",
                recv.len(),
                send.len()
            )));
        }
        let (s, r) = (send.as_mut_ptr(), recv.as_mut_ptr());
        // SAFETY: as in all_reduce_init.
        let sum = RedOp::Sum;
        unsafe { self.persistent(OpKind::AllGather, s, send.len(), r, recv.len(), sum) }
    }

    /// The in-place form of [`Communicator::all_reduce_init`]: each round
    /// reduces `buf` into itself.
    pub fn all_reduce_init_in_place<'a, T: Element>(
        &'a self,
        buf: &'a mut [T],
        op: RedOp,
    ) -> Result<PersistentAllReduce<'a, T>> {
        let (p, n) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: as in all_reduce_init.
        unsafe { self.persistent(OpKind::AllReduce, p, n, p, n, op) }
    }

    /// # Safety
    /// `send` and `recv` hold `send_len` and `recv_len` elements (or are
    /// equal) and stay borrowed by the returned request for `'a`.
    unsafe fn persistent<'a, T: Element>(
        &'a self,
        kind: OpKind,
        send: *mut T,
        send_len: usize,
        recv: *mut T,
        recv_len: usize,
        op: RedOp,
    ) -> Result<Persistent<'a, T>> {
        // The count of the layout table in `crate::algo`.
        let count = match kind {
            OpKind::AllGather => send_len,
            _ => recv_len,
        };
        let raw = RawOp {
            kind,
            dtype: T::DTYPE,
            redop: op,
            count,
            root: 0,
            send: send.cast_const().cast(),
            recv: recv.cast(),
            weight: None,
        };
        // SAFETY: forwarded from the caller.
        let raw = unsafe { self.prepare_raw(raw, None)? };
        Ok(Persistent {
            comm: self,
            raw,
            kind,
            send,
            recv,
            send_len,
            recv_len,
            _bufs: PhantomData,
        })
    }
}

impl<T: Element> Persistent<'_, T> {
    /// Begins one round, reading the send buffer now. A round still
    /// running is an `InvalidUsage` error.
    pub fn start(&mut self) -> Result<()> {
        // SAFETY: the buffers are borrowed for the request's life, and are
        // reachable (send_mut, recv) only while no round runs.
        unsafe { self.raw.start(self.comm) }
    }

    /// Whether no round is running (true before the first start); a
    /// finished round's error is returned once.
    pub fn test(&mut self) -> Result<bool> {
        self.raw.test(self.comm)
    }

    /// Blocks until the running round, if any, finishes.
    pub fn wait(&mut self) -> Result<()> {
        self.raw.wait(self.comm)
    }

    /// Blocks at most `timeout`; `Ok(false)` if the round is still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<bool> {
        self.raw.wait_timeout(self.comm, timeout)
    }

    /// See [`RawPersistent::is_one_sided`].
    pub fn is_one_sided(&self) -> bool {
        self.raw.is_one_sided()
    }

    /// See [`RawPersistent::on_host`].
    pub fn on_host(&self) -> bool {
        self.raw.on_host()
    }

    /// Whether a round was started and has not finished.
    pub fn is_running(&self) -> bool {
        self.raw.is_running()
    }

    fn idle(&self, what: &str) -> Result<()> {
        if self.raw.is_running() {
            return Err(Error::InvalidUsage(format!(
                "{what}: a round of this persistent {} is running; wait for it first",
                self.kind.name()
            )));
        }
        Ok(())
    }

    /// The send buffer (in place: the one buffer), to write the next
    /// round's input; refused while a round runs.
    pub fn send_mut(&mut self) -> Result<&mut [T]> {
        self.idle("send_mut")?;
        // SAFETY: borrowed for the request's life; no round runs, so the
        // engine does not touch it, and `&mut self` excludes other views.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.send, self.send_len) })
    }

    /// The receive buffer (in place: the one buffer), with the last round's
    /// result; refused while a round runs.
    pub fn recv(&self) -> Result<&[T]> {
        self.idle("recv")?;
        // SAFETY: as for send_mut; the shared view lasts while `&self` does,
        // and start needs `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(self.recv, self.recv_len) })
    }

    /// The receive buffer, writable; refused while a round runs.
    pub fn recv_mut(&mut self) -> Result<&mut [T]> {
        self.idle("recv_mut")?;
        // SAFETY: as for send_mut.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.recv, self.recv_len) })
    }

    /// Whether send and receive are one buffer.
    pub fn in_place(&self) -> bool {
        self.send == self.recv
    }
}

impl<T: Element> Drop for Persistent<'_, T> {
    fn drop(&mut self) {
        // Waits for a running round first: the borrows end after this.
        if let Err(e) = self.raw.free(self.comm) {
            tracing::debug!("freeing a persistent {}: {e}", self.kind.name());
        }
    }
}
