//! Small all-reduces, all-gathers, reduce-scatters, broadcasts and reduces
//! carried out straight through by the calling thread.
//!
//! For a message of a few bytes the exchange itself takes a microsecond
//! over shared memory, and the general path around it (queueing the
//! operation, its completion, the schedule cache, registering both buffers,
//! the engine's turn bookkeeping) costs more than that. MPI libraries answer
//! small all-reduces from a dedicated path for the same reason. Here a
//! blocking all-reduce that recursive doubling would run as one segment per
//! round, on a power-of-two world and without a weight (see
//! `algo::rd::direct_rounds`), is run by the caller under the engine's lock
//! when the engine has nothing else to do: per round one send from the
//! caller's buffer, one receive into scratch, one reduction into the result.
//! A small all-gather that the recursive doubling schedule would run (or the
//! ring, on two ranks: the same single exchange; see
//! `algo::rd_gather::direct_rounds`) goes the same way: per round the blocks
//! gathered so far out, the partner's straight into their place. A
//! small reduce-scatter likewise runs the recursive halving schedule's
//! exchanges (`algo::rh_scatter::direct_rounds`), its partial sums in
//! scratch, and a small broadcast or reduce this rank's edges of the
//! schedules' chain or tree (`algo::coll::direct_tree`), one message each.
//! A small blocking send, receive or sendrecv moves what the transport can
//! move at once (`Engine::run_direct_message`), its messages tagged as the
//! P2p schedule tags them (`algo/p2p.rs`), and leaves the rest to the
//! engine: a ping-pong of 8 bytes over shared memory cost about 1.2 µs a
//! message through the engine's queue, its completion and its turn
//! bookkeeping.
//!
//! The frames are exactly those of the schedules (same tags, same steps,
//! same sizes), so a rank on this path and a rank running the schedule
//! (its engine was busy, or `GW_INLINE=0`) still meet. A peer that is late
//! is waited for by spinning for `spin_us`, then by short sleeps; failures,
//! the timeout and disagreements are detected and reported as on the
//! general path.

use super::user_regs::Mem;
use super::{
    Engine, PEER_CHECK_EVERY, Ptr, STALL, STALL_CHECKS, aborted, consult_board, failed_earlier,
};
use crate::algo::coll::Tree;
use crate::op::Fingerprint;
use crate::reduce::Kernel;
use gw_transport::{Error, Now, Outstanding, Rank, Request, Result, SendHint, Tag};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a caller waiting for a late peer sleeps between looks, once
/// it spun for `spin_us`: about what a wake-up through the poller costs on
/// a VM. After `NAP_SHORT_FOR` of waiting (a peer that far behind is
/// computing, not sending) it looks every `LONG_NAP`, about 1% of a core.
const NAP: Duration = Duration::from_micros(50);
const NAP_SHORT_FOR: Duration = Duration::from_millis(5);
const LONG_NAP: Duration = Duration::from_micros(250);

/// Direct operations run in this process (tests check that the path ran).
static DIRECT_CALLS: AtomicU64 = AtomicU64::new(0);

/// Small all-reduces run straight through by callers so far, process-wide.
#[doc(hidden)]
pub fn direct_calls() -> u64 {
    DIRECT_CALLS.load(Ordering::Relaxed)
}

/// One exchange's partner: the transport to it, its rank, the tag.
#[derive(Clone, Copy)]
struct Leg {
    t: usize,
    peer: Rank,
    tag: Tag,
}

/// Where an exchange's incoming bytes land.
#[derive(Clone, Copy)]
enum Land {
    /// Nothing comes in (a send only).
    Nowhere,
    /// At the start of scratch, where a reduction reads them.
    Scratch,
    /// At their place in the caller's output, which nothing else of the
    /// call touches meanwhile: stored there, they need no second copy out
    /// of scratch (a 2-rank 64 KiB broadcast's receiver copied every byte
    /// twice).
    At(Ptr),
}

/// Size from which a direct reduce's messages are hinted
/// `SendHint::Stored`. 2 ranks over shm, pulled against pushed, 5 rounds:
/// 16 KiB 0.94x as fast (the pull's system call costs more than the copy
/// it saves), 32 KiB 1.10x, 64 KiB 1.34x.
const REDUCE_STORED_FROM: usize = 32 << 10;

/// A send [`Engine::direct_start`] began: its request and registration
/// where it had to be posted, nothing where it went at once.
#[derive(Default)]
struct Started {
    req: Option<Request>,
    mem: Option<Mem>,
}

/// Which collective a [`DirectOp`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirectShape {
    /// `count` elements reduced into `recv`.
    AllReduce,
    /// `count` elements of each rank gathered into `recv`, rank by rank.
    AllGather,
    /// `n` blocks of `count` elements in `send`, this rank's block of
    /// their sums into `recv`.
    ReduceScatter,
    /// `count` elements from the root's `send` into every `recv`, down
    /// this rank's edges of the tree.
    Broadcast(Tree),
    /// `count` elements of every `send` summed into the root's `recv`, up
    /// the tree; this rank adds its children's partial sums to its own.
    Reduce(Tree),
}

/// One half of a [`DirectMessage`]: the peer, the pair's message number in
/// that direction (the P2p schedule's step, so that its tag is the one a
/// peer on the general path uses), and its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub peer: Rank,
    pub step: u32,
    pub bytes: usize,
}

/// A small blocking point-to-point transfer for
/// [`Engine::run_direct_message`]: a message out of `send`, one into
/// `recv`, or both (`Communicator::send`, `recv`, `sendrecv`).
pub(crate) struct DirectMessage {
    pub fp: Fingerprint,
    pub send: Ptr,
    pub recv: Ptr,
    pub to: Option<Part>,
    pub from: Option<Part>,
}

/// The halves of a [`DirectMessage`] that the direct path left to the
/// general one; nothing of them was sent or consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Left {
    pub send: bool,
    pub recv: bool,
}

/// A small collective for [`Engine::run_direct`].
pub(crate) struct DirectOp {
    pub shape: DirectShape,
    pub fp: Fingerprint,
    pub kernel: Kernel,
    pub send: Ptr,
    pub recv: Ptr,
    /// Elements (a rank's block, for an all-gather or reduce-scatter), and
    /// their size in bytes.
    pub count: usize,
    pub bytes: usize,
    /// Recursive doubling (or halving) rounds, log2 of the world size; 0
    /// for a broadcast or reduce, whose tree says what to do.
    pub rounds: u32,
}

impl DirectShape {
    /// The algorithm, for errors.
    fn algorithm(self) -> &'static str {
        match self {
            DirectShape::AllReduce | DirectShape::AllGather => "recursive doubling",
            DirectShape::ReduceScatter => "recursive halving",
            DirectShape::Broadcast(t) | DirectShape::Reduce(t) if t.chain => "chain",
            DirectShape::Broadcast(_) | DirectShape::Reduce(_) => "tree",
        }
    }
}

impl DirectOp {
    /// The largest message of a round: the whole buffer for an
    /// all-reduce, broadcast or reduce, half of the blocks for an
    /// all-gather's last round and a reduce-scatter's first.
    fn largest_message(&self) -> usize {
        match self.shape {
            DirectShape::AllReduce | DirectShape::Broadcast(_) | DirectShape::Reduce(_) => {
                self.bytes
            }
            DirectShape::AllGather | DirectShape::ReduceScatter => {
                self.bytes << self.rounds.saturating_sub(1)
            }
        }
    }

    /// Scratch the operation needs: its largest message where a reduction
    /// reads it, and for a reduce-scatter or reduce as much again after it
    /// for the partial sums. An all-gather's and a broadcast's messages
    /// land in the caller's output.
    fn scratch_bytes(&self) -> usize {
        match self.shape {
            DirectShape::ReduceScatter | DirectShape::Reduce(_) => 2 * self.largest_message(),
            DirectShape::AllReduce => self.largest_message(),
            DirectShape::AllGather | DirectShape::Broadcast(_) => 0,
        }
    }
}

/// How long a direct operation has waited, for the checks the general path
/// makes on stalled operations. The clock is read only once the operation
/// waits, and then every [`CLOCK_EVERY`] idle turns: an exchange that does
/// not wait reads it not at all (a read costs as much as the exchange).
struct Waiting {
    /// Whom the operation waits for, and how (for the timeout error).
    peer: Rank,
    what: &'static str,
    /// Idle turns since something last moved.
    idle_turns: u32,
    clock: Option<Clock>,
    posted: bool,
}

/// Set when the operation first waited; the deadline counts from there.
struct Clock {
    /// When something last moved (or the wait began).
    since: Instant,
    /// The last clock read.
    last_look: Instant,
    last_check: Instant,
    deadline: Instant,
    stalled_at: Instant,
}

const CLOCK_EVERY: u32 = 64;

/// How often a blocking message's wait turns the transports (see
/// `direct_message`).
const PROGRESS_EVERY: u32 = 8;

impl Engine {
    /// Runs `op` now if the engine is idle; `None` if operations are queued
    /// or running, which the caller's must follow (it submits it instead).
    /// The operation's sequence number is drawn from `seq` only here, once
    /// it is sure to run now: drawn earlier, a submission from another
    /// thread could take the next number and reach the engine first.
    pub fn run_direct(&mut self, op: &mut DirectOp, seq: &AtomicU64) -> Option<Result<()>> {
        if !self.is_idle() {
            return None;
        }
        op.fp.seq = seq.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = &self.host_coll {
            h.note_engine_call(&op.fp);
        }
        if let Err(e) = self.direct_may_run() {
            return Some(Err(e));
        }
        // As on the general path, scratch that cannot be had fails this
        // operation only (every rank fails it alike).
        if let Err(e) = self.ensure_scratch(op.scratch_bytes()) {
            return Some(Err(e));
        }
        DIRECT_CALLS.fetch_add(1, Ordering::Relaxed);
        let mut w = Waiting {
            peer: 0,
            what: "",
            idle_turns: 0,
            clock: None,
            posted: false,
        };
        Some(self.direct(op, &mut w).map_err(|e| {
            let e = self.explain(e);
            self.fail(e.clone());
            e
        }))
    }

    /// An error if this engine failed earlier or the application aborted.
    fn direct_may_run(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(failed_earlier(e));
        }
        if self.abort.load(Ordering::Acquire) {
            let e = aborted();
            self.fail(e.clone());
            return Err(e);
        }
        Ok(())
    }

    /// Moves what of `m` the transports can move at once, if the engine is
    /// idle (`None` if not: everything goes the general way, after what is
    /// queued): the send if the transport takes it now
    /// (`Transport::send_now`; what a socket did not take of it the
    /// transport writes later, and the engine is not idle until it has:
    /// `Transport::unsent`), then the receive if its message is the
    /// next from its peer, or comes within `spin_us` (`recv_now`). Only
    /// moves that finish are made; the rest, untouched, is left to the
    /// general path (`Left`). So the caller never holds the engine waiting
    /// for a peer longer than a spin, as the P2p schedule on the engine
    /// would not: a receive may wait a long time for its send (pipeline
    /// parallelism), and meanwhile other threads' operations must run.
    /// Messages need no sequence number: their tags are told apart by
    /// their steps, on either path.
    pub fn run_direct_message(&mut self, m: &DirectMessage) -> Option<Result<Left>> {
        if !self.is_idle() {
            return None;
        }
        Some(self.direct_may_run().and_then(|()| {
            self.direct_message(m).map_err(|e| {
                let e = self.explain(e);
                self.fail(e.clone());
                e
            })
        }))
    }

    fn direct_message(&mut self, m: &DirectMessage) -> Result<Left> {
        let mut left = Left {
            send: m.to.is_some(),
            recv: m.from.is_some(),
        };
        if let Some(p) = m.to {
            let Some(t) = self.ready_transport(p.peer)? else {
                return Ok(left);
            };
            // As the general path hints a message (engine.rs).
            let hint = match m.from {
                _ if self.cfg.oversubscribed => None,
                Some(from) if from.peer == p.peer => Some(SendHint::Exchanged),
                _ => Some(SendHint::Stored),
            };
            // SAFETY: the caller's input, `bytes` long, valid and unwritten
            // until the blocking call returns.
            let out = unsafe { std::slice::from_raw_parts(m.send.0.cast_const(), p.bytes) };
            match self.transports[t].send_now(p.peer, m.fp.tag(p.step), out, hint)? {
                Now::Done => left.send = false,
                Now::Empty | Now::Later => return Ok(left),
            }
            DIRECT_CALLS.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(p) = m.from {
            let Some(t) = self.ready_transport(p.peer)? else {
                return Ok(left);
            };
            // SAFETY: the caller's output, `bytes` long, which nothing else
            // touches until the blocking call returns.
            let into = unsafe { std::slice::from_raw_parts_mut(m.recv.0, p.bytes) };
            let tag = m.fp.tag(p.step);
            let mut since: Option<Instant> = None;
            // From 1: a message that is there within a few looks (a
            // ping-pong's) never reads the clock.
            for turn in 1u32.. {
                match self.transports[t].recv_now(p.peer, tag, into)? {
                    Now::Done => {
                        left.recv = false;
                        DIRECT_CALLS.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Now::Later => break,
                    Now::Empty => {}
                }
                // The rest of the transports' work waits a few looks: a
                // message that lands while a look's progress runs is seen
                // only after it. Not where each turn yields the processor:
                // a few turns are several time slices there.
                if self.cfg.oversubscribed || turn.is_multiple_of(PROGRESS_EVERY) {
                    for tr in &mut self.transports {
                        tr.poke();
                        tr.progress()?;
                    }
                    self.pump_host();
                }
                // The clock is read only every CLOCK_EVERY turns: a read
                // costs as much as a look at the ring.
                if turn.is_multiple_of(CLOCK_EVERY) {
                    // The application may abort from another thread.
                    if self.abort.load(Ordering::Acquire) {
                        return Err(aborted());
                    }
                    let now = Instant::now();
                    if now.duration_since(*since.get_or_insert(now)) >= self.cfg.spin {
                        break;
                    }
                }
                if self.cfg.oversubscribed {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        Ok(left)
    }

    fn direct(&mut self, op: &DirectOp, w: &mut Waiting) -> Result<()> {
        match op.shape {
            DirectShape::AllReduce => self.direct_all_reduce(op, w),
            DirectShape::AllGather => self.direct_all_gather(op, w),
            DirectShape::ReduceScatter => self.direct_reduce_scatter(op, w),
            DirectShape::Broadcast(tree) => self.direct_broadcast(op, tree, w),
            DirectShape::Reduce(tree) => self.direct_reduce(op, tree, w),
        }
    }

    fn direct_all_reduce(&mut self, op: &DirectOp, w: &mut Waiting) -> Result<()> {
        let me = self.cfg.me;
        for j in 0..op.rounds {
            let peer: Rank = me ^ (1 << j);
            let t = self.direct_connect(op, peer, w)?;
            // Round 0 sends the caller's input, later rounds the partial sum.
            let src = if j == 0 { op.send } else { op.recv };
            let tag = op.fp.tag(j + 1);
            self.direct_exchange(op, Leg { t, peer, tag }, src, op.bytes, w)?;
            let got = self.scratch.as_ptr().cast::<u8>();
            // SAFETY: src and recv hold `count` elements (the caller's layout),
            // scratch at least `bytes`; recv is src or disjoint from it.
            unsafe {
                op.kernel.reduce(
                    op.recv.0,
                    src.0,
                    None,
                    got,
                    None,
                    op.count,
                    j + 1 == op.rounds,
                )
            };
        }
        Ok(())
    }

    /// Round `j` (step `j`, as `rd_gather.rs` numbers it) swaps the `2^j`
    /// blocks of this rank's aligned group, contiguous in `recv`, with the
    /// rank across bit `j`.
    fn direct_all_gather(&mut self, op: &DirectOp, w: &mut Waiting) -> Result<()> {
        let me = self.cfg.me as usize;
        let block = op.bytes;
        // SAFETY: recv holds a block per rank (the caller's layout); send,
        // one block, is either recv's block `me` (in place) or disjoint.
        let at = |b: usize| Ptr(unsafe { op.recv.0.add(b * block) });
        let copy_own = at(me).0 != op.send.0;
        for j in 0..op.rounds {
            let k = 1usize << j;
            let peer = me ^ k;
            let leg = self.direct_leg(op, peer, j, w)?;
            let (mine, theirs) = (me & !(k - 1), peer & !(k - 1));
            let len = k * block;
            // Round 0 sends this rank's block from the input, and copies
            // it into the output while the peer's comes.
            let src = if j == 0 { op.send } else { at(mine) };
            let started = self.direct_start(op, leg, src, len)?;
            if j == 0 && copy_own {
                // SAFETY: as above; disjoint, both `block` bytes; the
                // send only reads the input.
                unsafe { gw_transport::copy_bytes(at(me).0, op.send.0.cast_const(), block) };
            }
            // The peer's blocks in recv are `len` bytes, disjoint from
            // ours, and no other part of this call touches them.
            self.direct_finish(op, leg, started, Land::At(at(theirs)), len, w)?;
        }
        Ok(())
    }

    /// Round `j` (step `j`, as `rh_scatter.rs` numbers it) gives the half
    /// of the blocks still held that the rank across bit `log2 n - 1 - j`
    /// keeps, and adds that rank's copy of the other half: from `send` in
    /// round 0, then from the partial sums after the landing area in
    /// scratch, into `recv` in the last round.
    fn direct_reduce_scatter(&mut self, op: &DirectOp, w: &mut Waiting) -> Result<()> {
        let me = self.cfg.me as usize;
        let (n, block) = (1usize << op.rounds, op.bytes);
        let half = n / 2;
        let got = self.scratch.as_mut_ptr().cast::<u8>();
        // SAFETY: scratch holds twice the largest message (`scratch_bytes`).
        let acc = unsafe { got.add(half * block) };
        let acc_lo = if me & half == 0 { 0 } else { half };
        // SAFETY (both): send holds `n` blocks (the caller's layout); the
        // partial sums cover the `half` blocks from `acc_lo`, which every
        // later round's blocks lie within.
        let send_at = |b: usize| unsafe { op.send.0.add(b * block) };
        let acc_at = |b: usize| unsafe { acc.add((b - acc_lo) * block) };
        let mut lo = 0;
        for j in 0..op.rounds {
            let mask = n >> (j + 1);
            let peer = me ^ mask;
            let (keep, give) = if me & mask == 0 {
                (lo, lo + mask)
            } else {
                (lo + mask, lo)
            };
            let leg = self.direct_leg(op, peer, j, w)?;
            let src = Ptr(if j == 0 { send_at(give) } else { acc_at(give) });
            self.direct_exchange(op, leg, src, mask * block, w)?;
            let last = j + 1 == op.rounds;
            let a = if j == 0 { send_at(keep) } else { acc_at(keep) };
            let dst = if last { op.recv.0 } else { acc_at(keep) };
            // SAFETY: `mask` blocks at each of dst, a and the landed message;
            // dst is a (the partial sums), or recv, which in place is send's
            // block `me`: read by round 0 only, written by the last round
            // (the same round only on two ranks, where dst is then a).
            unsafe {
                op.kernel
                    .reduce(dst, a, None, got, None, mask * op.count, last)
            };
            lo = keep;
        }
        Ok(())
    }

    /// The root sends its input to its children and copies it to its
    /// output; any other rank receives from its parent and passes that on.
    /// One message per edge, step 0, as `coll::broadcast` sends a message
    /// of one segment.
    fn direct_broadcast(&mut self, op: &DirectOp, tree: Tree, w: &mut Waiting) -> Result<()> {
        let len = op.bytes;
        let src = match tree.parent {
            None => op.send,
            Some(parent) => {
                let leg = self.direct_leg(op, parent as usize, 0, w)?;
                // recv is the caller's output, `len` bytes; a non-root's
                // input is never read.
                self.direct_move(op, leg, None, Land::At(op.recv), len, w)?;
                op.recv
            }
        };
        // Every child's message goes out before the root's own copy, which
        // then runs beside the transfers instead of after them (a 2-rank
        // 64 KiB broadcast out of place waited for the pull, then copied).
        let mut sends = [None, None];
        for (slot, child) in sends.iter_mut().zip(tree.children) {
            if let Some(child) = child {
                let leg = self.direct_leg(op, child as usize, 0, w)?;
                *slot = Some((leg, self.direct_start(op, leg, src, len)?));
            }
        }
        if tree.parent.is_none() && op.send.0 != op.recv.0 {
            // SAFETY: the caller's input and output, `len` bytes each,
            // disjoint (not in place); the sends only read the input.
            unsafe { gw_transport::copy_bytes(op.recv.0, op.send.0.cast_const(), len) };
        }
        let mut res = Ok(());
        for (leg, started) in sends.into_iter().flatten() {
            // Every started send is finished (its registration given
            // back), even after one failed.
            let r = self.direct_finish(op, leg, started, Land::Nowhere, len, w);
            res = res.and(r);
        }
        res
    }

    /// Each child's partial sum is received and added, in the order
    /// `coll::reduce` adds them (the root into its output, finalized by the
    /// last addition; any other rank into scratch), and the sum goes to the
    /// parent; a leaf sends its input as it is.
    fn direct_reduce(&mut self, op: &DirectOp, tree: Tree, w: &mut Waiting) -> Result<()> {
        let len = op.bytes;
        let got = self.scratch.as_mut_ptr().cast::<u8>();
        let acc = match tree.parent {
            None => op.recv.0,
            // SAFETY: scratch holds two messages (`scratch_bytes`).
            Some(_) => unsafe { got.add(len) },
        };
        let nchildren = tree.children.iter().flatten().count();
        let mut sum = op.send.0;
        for (i, child) in tree.children.into_iter().flatten().enumerate() {
            let leg = self.direct_leg(op, child as usize, 0, w)?;
            self.direct_move(op, leg, None, Land::Scratch, len, w)?;
            let last = tree.parent.is_none() && i + 1 == nchildren;
            // SAFETY: `count` elements at sum (the input, or acc after the
            // first child), at the landed message and at acc; acc is the
            // output or scratch after the landing area, so it is sum or
            // disjoint from it, and disjoint from the message.
            unsafe {
                op.kernel
                    .reduce(acc, sum.cast_const(), None, got, None, op.count, last)
            };
            sum = acc;
        }
        if let Some(parent) = tree.parent {
            let leg = self.direct_leg(op, parent as usize, 0, w)?;
            self.direct_move(op, leg, Some(Ptr(sum)), Land::Nowhere, len, w)?;
        }
        Ok(())
    }

    /// Round `j`'s exchange with `peer`, under step `j` (the all-gather's
    /// and reduce-scatter's schedules number their rounds from 0).
    fn direct_leg(&mut self, op: &DirectOp, peer: usize, j: u32, w: &mut Waiting) -> Result<Leg> {
        let peer = peer as Rank;
        let t = self.direct_connect(op, peer, w)?;
        Ok(Leg {
            t,
            peer,
            tag: op.fp.tag(j),
        })
    }

    /// The transport to `peer`, waiting for the connection if needed.
    fn direct_connect(&mut self, op: &DirectOp, peer: Rank, w: &mut Waiting) -> Result<usize> {
        loop {
            if let Some(t) = self.ready_transport(peer)? {
                return Ok(t);
            }
            let mut moved = false;
            for tr in &mut self.transports {
                moved |= tr.progress()?;
            }
            if !moved {
                w.peer = peer;
                w.what = "connecting to";
                self.direct_wait(op, w)?;
            }
        }
    }

    /// One exchange of `len` bytes with the leg's peer: `src` out, the
    /// peer's into scratch.
    fn direct_exchange(
        &mut self,
        op: &DirectOp,
        leg: Leg,
        src: Ptr,
        len: usize,
        w: &mut Waiting,
    ) -> Result<()> {
        self.direct_move(op, leg, Some(src), Land::Scratch, len, w)
    }

    /// Sends `src` (if any) and receives the peer's `len` bytes where
    /// `land` says. Where the transport can move the messages
    /// at once (`send_now`, `recv_now`: shm and TCP, small messages with
    /// nothing else pending with the peer) no request is posted and no
    /// memory registered; otherwise,
    /// or as soon as anything else stands in the way, they are posted.
    fn direct_move(
        &mut self,
        op: &DirectOp,
        leg: Leg,
        src: Option<Ptr>,
        land: Land,
        len: usize,
        w: &mut Waiting,
    ) -> Result<()> {
        let started = match src {
            Some(src) => self.direct_start(op, leg, src, len)?,
            None => Started::default(),
        };
        self.direct_finish(op, leg, started, land, len, w)
    }

    /// Sends `len` bytes at `src` to the leg's peer: at once where the
    /// transport can, else posted.
    fn direct_start(&mut self, op: &DirectOp, leg: Leg, src: Ptr, len: usize) -> Result<Started> {
        let Leg { t, peer, tag } = leg;
        // SAFETY: the caller keeps `src` (its input or output, or scratch,
        // at least `len` long) valid and unwritten until the send is
        // finished.
        let out = unsafe { std::slice::from_raw_parts(src.0, len) };
        let hint = self.direct_hint(op);
        if matches!(
            self.transports[t].send_now(peer, tag, out, hint)?,
            Now::Done
        ) {
            return Ok(Started::default());
        }
        let m = self.direct_mem(t, src.0, len)?;
        let tr = &mut self.transports[t];
        let posted = match hint {
            Some(h) => tr.isend_hinted(peer, tag, m.handle, m.offset, len, h),
            None => tr.isend(peer, tag, m.handle, m.offset, len),
        };
        let req = match posted {
            Ok(req) => req,
            Err(e) => {
                self.give_back(t, m);
                return Err(e);
            }
        };
        Ok(Started {
            req: Some(req),
            mem: Some(m),
        })
    }

    /// The registration on transport `t` of the caller's `len` bytes at
    /// `ptr`, for a transfer that must be posted: a persistent round's
    /// buffer is registered already; else as any operation's (a caller
    /// registration, or its own, given back when the transfer is finished).
    fn direct_mem(&mut self, t: usize, ptr: *mut u8, len: usize) -> Result<Mem> {
        match self.prepared_mem(t, ptr, len) {
            Some(m) => Ok(m),
            None => self.mem_for(t, ptr, len),
        }
    }

    /// Waits for a started send and receives the peer's `len` bytes where
    /// `land` says, then gives back what the send and the receive
    /// registered.
    fn direct_finish(
        &mut self,
        op: &DirectOp,
        leg: Leg,
        started: Started,
        land: Land,
        len: usize,
        w: &mut Waiting,
    ) -> Result<()> {
        let mut dst_mem = None;
        let res = self.direct_complete(op, leg, started.req, land, len, &mut dst_mem, w);
        for m in [started.mem, dst_mem].into_iter().flatten() {
            // Its own registration's deregistering fails only while the
            // transfer is still posted, after an error that fails the
            // communicator (the transports are aborted).
            self.give_back(leg.t, m);
        }
        res
    }

    /// Who should move a send's bytes (see `SendHint`). A broadcast's
    /// receivers only store what comes, and with a core per rank it is
    /// pulled in one copy from where the transport would pull a
    /// point-to-point message: through the ring's slots a message of one
    /// segment costs a copy in and then a copy out, one after the other.
    /// So does a reduce's message from [`REDUCE_STORED_FROM`]: its parent
    /// adds it only once it is whole, so on the direct path nothing runs
    /// beside the push. The all-gather's and reduce-scatter's exchanges are
    /// `Exchanged`: both ranks copy anyway, and one copy each beats two
    /// (2 ranks over shm, 64 KiB, 1.47x and 1.36x as fast). That needs the
    /// rendezvous frame out at posting (see `shm`'s `post_send`): while it
    /// waited for the next progress, the all-gather's pulled exchange was
    /// 0.71x as fast as pushing. The all-reduce's gained nothing pulled
    /// (0.97-1.03 from 8 to 256 KiB) and pushes.
    fn direct_hint(&self, op: &DirectOp) -> Option<SendHint> {
        match op.shape {
            _ if self.cfg.oversubscribed => None,
            DirectShape::Broadcast(_) => Some(SendHint::Stored),
            DirectShape::AllGather | DirectShape::ReduceScatter => Some(SendHint::Exchanged),
            DirectShape::Reduce(_) if op.bytes >= REDUCE_STORED_FROM => Some(SendHint::Stored),
            _ => None,
        }
    }

    /// Waits for the send (if posted) and receives the peer's `len` bytes
    /// where `land` says. A receive posted on the caller's memory leaves
    /// its registration in `dst_mem`, for the caller to give back.
    #[allow(clippy::too_many_arguments)]
    fn direct_complete(
        &mut self,
        op: &DirectOp,
        leg: Leg,
        sreq: Option<Request>,
        land: Land,
        len: usize,
        dst_mem: &mut Option<Mem>,
        w: &mut Waiting,
    ) -> Result<()> {
        let Leg { t, peer, tag } = leg;
        let into: &mut [u8] = match land {
            // SAFETY: the caller's output, valid for `len` bytes that
            // nothing else touches until we return (the callers' promise
            // for `Land::At`).
            Land::At(p) => unsafe { std::slice::from_raw_parts_mut(p.0, len) },
            // SAFETY: scratch holds at least `len` (ensure_scratch took
            // the largest message a reduction reads) and nothing else uses
            // it during this call.
            Land::Scratch => unsafe {
                std::slice::from_raw_parts_mut(self.scratch.as_mut_ptr().cast(), len)
            },
            Land::Nowhere => &mut [],
        };
        let mut sreq = sreq.map(Outstanding::new);
        let (mut sent, mut got) = (sreq.is_none(), matches!(land, Land::Nowhere));
        let mut rreq: Option<Outstanding> = None;
        loop {
            let mut moved = false;
            if !got && rreq.is_none() {
                match self.transports[t].recv_now(peer, tag, into)? {
                    Now::Done => (got, moved) = (true, true),
                    Now::Empty => {}
                    Now::Later => {
                        let (mem, offset) = match land {
                            Land::At(p) => {
                                let m = self.direct_mem(t, p.0, len)?;
                                let at = (m.handle, m.offset);
                                *dst_mem = Some(m);
                                at
                            }
                            _ => (
                                self.scratch_handles[t].ok_or_else(|| {
                                    Error::Internal("scratch used before it was registered".into())
                                })?,
                                0,
                            ),
                        };
                        rreq = Some(Outstanding::new(
                            self.transports[t].irecv(peer, tag, mem, offset, len)?,
                        ));
                    }
                }
            }
            // Tested before any progress call: a receive posted on a frame
            // that came ahead of it (a broadcast root running ahead over
            // TCP) is complete at posting, and the progress call would
            // only read sockets that have nothing more.
            if let Some(s) = sreq.as_mut()
                && !sent
                && s.poll(self.transports[t].as_mut())?
            {
                sent = true;
                moved = true;
            }
            if let Some(r) = rreq.as_mut()
                && !got
                && r.poll(self.transports[t].as_mut())?
            {
                got = true;
                moved = true;
            }
            if sent && got {
                return Ok(());
            }
            if !(sent && (got || rreq.is_none())) {
                // What this moves is tested at the top of the next turn.
                for tr in &mut self.transports {
                    tr.poke();
                    moved |= tr.progress()?;
                }
            }
            if moved {
                w.idle_turns = 0;
                if let Some(c) = &mut w.clock {
                    c.since = Instant::now();
                }
            } else {
                w.peer = peer;
                w.what = if got { "sending to" } else { "receiving from" };
                self.direct_wait(op, w)?;
            }
        }
    }

    /// Nothing moved: spin, then nap; check on the peers and the board as
    /// the general path does for a stalled operation, and time out.
    fn direct_wait(&mut self, op: &DirectOp, w: &mut Waiting) -> Result<()> {
        // The application may abort from another thread; the engine thread
        // cannot notice while this caller holds the lock.
        if self.abort.load(Ordering::Acquire) {
            return Err(aborted());
        }
        self.pump_host();
        w.idle_turns = w.idle_turns.saturating_add(1);
        // The clock starts at the CLOCK_EVERY-th idle turn, not the first:
        // a ping-pong's receiver waits a little on every message, and a
        // clock read was a tenth of an 8-byte round trip.
        if w.idle_turns.is_multiple_of(CLOCK_EVERY) {
            self.direct_check(op, w)?;
        }
        let waited = w
            .clock
            .as_ref()
            .map_or(Duration::ZERO, |c| c.last_look.duration_since(c.since));
        if waited < self.cfg.spin {
            if self.cfg.oversubscribed {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(if waited < NAP_SHORT_FOR {
                NAP
            } else {
                LONG_NAP
            });
            // Each nap is long next to a clock read: look every time.
            self.direct_check(op, w)?;
        }
        Ok(())
    }

    /// Reads the clock; checks on the peers and the board as the general
    /// path does for a stalled operation, and times out.
    fn direct_check(&mut self, op: &DirectOp, w: &mut Waiting) -> Result<()> {
        let now = Instant::now();
        let timeout = self.cfg.timeout;
        let c = w.clock.get_or_insert_with(|| Clock {
            since: now,
            last_check: now,
            last_look: now,
            deadline: now + timeout,
            stalled_at: now + (timeout / 8).min(STALL),
        });
        c.last_look = now;
        let late = now >= c.deadline;
        if !late
            && (now.duration_since(c.since) < PEER_CHECK_EVERY
                || now.duration_since(c.last_check) < PEER_CHECK_EVERY)
        {
            return Ok(());
        }
        c.last_check = now;
        let stalled = now >= c.stalled_at;
        STALL_CHECKS.fetch_add(1, Ordering::Relaxed);
        self.check_links()?;
        let me = self.cfg.me;
        if let Some(e) = consult_board(&mut self.cfg.board, me, &op.fp, stalled, &mut w.posted) {
            return Err(e);
        }
        if stalled && let Some(e) = self.host_coll.as_ref().and_then(|h| h.here_instead(&op.fp)) {
            return Err(e);
        }
        if late {
            let others = self.others_doing();
            return Err(Error::Timeout {
                secs: timeout.as_secs_f64(),
                what: format!(
                    "in {} on rank {}: {} rank {} ({} B, {} done by the caller){others}",
                    op.fp,
                    self.cfg.me,
                    w.what,
                    w.peer,
                    op.bytes,
                    op.shape.algorithm()
                ),
            });
        }
        Ok(())
    }
}
