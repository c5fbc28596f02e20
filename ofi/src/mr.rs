//! Memory registration, honouring every mr_mode bit the provider asked
//! for, so that a caller writes the same code for verbs, EFA, TCP and shm:
//!
//! - `FI_MR_PROV_KEY`: the provider picks the key (read with fi_mr_key);
//!   otherwise the domain hands out keys no other registration asked for.
//! - `FI_MR_VIRT_ADDR`: peers address the region by virtual address;
//!   otherwise by offset from its start. [`Mr::remote_addr`] says which.
//! - `FI_MR_ENDPOINT`: the region is bound to an endpoint and enabled, so
//!   it must be registered through [`crate::Endpoint::register`].
//! - `FI_MR_LOCAL`: local buffers need [`Mr::desc`] on every transfer
//!   (given always: providers that do not need it ignore it).

use crate::endpoint::EpCore;
use crate::error::{Error, FiCall, Result};
use crate::fabric::{Domain, DomainCore};
use crate::ffi::{self, Fid, FidMr};
use crate::fi_call;
use crate::flags::*;
use std::ffi::c_void;
use std::sync::Arc;

/// A registration's local descriptor (`fi_mr_desc`), passed with a local
/// buffer to a data call. Copyable; valid while its [`Mr`] lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrDesc(pub(crate) *mut c_void);

// SAFETY: a descriptor is an opaque token the provider interprets; it is
// only handed back to the provider under the domain's lock.
unsafe impl Send for MrDesc {}
// SAFETY: as above; it is never dereferenced on the Rust side.
unsafe impl Sync for MrDesc {}

/// A registered memory region; deregistered (fi_close) on drop.
pub struct Mr {
    mr: *mut FidMr,
    domain: Arc<DomainCore>,
    // Keeps an FI_MR_ENDPOINT registration's endpoint open until the
    // registration is closed.
    _ep: Option<Arc<EpCore>>,
    key: u64,
    desc: MrDesc,
    base: usize,
    len: usize,
    access: u64,
    virt_addr: bool,
}

// SAFETY: the region is closed under the domain's lock, and its other
// fields are plain values read without calling libfabric.
unsafe impl Send for Mr {}
// SAFETY: as above; no method calls libfabric through `&self`.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .field("key", &format_args!("{:#x}", self.key))
            .field("access", &format_args!("{:#x}", self.access))
            .field("virt_addr", &self.virt_addr)
            .finish()
    }
}

impl Mr {
    /// The key a peer passes to write into or read from this region.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The descriptor to pass with local buffers inside this region.
    pub fn desc(&self) -> Option<MrDesc> {
        (!self.desc.0.is_null()).then_some(self.desc)
    }

    /// The address a peer must give to reach `ptr` inside this region:
    /// `ptr` itself under `FI_MR_VIRT_ADDR`, else its offset from the
    /// start. `None` when `ptr` lies outside the region.
    pub fn remote_addr(&self, ptr: *const u8) -> Option<u64> {
        let a = ptr as usize;
        if a < self.base || a > self.base + self.len {
            return None;
        }
        Some(if self.virt_addr {
            a as u64
        } else {
            (a - self.base) as u64
        })
    }

    /// Start of the region.
    pub fn base(&self) -> *const u8 {
        self.base as *const u8
    }

    /// Length of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registrations have bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access flags it was registered with.
    pub fn access(&self) -> u64 {
        self.access
    }

    /// Whether `[ptr, ptr+len)` lies inside the region.
    pub fn covers(&self, ptr: *const u8, len: usize) -> bool {
        let a = ptr as usize;
        a >= self.base
            && a.checked_add(len)
                .is_some_and(|end| end <= self.base + self.len)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _g = self.domain.lock();
        // SAFETY: the region was opened by fi_mr_reg and is closed once;
        // its domain (and endpoint) are kept open by the Arcs above.
        let ret = unsafe { ffi::gw_ofi_close(self.mr.cast::<Fid>()) };
        if ret != 0 {
            tracing::warn!("{}", fi_call("fi_close(mr)", ret as isize));
        }
    }
}

impl Domain {
    /// Registers `[ptr, ptr+len)` for `access` (`FI_SEND | FI_RECV |
    /// FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE`). Fails with
    /// [`Error::Usage`] where the provider asks for `FI_MR_ENDPOINT`: use
    /// [`crate::Endpoint::register`] there.
    ///
    /// # Safety
    ///
    /// The memory must stay allocated, and must not be unmapped or
    /// remapped, until the returned [`Mr`] is dropped and no transfer
    /// using it is in flight: the NIC may read or write it at any time
    /// until then.
    pub unsafe fn register(&self, ptr: *const u8, len: usize, access: u64) -> Result<Mr> {
        // SAFETY: the caller's promise is passed on.
        unsafe { register(&self.core, None, ptr, len, access, None) }
    }

    /// Registers CUDA device memory of GPU `device` (`FI_HMEM_CUDA`) for
    /// GPUDirect RDMA: the NIC reads and writes the GPU's memory directly.
    /// The fabric must have been opened with [`crate::Fabric::open_hmem`];
    /// otherwise [`Error::Usage`] says so.
    ///
    /// # Safety
    ///
    /// As [`Domain::register`], for device memory.
    pub unsafe fn register_cuda(
        &self,
        ptr: *const u8,
        len: usize,
        access: u64,
        device: i32,
    ) -> Result<Mr> {
        // SAFETY: the caller's promise is passed on.
        unsafe { register(&self.core, None, ptr, len, access, Some(device)) }
    }
}

/// `enum fi_hmem_iface`'s FI_HMEM_CUDA.
const FI_HMEM_CUDA: i32 = 1;

/// Registers on `domain`, binding to `ep` under FI_MR_ENDPOINT.
///
/// # Safety
///
/// As [`Domain::register`].
pub(crate) unsafe fn register(
    domain: &Arc<DomainCore>,
    ep: Option<&Arc<EpCore>>,
    ptr: *const u8,
    len: usize,
    access: u64,
    cuda_device: Option<i32>,
) -> Result<Mr> {
    let info = domain.info();
    let addr = ptr as usize;
    let refuse = |call: &'static str, errno: i32, text: String| Error::Register {
        addr,
        len,
        call: FiCall { call, errno, text },
    };
    if len == 0 || ptr.is_null() {
        return Err(Error::Usage(format!(
            "cannot register {len} bytes at {addr:#x}"
        )));
    }
    let bind_ep = info.mr(FI_MR_ENDPOINT);
    if bind_ep && ep.is_none() {
        return Err(Error::Usage(format!(
            "provider {} has FI_MR_ENDPOINT: register through the endpoint",
            info.provider
        )));
    }
    if cuda_device.is_some() && info.caps & FI_HMEM == 0 {
        return Err(Error::Usage(format!(
            "provider {} was opened without FI_HMEM, so it cannot register GPU memory \
             (open the fabric with Fabric::open_hmem)",
            info.provider
        )));
    }
    let prov_key = info.mr(FI_MR_PROV_KEY);
    let requested = if prov_key { 0 } else { domain.next_key() };
    let _g = domain.lock();
    let mut mr = std::ptr::null_mut();
    // SAFETY: the domain is live and locked; the caller promised the range
    // stays valid while registered; mr receives the object, closed by Mr
    // (or below on failure).
    let (ret, call) = match cuda_device {
        None => (
            unsafe {
                ffi::gw_ofi_mr_reg(domain.domain, ptr.cast(), len, access, requested, &mut mr)
            },
            "fi_mr_reg",
        ),
        // SAFETY: as above; the caller promised device memory of `device`.
        Some(device) => (
            unsafe {
                ffi::gw_ofi_mr_reg_hmem(
                    domain.domain,
                    ptr.cast(),
                    len,
                    access,
                    requested,
                    FI_HMEM_CUDA,
                    device,
                    &mut mr,
                )
            },
            "fi_mr_regattr",
        ),
    };
    if ret != 0 {
        let c = fi_call(call, ret as isize);
        return Err(refuse(c.call, c.errno, c.text));
    }
    let close = |mr: *mut FidMr| {
        // SAFETY: mr was opened above and is not used after this.
        unsafe { ffi::gw_ofi_close(mr.cast::<Fid>()) };
    };
    if let (true, Some(ep)) = (bind_ep, ep) {
        // SAFETY: mr and the endpoint are live; the domain is locked.
        let ret = unsafe { ffi::gw_ofi_mr_bind_ep(mr, ep.ep) };
        if ret != 0 {
            close(mr);
            let c = fi_call("fi_mr_bind/fi_mr_enable", ret as isize);
            return Err(refuse(c.call, c.errno, c.text));
        }
    }
    let key = if prov_key {
        // SAFETY: mr is live (and enabled, where that is needed first).
        let k = unsafe { ffi::gw_ofi_mr_key(mr) };
        if k == ffi::FI_KEY_NOTAVAIL {
            close(mr);
            return Err(refuse(
                "fi_mr_key",
                -ffi::FI_ENOSYS,
                format!(
                    "the key is larger than 64 bits (mr_key_size {})",
                    info.mr_key_size
                ),
            ));
        }
        k
    } else {
        requested
    };
    // SAFETY: mr is live.
    let desc = MrDesc(unsafe { ffi::gw_ofi_mr_desc(mr) });
    Ok(Mr {
        mr,
        domain: domain.clone(),
        _ep: if bind_ep { ep.cloned() } else { None },
        key,
        desc,
        base: addr,
        len,
        access,
        virt_addr: info.mr(FI_MR_VIRT_ADDR),
    })
}
