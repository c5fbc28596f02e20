//! Persistent all-reduce on device buffers (`gwAllReduceInit` given device
//! memory; issue 25 item 6), MiMatrix's GDRAA on one GPU: buffers are
//! exported, mapped and checked once at init, and each round is a constant
//! number of stream operations and one kernel, with no host message at all.
//!
//! The handshake lives in device memory: rank 0 allocates `n + 1` flags
//! (one "ready" per rank and one "done") and every rank maps them. A round
//! `r` on each rank's stream: write `ready[rank] = r`; rank 0 then waits
//! until every `ready[k] >= r`, runs the fan kernel and writes `done = r`;
//! the other ranks wait until `done >= r`. Comparisons wrap (the driver's
//! `GEQ` is `(int32)(*flag - r) >= 0`). A rank's next round is queued behind
//! its wait for `done`, so no rank can be a round ahead of rank 0's
//! kernel; rounds of one request therefore stay on one stream (a start on
//! another stream first waits for the previous one).
//!
//! Where the ranks cannot all map each other's buffers (another GPU, another
//! host, a buffer IPC cannot export), each round runs the ordinary device
//! call instead, synchronously.

use crate::CResult;
use crate::cuda::{self, DeviceHost, IpcPlan, Profile};
use gw_collectives::communicator::RawOp;
use gw_collectives::{DType, OpKind, RedOp};
use gw_cuda::api::{CUdeviceptr, CUstream, IpcMemHandle};
use gw_cuda::memory;
use gw_cuda::{DeviceBuf, Gpu};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A persistent all-reduce on device memory.
pub(crate) struct DevicePersistent {
    gpu: &'static Gpu,
    op: RawOp,
    way: Way,
    state: Mutex<State>,
    /// The communicator's `GW_TIMEOUT`, for waits without a limit.
    timeout: Duration,
}

// SAFETY: the raw pointers are device addresses and stream handles, usable
// from any thread; `state` serialises their use.
unsafe impl Send for DevicePersistent {}
unsafe impl Sync for DevicePersistent {}

enum Way {
    Flags {
        /// This rank's address of rank 0's flags.
        flags: CUdeviceptr,
        rank: usize,
        n: usize,
        plan: IpcPlan,
        stream: CUstream,
    },
    Ordinary,
}

#[derive(Default)]
struct State {
    round: u32,
    /// The stream the last round was queued on, while it may be running.
    running: Option<usize>,
}

/// Rank 0's flag buffers: never freed, since a peer's stream may still be
/// waiting on them when rank 0 frees its request (n + 1 words each).
static FLAGS: Mutex<Vec<DeviceBuf>> = Mutex::new(Vec::new());

impl DevicePersistent {
    /// Plans it if `op`'s buffers are device memory (`None`: host memory,
    /// for the host path's persistent request). Collective.
    pub(crate) fn init(
        st: &(impl DeviceHost + ?Sized),
        op: &RawOp,
    ) -> CResult<Option<DevicePersistent>> {
        let Some(gpu) = cuda::device_all_reduce(st, op)? else {
            return Ok(None);
        };
        let ordinary = DevicePersistent {
            gpu,
            op: *op,
            way: Way::Ordinary,
            state: Mutex::new(State::default()),
            timeout: st.comm().config().timeout.value,
        };
        if !cuda::ipc_possible(st, op) {
            return Ok(Some(ordinary));
        }
        let mut prof = Profile::start(Instant::now());
        let Some(plan) = IpcPlan::exchange(st, op, gpu, &mut prof)? else {
            return Ok(Some(ordinary));
        };
        let drv = gpu.driver();
        let (n, rank) = (st.comm().size() as usize, st.comm().rank() as usize);
        // Rank 0's flags, zeroed, their handle broadcast after a status
        // byte; then every rank maps them. Each step can fail on one rank
        // only, so the ranks agree on the outcome before any takes the
        // flags way; otherwise all take the ordinary one.
        let mut msg = [0u8; 65];
        let mut own = 0;
        if rank == 0 {
            let made = (|| -> CResult<(CUdeviceptr, IpcMemHandle)> {
                if let Some(Err(e)) = &plan.fan {
                    return Err(crate::Failure {
                        code: e.code,
                        msg: e.msg.clone(),
                    });
                }
                let buf = DeviceBuf::new(drv, (n + 1) * 4).map_err(cuda::cuda_err)?;
                // SAFETY: our own allocation of (n + 1) * 4 bytes.
                unsafe { memory::memset(drv, buf.ptr(), 0, (n + 1) * 4) }
                    .map_err(cuda::cuda_err)?;
                // A memset of device memory is asynchronous: it must be done
                // before any rank writes a flag.
                gpu.synchronize().map_err(cuda::cuda_err)?;
                let (h, _) = cuda::export(drv, buf.ptr()).ok_or_else(|| crate::Failure {
                    code: crate::gwSystemError,
                    msg: "cuIpcGetMemHandle failed on the persistent all-reduce's flags".into(),
                })?;
                let ptr = buf.ptr();
                FLAGS.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
                Ok((ptr, h))
            })();
            match made {
                Ok((ptr, h)) => {
                    own = ptr;
                    msg[0] = 1;
                    msg[1..].copy_from_slice(&h.reserved);
                }
                Err(e) => tracing::warn!("persistent device all-reduce without flags: {}", e.msg),
            }
        }
        let bcast = RawOp {
            kind: OpKind::Broadcast,
            dtype: DType::Bytes,
            redop: RedOp::None,
            count: msg.len(),
            root: 0,
            send: msg.as_ptr(),
            recv: msg.as_mut_ptr(),
            weight: None,
        };
        // SAFETY: a 65-byte buffer on every rank, alive for the call.
        unsafe { st.comm().run_raw(bcast, None)? };
        if msg[0] != 1 {
            return Ok(Some(ordinary));
        }
        let flags = if rank == 0 {
            Ok(own)
        } else {
            let mut handle = IpcMemHandle { reserved: [0; 64] };
            handle.reserved.copy_from_slice(&msg[1..]);
            cuda::import(st, drv, 0, &(handle, 0))
        };
        if cuda::agree(st, i32::from(flags.is_err()))? != 0 {
            if let Err(e) = flags {
                tracing::warn!("persistent device all-reduce without flags: {}", e.msg);
            }
            return Ok(Some(ordinary));
        }
        let flags = flags?;
        let stream = gpu.new_stream().map_err(cuda::cuda_err)?;
        Ok(Some(DevicePersistent {
            way: Way::Flags {
                flags,
                rank,
                n,
                plan,
                stream,
            },
            ..ordinary
        }))
    }

    /// Queues one round on `stream` (`None`: after everything this
    /// process queued on the GPU, on the request's own stream).
    pub(crate) fn start(
        &self,
        st: &(impl DeviceHost + ?Sized),
        stream: Option<CUstream>,
    ) -> CResult<()> {
        let drv = self.gpu.driver();
        self.gpu.make_current().map_err(cuda::cuda_err)?;
        let Way::Flags {
            flags,
            rank,
            n,
            plan,
            stream: own,
        } = &self.way
        else {
            return cuda::run(st, &self.op, stream).map(|_| ());
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = match stream {
            Some(s) => s,
            None => {
                // The send buffer may still be written by work queued on
                // another stream.
                self.gpu.synchronize().map_err(cuda::cuda_err)?;
                *own
            }
        };
        if let Some(prev) = state.running
            && prev != s as usize
        {
            cuda::sync(drv, prev as CUstream)?;
        }
        let r = state.round.wrapping_add(1);
        let word = |k: usize| flags + 4 * k as u64;
        // SAFETY: the flags are n + 1 words mapped at init; `s` is the
        // caller's stream (the ...Stream contract) or ours.
        unsafe {
            memory::write_flag(drv, s, word(*rank), r).map_err(cuda::cuda_err)?;
            if let Some(Ok(fan)) = &plan.fan {
                for k in 0..*n {
                    memory::wait_flag(drv, s, word(k), r).map_err(cuda::cuda_err)?;
                }
                fan.launch(self.gpu, s)?;
                memory::write_flag(drv, s, word(*n), r).map_err(cuda::cuda_err)?;
            } else {
                memory::wait_flag(drv, s, word(*n), r).map_err(cuda::cuda_err)?;
            }
        }
        state.round = r;
        state.running = Some(s as usize);
        Ok(())
    }

    /// Waits for the last round, at most `limit`; `Ok(false)` if it is
    /// still running then. Without a limit it waits the communicator's
    /// operation timeout (`GW_TIMEOUT`) and then fails naming the round:
    /// a rank that died or never started it leaves the others' streams
    /// waiting on its flag, which no host message would reveal.
    pub(crate) fn wait(&self, limit: Option<Duration>) -> CResult<bool> {
        let (s, round) = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match state.running {
                None => return Ok(true),
                Some(s) => (s as CUstream, state.round),
            }
        };
        let deadline = limit.unwrap_or(self.timeout);
        let end = Instant::now() + deadline;
        let mut pause = Duration::from_micros(5);
        // SAFETY: a stream queued on by start.
        while !unsafe { memory::stream_done(self.gpu.driver(), s) }.map_err(cuda::cuda_err)? {
            if Instant::now() >= end {
                if limit.is_some() {
                    return Ok(false);
                }
                return Err(crate::Failure {
                    code: crate::gwTimeout,
                    msg: format!(
                        "timeout: round {round} of a persistent device all-reduce did not finish \
                         within GW_TIMEOUT ({:?}); a rank may have died or not started it",
                        deadline
                    ),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
        self.state.lock().unwrap_or_else(|p| p.into_inner()).running = None;
        Ok(true)
    }
}
