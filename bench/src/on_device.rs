//! `--device cuda`: the device buffers a benchmark measures on, and the
//! communicator's device paths (the C ABI's, which C, Python and PyTorch
//! callers take), shared by the collectives' tables and p2p's.

use crate::Fail;
use gradwire::device::DeviceComm;
use gw_collectives::Communicator;
use gw_cuda::{DeviceBuf, Gpu};

/// Device buffers mirroring a benchmark's host `send` and `recv` (filled
/// from them before each measurement, read back for `-c 1`), and the
/// communicator's device state.
pub(crate) struct OnDevice<'a> {
    pub(crate) dc: DeviceComm<'a>,
    pub(crate) gpu: &'static Gpu,
    pub(crate) send: DeviceBuf,
    pub(crate) recv: DeviceBuf,
}

impl<'a> OnDevice<'a> {
    /// GPU `local rank % GPUs`, its kernels compiled up front, and the
    /// buffers. Without a driver: one error naming the loader's reason.
    pub(crate) fn new(
        comm: &'a Communicator,
        send_bytes: usize,
        recv_bytes: usize,
    ) -> Result<Self, Fail> {
        let count = gw_cuda::device::count().map_err(cuda)?;
        if count < 1 {
            return Err(Fail::Other("--device cuda: the driver sees no GPU".into()));
        }
        let gpu = Gpu::get(comm.local_rank() as i32 % count).map_err(cuda)?;
        gpu.make_current().map_err(cuda)?;
        gpu.prepare().map_err(cuda)?;
        Ok(OnDevice {
            dc: DeviceComm::new(comm),
            gpu,
            send: DeviceBuf::new(gpu.driver(), send_bytes).map_err(cuda)?,
            recv: DeviceBuf::new(gpu.driver(), recv_bytes).map_err(cuda)?,
        })
    }

    /// The header line that says where the buffers are.
    pub(crate) fn line(&self) -> String {
        format!(
            "# Buffers: CUDA device memory (rank 0: GPU {}, {}), results checked after copying back",
            self.gpu.ordinal, self.gpu.arch
        )
    }
}

/// A driver error as gwbench reports it.
pub(crate) fn cuda(e: gw_cuda::Error) -> Fail {
    Fail::Other(format!("--device cuda: {e}"))
}
