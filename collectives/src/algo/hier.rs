//! Hierarchical all-reduce for ranks spread over several hosts.
//!
//! A flat ring sends every byte of the message `2(n − 1)/n` times across the
//! slowest link; when ranks share hosts, most of that traffic can stay on the
//! host, in shared memory. This schedule does what NCCL and Horovod do:
//!
//! 1. reduce-scatter within each host (a ring over its `L` ranks), so that
//!    local rank `l` holds the host's sum of chunk `l` of `L` chunks;
//! 2. all-reduce chunk `l` across hosts among the ranks with local index `l`
//!    (a ring over the `H` hosts: reduce-scatter then all-gather of `H`
//!    sub-chunks), so each rank sends only `2(H − 1)/H · 1/L` of the message
//!    over the network;
//! 3. all-gather within each host.
//!
//! The host layout comes from [`OpSpec::local_size`]: rank `r` is local rank
//! `r % L` of host `r / L` (the communicator only offers hier when its ranks
//! are grouped that way). With one rank per host it is a flat ring over the
//! hosts, with one host a flat ring over its ranks.
//!
//! The message is cut into an `L × H` grid of pieces (sub-chunk `j` of chunk
//! `c`), and each piece into segments of at most `segment_elems`. As in
//! `ring.rs` the schedule is laid out segment-major: segment `k` of every
//! piece goes through the three phases before segment `k + 1` starts, so the
//! dag overlaps one segment's network transfer with the next segment's
//! shared-memory reduction. Intra-host messages (stream 0) of segment `k` have
//! step numbers `k·2H(L − 1) + …` (reduce-scatter of sub-chunk `j`, step `g`:
//! `j(L − 1) + g`; all-gather: `H(L − 1) + j(L − 1) + t`); inter-host messages
//! (stream 1) `k·2(H − 1) + g`. Intra- and inter-host peers are never the same
//! rank, so the two numberings cannot collide.
//!
//! Weighted contributions and `avg` follow `ring.rs`: `Send` is only ever
//! reduced or copied, never sent, when scaled; the one reduction that
//! completes an element's global sum (last inter-host reduce-scatter step, or
//! the last intra-host one with a single host) finalizes it.

use gw_transport::{Error, Result};

use super::dag::{Alias, Builder, DagSchedule, Desc, check_steps, chunk, nsegs, segment};
use super::{Buf, Loc, OpSpec};

/// A ring of `size` members; this rank is member `me`.
#[derive(Clone, Copy)]
struct Ring {
    size: usize,
    me: usize,
}

impl Ring {
    /// Member `me - back`, mod size.
    fn back(self, back: usize) -> usize {
        (self.me + 2 * self.size - back % self.size) % self.size
    }
}

/// Hierarchical all-reduce of `spec.count` elements (see the module comment).
pub(super) fn allreduce(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r, count, seg) = spec.dims();
    let l_size = spec.local_size as usize;
    if l_size == 0 || !n.is_multiple_of(l_size) {
        return Err(Error::InvalidArgument(format!(
            "hier needs hosts with the same number of consecutive ranks; {n} ranks in hosts of {l_size} is not that layout"
        )));
    }
    let h_size = n / l_size;
    let (host, local) = (r / l_size, r % l_size);
    let intra = Ring {
        size: l_size,
        me: local,
    };
    let inter = Ring {
        size: h_size,
        me: host,
    };
    // The rank at local index `l` of this host, and at host `h` with this local index.
    let local_peer = |l: usize| (host * l_size + l) as u32;
    let host_peer = |h: usize| (h * l_size + local) as u32;
    let (intra_right, intra_left) = (
        local_peer(intra.back(l_size - 1)),
        local_peer(intra.back(1)),
    );
    let (inter_right, inter_left) = (host_peer(inter.back(h_size - 1)), host_peer(inter.back(1)));

    // Piece (c, j): sub-chunk j (of H) of chunk c (of L); segment k of it.
    let piece = |c: usize, j: usize, k: usize| {
        let (coff, clen) = chunk(count, l_size, c);
        let (soff, slen) = chunk(clen, h_size, j);
        segment(slen, seg, k).map(|(o, len)| (coff + soff + o, len))
    };
    let maxpiece = count.div_ceil(l_size).div_ceil(h_size);
    let m = nsegs(maxpiece, seg);
    let intra_steps = 2 * h_size * (l_size - 1);
    let inter_steps = 2 * (h_size - 1);
    check_steps("hier all-reduce", m.checked_mul(intra_steps))?;
    check_steps("hier all-reduce", m.checked_mul(inter_steps))?;

    let mut b = Builder::new(
        "hier all-reduce",
        Alias {
            send_off: 0,
            recv_off: 0,
            len: count,
        },
        spec.depth,
    );
    // Separate slot pools, so a segment's intra-host receives never wait for
    // slots the previous segment's inter-host receives still hold.
    let slot_len = seg.min(maxpiece);
    let mut intra_slots = b.pool(spec.depth, slot_len);
    let mut inter_slots = b.pool(spec.depth, slot_len);
    let recv = |off: usize, len: usize| Loc::new(Buf::Recv, off, len);
    let send = |off: usize, len: usize| Loc::new(Buf::Send, off, len);
    // The first send of a range: straight from `Send` unless it is scaled (the
    // driver scales `Send` only when reducing or copying it).
    let first_send = |b: &mut Builder, off: usize, len: usize, desc: Desc| {
        if spec.scaled {
            b.copy(recv(off, len), send(off, len), false, desc);
            recv(off, len)
        } else {
            send(off, len)
        }
    };
    // Whether the intra-host reduce-scatter completes the sum (one host).
    let intra_finalizes = h_size == 1;
    for k in 0..m {
        // 1. Reduce-scatter within the host, one ring per sub-chunk j.
        for j in 0..h_size {
            for g in 0..l_size - 1 {
                let step = (k * intra_steps + j * (l_size - 1) + g) as u32;
                let desc = Desc::new("intra-host reduce-scatter", g, l_size - 1, k, m);
                if let Some((off, len)) = piece(intra.back(g + 1), j, k) {
                    let src = if g > 0 {
                        recv(off, len)
                    } else {
                        first_send(&mut b, off, len, desc)
                    };
                    b.send(intra_right, step, 0, src, desc);
                }
                if let Some((off, len)) = piece(intra.back(g + 2), j, k) {
                    let slot = intra_slots.slot(len);
                    b.recv(intra_left, step, 0, slot, desc);
                    let last = g == l_size - 2;
                    b.reduce(
                        recv(off, len),
                        send(off, len),
                        slot,
                        last && intra_finalizes,
                        desc,
                    );
                }
            }
        }
        // 2. All-reduce of chunk `local` across hosts: ring reduce-scatter of
        // its sub-chunks, then ring all-gather. The host's partial sum of the
        // chunk is in `Recv` after step 1, or still in `Send` with one rank
        // per host.
        let host_sum = |off: usize, len: usize| {
            if l_size > 1 {
                recv(off, len)
            } else {
                send(off, len)
            }
        };
        for g in 0..inter_steps {
            let step = (k * inter_steps + g) as u32;
            if g < h_size - 1 {
                let desc = Desc::new("inter-host reduce-scatter", g, h_size - 1, k, m);
                if let Some((off, len)) = piece(local, inter.back(g + 1), k) {
                    let src = if g > 0 || l_size > 1 {
                        recv(off, len)
                    } else {
                        first_send(&mut b, off, len, desc)
                    };
                    b.send(inter_right, step, 1, src, desc);
                }
                if let Some((off, len)) = piece(local, inter.back(g + 2), k) {
                    let slot = inter_slots.slot(len);
                    b.recv(inter_left, step, 1, slot, desc);
                    b.reduce(
                        recv(off, len),
                        host_sum(off, len),
                        slot,
                        g == h_size - 2,
                        desc,
                    );
                }
            } else {
                let t = g - (h_size - 1);
                let desc = Desc::new("inter-host all-gather", t, h_size - 1, k, m);
                if let Some((off, len)) = piece(local, inter.back(t), k) {
                    b.send(inter_right, step, 1, recv(off, len), desc);
                }
                if let Some((off, len)) = piece(local, inter.back(t + 1), k) {
                    b.recv(inter_left, step, 1, recv(off, len), desc);
                }
            }
        }
        // 3. All-gather within the host.
        for j in 0..h_size {
            for t in 0..l_size - 1 {
                let step = (k * intra_steps + h_size * (l_size - 1) + j * (l_size - 1) + t) as u32;
                let desc = Desc::new("intra-host all-gather", t, l_size - 1, k, m);
                if let Some((off, len)) = piece(intra.back(t), j, k) {
                    b.send(intra_right, step, 0, recv(off, len), desc);
                }
                if let Some((off, len)) = piece(intra.back(t + 1), j, k) {
                    b.recv(intra_left, step, 0, recv(off, len), desc);
                }
            }
        }
    }
    Ok(b.finish())
}
