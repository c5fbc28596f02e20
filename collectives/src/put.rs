//! Persistent one-sided transfers between two ranks: puts
//! (`Communicator::put_init`, what `gwbench p2p --op write` measures,
//! ib_write_bw's operation) and gets (`Communicator::get_init`, `--op
//! read`, ib_read_bw's).
//!
//! Both ranks of a two-rank communicator plan the transfer once: each
//! registers its buffers, publishes its receive and send buffers, and the
//! two exchange the descriptors (as a persistent all-reduce does,
//! `persistent.rs`). Each round of a put then writes the sender's buffer
//! `reps` times into the peer's with RDMA WRITE WITH IMM (or its
//! shared-memory form), and the peer counts the immediates; the only
//! message is the target's `Ready` as its round starts
//! (`algo::onesided::put`). Each round of a get reads the owner's buffer
//! `reps` times with RDMA READ; the owner says `Ready` as its round starts
//! and the reader `Done` when its reads completed (`algo::onesided::get`).
//! A rank may send, receive, or both at once (`--bidir`).
//!
//! Rounds draw the communicator's collective sequence numbers, like every
//! persistent operation, which is why the communicator must be the pair:
//! with more ranks the others' sequences would fall behind.

use crate::algo::{self, Schedule};
use crate::communicator::{Communicator, RawOp};
use crate::op::{DType, Fingerprint, OpKind, RedOp};
use crate::persistent::{Parts, RawPersistent, next_id};
use crate::reduce::Kernel;
use gw_transport::rma::MAX_WINDOWS;
use gw_transport::{Error, Result};
use std::marker::PhantomData;
use std::sync::atomic::Ordering;

/// Largest single write or read of a put or get (the libfabric
/// transport's segment).
const PUT_SEGMENT_BYTES: usize = 1 << 20;

/// A planned put or get on borrowed buffers (see the module comment).
/// Dropping it waits for a running round and frees the plan.
pub struct PersistentTransfer<'a> {
    comm: &'a Communicator,
    raw: RawPersistent,
    _bufs: PhantomData<&'a mut [u8]>,
}

impl Communicator {
    /// Plans a put between the two ranks of this communicator: each round
    /// writes `send` `reps` times into the peer's `recv`, and receives the
    /// peer's writes into this rank's `recv`. Either may be empty (a rank
    /// that only sends, or only receives); a non-empty `send` must be as
    /// long as the peer's `recv`. Both ranks call it, in the same order
    /// relative to their collectives. Needs one-sided writes to the peer,
    /// which every transport has (TCP's emulated over the stream); the
    /// engine refuses otherwise, naming the transport.
    pub fn put_init<'a>(
        &'a self,
        send: &'a [u8],
        recv: &'a mut [u8],
        reps: usize,
    ) -> Result<PersistentTransfer<'a>> {
        let peer = self.pair_peer("put_init")?;
        let window = (self.seq.load(Ordering::Relaxed) % MAX_WINDOWS as u64) as u8;
        let sched = algo::onesided::put(
            peer,
            send.len(),
            recv.len(),
            reps,
            PUT_SEGMENT_BYTES,
            window,
        )?;
        let recv_len = recv.len();
        let (put, its_recv, its_send) = self.plan_pair(sched, send, recv)?;
        if !send.is_empty() && its_recv != send.len() {
            return Err(Error::InvalidArgument(format!(
                "put_init: this rank writes {} bytes a round into rank {peer}'s receive buffer of {its_recv}",
                send.len()
            )));
        }
        if its_send != recv_len && (its_send > 0 || recv_len > 0) {
            return Err(Error::InvalidArgument(format!(
                "put_init: rank {peer} writes {its_send} bytes a round into this rank's receive buffer of {recv_len}"
            )));
        }
        Ok(put)
    }

    /// Plans a get between the two ranks of this communicator: each round
    /// reads the peer's `expose` `reps` times into this rank's `into`, and
    /// lends `expose` to the peer's reads (it must not change while a
    /// round runs). Either may be empty (a rank that only lends, or only
    /// reads); a non-empty `into` must be as long as the peer's `expose`.
    /// Both ranks call it, in the same order relative to their
    /// collectives. Needs one-sided reads from the peer (libfabric and
    /// shared memory have them, TCP not); the engine refuses otherwise,
    /// naming the transport.
    pub fn get_init<'a>(
        &'a self,
        expose: &'a [u8],
        into: &'a mut [u8],
        reps: usize,
    ) -> Result<PersistentTransfer<'a>> {
        let peer = self.pair_peer("get_init")?;
        // Both ranks refuse alike, before the exchange: the reader's engine
        // would, but the lender would wait for a peer that has given up.
        if !self.reads.get(peer as usize).copied().unwrap_or(false) {
            let name = self.routes().get(peer as usize).copied().unwrap_or("?");
            return Err(Error::InvalidUsage(format!(
                "get_init needs one-sided reads, and the transport to rank {peer} ({name}) has none"
            )));
        }
        let sched = algo::onesided::get(peer, expose.len(), into.len(), reps, PUT_SEGMENT_BYTES)?;
        let into_len = into.len();
        let (get, its_into, its_expose) = self.plan_pair(sched, expose, into)?;
        if !expose.is_empty() && its_into != expose.len() {
            return Err(Error::InvalidArgument(format!(
                "get_init: rank {peer} reads this rank's {} bytes a round into its receive buffer of {its_into}",
                expose.len()
            )));
        }
        if its_expose != into_len && (its_expose > 0 || into_len > 0) {
            return Err(Error::InvalidArgument(format!(
                "get_init: rank {peer} lends {its_expose} bytes a round, read into this rank's receive buffer of {into_len}"
            )));
        }
        Ok(get)
    }

    /// The other rank of a two-rank communicator; `what` names the call
    /// in the error for any other size.
    fn pair_peer(&self, what: &str) -> Result<u32> {
        if self.size() != 2 {
            return Err(Error::InvalidArgument(format!(
                "{what} needs a communicator of exactly 2 ranks, not {}",
                self.size()
            )));
        }
        Ok(1 - self.rank())
    }

    /// Prepares `sched` as a persistent operation on `send` and `recv`
    /// and exchanges the descriptors with the peer. Returns the plan with
    /// the length of the peer's receive buffer and of its send buffer.
    fn plan_pair<'a>(
        &'a self,
        sched: Box<dyn Schedule>,
        send: &'a [u8],
        recv: &'a mut [u8],
    ) -> Result<(PersistentTransfer<'a>, usize, usize)> {
        let peer = 1 - self.rank();
        let kernel = Kernel::new(DType::U8, RedOp::Sum, 2)?;
        let op = RawOp {
            kind: OpKind::SendRecv,
            dtype: DType::U8,
            redop: RedOp::Sum,
            count: send.len().max(recv.len()),
            root: 0,
            send: send.as_ptr(),
            recv: recv.as_mut_ptr(),
            weight: None,
        };
        let fp = Fingerprint {
            comm_id: self.comm_id,
            seq: 0,
            op: OpKind::SendRecv,
            dtype: DType::U8,
            redop: RedOp::Sum,
            count: op.count as u64,
            root: 0,
        };
        let parts = Parts {
            id: next_id(),
            fp,
            kernel,
            op,
            send_bytes: send.len(),
            recv_bytes: recv.len(),
        };
        // No two-sided plan to fall back on: a transport without the
        // one-sided operations the schedule uses is refused by the engine,
        // naming the peer.
        let (raw, published) = self.prepare_plan(parts, None, Some(sched), false)?;
        let t = PersistentTransfer {
            comm: self,
            raw,
            _bufs: PhantomData,
        };
        let remotes = self.exchange_regions(&t.raw, &published, &[peer])?;
        let d = remotes[peer as usize];
        // The peer's receive buffer, and its send buffer (what it writes,
        // or lends, a round).
        Ok((t, d[3] as usize, d[7] as usize))
    }
}

impl PersistentTransfer<'_> {
    /// Begins a round; an `InvalidUsage` error while one runs.
    pub fn start(&mut self) -> Result<()> {
        // SAFETY: the buffers are borrowed for the request's life and
        // reached by nothing else meanwhile (`&mut self`).
        unsafe { self.raw.start(self.comm) }
    }

    /// Blocks until the running round (if any) finishes.
    pub fn wait(&mut self) -> Result<()> {
        self.raw.wait(self.comm)
    }

    /// Whether no round is running, without blocking.
    pub fn test(&mut self) -> Result<bool> {
        self.raw.test(self.comm)
    }
}

impl Drop for PersistentTransfer<'_> {
    fn drop(&mut self) {
        let _ = self.raw.free(self.comm);
    }
}
