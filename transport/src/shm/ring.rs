//! A single-producer single-consumer ring of fixed-size slots over a byte region.
//!
//! The region starts with an 832-byte control block, then `slots` slots, each a
//! 64-byte [`FrameHeader`](crate::wire::FrameHeader) followed by up to
//! `slot_bytes` of payload (the stride is rounded up to a cache line):
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
//! 288  pull_cost        u32  consumer: ps per byte its pulls out of the producer cost
//! 292  out_cost         u32  consumer: ps per byte its copies out of the slots cost
//! 320  done[64]         u64  consumer: rendezvous message `k` pulled => done[k % 64] = k + 1
//! 832  slot 0: header[64] payload[stride - 64]
//!      slot 1 ...
//! ```
//!
//! `head` and `tail` are free-running message counters; slot `i` of the ring
//! holds message `i % slots`. The producer fills the slot at `tail` (the
//! header's first word, its magic, last, with a Release store: the slot's
//! stamp), then stores `tail + 1` (read only by a producer taking over the
//! ring, `Producer::new`); the consumer Acquire-loads the stamp of the slot
//! at `head`, reads the frame, and frees the slot by clearing the stamp
//! with a Release store. A slot whose stamp is cleared is free: the
//! producer, when the head it last read says the ring is full, reads the
//! consumer's head again and, if that too says full, the stamp of the slot
//! it wants. The consumer stores its head for the producer once per half
//! ring or when no frame follows (`Consumer::pop`), so that a stream of
//! small frames does not move the head's line between the cores twice a
//! frame (the transport also stores it after each pass of pops); room
//! never waits for it. The consumer reads no counter of the
//! producer's: the stamp shares a cache line with the header it reads next,
//! so a frame moves one line fewer between the cores than a published tail
//! did (the header's line and, past 16 bytes, the payload's still move, and
//! the cleared stamp sends the header's line back before the producer
//! refills the slot).
//! A whole data message of at most 16 bytes travels in its header's line
//! alone: the producer folds the payload into the header's offset and
//! total words (`wire::fold_inline`), and the consumer's copy of the header
//! is restored before anyone decodes it (`Consumer::peek`). An 8-byte
//! message so costs the consumer one line from the producer's core, not two.
//! Each side keeps its own counter privately, so a buggy peer can corrupt
//! what we read but never what we own; a head that makes no sense is
//! reported as [`Corrupt`], never trusted, and a frame a peer stamped
//! wrongly fails its header's decoding. The producer reads the consumer's
//! `head` (and `consumed`) again only when the value it read last says the
//! ring is full (out of credits): every read of a line the other side
//! writes per frame moves that line between cores, and an old value only
//! understates what may be done.
//!
//! `pull_cost` and `out_cost` (0: not measured yet) let the producer
//! choose between a pull and the slots for each large message (see
//! `costs.rs`); only a choice depends on them, never correctness.
//!
//! `credits` and `consumed` are the receive core's credits (see
//! `recv_core`) without messages: the producer may have `credits` eager
//! frames sent and not yet consumed, and learns of each consumption from the
//! counter, not from a frame that would need a slot.
//!
//! The fields from 256 on serve single-copy transfers (see `pull.rs`): a
//! large message travels as one small rendezvous frame naming its address in
//! the producer's process, the consumer copies it straight out of that
//! process, and reports completion in `done`, which needs no ring slot and so
//! can never be blocked behind frames the producer has not read.
//!
//! This module is pure logic over memory: it knows nothing of files, peers or
//! sockets, and is tested on an ordinary heap buffer.

use super::costs::{self, MEASURED_BYTES};
use crate::wire::{self, HEADER_LEN};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// Bytes of the control block in front of the slots.
pub(crate) const CONTROL_LEN: usize = 832;
const HEAD_OFF: usize = 0;
const TAIL_OFF: usize = 64;
const READER_SLEEPING_OFF: usize = 128;
const WRITER_SLEEPING_OFF: usize = 192;
const PROBE_ADDR_OFF: usize = 256;
const CAN_PULL_OFF: usize = 264;
const CREDITS_OFF: usize = 272;
const CONSUMED_OFF: usize = 280;
const PULL_COST_OFF: usize = 288;
const OUT_COST_OFF: usize = 292;
const _: () = assert!(
    PULL_COST_OFF >= CONSUMED_OFF + 8
        && OUT_COST_OFF >= PULL_COST_OFF + 4
        && OUT_COST_OFF.is_multiple_of(4)
        && OUT_COST_OFF + 4 <= DONE_OFF
);
const DONE_OFF: usize = 320;
/// Rendezvous messages a producer may have outstanding on one ring.
pub(crate) const MAX_PULLS: u64 = 64;

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

/// Distance between consecutive slots.
pub(crate) fn slot_stride(slot_bytes: usize) -> usize {
    HEADER_LEN + slot_bytes.div_ceil(64) * 64
}

/// Bytes a ring of `slots` slots of `slot_bytes` payload occupies.
pub(crate) fn ring_bytes(slots: usize, slot_bytes: usize) -> usize {
    CONTROL_LEN + slots * slot_stride(slot_bytes)
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
}

// SAFETY: a RingRef is a pointer into shared memory that is only accessed
// through atomics (control block) or by the side that currently owns a slot
// under the SPSC protocol; moving it to another thread changes nothing.
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
        self.u32_at(PULL_COST_OFF).store(0, Ordering::Relaxed);
        self.u32_at(OUT_COST_OFF).store(0, Ordering::Relaxed);
        for k in 0..MAX_PULLS as usize {
            self.u64_at(DONE_OFF + 8 * k).store(0, Ordering::Relaxed);
        }
        for n in 0..self.slots as u64 {
            self.stamp(n).store(0, Ordering::Relaxed);
        }
    }

    /// The first word of the slot holding message `n`: its header's magic
    /// once the frame is published, 0 while the slot is free (see the
    /// module comment).
    fn stamp(&self, n: u64) -> &AtomicU32 {
        // SAFETY: slots start cache-aligned inside the ring (see `slot`); the
        // word is written atomically by both sides, and read non-atomically
        // (as part of the header) only between the Acquire load that saw it
        // set and the consumer's own clearing store.
        unsafe { &*self.slot(n).cast::<AtomicU32>() }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the control-block offsets (multiples of 8 below
        // CONTROL_LEN), the base is 8-aligned and valid for the ring's size (see
        // `new`), and this memory is only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is one of the control-block offsets of a u32
        // (multiples of 4 below CONTROL_LEN, checked below); otherwise as in
        // `u64_at`.
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

    /// Pointer to the slot that holds message number `n`.
    fn slot(&self, n: u64) -> *mut u8 {
        let i = (n % self.slots as u64) as usize;
        // SAFETY: i < slots, so the slot lies inside the ring (see `new`).
        unsafe {
            self.base
                .as_ptr()
                .add(CONTROL_LEN + i * slot_stride(self.slot_bytes))
        }
    }

    /// Slots free by a head the consumer told and our `tail`. A head read
    /// now lags the consumer's own by at most half a ring (`Consumer::pop`
    /// tells it at least that often, and a pop clears its stamp just
    /// before), and the slots freed meanwhile may have been filled again
    /// (their stamps said so): `tail` runs at most a ring past it. Beyond
    /// that the head makes no sense. (A head read earlier may lag more:
    /// `Producer::free` reads afresh instead of judging it.)
    fn room(&self, head: u64, tail: u64) -> Result<usize, Corrupt> {
        let used = tail.wrapping_sub(head);
        if used > 2 * self.slots as u64 {
            return Err(Corrupt(format!(
                "ring counters head={head} tail={tail} are {used} apart but the ring has {} slots",
                self.slots
            )));
        }
        Ok(self.slots.saturating_sub(used as usize))
    }
}

/// The writing side of a ring.
#[derive(Debug)]
pub(crate) struct Producer {
    ring: RingRef,
    tail: u64,
    /// The consumer's head as last read. Reading it on every push moved
    /// that cache line between the cores each time (a sixth of an 8-byte
    /// broadcast root's time); the old value understates the free slots,
    /// never overstates them, and is read afresh only when it shows the
    /// ring full (and then the wanted slot's stamp, `Producer::free`).
    seen_head: Cell<u64>,
    /// The same for the consumer's count of consumed eager frames, which
    /// shares a line with what it writes per frame; refreshed only when
    /// the credits it leaves are too few (see `Producer::consumed`).
    seen_consumed: Cell<u64>,
    /// The consumer's credits once it has said them (0: not yet); it says
    /// them once.
    seen_credits: Cell<usize>,
    /// What our copies of large payloads into the slots cost, ps per byte
    /// (0: none yet).
    in_cost: u32,
}

impl Producer {
    /// Takes the producer role; starts from the tail currently in the ring.
    pub(crate) fn new(ring: RingRef) -> Producer {
        let tail = ring.tail().load(Ordering::Relaxed);
        let head = ring.head().load(Ordering::Acquire);
        let consumed = ring.u64_at(CONSUMED_OFF).load(Ordering::Acquire);
        Producer {
            ring,
            tail,
            seen_head: Cell::new(head),
            seen_consumed: Cell::new(consumed),
            seen_credits: Cell::new(0),
            in_cost: 0,
        }
    }

    /// Payload bytes per slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.ring.slot_bytes
    }

    /// Slots the producer may fill now: at least one whenever one is free,
    /// though fewer than are free when the head read last is stale.
    pub(crate) fn free(&self) -> Result<usize, Corrupt> {
        // The head read last may be older than `room` allows for; then it
        // says nothing, and the head is read again.
        let free = self.ring.room(self.seen_head.get(), self.tail).unwrap_or(0);
        if free > 0 {
            return Ok(free);
        }
        let head = self.ring.head().load(Ordering::Acquire);
        self.seen_head.set(head);
        let free = self.ring.room(head, self.tail)?;
        if free > 0 {
            return Ok(free);
        }
        // The consumer tells its head only now and then (`Consumer::pop`);
        // the slot says whether it was freed: its stamp is cleared.
        Ok(usize::from(
            self.ring.stamp(self.tail).load(Ordering::Acquire) == 0,
        ))
    }

    /// Writes one frame (header, then payload) into the next free slot and
    /// publishes it. Returns `false`, writing nothing, when the ring is full.
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
        if self.free()? == 0 {
            return Ok(false);
        }
        let stamp = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        if stamp == 0 {
            return Err(Corrupt("a frame header without its magic".into()));
        }
        let slot = self.ring.slot(self.tail);
        // A message of a few bytes rides in its header's line.
        let mut h = *header;
        let folded = wire::fold_inline(&mut h, payload);
        let timed = costs::timer(payload.len());
        // SAFETY: the slot at `tail` is free (head has moved past it, or its
        // stamp was cleared, observed with Acquire in `free`), so the
        // consumer does not touch it until we publish;
        // header and payload fit the slot's stride; sources are valid slices that
        // cannot overlap shared memory we own exclusively. The header's first
        // word is the stamp, stored last.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr().add(4), slot.add(4), HEADER_LEN - 4);
            if !folded {
                super::near::copy(slot.add(HEADER_LEN), payload.as_ptr(), payload.len());
            }
        }
        if let Some(t) = timed {
            let sample = costs::ps_per_byte(t.elapsed(), payload.len());
            self.in_cost = costs::mix(self.in_cost, sample);
        }
        self.ring.stamp(self.tail).store(stamp, Ordering::Release);
        self.tail = self.tail.wrapping_add(1);
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

    /// Asks the consumer to ring our doorbell when it frees a slot (or
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
        let seen = self.seen_credits.get();
        if seen > 0 {
            return seen;
        }
        match self.ring.u32_at(CREDITS_OFF).load(Ordering::Acquire) {
            0 => self.ring.slots,
            n => {
                self.seen_credits.set(n as usize - 1);
                n as usize - 1
            }
        }
    }

    /// Whether frames the consumer has not popped yet are in the ring.
    pub(crate) fn unread(&self) -> Result<bool, Corrupt> {
        let head = self.ring.head().load(Ordering::Acquire);
        Ok(self.ring.room(head, self.tail)? < self.ring.slots)
    }

    /// Eager frames the consumer has consumed so far: as last read, or
    /// (`fresh`) read now. The count only grows, so an old one understates
    /// the credits left; callers read afresh when it leaves too few.
    pub(crate) fn consumed(&self, fresh: bool) -> u64 {
        if fresh {
            let n = self.ring.u64_at(CONSUMED_OFF).load(Ordering::Acquire);
            self.seen_consumed.set(n);
        }
        self.seen_consumed.get()
    }

    /// Sets what our copies in cost (tests choose a winner).
    #[cfg(test)]
    pub(crate) fn set_in_cost(&mut self, ps: u32) {
        self.in_cost = ps;
    }

    /// What the ways a large message can take cost now (see `costs.rs`).
    pub(crate) fn costs(&self) -> costs::Costs {
        costs::Costs {
            pull: self.ring.u32_at(PULL_COST_OFF).load(Ordering::Relaxed),
            slot_in: self.in_cost,
            slot_out: self.ring.u32_at(OUT_COST_OFF).load(Ordering::Relaxed),
        }
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
    /// The head as last stored in the ring for the producer (see
    /// [`Consumer::pop`]).
    published: Cell<u64>,
}

impl Consumer {
    /// Takes the consumer role; starts from the head currently in the ring.
    pub(crate) fn new(ring: RingRef) -> Consumer {
        let head = ring.head().load(Ordering::Relaxed);
        Consumer {
            ring,
            head,
            published: Cell::new(head),
        }
    }

    /// Payload bytes per slot.
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

    /// Whether the oldest unread frame is published: its slot's stamp is
    /// set. The producer's tail is not read: the stamp shares its line with
    /// the header the consumer reads next, so a frame costs one line moved
    /// from the producer's core where the tail cost a second.
    fn ready(&self) -> bool {
        self.ring.stamp(self.head).load(Ordering::Acquire) != 0
    }

    /// A copy of the header of the oldest unread frame, if any.
    pub(crate) fn peek(&self) -> Result<Option<[u8; HEADER_LEN]>, Corrupt> {
        if !self.ready() {
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN];
        // SAFETY: the slot at `head` was published (its stamp observed set with
        // Acquire in `ready`) and the producer does not reuse it until `pop`
        // clears that stamp; it is valid for HEADER_LEN bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ring.slot(self.head), h.as_mut_ptr(), HEADER_LEN)
        };
        wire::unfold_inline(&mut h).map_err(Corrupt)?;
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
        // A streamed copy (into a receive of 16 MiB or more) costs what
        // writes past the caches cost, not what the cached copy a choice
        // weighs costs: not timed.
        let timed = if streaming {
            None
        } else {
            costs::timer(dst.len())
        };
        // SAFETY: `payload_ptr` checked that the published slot holds
        // dst.len() bytes; dst is a distinct local buffer.
        unsafe {
            if streaming {
                super::stream::copy_streaming(dst.as_mut_ptr(), src, dst.len());
            } else {
                super::near::copy(dst.as_mut_ptr(), src, dst.len());
            }
        }
        if let Some(t) = timed {
            self.record(OUT_COST_OFF, costs::ps_per_byte(t.elapsed(), dst.len()));
        }
        Ok(())
    }

    /// Where the first `len` payload bytes of the oldest unread frame are,
    /// for reading in place; valid until [`Consumer::pop`]. The caller
    /// checked that a frame is available ([`Consumer::peek`]).
    pub(crate) fn payload_ptr(&self, len: usize) -> Result<*const u8, Corrupt> {
        if len > self.ring.slot_bytes {
            return Err(Corrupt(format!(
                "segment of {len} bytes does not fit a {}-byte slot",
                self.ring.slot_bytes
            )));
        }
        if !self.ready() {
            return Err(Corrupt("payload read from an empty ring".into()));
        }
        let slot = self.ring.slot(self.head);
        // SAFETY: the slot at `head` was published (its stamp observed set
        // with Acquire in `ready`) and the producer does not reuse it until
        // `pop`; it holds a header, then slot_bytes >= len payload bytes.
        if wire::is_folded(unsafe { slot.add(wire::FLAGS_AT).read() }) {
            if len > wire::INLINE_MAX {
                return Err(Corrupt(format!(
                    "{len} payload bytes asked of a frame folded into its header"
                )));
            }
            // SAFETY: as above; a folded payload lies within the header.
            return Ok(unsafe { slot.add(wire::INLINE_AT) });
        }
        // SAFETY: as above.
        Ok(unsafe { slot.add(HEADER_LEN) })
    }

    /// Frees the oldest frame's slot for the producer: its stamp is
    /// cleared, which is what frees it (the producer takes a slot whose
    /// stamp it sees cleared, `Producer::free`). The head, which tells the
    /// producer of many freed slots in one read, is stored once half the
    /// ring is freed untold, or when no frame follows; returns whether it
    /// was. A receiver taking a stream of small frames stored the head
    /// after every frame, while the producer, out of room, was reading it:
    /// that line crossed between the cores twice a frame. (Room waited for
    /// the head in 2742f83, which hung a producer whose consumer took
    /// frames and then went idle; room now never waits for it.) The
    /// callers look for a sleeping producer after every pop or pass of
    /// pops, as before ([`Consumer::take_writer_sleeping`]).
    pub(crate) fn pop(&mut self) -> bool {
        // Release: the frame's reads come before the producer, which
        // Acquire-loads the cleared stamp, writes the slot again.
        self.ring.stamp(self.head).store(0, Ordering::Release);
        self.head = self.head.wrapping_add(1);
        let unstored = self.head.wrapping_sub(self.published.get());
        if unstored >= (self.ring.slots as u64 / 2).max(1) || !self.ready() {
            return self.publish();
        }
        false
    }

    /// Stores the head for the producer if it moved since it was last
    /// stored; returns whether it did.
    pub(crate) fn publish(&self) -> bool {
        if self.published.get() == self.head {
            return false;
        }
        self.ring.head().store(self.head, Ordering::Release);
        self.published.set(self.head);
        true
    }

    /// Whether the producer is asleep waiting for room, without taking
    /// the flag (for tests that must act only once it sleeps).
    #[cfg(test)]
    pub(crate) fn writer_asleep(&self) -> bool {
        self.ring.writer_sleeping().load(Ordering::SeqCst) != 0
    }

    /// After freeing slots: whether the producer asked to be woken (the flag is
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

    /// Mixes what a pull of a large message out of the producer cost into
    /// the figure the producer reads.
    pub(crate) fn record_pull(&self, elapsed: std::time::Duration, bytes: usize) {
        if bytes >= MEASURED_BYTES {
            self.record(PULL_COST_OFF, costs::ps_per_byte(elapsed, bytes));
        }
    }

    /// Sets both published costs as they are (tests choose a winner).
    #[cfg(test)]
    pub(crate) fn set_costs(&self, pull: u32, out: u32) {
        self.ring
            .u32_at(PULL_COST_OFF)
            .store(pull, Ordering::Relaxed);
        self.ring.u32_at(OUT_COST_OFF).store(out, Ordering::Relaxed);
    }

    /// Only this side writes the field, so a load and a store suffice.
    fn record(&self, off: usize, sample: u32) {
        let field = self.ring.u32_at(off);
        field.store(
            costs::mix(field.load(Ordering::Relaxed), sample),
            Ordering::Relaxed,
        );
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
        let (_, p, c) = pair_at(buf, slots, slot_bytes);
        (p, c)
    }

    /// [`pair`], and the region's base, for tests that look at the slots'
    /// bytes themselves (only between a push and its pop, or while free).
    fn pair_at(buf: &mut [u64], slots: usize, slot_bytes: usize) -> (*mut u8, Producer, Consumer) {
        let base = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: the buffer is 8-aligned, large enough (see `region`) and
        // outlives the producer and consumer in every test.
        let r = unsafe { RingRef::new(base, slots, slot_bytes) };
        r.init();
        (base, Producer::new(r), Consumer::new(r))
    }

    #[test]
    fn large_copies_are_timed_and_the_consumers_costs_reach_the_producer() {
        let slot = 2 * MEASURED_BYTES;
        let mut buf = region(2, slot);
        let (mut p, mut c) = pair(&mut buf, 2, slot);
        let through = |p: &mut Producer, c: &mut Consumer, len: usize| {
            let msg = vec![9u8; len];
            assert!(p.push(&header(0, len as u64, len as u64), &msg).unwrap());
            let mut out = vec![0u8; len];
            c.read_payload(&mut out).unwrap();
            c.pop();
            assert_eq!(out, msg);
            p.costs()
        };
        let none = costs::Costs {
            pull: 0,
            slot_in: 0,
            slot_out: 0,
        };
        assert_eq!(p.costs(), none);
        // Under the size that is timed, nothing is measured.
        assert_eq!(through(&mut p, &mut c, MEASURED_BYTES - 1), none);
        // A timed copy each way; the consumer's lands in the control block.
        let k = through(&mut p, &mut c, MEASURED_BYTES);
        assert!(k.slot_in > 0 && k.slot_out > 0 && k.pull == 0, "{k:?}");
        // A pull's cost, as the consumer reports it: 1 s for 1 MB is
        // 10^6 ps a byte; a small pull is not counted.
        c.record_pull(std::time::Duration::from_millis(1), 100);
        assert_eq!(p.costs().pull, 0);
        c.record_pull(std::time::Duration::from_secs(1), 1_000_000);
        assert_eq!(p.costs().pull, 1_000_000);
        // A ring made afresh over the same memory forgets them.
        let (p, _) = pair(&mut buf, 2, slot);
        assert_eq!(p.costs().pull, 0);
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

    /// Whole data messages of 1 to 16 bytes ride in the header's line and
    /// leave the slot's payload area alone; the consumer sees the header
    /// as encoded and the payload as sent. 17 bytes, a segment of a larger
    /// message, and an empty message go the usual way.
    #[test]
    fn small_messages_ride_in_the_header_line() {
        let (slots, sb) = (2, 64);
        let mut buf = region(slots, sb);
        let (base, mut p, mut c) = pair_at(&mut buf, slots, sb);
        let cases = (0..=17u64).map(|n| (n, n)).chain([(8, 16), (16, 17)]);
        for (k, (len, total)) in cases.enumerate() {
            let slot = CONTROL_LEN + (k % slots) * slot_stride(sb);
            // SAFETY: the slot is free (popped below) and inside `buf`.
            unsafe { std::ptr::write_bytes(base.add(slot + HEADER_LEN), 0xAB, sb) };
            let payload: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37) + 1).collect();
            let h = header(0, len, total);
            assert!(p.push(&h, &payload).unwrap());
            let folded = (1..=16).contains(&len) && len == total;
            // SAFETY: as above; the frame is published and not popped.
            let area = unsafe { std::slice::from_raw_parts(base.add(slot + HEADER_LEN), sb) };
            assert_eq!(
                area.iter().all(|&b| b == 0xAB),
                folded || len == 0,
                "{len} of {total} bytes: folded {folded}"
            );
            assert_eq!(c.peek().unwrap(), Some(h), "{len} of {total} bytes");
            let mut out = vec![0u8; len as usize];
            c.read_payload(&mut out).unwrap();
            assert_eq!(out, payload, "{len} of {total} bytes");
            if folded {
                let e = c.payload_ptr(17).unwrap_err();
                assert!(e.0.contains("folded into its header"), "{}", e.0);
            }
            c.pop();
        }
    }

    /// A peer's mark of folding on a frame that cannot be folded is
    /// reported as corruption, not read.
    #[test]
    fn a_false_fold_mark_is_corruption() {
        let mut buf = region(2, 64);
        let (base, mut p, c) = pair_at(&mut buf, 2, 64);
        assert!(p.push(&header(0, 32, 32), &[5; 32]).unwrap());
        // SAFETY: the published slot 0 is inside `buf`, its flags byte at
        // FLAGS_AT; 0x80 is the fold's mark.
        unsafe { *base.add(CONTROL_LEN + wire::FLAGS_AT) |= 0x80 };
        let e = c.peek().unwrap_err();
        assert!(e.0.contains("32-byte payload marked as folded"), "{}", e.0);
    }

    /// While frames follow, the head reaches the producer once per half
    /// ring, at once when the ring is left empty, and whenever asked
    /// (`publish`); meanwhile the producer finds each freed slot by its
    /// cleared stamp, so room never waits for the head.
    #[test]
    fn freed_slots_are_found_by_their_stamps_and_the_head_told_per_half_ring() {
        let (slots, sb) = (8, 8);
        let mut buf = region(slots, sb);
        let (mut p, mut c) = pair(&mut buf, slots, sb);
        for i in 0..8 {
            assert!(p.push(&header(0, 1, 1), &[i]).unwrap());
        }
        assert_eq!(p.free().unwrap(), 0);
        let told = |c: &Consumer| c.ring.head().load(Ordering::Acquire);
        let take = |c: &mut Consumer, want: u8| {
            assert!(c.peek().unwrap().is_some());
            let mut b = [0u8];
            c.read_payload(&mut b).unwrap();
            assert_eq!(b[0], want);
            c.pop()
        };
        for i in 0..3 {
            assert!(!take(&mut c, i));
        }
        assert_eq!(told(&c), 0);
        // Three slots freed, none told: each is found by its stamp.
        for i in 8..11 {
            assert_eq!(p.free().unwrap(), 1, "{i}");
            assert!(p.push(&header(0, 1, 1), &[i]).unwrap());
        }
        assert_eq!(p.free().unwrap(), 0);
        assert!(!p.push(&header(0, 1, 1), &[99]).unwrap());
        assert!(take(&mut c, 3), "half the ring");
        assert_eq!((told(&c), p.free().unwrap()), (4, 1));
        assert!(!take(&mut c, 4));
        assert_eq!(told(&c), 4);
        assert!(c.publish());
        assert!(!c.publish(), "nothing new to tell");
        assert_eq!(told(&c), 5);
        for i in 5..8 {
            assert!(!take(&mut c, i));
        }
        assert!(take(&mut c, 8), "half the ring again");
        assert_eq!(told(&c), 9);
        assert!(!take(&mut c, 9));
        assert!(take(&mut c, 10), "the ring is left empty");
        assert_eq!(told(&c), 11);
        assert!(c.peek().unwrap().is_none());
        // Drained and told: the whole ring takes frames again.
        for i in 0..8 {
            assert!(p.push(&header(0, 1, 1), &[i]).unwrap(), "{i}");
        }
        assert!(!p.push(&header(0, 1, 1), &[8]).unwrap());
    }

    /// A pop clears its slot's stamp before it stores the head, and the
    /// producer may see the one without the other, and fill the slot: the
    /// head it then holds is more than a ring behind its tail. That is no
    /// corruption, on a ring of one slot or of eight.
    #[test]
    fn a_slot_refilled_before_the_head_was_told_is_no_corruption() {
        for slots in [1usize, 8] {
            let mut buf = region(slots, 8);
            let (mut p, c) = pair(&mut buf, slots, 8);
            for i in 0..slots {
                assert!(p.push(&header(0, 1, 1), &[i as u8]).unwrap());
            }
            // Halfway through the consumer's pop of message 0: cleared,
            // the head not stored.
            c.ring.stamp(0).store(0, Ordering::Release);
            assert_eq!(p.free().unwrap(), 1, "{slots} slots");
            assert!(p.push(&header(0, 1, 1), &[99]).unwrap());
            assert_eq!(p.free().unwrap(), 0, "{slots} slots");
            assert!(!p.push(&header(0, 1, 1), &[100]).unwrap());
        }
    }

    #[test]
    fn stride_is_cache_aligned() {
        assert_eq!(slot_stride(1), 128);
        assert_eq!(slot_stride(64), 128);
        assert_eq!(slot_stride(65), 192);
        assert_eq!(ring_bytes(2, 64), CONTROL_LEN + 256);
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
                let payload = [next_in; 16];
                if p.push(&header(0, 16, 16), &payload).unwrap() {
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
                assert_eq!(out, vec![next_out; 16]);
                next_out = next_out.wrapping_add(1);
                c.pop();
            }
        }
        while c.peek().unwrap().is_some() {
            c.pop();
            next_out = next_out.wrapping_add(1);
        }
        assert_eq!(next_in, next_out);
        // Drained, the ring takes exactly `slots` frames again, whatever
        // head the producer saw last.
        let mut taken = 0;
        while p.push(&header(0, 1, 1), &[0]).unwrap() {
            taken += 1;
        }
        assert_eq!(taken, slots);
    }

    #[test]
    fn full_ring_refuses_and_recovers() {
        let mut buf = region(2, 8);
        let (mut p, mut c) = pair(&mut buf, 2, 8);
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
        // The "peer" scribbles over the tail, which the consumer does not
        // read (the slots' stamps say what is published), then over the head.
        p.ring.tail().store(1000, Ordering::Relaxed);
        assert!(c.peek().unwrap().is_none());
        p.ring.tail().store(0, Ordering::Relaxed);
        c.ring.head().store(7, Ordering::Relaxed);
        // The producer reads the head when the one it saw shows the ring
        // full: then the scribble is found.
        let mut p = p;
        assert!(p.push(&header(0, 1, 1), &[1]).unwrap());
        assert!(p.push(&header(0, 1, 1), &[2]).unwrap());
        assert!(p.free().unwrap_err().0.contains("2 slots"));
    }

    #[test]
    fn frames_are_published_by_their_stamps() {
        let mut buf = region(2, 8);
        let (mut p, mut c) = pair(&mut buf, 2, 8);
        assert!(c.peek().unwrap().is_none());
        // A slot written but not stamped is not a frame yet: everything of
        // a header but its first word, as `push` writes it before the stamp.
        let h = header(0, 1, 1);
        // SAFETY: slot 0 of the test's ring, HEADER_LEN bytes, which nothing
        // else touches meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr().add(4), p.ring.slot(0).add(4), HEADER_LEN - 4)
        };
        assert!(c.peek().unwrap().is_none());
        assert!(p.push(&header(0, 1, 1), &[1]).unwrap());
        assert_ne!(p.ring.stamp(0).load(Ordering::Relaxed), 0);
        // The tail does not matter to the consumer: set back, the frame is
        // still there.
        p.ring.tail().store(0, Ordering::Relaxed);
        let h = c.peek().unwrap().expect("the stamped frame");
        assert_eq!(FrameHeader::decode(&h).unwrap().len, 1);
        c.pop();
        // Consumed, its slot is unstamped again before the producer may
        // reuse it, and nothing else is there.
        assert_eq!(c.ring.stamp(0).load(Ordering::Relaxed), 0);
        assert!(c.peek().unwrap().is_none());
        // A header without the magic that stamps it is refused.
        let mut bad = header(0, 1, 1);
        bad[..4].fill(0);
        assert!(p.push(&bad, &[1]).unwrap_err().0.contains("magic"));
        // A ring made afresh over used memory starts with no stamps: both
        // slots stamped, then the ring made again over them.
        assert!(p.push(&header(0, 1, 1), &[2]).unwrap());
        assert!(p.push(&header(0, 1, 1), &[3]).unwrap());
        assert!((0..2).all(|n| p.ring.stamp(n).load(Ordering::Relaxed) != 0));
        let (_, c) = pair(&mut buf, 2, 8);
        assert!((0..2).all(|n| c.ring.stamp(n).load(Ordering::Relaxed) == 0));
        assert!(c.peek().unwrap().is_none());
    }

    #[test]
    fn stale_consumer_counts_understate_and_are_refreshed_when_short() {
        let mut buf = region(4, 8);
        let (p, c) = pair(&mut buf, 4, 8);
        c.publish_credits(3);
        assert_eq!(p.credits(), 3);
        // Three frames out, none consumed as far as the producer last saw.
        assert_eq!(super::super::eager_credits(&p, 3, 0), 0);
        c.set_consumed(2);
        // The count seen last still says none left; asked for one, it is
        // read afresh.
        assert_eq!(p.consumed(false), 0);
        assert_eq!(super::super::eager_credits(&p, 3, 0), 0);
        assert_eq!(super::super::eager_credits(&p, 3, 1), 2);
        assert_eq!(p.consumed(false), 2);
        // More than are left: the answer is what is left, exactly.
        c.set_consumed(3);
        assert_eq!(super::super::eager_credits(&p, 3, 5), 3);
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
