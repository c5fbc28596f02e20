//! One peer's receive side, without I/O: posted receives, the frames that
//! came before their receive, the messages announced for later, and the
//! credits that bound how far a sender may run ahead.
//!
//! Every backend reads frames from somewhere (a socket, a ring of slots)
//! and has to decide, per frame, where its bytes go. The rules are the same
//! everywhere, so they live here once:
//!
//! - A data frame whose receive is posted is delivered into it.
//! - An *eager* frame (sent on a credit) whose receive is not posted yet
//!   goes into one of a fixed number of buffers, allocated when the peer's
//!   connection is made. A sender holds one credit per buffer and spends
//!   one per eager frame, so the buffers can never run out: a frame that
//!   finds none is a protocol violation, not a reason to allocate.
//! - A sender without credits for a message *announces* it instead (a
//!   header-only `Rts` frame). The announcement is kept here until its
//!   receive is posted; then the backend tells the sender (`Cts`) and the
//!   message's frames come *cleared*: they must find their receive posted.
//! - Every eager frame consumed (delivered, now or from a buffer) is owed
//!   back to the sender as a credit, returned on the next frame that goes
//!   its way or in a `Credit` frame of its own.
//! - A receiver may also keep *small* buffers (many, of a few KiB each) for
//!   messages no larger than one: such a message goes eagerly on a small
//!   credit, never on a frame-sized one, so both sides tell the class from
//!   the message's size alone. Without them a sender of back-to-back small
//!   messages (a broadcast's root) runs only as far ahead as the few
//!   frame-sized buffers allow, then waits for a credit round trip.
//!
//! So a receiver never has to stop reading a peer: every frame that arrives
//! has a destination, and head-of-line blocking, which made the old
//! unbounded buffers necessary (a stream that stalls on a frame nobody has
//! asked for yet deadlocks schedules that post their receives in another
//! order than the peer sent), cannot happen. The schedules complete even
//! when every send waits for its receive (the simulator checks them with
//! sends that complete only on delivery), which is what an announced
//! message does.

use crate::error::{Error, Result};
use crate::seam::{MemPtr, POSTED_RESERVED, Rank, Tag};
use crate::wire::{FrameHeader, FrameKind};
use std::collections::VecDeque;

/// Default number of eager frame buffers a receiver keeps per peer.
pub const DEFAULT_EAGER_FRAMES: usize = 4;

/// Default number of small buffers a receiver keeps per peer where the
/// backend has them (TCP): how many small messages a sender may run ahead.
/// At 8 ranks on 2 cores, back-to-back 8-byte broadcasts over TCP took
/// about half the time with 64 frame credits as with 4; 32 small buffers of
/// [`SMALL_FRAME_BYTES`] cost 128 KiB of address space per peer, touched
/// only as far as they are used.
pub const DEFAULT_SMALL_FRAMES: usize = 32;

/// Largest message that takes a small credit (see [`DEFAULT_SMALL_FRAMES`]).
pub const SMALL_FRAME_BYTES: usize = 4096;

/// A posted receive, with what the backend keeps beside it (`X`).
#[derive(Debug)]
pub(crate) struct Posted<X> {
    pub req: u64,
    pub tag: Tag,
    pub dst: MemPtr,
    pub len: usize,
    /// Bytes delivered so far.
    pub got: usize,
    /// The sender announced this message and was told to send it: its
    /// frames come cleared.
    pub cleared: bool,
    pub extra: X,
}

impl<X> Posted<X> {
    /// A receive of `len` bytes into `dst` that nothing has reached yet.
    pub fn new(req: u64, tag: Tag, dst: MemPtr, len: usize, extra: X) -> Self {
        Posted {
            req,
            tag,
            dst,
            len,
            got: 0,
            cleared: false,
            extra,
        }
    }
}

/// What posting a receive led to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Posting<A> {
    /// The whole message had arrived already (copied from the buffers).
    Done,
    /// Waiting for (the rest of) the message.
    Pending,
    /// The message was announced as `id` (with what the backend kept of
    /// the announcement, `a`): have the sender send it now.
    Clear { id: u64, a: A },
}

/// An announced message waiting for its receive, with what the backend
/// keeps of the announcement (`A`: nothing over TCP; over shared memory,
/// where to pull the message from).
#[derive(Clone, Copy, Debug)]
struct Announced<A> {
    hdr: FrameHeader,
    a: A,
}

/// Marks a buffer index as one of the small buffers (see [`EarlyPool`]).
const SMALL_BUF: usize = 1 << (usize::BITS - 1);

/// The fixed early-frame buffers. A buffer index is that of a frame-sized
/// buffer in `bufs`, or `SMALL_BUF | i` for the `i`th slot of `small`.
#[derive(Debug)]
struct EarlyPool {
    bufs: Vec<Box<[u8]>>,
    /// Indices of unused buffers.
    free: Vec<usize>,
    /// The small buffers, `small_cap` bytes each, in one allocation.
    small: Box<[u8]>,
    small_cap: usize,
    /// Indices (without `SMALL_BUF`) of unused small buffers.
    small_free: Vec<usize>,
    /// Filed frames, oldest first: header, buffer, payload length.
    filed: VecDeque<(FrameHeader, usize)>,
}

impl EarlyPool {
    fn small_count(&self) -> usize {
        self.small.len().checked_div(self.small_cap).unwrap_or(0)
    }

    /// Where small buffer `b` lies in `small`; `None` for a frame-sized one.
    fn small_range(&self, b: usize) -> Option<std::ops::Range<usize>> {
        let i = (b & SMALL_BUF != 0).then_some(b & !SMALL_BUF)?;
        Some(i * self.small_cap..(i + 1) * self.small_cap)
    }

    fn bytes(&self, b: usize) -> &[u8] {
        match self.small_range(b) {
            Some(r) => &self.small[r],
            None => &self.bufs[b],
        }
    }

    fn bytes_mut(&mut self, b: usize) -> &mut [u8] {
        match self.small_range(b) {
            Some(r) => &mut self.small[r],
            None => &mut self.bufs[b],
        }
    }

    fn release(&mut self, b: usize) {
        if b & SMALL_BUF != 0 {
            self.small_free.push(b & !SMALL_BUF);
        } else {
            self.free.push(b);
        }
    }
}

/// One peer's receive side (see the module comment).
#[derive(Debug)]
pub(crate) struct RecvCore<X, A = ()> {
    me: Rank,
    peer: Rank,
    posted: Vec<Posted<X>>,
    early: EarlyPool,
    frame_cap: usize,
    announced: VecDeque<Announced<A>>,
    /// Eager frames consumed and not yet credited back: frame-sized ones,
    /// and small ones.
    owed: u32,
    owed_small: u32,
}

impl<X, A> RecvCore<X, A> {
    /// The receive side for frames from `peer`, with `eager_frames` buffers
    /// of `frame_cap` bytes: the credits the peer's sender gets.
    pub fn new(me: Rank, peer: Rank, eager_frames: usize, frame_cap: usize) -> RecvCore<X, A> {
        RecvCore::with_small(me, peer, eager_frames, frame_cap, 0, 0)
    }

    /// [`RecvCore::new`], plus `small_frames` small buffers of `small_cap`
    /// bytes (at most `frame_cap`) for messages of at most `small_cap`
    /// bytes, each sent on a small credit (see the module comment).
    pub fn with_small(
        me: Rank,
        peer: Rank,
        eager_frames: usize,
        frame_cap: usize,
        small_frames: usize,
        small_cap: usize,
    ) -> RecvCore<X, A> {
        let small_cap = if small_frames == 0 {
            0
        } else {
            small_cap.min(frame_cap)
        };
        let small_frames = if small_cap == 0 { 0 } else { small_frames };
        RecvCore {
            me,
            peer,
            posted: Vec::with_capacity(POSTED_RESERVED),
            early: EarlyPool {
                // Zeroed allocations of this size come from untouched pages:
                // the memory costs nothing until frames are buffered.
                bufs: (0..eager_frames)
                    .map(|_| vec![0u8; frame_cap].into_boxed_slice())
                    .collect(),
                free: (0..eager_frames).rev().collect(),
                small: vec![0u8; small_frames * small_cap].into_boxed_slice(),
                small_cap,
                // Taken from the end: the lowest slots are reused first, so
                // a few in use at a time touch only their pages.
                small_free: (0..small_frames).rev().collect(),
                filed: VecDeque::with_capacity(eager_frames + small_frames),
            },
            frame_cap,
            announced: VecDeque::with_capacity(POSTED_RESERVED),
            owed: 0,
            owed_small: 0,
        }
    }

    /// Whether data frame `h` belongs to the small class: a message that
    /// fits a small buffer, when there are small buffers.
    fn is_small(&self, h: &FrameHeader) -> bool {
        self.early.small_cap > 0 && h.total <= self.early.small_cap as u64
    }

    /// Counts eager frame `h` as consumed: its credit is owed back.
    fn owe(&mut self, h: &FrameHeader) {
        if h.cleared {
            return;
        }
        if self.is_small(h) {
            self.owed_small += 1;
        } else {
            self.owed += 1;
        }
    }

    /// A receive side that will buffer `eager_frames` frames once its
    /// connection is made ([`RecvCore::make_buffers`]): until then it has
    /// none, and a peer that sends it eager frames is violating its credits.
    pub fn unconnected(me: Rank, peer: Rank, frame_cap: usize) -> RecvCore<X, A> {
        RecvCore::new(me, peer, 0, frame_cap)
    }

    /// Makes the `n` early buffers (at connection), if not made yet.
    pub fn make_buffers(&mut self, n: usize) {
        // Room to file every buffered frame, so that filing never allocates.
        self.early
            .filed
            .reserve(n.saturating_sub(self.early.filed.len()));
        self.early
            .free
            .reserve(n.saturating_sub(self.early.free.len()));
        while self.early.bufs.len() < n {
            self.early.free.push(self.early.bufs.len());
            self.early
                .bufs
                .push(vec![0u8; self.frame_cap].into_boxed_slice());
        }
    }

    /// The credits a sender to this receiver starts with.
    pub fn credits(&self) -> usize {
        self.early.bufs.len()
    }

    /// The small credits a sender to this receiver starts with, and the
    /// largest message that takes one (see [`RecvCore::with_small`]).
    pub fn small_credits(&self) -> (usize, usize) {
        (self.early.small_count(), self.early.small_cap)
    }

    /// Eager frames in buffers now.
    pub fn buffered(&self) -> usize {
        self.early.filed.len()
    }

    /// The early buffers this receiver keeps, of both sizes.
    pub fn buffers(&self) -> usize {
        self.early.bufs.len() + self.early.small_count()
    }

    pub fn posted(&self) -> &[Posted<X>] {
        &self.posted
    }

    /// How many messages the peer announced that no receive has claimed.
    #[cfg(test)]
    pub fn announcements(&self) -> usize {
        self.announced.len()
    }

    /// Whether anything is posted, buffered or announced.
    pub fn is_idle(&self) -> bool {
        self.posted.is_empty() && self.early.filed.is_empty() && self.announced.is_empty()
    }

    /// Posts a receive: takes what of its message was buffered, clears an
    /// announcement of it, or waits for it.
    ///
    /// # Safety
    /// `p.dst` must be valid for writes of `p.len` bytes until the receive
    /// completes or the core is cleared.
    pub unsafe fn post(&mut self, mut p: Posted<X>) -> Result<Posting<A>> {
        let mut frames = 0usize;
        let mut i = 0;
        while i < self.early.filed.len() {
            let (h, b) = self.early.filed[i];
            if !p.tag.matches(self.me, &h, p.len as u64)? {
                i += 1;
                continue;
            }
            self.early.filed.remove(i);
            let n = h.len as usize;
            // SAFETY: matches() checked the total is p.len and decoding
            // checked offset + len <= total, so the copy stays within the
            // caller's p.len bytes; the buffer holds n <= frame_cap bytes.
            unsafe {
                crate::copy_bytes(
                    p.dst.0.add(h.offset as usize),
                    self.early.bytes(b).as_ptr(),
                    n,
                )
            };
            self.early.release(b);
            p.got += n;
            frames += 1;
            self.owe(&h);
        }
        if frames > 0 && p.got >= p.len {
            return Ok(Posting::Done);
        }
        for k in 0..self.announced.len() {
            let h = self.announced[k].hdr;
            if !p.tag.matches(self.me, &h, p.len as u64)? {
                continue;
            }
            if frames > 0 {
                return Err(self.violation(format!(
                    "announced {} after sending part of it eagerly",
                    h.tag.described_like(&p.tag)
                )));
            }
            let Some(a) = self.announced.remove(k) else {
                break;
            };
            p.cleared = true;
            self.posted.push(p);
            return Ok(Posting::Clear {
                id: h.offset,
                a: a.a,
            });
        }
        self.posted.push(p);
        Ok(Posting::Pending)
    }

    /// The posted receive a data frame belongs to, if any. A frame of the
    /// same operation that disagrees with it is a mismatch; a cleared frame
    /// without a cleared receive is a protocol violation.
    pub fn find(&self, h: &FrameHeader) -> Result<Option<usize>> {
        for (i, p) in self.posted.iter().enumerate() {
            if p.tag.matches(self.me, h, p.len as u64)? {
                if h.cleared && !p.cleared {
                    return Err(self.violation(format!(
                        "sent {} as cleared before it was told to",
                        h.tag.described_like(&p.tag)
                    )));
                }
                return Ok(Some(i));
            }
        }
        if h.cleared {
            return Err(self.violation(format!(
                "sent cleared data of {} for which no receive is posted",
                h.tag
            )));
        }
        Ok(None)
    }

    /// Records that `bytes` of frame `h` reached posted receive `i`;
    /// returns the receive when that completed it.
    pub fn delivered(&mut self, i: usize, h: &FrameHeader, bytes: usize) -> Option<Posted<X>> {
        self.owe(h);
        let p = &mut self.posted[i];
        p.got += bytes;
        (p.got >= p.len).then(|| self.posted.swap_remove(i))
    }

    /// Where the posted receive of request `req` is.
    pub fn index_of(&self, req: u64) -> Option<usize> {
        self.posted.iter().position(|p| p.req == req)
    }

    /// The first `n` bytes of early buffer `b` (see [`RecvCore::early_buffer`]),
    /// for a frame read into it over several calls.
    pub fn early_bytes(&mut self, b: usize, n: usize) -> &mut [u8] {
        &mut self.early.bytes_mut(b)[..n]
    }

    /// Records that eager frame `h` was consumed without being posted
    /// here (a backend's fast path for a message taken at once).
    pub fn consumed(&mut self, h: &FrameHeader) {
        self.owe(h);
    }

    /// Removes posted receive `i` (completed some other way).
    pub fn take(&mut self, i: usize) -> Posted<X> {
        self.posted.swap_remove(i)
    }

    /// A buffer for eager frame `h`, whose receive is not posted: its index
    /// and the bytes to fill. Running out is the sender's violation.
    pub fn early_buffer(&mut self, h: &FrameHeader) -> Result<(usize, &mut [u8])> {
        if h.cleared {
            return Err(self.violation(format!(
                "sent cleared data of {} for which no receive is posted",
                h.tag
            )));
        }
        let n = h.len as usize;
        if n > self.frame_cap {
            return Err(self.violation(format!(
                "sent an eager frame of {n} bytes; its eager frames hold at most {}",
                self.frame_cap
            )));
        }
        if self.is_small(h) {
            let Some(i) = self.early.small_free.pop() else {
                return Err(self.violation(format!(
                    "sent more small eager messages ahead of their receives than the {} small credits it was given",
                    self.early.small_count()
                )));
            };
            let b = SMALL_BUF | i;
            return Ok((b, &mut self.early.bytes_mut(b)[..n]));
        }
        let Some(b) = self.early.free.pop() else {
            return Err(self.violation(format!(
                "sent more eager frames ahead of their receives than the {} credits it was given",
                self.early.bufs.len()
            )));
        };
        Ok((b, &mut self.early.bufs[b][..n]))
    }

    /// Files eager frame `h`, whose payload is in buffer `b`. If its receive
    /// was posted meanwhile, it is delivered at once; returns the receive
    /// when that completed it.
    pub fn file(&mut self, h: FrameHeader, b: usize) -> Result<Option<Posted<X>>> {
        match self.find(&h)? {
            None => {
                self.early.filed.push_back((h, b));
                Ok(None)
            }
            Some(i) => {
                let n = h.len as usize;
                let p = &self.posted[i];
                // SAFETY: find() matched h against p (total == p.len, and
                // decoding checked offset + len <= total); p.dst is valid
                // for p.len bytes (post's contract).
                unsafe {
                    crate::copy_bytes(
                        p.dst.0.add(h.offset as usize),
                        self.early.bytes(b).as_ptr(),
                        n,
                    )
                };
                self.early.release(b);
                Ok(self.delivered(i, &h, n))
            }
        }
    }

    /// An announcement (an `Rts` frame, or the backend's own kind `h` of
    /// it, with `a`): if its receive is posted, that receive (cleared) and
    /// the announcement's id and `a` are handed back to act on now; else it
    /// waits for that receive.
    pub fn announce(&mut self, h: FrameHeader, a: A) -> Result<Option<(usize, u64, A)>> {
        debug_assert!(matches!(h.kind, FrameKind::Rts | FrameKind::Rendezvous));
        for (i, p) in self.posted.iter_mut().enumerate() {
            if p.tag.matches(self.me, &h, p.len as u64)? {
                if p.got > 0 || p.cleared {
                    return Err(Error::Protocol(format!(
                        "rank {} announced {} twice or after sending part of it",
                        self.peer, h.tag
                    )));
                }
                p.cleared = true;
                return Ok(Some((i, h.offset, a)));
            }
        }
        self.announced.push_back(Announced { hdr: h, a });
        Ok(None)
    }

    /// Credits owed to the sender, if at least `at_least`; they count as
    /// returned from here on.
    pub fn take_owed(&mut self, at_least: u32) -> u16 {
        take_at_least(&mut self.owed, at_least)
    }

    /// Credits taken with [`RecvCore::take_owed`] that did not go out
    /// after all (the frame that was to carry them was not sent).
    pub fn give_owed(&mut self, n: u16) {
        self.owed += u32::from(n);
    }

    /// Credits owed now, not taken.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// [`RecvCore::take_owed`] for the small credits.
    pub fn take_owed_small(&mut self, at_least: u32) -> u16 {
        take_at_least(&mut self.owed_small, at_least)
    }

    /// Small credits owed now, not taken.
    pub fn owed_small(&self) -> u32 {
        self.owed_small
    }

    /// Forgets everything (after an abort): posted receives are dropped.
    pub fn clear(&mut self) {
        self.posted.clear();
        while let Some((_, b)) = self.early.filed.pop_front() {
            self.early.release(b);
        }
        self.announced.clear();
        self.owed = 0;
        self.owed_small = 0;
    }

    fn violation(&self, what: String) -> Error {
        Error::Protocol(format!("rank {} {what}", self.peer))
    }
}

/// Takes what `owed` counts (as much as one frame's field holds) if that
/// is at least `at_least` (and not 0).
fn take_at_least(owed: &mut u32, at_least: u32) -> u16 {
    if *owed == 0 || *owed < at_least {
        return 0;
    }
    let n = (*owed).min(u32::from(u16::MAX));
    *owed -= n;
    n as u16
}

/// A sender's credits toward one receiver: eager frames it may still send
/// ahead of their receives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Credits {
    avail: usize,
    cap: usize,
}

impl Credits {
    pub fn new(cap: usize) -> Credits {
        Credits { avail: cap, cap }
    }

    /// Spends `n` credits if there are that many.
    pub fn take(&mut self, n: usize) -> bool {
        if n > self.avail {
            return false;
        }
        self.avail -= n;
        true
    }

    /// Credits handed back by the receiver; more than were spent is the
    /// receiver's violation.
    pub fn give_back(&mut self, n: u16, peer: Rank) -> Result<()> {
        let n = n as usize;
        if self.avail + n > self.cap {
            return Err(Error::Protocol(format!(
                "rank {peer} returned {n} credits with {} of {} unspent",
                self.avail, self.cap
            )));
        }
        self.avail += n;
        Ok(())
    }

    #[cfg(test)]
    pub fn available(&self) -> usize {
        self.avail
    }
}

#[cfg(test)]
#[path = "recv_core_tests.rs"]
mod tests;
