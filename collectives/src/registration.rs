//! Buffers registered once with every transport, as NCCL's
//! `ncclCommRegister`: later operations whose send or receive buffer lies
//! inside a registered range skip registering it, which on an RDMA device
//! (pinning pages, tens of microseconds) is most of a small message's cost.
//! Why the caller must say so, and what it promises, is in the engine's
//! `user_regs.rs`.

use crate::communicator::{Communicator, RawOp};
use crate::op::{DType, Fingerprint, OpKind, RedOp};
use crate::operation::Plan;
use crate::persistent::next_id;
use crate::reduce::Kernel;
use gw_transport::{Error, Result};

/// A range registered with a communicator's transports
/// ([`Communicator::register_raw`]); withdraw it with
/// [`Communicator::deregister`]. Dropped without that, the registration
/// lasts as long as the communicator (and the memory must too).
#[derive(Clone, Debug)]
pub struct Registration {
    id: u64,
    comm_id: u64,
    ptr: usize,
    len: usize,
}

impl Registration {
    /// Where the range starts.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: an empty range is refused at registration.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Communicator {
    /// Registers `[ptr, ptr + len)` with every transport of this
    /// communicator, for the operations that follow on memory inside it.
    /// It runs in order with this rank's operations and involves no other
    /// rank.
    ///
    /// # Safety
    /// The memory stays allocated until [`Communicator::deregister`] (or
    /// the communicator's end): a range freed while registered would leave
    /// its old pages pinned, and a new buffer at the same address would be
    /// reached through them.
    pub unsafe fn register_raw(&self, ptr: *mut u8, len: usize) -> Result<Registration> {
        if ptr.is_null() || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "register: {len} bytes at {ptr:p}: a registration needs a non-null pointer \
                 and at least one byte"
            )));
        }
        let id = next_id();
        self.local_op(Plan::Register { id }, ptr, len)?;
        Ok(Registration {
            id,
            comm_id: self.comm_id,
            ptr: ptr as usize,
            len,
        })
    }

    /// Withdraws a registration. It waits for this rank's earlier
    /// operations on memory inside the range. Should it fail, the range
    /// stays registered and `reg` may be given again; once it succeeds,
    /// deregistering `reg` again is an `InvalidUsage` error.
    pub fn deregister(&self, reg: &Registration) -> Result<()> {
        if reg.comm_id != self.comm_id {
            return Err(Error::InvalidArgument(format!(
                "deregister: the {} bytes at {:#x} were registered with another communicator",
                reg.len, reg.ptr
            )));
        }
        self.local_op(Plan::Deregister(reg.id), reg.ptr as *mut u8, reg.len)
    }

    /// Runs a local operation on `[ptr, ptr + len)` (its receive buffer,
    /// so that later messages on that memory wait for it) and waits.
    fn local_op(&self, plan: Plan, ptr: *mut u8, len: usize) -> Result<()> {
        let fp = Fingerprint {
            comm_id: self.comm_id,
            seq: 0,
            op: OpKind::Barrier,
            dtype: DType::U8,
            redop: RedOp::None,
            count: len as u64,
            root: 0,
        };
        let raw = RawOp {
            kind: OpKind::Barrier,
            dtype: DType::U8,
            redop: RedOp::None,
            count: 0,
            root: 0,
            send: ptr,
            recv: ptr,
            weight: None,
        };
        let kernel = Kernel::new(DType::U8, RedOp::None, self.size())?;
        self.submit(fp, plan, kernel, &raw, 0, len, false)?.wait()
    }
}
