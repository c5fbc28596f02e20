//! Small blocking collectives among the ranks of one host, through one
//! region every rank maps: a slot and a counter per rank per call, no
//! frames (MPICH's intra-node "release/gather" collectives, Open MPI's
//! coll/sm).
//!
//! Over shared memory an 8-byte broadcast or reduce through the pair
//! rings costs each rank about two thousand instructions of framing,
//! matching and checks (`docs/performance.md`), two to three times MPI's
//! time. Here each rank owns a ring of [`SLOTS`] slots in a region agreed
//! at init (the same vote as `host_rounds.rs`), and every eligible call is
//! one round, numbered alike on every rank because collectives are called
//! in the same order everywhere:
//!
//! - each rank fills its slot of the round (a header naming the call, and
//!   its contribution where it has one) and publishes the round in the
//!   slot's round word (Release), which shares a cache line with the
//!   header and the first 32 bytes, so a small call moves one line per
//!   writer;
//! - it then reads what it needs once the writers' slots show the round
//!   (Acquire): everyone's slots for an all-reduce, all-gather and
//!   reduce-scatter, the root's for a broadcast's receivers, everyone's at
//!   a reduce's root; a broadcast's root and a reduce's other ranks read
//!   nothing and return at once, which is how a stream of broadcasts
//!   pipelines;
//! - it then publishes the round in its `done` word.
//!
//! A rank fills slot `r mod SLOTS` only once every rank's `done` shows
//! round `r − SLOTS`, so no slot is overwritten while anyone may still read
//! it; that wait is the only flow control, and the `done` words are read
//! again only once the last reading no longer covers the round. Every
//! reader checks the slot's header: a rank in another collective, or the
//! same with another count, type, operator or root, is a mismatch naming
//! both calls. A rank that reads nothing checks every other rank's header
//! of the round once it is there, without waiting for it (by that call or
//! a later one), and its `done` moves past the round only then. A rank
//! that aborts, closes its communicator or fails a call says so in its
//! line (`left`), and those waiting for it stop, naming it; one that dies
//! is found by its pid; both are looked for every 100 ms by whoever waits,
//! `test` loops included, and `GW_TIMEOUT` runs from the round's post.
//!
//! Which calls: barriers (a header, no payload), and all-reduce,
//! reduce-scatter, all-gather, broadcast and reduce whose slot payload is
//! at most `GW_HOST_COLL_BYTES`, with no
//! algorithm asked for, where every rank shares one host over shared
//! memory. A blocking call posts and reads at once. A non-blocking one
//! posts at once where its slot is free, else is queued and posted, in
//! order, by the next call, test or wait that finds the slot free, or by
//! the engine's turns and the direct path's waits (`Engine::pump_host`), so
//! that a rank blocked in a message or an engine collective still posts
//! rounds its peers wait for (it never waits: MPI's non-blocking
//! collectives return at once); it is read when its handle is tested or
//! waited for. A wait for a slot, however it is made, asks after the ranks
//! it waits for and times out like a round's. Rounds are posted and read in
//! order, so a wait also completes every earlier round,
//! and a handle dropped unwaited is completed by the next call that needs
//! its turn, or when the communicator goes. So blocking and non-blocking
//! calls still match each other, as they do on the engine. A call on the
//! engine and one here never wait for each other, as neither medium
//! orders the other (what they share is their numbering, below). After
//! an error the rounds' numbering can no longer be trusted, so later
//! calls here fail at once with the first error.
//!
//! Calls on the engine and here share one sequence of collective numbers
//! (the engine's `seq`), so that ranks whose calls of one position went to
//! different media are told, not left to `GW_TIMEOUT`: with counts that
//! put one rank's call here and another's on the engine, each would wait
//! for the other for ever. Every slot carries its call's number, and every
//! rank notes in its line the number and call of the last collective its
//! engine started. A rank waiting here for one whose line shows this
//! round's number on the engine, an engine operation stalled while another
//! rank's slot shows its number here, and a reader whose writer's slot
//! shows another number, each fail with a mismatch naming both calls. (A
//! rank whose mismatched call was non-blocking and followed by another on
//! the engine is found by that engine's stall check alone; an engine that
//! fails says so in its line, as a call that fails here does, and the
//! waiters here stop.)
//!
//! ```text
//!    0  magic "GWHOSTC1" u64, ranks u64, payload u64   (the creator's)
//!   64  line of rank i (64 bytes each): done u64 at 0, pid u64 at 16,
//!       left u64 at 24 (1: aborted, 2: closed its communicator, 3: failed),
//!       its last engine collective: number + 1 u64 at 32, call u64 at 40,
//!       count u64 at 48
//!       slots of rank 0 (SLOTS of them), of rank 1, ...: each a 32-byte
//!       header (round u64: the slot's `posted`, call u64, count u64, the
//!       call's number u64) and `payload` bytes, padded to a cache line
//! ```

use crate::communicator::{Communicator, RawOp};
use crate::host_rounds::{self, Leaving, Vote};
use crate::op::{DType, Fingerprint, OpKind, RedOp};
use crate::reduce::Kernel;
use gw_transport::shm::HostRegion;
use gw_transport::{Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `GW_HOST_COLL_BYTES`' default: the largest slot payload, which is what
/// a rank contributes (an all-reduce's or a broadcast's whole buffer, a
/// reduce-scatter's whole input).
pub const DEFAULT_MAX_BYTES: usize = 2 << 10;

/// Slots per rank: how many rounds a broadcast's root may run ahead.
pub(crate) const SLOTS: u64 = 16;

/// Rounds that read nothing left unchecked before a call checks them (see
/// [`HostColl::advance_checking`]); well under [`SLOTS`], so that this
/// rank's `done` never holds the others back.
const LAZY_CHECKS: usize = 8;

const MAGIC: u64 = u64::from_le_bytes(*b"GWHOSTC1");
/// A slot's header: round, call, count and collective number words. A
/// payload of up to 32 bytes shares its cache line, so a reader of a small
/// call takes one line per writer.
const SLOT_HEADER: usize = 32;
/// Where a slot's header keeps its call's collective number.
const SEQ_AT: usize = 24;
/// Where a rank's line notes its last collective on the engine (see the
/// module comment): its number plus one (0: none yet), call and count.
const ENGINE_SEQ_AT: usize = 32;
const ENGINE_CALL_AT: usize = 40;
const ENGINE_COUNT_AT: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    n: usize,
    payload: usize,
}

impl Layout {
    fn new(n: usize, max_bytes: usize) -> Layout {
        Layout {
            n,
            payload: max_bytes.max(1),
        }
    }

    fn lines(&self) -> usize {
        host_rounds::HEADER
    }

    fn line(&self, rank: usize) -> usize {
        self.lines() + rank * host_rounds::LINE
    }

    fn slot(&self, rank: usize, round: u64) -> usize {
        let i = rank as u64 * SLOTS + round % SLOTS;
        self.line(self.n) + i as usize * self.stride()
    }

    fn stride(&self) -> usize {
        (SLOT_HEADER + self.payload).div_ceil(64) * 64
    }

    fn total(&self) -> usize {
        self.slot(self.n, 0)
    }
}

/// One rank's view of the host region of its communicator's collectives.
pub(crate) struct HostColl {
    region: HostRegion,
    layout: Layout,
    me: usize,
    /// `GW_TIMEOUT`: how long a rank waits for the others to reach a call.
    timeout: Duration,
    /// More ranks than cores here: a waiting rank yields at once.
    crowded: bool,
    abort: Arc<AtomicBool>,
    /// Some non-blocking call is queued for its slot: whoever waits on this
    /// rank, in any call, posts it once the slot is free ([`HostColl::pump`]).
    queued: AtomicBool,
    /// Calls queued so far: for tests.
    queued_total: AtomicU64,
    state: Mutex<State>,
}

/// Where this rank's rounds stand.
struct State {
    /// The round the next call is given.
    next: u64,
    /// Non-blocking calls given rounds `next − unposted.len() .. next` and
    /// not yet posted, oldest first: their slot still held a round some
    /// rank had not finished, and a non-blocking call never waits (see
    /// [`HostColl::submit`]). Posted, in order, before any later round.
    unposted: VecDeque<Call>,
    /// Every rank's `done` was at least this when last read: slots of
    /// rounds up to this plus [`SLOTS`] are free without reading again.
    done_min: u64,
    /// Rounds posted and not yet read, oldest first: a non-blocking call's
    /// until its handle is tested or waited for, or a later call needs
    /// its slot. They complete in order, so `done` is always a prefix.
    pending: VecDeque<Posted>,
    /// The error that stopped the rounds.
    failed: Option<Error>,
    /// `failed` was found by [`HostColl::pump`], and no call has been told.
    unreported: bool,
    /// When a wait for the first unposted round's slot (or a blocking
    /// call's) first found it held: `GW_TIMEOUT` runs from there however
    /// that slot is waited for (`test` loops, short timed waits).
    slot_since: Option<Instant>,
    /// When a wait for the oldest unfinished round next asks whether the
    /// ranks it waits for still run, and polls since the clock was read:
    /// kept here, so that `test` loops and short timed waits ask too.
    check_at: Instant,
    polls: u32,
}

/// A call given to the region: what its round posts, and, while a
/// non-blocking one waits for its slot, what is queued.
pub(crate) struct Call {
    pub op: RawOp,
    pub kernel: Kernel,
    pub count: usize,
    /// Its collective number (the engine's `seq`).
    pub seq: u64,
}

/// A round this rank posted and has still to finish: to read, if it
/// reads anything, and to check the other ranks' headers against.
struct Posted {
    round: u64,
    op: RawOp,
    kernel: Kernel,
    count: usize,
    call: u64,
    /// Its collective number (the engine's `seq`).
    seq: u64,
    /// It reads slots (else its call returned at once: a broadcast's root,
    /// a reduce's other ranks), and has done so.
    reads: bool,
    finished: bool,
    /// When a wait first found the round missing someone: `GW_TIMEOUT` runs
    /// from there however the round is waited for (set then, not at post:
    /// a clock read per call is a tenth of an 8-byte call on this VM).
    waited_since: Option<Instant>,
}

// SAFETY: the region is shared memory reached through atomics and through
// slots whose ownership the round protocol hands over (module comment).
unsafe impl Send for HostColl {}
// SAFETY: as above; the rounds' state is behind a mutex.
unsafe impl Sync for HostColl {}

/// A call as its slot header names it.
fn call_word(kind: OpKind, dtype: DType, redop: RedOp, root: u32) -> u64 {
    kind as u64 | (dtype as u64) << 8 | (redop as u64) << 16 | u64::from(root) << 32
}

/// A call as a slot (`on` "the host region") or a line's engine note (`on`
/// "the engine") names it: `call` and `count` words, collective number.
fn describe(call: u64, count: u64, seq: u64, on: &str) -> String {
    let kind = OpKind::from_code(call as u8).map_or("?", |k| k.name());
    let dtype = DType::from_code((call >> 8) as u8).map_or("?", |d| d.name());
    let redop = RedOp::from_code((call >> 16) as u8).map_or("?", |o| o.name());
    let root = call >> 32;
    format!("{kind} of {count} {dtype} ({redop}, root {root}) on {on}, collective #{seq}")
}

const HERE: &str = "the host region";
const ENGINE: &str = "the engine";
/// Why one call of a position can be on each medium, for the mismatch.
const MEDIA: &str = " (a call takes the host region where its share is at most \
                     GW_HOST_COLL_BYTES and no algorithm is asked, else the engine: the ranks \
                     passed different counts, or asked an algorithm on some ranks only)";

impl Communicator {
    /// Sets up the host region of this communicator's small collectives if
    /// every rank agrees it can (see the module comment and
    /// [`Communicator::host_rounds`]). Collective: called once, at init.
    pub(crate) fn host_coll(&self) -> Result<Option<HostColl>> {
        let n = self.size() as usize;
        if n < 2 {
            return Ok(None);
        }
        let cfg = self.config();
        let max = cfg.host_coll_bytes.value;
        let layout = Layout::new(n, max);
        let ok = self.all_peers_over_shm() && max > 0 && cfg.algo.value.is_none();
        let vote = Vote {
            ok,
            key: self.region_key(2),
            total: layout.total(),
            magic: MAGIC,
            words: [n as u64, layout.payload as u64],
            lines: layout.line(0),
        };
        let Some(region) = self.agree_on_region(vote)? else {
            return Ok(None);
        };
        tracing::debug!(
            "collectives of up to {max} B on the host region {}",
            region.path().display()
        );
        Ok(Some(HostColl {
            region,
            layout,
            me: self.rank() as usize,
            timeout: cfg.timeout.value,
            crowded: self.crowded(),
            abort: self.abort_flag(),
            queued: AtomicBool::new(false),
            queued_total: AtomicU64::new(0),
            state: Mutex::new(State {
                next: 1,
                unposted: VecDeque::new(),
                done_min: 0,
                pending: VecDeque::new(),
                failed: None,
                unreported: false,
                slot_since: None,
                check_at: Instant::now(),
                polls: 0,
            }),
        }))
    }
}

impl HostColl {
    /// The bytes rank `me` puts in its slot for `kind` of `count` elements
    /// of `es` bytes on `n` ranks (broadcast: the root's).
    fn payload(kind: OpKind, count: usize, es: usize, n: usize) -> Option<usize> {
        let elems = match kind {
            OpKind::ReduceScatter => count.checked_mul(n)?,
            OpKind::AllReduce | OpKind::AllGather | OpKind::Broadcast | OpKind::Reduce => count,
            // A header and nothing else: every rank reads every other's.
            OpKind::Barrier => 0,
            _ => return None,
        };
        elems.checked_mul(es)
    }

    /// Whether `kind` of `count` elements of `es` bytes runs here (the same
    /// answer on every rank for the same call).
    pub(crate) fn takes(&self, kind: OpKind, count: usize, es: usize) -> bool {
        (count > 0 || kind == OpKind::Barrier)
            && Self::payload(kind, count, es, self.layout.n)
                .is_some_and(|b| b <= self.layout.payload)
    }

    /// Rounds given to calls so far; `None` once an error stopped them.
    pub(crate) fn rounds(&self) -> Option<u64> {
        let st = self.state();
        st.failed.is_none().then(|| st.next - 1)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        host_rounds::word(&self.region, off)
    }

    fn done(&self, rank: usize) -> &AtomicU64 {
        self.word(self.layout.line(rank))
    }

    /// The round word of rank `rank`'s slot of round `r`: its `posted`.
    fn posted(&self, rank: usize, r: u64) -> &AtomicU64 {
        self.word(self.layout.slot(rank, r))
    }

    fn at(&self, off: usize) -> *mut u8 {
        // SAFETY: callers pass offsets of the layout, inside the region.
        unsafe { self.region.as_ptr().add(off) }
    }

    fn not_aborted(&self) -> Result<()> {
        if self.abort.load(Ordering::Acquire) {
            return Err(Error::Aborted(
                "a collective on the host region: the communicator was aborted".into(),
            ));
        }
        Ok(())
    }

    /// Fails if the communicator was aborted or an error stopped the rounds.
    /// The first call to ask after an error found by [`HostColl::pump`]
    /// (on the engine's thread, say) gets that error itself; later ones
    /// are told the rounds stopped.
    fn usable(&self, st: &mut State) -> Result<()> {
        self.not_aborted()?;
        match &st.failed {
            None => Ok(()),
            Some(e) if std::mem::take(&mut st.unreported) => Err(e.clone()),
            Some(e) => Err(Error::InvalidUsage(format!(
                "collectives on the host region stopped after an earlier error: {e}"
            ))),
        }
    }

    /// Records `e` as what stopped the rounds, tells the other ranks (who
    /// may be waiting for this one), and returns it.
    fn fail(&self, st: &mut State, e: Error) -> Error {
        st.failed.get_or_insert_with(|| e.clone());
        self.leave(Leaving::Failed);
        e
    }

    /// Runs an eligible blocking call (see [`HostColl::takes`]) to its end;
    /// returns its round.
    ///
    /// # Safety
    /// As for [`Communicator::run_raw`]: the buffers of `call.op` are valid
    /// for the layout of its kind and count until this returns.
    pub(crate) unsafe fn run(&self, call: &Call) -> Result<u64> {
        let mut st = self.state();
        self.usable(&mut st)?;
        // Earlier non-blocking calls take their rounds first.
        self.post_unposted(&mut st, u64::MAX, Some(None))?;
        let r = st.next;
        self.slot_free(&mut st, r, Some(None))?;
        // SAFETY: forwarded from the caller.
        unsafe { self.post(&mut st, r, call) };
        st.next = r + 1;
        self.advance(&mut st, r, Some(None))?;
        Ok(r)
    }

    /// Gives an eligible non-blocking call its round and returns it;
    /// [`HostColl::test`] and [`HostColl::wait`] then complete it.
    ///
    /// Posted now if its slot is free; if not (a rank, maybe this one, has
    /// yet to finish the round the slot last held), posted by a later
    /// call, test or wait. Waiting here could deadlock a correct program:
    /// a rank [`SLOTS`] calls ahead that then waits for a message the
    /// laggard sends only before its own calls (MPI's non-blocking
    /// collectives return at once, and so do the engine's).
    ///
    /// # Safety
    /// As for [`Communicator::submit_raw`]: the buffers of `call.op` stay
    /// valid until the round completes (its send buffer is read when
    /// posted).
    pub(crate) unsafe fn submit(&self, call: Call) -> Result<u64> {
        let mut st = self.state();
        self.usable(&mut st)?;
        let r = st.next;
        let posted_before = self.post_unposted(&mut st, u64::MAX, None)?;
        if posted_before && self.slot_free(&mut st, r, None)? {
            // SAFETY: forwarded from the caller.
            unsafe { self.post(&mut st, r, &call) };
        } else {
            st.unposted.push_back(call);
            self.queued.store(true, Ordering::Release);
            self.queued_total.fetch_add(1, Ordering::Relaxed);
        }
        st.next = r + 1;
        Ok(r)
    }

    /// Whether round `r` is complete, reading what has arrived, without
    /// waiting.
    /// While another thread holds the rounds (waiting in a call), "not
    /// yet": a test never blocks.
    pub(crate) fn test(&self, r: u64) -> Result<bool> {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
        };
        if !self.post_unposted(&mut st, r, None)? {
            return Ok(false);
        }
        self.advance(&mut st, r, None)
    }

    /// Waits until round `r` is complete, at most `limit` if given
    /// (`Ok(false)` then).
    pub(crate) fn wait(&self, r: u64, limit: Option<Duration>) -> Result<bool> {
        let mut st = self.state();
        let t0 = limit.map(|_| Instant::now());
        if !self.post_unposted(&mut st, r, Some(limit))? {
            return Ok(false);
        }
        let left = limit.map(|l| l.saturating_sub(t0.map_or(Duration::ZERO, |t| t.elapsed())));
        self.advance(&mut st, r, Some(left))
    }

    /// Completes every round posted so far (a communicator going away).
    pub(crate) fn finish_all(&self) -> Result<()> {
        let mut st = self.state();
        let last = st.next - 1;
        self.post_unposted(&mut st, last, Some(None))?;
        self.advance_checking(&mut st, last, Some(None), true)
            .map(|_| ())
    }

    /// Tells the other ranks this one will post no more rounds (the first
    /// reason stays: an aborted communicator is also closed later).
    pub(crate) fn leave(&self, why: Leaving) {
        host_rounds::say_left(
            &self.region,
            self.layout.line(self.me) + host_rounds::LEFT_AT,
            why,
        );
    }

    /// The first round given to a call and not yet posted.
    fn first_unposted(st: &State) -> u64 {
        st.next - st.unposted.len() as u64
    }

    /// Posts the unposted calls, oldest first, up to round `upto`. `block`
    /// as in [`HostColl::advance`]: `None` posts those whose slots are
    /// free now. Returns whether every round up to `upto` is posted.
    fn post_unposted(
        &self,
        st: &mut State,
        upto: u64,
        block: Option<Option<Duration>>,
    ) -> Result<bool> {
        if st.unposted.is_empty() {
            // Every blocking call comes here: no clock read.
            return Ok(true);
        }
        // After an error nothing more is posted: the caller of a queued
        // call may take the error as its end and free its buffers.
        self.usable(st)?;
        let t0 = Instant::now();
        let all = loop {
            let r = Self::first_unposted(st);
            if r > upto || st.unposted.is_empty() {
                break Ok(true);
            }
            let left = block.map(|l| l.map(|l| l.saturating_sub(t0.elapsed())));
            match self.slot_free(st, r, left) {
                Ok(true) => {}
                other => break other,
            }
            let Some(u) = st.unposted.pop_front() else {
                break Ok(true);
            };
            // SAFETY: the buffers of a submitted call stay valid until it
            // completes (`submit`'s caller), and it has not.
            unsafe { self.post(st, r, &u) };
        };
        self.queued
            .store(!st.unposted.is_empty(), Ordering::Release);
        all
    }

    /// Non-blocking calls queued for their slot so far.
    pub(crate) fn queued_total(&self) -> u64 {
        self.queued_total.load(Ordering::Relaxed)
    }

    /// Whether a non-blocking call is queued for its slot.
    pub(crate) fn has_queued(&self) -> bool {
        self.queued.load(Ordering::Acquire)
    }

    /// Posts what queued calls' slots allow, without waiting, unless the
    /// rounds are busy in another thread. Called wherever this rank waits
    /// for anything else (the engine's loops, a blocking message), so that
    /// a rank blocked there still posts rounds its peers wait for, as MPI's
    /// progress rule asks. An error is kept for the calls to report.
    pub(crate) fn pump(&self) {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        // After an error there is nothing to post, and asking `usable`
        // would take the report meant for the next call.
        if st.failed.is_some() {
            return;
        }
        if self.post_unposted(&mut st, u64::MAX, None).is_err() {
            st.unreported = st.failed.is_some();
        }
    }

    /// Whether this rank's slot of round `r` is free: it last held round
    /// `r − SLOTS`, which every rank (this one too: its own pending rounds
    /// are read meanwhile) must have finished. `block` as in
    /// [`HostColl::advance`]. The `done` words are read only when what was
    /// seen last does not say so: each read moves their lines here. Every
    /// look, waiting or not, asks now and then whether the ranks waited
    /// for still run, and fails past `GW_TIMEOUT` ([`HostColl::watch_slot`]).
    fn slot_free(&self, st: &mut State, r: u64, block: Option<Option<Duration>>) -> Result<bool> {
        if r <= st.done_min + SLOTS {
            return Ok(true);
        }
        let n = self.layout.n;
        let free = |j: usize| self.done(j).load(Ordering::Acquire).saturating_add(SLOTS) >= r;
        let mut t0: Option<Instant> = None;
        let mut polls = 0u32;
        loop {
            if let Some(oldest) = st.pending.front().map(|p| p.round) {
                self.advance_checking(st, oldest, None, true)?;
            }
            if (0..n).all(free) {
                break;
            }
            if let Err(e) = self.watch_slot(st, r, &free) {
                return Err(self.fail(st, e));
            }
            let Some(limit) = block else {
                return Ok(false);
            };
            if !self.pause(&mut polls, &mut t0, limit) {
                return Ok(false);
            }
        }
        st.slot_since = None;
        st.done_min = (0..n)
            .map(|j| self.done(j).load(Ordering::Acquire))
            .min()
            .unwrap_or(0);
        Ok(true)
    }

    /// One pause of a wait that may last `limit`: a spin (a yield where
    /// ranks outnumber cores), and every 64th a look at the clock, which
    /// starts at the first such look; yields once the wait is past
    /// [`host_rounds::SPIN`]. `false` once `limit` has passed.
    fn pause(&self, polls: &mut u32, t0: &mut Option<Instant>, limit: Option<Duration>) -> bool {
        *polls = polls.wrapping_add(1);
        if self.crowded {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        if polls.is_multiple_of(64) {
            let waited = t0.get_or_insert_with(Instant::now).elapsed();
            if limit.is_some_and(|l| waited >= l) {
                return false;
            }
            if waited >= host_rounds::SPIN && !self.crowded {
                std::thread::yield_now();
            }
        }
        true
    }

    /// One look of a wait for round `r`'s slot (`free(j)`: rank `j` is done
    /// with what it last held): every 64th asks whether the communicator
    /// was aborted, every [`host_rounds::LIVENESS_EVERY`] whether the ranks
    /// waited for left or exited, and fails once the slot has been waited
    /// for longer than `GW_TIMEOUT`, counted from the first look that found
    /// it held, across calls.
    fn watch_slot(&self, st: &mut State, r: u64, free: &dyn Fn(usize) -> bool) -> Result<()> {
        let Some(now) = self.look(st)? else {
            return Ok(());
        };
        let since = *st.slot_since.get_or_insert(now);
        if !Self::liveness_due(st, now) {
            return Ok(());
        }
        let held = |j: usize| !free(j);
        self.still_waiting(&held, r, "free the slot for", now.duration_since(since))
    }

    /// Fills this rank's slot of round `r`, whose slot is free
    /// ([`HostColl::slot_free`]) and before which every round is posted,
    /// and publishes it.
    ///
    /// # Safety
    /// `op`'s send buffer is valid for its kind's layout.
    unsafe fn post(&self, st: &mut State, r: u64, c: &Call) {
        let Call {
            ref op,
            kernel,
            count,
            seq,
        } = *c;
        let (n, me) = (self.layout.n, self.me);
        let es = kernel.dtype.size();
        let call = call_word(op.kind, kernel.dtype, op.redop, op.root);
        let mine = self.layout.slot(me, r);
        self.word(mine + 8).store(call, Ordering::Relaxed);
        self.word(mine + 16).store(count as u64, Ordering::Relaxed);
        self.word(mine + SEQ_AT).store(seq, Ordering::Relaxed);
        if op.kind != OpKind::Broadcast || me == op.root as usize {
            let bytes = Self::payload(op.kind, count, es, n).unwrap_or(0);
            let dst = self.at(mine + SLOT_HEADER);
            // SAFETY: the slot holds `payload >= bytes` (`takes`), nobody
            // reads it before its round word says so, and `send` is valid
            // for `bytes` (the layout table; a barrier's, maybe null, is
            // not read).
            unsafe {
                match op.weight {
                    _ if bytes == 0 => {}
                    Some(w) => kernel.copy(dst, op.send, Some(w), bytes / es, false),
                    None => gw_transport::copy_bytes(dst, op.send, bytes),
                }
            }
        }
        if op.kind == OpKind::Broadcast && me == op.root as usize && op.recv.cast_const() != op.send
        {
            // SAFETY: the root's send and recv hold `count` elements, and
            // differ; its call returns without reading anything.
            unsafe { gw_transport::copy_bytes(op.recv, op.send, count * es) };
        }
        self.posted(me, r).store(r, Ordering::Release);
        let reads = match op.kind {
            OpKind::Broadcast => me != op.root as usize,
            OpKind::Reduce => me == op.root as usize,
            _ => true,
        };
        st.pending.push_back(Posted {
            round: r,
            op: *op,
            kernel,
            count,
            call,
            seq,
            reads,
            finished: false,
            waited_since: None,
        });
    }

    /// Finishes the pending rounds that can be: reads what rounds up to
    /// `r` read, and checks every round's headers. A round that reads
    /// nothing is checked once the others' headers are there, never waited
    /// for; `done` moves over the finished prefix. `block`: `None` only
    /// takes what has arrived; `Some(limit)` waits, at most `limit` if
    /// given. Returns whether round `r` is complete for its caller.
    fn advance(&self, st: &mut State, r: u64, block: Option<Option<Duration>>) -> Result<bool> {
        self.advance_checking(st, r, block, false)
    }

    /// [`HostColl::advance`]; `eager`: check the rounds that read nothing
    /// now. Otherwise a call that itself reads nothing (a broadcast's
    /// root, a reduce's other ranks) leaves them until [`LAZY_CHECKS`]
    /// wait: checking one reads the other ranks' header lines while they
    /// still write them, and in a batch, later, the calls do not pay for
    /// that.
    fn advance_checking(
        &self,
        st: &mut State,
        r: u64,
        block: Option<Option<Duration>>,
        eager: bool,
    ) -> Result<bool> {
        let complete = |st: &State| {
            r < Self::first_unposted(st)
                && st
                    .pending
                    .iter()
                    .all(|p| p.round > r || p.finished || !p.reads)
        };
        // A round already complete stays so, whatever failed since.
        if complete(st) && st.pending.front().is_none_or(|p| p.round > r) {
            return Ok(true);
        }
        self.usable(st)?;
        // Deferred only by calls that read nothing themselves: one that
        // reads waits for the others anyway, and checks what is pending.
        let defer = !eager
            && st.pending.len() < LAZY_CHECKS
            && st
                .pending
                .iter()
                .all(|p| p.round > r || !p.reads || p.finished);
        let mut t0: Option<Instant> = None;
        let mut polls = 0u32;
        loop {
            // A round that reads nothing found incomplete, then a later one
            // complete: its writers posted it before that one, so it is
            // there now; look again before returning, or a mismatch there
            // would go unseen by this call (found only by a later one).
            let mut skipped = false;
            let mut again = false;
            for p in st.pending.iter_mut() {
                if p.finished || (defer && !p.reads) {
                    continue;
                }
                let checks = self.checks(p);
                match self.arrived(p, &checks) {
                    Ok(true) => {}
                    Ok(false) if p.reads && p.round <= r => break,
                    Ok(false) => {
                        skipped |= !p.reads;
                        continue;
                    }
                    Err(e) => return Err(self.fail(st, e)),
                }
                // SAFETY: the slots checked are posted (`arrived`) and stay
                // until our `done` says we are through with them; the
                // round's buffers are valid until it completes (`run`'s and
                // `submit`'s callers).
                if let Err(e) = unsafe { self.finish(p, &checks) } {
                    return Err(self.fail(st, e));
                }
                p.finished = true;
                again |= skipped;
            }
            let mut through = None;
            while st.pending.front().is_some_and(|p| p.finished) {
                through = st.pending.pop_front().map(|p| p.round);
            }
            if let Some(round) = through {
                self.done(self.me).store(round, Ordering::Release);
            }
            if again {
                continue;
            }
            if complete(st) {
                return Ok(true);
            }
            if let Err(e) = self.watch(st) {
                return Err(self.fail(st, e));
            }
            let Some(limit) = block else {
                return Ok(false);
            };
            if !self.pause(&mut polls, &mut t0, limit) {
                return Ok(false);
            }
        }
    }

    /// While the oldest unfinished round waits: now and then, whether the
    /// ranks it waits for left or exited, and whether it has waited past
    /// `GW_TIMEOUT` since a wait first found it missing someone.
    fn watch(&self, st: &mut State) -> Result<()> {
        let Some(now) = self.look(st)? else {
            return Ok(());
        };
        if !Self::liveness_due(st, now) {
            return Ok(());
        }
        // The oldest round still missing someone's post.
        let missing_in = |p: &Posted| {
            let (round, checks) = (p.round, self.checks(p));
            move |j: usize| checks(j) && self.posted(j, round).load(Ordering::Acquire) < round
        };
        let n = self.layout.n;
        let Some(p) = st
            .pending
            .iter_mut()
            .find(|p| !p.finished && (0..n).any(missing_in(p)))
        else {
            return Ok(());
        };
        let since = *p.waited_since.get_or_insert(now);
        let (round, missing) = (p.round, missing_in(p));
        let (call, count, seq) = (p.call, p.count as u64, p.seq);
        for j in (0..n).filter(|&j| missing(j)) {
            if let Some((their_call, their_count)) = self.on_engine(j, seq) {
                return Err(Error::Mismatch {
                    me: self.me as u32,
                    peer: j as u32,
                    local: describe(call, count, seq, HERE),
                    remote: describe(their_call, their_count, seq, ENGINE) + MEDIA,
                });
            }
        }
        self.still_waiting(&missing, round, "reach", now.duration_since(since))
    }

    /// Rank `j`'s call of collective number `seq`, if its line says it went
    /// to the engine.
    fn on_engine(&self, j: usize, seq: u64) -> Option<(u64, u64)> {
        let line = self.layout.line(j);
        if self.word(line + ENGINE_SEQ_AT).load(Ordering::Acquire) != seq.wrapping_add(1) {
            return None;
        }
        Some((
            self.word(line + ENGINE_CALL_AT).load(Ordering::Relaxed),
            self.word(line + ENGINE_COUNT_AT).load(Ordering::Relaxed),
        ))
    }

    /// Notes in this rank's line that the engine runs collective `fp` (see
    /// the module comment): as it starts, before it can wait for anyone.
    /// Messages have no collective number.
    pub(crate) fn note_engine_call(&self, fp: &Fingerprint) {
        if fp.is_message() {
            return;
        }
        let seq = fp.seq;
        let line = self.layout.line(self.me);
        let call = call_word(fp.op, fp.dtype, fp.redop, fp.root);
        self.word(line + ENGINE_CALL_AT)
            .store(call, Ordering::Relaxed);
        self.word(line + ENGINE_COUNT_AT)
            .store(fp.count, Ordering::Relaxed);
        self.word(line + ENGINE_SEQ_AT)
            .store(seq.wrapping_add(1), Ordering::Release);
    }

    /// For an engine operation `fp` stalled (the engine's checks): another
    /// rank's slot holding the same collective number, a call this rank
    /// made on the engine and that one here, as a mismatch naming both.
    pub(crate) fn here_instead(&self, fp: &Fingerprint) -> Option<Error> {
        if fp.is_message() {
            return None;
        }
        for j in (0..self.layout.n).filter(|&j| j != self.me) {
            for k in 0..SLOTS {
                let slot = self.layout.slot(j, k);
                // Ever posted (round words start at 0, rounds at 1). A slot
                // being refilled may show the next round's number with the
                // last round's word: a number this rank drew for a call
                // here all the same, so a match is never false (the call
                // and count read may be the last round's).
                if self.word(slot).load(Ordering::Acquire) == 0
                    || self.word(slot + SEQ_AT).load(Ordering::Relaxed) != fp.seq
                {
                    continue;
                }
                let (call, count) = (
                    self.word(slot + 8).load(Ordering::Relaxed),
                    self.word(slot + 16).load(Ordering::Relaxed),
                );
                let local = format!("{fp} on {ENGINE}");
                return Some(Error::Mismatch {
                    me: self.me as u32,
                    peer: j as u32,
                    local,
                    remote: describe(call, count, fp.seq, HERE) + MEDIA,
                });
            }
        }
        None
    }

    /// One look of a wait: every 64th asks whether the communicator was
    /// aborted and reads the clock (`Some(now)`); the others return `None`.
    fn look(&self, st: &mut State) -> Result<Option<Instant>> {
        st.polls = st.polls.wrapping_add(1);
        if !st.polls.is_multiple_of(64) {
            return Ok(None);
        }
        self.not_aborted()?;
        Ok(Some(Instant::now()))
    }

    /// Whether a wait should ask after its ranks now: every
    /// [`host_rounds::LIVENESS_EVERY`], whoever waits.
    fn liveness_due(st: &mut State, now: Instant) -> bool {
        if now < st.check_at {
            return false;
        }
        st.check_at = now + host_rounds::LIVENESS_EVERY;
        true
    }

    /// A wait for the ranks `missing` in round `r`, `waited` long so far:
    /// fails naming one that left or exited, or all of them once past
    /// `GW_TIMEOUT`.
    fn still_waiting(
        &self,
        missing: &dyn Fn(usize) -> bool,
        r: u64,
        what: &str,
        waited: Duration,
    ) -> Result<()> {
        self.gone(missing, r, what)?;
        if waited >= self.timeout {
            return Err(self.late(missing, r, what, waited));
        }
        Ok(())
    }

    /// A rank `missing` that left or exited, as an error.
    fn gone(&self, missing: &dyn Fn(usize) -> bool, r: u64, what: &str) -> Result<()> {
        let lines = self.layout.line(0);
        match host_rounds::first_gone(&self.region, lines, self.layout.n, missing) {
            Some((j, why)) => Err(Error::Remote {
                rank: j as u32,
                addr: "this host".into(),
                what: format!(
                    "{why} before it could {what} round {r} of the host region's collectives"
                ),
            }),
            None => Ok(()),
        }
    }

    /// The timeout of a wait for the ranks `missing`.
    fn late(&self, missing: &dyn Fn(usize) -> bool, r: u64, what: &str, waited: Duration) -> Error {
        let missing: Vec<usize> = (0..self.layout.n).filter(|&j| missing(j)).collect();
        Error::Timeout {
            secs: waited.as_secs_f64(),
            what: format!(
                "in round {r} of the host region's collectives: rank(s) {missing:?} did not \
                 {what} it (GW_TIMEOUT); a rank may be in another collective, or in one larger \
                 than GW_HOST_COLL_BYTES"
            ),
        }
    }

    /// The ranks whose slots round `p` checks: those it reads, or, where
    /// it reads none, every other rank (each posts a header every round).
    fn checks(&self, p: &Posted) -> impl Fn(usize) -> bool + use<> {
        let (me, root, kind, reads) = (self.me, p.op.root as usize, p.op.kind, p.reads);
        move |j: usize| match kind {
            _ if !reads => j != me,
            OpKind::Broadcast => j == root,
            _ => true,
        }
    }

    /// Whether every slot round `p` reads holds it; a slot holding a later
    /// round, which the flow control forbids, is a corrupt region.
    fn arrived(&self, p: &Posted, writes: &impl Fn(usize) -> bool) -> Result<bool> {
        let mut all = true;
        for j in (0..self.layout.n).filter(|&j| writes(j)) {
            let seen = self.posted(j, p.round).load(Ordering::Acquire);
            if seen > p.round {
                return Err(Error::Protocol(format!(
                    "host region {}: rank {j}'s slot holds round {seen} while rank {} reads \
                     round {}",
                    self.region.path().display(),
                    self.me,
                    p.round
                )));
            }
            all &= seen == p.round;
        }
        Ok(all)
    }

    /// Checks that the slots of round `p` name the same call, then reads
    /// what it reads.
    ///
    /// # Safety
    /// As in [`HostColl::advance`].
    unsafe fn finish(&self, p: &Posted, checks: &impl Fn(usize) -> bool) -> Result<()> {
        let (n, me, r) = (self.layout.n, self.me, p.round);
        for j in (0..n).filter(|&j| checks(j)) {
            let slot = self.layout.slot(j, r);
            let seen = (
                self.word(slot + 8).load(Ordering::Relaxed),
                self.word(slot + 16).load(Ordering::Relaxed),
                self.word(slot + SEQ_AT).load(Ordering::Relaxed),
            );
            // Another number with the same round: a call between went to
            // the engine on one rank and here on the other.
            if seen != (p.call, p.count as u64, p.seq) {
                return Err(Error::Mismatch {
                    me: me as u32,
                    peer: j as u32,
                    local: describe(p.call, p.count as u64, p.seq, HERE),
                    remote: describe(seen.0, seen.1, seen.2, HERE),
                });
            }
        }
        let (op, kernel, count) = (&p.op, p.kernel, p.count);
        let es = kernel.dtype.size();
        let root = op.root as usize;
        let payload = |j: usize| self.at(self.layout.slot(j, r) + SLOT_HEADER).cast_const();
        // SAFETY (every arm): the slots read are complete (their round
        // words' Release, our Acquire in `arrived`) and stay until our
        // `done`; `recv` is valid for the kind's layout and outside the
        // region; `reduce` allows `dst` equal to `a`.
        match op.kind {
            // Its own copy was made when it posted.
            OpKind::Broadcast if me == root => {}
            OpKind::Broadcast => unsafe {
                gw_transport::copy_bytes(op.recv, payload(root), count * es)
            },
            OpKind::Reduce if me != root => {}
            OpKind::AllReduce | OpKind::Reduce => unsafe {
                reduce_into(kernel, op.recv, n, count, payload)
            },
            OpKind::ReduceScatter => {
                let block = count * es;
                unsafe { reduce_into(kernel, op.recv, n, count, |j| payload(j).add(me * block)) };
            }
            OpKind::AllGather => {
                for j in 0..n {
                    unsafe {
                        gw_transport::copy_bytes(
                            op.recv.add(j * count * es),
                            payload(j),
                            count * es,
                        )
                    };
                }
            }
            // Every rank's header is here: every rank has entered.
            OpKind::Barrier => {}
            other => {
                return Err(Error::Internal(format!(
                    "{} reached the host region",
                    other.name()
                )));
            }
        }
        Ok(())
    }
}

/// `recv = part(0) ⊕ … ⊕ part(n−1)` in rank order, with the operator's
/// final step (every rank adds in the same order, so all get the same bits).
///
/// # Safety
/// Each `part(j)` is readable and `recv` writable for `count` elements;
/// `recv` overlaps none of them.
unsafe fn reduce_into(
    kernel: Kernel,
    recv: *mut u8,
    n: usize,
    count: usize,
    part: impl Fn(usize) -> *const u8,
) {
    // SAFETY: forwarded; `reduce` allows `dst` equal to `a`.
    unsafe {
        kernel.reduce(recv, part(0), None, part(1), None, count, n == 2);
        for j in 2..n {
            kernel.reduce(recv, recv, None, part(j), None, count, j == n - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_and_cache_line_aligned() {
        for (n, max) in [(2, 8), (3, 2048), (8, 100)] {
            let l = Layout::new(n, max);
            let mut spans: Vec<(usize, usize)> = (0..n)
                .map(|j| (l.line(j), l.line(j) + host_rounds::LINE))
                .chain((0..n).flat_map(|j| {
                    (0..SLOTS).map(move |r| (l.slot(j, r), l.slot(j, r) + SLOT_HEADER + max))
                }))
                .collect();
            spans.sort();
            assert!(spans[0].0 >= host_rounds::HEADER);
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{spans:?}");
            assert!(
                spans
                    .iter()
                    .all(|s| s.0.is_multiple_of(64) && s.1 <= l.total())
            );
            assert_eq!(l.slot(1, 3), l.slot(1, 3 + SLOTS), "rounds wrap");
        }
    }

    #[test]
    fn payloads_follow_the_layout_table() {
        use OpKind::*;
        assert_eq!(HostColl::payload(ReduceScatter, 3, 4, 5), Some(60));
        for k in [AllReduce, AllGather, Broadcast, Reduce] {
            assert_eq!(HostColl::payload(k, 3, 4, 5), Some(12));
        }
        assert_eq!(HostColl::payload(SendRecv, 3, 4, 5), None);
        assert_eq!(HostColl::payload(ReduceScatter, usize::MAX, 4, 5), None);
        let d = describe(
            call_word(Broadcast, DType::F32, RedOp::None, 3),
            7,
            12,
            ENGINE,
        );
        assert!(
            d.contains("broadcast")
                && d.contains("7 float")
                && d.contains("root 3")
                && d.contains("on the engine, collective #12"),
            "{d}"
        );
    }
}
