//! Fan-out all-gather: every rank sends its block straight to every other
//! rank and receives every other rank's block, all at once, segment by
//! segment. It moves the same bytes per rank as the ring ((n - 1) blocks
//! out and in) but nothing is forwarded, so no receive waits on a chain of
//! ranks before it. That matters where ranks share cores over shared
//! memory: there each of the ring's n - 1 steps waits until the next rank
//! in the chain is scheduled, while a pulled fan-out message is read from
//! its owner's buffer whether the owner runs or not. It is chosen by the
//! communicator ([`OpSpec::fan_out`]); over a network the ring's one
//! stream per rank is the better use of the links.

use gw_transport::Result;

use super::dag::{Alias, Builder, DagSchedule, Desc, check_steps, nsegs, segment};
use super::{Buf, Loc, OpSpec};
use crate::op::OpKind;

/// Whether `spec` is an all-gather this schedule runs: asked for, more
/// than two ranks (on two both are one exchange), and something to gather.
pub(crate) fn eligible(spec: &OpSpec) -> bool {
    spec.op == OpKind::AllGather && spec.fan_out && spec.nranks > 2 && spec.count > 0
}

/// `Send` holds `spec.count`, `Recv` gets `n` blocks of it. No scratch.
pub(super) fn all_gather(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r, count, seg) = spec.dims();
    let m = nsegs(count, seg);
    check_steps("fan-out all-gather", m.checked_mul(n - 1))?;
    let mut b = Builder::new(
        "fan-out all-gather",
        Alias {
            send_off: 0,
            recv_off: r * count,
            len: count,
        },
        spec.depth,
    );
    // Rank r sends to r+1, r+2, ... and receives from r-1, r-2, ...: at
    // each position in those lists every rank's partner is a different
    // rank, so no one rank is everyone's first.
    let to = |t: usize| ((r + t) % n) as u32;
    let from = |t: usize| (r + n - t) % n;
    for k in 0..m {
        let (off, len) = segment(count, seg, k).expect("segment");
        let piece = |c: usize| Loc::new(Buf::Recv, c * count + off, len);
        let own = Loc::new(Buf::Send, off, len);
        let desc = Desc::new("all-gather", 0, 1, k, m);
        let step = k as u32;
        // Unscaled, the sends read Send itself and must come before the copy
        // that (in place) writes the same elements; scaled, they send the
        // weighted copy, made first.
        if spec.scaled {
            b.copy(piece(r), own, false, desc);
        }
        let src = if spec.scaled { piece(r) } else { own };
        for t in 1..n {
            b.send(to(t), step, 0, src, desc);
        }
        if !spec.scaled {
            b.copy(piece(r), own, false, desc);
        }
        for t in 1..n {
            b.recv(from(t) as u32, step, 0, piece(from(t)), desc);
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algo;

    #[test]
    fn only_asked_for_all_gathers_over_two_ranks() {
        let mut s = OpSpec::for_test(OpKind::AllGather, 4, 10, 4);
        assert!(!eligible(&s), "not asked for");
        s.fan_out = true;
        assert!(eligible(&s));
        assert!(
            !eligible(&OpSpec { nranks: 2, ..s }),
            "two ranks: one exchange"
        );
        assert!(!eligible(&OpSpec { count: 0, ..s }), "nothing to gather");
        assert!(!eligible(&OpSpec {
            op: OpKind::Broadcast,
            ..s
        }));
    }

    #[test]
    fn build_picks_it_where_asked_even_over_recursive_doubling() {
        let name = |s: &OpSpec| crate::algo::build(s, Algo::Ring).map(|b| b.name());
        // Four ranks, a block of one segment: recursive doubling's shape.
        let s = OpSpec::for_test(OpKind::AllGather, 4, 10, 64);
        assert_eq!(name(&s).unwrap(), "rd all-gather");
        let fan = OpSpec { fan_out: true, ..s };
        assert_eq!(name(&fan).unwrap(), "fan-out all-gather");
        let b = OpSpec {
            op: OpKind::Broadcast,
            ..fan
        };
        assert_eq!(name(&b).unwrap(), "fan-out broadcast");
        assert_eq!(
            name(&OpSpec {
                fan_out: false,
                ..b
            })
            .unwrap(),
            "chain broadcast"
        );
    }
}
