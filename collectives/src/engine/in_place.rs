//! Reading a received message where the transport left it.
//!
//! Over shared memory a message arrives in a ring slot, and a receive copies
//! it into the engine's scratch, from which a reduction then reads it: in a
//! reduce-scatter that copy is one of four passes over every byte. A receive
//! into scratch is posted with `irecv_in_place` instead; a transport that can
//! (shm, for a message that came as one frame) completes it
//! [`Landed::InPlace`], leaving the bytes in the slot. The engine then runs
//! what the receive's completion made ready. The first reduction that reads
//! exactly the received range reads it from the slot; anything else that
//! touches the range first (a send of it, a copy, a reduction reading part
//! of it) gets it copied into scratch, as a plain receive would. Either way
//! the slot is
//! released before this function returns, so a held slot never blocks the
//! peer's stream while the engine waits for something else.
//!
//! [`Landed::InPlace`]: gw_transport::Landed::InPlace

use super::{Engine, Running};
use crate::algo::{Action, ActionId, Loc};
use gw_transport::{Request, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// Reductions that read a received message where it arrived, process-wide.
static IN_PLACE_READS: AtomicU64 = AtomicU64::new(0);

/// How many reductions of any engine of this process read their received
/// operand where the transport left it; tests use it to see the path taken.
#[doc(hidden)]
pub fn in_place_reads() -> u64 {
    IN_PLACE_READS.load(Ordering::Relaxed)
}

impl Engine {
    /// Completes receive `id` on transport `t`, whose message lies at `at`
    /// until `held` is released, and runs what that made ready (see the
    /// module comment).
    pub(super) fn consume_in_place(
        &mut self,
        r: &mut Running,
        t: usize,
        id: ActionId,
        in_place: Option<Loc>,
        held: Request,
        at: *const u8,
    ) -> Result<()> {
        let Some(range) = in_place else {
            let _ = self.transports[t].release_in_place(held);
            return Err(gw_transport::Error::Internal(
                "a receive not posted in place completed in place".into(),
            ));
        };
        r.sched.complete(id);
        // The slot's request, until it is released.
        let mut held = Some(held);
        let mut out = Ok(());
        while out.is_ok() {
            let Some(a) = r.sched.next_action() else {
                break;
            };
            if held.is_some() {
                if let Action::Reduce {
                    id,
                    dst,
                    a: x,
                    b: y,
                    finalize,
                } = a
                    && reads_once(range, dst, x, y)
                {
                    out = self.reduce(r, dst, x, y, finalize, Some((range, at)));
                    IN_PLACE_READS.fetch_add(1, Ordering::Relaxed);
                    if let Some(h) = held.take() {
                        out = out.and(self.transports[t].release_in_place(h));
                    }
                    r.sched.complete(id);
                    continue;
                }
                if touches(&a, range)
                    && let Some(h) = held.take()
                {
                    out = self.land(r, t, h, range, at);
                    if out.is_err() {
                        break;
                    }
                }
            }
            out = self.execute(r, a).map(|_| ());
        }
        if let Some(h) = held {
            // Nothing that reads the message is ready yet: it goes to
            // scratch, and the slot back to the peer.
            out = out.and(self.land(r, t, h, range, at));
        }
        out
    }

    /// Copies a message left in place into its scratch range and releases
    /// it (released even if the range is bad, so that no slot stays held).
    fn land(
        &mut self,
        r: &Running,
        t: usize,
        held: Request,
        range: Loc,
        at: *const u8,
    ) -> Result<()> {
        let copied = self.buf_range(r, range).map(|(base, off, len)| {
            // SAFETY: buf_range checked the range against scratch; the
            // transport guarantees `len` bytes at `at` until release, in
            // memory the engine does not own, so the two do not overlap.
            unsafe { gw_transport::copy_bytes(base.0.add(off), at, len) }
        });
        let released = self.transports[t].release_in_place(held);
        copied.and(released)
    }
}

/// Whether a reduction `dst = x ⊕ y` reads `range` as one whole operand and
/// nothing else of it, so that it can read it from where it arrived.
fn reads_once(range: Loc, dst: Loc, x: Loc, y: Loc) -> bool {
    let (ux, uy) = (x == range, y == range);
    (ux != uy)
        && !overlaps(if ux { y } else { x }, range)
        && (dst == range || !overlaps(dst, range))
}

/// Whether action `a` reads or writes any element of `l`.
fn touches(a: &Action, l: Loc) -> bool {
    match *a {
        Action::Send { src: x, .. } | Action::Recv { dst: x, .. } => overlaps(x, l),
        Action::Reduce { dst, a, b, .. } => [dst, a, b].iter().any(|&x| overlaps(x, l)),
        Action::Copy { dst, src, .. } => overlaps(dst, l) || overlaps(src, l),
        Action::Write { src: x, .. }
        | Action::Read { dst: x, .. }
        | Action::Landed { dst: x, .. } => overlaps(x, l),
    }
}

fn overlaps(a: Loc, b: Loc) -> bool {
    a.buf == b.buf && a.offset < b.offset + b.len && b.offset < a.offset + a.len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Buf;

    fn s(offset: usize, len: usize) -> Loc {
        Loc::new(Buf::Scratch, offset, len)
    }

    #[test]
    fn a_reduction_reads_in_place_only_a_whole_operand_it_reads_once() {
        let (mine, out) = (Loc::new(Buf::Send, 0, 8), Loc::new(Buf::Recv, 0, 8));
        assert!(reads_once(s(8, 8), out, mine, s(8, 8)));
        assert!(reads_once(s(8, 8), out, s(8, 8), mine));
        // The result may overwrite the received range itself...
        assert!(reads_once(s(8, 8), s(8, 8), s(8, 8), mine));
        // ...but not part of it, nor may the other operand read it.
        assert!(!reads_once(s(8, 8), s(12, 8), s(8, 8), mine));
        assert!(!reads_once(s(8, 8), out, s(8, 8), s(8, 8)));
        assert!(!reads_once(s(8, 8), out, s(8, 8), s(12, 8)));
        // A part of the range is not the message.
        assert!(!reads_once(
            s(8, 8),
            out,
            s(8, 4),
            Loc::new(Buf::Send, 0, 4)
        ));
        assert!(!reads_once(s(8, 8), out, mine, Loc::new(Buf::Recv, 8, 8)));
    }

    #[test]
    fn overlap_is_per_buffer_and_half_open() {
        assert!(overlaps(s(0, 8), s(7, 1)));
        assert!(!overlaps(s(0, 8), s(8, 8)));
        assert!(!overlaps(s(0, 8), Loc::new(Buf::Recv, 0, 8)));
        let send = Action::Send {
            id: 0,
            peer: 1,
            step: 0,
            src: s(4, 4),
        };
        assert!(touches(&send, s(0, 8)));
        assert!(!touches(&send, s(8, 8)));
    }
}
