//! Recursive doubling all-reduce: the latency algorithm.
//!
//! Every round each rank swaps its whole partial result with the rank whose
//! number differs in one bit and adds the two, so after `log2 n` rounds all
//! ranks hold the sum. It sends `log2 n` times the data the ring sends, but
//! in `log2 n` sequential messages instead of `2(n - 1)` (ring) or
//! `2 log2 n` (rhd, tree): for small messages, where each message costs a
//! wake-up or a network hop and the bytes cost nothing, it is the fastest.
//! On two ranks it is a single exchange. MPI libraries use it for small
//! all-reduces for the same reason.
//!
//! For a world size that is not a power of two, with `p` the largest power
//! of two below `n` and `e = n - p`, ranks `2i + 1` (`i < e`) first fold
//! their data into rank `2i`, the remaining `p` ranks run the rounds, and
//! the folded ranks get the result back at the end. Each addition takes the
//! two partial sums of one round, so both partners compute the same bits
//! (addition is commutative) and every rank ends with an identical result.
//!
//! Messages are cut into segments; received partials land in `spec.depth`
//! scratch slots. Round `g` uses step numbers `g·M + k` (`M` segments) and
//! is its own stream; the fold is round 0 and the hand-back the last.

use gw_transport::Result;

use super::dag::{Alias, Builder, DagSchedule, Desc, check_steps, nsegs, segment};
use super::{Buf, Loc, OpSpec};

/// Rank `r`'s role in a world of `n` with `e` ranks folded away.
enum Role {
    /// Folds into `partner` and gets the result back from it.
    Folded { partner: u32 },
    /// Runs the rounds as virtual rank `v`; `folded` is the rank that folds
    /// into it, if any.
    Active { v: usize, folded: Option<u32> },
}

fn role(r: usize, e: usize) -> Role {
    if r < 2 * e {
        if r % 2 == 1 {
            Role::Folded {
                partner: (r - 1) as u32,
            }
        } else {
            Role::Active {
                v: r / 2,
                folded: Some((r + 1) as u32),
            }
        }
    } else {
        Role::Active {
            v: r - e,
            folded: None,
        }
    }
}

/// The real rank of virtual rank `v`.
fn real(v: usize, e: usize) -> u32 {
    (if v < e { 2 * v } else { v + e }) as u32
}

/// The rounds of an all-reduce whose schedule is nothing but `log2 n`
/// exchanges of the whole buffer: a power-of-two world, one segment, no
/// weight. Round `j` swaps with rank `rank ^ 2^j` under step `j + 1`, sends
/// the input in round 0 and the partial sum (in `Recv`) after, and adds
/// what it received to it. The engine runs such calls without the schedule
/// (`engine/direct.rs`); `None` for any other call.
pub(crate) fn direct_rounds(spec: &OpSpec) -> Option<u32> {
    spec.direct_rounds_of(crate::op::OpKind::AllReduce)
}

pub(super) fn allreduce(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r, count, seg) = spec.dims();
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let e = n - p;
    let rounds = p.trailing_zeros() as usize;
    // Round 0 is the fold, 1..=rounds the exchanges, rounds + 1 the hand-back.
    let m = nsegs(count, seg).max(1);
    check_steps("rd all-reduce", m.checked_mul(rounds + 2))?;
    let mut b = Builder::new(
        "rd all-reduce",
        Alias {
            send_off: 0,
            recv_off: 0,
            len: count,
        },
        spec.depth,
    );
    let mut slots = b.pool(spec.depth, seg.min(count).max(1));
    let piece = |k: usize| segment(count, seg, k);
    match role(r, e) {
        Role::Folded { partner } => {
            for k in 0..m {
                let Some((o, l)) = piece(k) else { continue };
                let desc = Desc::new("fold", 0, 1, k, m);
                let mut src = Loc::new(Buf::Send, o, l);
                if spec.scaled {
                    let dst = Loc::new(Buf::Recv, o, l);
                    b.copy(dst, src, false, desc);
                    src = dst;
                }
                b.send(partner, k as u32, 0, src, desc);
            }
            for k in 0..m {
                let Some((o, l)) = piece(k) else { continue };
                let desc = Desc::new("hand-back", 0, 1, k, m);
                let step = ((rounds + 1) * m + k) as u32;
                b.recv(
                    partner,
                    step,
                    (rounds + 1) as u32,
                    Loc::new(Buf::Recv, o, l),
                    desc,
                );
            }
        }
        Role::Active { v, folded } => {
            // Where this rank's partial sum lives before each round: its own
            // contribution in Send until the first addition writes Recv.
            let mut in_recv = false;
            if let Some(f) = folded {
                for k in 0..m {
                    let Some((o, l)) = piece(k) else { continue };
                    let desc = Desc::new("fold", 0, 1, k, m);
                    let slot = slots.slot(l);
                    b.recv(f, k as u32, 0, slot, desc);
                    let dst = Loc::new(Buf::Recv, o, l);
                    b.reduce(dst, Loc::new(Buf::Send, o, l), slot, false, desc);
                }
                in_recv = true;
            }
            for j in 0..rounds {
                let peer = real(v ^ (1 << j), e);
                let g = j + 1;
                for k in 0..m {
                    let Some((o, l)) = piece(k) else { continue };
                    let desc = Desc::new("recursive doubling", j, rounds, k, m);
                    let step = (g * m + k) as u32;
                    let dst = Loc::new(Buf::Recv, o, l);
                    let mine = if in_recv {
                        dst
                    } else {
                        Loc::new(Buf::Send, o, l)
                    };
                    let src = if !in_recv && spec.scaled {
                        b.copy(dst, mine, false, desc);
                        dst
                    } else {
                        mine
                    };
                    b.send(peer, step, g as u32, src, desc);
                    let slot = slots.slot(l);
                    b.recv(peer, step, g as u32, slot, desc);
                    b.reduce(dst, src, slot, j + 1 == rounds, desc);
                }
                in_recv = true;
            }
            if let Some(f) = folded {
                for k in 0..m {
                    let Some((o, l)) = piece(k) else { continue };
                    let desc = Desc::new("hand-back", 0, 1, k, m);
                    let step = ((rounds + 1) * m + k) as u32;
                    b.send(
                        f,
                        step,
                        (rounds + 1) as u32,
                        Loc::new(Buf::Recv, o, l),
                        desc,
                    );
                }
            }
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Action, Schedule};
    use crate::op::OpKind;

    fn spec(n: u32, rank: u32, count: usize, seg: usize, scaled: bool) -> OpSpec {
        OpSpec {
            op: OpKind::AllReduce,
            rank,
            nranks: n,
            count,
            root: 0,
            segment_elems: seg,
            depth: 8,
            scaled,
            local_size: 0,
            fan_out: false,
        }
    }

    /// The direct path's description of the rounds is the schedule's: walking
    /// the DAG (completing each action as it comes) yields, per round, one
    /// send of the whole buffer (input first, then the partial sum) and one
    /// receive of it from `rank ^ 2^j` under step `j + 1`, and nothing else
    /// that moves data.
    #[test]
    fn direct_rounds_are_the_schedules_rounds() {
        for n in [2u32, 4, 8, 16] {
            for count in [1usize, 7, 64] {
                for rank in 0..n {
                    let s = spec(n, rank, count, 64, false);
                    let rounds = direct_rounds(&s).expect("eligible");
                    assert_eq!(1u32 << rounds, n);
                    let mut sched = allreduce(&s).expect("schedule");
                    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
                    while !sched.is_done() {
                        let a = sched
                            .next_action()
                            .expect("a DAG that is not done has work");
                        match a {
                            Action::Send {
                                peer, step, src, ..
                            } => {
                                assert_eq!((src.offset, src.len), (0, count));
                                sends.push((peer, step, src.buf));
                            }
                            Action::Recv {
                                peer, step, dst, ..
                            } => {
                                assert_eq!(dst.len, count);
                                recvs.push((peer, step));
                            }
                            Action::Reduce { .. } => {}
                            Action::Copy { .. }
                            | Action::Write { .. }
                            | Action::Read { .. }
                            | Action::Landed { .. } => {
                                panic!("unexpected action: {a:?}")
                            }
                        }
                        sched.complete(a.id());
                    }
                    let want: Vec<_> = (0..rounds).map(|j| (rank ^ (1 << j), j + 1)).collect();
                    let srcs: Vec<_> = sends.iter().map(|&(p, s, _)| (p, s)).collect();
                    assert_eq!(srcs, want, "n={n} rank={rank} count={count}");
                    assert_eq!(recvs, want, "n={n} rank={rank} count={count}");
                    for (j, &(_, _, b)) in sends.iter().enumerate() {
                        let want_buf = if j == 0 { Buf::Send } else { Buf::Recv };
                        assert_eq!(b, want_buf, "round {j} sends from the wrong buffer");
                    }
                }
            }
        }
    }

    #[test]
    fn direct_rounds_refuse_what_the_schedule_does_otherwise() {
        assert_eq!(direct_rounds(&spec(3, 0, 8, 64, false)), None, "fold");
        assert_eq!(direct_rounds(&spec(6, 0, 8, 64, false)), None, "fold");
        assert_eq!(
            direct_rounds(&spec(4, 0, 65, 64, false)),
            None,
            "two segments"
        );
        assert_eq!(direct_rounds(&spec(4, 0, 8, 64, true)), None, "weighted");
        assert_eq!(direct_rounds(&spec(4, 0, 0, 64, false)), None, "empty");
        assert_eq!(direct_rounds(&spec(1, 0, 8, 64, false)), None, "alone");
        let mut bcast = spec(4, 0, 8, 64, false);
        bcast.op = OpKind::Broadcast;
        assert_eq!(direct_rounds(&bcast), None, "not all-reduce");
        assert_eq!(direct_rounds(&spec(4, 0, 64, 64, false)), Some(2));
    }
}
