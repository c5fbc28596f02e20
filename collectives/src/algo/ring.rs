//! Ring algorithms: all-reduce (reduce-scatter then all-gather), reduce-scatter
//! and all-gather.
//!
//! Rank `r` sends to `r + 1` and receives from `r - 1`. In reduce-scatter step
//! `s` (of `n - 1`) it sends chunk `r - s - 1` and receives chunk `r - s - 2`,
//! adding its own contribution, so that after the last step it holds the
//! complete chunk `r`. In all-gather step `t` it forwards chunk `r - t` and
//! receives chunk `r - t - 1`.
//!
//! Each chunk is cut into segments of at most `segment_elems`, and the
//! schedule is laid out segment-major (segment `k` goes through every step
//! before segment `k + 1` starts, as NCCL's loop does), so up to
//! `depth` ([`OpSpec::depth`](super::OpSpec::depth)) segments of every stream are in flight and the
//! reduction of one overlaps the transfer of the next. Message `(segment k,
//! step g)` of the `2(n - 1)` (or `n - 1`) steps has step number
//! `k * steps + g`.

use gw_transport::Result;

use super::dag::{Alias, Builder, DagSchedule, Desc, check_steps, chunk, nsegs, segment};
use super::{Buf, Loc, OpSpec};

struct Ring {
    n: usize,
    r: usize,
    right: u32,
    left: u32,
}

impl Ring {
    fn new(spec: &OpSpec) -> Ring {
        let n = spec.nranks as usize;
        let r = spec.rank as usize;
        Ring {
            n,
            r,
            right: ((r + 1) % n) as u32,
            left: ((r + n - 1) % n) as u32,
        }
    }

    /// Chunk `r - back`, mod n.
    fn back(&self, back: usize) -> usize {
        (self.r + 2 * self.n - back) % self.n
    }
}

/// Ring all-reduce of `spec.count` elements, `n >= 2`. Partial sums live in
/// `Recv`; each reduce-scatter message lands in one of `spec.depth` scratch slots
/// of a segment each.
pub(super) fn allreduce(spec: &OpSpec) -> Result<DagSchedule> {
    let ring = Ring::new(spec);
    let (n, count, seg) = (ring.n, spec.count, spec.segment_elems);
    let maxchunk = count.div_ceil(n);
    let m = nsegs(maxchunk, seg);
    let steps = 2 * (n - 1);
    check_steps("ring all-reduce", m.checked_mul(steps))?;
    let mut b = Builder::new(
        "ring all-reduce",
        Alias {
            send_off: 0,
            recv_off: 0,
            len: count,
        },
        spec.depth,
    );
    let mut slots = b.pool(spec.depth, seg.min(maxchunk));
    // The segment `k` of chunk `c`, if it has one.
    let piece = |c: usize, k: usize| {
        let (coff, clen) = chunk(count, n, c);
        segment(clen, seg, k).map(|(o, l)| (coff + o, l))
    };
    for k in 0..m {
        for g in 0..steps {
            let step = (k * steps + g) as u32;
            if g < n - 1 {
                let desc = Desc::new("reduce-scatter", g, n - 1, k, m);
                if let Some((off, len)) = piece(ring.back(g + 1), k) {
                    let src = if g > 0 {
                        Loc::new(Buf::Recv, off, len)
                    } else if spec.scaled {
                        let dst = Loc::new(Buf::Recv, off, len);
                        b.copy(dst, Loc::new(Buf::Send, off, len), false, desc);
                        dst
                    } else {
                        Loc::new(Buf::Send, off, len)
                    };
                    b.send(ring.right, step, 0, src, desc);
                }
                if let Some((off, len)) = piece(ring.back(g + 2), k) {
                    let slot = slots.slot(len);
                    b.recv(ring.left, step, 0, slot, desc);
                    let (dst, mine) =
                        (Loc::new(Buf::Recv, off, len), Loc::new(Buf::Send, off, len));
                    b.reduce(dst, mine, slot, g == n - 2, desc);
                }
            } else {
                let t = g - (n - 1);
                let desc = Desc::new("all-gather", t, n - 1, k, m);
                if let Some((off, len)) = piece(ring.back(t), k) {
                    b.send(ring.right, step, 0, Loc::new(Buf::Recv, off, len), desc);
                }
                if let Some((off, len)) = piece(ring.back(t + 1), k) {
                    b.recv(ring.left, step, 0, Loc::new(Buf::Recv, off, len), desc);
                }
            }
        }
    }
    Ok(b.finish())
}

/// Ring reduce-scatter: `Send` holds `n` chunks of `spec.count`, `Recv` gets
/// chunk `rank`. Partial sums travel in scratch slots (2·`spec.depth` of a
/// segment each: a slot is held from its receive until the partial in it has
/// been sent on), only the final reduction writes `Recv`.
pub(super) fn reduce_scatter(spec: &OpSpec) -> Result<DagSchedule> {
    let ring = Ring::new(spec);
    let (n, count, seg) = (ring.n, spec.count, spec.segment_elems);
    let m = nsegs(count, seg);
    let steps = n - 1;
    check_steps("ring reduce-scatter", m.checked_mul(steps))?;
    let mut b = Builder::new(
        "ring reduce-scatter",
        Alias {
            send_off: ring.r * count,
            recv_off: 0,
            len: count,
        },
        spec.depth,
    );
    let mut slots = b.pool(2 * spec.depth, seg.min(count));
    for k in 0..m {
        let (off, len) = segment(count, seg, k).expect("segment");
        let send_piece = |c: usize| Loc::new(Buf::Send, c * count + off, len);
        // The partial sum of this segment that the next step sends on.
        let mut partial = send_piece(ring.back(1));
        if spec.scaled {
            let slot = slots.slot(len);
            b.copy(
                slot,
                partial,
                false,
                Desc::new("reduce-scatter", 0, steps, k, m),
            );
            partial = slot;
        }
        for s in 0..steps {
            let step = (k * steps + s) as u32;
            let desc = Desc::new("reduce-scatter", s, steps, k, m);
            b.send(ring.right, step, 0, partial, desc);
            let slot = slots.slot(len);
            b.recv(ring.left, step, 0, slot, desc);
            let mine = send_piece(ring.back(s + 2));
            if s == steps - 1 {
                b.reduce(Loc::new(Buf::Recv, off, len), mine, slot, true, desc);
            } else {
                b.reduce(slot, slot, mine, false, desc);
                partial = slot;
            }
        }
    }
    Ok(b.finish())
}

/// Ring all-gather: `Send` holds `spec.count`, `Recv` gets `n` chunks of it.
/// No scratch.
pub(super) fn all_gather(spec: &OpSpec) -> Result<DagSchedule> {
    let ring = Ring::new(spec);
    let (n, count, seg) = (ring.n, spec.count, spec.segment_elems);
    let m = nsegs(count, seg);
    let steps = n - 1;
    check_steps("ring all-gather", m.checked_mul(steps))?;
    let mut b = Builder::new(
        "ring all-gather",
        Alias {
            send_off: 0,
            recv_off: ring.r * count,
            len: count,
        },
        spec.depth,
    );
    for k in 0..m {
        let (off, len) = segment(count, seg, k).expect("segment");
        let piece = |c: usize| Loc::new(Buf::Recv, c * count + off, len);
        let own = Loc::new(Buf::Send, off, len);
        let desc = Desc::new("all-gather", 0, steps, k, m);
        // Unscaled, the first send reads Send itself and must come before the
        // copy that (in place) writes the same elements.
        if !spec.scaled {
            b.send(ring.right, (k * steps) as u32, 0, own, desc);
        }
        b.copy(piece(ring.r), own, false, desc);
        for t in 0..steps {
            let step = (k * steps + t) as u32;
            let desc = Desc::new("all-gather", t, steps, k, m);
            if t > 0 || spec.scaled {
                b.send(ring.right, step, 0, piece(ring.back(t)), desc);
            }
            b.recv(ring.left, step, 0, piece(ring.back(t + 1)), desc);
        }
    }
    Ok(b.finish())
}
