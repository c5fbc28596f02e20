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
//! Messages are matched by [`Tag`]: conversation, operation slot, message
//! within the operation, and an opaque [`Signature`] of the operation that
//! the layer above chose (the transport never knows what a collective is).
//! Between one pair of ranks, messages are delivered in the order they were
//! posted per tag stream; a receiver that sees a frame of the same operation
//! slot but a different signature reports [`Error::Mismatch`] naming both
//! calls, printed by the tag's own [`TagFmt`].
//!
//! One-sided writes (RDMA WRITE WITH IMM, or a store into a mapped shared
//! region) fit the same seam: a region registered once is published to peers
//! as a [`RemoteRegion`] during bring-up, and [`Transport::write_imm`] writes
//! into it; the immediate value arrives as a completion on the peer.
//! [`Transport::read`] (RDMA READ) fetches from such a region without the
//! peer taking part.

use crate::error::{Error, Result};
pub use crate::wire::{Scope, Signature, Tag, TagFmt};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

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
    /// Whether [`Transport::read`] is supported.
    pub one_sided_read: bool,
    /// Whether those writes are carried out by hardware (an RDMA NIC), so
    /// that no CPU copies the bytes; where they are emulated (a kernel
    /// copy, a provider over sockets) two-sided transfers may be as fast.
    pub offloaded_writes: bool,
    /// Whether registering memory pins it with a device (an RDMA NIC), so
    /// that registering per call costs real time: only such a transport
    /// lends the caller's registrations to operations (gw-collectives'
    /// registered memory). On TCP and shm a registration is a table entry.
    pub pins_memory: bool,
    /// Whether registered memory may live on a GPU.
    pub gpu_memory: bool,
    /// Largest payload moved as one segment; larger messages are cut.
    pub max_segment: usize,
}

/// A pointer into memory a caller lent gradwire: registered memory, or the
/// buffers of an operation in flight. It may move to the thread that turns
/// the engine; where it may be dereferenced is what its holder documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemPtr(pub *mut u8);

// SAFETY: the pointer is dereferenced only by the one thread driving the
// transport or engine that holds it, within memory whose owner promised it
// stays valid and unraced for as long as it is lent (`Transport::register`,
// an operation until its completion is signalled).
unsafe impl Send for MemPtr {}

/// Which transport instance issued a memory handle or a request, so that
/// one given to another transport is refused instead of naming someone
/// else's memory or transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransportId(u32);

impl TransportId {
    /// A new id, never handed out before in this process.
    pub fn next() -> TransportId {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        TransportId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A registered memory region of one transport. It may be used by any
/// number of transfers until it is deregistered, so it is `Copy`; only the
/// transport that issued it accepts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemHandle {
    owner: TransportId,
    index: u32,
}

impl MemHandle {
    /// For transport implementations: the handle of registration `index`.
    pub fn new(owner: TransportId, index: u32) -> MemHandle {
        MemHandle { owner, index }
    }

    /// For transport implementations: the registration index, if `owner`
    /// (called `name` in errors) issued this handle.
    pub fn index_for(self, owner: TransportId, name: &str) -> Result<u32> {
        if self.owner != owner {
            return Err(Error::InvalidUsage(format!(
                "memory handle {} of transport {} passed to transport {name} {owner}",
                self.index, self.owner
            )));
        }
        Ok(self.index)
    }
}

/// An outstanding transfer. It is not `Copy`: testing it consumes it and
/// hands it back only while the transfer is still pending, so a finished
/// request cannot be tested, or released, a second time.
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a request must be tested until it completes"]
pub struct Request {
    owner: TransportId,
    id: u64,
}

impl Request {
    /// For transport implementations: request number `id`.
    pub fn new(owner: TransportId, id: u64) -> Request {
        Request { owner, id }
    }

    /// For transport implementations: the request number, if `owner`
    /// (called `name` in errors) issued this request.
    pub fn id_for(&self, owner: TransportId, name: &str) -> Result<u64> {
        if self.owner != owner {
            return Err(Error::InvalidUsage(format!(
                "request {} of transport {} passed to transport {name} {owner}",
                self.id, self.owner
            )));
        }
        Ok(self.id)
    }

    /// The request's number, for messages.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// What [`Transport::test`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Tested {
    /// Not finished: the request, to test again.
    Pending(Request),
    /// Finished; the request is gone.
    Done,
}

/// A request being polled to completion: the request while it is pending,
/// nothing once it is done. For code that tests the same transfer in a loop.
#[derive(Debug, Default)]
pub struct Outstanding(Option<Request>);

impl Outstanding {
    pub fn new(req: Request) -> Outstanding {
        Outstanding(Some(req))
    }

    /// Whether the transfer has finished (testing it on `t` if not yet known).
    pub fn poll(&mut self, t: &mut (impl Transport + ?Sized)) -> Result<bool> {
        let Some(req) = self.0.take() else {
            return Ok(true);
        };
        match t.test(req)? {
            Tested::Pending(r) => {
                self.0 = Some(r);
                Ok(false)
            }
            Tested::Done => Ok(true),
        }
    }

    /// Whether it has finished, without testing.
    pub fn is_done(&self) -> bool {
        self.0.is_none()
    }
}

impl From<Request> for Outstanding {
    fn from(req: Request) -> Outstanding {
        Outstanding::new(req)
    }
}

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

/// A one-sided read (RDMA READ): `len` bytes of the peer's `remote`
/// region at `remote_offset` land in local region `mem` at `offset`. The
/// peer takes no part and learns nothing of it; the request completes once
/// the bytes are here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadFrom {
    pub mem: MemHandle,
    pub offset: usize,
    pub len: usize,
    pub remote: RemoteRegion,
    pub remote_offset: u64,
}

/// An immediate taken by [`Transport::next_imm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// The writer, where the backend knows it.
    pub from: Option<Rank>,
    pub imm: u32,
}

/// Where the bytes of a completed receive are (see
/// [`Transport::irecv_in_place`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Landed {
    /// Not complete yet: the request, to test again.
    Pending(Request),
    /// Complete, and written to the receive's destination.
    Written,
    /// Complete, but left where it arrived: the `len` bytes start at `at`
    /// and stay valid, unchanged, until `held` is given to
    /// [`Transport::release_in_place`]; the destination was not written.
    InPlace { at: *const u8, held: Request },
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

/// Who should move a send's bytes, where a transport has the choice (see
/// [`Transport::isend_hinted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendHint {
    /// The sender pushes it: its receiver reduces it into its own data
    /// while the sender has nothing else to do, as a reduce's children do
    /// for their parent; a pull would give the busier side one more pass
    /// over the bytes.
    Pushed,
    /// Sent while the peer sends this rank one too (both halves of a
    /// `sendrecv` with one peer). Both ranks' cores are busy with the
    /// exchange, so nothing gains from the two copies a ring makes for a
    /// large region (where the copy out of the slots overlaps the copy
    /// in): the receiver may copy it straight out, once, however large
    /// the region.
    Exchanged,
    /// A point-to-point message whose receiver only stores it: no
    /// reduction or forward overlaps the copy, so one copy (a pull) beats
    /// two (into a slot and out) from smaller sizes on than for a
    /// collective's segment.
    Stored,
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

    /// [`Transport::isend`] with a hint on who should move the bytes, for
    /// a transport that can have the receiver copy them out of the sender's
    /// memory (a shared-memory pull) or the sender push them (through the
    /// ring). By default the same as `isend`.
    fn isend_hinted(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
        _hint: SendHint,
    ) -> Result<Request> {
        self.isend(peer, tag, mem, offset, len)
    }

    /// Posts a receive of exactly `len` bytes from `peer` into `mem` at `offset`.
    fn irecv(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request>;

    /// Whether `req` has completed: [`Tested::Done`] releases it,
    /// [`Tested::Pending`] hands it back.
    fn test(&mut self, req: Request) -> Result<Tested>;

    /// Sends `bytes` as the message `tag` to `peer` now, without posting a
    /// request, if the transport can do so at once (a message that fits its
    /// eager path, nothing queued before it); [`Now::Later`] otherwise, and
    /// nothing was sent. After `Done` the caller's bytes are no longer
    /// needed: a transport that could hand over only part of them keeps a
    /// copy of the rest and says so ([`Transport::unsent`]). For small
    /// operations whose own bookkeeping would cost more than the transfer.
    /// `hint` is the one the caller would post
    /// the send with ([`Transport::isend_hinted`]): a message that the
    /// transport would then have its receiver pull is `Later` too, since
    /// pushing it costs two copies where a pull costs one. By default
    /// always `Later`.
    fn send_now(
        &mut self,
        peer: Rank,
        tag: Tag,
        bytes: &[u8],
        hint: Option<SendHint>,
    ) -> Result<Now> {
        let _ = (peer, tag, bytes, hint);
        Ok(Now::Later)
    }

    /// Makes, on the calling thread, whatever this transport keeps per
    /// thread and would otherwise make at that thread's first transfer, so
    /// that a thread that moves bytes for a long time (the engine's) does
    /// its allocating at its start. By default nothing.
    fn prepare_thread(&self) {}

    /// Whether part of a message that [`Transport::send_now`] reported
    /// sent still waits inside the transport for its connection to take
    /// it (a socket that took only part of the frame). The caller of
    /// `send_now` may be gone, so whoever owns the transport keeps calling
    /// `progress` until this is `false` (the engine counts it as work). By
    /// default `false`.
    fn unsent(&self) -> bool {
        false
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
        Ok(match self.test(req)? {
            Tested::Done => Landed::Written,
            Tested::Pending(r) => Landed::Pending(r),
        })
    }

    /// Ends the use of a receive that completed [`Landed::InPlace`].
    fn release_in_place(&mut self, held: Request) -> Result<()> {
        Err(Error::InvalidUsage(format!(
            "request {}: transport {} leaves no receive in place",
            held.id(),
            self.properties().name
        )))
    }

    /// How many requests have finished on this transport since it was made
    /// (become ready for a `test` that says done), if it counts them. While
    /// the count stays the same, testing requests again only finds them
    /// pending, so the engine skips its scan of point-to-point messages
    /// (with a window of 64 messages in flight, the scan was a sixth of a
    /// TCP sender's cycles). A transport whose `test` itself moves bytes,
    /// or that does not count, says `None` (the default): everything is
    /// tested every turn.
    fn finished(&self) -> Option<u64> {
        None
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

    /// Carries out a one-sided write (see [`WriteImm`]). The request
    /// completes once the local bytes may be reused; the peer learns of the
    /// write only through its immediate ([`Transport::next_imm`]), which
    /// reaches it after the bytes are in its memory.
    fn write_imm(&mut self, peer: Rank, w: &WriteImm) -> Result<Request> {
        let _ = (peer, w);
        Err(Error::InvalidUsage(format!(
            "transport {} has no one-sided writes",
            self.properties().name
        )))
    }

    /// Carries out a one-sided read (see [`ReadFrom`]). The peer's bytes
    /// must not change until the request completes; which bytes a read
    /// racing a change sees is undefined, as with RDMA READ.
    fn read(&mut self, peer: Rank, r: &ReadFrom) -> Result<Request> {
        let _ = (peer, r);
        Err(Error::InvalidUsage(format!(
            "transport {} has no one-sided reads",
            self.properties().name
        )))
    }

    /// The oldest immediate of a one-sided write by a peer into this rank's
    /// published regions that has not been taken yet; its bytes are in
    /// place. Immediates of different writes may arrive in another order
    /// than they were written (as on an unordered RDMA provider). Not every
    /// backend learns who wrote ([`Arrival::from`]): RDMA completions carry
    /// only the 32 bits, so protocols that need the writer say it in them.
    fn next_imm(&mut self) -> Result<Option<Arrival>> {
        Err(Error::InvalidUsage(format!(
            "transport {} has no one-sided writes",
            self.properties().name
        )))
    }
}
