//! Persistent all-reduce among ranks that all share one host: every rank
//! writes its contribution once into a region every rank maps, and a round
//! costs one flag per rank (MiMatrix's GDRAA, on shared memory).
//!
//! The ordinary call, and a persistent round on the engine, move a small
//! all-reduce as messages: each exchange a frame through a pair's ring,
//! matched, checked and copied out, about two thousand instructions a call
//! at 8 bytes. A persistent request knows its buffers and its peers for its
//! whole life, so here the ranks agree on one host region at init
//! ([`Communicator::host_rounds`], through `gw_transport::shm::HostRegion`)
//! and a round is:
//!
//! - `start`: copy the send buffer (times the weight, if any) into this
//!   rank's mailbox of the round's parity, then publish the round number in
//!   this rank's line (Release);
//! - `test`/`wait`: once every rank's line shows the round (Acquire),
//!   reduce the n mailboxes in rank order into the receive buffer. Every
//!   rank adds in the same order, so all get the same bits (though not
//!   necessarily those of the ordinary call, whose order differs).
//!
//! Why two parities are enough, with no "done reading" counter: a rank
//! writes round r's mailbox only after it completed round r−1, which needs
//! every rank's line at r−1 or more; a rank publishes r−1 only in its
//! `start` of r−1, after it completed round r−2, the last round that read
//! the same parity. So nobody can still be reading what is overwritten, and
//! a line is never more than one round ahead of a rank that waits for it
//! (anything else is a corrupt region, reported as such).
//!
//! Nothing goes through the engine, the transports or the collective
//! sequence: a round needs no progress from anyone but the ranks' own
//! `start`s, so a rank may start and wait whenever it likes. A rank that
//! aborts or closes its communicator, frees its request, or stops on an
//! error says so in its line (`left`); one that dies is found by its pid,
//! and one that never starts by `GW_TIMEOUT`; an abort here stops the
//! wait. Each is an error naming the rank and the round.
//!
//! ```text
//!    0  magic "GWHOSTR1" u64, ranks u64, call u64 (`call_word`) (the creator's)
//!   64  line of rank i (64 bytes each): round u64 at 0, pid u64 at 16 (rank i's),
//!       left u64 at 24 (1: aborted, 2: closed its communicator, 3: failed,
//!       4: freed its request; [`Leaving`])
//!       mailboxes: parity 0 ranks 0..n, parity 1 ranks 0..n, `stride` each
//! ```

use crate::communicator::{Communicator, RawOp};
use crate::config::{OneSided, Source};
use crate::op::{DType, OpKind, RedOp};
use crate::reduce::Kernel;
use gw_transport::shm::{HostRegion, process_alive};
use gw_transport::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `GW_HOST_ROUND_BYTES`' default where every rank has a core: the
/// largest all-reduce that runs here. Every rank reads all n contributions
/// and reduces the whole vector, where the ordinary call's reduce-scatter
/// splits that work and, from 64 KiB at two ranks, copies each byte once
/// out of the peer's process. 2 ranks on the 2-core VM
/// (`scripts/persistent-vs-ordinary.sh -b 8 -e 4M -T 0.2`, medians of
/// per-round ordinary/host-round time, above 1 the host round faster; a run
/// of 3 rounds / one of 5): 2.67/3.33 at 8 B, 1.67/3.13 at 512 B, 1.12/1.05
/// at 2 KiB, 1.06/0.92 at 8 KiB, 1.19/1.13 at 32 KiB, 0.89/1.00 at 128 KiB,
/// 0.60/0.62 at 512 KiB.
pub const DEFAULT_MAX_BYTES: usize = 32 << 10;

/// The default where a host runs more ranks than it has cores: a waiting
/// rank can only yield its core, and a round needs every rank scheduled,
/// so from a few KiB the time swings with the scheduler. Same script, two
/// runs of 3 rounds: 3 ranks on 2 cores 3.37/1.86 at 2 KiB, 3.41/1.25 at 8
/// KiB, 1.77/0.56 at 32 KiB; 4 ranks 1.09/1.71, 0.65/1.46, 0.59/1.59.
pub const CROWDED_MAX_BYTES: usize = 2 << 10;

const MAGIC: u64 = u64::from_le_bytes(*b"GWHOSTR1");
/// Bytes of a host region's header, and of each rank's line.
pub(crate) const HEADER: usize = 64;
pub(crate) const LINE: usize = 64;
/// Where a rank's pid sits in its line.
pub(crate) const PID_AT: usize = 16;
/// Where a rank's `left` word sits in its line ([`Leaving`] as a number).
pub(crate) const LEFT_AT: usize = 24;
/// How long a waiting rank polls flat out before it starts yielding its
/// core (where every rank has one; elsewhere it yields from the start).
pub(crate) const SPIN: Duration = Duration::from_micros(200);
/// How often a waiting rank asks whether the ranks it waits for still run.
pub(crate) const LIVENESS_EVERY: Duration = Duration::from_millis(100);

/// Where things are in a region for `n` ranks of `bytes` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    n: usize,
    stride: usize,
}

impl Layout {
    fn new(n: usize, bytes: usize) -> Layout {
        Layout {
            n,
            stride: bytes.div_ceil(64).max(1) * 64,
        }
    }

    fn total(&self) -> usize {
        HEADER + self.n * LINE + 2 * self.n * self.stride
    }

    fn line(&self, rank: usize) -> usize {
        HEADER + rank * LINE
    }

    fn mailbox(&self, round: u64, rank: usize) -> usize {
        let parity = (round & 1) as usize;
        HEADER + self.n * LINE + (parity * self.n + rank) * self.stride
    }
}

/// The rounds of one persistent all-reduce on a host region.
pub(crate) struct HostRounds {
    /// Shared with the communicator's list of them, which tells each an
    /// abort or a close.
    region: Arc<HostRegion>,
    layout: Layout,
    me: usize,
    kernel: Kernel,
    count: usize,
    bytes: usize,
    weight: Option<f64>,
    send: *const u8,
    recv: *mut u8,
    /// `GW_TIMEOUT`: how long a wait may go without every rank starting.
    timeout: Duration,
    /// More ranks than cores here: a waiting rank yields at once.
    crowded: bool,
    abort: Arc<AtomicBool>,
    state: Mutex<State>,
}

// SAFETY: the raw pointers are the user's buffers, which the caller of
// `prepare_raw` promised stay valid and untouched while rounds run; all
// shared state is behind `state`'s mutex or in the region's atomics.
unsafe impl Send for HostRounds {}
// SAFETY: as above.
unsafe impl Sync for HostRounds {}

#[derive(Debug)]
struct State {
    /// The round `start` begins next (rounds count from 1: lines start 0).
    next: u64,
    running: bool,
    /// When the running round started, and when its ranks are next asked
    /// whether they still run (`test`, however it is called, asks).
    started: Instant,
    check_at: Instant,
    /// Polls since the clock was last read.
    polls: u32,
    /// A rank that exited or a corrupt region: every later call fails so.
    failed: Option<Error>,
}

impl Communicator {
    /// Sets up host rounds for the persistent all-reduce `op` if every rank
    /// agrees it can (see the module comment): each rank votes on what it
    /// knows (every peer over shared memory, `GW_HOST_ROUND_BYTES`, no
    /// algorithm forced by `GW_ALGO`, and no `GW_ONE_SIDED=1`, which asks
    /// for the transports' one-sided writes), rank 0 creates the region, the others
    /// open it, and two one-word all-reduces carry the votes, so either
    /// every rank runs rounds here or none does. Collective, like the init
    /// it is part of; `None` means the engine runs the rounds.
    pub(crate) fn host_rounds(
        &self,
        op: &RawOp,
        kernel: Kernel,
        count: usize,
        bytes: usize,
    ) -> Result<Option<HostRounds>> {
        // A deferred round one rank has numbered and another not would give
        // the ranks different keys (`region_key`): hand it over first.
        self.flush_deferred()?;
        let n = self.size() as usize;
        let cfg = self.config();
        let max = match cfg.host_round_bytes.source {
            Source::Default if self.crowded() => CROWDED_MAX_BYTES,
            _ => cfg.host_round_bytes.value,
        };
        let ok = self.all_peers_over_shm()
            && bytes > 0
            && bytes <= max
            && cfg.algo.value.is_none()
            && cfg.one_sided.value != OneSided::Always
            && op.kind == OpKind::AllReduce
            && op.redop != RedOp::None;
        let layout = Layout::new(n, bytes);
        let vote = Vote {
            ok,
            key: self.region_key(1),
            total: layout.total(),
            magic: MAGIC,
            // The layout follows from `total`; the call must match too.
            words: [n as u64, call_word(op.dtype, op.redop, count)],
            lines: layout.line(0),
        };
        let Some(region) = self.agree_on_region(vote)? else {
            return Ok(None);
        };
        tracing::debug!(
            "persistent all-reduce of {bytes} B: host rounds on {}",
            region.path().display()
        );
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
        Ok(Some(HostRounds {
            region,
            layout,
            me,
            kernel,
            count,
            bytes,
            weight: op.weight,
            send: op.send,
            recv: op.recv,
            timeout: cfg.timeout.value,
            crowded: self.crowded(),
            abort: self.abort_flag(),
            state: Mutex::new(State::new()),
        }))
    }

    /// Whether every peer is reached over shared memory.
    /// Tells the ranks of every live persistent host round why this one
    /// leaves (an abort, a close): those waiting for it stop, naming it.
    pub(crate) fn tell_host_rounds(&self, why: Leaving) {
        let lines = self
            .host_round_lines
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (region, off) in lines.iter() {
            if let Some(r) = region.upgrade() {
                say_left(&r, *off, why);
            }
        }
    }

    pub(crate) fn all_peers_over_shm(&self) -> bool {
        let me = self.rank() as usize;
        self.routes()
            .iter()
            .enumerate()
            .all(|(r, t)| r == me || *t == "shm")
    }

    /// A region key the same on every rank: the communicator, its sequence
    /// number now (every rank has drawn the same numbers so far) and what
    /// the region is for (`tag`).
    pub(crate) fn region_key(&self, tag: u8) -> u64 {
        self.comm_id
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(self.seq.load(Ordering::Relaxed))
            .wrapping_add(u64::from(tag) << 56)
    }

    /// The vote of every host region: each rank says whether it can
    /// (`v.ok`), rank 0 creates the region and writes its header, the
    /// others open it and check the header, each writes its pid in its
    /// line, and two one-byte all-reduces carry the votes, so either every
    /// rank maps the region or none does. Collective.
    pub(crate) fn agree_on_region(&self, v: Vote) -> Result<Option<HostRegion>> {
        let me = self.rank() as usize;
        let secret = self.shm_secret();
        let mut region = None;
        let mut ok = v.ok;
        if me == 0 && ok {
            match HostRegion::create(secret, v.key, v.total) {
                Ok(r) => {
                    word(&r, 8).store(v.words[0], Ordering::Relaxed);
                    word(&r, 16).store(v.words[1], Ordering::Relaxed);
                    word(&r, 0).store(v.magic, Ordering::Release);
                    region = Some(r);
                }
                Err(e) => {
                    tracing::info!("no host region: {e}");
                    ok = false;
                }
            }
        }
        if !self.everyone(ok)? {
            return Ok(None);
        }
        if me != 0 {
            match open_checked(secret, &v) {
                Ok(r) => region = Some(r),
                Err(e) => {
                    tracing::info!("no host region: {e}");
                    ok = false;
                }
            }
        }
        if let Some(r) = &region {
            word(r, v.lines + me * LINE + PID_AT)
                .store(u64::from(std::process::id()), Ordering::Release);
        }
        // Orders the openers' pids before anyone reads them, and the
        // creator's unlink after every open.
        let everyone = self.everyone(ok)?;
        let Some(mut region) = region.filter(|_| everyone) else {
            return Ok(None);
        };
        region.unlink();
        Ok(Some(region))
    }

    /// Whether `mine` holds on every rank (a one-word all-reduce).
    pub(crate) fn everyone(&self, mine: bool) -> Result<bool> {
        let mut v = [u8::from(mine)];
        self.all_reduce_in_place(&mut v, RedOp::Min)?;
        self.forget_auto_choice();
        Ok(v[0] == 1)
    }
}

/// The header word that says which call a region is for. Ranks that
/// disagree on it must not share the region (their slices or mailboxes
/// would not line up, or the bytes would be read as another type): none
/// opens it, and the engine's matching then names the mismatch.
pub(crate) fn call_word(dtype: DType, op: RedOp, count: usize) -> u64 {
    (count as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (dtype as u64) << 48 ^ (op as u64) << 56
}

/// Calls `test` until it says done, at most `limit` if given (`Ok(false)`
/// then): flat out for [`SPIN`], then yielding the core every 64 polls;
/// where ranks outnumber cores (`crowded`), yielding after every poll.
pub(crate) fn poll_until(
    crowded: bool,
    limit: Option<Duration>,
    mut test: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let t0 = Instant::now();
    let mut polls = 0u32;
    loop {
        if test()? {
            return Ok(true);
        }
        polls = polls.wrapping_add(1);
        if crowded {
            std::thread::yield_now();
        } else if !polls.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        let waited = t0.elapsed();
        if limit.is_some_and(|l| waited >= l) {
            return Ok(false);
        }
        if waited >= SPIN && !crowded {
            std::thread::yield_now();
        }
    }
}

/// What a rank knows when the ranks vote on a host region
/// ([`Communicator::agree_on_region`]).
pub(crate) struct Vote {
    /// This rank can use it.
    pub ok: bool,
    /// [`Communicator::region_key`].
    pub key: u64,
    /// The region's bytes.
    pub total: usize,
    /// The header: magic, then two words every rank must agree on.
    pub magic: u64,
    pub words: [u64; 2],
    /// Where line 0 starts (each rank's line is [`LINE`] bytes, its pid at
    /// [`PID_AT`]).
    pub lines: usize,
}

/// Rank `rank`'s round and pid words.
fn line(r: &HostRegion, layout: Layout, rank: usize) -> (&AtomicU64, &AtomicU64) {
    let at = layout.line(rank);
    (word(r, at), word(r, at + PID_AT))
}

/// The pid rank `rank` wrote in its line (lines from `lines`), if its
/// process has exited. A pid that is 0 or does not fit is unknown: alive.
pub(crate) fn exited(r: &HostRegion, lines: usize, rank: usize) -> Option<u32> {
    let pid = word(r, lines + rank * LINE + PID_AT).load(Ordering::Acquire);
    u32::try_from(pid)
        .ok()
        .filter(|&pid| pid != 0 && !process_alive(pid))
}

/// Why a rank left a host region (its `left` word): its peers waiting for
/// it stop at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaving {
    Aborted = 1,
    Closed = 2,
    /// A call of this rank on the region failed (a mismatch, a timeout).
    Failed = 3,
    /// Its persistent request was freed (host rounds only).
    Freed = 4,
}

/// Says in the `left` word at `off` why this rank leaves a host region;
/// the first reason stays (an aborted communicator is also closed later).
pub(crate) fn say_left(r: &HostRegion, off: usize, why: Leaving) {
    let _ = word(r, off).compare_exchange(0, why as u64, Ordering::AcqRel, Ordering::Acquire);
}

/// Why rank `rank` (lines from `lines`) left a host region, in words, if
/// it did.
pub(crate) fn why_left(r: &HostRegion, lines: usize, rank: usize) -> Option<&'static str> {
    let left = word(r, lines + rank * LINE + LEFT_AT).load(Ordering::Acquire);
    Some(match left {
        0 => return None,
        x if x == Leaving::Aborted as u64 => "aborted its communicator",
        x if x == Leaving::Closed as u64 => "closed its communicator",
        x if x == Leaving::Freed as u64 => "freed its persistent request",
        _ => "stopped on an error of its own",
    })
}

/// Why rank `j` (lines from `lines`) will post nothing more: it left (its
/// `left` word) or its process exited. A caller that found `j` missing
/// must look again after this says so: a rank descheduled between the two
/// looks may have seen `j` post, finish and leave meanwhile, and `j`'s
/// `left` word and exit come after its posts.
pub(crate) fn gone_why(r: &HostRegion, lines: usize, j: usize) -> Option<String> {
    why_left(r, lines, j)
        .map(str::to_string)
        .or_else(|| exited(r, lines, j).map(|pid| format!("exited (pid {pid})")))
}

/// The first of `n` ranks (lines from `lines`) that a round still waits
/// for (`behind`) and that will post nothing more, with why. Each rank is
/// asked again once it has gone (see `gone_why`).
pub(crate) fn first_gone(
    r: &HostRegion,
    lines: usize,
    n: usize,
    behind: impl Fn(usize) -> bool,
) -> Option<(usize, String)> {
    (0..n).filter(|&j| behind(j)).find_map(|j| {
        gone_why(r, lines, j)
            .filter(|_| behind(j))
            .map(|why| (j, why))
    })
}

/// The 8-byte word at `off` of a host region, shared by every rank.
pub(crate) fn word(r: &HostRegion, off: usize) -> &AtomicU64 {
    assert!(off.is_multiple_of(8) && off + 8 <= r.len());
    // SAFETY: in bounds and 8-aligned (the region is page aligned); the
    // region's control words are only ever accessed atomically.
    unsafe { &*r.as_ptr().add(off).cast::<AtomicU64>() }
}

/// Opens the region and checks that its creator laid it out as we would.
fn open_checked(secret: &str, v: &Vote) -> Result<HostRegion> {
    let r = HostRegion::open(secret, v.key, v.total)?;
    let seen = (
        word(&r, 0).load(Ordering::Acquire),
        word(&r, 8).load(Ordering::Relaxed),
        word(&r, 16).load(Ordering::Relaxed),
    );
    if seen != (v.magic, v.words[0], v.words[1]) {
        return Err(Error::Protocol(format!(
            "host region {}: header {:#x} {} {}, expected {:#x} {} {}",
            r.path().display(),
            seen.0,
            seen.1,
            seen.2,
            v.magic,
            v.words[0],
            v.words[1]
        )));
    }
    Ok(r)
}

impl State {
    fn new() -> State {
        let now = Instant::now();
        State {
            next: 1,
            running: false,
            started: now,
            check_at: now,
            polls: 0,
            failed: None,
        }
    }
}

impl Drop for HostRounds {
    /// A request freed while others wait for its next round: they stop,
    /// naming this rank, instead of waiting for `GW_TIMEOUT`.
    fn drop(&mut self) {
        self.leave(Leaving::Freed);
    }
}

impl HostRounds {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a round was started and not yet found complete.
    pub(crate) fn is_running(&self) -> bool {
        self.state().running
    }

    /// Begins the next round (see the module comment). A round still
    /// running (its peers not all started) is `Ok(false)`, and nothing is
    /// done; one complete but not yet looked at is finished first.
    ///
    /// # Safety
    /// The buffers given at init must be valid, and untouched by the caller
    /// until the round completes.
    pub(crate) unsafe fn start(&self) -> Result<bool> {
        let mut st = self.state();
        self.usable(&st)?;
        if st.running && !self.finish(&mut st)? {
            return Ok(false);
        }
        let r = st.next;
        let dst = self.at(self.layout.mailbox(r, self.me));
        // SAFETY: the mailbox holds `stride >= bytes` bytes inside the
        // region, nobody reads it until the line below says so (see the
        // module comment), and `send` is valid for `bytes` (init's promise).
        unsafe {
            match self.weight {
                Some(w) => self.kernel.copy(dst, self.send, Some(w), self.count, false),
                None => gw_transport::copy_bytes(dst, self.send, self.bytes),
            }
        }
        line(&self.region, self.layout, self.me)
            .0
            .store(r, Ordering::Release);
        st.running = true;
        st.started = Instant::now();
        st.check_at = st.started + LIVENESS_EVERY;
        Ok(true)
    }

    /// Fails if the communicator was aborted, or an earlier call found a
    /// rank gone or the region corrupt.
    fn usable(&self, st: &State) -> Result<()> {
        if self.abort.load(Ordering::Acquire) {
            return Err(Error::Aborted(
                "persistent all-reduce: the communicator was aborted".into(),
            ));
        }
        st.failed.clone().map_or(Ok(()), Err)
    }

    /// Whether no round is running, finishing one whose ranks all started.
    /// While they have not, every [`LIVENESS_EVERY`] a call asks whether
    /// the missing ranks still run, and past `GW_TIMEOUT` fails naming them.
    pub(crate) fn test(&self) -> Result<bool> {
        let mut st = self.state();
        self.usable(&st)?;
        if !st.running {
            return Ok(true);
        }
        let done = match self.finish(&mut st) {
            Ok(done) => done,
            Err(e) => return Err(self.fail(&mut st, e)),
        };
        if !done {
            st.polls = st.polls.wrapping_add(1);
            if st.polls.is_multiple_of(64) {
                let now = Instant::now();
                if now >= st.check_at {
                    st.check_at = now + LIVENESS_EVERY;
                    self.check_peers(&mut st, now)?;
                }
            }
        }
        Ok(done)
    }

    /// Waits for the running round, at most `limit` if given (`Ok(false)`
    /// then); fails as [`HostRounds::test`] does.
    pub(crate) fn wait(&self, limit: Option<Duration>) -> Result<bool> {
        poll_until(self.crowded, limit, || self.test())
    }

    /// Fails if a rank the running round waits for has exited (for good:
    /// `failed`), or if the round has run longer than `GW_TIMEOUT` (a
    /// later call may still see it complete).
    fn check_peers(&self, st: &mut State, now: Instant) -> Result<()> {
        let r = st.next;
        let round_of = |j: usize| line(&self.region, self.layout, j).0.load(Ordering::Acquire);
        let lines = self.layout.line(0);
        if let Some((j, why)) = first_gone(&self.region, lines, self.layout.n, |j| round_of(j) < r)
        {
            let e = Error::Remote {
                rank: j as u32,
                addr: "this host".into(),
                what: format!("{why} before starting round {r} of a persistent all-reduce"),
            };
            return Err(self.fail(st, e));
        }
        let waited = now.duration_since(st.started);
        if waited >= self.timeout {
            let missing: Vec<usize> = (0..self.layout.n).filter(|&j| round_of(j) < r).collect();
            if !missing.is_empty() {
                return Err(Error::Timeout {
                    secs: waited.as_secs_f64(),
                    what: format!(
                        "round {r} of a persistent all-reduce: rank(s) {missing:?} had not \
                         started it (GW_TIMEOUT)"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Records `e` as what stops every later call, tells the other ranks
    /// (who may wait for this one), and returns it.
    fn fail(&self, st: &mut State, e: Error) -> Error {
        st.failed = Some(e.clone());
        self.leave(Leaving::Failed);
        e
    }

    fn leave(&self, why: Leaving) {
        say_left(&self.region, self.layout.line(self.me) + LEFT_AT, why);
    }

    /// Completes the running round if every rank started it.
    fn finish(&self, st: &mut State) -> Result<bool> {
        let r = st.next;
        for j in 0..self.layout.n {
            let seen = line(&self.region, self.layout, j).0.load(Ordering::Acquire);
            if seen == r || seen == r + 1 {
                continue;
            }
            if seen.checked_add(1) == Some(r) {
                return Ok(false);
            }
            return Err(Error::Protocol(format!(
                "host region {}: rank {j} published round {seen} while rank {} waits for round {r}",
                self.region.path().display(),
                self.me
            )));
        }
        let n = self.layout.n;
        let m = |j: usize| self.at(self.layout.mailbox(r, j)).cast_const();
        // SAFETY: every mailbox of round r is complete (each line's Release
        // after its copy, our Acquire above) and stays put until we start
        // round r + 1 (module comment); `recv` is valid for `count`
        // elements, disjoint from the region, and `reduce` allows `dst`
        // equal to `a`.
        unsafe {
            self.kernel
                .reduce(self.recv, m(0), None, m(1), None, self.count, n == 2);
            for j in 2..n {
                self.kernel.reduce(
                    self.recv,
                    self.recv,
                    None,
                    m(j),
                    None,
                    self.count,
                    j == n - 1,
                );
            }
        }
        st.running = false;
        st.next = r + 1;
        Ok(true)
    }

    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off + self.bytes <= self.region.len());
        // SAFETY: callers pass offsets of the layout, inside the region.
        unsafe { self.region.as_ptr().add(off) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::DType;

    const SECRET: &str = "00112233445566778899aabbccddeeff";

    /// Rank 0 of a 2-rank request over a fresh region, with `peer_pid` in
    /// rank 1's line, summing one f64 from `buf` into itself.
    fn rank0(key: u64, peer_pid: u64, buf: &mut [f64; 1]) -> HostRounds {
        let layout = Layout::new(2, 8);
        let region = HostRegion::create(SECRET, key, layout.total()).expect("region");
        line(&region, layout, 1)
            .1
            .store(peer_pid, Ordering::Relaxed);
        let p = buf.as_mut_ptr().cast::<u8>();
        HostRounds {
            region: Arc::new(region),
            layout,
            me: 0,
            kernel: Kernel::new(DType::F64, RedOp::Sum, 2).expect("kernel"),
            count: 1,
            bytes: 8,
            weight: None,
            send: p,
            recv: p,
            timeout: Duration::from_secs(60),
            crowded: false,
            abort: Arc::new(AtomicBool::new(false)),
            state: Mutex::new(State::new()),
        }
    }

    fn key(k: u64) -> u64 {
        u64::from(std::process::id()) << 16 | k
    }

    #[test]
    fn a_peer_that_exited_is_named_with_its_pid() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("reap");
        let mut buf = [1.0];
        let h = rank0(key(1), u64::from(pid), &mut buf);
        // SAFETY: `buf` outlives `h`.
        assert!(unsafe { h.start() }.expect("start"));
        let e = h.wait(None).expect_err("the peer is gone").to_string();
        assert!(
            e.contains("rank 1") && e.contains(&format!("pid {pid}")) && e.contains("round 1"),
            "{e}"
        );
    }

    #[test]
    fn an_abort_stops_the_wait_and_a_line_out_of_step_is_corrupt_for_good() {
        let mut buf = [1.0];
        let h = rank0(key(2), 0, &mut buf);
        // SAFETY: `buf` outlives `h`.
        assert!(unsafe { h.start() }.expect("start"));
        assert!(!h.test().expect("rank 1 has not started"));
        h.abort.store(true, Ordering::Release);
        let e = h.wait(None).expect_err("aborted").to_string();
        assert!(e.contains("aborted"), "{e}");
        h.abort.store(false, Ordering::Release);
        // The peer's round 1 lands (its mailbox holds 2.0): 1 + 2.
        let at = h.layout.mailbox(1, 1);
        // SAFETY: inside the region, 8-aligned; nobody else uses it here.
        unsafe { h.region.as_ptr().add(at).cast::<f64>().write(2.0) };
        line(&h.region, h.layout, 1).0.store(1, Ordering::Release);
        assert!(h.wait(None).expect("complete"));
        assert_eq!(buf, [3.0]);
        // SAFETY: as above.
        assert!(unsafe { h.start() }.expect("round 2"));
        line(&h.region, h.layout, 1)
            .0
            .store(u64::MAX, Ordering::Release);
        for _ in 0..2 {
            let e = h.test().expect_err("a round from nowhere").to_string();
            assert!(
                e.contains("rank 1 published round 18446744073709551615"),
                "{e}"
            );
            assert!(e.contains("round 2"), "{e}");
        }
        // Told to the peer, which would stop waiting for this rank.
        assert_eq!(
            why_left(&h.region, h.layout.line(0), 0),
            Some("stopped on an error of its own")
        );
    }

    #[test]
    fn a_peer_that_left_is_named_with_why_and_a_freed_request_says_so() {
        let mut buf = [1.0];
        let h = rank0(key(3), 0, &mut buf);
        // SAFETY: `buf` outlives `h`.
        assert!(unsafe { h.start() }.expect("start"));
        say_left(&h.region, h.layout.line(1) + LEFT_AT, Leaving::Aborted);
        // A later reason does not replace the first.
        say_left(&h.region, h.layout.line(1) + LEFT_AT, Leaving::Closed);
        let e = h.wait(None).expect_err("rank 1 left").to_string();
        assert!(
            e.contains("rank 1") && e.contains("aborted its communicator") && e.contains("round 1"),
            "{e}"
        );
        let region = h.region.clone();
        let lines = h.layout.line(0);
        assert_eq!(
            why_left(&region, lines, 0),
            Some("stopped on an error of its own")
        );
        // A request that never failed says, when freed, that it was.
        let mut buf = [1.0];
        let h = rank0(key(4), 0, &mut buf);
        let region = h.region.clone();
        assert_eq!(why_left(&region, lines, 0), None);
        drop(h);
        assert_eq!(
            why_left(&region, lines, 0),
            Some("freed its persistent request")
        );
    }
}
