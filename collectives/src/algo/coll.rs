//! The other collectives: broadcast, reduce to a root, barrier, and the
//! single-rank case of every operation.
//!
//! Broadcast and reduce run over a tree of ranks relative to the root
//! (`rel = rank − root mod n`): a pipelined chain (`rel → rel + 1`) when the
//! message has enough segments to fill it, else a binary heap tree
//! (`rel → 2·rel + 1, 2·rel + 2`), which has fewer hops but sends every
//! segment twice from each inner rank. Segment `k` is step `k` (one stream
//! per peer and direction).

use gw_transport::Result;

use super::dag::{Alias, Builder, DagSchedule, Desc, Pool, check_steps, nsegs, segment};
use super::{Buf, Loc, OpSpec};
use crate::op::OpKind;

/// Parent and children (actual ranks) of this rank in the broadcast/reduce
/// tree rooted at `spec.root`, for a message of `m` segments.
struct Shape {
    parent: Option<u32>,
    children: Vec<u32>,
    chain: bool,
}

impl Shape {
    fn new(spec: &OpSpec, m: usize) -> Shape {
        let tree = Tree::new(spec, m);
        Shape {
            parent: tree.parent,
            children: tree.children.into_iter().flatten().collect(),
            chain: tree.chain,
        }
    }

    /// The root sends to every other rank itself (see `fan_gather.rs`:
    /// pulled, no receive waits on a chain of ranks), starting after itself
    /// so that no one rank is always served first.
    fn star(spec: &OpSpec) -> Shape {
        let (n, root) = (spec.nranks, spec.root);
        let me = spec.rank;
        Shape {
            parent: (me != root).then_some(root),
            children: if me == root {
                (1..n).map(|t| (root + t) % n).collect()
            } else {
                Vec::new()
            },
            chain: false,
        }
    }
}

/// [`Shape`] without allocating, for the caller's direct path: at most two
/// children, in the order the schedules serve them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tree {
    pub parent: Option<u32>,
    pub children: [Option<u32>; 2],
    pub chain: bool,
}

impl Tree {
    fn new(spec: &OpSpec, m: usize) -> Tree {
        let n = spec.nranks as usize;
        let root = spec.root as usize;
        let rel = (spec.rank as usize + n - root) % n;
        let actual = |x: usize| ((x + root) % n) as u32;
        let depth = n.ilog2() as usize;
        // Chain: m + n − 2 segment times; tree: about 2·(m + depth − 1).
        let chain = n <= m + 2 * depth;
        let (parent, children) = if chain {
            (rel.checked_sub(1), [rel + 1, n])
        } else {
            let parent = if rel == 0 { None } else { Some((rel - 1) / 2) };
            (parent, [2 * rel + 1, 2 * rel + 2])
        };
        Tree {
            parent: parent.map(actual),
            children: children.map(|c| (c < n).then(|| actual(c))),
            chain,
        }
    }
}

/// The tree of a broadcast or reduce the caller runs itself
/// (`engine/direct.rs`, where [`OpSpec::fits_direct`]): a message of one
/// segment, which these schedules send as one message per edge (step 0).
/// `None` where the engine runs it.
pub(crate) fn direct_tree(spec: &OpSpec) -> Option<Tree> {
    let eligible = matches!(spec.op, OpKind::Broadcast | OpKind::Reduce) && spec.fits_direct();
    eligible.then(|| Tree::new(spec, 1))
}

fn identity(count: usize) -> Alias {
    Alias {
        send_off: 0,
        recv_off: 0,
        len: count,
    }
}

/// Broadcast from `spec.root`, `n >= 2`. Between two ranks there is no
/// chain to fill and no compute to overlap, so segments are 8 times the
/// configured length: fewer hand-offs, and over shared memory segments
/// (1 MiB by default) above the size its receiver pulls in one copy, where
/// 128 KiB ones went twice through the ring's slots. One segment for the
/// whole message was tried: faster on shared memory, slower over TCP at
/// 16 MiB, which gains from a pipeline of its 1 MiB segments.
pub(super) fn broadcast(spec: &OpSpec) -> Result<DagSchedule> {
    let count = spec.count;
    let seg = if spec.nranks == 2 {
        spec.segment_elems.saturating_mul(8)
    } else {
        spec.segment_elems
    };
    let m = nsegs(count, seg);
    check_steps("broadcast", Some(m))?;
    let (shape, name) = if spec.fan_out && spec.nranks > 2 {
        (Shape::star(spec), "fan-out broadcast")
    } else {
        let shape = Shape::new(spec, m);
        let name = if shape.chain {
            "chain broadcast"
        } else {
            "tree broadcast"
        };
        (shape, name)
    };
    let mut b = Builder::new(name, identity(count), spec.depth);
    for k in 0..m {
        let (off, len) = segment(count, seg, k).expect("segment");
        let desc = Desc::new("broadcast", 0, 1, k, m);
        let (own, out) = (Loc::new(Buf::Send, off, len), Loc::new(Buf::Recv, off, len));
        let step = k as u32;
        match shape.parent {
            None if spec.scaled => {
                b.copy(out, own, false, desc);
                for &c in &shape.children {
                    b.send(c, step, 0, out, desc);
                }
            }
            None => {
                // Send straight from Send, then copy (in place, onto itself).
                for &c in &shape.children {
                    b.send(c, step, 0, own, desc);
                }
                b.copy(out, own, false, desc);
            }
            Some(p) => {
                b.recv(p, step, 0, out, desc);
                for &c in &shape.children {
                    b.send(c, step, 0, out, desc);
                }
            }
        }
    }
    Ok(b.finish())
}

/// Reduce to `spec.root`, `n >= 2`. Only the root writes `Recv`; the other
/// ranks add up in scratch (`spec.depth` slots of a segment per child, and as
/// many more for a scaled leaf's contribution).
pub(super) fn reduce(spec: &OpSpec) -> Result<DagSchedule> {
    let (count, seg) = (spec.count, spec.segment_elems);
    let m = nsegs(count, seg);
    check_steps("reduce", Some(m))?;
    let shape = Shape::new(spec, m);
    let name = if shape.chain {
        "chain reduce"
    } else {
        "tree reduce"
    };
    let mut b = Builder::new(name, identity(count), spec.depth);
    let slot_len = seg.min(count);
    let mut pools: Vec<Pool> = shape
        .children
        .iter()
        .map(|_| b.pool(spec.depth, slot_len))
        .collect();
    let mut own_pool =
        (shape.children.is_empty() && spec.scaled).then(|| b.pool(spec.depth, slot_len));
    let mut slots = Vec::with_capacity(2);
    for k in 0..m {
        let (off, len) = segment(count, seg, k).expect("segment");
        let desc = Desc::new("reduce", 0, 1, k, m);
        let step = k as u32;
        let own = Loc::new(Buf::Send, off, len);
        slots.clear();
        for (&c, pool) in shape.children.iter().zip(pools.iter_mut()) {
            let slot = pool.slot(len);
            b.recv(c, step, 0, slot, desc);
            slots.push(slot);
        }
        match shape.parent {
            None => {
                let out = Loc::new(Buf::Recv, off, len);
                for (i, &slot) in slots.iter().enumerate() {
                    b.reduce(
                        out,
                        if i == 0 { own } else { out },
                        slot,
                        i + 1 == slots.len(),
                        desc,
                    );
                }
            }
            Some(p) => {
                let src = match (slots.first(), own_pool.as_mut()) {
                    (Some(&acc), _) => {
                        b.reduce(acc, acc, own, false, desc);
                        for &slot in &slots[1..] {
                            b.reduce(acc, acc, slot, false, desc);
                        }
                        acc
                    }
                    (None, Some(pool)) => {
                        let slot = pool.slot(len);
                        b.copy(slot, own, false, desc);
                        slot
                    }
                    (None, None) => own,
                };
                b.send(p, step, 0, src, desc);
            }
        }
    }
    Ok(b.finish())
}

/// Dissemination barrier, `n >= 2`: in round `k` (of `⌈log2 n⌉`) send an
/// empty message to `rank + 2^k` and wait for one from `rank − 2^k`; a round's
/// send waits for the receives of *all* earlier rounds (waiting for the
/// previous one only lets a later receive overtake an earlier one, and a rank
/// could then leave before the rank behind that earlier one entered — found
/// by the simulator at 8 ranks). Step `k`.
pub(super) fn barrier(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r) = (spec.nranks as usize, spec.rank as usize);
    let rounds = n.next_power_of_two().trailing_zeros() as usize;
    let mut b = Builder::new("dissemination barrier", identity(0), spec.depth);
    let empty = Loc::new(Buf::Recv, 0, 0);
    let mut earlier = Vec::with_capacity(rounds);
    for k in 0..rounds {
        let d = 1 << k;
        let desc = Desc::new("round", k, rounds, 0, 1);
        let s = b.send(((r + d) % n) as u32, k as u32, k as u32, empty, desc);
        for &p in &earlier {
            b.dep(p, s);
        }
        earlier.push(b.recv(((r + n - d) % n) as u32, k as u32, k as u32, empty, desc));
    }
    Ok(b.finish())
}

/// Any operation on a single rank: one copy from `Send` to `Recv`, finalized
/// for the reductions.
pub(super) fn local(spec: &OpSpec) -> Result<DagSchedule> {
    let count = if spec.op == OpKind::Barrier {
        0
    } else {
        spec.count
    };
    let mut b = Builder::new("single-rank", identity(count), spec.depth);
    if count > 0 {
        let finalize = matches!(
            spec.op,
            OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce
        );
        let desc = Desc::new("copy", 0, 1, 0, 1);
        b.copy(
            Loc::new(Buf::Recv, 0, count),
            Loc::new(Buf::Send, 0, count),
            finalize,
            desc,
        );
    }
    Ok(b.finish())
}
