//! The one interface every transport implements, shaped like NCCL's `ncclNet`.
//!
//! A transport is driven by a single progress thread (the engine in
//! `gw-collectives`), so its methods take `&mut self` and need no locking. All
//! calls are non-blocking: `connect` reports whether the connection is up yet,
//! `isend`/`irecv` post a transfer of a registered memory range and return a
//! [`Request`], `test` says whether it finished, and `progress` moves bytes.
//! When nothing can move, the engine sleeps in one `mio::Poll` shared by all
//! transports: each transport registers its file descriptors there at
//! [`Transport::attach`] and gets the events back through
//! [`Transport::on_event`].
//!
//! Messages are matched by [`Tag`]: the fingerprint of the operation plus the
//! algorithm step. Between one pair of ranks, messages are delivered in the
//! order they were posted per tag stream; a receiver that sees a frame of the
//! same operation sequence number but a different fingerprint reports
//! [`Error::Mismatch`] naming both calls.
//!
//! One-sided writes (RDMA WRITE WITH IMM, or a store into a mapped shared
//! region) fit the same seam: a region registered once is published to peers
//! as a [`RemoteRegion`] during bring-up, and [`Transport::write_imm`] writes
//! into it; the immediate value arrives as a completion on the peer.

use crate::error::{Error, Result};
use crate::wire::{Fingerprint, FrameHeader, OpKind};

/// A rank within a communicator.
pub type Rank = u32;

/// Requests a transport has room for before its request table grows: far
/// more than schedules keep in flight (at most 16 messages per stream,
/// `gw_collectives`'s `MAX_DEPTH`, and two streams per peer).
pub(crate) const REQS_RESERVED: usize = 512;
/// Posted sends or receives per peer a transport has room for before its
/// queues grow (at most 16 messages per stream and two streams per peer in
/// flight).
pub(crate) const POSTED_RESERVED: usize = 64;

/// What a transport is, for the algorithm chooser.
#[derive(Clone, Debug, PartialEq)]
pub struct Properties {
    /// Short name used in logs and benchmark headers ("tcp", "shm", "verbs").
    pub name: &'static str,
    /// Expected point-to-point bandwidth in GB/s (1e9 bytes per second).
    pub bandwidth_gbps: f64,
    /// Expected one-way latency of a small message in microseconds.
    pub latency_us: f64,
    /// Whether [`Transport::write_imm`] is supported.
    pub one_sided_write: bool,
    /// Whether registered memory may live on a GPU.
    pub gpu_memory: bool,
    /// Largest payload moved as one segment; larger messages are cut.
    pub max_segment: usize,
}

/// Names one message: which operation, and which step of its algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub fp: Fingerprint,
    pub step: u32,
}

impl Tag {
    /// Whether a frame belongs to the message this tag names.
    ///
    /// Returns an error when the frame comes from the same operation slot
    /// (communicator and sequence number) but describes a different call:
    /// the two ranks disagree about what they are doing.
    pub fn matches(&self, me: Rank, h: &FrameHeader, expected_total: u64) -> Result<bool> {
        if h.fp.comm_id != self.fp.comm_id || h.fp.seq != self.fp.seq {
            return Ok(false);
        }
        // Point-to-point messages all share one sequence number and are told
        // apart by their per-pair step alone: a frame of a later send (on
        // another lane, say) is not a disagreement about this one.
        if h.fp.op == OpKind::SendRecv && self.fp.op == OpKind::SendRecv && h.step != self.step {
            return Ok(false);
        }
        if h.fp != self.fp {
            return Err(Error::Mismatch {
                me,
                peer: h.src_rank,
                local: self.fp.to_string(),
                remote: h.fp.to_string(),
            });
        }
        if h.step != self.step {
            return Ok(false);
        }
        if h.total != expected_total {
            return Err(Error::Mismatch {
                me,
                peer: h.src_rank,
                local: format!(
                    "{} expecting {expected_total} bytes at step {}",
                    self.fp, self.step
                ),
                remote: format!("{} sending {} bytes at step {}", h.fp, h.total, h.step),
            });
        }
        Ok(true)
    }
}

/// A registered memory region, local to one transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemHandle(pub u32);

/// An outstanding transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request(pub u64);

/// Whether a connection is usable yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Pending,
    Ready,
}

/// A region a peer registered once and published, so that this rank can write
/// into it directly (the GDRAA pattern: keys exchanged at init, then each step
/// is one-sided writes plus synchronisation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    pub rank: Rank,
    /// Backend-specific key (an RDMA rkey, a shared-segment id).
    pub key: u64,
    /// Base address in the peer's address space (or 0 for offset-addressed regions).
    pub addr: u64,
    pub len: u64,
}

/// A one-sided write: `len` bytes of local region `mem` at `offset` land in
/// the peer's `remote` region at `remote_offset`, and `imm` is delivered to
/// the peer as a completion once they are there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteImm {
    pub mem: MemHandle,
    pub offset: usize,
    pub len: usize,
    pub remote: RemoteRegion,
    pub remote_offset: u64,
    pub imm: u32,
}

/// Where the bytes of a completed receive are (see
/// [`Transport::irecv_in_place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    /// Not complete yet.
    Pending,
    /// Complete, and written to the receive's destination.
    Written,
    /// Complete, but left where it arrived: the `len` bytes start here and
    /// stay valid, unchanged, until [`Transport::release_in_place`]; the
    /// destination was not written.
    InPlace(*const u8),
}

/// What became of an attempt to move a small message at once (see
/// [`Transport::send_now`] and [`Transport::recv_now`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Now {
    /// Moved.
    Done,
    /// Nothing from that peer yet: try again.
    Empty,
    /// Not on this path: post the transfer (`isend` / `irecv`) instead.
    Later,
}

/// The transport interface (see the module comment for the contract).
pub trait Transport: Send {
    /// What this transport is and how fast it is expected to be.
    fn properties(&self) -> Properties;

    /// Registers this transport's file descriptors with the engine's poller.
    /// Tokens it uses must lie in `[token_base, token_base + (1 << 32))`.
    fn attach(&mut self, registry: &mio::Registry, token_base: usize) -> Result<()>;

    /// Starts or continues bringing up the connection to `peer`. Both sides call
    /// it when they need each other; repeated calls are cheap.
    fn connect(&mut self, peer: Rank) -> Result<Readiness>;

    /// Makes `[ptr, ptr + len)` available for transfers.
    ///
    /// # Safety
    /// The memory must stay valid, and must not be accessed in a way that races
    /// with a posted transfer, until [`Transport::deregister`] returns.
    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<MemHandle>;

    /// Forgets a registration. Transfers using it must have completed.
    fn deregister(&mut self, mem: MemHandle) -> Result<()>;

    /// Posts a send of `len` bytes at `offset` within `mem` to `peer`.
    fn isend(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request>;

    /// Posts a receive of exactly `len` bytes from `peer` into `mem` at `offset`.
    fn irecv(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request>;

    /// Whether `req` has completed; a completed request is released.
    fn test(&mut self, req: Request) -> Result<bool>;

    /// Sends `bytes` as the message `tag` to `peer` now, without posting a
    /// request, if the transport can do so at once (a message that fits its
    /// eager path, nothing queued before it); [`Now::Later`] otherwise, and
    /// nothing was sent. For small operations whose own bookkeeping would
    /// cost more than the transfer. By default always `Later`.
    fn send_now(&mut self, peer: Rank, tag: Tag, bytes: &[u8]) -> Result<Now> {
        let _ = (peer, tag, bytes);
        Ok(Now::Later)
    }

    /// Receives the message `tag` from `peer` into `dst` now if it is the
    /// next thing from that peer and nothing else is pending with it;
    /// [`Now::Empty`] if nothing has come from that peer yet; [`Now::Later`]
    /// if anything else stands in the way (other frames, posted receives),
    /// and then the caller posts an `irecv`, which handles every case.
    /// Disagreements and peer failures are errors, as from `progress`. By
    /// default always `Later`.
    fn recv_now(&mut self, peer: Rank, tag: Tag, dst: &mut [u8]) -> Result<Now> {
        let _ = (peer, tag, dst);
        Ok(Now::Later)
    }

    /// [`Transport::irecv`], except that the transport may leave the message
    /// where it arrived (a shared-memory ring slot) instead of copying it to
    /// the destination, so that its consumer reads it from there: one copy
    /// fewer. Such a request is tested with [`Transport::test_in_place`]
    /// only. By default the bytes are written, as by `irecv`.
    fn irecv_in_place(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request> {
        self.irecv(peer, tag, mem, offset, len)
    }

    /// [`Transport::test`] for any request, saying also where a completed
    /// receive's bytes are; a receive posted with
    /// [`Transport::irecv_in_place`] must be tested with this. A request
    /// that completes [`Landed::InPlace`] holds its peer's inbound stream
    /// (nothing behind it is delivered) until [`Transport::release_in_place`],
    /// so the caller consumes the bytes and releases them at once.
    fn test_in_place(&mut self, req: Request) -> Result<Landed> {
        Ok(if self.test(req)? {
            Landed::Written
        } else {
            Landed::Pending
        })
    }

    /// Ends the use of a receive that completed [`Landed::InPlace`].
    fn release_in_place(&mut self, req: Request) -> Result<()> {
        Err(Error::InvalidUsage(format!(
            "request {}: transport {} leaves no receive in place",
            req.0,
            self.properties().name
        )))
    }

    /// Moves whatever bytes can move now. Returns whether anything happened.
    fn progress(&mut self) -> Result<bool>;

    /// Delivers a poller event for one of this transport's tokens.
    fn on_event(&mut self, event: &mio::event::Event) -> Result<()>;

    /// Called before the engine blocks in the poller. Returns `false` if work is
    /// already waiting (the engine then does not sleep). A transport whose
    /// peers cannot raise a poller event by themselves (shared memory) arms its
    /// doorbell here.
    fn prepare_sleep(&mut self) -> bool {
        true
    }

    /// Called after the engine wakes from the poller.
    fn finish_sleep(&mut self) {}

    /// The next `progress` calls come from a thread that does not watch the
    /// poller (a caller driving its own operation): check every connection
    /// for work instead of only those the poller reported.
    fn poke(&mut self) {}

    /// Checks, cheaply, that connected peers are still alive. Called a few
    /// times per second while an operation waits.
    fn check_peers(&mut self) -> Result<()> {
        Ok(())
    }

    /// Tells every connected peer that this rank failed, best effort. After
    /// it returns the transport never touches registered memory again: posted
    /// transfers are dropped, and later posts fail.
    fn abort(&mut self, reason: &str);

    /// Publishes a registered region for one-sided writes, if supported.
    fn remote_region(&mut self, _mem: MemHandle) -> Result<Option<RemoteRegion>> {
        Ok(None)
    }

    /// Carries out a one-sided write (see [`WriteImm`]).
    fn write_imm(&mut self, peer: Rank, w: &WriteImm) -> Result<Request> {
        let _ = (peer, w);
        Err(Error::InvalidUsage(format!(
            "transport {} has no one-sided writes",
            self.properties().name
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{DType, FrameKind, RedOp};

    fn fp(op: OpKind, dtype: DType) -> Fingerprint {
        Fingerprint {
            comm_id: 9,
            seq: if op == OpKind::SendRecv { u64::MAX } else { 4 },
            op,
            dtype,
            redop: RedOp::None,
            count: 0,
            root: 0,
        }
    }

    fn frame(fp: Fingerprint, step: u32) -> FrameHeader {
        FrameHeader {
            kind: FrameKind::Data,
            src_rank: 1,
            fp,
            step,
            offset: 0,
            len: 8,
            total: 8,
        }
    }

    #[test]
    fn a_later_point_to_point_message_of_another_type_is_not_a_mismatch() {
        let want = Tag {
            fp: fp(OpKind::SendRecv, DType::F64),
            step: 5,
        };
        let later = frame(fp(OpKind::SendRecv, DType::U8), 6);
        assert!(!want.matches(0, &later, 8).unwrap());
        // The same step with another type is a real disagreement.
        let same = frame(fp(OpKind::SendRecv, DType::U8), 5);
        assert!(matches!(
            want.matches(0, &same, 8),
            Err(Error::Mismatch { .. })
        ));
        assert!(want.matches(0, &frame(want.fp, 5), 8).unwrap());
    }

    #[test]
    fn a_collective_of_another_kind_in_the_same_slot_is_a_mismatch_at_any_step() {
        let want = Tag {
            fp: fp(OpKind::AllReduce, DType::F32),
            step: 0,
        };
        let other = frame(fp(OpKind::Broadcast, DType::F32), 3);
        assert!(matches!(
            want.matches(0, &other, 8),
            Err(Error::Mismatch { .. })
        ));
    }
}
