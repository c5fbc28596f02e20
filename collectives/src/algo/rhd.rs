//! Recursive halving-doubling all-reduce (Rabenseifner), for power-of-two `n`.
//!
//! The data is cut into `n` chunks. Reduce-scatter by recursive halving: in
//! round `j` (of `L = log2 n`) rank `r` pairs with `r XOR n/2^(j+1)`; of the
//! chunk block both hold, the rank with that bit clear keeps the lower half
//! and the other the upper half; each sends the half it gives up and adds the
//! partner's copy of the half it keeps. After `L` rounds rank `r` holds chunk
//! `r` complete (finalized in the last round). All-gather by recursive
//! doubling runs the rounds backwards, exchanging whole blocks, which double.
//!
//! Messages are cut into segments; received halves land in `spec.depth` scratch
//! slots of a segment each. Round `g` (0..L halving, L..2L doubling) uses step
//! numbers `g·M + k` with `M` the number of segments of the whole buffer, and
//! is its own stream.

use gw_transport::{Error, Result};

use super::dag::{Alias, Builder, DagSchedule, Desc, check_steps, chunk, nsegs, segment};
use super::{Buf, Loc, OpSpec};

pub(super) fn allreduce(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r, count, seg) = spec.dims();
    if !n.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "rhd needs a power-of-two world size, got {n} ranks"
        )));
    }
    let rounds = n.trailing_zeros() as usize;
    let m = nsegs(count, seg).max(1);
    check_steps("rhd all-reduce", m.checked_mul(2 * rounds))?;
    let mut b = Builder::new(
        "rhd all-reduce",
        Alias {
            send_off: 0,
            recv_off: 0,
            len: count,
        },
        spec.depth,
    );
    let mut slots = b.pool(spec.depth, seg.min(count));
    // Element range of chunks [lo, hi).
    let elems = |lo: usize, hi: usize| {
        let a = chunk(count, n, lo).0;
        (a, chunk(count, n, hi).0 - a)
    };
    let (mut lo, mut hi) = (0, n);
    for j in 0..rounds {
        let mask = n >> (j + 1);
        let peer = (r ^ mask) as u32;
        let mid = lo + mask;
        let (keep, give) = if r & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (koff, klen) = elems(keep.0, keep.1);
        let (goff, glen) = elems(give.0, give.1);
        let segs = nsegs(klen, seg).max(nsegs(glen, seg));
        for k in 0..segs {
            let step = (j * m + k) as u32;
            let desc = Desc::new("recursive halving", j, rounds, k, segs);
            if let Some((o, l)) = segment(glen, seg, k) {
                let src = if j > 0 {
                    Loc::new(Buf::Recv, goff + o, l)
                } else if spec.scaled {
                    let dst = Loc::new(Buf::Recv, goff + o, l);
                    b.copy(dst, Loc::new(Buf::Send, goff + o, l), false, desc);
                    dst
                } else {
                    Loc::new(Buf::Send, goff + o, l)
                };
                b.send(peer, step, j as u32, src, desc);
            }
            if let Some((o, l)) = segment(klen, seg, k) {
                let slot = slots.slot(l);
                b.recv(peer, step, j as u32, slot, desc);
                let dst = Loc::new(Buf::Recv, koff + o, l);
                let a = if j == 0 {
                    Loc::new(Buf::Send, koff + o, l)
                } else {
                    dst
                };
                b.reduce(dst, a, slot, j + 1 == rounds, desc);
            }
        }
        (lo, hi) = keep;
    }
    debug_assert_eq!((lo, hi), (r, r + 1));
    for j in (0..rounds).rev() {
        let mask = n >> (j + 1);
        let peer = (r ^ mask) as u32;
        let g = 2 * rounds - 1 - j;
        let plo = lo ^ mask;
        let (moff, mlen) = elems(lo, hi);
        let (poff, plen) = elems(plo, plo + mask);
        let segs = nsegs(mlen, seg).max(nsegs(plen, seg));
        for k in 0..segs {
            let step = (g * m + k) as u32;
            let desc = Desc::new("recursive doubling", rounds - 1 - j, rounds, k, segs);
            if let Some((o, l)) = segment(mlen, seg, k) {
                b.send(peer, step, g as u32, Loc::new(Buf::Recv, moff + o, l), desc);
            }
            if let Some((o, l)) = segment(plen, seg, k) {
                b.recv(peer, step, g as u32, Loc::new(Buf::Recv, poff + o, l), desc);
            }
        }
        lo = lo.min(plo);
        hi = lo + 2 * mask;
    }
    Ok(b.finish())
}
