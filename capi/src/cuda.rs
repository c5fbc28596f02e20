//! Device memory in the C ABI's calls (issue 25).
//!
//! Every call takes `void *`, so each asks whether a buffer is device
//! memory, but only in a process that has the CUDA driver loaded already:
//! a process that has not cannot hold device or pinned memory, and a
//! host-only program never loads the driver because of gradwire.
//!
//! Two ways to run an operation on device buffers:
//! - **IPC** (all-reduce, every rank on one host, every buffer on one
//!   GPU, at most `MAX_FAN` ranks): ranks exchange CUDA IPC handles of
//!   their buffers (exported once per allocation, each peer's mapping
//!   opened once and cached), then rank 0 runs one kernel that reads every
//!   rank's send buffer and writes every rank's receive buffer, reducing in
//!   rank order. Host messages carry only the handles and one barrier.
//! - **Staged** (everything else): the device data is copied into pinned
//!   host buffers kept per communicator, the host operation runs, and the
//!   result is copied back. All-reduce, broadcast and reduce larger than a
//!   segment (`GW_CUDA_STAGE_BYTES`, 4 MiB) go segment by segment through
//!   three pinned slots, the copies on streams of their own overlapping the
//!   host operation on the segment between (`gw_cuda::pipeline`).
//!
//! Every choice that changes the host messages is made alike on every
//! rank: IPC from the call and every rank's record, the pipeline from the
//! call's kind and size, rank 0's outcome through one small all-reduce
//! ([`agree`]). Every rank of a call must pass at least one device buffer,
//! or none (docs/gpu.md).

use crate::{
    CResult, CommState, Failure, fail, gwInternalError, gwInvalidArgument, gwInvalidUsage,
    gwSystemError,
};
use gw_collectives::communicator::RawOp;
use gw_collectives::{DType, OpKind, RedOp};
use gw_cuda::api::{CUdeviceptr, CUstream, IpcMemHandle};
use gw_cuda::memory::{self, MemKind};
use gw_cuda::pipeline::{Action, Done, Pipeline};
use gw_cuda::{Driver, Elem, Event, Gpu, Op, PinnedBuf};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// What the device paths need of a communicator: the communicator for
/// host messages, and its device state. The C ABI's `CommState` and
/// [`crate::device::DeviceComm`] (Rust callers such as gwbench) both are.
pub(crate) trait DeviceHost {
    fn comm(&self) -> &gw_collectives::Communicator;
    fn cuda(&self) -> &CommCuda;
}

impl DeviceHost for CommState {
    fn comm(&self) -> &gw_collectives::Communicator {
        &self.comm
    }
    fn cuda(&self) -> &CommCuda {
        &self.cuda
    }
}

/// Per-communicator device state: pinned staging buffers and the peers'
/// opened IPC mappings.
#[derive(Default)]
pub struct CommCuda {
    staging: Mutex<Vec<PinnedBuf>>,
    /// (peer rank, handle) → mapped base address in this process. Kept
    /// while the communicator lives (a persistent request's kernel reads
    /// through them), closed when it goes.
    opened: Mutex<HashMap<(u32, [u8; 64]), CUdeviceptr>>,
}

impl Drop for CommCuda {
    fn drop(&mut self) {
        let opened = std::mem::take(self.opened.get_mut().unwrap_or_else(|p| p.into_inner()));
        if opened.is_empty() {
            return;
        }
        if let Ok(drv) = Driver::global() {
            for base in opened.into_values() {
                // SAFETY: mapped by cuIpcOpenMemHandle in `import`, closed
                // once; no call of this communicator runs any more.
                unsafe { (drv.api().ipc_close_mem_handle)(base) };
            }
        }
    }
}

pub(crate) fn cuda_err(e: gw_cuda::Error) -> Failure {
    let code = match e {
        gw_cuda::Error::Memory(_) | gw_cuda::Error::InvalidArgument(_) => gwInvalidArgument,
        _ => gwSystemError,
    };
    Failure {
        code,
        msg: e.to_string(),
    }
}

/// The device and kinds of an operation's buffers, when any is device
/// memory.
struct DeviceUse {
    gpu: &'static Gpu,
    send: MemKind,
    recv: MemKind,
}

/// Classifies `op`'s buffers of `send_bytes` and `recv_bytes`; `None`
/// when both are host memory. In a process with CUDA, a pointer CUDA does
/// not know and the process cannot read (a freed device allocation) is
/// named here rather than faulting the host path.
fn device_use(op: &RawOp, send_bytes: usize, recv_bytes: usize) -> CResult<Option<DeviceUse>> {
    if !gw_cuda::driver::loaded_in_process() {
        return Ok(None);
    }
    let drv = Driver::global().map_err(cuda_err)?;
    let send = memory::classify(drv, op.send.cast()).map_err(cuda_err)?;
    let recv = memory::classify(drv, op.recv.cast::<c_void>()).map_err(cuda_err)?;
    for (kind, ptr, bytes, what) in [
        (send, op.send, send_bytes, "sendbuff"),
        (recv, op.recv.cast_const(), recv_bytes, "recvbuff"),
    ] {
        if kind == MemKind::Host
            && bytes <= isize::MAX as usize
            && !memory::host_readable(ptr, bytes)
        {
            return fail(
                gwInvalidArgument,
                format!(
                    "invalid argument: {what} {ptr:p} ({bytes} bytes) is neither a live device \
                     allocation nor host memory this process can read (freed?)"
                ),
            );
        }
    }
    let ordinal = match (send, recv) {
        (MemKind::Device { ordinal: a }, MemKind::Device { ordinal: b }) if a != b => {
            return fail(
                gwInvalidArgument,
                format!(
                    "invalid argument: sendbuff {:p} is on GPU {a} and recvbuff {:p} on GPU {b}",
                    op.send, op.recv
                ),
            );
        }
        (MemKind::Device { ordinal }, _) | (_, MemKind::Device { ordinal }) => ordinal,
        _ => return Ok(None),
    };
    if !cfg!(feature = "cuda") {
        return fail(
            gwInvalidUsage,
            "device memory given, but libgradwire was built without CUDA support \
             (rebuild gw-capi with its `cuda` feature)",
        );
    }
    let gpu = Gpu::get(ordinal).map_err(cuda_err)?;
    Ok(Some(DeviceUse { gpu, send, recv }))
}

/// Whether `ptr` is device memory (never, in a process without CUDA).
pub(crate) fn is_device(ptr: *const c_void) -> CResult<bool> {
    if !gw_cuda::driver::loaded_in_process() {
        return Ok(false);
    }
    let drv = Driver::global().map_err(cuda_err)?;
    let kind = memory::classify(drv, ptr).map_err(cuda_err)?;
    Ok(matches!(kind, MemKind::Device { .. }))
}

/// Whether any of `op`'s buffers is device memory.
pub(crate) fn device_given(st: &(impl DeviceHost + ?Sized), op: &RawOp) -> CResult<bool> {
    Ok(device_use_of(st, op)?.is_some())
}

/// [`device_use`] for `op` on this communicator, with its (send, recv)
/// extents in bytes.
fn device_use_of(
    st: &(impl DeviceHost + ?Sized),
    op: &RawOp,
) -> CResult<Option<(DeviceUse, usize, usize)>> {
    let (send_bytes, recv_bytes) =
        extents(op, st.comm().size() as usize, st.comm().rank() as usize);
    Ok(device_use(op, send_bytes, recv_bytes)?.map(|d| (d, send_bytes, recv_bytes)))
}

/// Before a call reads device buffers: its GPU's context current, the
/// work queued before it finished (on `stream`, or all of this process's),
/// and its device buffers' extents checked against their allocations.
fn settle(
    dev: &DeviceUse,
    op: &RawOp,
    send_bytes: usize,
    recv_bytes: usize,
    stream: Option<CUstream>,
) -> CResult<()> {
    let (gpu, drv) = (dev.gpu, dev.gpu.driver());
    gpu.make_current().map_err(cuda_err)?;
    match stream {
        Some(s) => sync(drv, s)?,
        None => gpu.synchronize().map_err(cuda_err)?,
    }
    for (kind, ptr, bytes, what) in [
        (dev.send, op.send as u64, send_bytes, "sendbuff"),
        (dev.recv, op.recv as u64, recv_bytes, "recvbuff"),
    ] {
        if kind.is_device() && bytes > 0 {
            memory::check_extent(drv, ptr, bytes, what).map_err(cuda_err)?;
        }
    }
    Ok(())
}

/// Waits for `stream` before a host-memory `...Stream` call, where the
/// process has CUDA loaded (without it, no stream can exist).
pub(crate) fn sync_stream_if_loaded(stream: *mut c_void) -> CResult<()> {
    if !gw_cuda::driver::loaded_in_process() {
        if stream.is_null() {
            return Ok(());
        }
        return fail(
            gwInvalidArgument,
            "invalid argument: a CUDA stream was given, but this process has not loaded \
             the CUDA driver (libcuda.so.1)",
        );
    }
    let drv = Driver::global().map_err(cuda_err)?;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { (drv.api().ctx_get_current)(&mut ctx) };
    if ctx.is_null() {
        if stream.is_null() {
            // No context on this thread: nothing was queued from it.
            return Ok(());
        }
        Gpu::get(0)
            .and_then(|g| g.make_current())
            .map_err(cuda_err)?;
    }
    sync(drv, stream)
}

/// A staged point-to-point call: the pinned buffers (held until it ends)
/// and where a received message goes back to.
pub(crate) struct StagedP2p<'a> {
    _bufs: std::sync::MutexGuard<'a, Vec<PinnedBuf>>,
    back: Option<(&'static Driver, CUdeviceptr, *const u8, usize)>,
}

impl StagedP2p<'_> {
    /// Copies a received message to its device buffer.
    pub(crate) fn finish(self) -> CResult<()> {
        if let Some((drv, dst, src, bytes)) = self.back {
            // SAFETY: the extent was checked and the pinned buffer is held.
            unsafe { memory::copy_htod(drv, dst, src, bytes, None) }.map_err(cuda_err)?;
        }
        Ok(())
    }
}

/// Rewrites a send or receive on device memory to pinned host buffers
/// (the send's data copied in); `None` for host memory.
pub(crate) fn stage_p2p<'a>(
    st: &'a (impl DeviceHost + ?Sized),
    dt: DType,
    send: &mut Option<(u32, *const u8, usize)>,
    recv: &mut Option<(u32, *mut u8, usize)>,
    asynchronous: bool,
) -> CResult<Option<StagedP2p<'a>>> {
    let probe = RawOp {
        kind: OpKind::SendRecv,
        dtype: dt,
        redop: RedOp::None,
        count: 0,
        root: 0,
        send: send.map_or(std::ptr::null(), |s| s.1),
        recv: recv.map_or(std::ptr::null_mut(), |r| r.1),
        weight: None,
    };
    let es = dt.size();
    let (sb, rb) = (
        send.map_or(0, |s| s.2.saturating_mul(es)),
        recv.map_or(0, |r| r.2.saturating_mul(es)),
    );
    let Some(dev) = device_use(&probe, sb, rb)? else {
        return Ok(None);
    };
    if asynchronous {
        return fail(
            gwInvalidArgument,
            "invalid argument: gwSendAsync and gwRecvAsync take host memory; use gwSend, \
             gwRecv or gwSendRecv for device memory",
        );
    }
    let drv = dev.gpu.driver();
    dev.gpu.synchronize().map_err(cuda_err)?;
    let mut bufs = st.cuda().staging.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((peer, ptr, count)) = *send
        && dev.send.is_device()
    {
        let bytes = count.saturating_mul(es);
        memory::check_extent(drv, ptr as u64, bytes, "sendbuff").map_err(cuda_err)?;
        let host = pinned(&mut bufs, drv, PIN_P2P_SEND, bytes)?;
        // SAFETY: the extent was just checked; the pinned buffer holds it.
        unsafe { memory::copy_dtoh(drv, host, ptr as u64, bytes, None) }.map_err(cuda_err)?;
        *send = Some((peer, host.cast_const(), count));
    }
    let mut back = None;
    if let Some((peer, ptr, count)) = *recv
        && dev.recv.is_device()
    {
        let bytes = count.saturating_mul(es);
        memory::check_extent(drv, ptr as u64, bytes, "recvbuff").map_err(cuda_err)?;
        let host = pinned(&mut bufs, drv, PIN_P2P_RECV, bytes)?;
        back = Some((drv, ptr as u64, host.cast_const(), bytes));
        *recv = Some((peer, host, count));
    }
    Ok(Some(StagedP2p { _bufs: bufs, back }))
}

/// The communicator's pinned staging buffers by use: a collective's
/// receive (or both sides, in place) and send, a message's send and
/// receive, then the pipeline's slots.
const PIN_RECV: usize = 0;
const PIN_SEND: usize = 1;
const PIN_P2P_SEND: usize = 2;
const PIN_P2P_RECV: usize = 3;
const PIN_SLOTS: usize = 4;

/// Pinned staging buffer `i` of `bufs`, grown to hold `bytes` (to the
/// next power of two, so that sizes creeping up do not reallocate each
/// call).
fn pinned(
    bufs: &mut Vec<PinnedBuf>,
    drv: &'static Driver,
    i: usize,
    bytes: usize,
) -> CResult<*mut u8> {
    while bufs.len() <= i {
        bufs.push(PinnedBuf::new(drv, 0).map_err(cuda_err)?);
    }
    if bufs[i].len() < bytes {
        bufs[i] = PinnedBuf::new(drv, bytes.next_power_of_two()).map_err(cuda_err)?;
    }
    Ok(bufs[i].as_ptr())
}

/// Bytes of (send, recv) per the layout table of `gw_collectives::algo`.
fn extents(op: &RawOp, n: usize, rank: usize) -> (usize, usize) {
    // Saturating: a count too large for memory is the host path's error
    // to name (the probes below skip such extents).
    let b = op.count.saturating_mul(op.dtype.size());
    let root = op.root as usize == rank;
    match op.kind {
        OpKind::AllReduce => (b, b),
        OpKind::ReduceScatter => (n.saturating_mul(b), b),
        OpKind::AllGather => (b, n.saturating_mul(b)),
        OpKind::Broadcast => (if root { b } else { 0 }, b),
        OpKind::Reduce => (b, b),
        _ => (0, 0),
    }
}

/// Where the send data sits inside the receive buffer for an in-place
/// call (recv + offset == send), if it is one.
fn in_place_offset(op: &RawOp, rank: usize) -> Option<isize> {
    let b = op.count.saturating_mul(op.dtype.size()) as isize;
    let diff = (op.send as isize).wrapping_sub(op.recv as isize);
    let want = match op.kind {
        OpKind::AllReduce | OpKind::Broadcast | OpKind::Reduce => 0,
        OpKind::AllGather => rank as isize * b,
        OpKind::ReduceScatter => -(rank as isize * b),
        _ => return None,
    };
    (diff == want && !op.send.is_null()).then_some(diff)
}

/// Runs `op` if any of its buffers is device memory; `Ok(false)` leaves
/// it to the host path. With `stream`, waits for the work queued on it
/// first, and work queued after the call sees the result.
pub(crate) fn run(
    st: &(impl DeviceHost + ?Sized),
    op: &RawOp,
    stream: Option<CUstream>,
) -> CResult<bool> {
    let Some((dev, send_bytes, recv_bytes)) = device_use_of(st, op)? else {
        return Ok(false);
    };
    // From here: a clock read on every host call was a tenth of a 4-byte
    // all-reduce's time in the C ABI.
    let t0 = std::time::Instant::now();
    settle(&dev, op, send_bytes, recv_bytes, stream)?;
    let gpu = dev.gpu;
    let n = st.comm().size() as usize;
    if n == 1 && dev.send.is_device() && dev.recv.is_device() {
        return one_rank(op, gpu, stream, recv_bytes).map(|_| true);
    }
    if ipc_wanted(st, op) {
        let stream = match stream {
            Some(s) => s,
            None => internal_stream(gpu)?,
        };
        if all_reduce_ipc(st, op, gpu, stream, Profile::start(t0))? {
            return Ok(true);
        }
    }
    if pipelines(op, recv_bytes) {
        staged_pipelined(st, op, &dev, recv_bytes)?;
    } else {
        staged(st, op, &dev, stream, send_bytes, recv_bytes)?;
    }
    Ok(true)
}

/// Waits for `stream`: the C caller's (the `...Stream` calls' contract: a
/// live stream or NULL) or this module's own.
pub(crate) fn sync(drv: &Driver, stream: CUstream) -> CResult<()> {
    // SAFETY: see above.
    unsafe { memory::sync_stream(drv, stream) }.map_err(cuda_err)
}

/// A single rank's operation on device buffers: its result is its input
/// (avg divided by 1, as the host path does), copied on the device.
fn one_rank(op: &RawOp, gpu: &'static Gpu, stream: Option<CUstream>, bytes: usize) -> CResult<()> {
    let drv = gpu.driver();
    let s = match stream {
        Some(s) => s,
        None => internal_stream(gpu)?,
    };
    let (send, recv) = (op.send as u64, op.recv as u64);
    match (op.redop, elem(op.dtype)) {
        (RedOp::Avg, Some(e)) => gpu
            .copy(e, recv, send, op.count as u64, None, Some(1.0), s)
            .map_err(cuda_err)?,
        _ if send != recv => {
            // SAFETY: both extents were checked by the caller.
            unsafe { memory::copy_dtod(drv, recv, send, bytes, s) }.map_err(cuda_err)?
        }
        _ => {}
    }
    sync(drv, s)
}

/// The blocking calls' stream on `gpu`.
fn internal_stream(gpu: &'static Gpu) -> CResult<CUstream> {
    own_stream(gpu, 0)
}

/// Non-blocking stream number `which` of this process on `gpu` (0: the
/// blocking calls' work, 1 and 2: the staging pipeline's copies in and
/// out), created once.
fn own_stream(gpu: &'static Gpu, which: u8) -> CResult<CUstream> {
    struct S(CUstream);
    // SAFETY: a stream handle may be used from any thread.
    unsafe impl Send for S {}
    static STREAMS: Mutex<Vec<(i32, u8, S)>> = Mutex::new(Vec::new());
    let mut all = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, s)) = all
        .iter()
        .find(|(o, w, _)| *o == gpu.ordinal && *w == which)
    {
        return Ok(s.0);
    }
    let s = gpu.new_stream().map_err(cuda_err)?;
    all.push((gpu.ordinal, which, S(s)));
    Ok(s)
}

/// Segment size of the staging pipeline: `GW_CUDA_STAGE_BYTES` (every rank
/// must use the same, since each segment is a host operation of its own),
/// whole elements.
fn stage_bytes(es: usize) -> usize {
    let b = std::env::var("GW_CUDA_STAGE_BYTES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|b| *b > 0)
        .unwrap_or(4 << 20);
    (b / es).max(1) * es
}

/// Pinned slots the pipeline cycles through.
const STAGE_SLOTS: usize = 3;

/// Whether `op` may be staged segment by segment: an elementwise
/// operation (each segment an operation of its own) on device buffers of
/// more than one segment.
fn pipelines(op: &RawOp, bytes: usize) -> bool {
    // Only what every rank knows alike: each segment is a host operation
    // of its own, so all ranks must cut the call the same way, whatever
    // kinds of memory each passed (one buffer of theirs on the device).
    let elementwise = matches!(
        op.kind,
        OpKind::AllReduce | OpKind::Broadcast | OpKind::Reduce
    );
    elementwise && bytes > stage_bytes(op.dtype.size())
}

/// The staged way, segment by segment ([`gw_cuda::pipeline`]): the copies
/// to the host and back run on two copy streams of their own while the
/// host operation works on the segment between, each in place in its
/// pinned slot.
fn staged_pipelined(
    st: &(impl DeviceHost + ?Sized),
    op: &RawOp,
    dev: &DeviceUse,
    bytes: usize,
) -> CResult<()> {
    let gpu = dev.gpu;
    let drv = gpu.driver();
    let rank = st.comm().rank() as usize;
    let es = op.dtype.size();
    let seg = stage_bytes(es);
    let root = op.root as usize == rank;
    // A side in host memory is read or written in place by the host
    // operation; a side nobody uses (a broadcast's send off the root, a
    // reduce's receive off it) is the slot.
    let send_used = op.kind != OpKind::Broadcast || root;
    let recv_used = op.kind != OpKind::Reduce || root;
    let copy_in = send_used && dev.send.is_device();
    let copy_out = recv_used && dev.recv.is_device();
    let (s_in, s_out) = (own_stream(gpu, 1)?, own_stream(gpu, 2)?);
    let mut bufs = st.cuda().staging.lock().unwrap_or_else(|p| p.into_inner());
    let slots = (0..STAGE_SLOTS)
        .map(|k| pinned(&mut bufs, drv, PIN_SLOTS + k, seg))
        .collect::<CResult<Vec<*mut u8>>>()?;
    let mut pipe = Pipeline::new(bytes, seg, STAGE_SLOTS, copy_in, copy_out);
    // An event after a copy just queued on stream `s`.
    let queued = |copy: gw_cuda::Result<()>, s: CUstream| -> CResult<Event> {
        copy.map_err(cuda_err)?;
        let ev = Event::new(drv).map_err(cuda_err)?;
        // SAFETY: our own stream.
        unsafe { ev.record(s) }.map_err(cuda_err)?;
        Ok(ev)
    };
    let result = (|| -> CResult<()> {
        let mut pending: std::collections::VecDeque<(Done, Event)> = Default::default();
        loop {
            let mut runs = Vec::new();
            for a in pipe.poll() {
                match a {
                    Action::CopyIn { seg, slot } => {
                        let r = pipe.range(seg);
                        let dev = op.send as u64 + r.start as u64;
                        // SAFETY: a segment of the checked send extent into a
                        // slot of `seg` bytes, both alive until the event.
                        let copy = unsafe {
                            memory::copy_dtoh(drv, slots[slot], dev, r.len(), Some(s_in))
                        };
                        pending.push_back((Done::CopiedIn(seg), queued(copy, s_in)?));
                    }
                    Action::CopyOut { seg, slot } => {
                        let r = pipe.range(seg);
                        let dev = op.recv as u64 + r.start as u64;
                        // SAFETY: as the copy in, to the checked receive extent.
                        let copy = unsafe {
                            memory::copy_htod(drv, dev, slots[slot], r.len(), Some(s_out))
                        };
                        pending.push_back((Done::CopiedOut(seg), queued(copy, s_out)?));
                    }
                    // After the copies are queued, so that they overlap it.
                    Action::Run { seg, slot } => runs.push((seg, slot)),
                }
            }
            let ran = !runs.is_empty();
            for (seg, slot) in runs {
                let r = pipe.range(seg);
                let send = if send_used && !copy_in {
                    op.send.wrapping_add(r.start)
                } else {
                    slots[slot].cast_const()
                };
                let recv = if recv_used && !copy_out {
                    op.recv.wrapping_add(r.start)
                } else {
                    slots[slot]
                };
                let host = RawOp {
                    count: r.len() / es,
                    send,
                    recv,
                    ..*op
                };
                // SAFETY: the slot holds the segment and is ours (the lock);
                // a host side is the caller's buffer, valid for its extent.
                unsafe { st.comm().run_raw(host, None)? };
                pipe.on(Done::Ran(seg)).map_err(pipeline_bug)?;
            }
            if pipe.is_done() {
                return Ok(());
            }
            if !ran {
                let Some((done, ev)) = pending.pop_front() else {
                    return Err(pipeline_bug("stalled with nothing in flight".into()));
                };
                ev.wait().map_err(cuda_err)?;
                pipe.on(done).map_err(pipeline_bug)?;
            }
        }
    })();
    // No copy may still use the slots (or the caller's buffers) once the
    // lock is released, error or not.
    let drained = sync(drv, s_in).and(sync(drv, s_out));
    result.and(drained)
}

fn pipeline_bug(msg: String) -> Failure {
    Failure {
        code: gwInternalError,
        msg: format!("internal error: staging pipeline: {msg}"),
    }
}

/// The device data through pinned host buffers and the host operation.
fn staged(
    st: &(impl DeviceHost + ?Sized),
    op: &RawOp,
    dev: &DeviceUse,
    stream: Option<CUstream>,
    send_bytes: usize,
    recv_bytes: usize,
) -> CResult<()> {
    let drv = dev.gpu.driver();
    let rank = st.comm().rank() as usize;
    let mut bufs = st.cuda().staging.lock().unwrap_or_else(|p| p.into_inner());
    let mut host = *op;
    let in_place =
        in_place_offset(op, rank).filter(|_| dev.send.is_device() && dev.recv.is_device());
    if let Some(off) = in_place {
        // One buffer, the same layout as the caller's.
        let span = send_bytes.max(recv_bytes);
        let base = pinned(&mut bufs, drv, PIN_RECV, span)?;
        // The lower of the two starts the buffer (reduce-scatter's send,
        // all-gather's receive).
        if off >= 0 {
            host.recv = base;
            host.send = base.wrapping_offset(off);
        } else {
            host.send = base;
            host.recv = base.wrapping_offset(-off);
        }
    } else {
        if dev.recv.is_device() {
            host.recv = pinned(&mut bufs, drv, PIN_RECV, recv_bytes)?;
        }
        if dev.send.is_device() {
            host.send = pinned(&mut bufs, drv, PIN_SEND, send_bytes)?;
        }
    }
    if dev.send.is_device() && send_bytes > 0 {
        // SAFETY: extents checked above; the pinned buffer holds send_bytes.
        unsafe {
            memory::copy_dtoh(
                drv,
                host.send.cast_mut(),
                op.send as u64,
                send_bytes,
                stream,
            )
        }
        .map_err(cuda_err)?;
        if let Some(s) = stream {
            sync(drv, s)?;
        }
    }
    // SAFETY: host buffers of the extents' sizes, held (the lock) until the
    // operation ends.
    unsafe { st.comm().run_raw(host, None)? };
    let root_only = op.kind == OpKind::Reduce && op.root as usize != rank;
    if dev.recv.is_device() && !root_only {
        // SAFETY: as the copy in.
        unsafe { memory::copy_htod(drv, op.recv as u64, host.recv, recv_bytes, stream) }
            .map_err(cuda_err)?;
        if let Some(s) = stream {
            sync(drv, s)?;
        }
    }
    Ok(())
}

/// For a persistent all-reduce: its GPU, when both buffers are device
/// memory (checked, and the device idle), `None` for host memory.
pub(crate) fn device_all_reduce(
    st: &(impl DeviceHost + ?Sized),
    op: &RawOp,
) -> CResult<Option<&'static Gpu>> {
    let Some((dev, send_bytes, recv_bytes)) = device_use_of(st, op)? else {
        return Ok(None);
    };
    if !(dev.send.is_device() && dev.recv.is_device()) {
        return fail(
            gwInvalidArgument,
            "invalid argument: a persistent all-reduce takes both buffers in device memory \
             or both in host memory",
        );
    }
    settle(&dev, op, send_bytes, recv_bytes, None)?;
    Ok(Some(dev.gpu))
}

/// Whether an all-reduce on device buffers may go the IPC way, as far as
/// this rank can tell (the records decide).
pub(crate) fn ipc_possible(st: &(impl DeviceHost + ?Sized), op: &RawOp) -> bool {
    op.kind == OpKind::AllReduce
        && op.weight.is_none()
        && st.comm().size() > 1
        && st.comm().size() as usize <= gw_cuda::kernels::MAX_FAN
        && st.comm().local_size() == st.comm().size()
        && std::env::var("GW_CUDA_IPC").as_deref() != Ok("0")
}

/// Whether this all-reduce may go the IPC way, as far as this rank can
/// tell (the records decide).
fn ipc_wanted(st: &(impl DeviceHost + ?Sized), op: &RawOp) -> bool {
    // Not this rank's memory kinds: every rank on the device path must
    // make the same choice, and a rank whose buffers IPC cannot export says
    // so in its record, which sends every rank the staged way.
    ipc_possible(st, op)
}

const RECORD: usize = 176;

/// One rank's record: usable, GPU, its buffers' handles and offsets.
struct Record {
    ok: bool,
    /// The GPU's UUID (`cuDeviceGetUuid`).
    uuid: [u8; 16],
    count: u64,
    send: (IpcMemHandle, u64),
    recv: (IpcMemHandle, u64),
}

impl Record {
    fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[0] = u8::from(self.ok);
        b[160..176].copy_from_slice(&self.uuid);
        b[8..72].copy_from_slice(&self.send.0.reserved);
        b[72..80].copy_from_slice(&self.send.1.to_le_bytes());
        b[80..144].copy_from_slice(&self.recv.0.reserved);
        b[144..152].copy_from_slice(&self.recv.1.to_le_bytes());
        b[152..160].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Record {
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let handle = |i: usize| {
            let mut h = IpcMemHandle { reserved: [0; 64] };
            h.reserved.copy_from_slice(&b[i..i + 64]);
            h
        };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[160..176]);
        Record {
            ok: b[0] == 1,
            uuid,
            count: u64_at(152),
            send: (handle(8), u64_at(72)),
            recv: (handle(80), u64_at(144)),
        }
    }
}

/// This rank's handle for the allocation holding `ptr`, and the offset.
/// Handles are kept per allocation (base address and the driver's buffer
/// id, which a later allocation at the same address does not share), as
/// `cuIpcGetMemHandle` costs far more than the two lookups.
pub(crate) fn export(drv: &Driver, ptr: CUdeviceptr) -> Option<(IpcMemHandle, u64)> {
    static EXPORTED: Mutex<Option<HashMap<(u64, u64), IpcMemHandle>>> = Mutex::new(None);
    let (base, _) = memory::address_range(drv, ptr).ok()?;
    let id = memory::buffer_id(drv, base).ok()?;
    let mut cache = EXPORTED.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(h) = cache.get(&(base, id)) {
        return Some((*h, ptr - base));
    }
    let mut h = IpcMemHandle { reserved: [0; 64] };
    // SAFETY: a valid out-pointer and the base of a live allocation.
    let code = unsafe { (drv.api().ipc_get_mem_handle)(&mut h, base) };
    if code != 0 {
        return None;
    }
    cache.insert((base, id), h);
    Some((h, ptr - base))
}

/// Where the IPC all-reduce's time goes (`GW_CUDA_PROFILE=1`): totals per
/// phase, printed to stderr every 200 calls.
pub(crate) struct Profile {
    on: bool,
    t: std::time::Instant,
    phase: usize,
}

const PHASES: [&str; 6] = [
    "classify+sync",
    "export",
    "records",
    "import",
    "kernel",
    "barrier",
];

static TOTALS: Mutex<([f64; 6], u32)> = Mutex::new(([0.0; 6], 0));

impl Profile {
    pub(crate) fn start(t: std::time::Instant) -> Profile {
        Profile {
            on: std::env::var("GW_CUDA_PROFILE").as_deref() == Ok("1"),
            t,
            phase: 0,
        }
    }

    fn mark(&mut self) {
        if !self.on {
            return;
        }
        let now = std::time::Instant::now();
        let mut tot = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
        tot.0[self.phase] += (now - self.t).as_secs_f64();
        self.t = now;
        self.phase += 1;
        if self.phase == PHASES.len() {
            tot.1 += 1;
            if tot.1 == 200 {
                let line: Vec<String> = PHASES
                    .iter()
                    .zip(tot.0)
                    .map(|(p, s)| format!("{p} {:.1}", s / 200.0 * 1e6))
                    .collect();
                eprintln!(
                    "gradwire cuda ipc profile (µs per call over 200): {}",
                    line.join(", ")
                );
                *tot = ([0.0; 6], 0);
            }
        }
    }
}

/// A peer's buffer mapped into this process (opened once per handle).
pub(crate) fn import(
    st: &(impl DeviceHost + ?Sized),
    drv: &Driver,
    peer: u32,
    h: &(IpcMemHandle, u64),
) -> CResult<CUdeviceptr> {
    let mut opened = st.cuda().opened.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(base) = opened.get(&(peer, h.0.reserved)) {
        return Ok(base + h.1);
    }
    let mut base = 0;
    // SAFETY: a handle exported by the peer; flag 1 is
    // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
    let code = unsafe { (drv.api().ipc_open_mem_handle)(&mut base, h.0, 1) };
    drv.check("cuIpcOpenMemHandle", code, &format!("rank {peer}'s buffer"))
        .map_err(cuda_err)?;
    opened.insert((peer, h.0.reserved), base);
    Ok(base + h.1)
}

fn elem(d: DType) -> Option<Elem> {
    Some(match d {
        DType::F32 => Elem::F32,
        DType::F64 => Elem::F64,
        DType::F16 => Elem::F16,
        DType::Bf16 => Elem::Bf16,
        DType::I32 => Elem::I32,
        DType::I64 => Elem::I64,
        DType::U8 => Elem::U8,
        DType::Bytes => return None,
    })
}

fn binop(r: RedOp) -> Option<Op> {
    Some(match r {
        RedOp::Sum | RedOp::Avg => Op::Sum,
        RedOp::Prod => Op::Prod,
        RedOp::Min => Op::Min,
        RedOp::Max => Op::Max,
        RedOp::None => return None,
    })
}

/// A small host operation on this communicator (the records, barriers).
fn host_op(
    st: &(impl DeviceHost + ?Sized),
    kind: OpKind,
    count: usize,
    send: *const u8,
    recv: *mut u8,
) -> CResult<()> {
    let op = RawOp {
        kind,
        dtype: DType::Bytes,
        redop: RedOp::None,
        count,
        root: 0,
        send,
        recv,
        weight: None,
    };
    // SAFETY: buffers of the layout's sizes, alive for the call.
    unsafe { st.comm().run_raw(op, None)? };
    Ok(())
}

/// The IPC all-reduce; `Ok(false)` when some rank cannot take it (every
/// rank then takes the staged way).
fn all_reduce_ipc(
    st: &(impl DeviceHost + ?Sized),
    op: &RawOp,
    gpu: &'static Gpu,
    stream: CUstream,
    mut prof: Profile,
) -> CResult<bool> {
    prof.mark();
    let Some(plan) = IpcPlan::exchange(st, op, gpu, &mut prof)? else {
        return Ok(false);
    };
    prof.mark();
    // Rank 0's outcome: 0 done, 1 could not map a peer's buffer (nothing
    // written: every rank takes the staged way), 2 its kernel failed.
    let (status, why) = match &plan.fan {
        None => (0, None),
        Some(Err(e)) => (1, Some(e.msg.clone())),
        Some(Ok(fan)) => match fan
            .launch(gpu, stream)
            .and_then(|_| sync(gpu.driver(), stream))
        {
            Ok(()) => (0, None),
            Err(e) => (2, Some(e.msg)),
        },
    };
    prof.mark();
    // Every rank hears the outcome here, and none returns before its
    // receive buffer holds the result (and no rank reads its send buffer
    // any more): this all-reduce is the barrier.
    let agreed = agree(st, status)?;
    prof.mark();
    match agreed {
        0 => Ok(true),
        1 => {
            if let Some(w) = why {
                tracing::warn!("device all-reduce staged through the host: {w}");
            }
            Ok(false)
        }
        _ => Err(Failure {
            code: gwSystemError,
            msg: match why {
                Some(w) => format!("the device all-reduce's kernel failed on this rank: {w}"),
                None => "rank 0's device all-reduce kernel failed (its message names why)".into(),
            },
        }),
    }
}

/// The largest of every rank's `status`: one small host all-reduce that
/// every rank reaches whatever happened on it, so no rank is left waiting
/// in a host collective the others skipped.
pub(crate) fn agree(st: &(impl DeviceHost + ?Sized), status: i32) -> CResult<i32> {
    let mut v = [status];
    let op = RawOp {
        kind: OpKind::AllReduce,
        dtype: DType::I32,
        redop: RedOp::Max,
        count: 1,
        root: 0,
        send: v.as_ptr().cast(),
        recv: v.as_mut_ptr().cast(),
        weight: None,
    };
    // SAFETY: one element, alive for the call.
    unsafe { st.comm().run_raw(op, None)? };
    Ok(v[0])
}

/// What rank 0's kernel needs: every rank's buffers in this process.
pub(crate) struct Fan {
    e: Elem,
    op: Op,
    sends: Vec<CUdeviceptr>,
    recvs: Vec<CUdeviceptr>,
    count: u64,
    div: Option<f64>,
}

impl Fan {
    pub(crate) fn launch(&self, gpu: &Gpu, stream: CUstream) -> CResult<()> {
        gpu.fan(
            self.e,
            self.op,
            &self.recvs,
            &self.sends,
            self.count,
            self.div,
            stream,
        )
        .map_err(cuda_err)
    }
}

/// An all-reduce every rank can run over IPC: one rank (0) does the GPU's
/// work for all, since the ranks share one GPU and splitting it would only
/// add context switches between processes. Its fan kernel reads every
/// rank's send buffer once and writes every rank's receive buffer once:
/// 2·n·bytes, the least there is.
pub(crate) struct IpcPlan {
    /// Rank 0's kernel, or why its peers' buffers could not be mapped;
    /// `None` on the other ranks. An error here is not returned at once:
    /// the other ranks must hear of it first (see [`agree`]).
    pub(crate) fan: Option<CResult<Fan>>,
}

impl IpcPlan {
    /// Exchanges the records; `None` when some rank cannot take part.
    pub(crate) fn exchange(
        st: &(impl DeviceHost + ?Sized),
        op: &RawOp,
        gpu: &'static Gpu,
        prof: &mut Profile,
    ) -> CResult<Option<IpcPlan>> {
        let drv = gpu.driver();
        let (n, rank) = (st.comm().size() as usize, st.comm().rank() as usize);
        let (e, bop) = match (elem(op.dtype), binop(op.redop)) {
            (Some(e), Some(b)) => (e, b),
            _ => return Ok(None),
        };
        let send = export(drv, op.send as u64);
        let recv = if op.recv.cast_const() == op.send {
            send
        } else {
            export(drv, op.recv as u64)
        };
        prof.mark();
        let none = (IpcMemHandle { reserved: [0; 64] }, 0);
        let mine = Record {
            // Only rank 0 launches the kernel, so only it needs them compiled.
            ok: send.is_some() && recv.is_some() && (rank != 0 || gpu.prepare().is_ok()),
            uuid: gpu.uuid,
            count: op.count as u64,
            send: send.unwrap_or(none),
            recv: recv.unwrap_or(none),
        };
        let mut all = vec![0u8; RECORD * n];
        host_op(
            st,
            OpKind::AllGather,
            RECORD,
            mine.encode().as_ptr(),
            all.as_mut_ptr(),
        )?;
        let recs: Vec<Record> = all.chunks(RECORD).map(Record::decode).collect();
        prof.mark();
        if let Some((r, x)) = recs
            .iter()
            .enumerate()
            .find(|(_, x)| x.count != op.count as u64)
        {
            return fail(
                gwInvalidUsage,
                format!(
                    "all-reduce count mismatch: rank {rank} has {}, rank {r} has {}",
                    op.count, x.count
                ),
            );
        }
        // The same physical GPU: ordinals differ between processes with
        // different CUDA_VISIBLE_DEVICES, UUIDs do not.
        if !recs.iter().all(|x| x.ok && x.uuid == gpu.uuid) {
            return Ok(None);
        }
        if rank != 0 {
            return Ok(Some(IpcPlan { fan: None }));
        }
        let mapped = (|| -> CResult<(Vec<CUdeviceptr>, Vec<CUdeviceptr>)> {
            let mut sends = Vec::with_capacity(n);
            let mut recvs = Vec::with_capacity(n);
            for (r, x) in recs.iter().enumerate() {
                if r == rank {
                    sends.push(op.send as u64);
                    recvs.push(op.recv as u64);
                } else {
                    sends.push(import(st, drv, r as u32, &x.send)?);
                    recvs.push(import(st, drv, r as u32, &x.recv)?);
                }
            }
            Ok((sends, recvs))
        })();
        let (sends, recvs) = match mapped {
            Ok(m) => m,
            Err(e) => return Ok(Some(IpcPlan { fan: Some(Err(e)) })),
        };
        Ok(Some(IpcPlan {
            fan: Some(Ok(Fan {
                e,
                op: bop,
                sends,
                recvs,
                count: op.count as u64,
                div: (op.redop == RedOp::Avg).then_some(n as f64),
            })),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let mut h = IpcMemHandle { reserved: [0; 64] };
        h.reserved[0] = 7;
        h.reserved[63] = 9;
        let r = Record {
            ok: true,
            uuid: [3; 16],
            count: 1 << 40,
            send: (h, 12),
            recv: (h, 1 << 33),
        };
        let d = Record::decode(&r.encode());
        assert!(d.ok);
        assert_eq!(
            (d.uuid, d.count, d.send.1, d.recv.1),
            ([3; 16], 1 << 40, 12, 1 << 33)
        );
        assert_eq!(d.send.0, h);
    }

    #[test]
    fn in_place_layouts_are_recognised() {
        let mut buf = vec![0u8; 64];
        let p = buf.as_mut_ptr();
        let mk = |kind, send: *const u8, recv: *mut u8| RawOp {
            kind,
            dtype: DType::F32,
            redop: RedOp::Sum,
            count: 4,
            root: 0,
            send,
            recv,
            weight: None,
        };
        assert_eq!(in_place_offset(&mk(OpKind::AllReduce, p, p), 1), Some(0));
        assert_eq!(
            in_place_offset(&mk(OpKind::AllGather, p.wrapping_add(16), p), 1),
            Some(16)
        );
        assert_eq!(
            in_place_offset(&mk(OpKind::ReduceScatter, p, p.wrapping_add(32)), 2),
            Some(-32)
        );
        assert_eq!(in_place_offset(&mk(OpKind::AllGather, p, p), 1), None);
        assert_eq!(extents(&mk(OpKind::ReduceScatter, p, p), 3, 0), (48, 16));
        assert_eq!(extents(&mk(OpKind::AllGather, p, p), 3, 0), (16, 48));
    }
}
