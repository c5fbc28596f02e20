//! Persistent one-sided puts (`Communicator::put_init`): what `gwbench p2p
//! --op write` measures, ib_write_bw's operation through the communicator.
//!
//! Both ranks of a two-rank communicator plan the put once: each registers
//! its buffers, publishes its receive buffer, and the two exchange the
//! descriptors (as a persistent all-reduce does, `persistent.rs`). Each
//! round then writes the sender's buffer `reps` times into the peer's with
//! RDMA WRITE WITH IMM (or its shared-memory form), and the peer counts the
//! immediates; the only message is the target's `Ready` as its round starts
//! (`algo::onesided::put`). A rank may send, receive, or both at once
//! (`--bidir`).
//!
//! Rounds draw the communicator's collective sequence numbers, like every
//! persistent operation, which is why the communicator must be the pair:
//! with more ranks the others' sequences would fall behind.

use crate::algo;
use crate::communicator::{Communicator, RawOp};
use crate::op::{DType, Fingerprint, OpKind, RedOp};
use crate::persistent::{Parts, RawPersistent, next_id};
use crate::reduce::Kernel;
use gw_transport::rma::MAX_WINDOWS;
use gw_transport::{Error, Result};
use std::marker::PhantomData;
use std::sync::atomic::Ordering;

/// Largest single write of a put (the libfabric transport's segment).
const PUT_SEGMENT_BYTES: usize = 1 << 20;

/// A planned put on borrowed buffers (see the module comment). Dropping it
/// waits for a running round and frees the plan.
pub struct PersistentPut<'a> {
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
    ) -> Result<PersistentPut<'a>> {
        if self.size() != 2 {
            return Err(Error::InvalidArgument(format!(
                "put_init needs a communicator of exactly 2 ranks, not {}",
                self.size()
            )));
        }
        let peer = 1 - self.rank();
        let id = next_id();
        let window = (self.seq.load(Ordering::Relaxed) % MAX_WINDOWS as u64) as u8;
        let sched = algo::onesided::put(
            peer,
            send.len(),
            recv.len(),
            reps,
            PUT_SEGMENT_BYTES,
            window,
        )?;
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
            id,
            fp,
            kernel,
            op,
            send_bytes: send.len(),
            recv_bytes: recv.len(),
        };
        // No two-sided plan to fall back on: a transport without one-sided
        // writes is refused by the engine, naming the peer.
        let (raw, published) = self.prepare_plan(parts, None, Some(sched), false)?;
        let put = PersistentPut {
            comm: self,
            raw,
            _bufs: PhantomData,
        };
        let remotes = self.exchange_regions(&put.raw, &published, &[peer])?;
        let d = remotes[peer as usize];
        // The peer's receive buffer, and what it writes a round.
        let (its_recv, its_send) = (d[3] as usize, d[7] as usize);
        if !send.is_empty() && its_recv != send.len() {
            return Err(Error::InvalidArgument(format!(
                "put_init: this rank writes {} bytes a round into rank {peer}'s receive buffer of {its_recv}",
                send.len()
            )));
        }
        if its_send != recv.len() && (its_send > 0 || !recv.is_empty()) {
            return Err(Error::InvalidArgument(format!(
                "put_init: rank {peer} writes {its_send} bytes a round into this rank's receive buffer of {}",
                recv.len()
            )));
        }
        Ok(put)
    }
}

impl PersistentPut<'_> {
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

impl Drop for PersistentPut<'_> {
    fn drop(&mut self) {
        let _ = self.raw.free(self.comm);
    }
}
