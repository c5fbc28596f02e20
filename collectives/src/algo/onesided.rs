//! Ring all-reduce by one-sided writes (MiMatrix's GDRAA): the schedule a
//! persistent all-reduce runs when every peer's transport can write into
//! published memory (`Transport::write_imm`).
//!
//! Each rank owns a window ([`Buf::Window`]) of `n - 1` chunk slots that
//! its left neighbour writes its reduce-scatter partials into, and its
//! `Recv` buffer, which the left neighbour writes the finished chunks into
//! during the all-gather. Both are registered and published once, at init;
//! a round then costs two small messages per neighbour, whatever the size:
//!
//! 1. `Ready-RS` (step 0): "my window is free for this round", sent to the
//!    left neighbour when the round starts, so it was read to the end in the
//!    round before.
//! 2. `Ready-AG` (step 1): "my `Recv` may be written", sent once this
//!    rank's reduce-scatter no longer reads or writes `Recv` (its writes
//!    out of it completed, its reductions into it are done).
//!
//! Data moves only as writes with immediates (segments of at most `seg`
//! elements); each says which round (added by the engine), phase, step and
//! segment it is, and the receiver waits for that immediate
//! ([`super::Action::Landed`]) before reading the bytes. The data flow is
//! the two-sided ring's (`ring.rs`): in reduce-scatter step `g` rank `r`
//! writes chunk `r - g - 1` and reduces chunk `r - g - 2` from its window;
//! in all-gather step `t` it forwards chunk `r - t` and receives `r - t - 1`.

use gw_transport::rma::{Imm, MAX_CHUNKS};
use gw_transport::{Error, Result};

use super::dag::{Alias, Builder, Desc, chunk, nsegs, segment};
use super::{Buf, Loc, OpSpec, Remote, Schedule};

/// The steps of the two `Ready` messages.
const READY_RS: u32 = 0;
const READY_AG: u32 = 1;

/// The immediate of chunk `chunk` of persistent window `window`, round 0
/// (the engine stamps each round's number on it).
fn imm(window: u8, chunk: usize) -> u32 {
    Imm::Window {
        window,
        round: 0,
        chunk: chunk as u16,
    }
    .encode()
}

/// The one-sided ring all-reduce of `spec.count` elements on `n >= 2`
/// ranks, in writes of at most `seg` elements, its immediates naming
/// `window`. Fails when a round would need more chunks than an immediate
/// can name (the caller then runs the two-sided ring).
pub fn allreduce(spec: &OpSpec, seg: usize, window: u8) -> Result<Box<dyn Schedule>> {
    let n = spec.nranks as usize;
    let r = spec.rank as usize;
    if n < 2 {
        return Err(Error::InvalidArgument(
            "a one-sided all-reduce needs two ranks or more".into(),
        ));
    }
    let (count, seg) = (spec.count, seg.max(1));
    let right = ((r + 1) % n) as u32;
    let left = ((r + n - 1) % n) as u32;
    let back = |k: usize| (r + 2 * n - k) % n;
    let maxchunk = count.div_ceil(n);
    let m = nsegs(maxchunk, seg).max(1);
    let chunks = 2 * (n - 1) * m;
    if chunks > MAX_CHUNKS {
        return Err(Error::InvalidArgument(format!(
            "a one-sided all-reduce of {count} elements in writes of {seg} on {n} ranks needs {chunks} chunks a round; an immediate names at most {MAX_CHUNKS}"
        )));
    }
    let mut b = Builder::new(
        "one-sided ring all-reduce",
        Alias {
            send_off: 0,
            recv_off: 0,
            len: count,
        },
        1,
    );
    b.window((n - 1) * maxchunk);
    let mut flags = b.pool(3, 1);
    let piece = |c: usize, k: usize| {
        let (coff, clen) = chunk(count, n, c);
        segment(clen, seg, k).map(|(o, l)| (coff + o, l))
    };
    let sync = Desc::new("handshake", 0, 2, 0, 1);
    let (f0, f1, f2) = (flags.slot(1), flags.slot(1), flags.slot(1));
    b.send(left, READY_RS, 0, f0, sync);
    let rs_ok = b.recv(right, READY_RS, 0, f1, sync);
    // Everything of the reduce-scatter that touches Recv (or Send, which
    // in place is Recv): the left neighbour's all-gather writes wait for it.
    let mut rs = Vec::new();
    for g in 0..n - 1 {
        for k in 0..m {
            let desc = Desc::new("reduce-scatter", g, n - 1, k, m);
            let id = g * m + k;
            if let Some((off, len)) = piece(back(g + 1), k) {
                let src = if g > 0 {
                    Loc::new(Buf::Recv, off, len)
                } else if spec.scaled {
                    let dst = Loc::new(Buf::Recv, off, len);
                    rs.push(b.copy(dst, Loc::new(Buf::Send, off, len), false, desc));
                    dst
                } else {
                    Loc::new(Buf::Send, off, len)
                };
                let slot = Remote {
                    buf: Buf::Window,
                    offset: g * maxchunk + (off - chunk(count, n, back(g + 1)).0),
                };
                let w = b.write_remote(right, src, slot, imm(window, id), desc);
                b.dep(rs_ok, w);
                rs.push(w);
            }
            if let Some((off, len)) = piece(back(g + 2), k) {
                let within = off - chunk(count, n, back(g + 2)).0;
                let slot = Loc::new(Buf::Window, g * maxchunk + within, len);
                b.landed(left, imm(window, id), slot, desc);
                let (dst, mine) = (Loc::new(Buf::Recv, off, len), Loc::new(Buf::Send, off, len));
                rs.push(b.reduce(dst, mine, slot, g == n - 2, desc));
            }
        }
    }
    let ready = b.send(left, READY_AG, 0, f0, Desc::new("handshake", 1, 2, 0, 1));
    for a in rs {
        b.dep(a, ready);
    }
    let ag_ok = b.recv(right, READY_AG, 0, f2, Desc::new("handshake", 1, 2, 0, 1));
    for t in 0..n - 1 {
        for k in 0..m {
            let desc = Desc::new("all-gather", t, n - 1, k, m);
            let id = (n - 1) * m + t * m + k;
            if let Some((off, len)) = piece(back(t), k) {
                let dst = Remote {
                    buf: Buf::Recv,
                    offset: off,
                };
                let w = b.write_remote(
                    right,
                    Loc::new(Buf::Recv, off, len),
                    dst,
                    imm(window, id),
                    desc,
                );
                b.dep(ag_ok, w);
            }
            if let Some((off, len)) = piece(back(t + 1), k) {
                b.landed(left, imm(window, id), Loc::new(Buf::Recv, off, len), desc);
            }
        }
    }
    Ok(Box::new(b.finish()))
}
