//! Recursive doubling all-gather, for a power-of-two world and a per-rank
//! block that fits one segment: in round `j` each rank swaps everything it
//! has gathered so far (the `2^j` blocks of its aligned group, contiguous
//! in `Recv`) with the rank whose number differs in bit `j`. It moves the
//! same bytes as the ring, `(n - 1)` blocks in and out per rank, but in
//! `log2 n` sequential messages instead of `n - 1`, which is what a small
//! or mid-sized all-gather waits for on a loaded machine or a network;
//! MPI libraries use it there for that reason. Larger blocks take the
//! ring, whose segments pipeline. On two ranks both are one exchange.

use gw_transport::Result;

use super::dag::{Alias, Builder, DagSchedule, Desc, nsegs};
use super::{Buf, Loc, OpSpec};
use crate::op::OpKind;

/// Whether `spec` is an all-gather this schedule runs: a power-of-two
/// world of more than two ranks and a block of one segment (or none).
pub(crate) fn eligible(spec: &OpSpec) -> bool {
    let (n, _, count, seg) = spec.dims();
    spec.op == OpKind::AllGather
        && n > 2
        && n.is_power_of_two()
        && count > 0
        && nsegs(count, seg) == 1
}

/// The rounds of an all-gather the caller runs itself
/// (`engine/direct.rs`): a power-of-two world (on two ranks the ring's one
/// exchange has the same frame as round 0 here), no weight, and a block of
/// one segment, so that this schedule (or that ring) would send it as one
/// message per round. `None` where the engine runs it.
pub(crate) fn direct_rounds(spec: &OpSpec) -> Option<u32> {
    spec.direct_rounds_of(OpKind::AllGather)
}

/// `Send` holds `spec.count`, `Recv` gets `n` blocks of it. No scratch.
pub(super) fn all_gather(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r, count, _) = spec.dims();
    let rounds = n.trailing_zeros() as usize;
    let mut b = Builder::new(
        "rd all-gather",
        Alias {
            send_off: 0,
            recv_off: r * count,
            len: count,
        },
        spec.depth,
    );
    let blocks = |first: usize, k: usize| Loc::new(Buf::Recv, first * count, k * count);
    let own = Loc::new(Buf::Send, 0, count);
    // Unscaled, the first send reads Send itself and must come before the
    // copy that (in place) writes the same elements.
    if !spec.scaled {
        b.send(
            (r ^ 1) as u32,
            0,
            0,
            own,
            Desc::new("all-gather", 0, rounds, 0, 1),
        );
    }
    b.copy(
        blocks(r, 1),
        own,
        false,
        Desc::new("all-gather", 0, rounds, 0, 1),
    );
    for j in 0..rounds {
        let k = 1 << j;
        let peer = r ^ k;
        let (mine, theirs) = (r & !(k - 1), peer & !(k - 1));
        let desc = Desc::new("all-gather", j, rounds, 0, 1);
        if j > 0 || spec.scaled {
            b.send(peer as u32, j as u32, 0, blocks(mine, k), desc);
        }
        b.recv(peer as u32, j as u32, 0, blocks(theirs, k), desc);
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::OpSpec;

    fn spec(n: u32, count: usize, seg: usize) -> OpSpec {
        OpSpec::for_test(OpKind::AllGather, n, count, seg)
    }

    #[test]
    fn only_power_of_two_worlds_over_two_with_one_segment_blocks() {
        assert!(eligible(&spec(4, 10, 64)));
        assert!(eligible(&spec(8, 64, 64)));
        assert!(
            !eligible(&spec(8, 65, 64)),
            "two segments: the ring pipelines them"
        );
        assert!(
            !eligible(&spec(2, 10, 64)),
            "two ranks: one exchange either way"
        );
        assert!(!eligible(&spec(6, 10, 64)), "not a power of two");
        assert!(!eligible(&spec(8, 0, 64)), "nothing to gather");
        let mut s = spec(8, 10, 64);
        s.op = OpKind::ReduceScatter;
        assert!(!eligible(&s));
    }
}
