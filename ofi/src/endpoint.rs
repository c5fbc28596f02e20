//! One RDM endpoint with its completion queue and address vector, and the
//! non-blocking data calls on it.
//!
//! Every data call returns at once: `Ok(())` when posted, [`Error::Again`]
//! when the provider (or this endpoint's table of operation contexts) has
//! no room, so the caller reads completions and posts again. Completions
//! come back from [`Endpoint::poll_cq`] carrying the `u64` context the
//! caller gave.
//!
//! Operation contexts: under the `FI_CONTEXT`/`FI_CONTEXT2` modes the
//! provider uses a `struct fi_context2` per operation as scratch space
//! until the operation completes. The endpoint owns a fixed table of them
//! (as many as the transmit and receive queues hold), hands one to each
//! posted operation and takes it back when its completion is read, so the
//! caller never manages that memory. The table is freed only after the
//! endpoint is closed, so an operation still in flight at drop never
//! writes into freed memory.
//!
//! Sleeping: the completion queue is opened with `FI_WAIT_FD` where the
//! provider allows it. An outer poller (the engine's `mio::Poll`) watches
//! [`Endpoint::wait_fd`], and before sleeping calls [`Endpoint::trywait`]:
//! only when it says `true` may it sleep, since a manual-progress
//! provider may have completions the fd does not announce.

use crate::error::{Error, FiCall, Result};
use crate::fabric::{Domain, DomainCore};
use crate::ffi::{self, CQ_BATCH, Fid, FidAv, FidCq, FidEp, GwCqErr, GwCqe};
use crate::info::Info;
use crate::linger::{self, Closable, Registry};
use crate::mr::{Mr, MrDesc, register};
use crate::{c_text, fi_call};
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::Arc;

/// A peer's address in this endpoint's address vector (`fi_addr_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FiAddr(pub u64);

/// Where a one-sided operation lands: the peer, the address inside its
/// region (what its [`Mr::remote_addr`] said) and the region's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// The peer.
    pub dest: FiAddr,
    /// Remote address: virtual address or offset, as the peer's region says.
    pub addr: u64,
    /// The peer region's key.
    pub key: u64,
}

/// One completion from [`Endpoint::poll_cq`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// The context the operation was posted with; `None` for completions
    /// of no posted operation (a peer's immediate data, where the mode is
    /// not `FI_RX_CQ_DATA`).
    pub ctx: Option<u64>,
    /// `FI_SEND`, `FI_RECV`, `FI_RMA`, `FI_WRITE`, `FI_READ`,
    /// `FI_REMOTE_WRITE`, `FI_REMOTE_CQ_DATA`, `FI_MSG`, ...
    pub flags: u64,
    /// Bytes received (receives); providers may leave it 0 otherwise.
    pub len: usize,
    /// The peer's immediate data, where `flags` has `FI_REMOTE_CQ_DATA`.
    pub data: u64,
}

/// How an endpoint is opened.
#[derive(Clone, Debug)]
pub struct EpConfig {
    /// Peers the address vector is sized for (it may grow).
    pub av_count: usize,
    /// Completion queue entries; `None`: transmit plus receive queue size.
    pub cq_size: Option<usize>,
    /// Ask for a completion queue with a file descriptor to sleep on.
    pub wait_fd: bool,
}

impl Default for EpConfig {
    fn default() -> Self {
        EpConfig {
            av_count: 256,
            cq_size: None,
            wait_fd: true,
        }
    }
}

/// Storage for one `struct fi_context2` (8 pointers), written by the
/// provider through the pointer it was given, never read by Rust.
#[repr(C, align(64))]
struct CtxSlot(UnsafeCell<[u64; 8]>);

/// Most operation contexts per direction.
const MAX_CTX_PER_QUEUE: usize = 8192;

pub(crate) struct EpCore {
    domain: Arc<DomainCore>,
    pub(crate) ep: *mut FidEp,
    cq: *mut FidCq,
    av: *mut FidAv,
    // Dropped after Drop::drop closed the endpoint.
    slots: Box<[CtxSlot]>,
    /// Its id in [`LINGERING`], for providers whose endpoints linger (see
    /// `linger.rs`).
    linger_id: Option<u64>,
}

// SAFETY: the endpoint, its CQ and AV are used only under the domain's
// lock; the slots are memory the provider writes into and Rust never
// reads, owned here so that they outlive the endpoint.
unsafe impl Send for EpCore {}
// SAFETY: as above.
unsafe impl Sync for EpCore {}

impl EpCore {
    /// The endpoint's address (fi_getname).
    fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        for _ in 0..2 {
            let mut len = buf.len();
            let ret = {
                let _g = self.domain.lock();
                // SAFETY: ep is live; buf is writable for len bytes.
                unsafe { ffi::gw_ofi_getname(self.ep, buf.as_mut_ptr().cast(), &mut len) }
            };
            if ret == 0 {
                buf.truncate(len);
                return Ok(buf);
            }
            if len <= buf.len() {
                return Err(Error::GetName(fi_call("fi_getname", ret as isize)));
            }
            buf.resize(len, 0);
        }
        Err(Error::GetName(fi_call(
            "fi_getname",
            -(ffi::FI_ETOOSMALL as isize),
        )))
    }
}

impl Drop for EpCore {
    fn drop(&mut self) {
        let ep = Closable {
            domain: self.domain.clone(),
            ep: std::mem::replace(&mut self.ep, std::ptr::null_mut()),
            av: std::mem::replace(&mut self.av, std::ptr::null_mut()),
            cq: std::mem::replace(&mut self.cq, std::ptr::null_mut()),
            slots: std::mem::take(&mut self.slots),
        };
        match self.linger_id {
            Some(id) => LINGERING.close(id, ep),
            None => ep.close(),
        }
    }
}

/// Endpoints of providers that reach same-process peers through their
/// memory, closed only once none of them is open (see `linger.rs`).
static LINGERING: Registry<Box<[CtxSlot]>> = Registry::new();

/// Endpoints closed by their owner but kept open while an open endpoint of
/// this process has them as a peer (see `linger.rs`).
pub fn lingering_endpoints() -> usize {
    LINGERING.lingering()
}

/// An RDM endpoint bound to one completion queue and one address vector.
pub struct Endpoint {
    core: Arc<EpCore>,
    wait_fd: Option<RawFd>,
    wait_refused: Option<FiCall>,
    // Per context slot: the caller's context while in flight.
    user: Vec<Option<u64>>,
    free: Vec<u32>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.info().provider)
            .field("wait_fd", &self.wait_fd)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Endpoint {
    /// Opens an endpoint on `domain`, with its completion queue
    /// (`FI_CQ_FORMAT_DATA`, `FI_WAIT_FD` when asked for and allowed,
    /// else `FI_WAIT_NONE`) and an `FI_AV_TABLE` address vector.
    pub fn open(domain: &Domain, config: &EpConfig) -> Result<Endpoint> {
        // A dead process with this pid may have left shm regions that
        // would make fi_enable fail with EBUSY (see `stale.rs`).
        crate::stale::remove_leftovers();
        let d = &domain.core;
        let info = d.info();
        let queue = |n: usize| n.clamp(64, MAX_CTX_PER_QUEUE);
        let nslots = queue(info.tx_size) + queue(info.rx_size);
        let slots: Box<[CtxSlot]> = (0..nslots)
            .map(|_| CtxSlot(UnsafeCell::new([0; 8])))
            .collect();
        let mut core = EpCore {
            domain: d.clone(),
            ep: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            av: std::ptr::null_mut(),
            slots,
            linger_id: None,
        };
        let cq_size = config
            .cq_size
            .unwrap_or(info.tx_size.saturating_add(info.rx_size))
            .max(64);
        let mut wait_fd = None;
        let mut wait_refused = None;
        {
            let _g = d.lock();
            if config.wait_fd {
                match open_cq(d, cq_size, true) {
                    Ok(cq) => {
                        let mut fd = -1;
                        // SAFETY: cq is live; fd is writable.
                        let ret = unsafe { ffi::gw_ofi_cq_wait_fd(cq, &mut fd) };
                        if ret == 0 && fd >= 0 {
                            core.cq = cq;
                            wait_fd = Some(fd);
                        } else {
                            wait_refused = Some(fi_call("fi_control(FI_GETWAIT)", ret as isize));
                            // SAFETY: cq was opened above and is not used again.
                            unsafe { ffi::gw_ofi_close(cq.cast::<Fid>()) };
                        }
                    }
                    Err(call) => wait_refused = Some(call),
                }
            }
            if core.cq.is_null() {
                core.cq = open_cq(d, cq_size, false).map_err(Error::Cq)?;
            }
            // SAFETY: the domain is live and locked; av receives the
            // object, closed by EpCore.
            let ret = unsafe { ffi::gw_ofi_av_open(d.domain, config.av_count, &mut core.av) };
            if ret != 0 {
                return Err(Error::Av(fi_call("fi_av_open", ret as isize)));
            }
            // SAFETY: as above, with the fi_info the fabric was opened from.
            let ret = unsafe { ffi::gw_ofi_ep_open(d.domain, d.fabric.raw_info.0, &mut core.ep) };
            if ret != 0 {
                return Err(Error::Endpoint(fi_call("fi_endpoint", ret as isize)));
            }
            // SAFETY: ep, cq and av are live objects of this domain.
            let ret = unsafe { ffi::gw_ofi_ep_setup(core.ep, core.cq, core.av) };
            if ret != 0 {
                return Err(Error::Endpoint(fi_call(
                    "fi_ep_bind/fi_enable",
                    ret as isize,
                )));
            }
        }
        if linger::needed(&info.provider) {
            core.linger_id = Some(LINGERING.opened(core.name()?));
        }
        Ok(Endpoint {
            core: Arc::new(core),
            wait_fd,
            wait_refused,
            user: vec![None; nslots],
            free: (0..nslots as u32).rev().collect(),
        })
    }

    /// What fi_getinfo negotiated.
    pub fn info(&self) -> &Info {
        self.core.domain.info()
    }

    /// The completion queue's file descriptor, when it has one.
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.wait_fd
    }

    /// Why the completion queue has no file descriptor, when it was asked
    /// for and the provider refused.
    pub fn wait_refused(&self) -> Option<&FiCall> {
        self.wait_refused.as_ref()
    }

    /// fi_trywait: `true` when the caller may sleep on [`Self::wait_fd`],
    /// `false` when it must read the completion queue first.
    pub fn trywait(&self) -> Result<bool> {
        if self.wait_fd.is_none() {
            return Err(Error::Usage(
                "the completion queue has no wait fd".to_owned(),
            ));
        }
        let _g = self.core.domain.lock();
        // SAFETY: fabric and cq are live; the domain is locked.
        let ret = unsafe { ffi::gw_ofi_trywait(self.core.domain.fabric.fabric, self.core.cq) };
        match ret {
            0 => Ok(true),
            r if r == -ffi::FI_EAGAIN => Ok(false),
            r => Err(Error::CqRead(fi_call("fi_trywait", r as isize))),
        }
    }

    /// This endpoint's address, to publish to peers.
    pub fn name(&self) -> Result<Vec<u8>> {
        self.core.name()
    }

    /// Adds a peer's [`Self::name`] to the address vector.
    pub fn insert_peer(&mut self, name: &[u8]) -> Result<FiAddr> {
        if let Some(id) = self.core.linger_id {
            LINGERING.peer_added(id, name);
        }
        let mut out = 0u64;
        let ret = {
            let _g = self.core.domain.lock();
            // SAFETY: av is live; name is readable for its length, which
            // the provider knows from its address format.
            unsafe { ffi::gw_ofi_av_insert(self.core.av, name.as_ptr().cast(), &mut out) }
        };
        if ret != 0 {
            return Err(Error::AvInsert {
                len: name.len(),
                call: fi_call("fi_av_insert", ret as isize),
            });
        }
        Ok(FiAddr(out))
    }

    /// Registers memory, bound to this endpoint where the provider asks
    /// for `FI_MR_ENDPOINT` (see [`Domain::register`]).
    ///
    /// # Safety
    ///
    /// As [`Domain::register`]: the memory stays valid until the [`Mr`]
    /// is dropped and no transfer using it is in flight.
    pub unsafe fn register(&self, ptr: *const u8, len: usize, access: u64) -> Result<Mr> {
        // SAFETY: the caller's promise is passed on.
        unsafe { register(&self.core.domain, Some(&self.core), ptr, len, access, None) }
    }

    /// Operations posted whose completion has not been read yet.
    pub fn in_flight(&self) -> usize {
        self.user.len() - self.free.len()
    }

    /// Posts one operation with a context slot: `f` gets the slot's
    /// pointer and makes the call.
    fn post(
        &mut self,
        call: &'static str,
        ctx: u64,
        f: impl FnOnce(*mut c_void) -> isize,
    ) -> Result<()> {
        let Some(slot) = self.free.pop() else {
            return Err(Error::Again);
        };
        let p = self.core.slots[slot as usize].0.get().cast::<c_void>();
        let ret = {
            let _g = self.core.domain.lock();
            f(p)
        };
        if ret == 0 {
            self.user[slot as usize] = Some(ctx);
            return Ok(());
        }
        self.free.push(slot);
        if ret == -(ffi::FI_EAGAIN as isize) {
            Err(Error::Again)
        } else {
            Err(Error::Post(fi_call(call, ret)))
        }
    }

    /// The caller's context of a completed operation's slot pointer, and
    /// the slot freed; `None` for a pointer that is not one of ours.
    fn finish(&mut self, p: u64) -> Option<u64> {
        let base = self.core.slots.as_ptr() as u64;
        let size = std::mem::size_of::<CtxSlot>() as u64;
        let off = p.checked_sub(base)?;
        if off % size != 0 {
            return None;
        }
        let i = usize::try_from(off / size).ok()?;
        let ctx = self.user.get_mut(i)?.take()?;
        self.free.push(i as u32);
        Some(ctx)
    }

    /// fi_send of `[buf, buf+len)` to `dest`.
    ///
    /// # Safety
    ///
    /// The buffer must stay valid and unmodified until this operation's
    /// completion is read from [`Self::poll_cq`] (or the endpoint is
    /// dropped); `desc` must come from a live [`Mr`] covering it, where the
    /// provider has `FI_MR_LOCAL`.
    pub unsafe fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        desc: Option<MrDesc>,
        dest: FiAddr,
        ctx: u64,
    ) -> Result<()> {
        let ep = self.core.ep;
        self.post("fi_send", ctx, |c| {
            // SAFETY: ep is live and the domain locked; the caller vouches
            // for the buffer; c is a context slot owned until completion.
            unsafe { ffi::gw_ofi_send(ep, buf.cast(), len, raw_desc(desc), dest.0, c) }
        })
    }

    /// fi_inject: sends a copy of `buf` (at most `inject_size` bytes); no
    /// completion is generated and `buf` may be reused at once.
    pub fn inject(&mut self, buf: &[u8], dest: FiAddr) -> Result<()> {
        let max = self.info().inject_size;
        if buf.len() > max {
            return Err(Error::Usage(format!(
                "fi_inject of {} bytes: inject_size is {max}",
                buf.len()
            )));
        }
        let ret = {
            let _g = self.core.domain.lock();
            // SAFETY: ep is live and the domain locked; the provider copies
            // buf before returning.
            unsafe { ffi::gw_ofi_inject(self.core.ep, buf.as_ptr().cast(), buf.len(), dest.0) }
        };
        match ret {
            0 => Ok(()),
            r if r == -(ffi::FI_EAGAIN as isize) => Err(Error::Again),
            r => Err(Error::Post(fi_call("fi_inject", r))),
        }
    }

    /// fi_recv into `[buf, buf+len)` from any peer. Under `FI_RX_CQ_DATA`
    /// a peer's immediate data also consumes a posted receive.
    ///
    /// # Safety
    ///
    /// The buffer must stay valid, and not be read or written by anyone
    /// else, until this operation's completion is read (or the endpoint is
    /// dropped); `desc` as for [`Self::send`].
    pub unsafe fn recv(
        &mut self,
        buf: *mut u8,
        len: usize,
        desc: Option<MrDesc>,
        ctx: u64,
    ) -> Result<()> {
        let ep = self.core.ep;
        self.post("fi_recv", ctx, |c| {
            // SAFETY: as in send, for a buffer the provider may write.
            unsafe { ffi::gw_ofi_recv(ep, buf.cast(), len, raw_desc(desc), c) }
        })
    }

    /// fi_write of `[buf, buf+len)` into a peer's region.
    ///
    /// # Safety
    ///
    /// As [`Self::send`].
    pub unsafe fn write(
        &mut self,
        buf: *const u8,
        len: usize,
        desc: Option<MrDesc>,
        remote: Remote,
        ctx: u64,
    ) -> Result<()> {
        let ep = self.core.ep;
        self.post("fi_write", ctx, |c| {
            // SAFETY: as in send.
            unsafe {
                ffi::gw_ofi_write(
                    ep,
                    buf.cast(),
                    len,
                    raw_desc(desc),
                    remote.dest.0,
                    remote.addr,
                    remote.key,
                    c,
                )
            }
        })
    }

    /// fi_writedata: as [`Self::write`], and the peer gets a completion
    /// with `FI_REMOTE_CQ_DATA` carrying `imm` (at most `cq_data_size`
    /// bytes of it arrive).
    ///
    /// # Safety
    ///
    /// As [`Self::send`].
    pub unsafe fn writedata(
        &mut self,
        buf: *const u8,
        len: usize,
        desc: Option<MrDesc>,
        imm: u64,
        remote: Remote,
        ctx: u64,
    ) -> Result<()> {
        let ep = self.core.ep;
        self.post("fi_writedata", ctx, |c| {
            // SAFETY: as in send.
            unsafe {
                ffi::gw_ofi_writedata(
                    ep,
                    buf.cast(),
                    len,
                    raw_desc(desc),
                    imm,
                    remote.dest.0,
                    remote.addr,
                    remote.key,
                    c,
                )
            }
        })
    }

    /// fi_read of a peer's region into `[buf, buf+len)`.
    ///
    /// # Safety
    ///
    /// As [`Self::recv`].
    pub unsafe fn read(
        &mut self,
        buf: *mut u8,
        len: usize,
        desc: Option<MrDesc>,
        remote: Remote,
        ctx: u64,
    ) -> Result<()> {
        let ep = self.core.ep;
        self.post("fi_read", ctx, |c| {
            // SAFETY: as in recv.
            unsafe {
                ffi::gw_ofi_read(
                    ep,
                    buf.cast(),
                    len,
                    raw_desc(desc),
                    remote.dest.0,
                    remote.addr,
                    remote.key,
                    c,
                )
            }
        })
    }

    /// Reads up to `out.len()` completions (at most 64 per call) and
    /// drives a manual-progress provider. `Ok(0)` when none is ready. An
    /// operation that failed is returned as [`Error::Completion`], its
    /// context freed; the completions read before it in the same call are
    /// not lost, as the error entry is only read when it is first in line.
    pub fn poll_cq(&mut self, out: &mut [Completion]) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        // Left uninitialised: zeroing a fresh 2 KiB batch on every poll was
        // 7% of a spinning engine's time over the shm provider.
        let mut raw: [MaybeUninit<GwCqe>; CQ_BATCH] = [const { MaybeUninit::uninit() }; CQ_BATCH];
        let n = out.len().min(CQ_BATCH);
        let ret = {
            let _g = self.core.domain.lock();
            // SAFETY: cq is live and the domain locked; raw holds n entries.
            unsafe { ffi::gw_ofi_cq_read(self.core.cq, raw.as_mut_ptr().cast(), n) }
        };
        if ret > 0 {
            let got = ret as usize;
            debug_assert!(got <= n, "fi_cq_read returned {got} of {n}");
            for (o, r) in out.iter_mut().zip(&raw[..got]) {
                // SAFETY: fi_cq_read filled the first `got` entries.
                let r = unsafe { r.assume_init_ref() };
                *o = Completion {
                    ctx: self.finish(r.ctx),
                    flags: r.flags,
                    len: usize::try_from(r.len).unwrap_or(usize::MAX),
                    data: r.data,
                };
            }
            return Ok(got);
        }
        if ret == 0 || ret == -(ffi::FI_EAGAIN as isize) {
            return Ok(0);
        }
        if ret != -(ffi::FI_EAVAIL as isize) {
            return Err(Error::CqRead(fi_call("fi_cq_read", ret)));
        }
        // SAFETY: GwCqErr is plain data; all-zero is valid.
        let mut e: GwCqErr = unsafe { std::mem::zeroed() };
        let ret = {
            let _g = self.core.domain.lock();
            // SAFETY: cq is live and the domain locked; e is writable.
            unsafe { ffi::gw_ofi_cq_readerr(self.core.cq, &mut e) }
        };
        if ret < 0 {
            return Err(Error::CqRead(fi_call("fi_cq_readerr", ret)));
        }
        let errno = e.err.saturating_abs();
        Err(Error::Completion {
            ctx: self.finish(e.ctx),
            flags: e.flags,
            errno,
            text: crate::strerror(errno),
            prov_errno: e.prov_errno,
            prov_text: c_text(&e.text),
        })
    }
}

/// Opens a CQ; the domain must be locked.
fn open_cq(d: &DomainCore, size: usize, wait_fd: bool) -> std::result::Result<*mut FidCq, FiCall> {
    let mut cq = std::ptr::null_mut();
    // SAFETY: the domain is live and locked by the caller; cq receives the
    // object, which the caller closes or hands to EpCore.
    let ret = unsafe { ffi::gw_ofi_cq_open(d.domain, size, i32::from(wait_fd), &mut cq) };
    if ret != 0 {
        return Err(fi_call(
            if wait_fd {
                "fi_cq_open(FI_WAIT_FD)"
            } else {
                "fi_cq_open"
            },
            ret as isize,
        ));
    }
    Ok(cq)
}

fn raw_desc(desc: Option<MrDesc>) -> *mut c_void {
    desc.map_or(std::ptr::null_mut(), |d| d.0)
}
