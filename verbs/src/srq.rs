//! A shared receive queue: one pool of posted receives for every queue pair
//! made on it, as a libfabric RDM endpoint has. Without it each queue pair
//! holds its own receives, a peer's burst of frames and immediates (every
//! RDMA WRITE WITH IMM consumes one) draws only on its share and stalls in
//! receiver-not-ready retries, and a queue pair that fails flushes the
//! receives posted on it.

use crate::device::Hca;
use crate::error::{Errno, Error, Result};
use crate::mr::{Pd, ProtectionDomain, Slice};
use std::mem::MaybeUninit;
use std::sync::Arc;

pub(crate) struct Srq {
    pub(crate) srq: *mut rdma_sys::ibv_srq,
    _pd: Arc<Pd>,
}

// SAFETY: a shared receive queue may be posted to from any thread
// (libibverbs serialises posts); posting needs &mut on its owner.
unsafe impl Send for Srq {}
// SAFETY: as for Send; shared references only keep it alive.
unsafe impl Sync for Srq {}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: srq came from ibv_create_srq and is destroyed once; every
        // queue pair on it holds an Arc of this, so none is left.
        let rc = unsafe { rdma_sys::ibv_destroy_srq(self.srq) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_srq failed: {}", crate::sys::rc_errno(rc));
        }
    }
}

/// A shared receive queue.
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<Srq>,
    depth: u32,
}

impl Hca {
    /// Creates a shared receive queue in `pd` with room for `depth` posted
    /// receives of one scatter entry each.
    pub fn create_srq(&self, pd: &ProtectionDomain, depth: u32) -> Result<SharedReceiveQueue> {
        // SAFETY: an all-zero ibv_srq_init_attr is valid (no context, zero
        // limits); the fields gradwire needs are set below.
        let mut attr: rdma_sys::ibv_srq_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.attr.max_wr = depth;
        attr.attr.max_sge = 1;
        // SAFETY: the pd is alive (held by the new queue); attr is valid.
        let srq = unsafe { rdma_sys::ibv_create_srq(pd.pd.pd, &mut attr) };
        if srq.is_null() {
            return Err(Error::CreateSrq {
                call: "ibv_create_srq",
                depth,
                errno: Errno::last(),
            });
        }
        Ok(SharedReceiveQueue {
            inner: Arc::new(Srq {
                srq,
                _pd: pd.pd.clone(),
            }),
            depth,
        })
    }
}

impl SharedReceiveQueue {
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Posts a receive into `dst` for whichever queue pair on this queue
    /// gets a send or an RDMA WRITE WITH IMM next; its completion names the
    /// queue pair (`Completion::qp_num`).
    pub fn post_recv(&mut self, wr_id: u64, dst: Slice<'_>) -> Result<()> {
        let mut sge = dst.sge();
        let mut wr = rdma_sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut rdma_sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the queue is alive; wr and its sge live across the call
        // (libibverbs copies them); the memory they name is registered and
        // its owner promised, at registration, not to race the device.
        let rc = unsafe { rdma_sys::ibv_post_srq_recv(self.inner.srq, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::PostRecv {
                call: "ibv_post_srq_recv",
                wr_id,
                errno: crate::sys::rc_errno(rc),
            });
        }
        Ok(())
    }
}
