//! Device buffers for Rust programs that hold a [`Communicator`] (gwbench's
//! `--device cuda`): the same device paths the C ABI's calls take (the IPC
//! all-reduce among ranks on one GPU, the staging pipeline, the persistent
//! device all-reduce, point-to-point messages staged through pinned host
//! memory), so that what gwbench measures is what C, Python and PyTorch
//! callers get.

use crate::cuda::{self, CommCuda, DeviceHost};
use crate::cuda_persistent::DevicePersistent;
use gw_collectives::communicator::RawOp;
use gw_collectives::{Communicator, DType};

/// A communicator with the device state its device calls keep (pinned
/// staging buffers, peers' IPC mappings).
pub struct DeviceComm<'a> {
    comm: &'a Communicator,
    cuda: CommCuda,
}

impl DeviceHost for DeviceComm<'_> {
    fn comm(&self) -> &Communicator {
        self.comm
    }
    fn cuda(&self) -> &CommCuda {
        &self.cuda
    }
}

impl<'a> DeviceComm<'a> {
    pub fn new(comm: &'a Communicator) -> DeviceComm<'a> {
        DeviceComm {
            comm,
            cuda: CommCuda::default(),
        }
    }

    /// Runs `op`, blocking, on buffers of which at least one is device
    /// memory; buffers all in host memory are an error (use the
    /// communicator itself).
    ///
    /// # Safety
    /// The buffers are valid for `op`'s layout and untouched until it returns.
    pub unsafe fn run(&self, op: &RawOp) -> Result<(), String> {
        match cuda::run(self, op, None) {
            Ok(true) => Ok(()),
            Ok(false) => Err(
                "the buffers are host memory, or this process has not loaded the CUDA driver"
                    .into(),
            ),
            Err(f) => Err(f.msg),
        }
    }

    /// A blocking send of `send`'s bytes and/or receive into `recv`'s (peer,
    /// address, bytes), as `gwSendRecv`, where at least one buffer is
    /// device memory: staged through the communicator's pinned buffers.
    /// Buffers all in host memory are an error (use the communicator).
    ///
    /// # Safety
    /// Each buffer is valid for its bytes and untouched until this returns.
    pub unsafe fn sendrecv(
        &self,
        send: Option<(u32, *const u8, usize)>,
        recv: Option<(u32, *mut u8, usize)>,
    ) -> Result<(), String> {
        let (mut send, mut recv) = (send, recv);
        let staged = cuda::stage_p2p(self, DType::U8, &mut send, &mut recv, false)
            .map_err(|f| f.msg)?
            .ok_or("the buffers are host memory, or this process has not loaded the CUDA driver")?;
        // SAFETY: the host halves are the caller's (valid per the contract)
        // or the staged pinned buffers, which `staged` holds until the end.
        let h =
            unsafe { self.comm.sendrecv_raw(DType::U8, send, recv) }.map_err(|e| e.to_string())?;
        h.wait().map_err(|e| e.to_string())?;
        staged.finish().map_err(|f| f.msg)
    }

    /// A persistent all-reduce of `op` (an all-reduce on device buffers),
    /// as `gwAllReduceInit`. Collective.
    ///
    /// # Safety
    /// The buffers stay valid, and untouched while a round runs, until the
    /// request is dropped; and the request is dropped before this
    /// `DeviceComm` (whose peer mappings its kernel reads through).
    pub unsafe fn all_reduce_init(&self, op: &RawOp) -> Result<DeviceRequest, String> {
        match DevicePersistent::init(self, op) {
            Ok(Some(p)) => Ok(DeviceRequest { p }),
            Ok(None) => Err("the buffers are host memory".into()),
            Err(f) => Err(f.msg),
        }
    }
}

/// A persistent device all-reduce ([`DeviceComm::all_reduce_init`]).
pub struct DeviceRequest {
    p: DevicePersistent,
}

impl DeviceRequest {
    /// Queues one round (as `gwStart`) on the communicator it was made on.
    pub fn start(&self, comm: &DeviceComm<'_>) -> Result<(), String> {
        self.p.start(comm, None).map_err(|f| f.msg)
    }

    /// Waits for the last round (at most `GW_TIMEOUT`, as `gwWait`).
    pub fn wait(&self) -> Result<(), String> {
        self.p.wait(None).map(|_| ()).map_err(|f| f.msg)
    }
}

impl Drop for DeviceRequest {
    fn drop(&mut self) {
        // The buffers may be freed next: no round may still use them.
        let _ = self.p.wait(None);
    }
}
