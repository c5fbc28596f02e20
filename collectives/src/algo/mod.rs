//! Collective algorithms as deterministic state machines, without I/O.
//!
//! In the style of quinn-proto: a [`Schedule`] says which transfers and local
//! reductions it wants next ([`Schedule::next_action`]) and is told when each
//! one finished ([`Schedule::complete`]). It never touches memory or sockets;
//! the engine carries its actions out over real transports, and the tests
//! carry them out over a simulated network with random delays and arrival
//! orders. The same schedule therefore runs over TCP, shared memory, verbs or
//! a simulator, and behaves identically on every rank given the same inputs.
//!
//! All offsets and lengths are in elements of the operation's dtype.
//!
//! ## Buffers
//! An operation sees three buffers ([`Buf`]):
//! - `Send`: the caller's input. Read-only. When the caller asked for a
//!   weighted contribution, the driver multiplies every element read from
//!   `Send` by the local weight, in the same pass ("the local contribution").
//!   A schedule built with `spec.scaled == true` therefore never `Send`s
//!   straight from `Buf::Send`; it reduces or copies it first.
//! - `Recv`: the caller's output, which the schedule may also use as working
//!   space.
//! - `Scratch`: communicator-owned memory, registered once, of
//!   [`Schedule::scratch_elems`] elements.
//!
//! For in-place calls the driver aliases `Send` and `Recv` (with the offsets
//! NCCL uses: reduce-scatter's output is the rank's chunk of the input,
//! all-gather's input is the rank's chunk of the output). Schedules must
//! therefore read each element of `Send` before writing the `Recv` element
//! that aliases it, and only the `Send` view is ever scaled.
//!
//! Layouts (`count` is [`OpSpec::count`], `n` the world size):
//! | op | Send | Recv |
//! |---|---|---|
//! | all-reduce | count | count |
//! | reduce-scatter | n·count | count (rank's chunk) |
//! | all-gather | count | n·count |
//! | broadcast | count (root) | count |
//! | reduce | count | count (meaningful at root) |
//! | barrier | 0 | 0 |

pub mod onesided;
pub mod p2p;

use crate::op::OpKind;
use gw_transport::{Error, Rank, Result};

/// Which buffer a [`Loc`] refers to (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    Send,
    Recv,
    Scratch,
    /// A persistent one-sided operation's inbound window: memory of its
    /// own, registered and published once, that peers write into
    /// ([`Action::Write`]); of [`Schedule::window_elems`] elements.
    Window,
}

/// Where in a peer's memory a one-sided write lands: its `Recv` buffer or
/// its `Window`, at an element offset (the peer's layout is the same as
/// this rank's, since every rank built the same schedule shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Remote {
    pub buf: Buf,
    pub offset: usize,
}

impl Remote {
    /// Element `offset` of the peer's `Recv`.
    pub fn recv(offset: usize) -> Remote {
        Remote {
            buf: Buf::Recv,
            offset,
        }
    }
}

/// A range of elements within one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    pub buf: Buf,
    pub offset: usize,
    pub len: usize,
}

impl Loc {
    pub fn new(buf: Buf, offset: usize, len: usize) -> Loc {
        Loc { buf, offset, len }
    }
}

/// Identifies one action within a schedule; unique per schedule.
pub type ActionId = usize;

/// What a schedule wants done next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `src` to `peer` as the message of this `step`.
    Send {
        id: ActionId,
        peer: Rank,
        step: u32,
        src: Loc,
    },
    /// Receive the message of this `step` from `peer` into `dst` (exactly `dst.len` elements).
    Recv {
        id: ActionId,
        peer: Rank,
        step: u32,
        dst: Loc,
    },
    /// `dst[i] = a[i] ⊕ b[i]`. `dst` may be exactly `a` or exactly `b`, never a
    /// partial overlap. With `finalize`, the reduction's final step is applied
    /// as well (division by the world size for `avg`): set it on the reduction
    /// that produces an element's complete result.
    Reduce {
        id: ActionId,
        dst: Loc,
        a: Loc,
        b: Loc,
        finalize: bool,
    },
    /// `dst[i] = src[i]` (scaled if `src` is `Buf::Send` and a weight is set;
    /// finalized if `finalize`, for the single-rank case).
    Copy {
        id: ActionId,
        dst: Loc,
        src: Loc,
        finalize: bool,
    },
    /// Write `src` one-sidedly into `peer`'s `dst` (its published region),
    /// with the immediate `imm`; complete once `src` may be reused.
    Write {
        id: ActionId,
        peer: Rank,
        src: Loc,
        dst: Remote,
        imm: u32,
    },
    /// Read `peer`'s published `src` one-sidedly into this rank's `dst`
    /// (RDMA READ); the peer takes no part. Complete once the bytes are
    /// here.
    Read {
        id: ActionId,
        peer: Rank,
        src: Remote,
        dst: Loc,
    },
    /// Wait until `peer`'s write with the immediate `imm` has landed in
    /// `dst` (this rank's memory); complete once the bytes are there.
    Landed {
        id: ActionId,
        peer: Rank,
        imm: u32,
        dst: Loc,
    },
}

impl Action {
    pub fn id(&self) -> ActionId {
        match *self {
            Action::Send { id, .. }
            | Action::Recv { id, .. }
            | Action::Reduce { id, .. }
            | Action::Copy { id, .. }
            | Action::Write { id, .. }
            | Action::Read { id, .. }
            | Action::Landed { id, .. } => id,
        }
    }
}

/// A running collective on one rank.
pub trait Schedule: Send {
    /// The next action that may start now, or `None` until something completes.
    /// Actions that are returned are in flight until [`Schedule::complete`].
    fn next_action(&mut self) -> Option<Action>;
    /// An action returned earlier finished.
    fn complete(&mut self, id: ActionId);
    /// Whether every action finished and the result is in place.
    fn is_done(&self) -> bool;
    /// Scratch elements the schedule needs (fixed at construction).
    fn scratch_elems(&self) -> usize;
    /// Elements of [`Buf::Window`] the schedule needs; nonzero only for
    /// one-sided schedules, which run only as persistent operations (the
    /// window is registered and published once, at init).
    fn window_elems(&self) -> usize {
        0
    }
    /// How many [`Action::Landed`] it has: room the engine reserves at init
    /// for immediates that come before their action is ready.
    fn landed_actions(&self) -> usize {
        0
    }
    /// What the schedule is waiting for, for timeout errors (e.g. "step 3: recv from rank 2").
    fn waiting_for(&self) -> String;
    /// The algorithm, as the debug log names it (e.g. "ring all-gather").
    fn name(&self) -> &'static str {
        "schedule"
    }
    /// Whether its sends to `peer` go while `peer` sends to this rank in the
    /// same operation, a point-to-point exchange (see
    /// `SendHint::Exchanged`). Collectives answer no: their
    /// receivers mostly reduce what arrives, where slots serve better.
    fn exchanges_with(&self, _peer: Rank) -> bool {
        false
    }
    /// Rewinds the schedule to its state right after construction, so that an
    /// identical later call runs it again instead of rebuilding it (the
    /// engine's schedule cache: a training step repeats the same calls, and
    /// rebuilding allocates). Must not allocate. Returns false if this
    /// schedule cannot be rewound; it is then never reused.
    fn reset(&mut self) -> bool {
        false
    }
    /// Approximate heap bytes the schedule holds, so that the engine can bound
    /// the memory its cache keeps.
    fn heap_bytes(&self) -> usize {
        0
    }
}

/// Which algorithm to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Ring,
    Tree,
    Rhd,
    /// Reduce-scatter within each host, all-reduce across hosts, all-gather
    /// within each host (needs [`OpSpec::local_size`]).
    Hier,
    /// Recursive doubling: `log2 n` exchanges of the whole buffer (small messages).
    Rd,
}

impl Algo {
    /// Every algorithm.
    pub const ALL: [Algo; 5] = [Algo::Ring, Algo::Tree, Algo::Rhd, Algo::Hier, Algo::Rd];

    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Tree => "tree",
            Algo::Rhd => "rhd",
            Algo::Hier => "hier",
            Algo::Rd => "rd",
        }
    }

    pub fn parse(s: &str) -> Option<Algo> {
        match s {
            "ring" => Some(Algo::Ring),
            "tree" => Some(Algo::Tree),
            "rhd" => Some(Algo::Rhd),
            "hier" => Some(Algo::Hier),
            "rd" => Some(Algo::Rd),
            _ => None,
        }
    }
}

/// Everything a schedule needs to know about the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSpec {
    pub op: OpKind,
    pub rank: Rank,
    pub nranks: u32,
    /// Elements, per the layout table in the module comment.
    pub count: usize,
    /// Root rank for broadcast and reduce (ignored otherwise).
    pub root: Rank,
    /// Largest message, in elements, a schedule should send at once; bigger
    /// transfers are cut into segments of this size and pipelined.
    pub segment_elems: usize,
    /// Messages in flight per stream (to or from one peer) and scratch slots
    /// per pipeline, 1..=[`MAX_DEPTH`]. Ranks may differ in it: each side's
    /// window only bounds what it has posted, and both list a stream in the
    /// same order.
    pub depth: usize,
    /// A weight applies to `Send`; never send from `Buf::Send` directly.
    pub scaled: bool,
    /// Ranks per host, for [`Algo::Hier`]: the ranks are grouped host by
    /// host, `local_size` consecutive ranks on each (rank `r` is on host
    /// `r / local_size`). 0 where the communicator's ranks are not laid out
    /// that way; only hier reads it.
    pub local_size: u32,
    /// An all-gather or broadcast of more than two ranks fans out: every
    /// rank sends its block to every other at once (`fan_gather.rs`), the
    /// root to every rank itself (`coll::broadcast`). The communicator sets
    /// it the same way on every rank (`GW_FANOUT`).
    pub fan_out: bool,
}

impl OpSpec {
    /// World size, rank, element count and segment length, as `usize`: what
    /// every schedule builder starts from.
    pub(crate) fn dims(&self) -> (usize, usize, usize, usize) {
        (
            self.nranks as usize,
            self.rank as usize,
            self.count,
            self.segment_elems,
        )
    }

    /// Whether the caller's direct path (`engine/direct.rs`) can run this
    /// call with the schedules' frames, one message per exchange: more than
    /// one rank, no weight, and `count` within one segment.
    pub(crate) fn fits_direct(&self) -> bool {
        let (n, _, count, seg) = self.dims();
        n >= 2 && !self.scaled && count > 0 && count <= seg
    }

    /// `log2 n` where this is a call of `op` the caller's direct path can
    /// run one message a round: [`OpSpec::fits_direct`] on a power-of-two
    /// world.
    pub(crate) fn direct_rounds_of(&self, op: crate::op::OpKind) -> Option<u32> {
        let n = self.nranks;
        (self.op == op && n.is_power_of_two() && self.fits_direct()).then(|| n.trailing_zeros())
    }

    /// Rank 0 of `n`, root 0, depth 1, unscaled: the spec the schedules'
    /// own unit tests start from.
    #[cfg(test)]
    pub(crate) fn for_test(op: OpKind, n: u32, count: usize, seg: usize) -> OpSpec {
        OpSpec {
            op,
            rank: 0,
            nranks: n,
            count,
            root: 0,
            segment_elems: seg,
            depth: 1,
            scaled: false,
            local_size: 0,
            fan_out: false,
        }
    }
}

pub(crate) mod coll;
mod dag;
mod fan_gather;
pub use dag::MAX_DEPTH;
mod hier;
mod rd;
pub(crate) mod rd_gather;
pub(crate) mod rh_scatter;
pub(crate) use rd::direct_rounds;
mod rhd;
mod ring;
#[cfg(test)]
mod sim;
mod tree;

/// Builds the schedule for `spec` with `algo`.
///
/// Only all-reduce offers a choice of algorithm; the other collectives ignore
/// `algo`. An algorithm that cannot run this call (rhd on a world size that is
/// not a power of two, hier without a host layout that divides the world
/// size) is an [`Error::InvalidArgument`].
///
/// | op | algorithm |
/// |---|---|
/// | all-reduce | ring (reduce-scatter + all-gather), double binary tree, recursive halving-doubling, recursive doubling, or hierarchical (per host, then across hosts) |
/// | reduce-scatter | ring |
/// | all-gather | fan-out where asked for ([`OpSpec::fan_out`]), else recursive doubling on a power-of-two world (over 2 ranks) when a rank's block is one segment, else ring |
/// | broadcast | root to every rank at once where asked for ([`OpSpec::fan_out`]) |
/// | reduce, other broadcasts | pipelined chain, or binary tree when the message has few segments |
/// | barrier | dissemination (empty messages, ⌈log2 n⌉ rounds) |
///
/// With one rank every operation is a single local copy. Every schedule lays
/// out all its actions at construction (memory proportional to the number of
/// segments times the number of steps); `next_action` and `complete` then
/// neither allocate nor search.
pub fn build(spec: &OpSpec, algo: Algo) -> Result<Box<dyn Schedule>> {
    check(spec, algo)?;
    let n = spec.nranks as usize;
    let schedule = match spec.op {
        OpKind::SendRecv => {
            return Err(Error::InvalidArgument(
                "send/recv is point-to-point, not a collective schedule".into(),
            ));
        }
        _ if n == 1 => coll::local(spec)?,
        OpKind::AllReduce => match algo {
            Algo::Ring => ring::allreduce(spec)?,
            Algo::Tree => tree::allreduce(spec)?,
            Algo::Rhd => rhd::allreduce(spec)?,
            Algo::Hier => hier::allreduce(spec)?,
            Algo::Rd => rd::allreduce(spec)?,
        },
        OpKind::ReduceScatter if rh_scatter::eligible(spec) => rh_scatter::reduce_scatter(spec)?,
        OpKind::ReduceScatter => ring::reduce_scatter(spec)?,
        OpKind::AllGather if fan_gather::eligible(spec) => fan_gather::all_gather(spec)?,
        OpKind::AllGather if rd_gather::eligible(spec) => rd_gather::all_gather(spec)?,
        OpKind::AllGather => ring::all_gather(spec)?,
        OpKind::Broadcast => coll::broadcast(spec)?,
        OpKind::Reduce => coll::reduce(spec)?,
        OpKind::Barrier => coll::barrier(spec)?,
    };
    Ok(Box::new(schedule))
}

/// The argument checks of [`build`] without building anything, so that a
/// caller can refuse a bad call at once and leave the building (or the reuse
/// of an earlier identical schedule) to the engine.
pub fn check(spec: &OpSpec, algo: Algo) -> Result<()> {
    let invalid = |what: String| Err(Error::InvalidArgument(what));
    let n = spec.nranks as usize;
    if n == 0 {
        return invalid("world size 0".into());
    }
    if spec.rank >= spec.nranks {
        return invalid(format!("rank {} out of range for {} ranks", spec.rank, n));
    }
    if matches!(spec.op, OpKind::Broadcast | OpKind::Reduce) && spec.root >= spec.nranks {
        return invalid(format!(
            "{} root {} out of range for {} ranks",
            spec.op.name(),
            spec.root,
            n
        ));
    }
    if spec.segment_elems == 0 {
        return invalid("segment_elems must be at least 1".into());
    }
    if !(1..=MAX_DEPTH).contains(&spec.depth) {
        return invalid(format!(
            "pipeline depth {} out of range 1..={MAX_DEPTH}",
            spec.depth
        ));
    }
    if matches!(spec.op, OpKind::ReduceScatter | OpKind::AllGather)
        && spec.count.checked_mul(n).is_none()
    {
        return invalid(format!(
            "{}: count {} times {} ranks overflows",
            spec.op.name(),
            spec.count,
            n
        ));
    }
    if spec.count as u64 > crate::op::MAX_COUNT {
        return invalid(format!(
            "{}: count {} is more than the {} elements one call can carry",
            spec.op.name(),
            spec.count,
            crate::op::MAX_COUNT
        ));
    }
    if spec.op == OpKind::Barrier && spec.count != 0 {
        return invalid(format!("barrier takes count 0, got {}", spec.count));
    }
    if spec.op == OpKind::AllReduce && algo == Algo::Rhd && !n.is_power_of_two() {
        return invalid(format!(
            "rhd needs a power-of-two world size, got {n} ranks"
        ));
    }
    if spec.op == OpKind::AllReduce && algo == Algo::Hier && n > 1 {
        let l = spec.local_size as usize;
        if l == 0 || !n.is_multiple_of(l) {
            return invalid(format!(
                "hier needs hosts with the same number of consecutive ranks; {n} ranks in hosts of {l} is not that layout"
            ));
        }
    }
    if spec.op == OpKind::SendRecv {
        return invalid("send/recv is point-to-point, not a collective schedule".into());
    }
    Ok(())
}
