//! A single-producer single-consumer ring of variable-size frames over a
//! byte region.
//!
//! The region starts with an 832-byte control block, then the frame area of
//! `max(slots, 2)` times the largest frame, where a frame is a 64-byte ring
//! word (the payload length), a 64-byte [`FrameHeader`](crate::wire::FrameHeader)
//! and up to `slot_bytes` of payload, rounded up to a cache line:
//!
//! ```text
//!   0  head             u64  written by the consumer only
//!  64  tail             u64  written by the producer only
//! 128  reader_sleeping  u32  set by the consumer, cleared by either side
//! 192  writer_sleeping  u32  set by the producer, cleared by either side
//! 256  probe_addr       u64  producer: this field's own address in its process
//! 264  can_pull         u32  consumer: 1 if it can read the producer's memory, 2 if not
//! 272  credits          u32  consumer: 1 + the eager frames it buffers (0: not yet said)
//! 280  consumed         u64  consumer: eager frames it has consumed so far
//! 296  small_consumed   u64  consumer: small eager messages it has consumed so far
//! 320  done[64]         u64  consumer: rendezvous message `k` pulled => done[k % 64] = k + 1
//! 832  frame: word[64] header[64] payload[len rounded up to 64]
//!      frame ...
//! ```
//!
//! `head` and `tail` are free-running byte counters; a frame starts at
//! `tail % area`. The producer writes a frame, then publishes it with a
//! Release store of the new tail; the consumer Acquire-loads `tail`, reads
//! the frame at `head`, then frees it with a Release store of the new head.
//! A frame never wraps: when it does not fit before the end of the area, the
//! producer writes a pad word there and the frame at the start, publishing
//! both at once. Each side keeps its own counter privately and only reads
//! the other's, so a buggy peer can corrupt what we read but never what we
//! own; counters or words that make no sense are reported as [`Corrupt`],
//! never trusted.
//!
//! Frames are as long as their payload, not a slot each: an 8-byte message
//! takes 192 bytes, so a ring sized for two 512 KiB frames holds over 5,000
//! small messages where a ring of fixed slots held one per slot, and a
//! broadcast root runs as far ahead of a child that is not scheduled as its
//! small credits allow (see `shm/mod.rs`).
//!
//! `credits` and `consumed` are the receive core's credits (see
//! `recv_core`) without messages: the producer may have `credits` eager
//! frames sent and not yet consumed, and learns of each consumption from the
//! counter, not from a frame that would need ring space. Messages of at most
//! [`SMALL_FRAME_BYTES`](crate::recv_core::SMALL_FRAME_BYTES) go on small
//! credits instead (as many as the segment header says both sides keep),
//! whose consumption `small_consumed` counts the same way.
//!
//! The fields from 256 on serve single-copy transfers (see `pull.rs`): a
//! large message travels as one small rendezvous frame naming its address in
//! the producer's process, the consumer copies it straight out of that
//! process, and reports completion in `done`, which needs no ring space and so
//! can never be blocked behind frames the producer has not read.
//!
//! This module is pure logic over memory: it knows nothing of files, peers or
//! sockets, and is tested on an ordinary heap buffer.

use crate::wire::HEADER_LEN;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// Bytes of the control block in front of the frames.
pub(crate) const CONTROL_LEN: usize = 832;
const HEAD_OFF: usize = 0;
const TAIL_OFF: usize = 64;
const READER_SLEEPING_OFF: usize = 128;
const WRITER_SLEEPING_OFF: usize = 192;
const PROBE_ADDR_OFF: usize = 256;
const CAN_PULL_OFF: usize = 264;
const CREDITS_OFF: usize = 272;
const CONSUMED_OFF: usize = 280;
const SMALL_CONSUMED_OFF: usize = 296;
const DONE_OFF: usize = 320;
/// Rendezvous messages a producer may have outstanding on one ring.
pub(crate) const MAX_PULLS: u64 = 64;
/// The ring word in front of each header: the payload length, or [`PAD`].
const WORD_LEN: usize = 64;
/// A ring word marking the rest of the area as unused (the next frame is at
/// its start).
const PAD: u64 = 1 << 63;

/// What the consumer found out about reading the producer's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CanPull {
    Unknown,
    Yes,
    No,
}

/// The ring's counters disagree with the protocol: the peer is buggy or the
/// memory was overwritten. The string says what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Corrupt(pub String);

/// Ring bytes of a frame with `len` payload bytes.
pub(crate) fn frame_bytes(len: usize) -> usize {
    WORD_LEN + HEADER_LEN + len.div_ceil(64) * 64
}

/// Bytes of the frame area: room for `slots` (at least two) of the largest
/// frames, so that an empty ring always takes one, padding included.
fn area_bytes(slots: usize, slot_bytes: usize) -> usize {
    slots.max(2) * frame_bytes(slot_bytes)
}

/// Bytes a ring of `slots` largest frames of `slot_bytes` payload occupies.
pub(crate) fn ring_bytes(slots: usize, slot_bytes: usize) -> usize {
    CONTROL_LEN + area_bytes(slots, slot_bytes)
}

/// Where the next segment of a `total`-byte message starts and how long it is,
/// given that `sent` bytes already went: `(offset, len)`. A zero-length
/// message is one header-only segment.
pub(crate) fn next_segment(sent: u64, total: u64, slot_bytes: usize) -> (u64, u64) {
    let left = total.saturating_sub(sent);
    (sent, left.min(slot_bytes as u64))
}

/// A view of one ring inside a mapped region. Copyable; it does not own the memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingRef {
    base: NonNull<u8>,
    slots: usize,
    slot_bytes: usize,
    /// Bytes of the frame area ([`area_bytes`]).
    area: u64,
}

// SAFETY: a RingRef is a pointer into shared memory that is only accessed
// through atomics (control block) or by the side that currently owns a
// frame under the SPSC protocol; moving it to another thread changes nothing.
unsafe impl Send for RingRef {}

impl RingRef {
    /// # Safety
    /// `base` must be 8-byte aligned and valid for reads and writes of
    /// [`ring_bytes`]`(slots, slot_bytes)` bytes for as long as this view (or
    /// any copy, producer or consumer made from it) is used, and only one
    /// producer and one consumer may use the ring at a time.
    pub(crate) unsafe fn new(base: *mut u8, slots: usize, slot_bytes: usize) -> RingRef {
        assert!(slots > 0, "a ring needs at least one slot");
        assert_eq!(base as usize % 8, 0, "ring memory must be 8-byte aligned");
        RingRef {
            base: NonNull::new(base).expect("ring memory must not be null"),
            slots,
            slot_bytes,
            area: area_bytes(slots, slot_bytes) as u64,
        }
    }

    /// Resets the control block (before either side uses the ring).
    pub(crate) fn init(&self) {
        self.u64_at(HEAD_OFF).store(0, Ordering::Relaxed);
        self.u64_at(TAIL_OFF).store(0, Ordering::Relaxed);
        self.u32_at(READER_SLEEPING_OFF).store(0, Ordering::Relaxed);
        self.u32_at(WRITER_SLEEPING_OFF).store(0, Ordering::Relaxed);
        self.u64_at(PROBE_ADDR_OFF).store(0, Ordering::Relaxed);
        self.u32_at(CAN_PULL_OFF).store(0, Ordering::Relaxed);
        self.u32_at(CREDITS_OFF).store(0, Ordering::Relaxed);
        self.u64_at(CONSUMED_OFF).store(0, Ordering::Relaxed);
        self.u64_at(SMALL_CONSUMED_OFF).store(0, Ordering::Relaxed);
        for k in 0..MAX_PULLS as usize {
            self.u64_at(DONE_OFF + 8 * k).store(0, Ordering::Relaxed);
        }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the control-block offsets (multiples of 8 below
        // CONTROL_LEN), the base is 8-aligned and valid for the ring's size (see
        // `new`), and this memory is only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `u64_at`.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }

    fn head(&self) -> &AtomicU64 {
        self.u64_at(HEAD_OFF)
    }

    fn tail(&self) -> &AtomicU64 {
        self.u64_at(TAIL_OFF)
    }

    fn reader_sleeping(&self) -> &AtomicU32 {
        self.u32_at(READER_SLEEPING_OFF)
    }

    fn writer_sleeping(&self) -> &AtomicU32 {
        self.u32_at(WRITER_SLEEPING_OFF)
    }

    fn can_pull(&self) -> &AtomicU32 {
        self.u32_at(CAN_PULL_OFF)
    }

    fn done(&self, k: u64) -> &AtomicU64 {
        self.u64_at(DONE_OFF + 8 * (k % MAX_PULLS) as usize)
    }

    /// Pointer to the area byte that free-running counter `at` names.
    fn at(&self, at: u64) -> *mut u8 {
        // SAFETY: at % area < area, so the byte lies inside the ring (see `new`).
        unsafe {
            self.base
                .as_ptr()
                .add(CONTROL_LEN + (at % self.area) as usize)
        }
    }

    /// Bytes from `at` to the end of the area.
    fn left_after(&self, at: u64) -> u64 {
        self.area - at % self.area
    }

    /// Bytes between `head` and `tail`, checked against the area.
    fn used(&self, head: u64, tail: u64) -> Result<u64, Corrupt> {
        let used = tail.wrapping_sub(head);
        if used > self.area {
            return Err(Corrupt(format!(
                "ring counters head={head} tail={tail} are {used} bytes apart but the ring holds {} bytes",
                self.area
            )));
        }
        Ok(used)
    }

    /// Where a frame of `need` bytes goes, with `used` bytes published
    /// ahead of `tail`: the padding written first (0: at the tail), or
    /// `None` if it does not fit now. (Going back to the start early, to
    /// keep the frames in flight within the first bytes of the area, was
    /// tried: the padding counts as used until the consumer passes it, so
    /// the ring held one frame at a time.)
    fn place(&self, tail: u64, used: u64, need: u64) -> Option<u64> {
        let end = self.area - tail % self.area;
        if need <= end {
            return (used + need <= self.area).then_some(0);
        }
        (used + end + need <= self.area).then_some(end)
    }
}

/// The writing side of a ring.
#[derive(Debug)]
pub(crate) struct Producer {
    ring: RingRef,
    tail: u64,
}

impl Producer {
    /// Takes the producer role; starts from the tail currently in the ring.
    pub(crate) fn new(ring: RingRef) -> Producer {
        let tail = ring.tail().load(Ordering::Relaxed);
        Producer { ring, tail }
    }

    /// Largest payload of one frame.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.ring.slot_bytes
    }

    /// Whether a frame of `len` payload bytes would fit now (then
    /// [`Producer::push`] of it, or of any smaller one, succeeds).
    pub(crate) fn fits(&self, len: usize) -> Result<bool, Corrupt> {
        let head = self.ring.head().load(Ordering::Acquire);
        let used = self.ring.used(head, self.tail)?;
        Ok(self
            .ring
            .place(self.tail, used, frame_bytes(len) as u64)
            .is_some())
    }

    /// Largest frames the producer could write now.
    #[cfg(test)]
    pub(crate) fn free(&self) -> Result<usize, Corrupt> {
        let head = self.ring.head().load(Ordering::Acquire);
        let used = self.ring.used(head, self.tail)?;
        let most = frame_bytes(self.ring.slot_bytes) as u64;
        Ok(match self.ring.place(self.tail, used, most) {
            Some(pad) => ((self.ring.area - used - pad) / most) as usize,
            None => 0,
        })
    }

    /// Writes one frame (ring word, header, payload) and publishes it.
    /// Returns `false`, writing nothing, when it does not fit now.
    pub(crate) fn push(
        &mut self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> Result<bool, Corrupt> {
        assert!(
            payload.len() <= self.ring.slot_bytes,
            "segment of {} bytes does not fit a {}-byte slot",
            payload.len(),
            self.ring.slot_bytes
        );
        let head = self.ring.head().load(Ordering::Acquire);
        let used = self.ring.used(head, self.tail)?;
        let need = frame_bytes(payload.len()) as u64;
        let Some(pad) = self.ring.place(self.tail, used, need) else {
            return Ok(false);
        };
        let word = |at: u64, w: u64| {
            // SAFETY: `at` is a frame start inside the area that the
            // consumer has freed (head observed with Acquire above), 64-byte
            // aligned (frames and the area are multiples of 64 and the base
            // is 8-aligned), with at least WORD_LEN bytes before the end.
            unsafe { self.ring.at(at).cast::<u64>().write(w.to_le()) }
        };
        if pad > 0 {
            word(self.tail, PAD);
        }
        let at = self.tail + pad;
        word(at, payload.len() as u64);
        let frame = self.ring.at(at);
        // SAFETY: the frame's `need` bytes from `at` are free (as above) and
        // lie before the end of the area (`place` moved `at` to its start
        // otherwise); sources are valid slices that cannot overlap shared
        // memory we own exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), frame.add(WORD_LEN), HEADER_LEN);
            std::ptr::copy_nonoverlapping(
                payload.as_ptr(),
                frame.add(WORD_LEN + HEADER_LEN),
                payload.len(),
            );
        }
        self.tail = at.wrapping_add(need);
        self.ring.tail().store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// After publishing: whether the consumer asked to be woken (the flag is
    /// cleared so that one doorbell is rung per sleep).
    pub(crate) fn take_reader_sleeping(&self) -> bool {
        fence(Ordering::SeqCst);
        self.ring.reader_sleeping().load(Ordering::SeqCst) != 0
            && self.ring.reader_sleeping().swap(0, Ordering::SeqCst) != 0
    }

    /// Asks the consumer to ring our doorbell when it frees a frame (or
    /// reports a pulled message).
    pub(crate) fn set_writer_sleeping(&self, on: bool) {
        self.ring
            .writer_sleeping()
            .store(on as u32, Ordering::SeqCst);
    }

    /// Publishes where the probe word lives in this process: the field
    /// itself, so the consumer can check that what it reads is what we wrote.
    pub(crate) fn publish_probe(&self) {
        let field = self.ring.u64_at(PROBE_ADDR_OFF);
        field.store(field as *const AtomicU64 as u64, Ordering::Release);
    }

    /// Whether the consumer can copy straight out of this process.
    pub(crate) fn can_pull(&self) -> CanPull {
        match self.ring.can_pull().load(Ordering::Acquire) {
            1 => CanPull::Yes,
            2 => CanPull::No,
            _ => CanPull::Unknown,
        }
    }

    /// The eager frames the consumer buffers: what it said, or before it
    /// has, a ring's worth, which it always keeps at least (see
    /// `ShmConfig::credits`).
    pub(crate) fn credits(&self) -> usize {
        match self.ring.u32_at(CREDITS_OFF).load(Ordering::Acquire) {
            0 => self.ring.slots,
            n => n as usize - 1,
        }
    }

    /// Eager frames the consumer has consumed so far.
    pub(crate) fn consumed(&self) -> u64 {
        self.ring.u64_at(CONSUMED_OFF).load(Ordering::Acquire)
    }

    /// Small eager messages the consumer has consumed so far.
    pub(crate) fn small_consumed(&self) -> u64 {
        self.ring.u64_at(SMALL_CONSUMED_OFF).load(Ordering::Acquire)
    }

    /// Whether rendezvous message `k` has been pulled by the consumer.
    pub(crate) fn pulled(&self, k: u64) -> bool {
        self.ring.done(k).load(Ordering::Acquire) == k.wrapping_add(1)
    }
}

/// The reading side of a ring.
#[derive(Debug)]
pub(crate) struct Consumer {
    ring: RingRef,
    head: u64,
}

/// The oldest unread frame: where it starts and its payload length.
#[derive(Clone, Copy)]
struct Front {
    at: u64,
    len: usize,
}

impl Consumer {
    /// Takes the consumer role; starts from the head currently in the ring.
    pub(crate) fn new(ring: RingRef) -> Consumer {
        let head = ring.head().load(Ordering::Relaxed);
        Consumer { ring, head }
    }

    /// Largest payload of one frame.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.ring.slot_bytes
    }

    /// Tells the producer how many eager frames we buffer.
    pub(crate) fn publish_credits(&self, n: usize) {
        let n = u32::try_from(n).unwrap_or(u32::MAX - 1);
        self.ring
            .u32_at(CREDITS_OFF)
            .store(n + 1, Ordering::Release);
    }

    /// Tells the producer how many of its eager frames we have consumed.
    pub(crate) fn set_consumed(&self, total: u64) {
        self.ring
            .u64_at(CONSUMED_OFF)
            .store(total, Ordering::Release);
    }

    /// Tells the producer how many of its small messages we have consumed.
    pub(crate) fn set_small_consumed(&self, total: u64) {
        self.ring
            .u64_at(SMALL_CONSUMED_OFF)
            .store(total, Ordering::Release);
    }

    /// The oldest published frame, past any pad word, with its ring word
    /// checked against what was published.
    fn front(&self) -> Result<Option<Front>, Corrupt> {
        let tail = self.ring.tail().load(Ordering::Acquire);
        let used = self.ring.used(self.head, tail)?;
        if used == 0 {
            return Ok(None);
        }
        let word = |at: u64| {
            // SAFETY: `at` is a published frame start (tail observed past it
            // with Acquire above), 8-aligned, inside the area with at least
            // WORD_LEN bytes before its end (frames never wrap).
            u64::from_le(unsafe { self.ring.at(at).cast::<u64>().read() })
        };
        let mut at = self.head;
        let mut w = word(at);
        if w == PAD {
            let pad = self.ring.left_after(at);
            if pad >= used {
                return Err(Corrupt(format!(
                    "a pad word at ring byte {at} with only {used} bytes published"
                )));
            }
            at += pad;
            w = word(at);
        }
        let frame = frame_bytes(w.min(u64::from(u32::MAX)) as usize) as u64;
        if w > self.ring.slot_bytes as u64 || frame > tail.wrapping_sub(at) {
            return Err(Corrupt(format!(
                "ring word {w:#x} at ring byte {at}: not a payload length up to {} within the {} bytes published",
                self.ring.slot_bytes,
                tail.wrapping_sub(at)
            )));
        }
        Ok(Some(Front {
            at,
            len: w as usize,
        }))
    }

    /// A copy of the header of the oldest unread frame, if any.
    pub(crate) fn peek(&self) -> Result<Option<[u8; HEADER_LEN]>, Corrupt> {
        let Some(f) = self.front()? else {
            return Ok(None);
        };
        let mut h = [0u8; HEADER_LEN];
        // SAFETY: the frame was published (`front`) and the producer does
        // not reuse it until we advance head; its header follows the word.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ring.at(f.at).add(WORD_LEN),
                h.as_mut_ptr(),
                HEADER_LEN,
            )
        };
        Ok(Some(h))
    }

    /// Copies the first `dst.len()` payload bytes of the oldest unread frame.
    /// The caller checked that a frame is available ([`Consumer::peek`]).
    pub(crate) fn read_payload(&self, dst: &mut [u8]) -> Result<(), Corrupt> {
        self.read_payload_with(dst, false)
    }

    /// [`Consumer::read_payload`], with streaming stores if `streaming`
    /// (see `stream.rs`).
    pub(crate) fn read_payload_with(&self, dst: &mut [u8], streaming: bool) -> Result<(), Corrupt> {
        let src = self.payload_ptr(dst.len())?;
        // SAFETY: `payload_ptr` checked that the published frame holds
        // dst.len() bytes; dst is a distinct local buffer.
        unsafe {
            if streaming {
                super::stream::copy_streaming(dst.as_mut_ptr(), src, dst.len());
            } else {
                std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len());
            }
        }
        Ok(())
    }

    /// Where the first `len` payload bytes of the oldest unread frame are,
    /// for reading in place; valid until [`Consumer::pop`]. The caller
    /// checked that a frame is available ([`Consumer::peek`]).
    pub(crate) fn payload_ptr(&self, len: usize) -> Result<*const u8, Corrupt> {
        let Some(f) = self.front()? else {
            return Err(Corrupt("payload read from an empty ring".into()));
        };
        if len > f.len {
            return Err(Corrupt(format!(
                "a read of {len} payload bytes from a frame that holds {}",
                f.len
            )));
        }
        // SAFETY: the frame was published (`front`) and the producer does
        // not reuse it until `pop`; its payload of f.len >= len bytes lies
        // inside the area.
        Ok(unsafe { self.ring.at(f.at).add(WORD_LEN + HEADER_LEN) })
    }

    /// Frees the oldest frame for the producer (nothing if there is none
    /// or it is corrupt, which `peek` reported).
    pub(crate) fn pop(&mut self) {
        if let Ok(Some(f)) = self.front() {
            self.head = f.at.wrapping_add(frame_bytes(f.len) as u64);
            self.ring.head().store(self.head, Ordering::Release);
        }
    }

    /// After freeing frames: whether the producer asked to be woken (the flag is
    /// cleared so that one doorbell is rung per sleep).
    pub(crate) fn take_writer_sleeping(&self) -> bool {
        fence(Ordering::SeqCst);
        self.ring.writer_sleeping().load(Ordering::SeqCst) != 0
            && self.ring.writer_sleeping().swap(0, Ordering::SeqCst) != 0
    }

    /// Asks the producer to ring our doorbell when it publishes a frame.
    pub(crate) fn set_reader_sleeping(&self, on: bool) {
        self.ring
            .reader_sleeping()
            .store(on as u32, Ordering::SeqCst);
    }

    /// The producer's published probe address (0 until it is published).
    pub(crate) fn probe_addr(&self) -> u64 {
        self.ring.u64_at(PROBE_ADDR_OFF).load(Ordering::Acquire)
    }

    /// Records whether this side can copy out of the producer's process.
    pub(crate) fn set_can_pull(&self, yes: bool) {
        self.ring
            .can_pull()
            .store(if yes { 1 } else { 2 }, Ordering::Release);
    }

    /// Reports rendezvous message `k` as pulled: the producer may reuse its memory.
    pub(crate) fn mark_pulled(&self, k: u64) {
        self.ring
            .done(k)
            .store(k.wrapping_add(1), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameHeader, FrameKind};

    /// An 8-aligned heap region for a ring.
    fn region(slots: usize, slot_bytes: usize) -> Vec<u64> {
        vec![0u64; ring_bytes(slots, slot_bytes).div_ceil(8)]
    }

    fn pair(buf: &mut [u64], slots: usize, slot_bytes: usize) -> (Producer, Consumer) {
        // SAFETY: the buffer is 8-aligned, large enough (see `region`) and outlives
        // the producer and consumer in every test.
        let r = unsafe { RingRef::new(buf.as_mut_ptr().cast(), slots, slot_bytes) };
        r.init();
        (Producer::new(r), Consumer::new(r))
    }

    fn header(offset: u64, len: u64, total: u64) -> [u8; HEADER_LEN] {
        FrameHeader {
            kind: FrameKind::Data,
            cleared: false,
            credits: 0,
            src_rank: 0,
            tag: crate::test_tags::tag(1, 2, total, 0, 0),
            offset,
            len,
            total,
        }
        .encode()
    }

    #[test]
    fn frames_are_as_long_as_their_payload_in_cache_lines() {
        assert_eq!(frame_bytes(0), 128);
        assert_eq!(frame_bytes(1), 192);
        assert_eq!(frame_bytes(64), 192);
        assert_eq!(frame_bytes(65), 256);
        // Room for two of the largest frames even where one slot is asked.
        assert_eq!(ring_bytes(1, 64), CONTROL_LEN + 2 * 192);
        assert_eq!(ring_bytes(3, 64), CONTROL_LEN + 3 * 192);
    }

    #[test]
    fn a_ring_of_two_4k_slots_holds_44_eight_byte_frames() {
        let (slots, sb) = (2, 4096);
        let mut buf = region(slots, sb);
        let (mut p, mut c) = pair(&mut buf, slots, sb);
        let mut n = 0u8;
        while p.push(&header(0, 8, 8), &[n; 8]).unwrap() {
            n += 1;
        }
        // (2 × (128 + 4096)) / 192 = 44 exactly: no byte is lost.
        assert_eq!(n, 44);
        assert_eq!(p.free().unwrap(), 0);
        for k in 0..n {
            let mut b = [0u8; 8];
            c.read_payload(&mut b).unwrap();
            assert_eq!(b, [k; 8]);
            c.pop();
        }
        assert!(c.peek().unwrap().is_none());
        assert_eq!(p.free().unwrap(), 2);
    }

    #[test]
    fn an_empty_ring_always_takes_the_largest_frame() {
        // Whatever the tail's position when the ring empties, padding
        // included (this is what keeps a blocked producer live).
        for slots in [1, 2, 3] {
            let sb = 200;
            let mut buf = region(slots, sb);
            let (mut p, mut c) = pair(&mut buf, slots, sb);
            for small in 0..40 {
                assert!(
                    p.push(&header(0, small, small), &vec![7u8; small as usize])
                        .unwrap()
                );
                c.pop();
                assert!(c.peek().unwrap().is_none());
                assert!(p.free().unwrap() >= 1, "slots {slots} after {small}");
                assert!(
                    p.push(&header(0, sb as u64, sb as u64), &[9u8; 200])
                        .unwrap()
                );
                let mut b = [0u8; 200];
                c.read_payload(&mut b).unwrap();
                assert_eq!(b, [9u8; 200]);
                c.pop();
            }
        }
    }

    #[test]
    fn wraparound_many_times() {
        let (slots, sb) = (3, 16);
        let mut buf = region(slots, sb);
        let (mut p, mut c) = pair(&mut buf, slots, sb);
        let mut next_in = 0u8;
        let mut next_out = 0u8;
        for round in 0..50 {
            // Fill up to 1..=slots frames, then drain some of them.
            let n = 1 + round % slots;
            for _ in 0..n {
                // Sizes 0..=16 vary where frames end, so pads come and go.
                let len = (next_in as usize * 5) % 17;
                let payload = vec![next_in; len];
                if p.push(&header(0, len as u64, len as u64), &payload)
                    .unwrap()
                {
                    next_in = next_in.wrapping_add(1);
                }
            }
            assert!(p.free().unwrap() <= slots);
            let k = 1 + (round * 7) % slots;
            for _ in 0..k {
                let Some(h) = c.peek().unwrap() else { break };
                let d = FrameHeader::decode(&h).unwrap();
                let mut out = vec![0u8; d.len as usize];
                c.read_payload(&mut out).unwrap();
                assert_eq!(out, vec![next_out; (next_out as usize * 5) % 17]);
                next_out = next_out.wrapping_add(1);
                c.pop();
            }
        }
        while c.peek().unwrap().is_some() {
            c.pop();
            next_out = next_out.wrapping_add(1);
        }
        assert_eq!(next_in, next_out);
        assert!(p.free().unwrap() >= 1);
    }

    #[test]
    fn full_ring_refuses_and_recovers() {
        // Two slots of 64: 2 × 192 bytes, two frames of 1 to 64 bytes.
        let mut buf = region(2, 64);
        let (mut p, mut c) = pair(&mut buf, 2, 64);
        assert!(p.push(&header(0, 1, 1), &[1]).unwrap());
        assert!(p.push(&header(0, 1, 1), &[2]).unwrap());
        assert!(!p.push(&header(0, 1, 1), &[3]).unwrap());
        assert_eq!(p.free().unwrap(), 0);
        c.pop();
        assert!(p.push(&header(0, 1, 1), &[3]).unwrap());
        let mut b = [0u8; 1];
        c.read_payload(&mut b).unwrap();
        assert_eq!(b, [2]);
    }

    #[test]
    fn segments_reassemble_across_wrap() {
        let (slots, sb) = (2, 10);
        let mut buf = region(slots, sb);
        let (mut p, mut c) = pair(&mut buf, slots, sb);
        for total in [0u64, 1, 9, 10, 11, 20, 21, 57] {
            let msg: Vec<u8> = (0..total).map(|i| (i * 31 + total) as u8).collect();
            let mut out = vec![0xAAu8; total as usize];
            let (mut sent, mut frames_out, mut frames_in, mut got) = (0u64, 0, 0, 0u64);
            // Alternate producer and consumer so that the message wraps the ring.
            while frames_in == 0 || got < total {
                if frames_out == 0 || sent < total {
                    let (off, len) = next_segment(sent, total, sb);
                    let data = &msg[off as usize..(off + len) as usize];
                    if p.push(&header(off, len, total), data).unwrap() {
                        sent += len;
                        frames_out += 1;
                    }
                }
                if let Some(h) = c.peek().unwrap() {
                    let d = FrameHeader::decode(&h).unwrap();
                    assert_eq!(d.offset, got);
                    assert!(d.len as usize <= sb);
                    c.read_payload(&mut out[d.offset as usize..(d.offset + d.len) as usize])
                        .unwrap();
                    got += d.len;
                    frames_in += 1;
                    c.pop();
                }
            }
            assert_eq!(out, msg, "total {total}");
            assert_eq!(frames_in, frames_out);
            assert_eq!(frames_in as u64, total.div_ceil(sb as u64).max(1));
        }
    }

    #[test]
    fn corrupt_counters_are_reported() {
        let mut buf = region(2, 8);
        let (p, c) = pair(&mut buf, 2, 8);
        // The "peer" scribbles over the tail, then over the head.
        p.ring.tail().store(1000, Ordering::Relaxed);
        assert!(c.peek().unwrap_err().0.contains("holds 384 bytes"));
        p.ring.tail().store(0, Ordering::Relaxed);
        c.ring.head().store(7, Ordering::Relaxed);
        assert!(p.free().is_err());
    }

    #[test]
    fn corrupt_ring_words_are_reported_not_followed() {
        let mut buf = region(2, 8);
        let (mut p, c) = pair(&mut buf, 2, 8);
        assert!(p.push(&header(0, 1, 1), &[1]).unwrap());
        // SAFETY: ring byte 0 is the published frame's word, in the test's
        // own buffer, which only this thread touches.
        let word = |w: u64| unsafe { p.ring.at(0).cast::<u64>().write(w.to_le()) };
        // A length beyond the slot size, one past what was published, a
        // pad with nothing after it, a pad word with other bits.
        for (w, says) in [
            (9u64, "not a payload length"),
            (u64::MAX, "not a payload length"),
            (PAD | 1, "not a payload length"),
        ] {
            word(w);
            assert!(c.peek().unwrap_err().0.contains(says), "{w:#x}");
            assert!(c.payload_ptr(1).is_err());
        }
        word(1);
        assert!(c.payload_ptr(2).unwrap_err().0.contains("holds 1"));
        assert!(c.payload_ptr(1).is_ok());
        // The published frame claims more bytes than the tail covers.
        p.ring.tail().store(64, Ordering::Relaxed);
        assert!(
            c.peek()
                .unwrap_err()
                .0
                .contains("within the 64 bytes published")
        );
    }

    #[test]
    fn a_pad_with_nothing_published_after_it_is_corrupt() {
        let (slots, sb) = (2, 64);
        let mut buf = region(slots, sb);
        let (mut p, mut c) = pair(&mut buf, slots, sb);
        // One 1-byte frame (192 bytes), popped: the tail sits 192 bytes
        // before the end of the 384-byte area.
        assert!(p.push(&header(0, 1, 1), &[1]).unwrap());
        c.pop();
        // SAFETY: ring byte 192 is inside the 384-byte area of the test's
        // buffer, 8-aligned, and only this thread touches it.
        unsafe { p.ring.at(192).cast::<u64>().write(PAD.to_le()) };
        p.ring.tail().store(384, Ordering::Relaxed);
        assert!(c.peek().unwrap_err().0.contains("pad word"));
    }

    #[test]
    fn threads_move_random_frames_in_order() {
        // The SPSC protocol across two real threads: random sizes, the
        // producer retrying when full, every payload checked in order.
        let (slots, sb) = (3, 700);
        let mut buf = region(slots, sb);
        let (mut p, mut c) = pair(&mut buf, slots, sb);
        const N: u32 = 20_000;
        let len_of = |i: u32| (i.wrapping_mul(2_654_435_761) >> 7) as usize % (sb + 1);
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..N {
                    let len = len_of(i);
                    let payload: Vec<u8> = (0..len).map(|k| (i as usize + k) as u8).collect();
                    while !p
                        .push(&header(0, len as u64, len as u64), &payload)
                        .unwrap()
                    {
                        std::hint::spin_loop();
                    }
                }
            });
            s.spawn(move || {
                for i in 0..N {
                    let h = loop {
                        if let Some(h) = c.peek().unwrap() {
                            break h;
                        }
                        std::hint::spin_loop();
                    };
                    let d = FrameHeader::decode(&h).unwrap();
                    assert_eq!(d.len as usize, len_of(i));
                    let mut out = vec![0u8; d.len as usize];
                    c.read_payload(&mut out).unwrap();
                    assert!(
                        out.iter()
                            .enumerate()
                            .all(|(k, &b)| b == (i as usize + k) as u8)
                    );
                    c.pop();
                }
                assert!(c.peek().unwrap().is_none());
            });
        });
    }

    #[test]
    fn sleeping_flags_are_taken_once() {
        let mut buf = region(2, 8);
        let (p, c) = pair(&mut buf, 2, 8);
        assert!(!p.take_reader_sleeping());
        c.set_reader_sleeping(true);
        assert!(p.take_reader_sleeping());
        assert!(!p.take_reader_sleeping());
        p.set_writer_sleeping(true);
        assert!(c.take_writer_sleeping());
        assert!(!c.take_writer_sleeping());
    }

    #[test]
    fn next_segment_cuts() {
        assert_eq!(next_segment(0, 0, 4), (0, 0));
        assert_eq!(next_segment(0, 10, 4), (0, 4));
        assert_eq!(next_segment(8, 10, 4), (8, 2));
    }
}
