//! Persistent all-reduce on buffers the communicator allocates where every
//! rank of the host can read and write them: no copy in, and each result
//! byte reduced once on the host (MPI's `MPI_Win_allocate_shared` memory,
//! NCCL's `ncclMemAlloc` buffers; GDRAA's buffers registered once, with the
//! host's memory as the fabric).
//!
//! A persistent request on the caller's own buffers (`host_rounds.rs`)
//! copies its send buffer into a shared mailbox every round, because no
//! other process can read private memory, and then every rank reduces the
//! whole vector: at two ranks 3N bytes read and 2N written per rank, more
//! than the ordinary call's pulled ring moves from about 128 KiB. Here the
//! send and receive buffers of every rank lie in one region that every rank
//! maps, and a round is:
//!
//! - `start`: publish the round number `r` in this rank's line (Release):
//!   its send buffer holds the round's input, and its receive buffer may be
//!   overwritten;
//! - once every line shows `r` (Acquire): reduce this rank's slice of every
//!   rank's send buffer into its own receive buffer, copy that slice into
//!   every other rank's receive buffer, and publish `done = r`;
//! - once every line's `done` shows `r`: the round is complete here.
//!
//! Per rank that is N bytes read and N written whatever the number of
//! ranks, with two flags per rank per round. The slices are whole cache
//! lines, so no two ranks write one line.
//!
//! Why one set of buffers is enough: a rank reads another's send buffer,
//! and writes into its receive buffer, only between that rank's start of
//! the round and its own `done`; the owner touches them again only after
//! its wait, which needs every rank's `done`, and the next round's writes
//! wait for the owner's next start. So while a rank waits for round `r`,
//! every rank's `round` and `done` read `r − 1` or `r` (anything else is
//! a corrupt region, reported as such).
//!
//! Where some peer is not reached over shared memory, where
//! `GW_HOST_ROUND_BYTES` is set below the size, where a host runs more
//! ranks than cores and the call is small ([`CROWDED_MIN_BYTES`]), where
//! `GW_ALGO` or `GW_ONE_SIDED=1` asks for the engine, for zero elements,
//! or where the region cannot be made (a full `/dev/shm`), the request
//! owns private buffers and runs an ordinary persistent all-reduce on them
//! ([`Communicator::prepare_raw`]): the same calls, wherever it runs.
//!
//! ```text
//!    0  magic "GWHOSTS1" u64, ranks u64, call u64 (`call_word`) (the creator's)
//!   64  line of rank i (64 bytes each): round u64 at 0, done u64 at 8,
//!       pid u64 at 16, left u64 at 24 (as in host_rounds.rs)
//!       send buffers of ranks 0..n, then receive buffers of ranks 0..n
//!       (in place: one buffer per rank), `stride` each, page aligned
//! ```

use crate::communicator::{Communicator, RawOp};
use crate::config::{OneSided, Source};
use crate::element::Element;
use crate::host_rounds::{CROWDED_MAX_BYTES, call_word, first_gone, poll_until, say_left, word};
use crate::host_rounds::{HEADER, LEFT_AT, LINE, LIVENESS_EVERY, Leaving, Vote};
use crate::op::{DType, OpKind, RedOp};
use crate::persistent::RawPersistent;
use crate::reduce::Kernel;
use gw_transport::shm::HostRegion;
use gw_transport::{Error, Result};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const MAGIC: u64 = u64::from_le_bytes(*b"GWHOSTS1");
/// Where a rank's `done` word sits in its line.
const DONE_AT: usize = 8;
/// Buffers start on pages of their own.
const PAGE: usize = 4096;
/// Slices are whole cache lines, so that no two ranks write one line.
const CACHE_LINE: usize = 64;
/// Where a host runs more ranks than cores (and `GW_HOST_ROUND_BYTES` is
/// not set), calls up to this size keep private buffers: a round here
/// waits twice for every rank to be scheduled, and at 4 ranks on the
/// 2-core VM a 1 KiB round took 1.15x the ordinary call's time, where from
/// 4 KiB it took 0.74x down to 0.23x (`GW_HOST_ROUND_BYTES=1073741824
/// gwbench allreduce -P 1 --shared 1` in the shared column of
/// `scripts/persistent-vs-ordinary.sh -p 4 -r 3 -b 1K -e 4M -T 0.2` before
/// that column left the variable unset; medians of 3 rounds).
const CROWDED_MIN_BYTES: usize = CROWDED_MAX_BYTES;

/// Where things are in a region for `n` ranks of `bytes` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    n: usize,
    stride: usize,
    in_place: bool,
}

impl Layout {
    fn new(n: usize, bytes: usize, in_place: bool) -> Layout {
        Layout {
            n,
            stride: bytes.div_ceil(PAGE).max(1) * PAGE,
            in_place,
        }
    }

    fn buffers_at(&self) -> usize {
        (HEADER + self.n * LINE).div_ceil(PAGE) * PAGE
    }

    /// `None` where the region would not fit in an address.
    fn total(&self) -> Option<usize> {
        let per_rank = if self.in_place { 1 } else { 2 };
        self.stride
            .checked_mul(self.n)?
            .checked_mul(per_rank)?
            .checked_add(self.buffers_at())
    }

    fn line(&self, rank: usize) -> usize {
        HEADER + rank * LINE
    }

    fn send(&self, rank: usize) -> usize {
        self.buffers_at() + rank * self.stride
    }

    fn recv(&self, rank: usize) -> usize {
        if self.in_place {
            self.send(rank)
        } else {
            self.buffers_at() + (self.n + rank) * self.stride
        }
    }
}

/// Rank `j`'s slice of `count` elements of `esz` bytes among `n` ranks, as
/// an element range: whole cache lines, the last slice taking the tail.
fn slice(count: usize, esz: usize, n: usize, j: usize) -> (usize, usize) {
    let unit = (CACHE_LINE / esz).max(1);
    let units = count.div_ceil(unit);
    let at = |k: usize| (units * k / n * unit).min(count);
    (at(j), at(j + 1))
}

/// Which words a round waits on, in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Every rank's `round`: its input is there.
    Arrive,
    /// Every rank's `done`: its slice is in every receive buffer.
    Depart,
}

impl Phase {
    fn at(self) -> usize {
        match self {
            Phase::Arrive => 0,
            Phase::Depart => DONE_AT,
        }
    }

    fn missing(self) -> &'static str {
        match self {
            Phase::Arrive => "had not started",
            Phase::Depart => "had not finished its slice of",
        }
    }
}

/// The rounds of one request on a host region (see the module comment).
struct HostShared {
    region: Arc<HostRegion>,
    layout: Layout,
    me: usize,
    kernel: Kernel,
    count: usize,
    esz: usize,
    /// `GW_TIMEOUT`: how long a round may wait for the other ranks.
    timeout: Duration,
    /// More ranks than cores here: a waiting rank yields at once.
    crowded: bool,
    abort: Arc<AtomicBool>,
    /// Behind a lock so that one thread may test while another waits.
    progress: Mutex<Progress>,
}

#[derive(Debug)]
struct Progress {
    /// The round `start` begins next (rounds count from 1: lines start 0).
    next: u64,
    phase: Option<Phase>,
    started: Instant,
    check_at: Instant,
    polls: u32,
    /// A rank that exited or a corrupt region: every later call fails so.
    failed: Option<Error>,
}

/// Where a shared request's rounds run.
enum Way {
    Host(HostShared),
    /// Private buffers (whole cache lines, as the region's are) and an
    /// ordinary persistent request on them; in place, `recv` is empty.
    /// `send_at` and `recv_at` are the buffers' addresses, taken once
    /// (writable), for the caller and the engine.
    Engine {
        send: Vec<Line>,
        recv: Vec<Line>,
        send_at: *mut u8,
        recv_at: *mut u8,
        raw: RawPersistent,
    },
}

/// A cache line of a private buffer: 64-byte alignment, as in the region.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; CACHE_LINE]);

/// A persistent all-reduce on buffers it owns, typeless (see the module
/// comment); [`SharedAllReduce`] is the typed form. Its methods take the
/// communicator it was made on.
pub struct RawSharedAllReduce {
    way: Way,
    dtype: DType,
    count: usize,
    in_place: bool,
    /// [`RawSharedAllReduce::free`] ran: no round starts again.
    freed: AtomicBool,
    /// The engine forgot the private buffers (its `free` succeeded), so
    /// dropping them is safe.
    released: AtomicBool,
}

// SAFETY: the raw pointers are the private buffers' addresses, owned by the
// request; everything shared is behind a mutex, an atomic, or the region's
// atomics.
unsafe impl Send for RawSharedAllReduce {}
// SAFETY: as above.
unsafe impl Sync for RawSharedAllReduce {}

impl Communicator {
    /// A persistent `recv = ⊕ over ranks of send` of `count` elements of
    /// `dtype` on buffers the request allocates ([`RawSharedAllReduce::send_ptr`],
    /// [`RawSharedAllReduce::recv_ptr`]): where every rank shares this
    /// host, in one region they all map, so that a round copies nothing in
    /// (see [`crate::shared_all_reduce`]). In place, both are one buffer.
    /// Collective, like the all-reduce; the buffers start zeroed.
    pub fn shared_all_reduce_init_raw(
        &self,
        dtype: DType,
        count: usize,
        op: RedOp,
        in_place: bool,
    ) -> Result<RawSharedAllReduce> {
        let n = self.size() as usize;
        if op == RedOp::None {
            return Err(Error::InvalidArgument(
                "shared all-reduce: op none does not reduce; name a reduction".into(),
            ));
        }
        let kernel = Kernel::new(dtype, op, self.size())?;
        let esz = dtype.size();
        let bytes = count.checked_mul(esz).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "shared all-reduce: {count} elements of {} overflow an address",
                dtype.name()
            ))
        })?;
        // A deferred round one rank has numbered and another not would give
        // the ranks different keys (`region_key`): hand it over first.
        self.flush_deferred()?;
        let cfg = self.config();
        let layout = Layout::new(n, bytes, in_place);
        let total = layout.total();
        let limit_ok = match cfg.host_round_bytes.source {
            Source::Default => !self.crowded() || bytes > CROWDED_MIN_BYTES,
            _ => bytes <= cfg.host_round_bytes.value,
        };
        let vote = Vote {
            ok: self.all_peers_over_shm()
                && bytes > 0
                && limit_ok
                && total.is_some()
                && cfg.algo.value.is_none()
                && cfg.one_sided.value != OneSided::Always,
            key: self.region_key(3),
            total: total.unwrap_or(0),
            magic: MAGIC,
            // Ranks that disagree on the call must not share slices of
            // it: their header differs, none opens, and the engine's
            // matching names the mismatch.
            words: [n as u64, call_word(dtype, op, count)],
            lines: layout.line(0),
        };
        let way = match self.agree_on_region(vote)? {
            Some(region) => {
                let region = Arc::new(region);
                let me = self.rank() as usize;
                {
                    let mut lines = self
                        .host_round_lines
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    lines.retain(|(r, _)| r.strong_count() > 0);
                    lines.push((Arc::downgrade(&region), layout.line(me) + LEFT_AT));
                }
                tracing::debug!(
                    "shared all-reduce of {bytes} B: rounds on {}",
                    region.path().display()
                );
                let now = Instant::now();
                let progress = Progress {
                    next: 1,
                    phase: None,
                    started: now,
                    check_at: now,
                    polls: 0,
                    failed: None,
                };
                Way::Host(HostShared {
                    region,
                    layout,
                    me,
                    kernel,
                    count,
                    esz,
                    timeout: cfg.timeout.value,
                    crowded: self.crowded(),
                    abort: self.abort_flag(),
                    progress: Mutex::new(progress),
                })
            }
            None => self.private_way(dtype, count, op, in_place)?,
        };
        Ok(RawSharedAllReduce {
            way,
            dtype,
            count,
            in_place,
            freed: AtomicBool::new(false),
            released: AtomicBool::new(false),
        })
    }

    /// Private buffers and an ordinary persistent all-reduce on them. A
    /// rank that cannot allocate says so to the others (a one-byte vote),
    /// so that all fail rather than wait for it.
    fn private_way(&self, dtype: DType, count: usize, op: RedOp, in_place: bool) -> Result<Way> {
        let lines = count
            .saturating_mul(dtype.size())
            .div_ceil(CACHE_LINE)
            .max(1);
        let zeroed = |lines: usize| -> Option<Vec<Line>> {
            let mut v = Vec::new();
            v.try_reserve_exact(lines).ok()?;
            v.resize(lines, Line([0; CACHE_LINE]));
            Some(v)
        };
        let send = zeroed(lines);
        let recv = if in_place {
            Some(Vec::new())
        } else {
            zeroed(lines)
        };
        let mine = send.is_some() && recv.is_some();
        if !self.everyone(mine)? {
            return Err(Error::InvalidArgument(format!(
                "shared all-reduce: {} of {count} elements of {} could not be allocated {}",
                if in_place { "a buffer" } else { "two buffers" },
                dtype.name(),
                if mine { "on another rank" } else { "here" }
            )));
        }
        let (Some(mut send), Some(mut recv)) = (send, recv) else {
            unreachable!("every rank allocated, this one too");
        };
        let send_at = send.as_mut_ptr().cast::<u8>();
        let recv_at = if in_place {
            send_at
        } else {
            recv.as_mut_ptr().cast()
        };
        let raw = RawOp {
            kind: OpKind::AllReduce,
            dtype,
            redop: op,
            count,
            root: 0,
            send: send_at.cast_const(),
            recv: recv_at,
            weight: None,
        };
        // SAFETY: the vectors move into the request with their heap
        // buffers in place and are never resized; the request drops them
        // only once `raw.free` succeeded, and leaks them otherwise.
        let raw = unsafe { self.prepare_raw(raw, None)? };
        Ok(Way::Engine {
            send,
            recv,
            send_at,
            recv_at,
            raw,
        })
    }

    /// The typed form of [`Communicator::shared_all_reduce_init_raw`], out
    /// of place.
    pub fn all_reduce_init_shared<T: Element>(
        &self,
        count: usize,
        op: RedOp,
    ) -> Result<SharedAllReduce<'_, T>> {
        self.shared_typed(count, op, false)
    }

    /// The typed form of [`Communicator::shared_all_reduce_init_raw`], in
    /// place: each round reduces the one buffer into itself.
    pub fn all_reduce_init_shared_in_place<T: Element>(
        &self,
        count: usize,
        op: RedOp,
    ) -> Result<SharedAllReduce<'_, T>> {
        self.shared_typed(count, op, true)
    }

    fn shared_typed<T: Element>(
        &self,
        count: usize,
        op: RedOp,
        in_place: bool,
    ) -> Result<SharedAllReduce<'_, T>> {
        let raw = self.shared_all_reduce_init_raw(T::DTYPE, count, op, in_place)?;
        Ok(SharedAllReduce {
            comm: self,
            raw: Some(raw),
            _t: PhantomData,
        })
    }
}

impl RawSharedAllReduce {
    /// Whether the rounds run on a host region (else on the engine, over
    /// private buffers).
    pub fn on_host(&self) -> bool {
        matches!(self.way, Way::Host(_))
    }

    /// The elements of each buffer, and their type.
    pub fn count(&self) -> usize {
        self.count
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether send and receive are one buffer.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Whether a round was started and has not finished.
    pub fn is_running(&self) -> bool {
        match &self.way {
            Way::Host(h) => h.progress().phase.is_some(),
            Way::Engine { raw, .. } => raw.is_running(),
        }
    }

    /// This rank's send buffer (`count` elements, aligned to 64 bytes),
    /// for the caller to write between rounds; valid until the request is
    /// freed or dropped.
    pub fn send_ptr(&self) -> *mut u8 {
        match &self.way {
            Way::Host(h) => h.at(h.layout.send(h.me)),
            Way::Engine { send_at, .. } => *send_at,
        }
    }

    /// This rank's receive buffer (in place: the send buffer), holding the
    /// last finished round's result; valid as [`RawSharedAllReduce::send_ptr`].
    pub fn recv_ptr(&self) -> *mut u8 {
        match &self.way {
            Way::Host(h) => h.at(h.layout.recv(h.me)),
            Way::Engine { recv_at, .. } => *recv_at,
        }
    }

    /// Begins one round, reading the send buffer from now until the round
    /// completes. A round still running is an `InvalidUsage` error.
    ///
    /// # Safety
    /// Nothing may write the send buffer, or touch the receive buffer,
    /// until the round completes (`test` true, or `wait`).
    pub unsafe fn start(&self, comm: &Communicator) -> Result<()> {
        if self.freed.load(Ordering::Acquire) {
            return Err(Error::InvalidUsage(
                "start: this shared all-reduce was freed".into(),
            ));
        }
        match &self.way {
            Way::Host(h) => h.start(),
            // SAFETY: the buffers belong to the request; the caller keeps
            // off them until the round completes.
            Way::Engine { raw, .. } => unsafe { raw.start(comm) },
        }
    }

    /// Whether no round is running, finishing one whose ranks all got far
    /// enough; a rank that exited, or a round past `GW_TIMEOUT`, is an
    /// error naming the rank and the round.
    pub fn test(&self, comm: &Communicator) -> Result<bool> {
        match &self.way {
            Way::Host(h) => h.test(),
            Way::Engine { raw, .. } => raw.test(comm),
        }
    }

    /// Blocks until the running round, if any, completes.
    pub fn wait(&self, comm: &Communicator) -> Result<()> {
        match &self.way {
            Way::Host(h) => h.wait(None).map(drop),
            Way::Engine { raw, .. } => raw.wait(comm),
        }
    }

    /// Blocks at most `limit`; `Ok(false)` if the round is still running.
    pub fn wait_timeout(&self, comm: &Communicator, limit: Duration) -> Result<bool> {
        match &self.way {
            Way::Host(h) => h.wait(Some(limit)),
            Way::Engine { raw, .. } => raw.wait_timeout(comm, limit),
        }
    }

    /// Waits for a running round, then releases the request: no round
    /// starts again, and other ranks waiting for this one's next round
    /// stop, naming it. The buffers stay until the request is dropped.
    /// The result is the running round's.
    pub fn free(&self, comm: &Communicator) -> Result<()> {
        self.freed.store(true, Ordering::Release);
        let waited = self.wait(comm);
        match &self.way {
            Way::Host(h) => {
                h.leave(Leaving::Freed);
                waited
            }
            Way::Engine { raw, .. } => {
                let freed = raw.free(comm);
                if freed.is_ok() {
                    self.released.store(true, Ordering::Release);
                }
                waited.and(freed)
            }
        }
    }
}

impl HostShared {
    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.region.len());
        // SAFETY: callers pass offsets of the layout, inside the region.
        unsafe { self.region.as_ptr().add(off) }
    }

    fn flag(&self, rank: usize, phase: Phase) -> &AtomicU64 {
        word(&self.region, self.layout.line(rank) + phase.at())
    }

    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start(&self) -> Result<()> {
        let mut p = self.progress();
        self.usable(&p)?;
        if p.phase.is_some() {
            return Err(Error::InvalidUsage(
                "start: a round of this shared all-reduce is still running; wait for it first"
                    .into(),
            ));
        }
        self.flag(self.me, Phase::Arrive)
            .store(p.next, Ordering::Release);
        p.phase = Some(Phase::Arrive);
        p.started = Instant::now();
        p.check_at = p.started + LIVENESS_EVERY;
        Ok(())
    }

    /// Fails if the communicator was aborted, or an earlier call found a
    /// rank gone or the region corrupt.
    fn usable(&self, p: &Progress) -> Result<()> {
        if self.abort.load(Ordering::Acquire) {
            return Err(Error::Aborted(
                "shared all-reduce: the communicator was aborted".into(),
            ));
        }
        p.failed.clone().map_or(Ok(()), Err)
    }

    /// Whether no round is running, taking the running one as far as the
    /// other ranks let it go.
    fn test(&self) -> Result<bool> {
        let mut p = self.progress();
        self.usable(&p)?;
        while let Some(phase) = p.phase {
            match self.all_at(phase, p.next) {
                Err(e) => return Err(self.fail(&mut p, e)),
                Ok(false) => {
                    p.polls = p.polls.wrapping_add(1);
                    if p.polls.is_multiple_of(64) {
                        let now = Instant::now();
                        if now >= p.check_at {
                            p.check_at = now + LIVENESS_EVERY;
                            self.check_peers(&mut p, phase, now)?;
                        }
                    }
                    return Ok(false);
                }
                Ok(true) => {}
            }
            match phase {
                Phase::Arrive => {
                    // SAFETY: every rank published this round, so its send
                    // buffer holds the input and its receive buffer is free
                    // (module comment); the slice is this rank's alone.
                    unsafe { self.reduce_slice() };
                    self.flag(self.me, Phase::Depart)
                        .store(p.next, Ordering::Release);
                    p.phase = Some(Phase::Depart);
                }
                Phase::Depart => {
                    p.phase = None;
                    p.next += 1;
                }
            }
        }
        Ok(true)
    }

    /// Whether every rank's word for `phase` shows the running round.
    fn all_at(&self, phase: Phase, r: u64) -> Result<bool> {
        for j in 0..self.layout.n {
            let seen = self.flag(j, phase).load(Ordering::Acquire);
            if seen == r {
                continue;
            }
            if seen.checked_add(1) == Some(r) {
                return Ok(false);
            }
            return Err(Error::Protocol(format!(
                "host region {}: rank {j} published {} {seen} while rank {} waits for round {r}",
                self.region.path().display(),
                if phase == Phase::Arrive {
                    "round"
                } else {
                    "done"
                },
                self.me
            )));
        }
        Ok(true)
    }

    /// This rank's slice: every rank's send buffer reduced into this
    /// rank's receive buffer (its own input first, then the others in rank
    /// order: in place, its own buffer is both), then copied into every
    /// other rank's receive buffer.
    ///
    /// # Safety
    /// Every rank has published the running round and nobody else touches
    /// this slice of any buffer until this rank publishes `done`.
    unsafe fn reduce_slice(&self) {
        let n = self.layout.n;
        let (lo, hi) = slice(self.count, self.esz, n, self.me);
        if lo == hi {
            return;
        }
        let (off, k) = (lo * self.esz, hi - lo);
        let send = |j: usize| self.at(self.layout.send(j) + off).cast_const();
        let dst = self.at(self.layout.recv(self.me) + off);
        let mut others = (0..n).filter(|&j| j != self.me);
        // SAFETY: every pointer is a slice of `k` elements inside the
        // region (the layout); `dst` is the first input itself (in place)
        // or disjoint from every input; nobody else touches these slices
        // now (the caller's promise).
        unsafe {
            match others.next() {
                None => self.kernel.copy(dst, send(self.me), None, k, true),
                Some(first) => {
                    self.kernel
                        .reduce(dst, send(self.me), None, send(first), None, k, n == 2);
                    for (i, j) in others.enumerate() {
                        let last = i + 3 == n;
                        self.kernel
                            .reduce(dst, dst.cast_const(), None, send(j), None, k, last);
                    }
                }
            }
            for j in (0..n).filter(|&j| j != self.me) {
                let to = self.at(self.layout.recv(j) + off);
                gw_transport::copy_bytes(to, dst.cast_const(), k * self.esz);
            }
        }
    }

    fn wait(&self, limit: Option<Duration>) -> Result<bool> {
        poll_until(self.crowded, limit, || self.test())
    }

    /// Fails if a rank the running round waits for has gone (for good:
    /// `failed`), or if the round has run longer than `GW_TIMEOUT` (a
    /// later call may still see it complete).
    fn check_peers(&self, p: &mut Progress, phase: Phase, now: Instant) -> Result<()> {
        let r = p.next;
        let lines = self.layout.line(0);
        let behind = |j: usize| self.flag(j, phase).load(Ordering::Acquire) < r;
        if let Some((j, why)) = first_gone(&self.region, lines, self.layout.n, behind) {
            let e = Error::Remote {
                rank: j as u32,
                addr: "this host".into(),
                what: format!(
                    "{why}: it {} round {r} of a shared all-reduce",
                    phase.missing()
                ),
            };
            return Err(self.fail(p, e));
        }
        let waited = now.duration_since(p.started);
        if waited >= self.timeout {
            let missing: Vec<usize> = (0..self.layout.n).filter(|&j| behind(j)).collect();
            if !missing.is_empty() {
                return Err(Error::Timeout {
                    secs: waited.as_secs_f64(),
                    what: format!(
                        "round {r} of a shared all-reduce: rank(s) {missing:?} {} it (GW_TIMEOUT)",
                        phase.missing()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Records `e` as what stops every later call, tells the other ranks
    /// (who may wait for this one), and returns it.
    fn fail(&self, p: &mut Progress, e: Error) -> Error {
        p.failed = Some(e.clone());
        self.leave(Leaving::Failed);
        e
    }

    fn leave(&self, why: Leaving) {
        say_left(&self.region, self.layout.line(self.me) + LEFT_AT, why);
    }
}

impl Drop for RawSharedAllReduce {
    /// A request dropped without `free`: a running round on the host is
    /// waited for (at most `GW_TIMEOUT`) and its peers are told, so that
    /// none waits for it until `GW_TIMEOUT`. An engine request's plan stays
    /// in the engine, as a dropped [`RawPersistent`]'s does, and so do its
    /// buffers.
    fn drop(&mut self) {
        match &mut self.way {
            Way::Host(h) => {
                if h.progress().phase.is_some() {
                    let _ = h.wait(Some(h.timeout));
                }
                h.leave(Leaving::Freed);
            }
            // Without the communicator the plan cannot be freed, and the
            // engine keeps pointing at the buffers (and may still write
            // them): they are leaked rather than freed under it.
            Way::Engine { send, recv, .. } if !self.released.load(Ordering::Acquire) => {
                std::mem::forget(std::mem::take(send));
                std::mem::forget(std::mem::take(recv));
            }
            Way::Engine { .. } => {}
        }
    }
}

/// A persistent all-reduce on `T` buffers it owns (see the module
/// comment): write the input through [`SharedAllReduce::send_mut`], run a
/// round, read the result through [`SharedAllReduce::recv`]. Dropping it
/// waits for a running round and frees it.
pub struct SharedAllReduce<'a, T: Element> {
    comm: &'a Communicator,
    raw: Option<RawSharedAllReduce>,
    _t: PhantomData<T>,
}

impl<T: Element> SharedAllReduce<'_, T> {
    fn raw(&self) -> &RawSharedAllReduce {
        self.raw.as_ref().expect("present until drop")
    }

    /// Begins one round on what the send buffer holds now. A round still
    /// running is an `InvalidUsage` error.
    pub fn start(&mut self) -> Result<()> {
        let comm = self.comm;
        // SAFETY: the buffers are reachable only through `&mut self`
        // methods that refuse while a round runs.
        unsafe { self.raw().start(comm) }
    }

    /// Whether no round is running (true before the first start).
    pub fn test(&mut self) -> Result<bool> {
        let comm = self.comm;
        self.raw().test(comm)
    }

    /// Blocks until the running round, if any, completes.
    pub fn wait(&mut self) -> Result<()> {
        let comm = self.comm;
        self.raw().wait(comm)
    }

    /// Blocks at most `limit`; `Ok(false)` if the round is still running.
    pub fn wait_timeout(&mut self, limit: Duration) -> Result<bool> {
        let comm = self.comm;
        self.raw().wait_timeout(comm, limit)
    }

    /// See [`RawSharedAllReduce::on_host`].
    pub fn on_host(&self) -> bool {
        self.raw().on_host()
    }

    pub fn is_running(&self) -> bool {
        self.raw().is_running()
    }

    pub fn in_place(&self) -> bool {
        self.raw().in_place()
    }

    fn idle(&self, what: &str) -> Result<()> {
        if self.is_running() {
            return Err(Error::InvalidUsage(format!(
                "{what}: a round of this shared all-reduce is running; wait for it first"
            )));
        }
        Ok(())
    }

    /// The send buffer (in place: the one buffer), to write the next
    /// round's input; refused while a round runs.
    pub fn send_mut(&mut self) -> Result<&mut [T]> {
        self.idle("send_mut")?;
        let (p, n) = (self.raw().send_ptr(), self.raw().count());
        // SAFETY: `count` elements of `T`, aligned (a page or a cache line),
        // owned by the request; no round runs, so no rank reads or writes
        // them, and `&mut self` excludes other views here.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<T>(), n) })
    }

    /// The receive buffer (in place: the one buffer), with the last
    /// round's result; refused while a round runs.
    pub fn recv(&self) -> Result<&[T]> {
        self.idle("recv")?;
        let (p, n) = (self.raw().recv_ptr(), self.raw().count());
        // SAFETY: as for send_mut; start needs `&mut self`, so the view
        // ends before the next round writes.
        Ok(unsafe { std::slice::from_raw_parts(p.cast_const().cast::<T>(), n) })
    }
}

impl<T: Element> Drop for SharedAllReduce<'_, T> {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take()
            && let Err(e) = raw.free(self.comm)
        {
            tracing::debug!("freeing a shared all-reduce: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_whole_lines_cover_everything_and_do_not_overlap() {
        for esz in [1usize, 2, 4, 8] {
            for n in 1..=8 {
                for count in [0usize, 1, 7, 8, 15, 16, 17, 63, 64, 65, 1000, 4099] {
                    let mut next = 0;
                    for j in 0..n {
                        let (lo, hi) = slice(count, esz, n, j);
                        assert_eq!(lo, next, "esz {esz} n {n} count {count} rank {j}");
                        assert!(lo <= hi && hi <= count);
                        assert!(
                            (lo * esz).is_multiple_of(CACHE_LINE) || lo == count,
                            "esz {esz} n {n} count {count} rank {j}: starts at {lo}"
                        );
                        next = hi;
                    }
                    assert_eq!(next, count, "esz {esz} n {n} count {count}");
                }
            }
        }
    }

    #[test]
    fn buffers_sit_on_their_own_pages_after_the_lines() {
        let l = Layout::new(3, 5000, false);
        assert_eq!(l.stride, 8192);
        assert!(l.buffers_at() >= HEADER + 3 * LINE);
        assert_eq!(l.send(0) % PAGE, 0);
        assert_eq!(l.recv(0), l.send(0) + 3 * 8192);
        assert_eq!(l.total(), Some(l.buffers_at() + 6 * 8192));
        let p = Layout::new(3, 5000, true);
        assert_eq!(p.recv(2), p.send(2));
        assert_eq!(p.total(), Some(p.buffers_at() + 3 * 8192));
        assert_eq!(Layout::new(4, usize::MAX / 2, false).total(), None);
    }
}
