//! Recursive halving reduce-scatter, for a power-of-two world and an input
//! (all `n` blocks) that fits one segment: in round `j` (of `log2 n`) each
//! rank pairs with the rank across bit `log2 n - 1 - j`; of the blocks both
//! still hold partial sums of, the rank with that bit clear keeps the lower
//! half and the other the upper, each sends the half it gives up and adds
//! the partner's copy of the half it keeps. After the last round it holds
//! its own block complete. The same bytes as the ring, `(n - 1)` blocks out
//! and in per rank, but `log2 n` dependent exchanges instead of `n - 1`:
//! what a small reduce-scatter waits for on a loaded host or over TCP round
//! trips, which is why MPI libraries use it there. It is the first half of
//! the rhd all-reduce, with the partial sums in scratch because `Recv`
//! holds one block. Larger inputs take the ring: over TCP at 8 ranks, 2 to
//! 4 MiB ran 0.84-0.88 of the ring's speed this way (6 rounds), a round's
//! half of the data going to one peer with its reduction after it, where
//! the ring's segments pipeline. On two ranks both are one exchange.

use gw_transport::Result;

use super::dag::{Alias, Builder, DagSchedule, Desc};
use super::{Buf, Loc, OpSpec};
use crate::op::OpKind;

/// Whether `spec` is a reduce-scatter this schedule runs: a power-of-two
/// world of more than two ranks and an input of one segment (or less), so
/// that no message is cut and the partial sums take half a segment.
pub(crate) fn eligible(spec: &OpSpec) -> bool {
    let (n, _, count, seg) = spec.dims();
    spec.op == OpKind::ReduceScatter
        && n > 2
        && n.is_power_of_two()
        && count > 0
        && n.checked_mul(count).is_some_and(|all| all <= seg)
}

/// The rounds of a reduce-scatter the caller runs itself
/// (`engine/direct.rs`): no weight, a power-of-two world, and the shape this
/// schedule runs, or on two ranks a block of one segment (the ring's one
/// exchange, with the same frame as round 0 here). `None` where the engine
/// runs it.
pub(crate) fn direct_rounds(spec: &OpSpec) -> Option<u32> {
    let rounds = spec.direct_rounds_of(OpKind::ReduceScatter)?;
    (rounds == 1 || eligible(spec)).then_some(rounds)
}

/// `Send` holds `n` blocks of `spec.count`, `Recv` gets block `rank`.
/// Scratch, `2n - 1` blocks at most (one segment or less each way): the
/// partial sums of the `n / 2` blocks kept after round 0, a landing place
/// for each round's message (so that every receive can be posted at once),
/// and for a scaled rank a copy of round 0's outgoing half (a weight applies
/// to `Send`, which is then never sent from directly).
pub(super) fn reduce_scatter(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r, count, _) = spec.dims();
    let rounds = n.trailing_zeros() as usize;
    let half = n / 2;
    let mut b = Builder::new(
        "rh reduce-scatter",
        Alias {
            send_off: r * count,
            recv_off: 0,
            len: count,
        },
        spec.depth,
    );
    let mut region = |blocks: usize| b.pool(1, blocks * count).slot(blocks * count).offset;
    let acc_base = region(half);
    let landing = region(n - 1);
    let scaled_copy = spec.scaled.then(|| region(half));
    // Blocks from `acc_lo` on have their partial sums in scratch.
    let acc_lo = if r & half == 0 { 0 } else { half };
    let acc =
        |elem: usize, len: usize| Loc::new(Buf::Scratch, acc_base + elem - acc_lo * count, len);
    let (mut lo, mut landed) = (0, 0);
    for j in 0..rounds {
        let mask = n >> (j + 1);
        let peer = (r ^ mask) as u32;
        let (keep, give) = if r & mask == 0 {
            (lo, lo + mask)
        } else {
            (lo + mask, lo)
        };
        let (koff, goff, len) = (keep * count, give * count, mask * count);
        let desc = Desc::new("recursive halving", j, rounds, 0, 1);
        let src = match (j, scaled_copy) {
            (0, Some(at)) => {
                let copy = Loc::new(Buf::Scratch, at, len);
                b.copy(copy, Loc::new(Buf::Send, goff, len), false, desc);
                copy
            }
            (0, None) => Loc::new(Buf::Send, goff, len),
            _ => acc(goff, len),
        };
        b.send(peer, j as u32, 0, src, desc);
        let got = Loc::new(Buf::Scratch, landing + landed, len);
        landed += len;
        b.recv(peer, j as u32, 0, got, desc);
        if j == 0 {
            // Round 0 adds Send's blocks, and in place its block `r` is
            // `Recv`: a read may not straddle that block's edges.
            let end = koff + len;
            let cuts = [
                koff,
                (r * count).clamp(koff, end),
                ((r + 1) * count).clamp(koff, end),
                end,
            ];
            for w in cuts.windows(2).filter(|w| w[0] < w[1]) {
                let (x, l) = (w[0], w[1] - w[0]);
                let part = Loc::new(Buf::Scratch, got.offset + x - koff, l);
                b.reduce(acc(x, l), Loc::new(Buf::Send, x, l), part, false, desc);
            }
        } else if j + 1 == rounds {
            b.reduce(Loc::new(Buf::Recv, 0, len), acc(koff, len), got, true, desc);
        } else {
            b.reduce(acc(koff, len), acc(koff, len), got, false, desc);
        }
        lo = keep;
    }
    debug_assert_eq!((lo, landed), (r, (n - 1) * count));
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::OpSpec;

    fn spec(n: u32, count: usize, seg: usize) -> OpSpec {
        OpSpec::for_test(OpKind::ReduceScatter, n, count, seg)
    }

    #[test]
    fn only_power_of_two_worlds_over_two_with_one_segment_inputs() {
        assert!(eligible(&spec(4, 16, 64)));
        assert!(eligible(&spec(8, 8, 64)));
        assert!(
            !eligible(&spec(8, 9, 64)),
            "two segments of input: the ring pipelines them"
        );
        assert!(
            !eligible(&spec(2, 10, 64)),
            "two ranks: one exchange either way"
        );
        assert!(!eligible(&spec(6, 10, 64)), "not a power of two");
        assert!(!eligible(&spec(8, 0, 64)), "nothing to scatter");
        assert!(!eligible(&spec(8, usize::MAX / 4, usize::MAX)), "overflow");
        let mut s = spec(8, 8, 64);
        s.op = OpKind::AllGather;
        assert!(!eligible(&s));
    }

    /// (peer, elements) of every send, releasing actions in dependency order.
    fn sends_of(mut dag: DagSchedule) -> Vec<(u32, usize)> {
        use crate::algo::{Action, Schedule};
        let mut sends = Vec::new();
        while let Some(action) = dag.next_action() {
            let id = match action {
                Action::Send { id, peer, src, .. } => {
                    sends.push((peer, src.len));
                    id
                }
                Action::Recv { id, .. } | Action::Reduce { id, .. } | Action::Copy { id, .. } => id,
                other => panic!("unexpected action {other:?}"),
            };
            dag.complete(id);
        }
        assert!(dag.is_done());
        sends
    }

    /// Every rank sends `n - 1` blocks' worth in `log2 n` rounds, to one
    /// peer per round.
    #[test]
    fn log2_n_peers_and_n_minus_1_blocks_out() {
        for n in [4u32, 8, 16] {
            for r in 0..n {
                let mut s = spec(n, 5, 64);
                s.rank = r;
                let sends = sends_of(reduce_scatter(&s).expect("build"));
                let peers: std::collections::BTreeSet<_> = sends.iter().map(|&(p, _)| p).collect();
                assert_eq!(peers.len(), n.trailing_zeros() as usize, "n={n} r={r}");
                let elems: usize = sends.iter().map(|&(_, len)| len).sum();
                assert_eq!(elems, (n as usize - 1) * 5, "n={n} r={r}");
            }
        }
    }
}
