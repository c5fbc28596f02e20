//! The protection domain and memory registration.
//!
//! A registration pins pages and gives the device keys for them: the `lkey`
//! that local work requests name, and the `rkey` a peer needs to write into
//! them (published as the seam's `RemoteRegion`). The device reads and
//! writes registered memory behind the compiler's back for as long as the
//! registration lives, which no Rust lifetime can express: so
//! [`ProtectionDomain::register`] is `unsafe` and states the contract, and
//! everything after it (slices of a region, posts) is bounds-checked and
//! safe. [`RegisteredBuffer`] is memory this crate allocates and registers
//! itself, for control messages and tests.

use crate::device::{Context, Hca};
use crate::error::{Errno, Error, Result};
use crate::qp_plan::ACCESS;
use std::alloc::Layout;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// A protection domain; freed once its last registration and queue pair
/// are gone.
pub(crate) struct Pd {
    pub(crate) pd: *mut rdma_sys::ibv_pd,
    pub(crate) ctx: Arc<Context>,
}

// SAFETY: protection domains may be used from any thread (libibverbs is
// thread-safe); no reference into the C struct is handed out.
unsafe impl Send for Pd {}
// SAFETY: as for Send.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: pd came from ibv_alloc_pd; every MR and QP of it holds an
        // Arc of this Pd, so none is left.
        let rc = unsafe { rdma_sys::ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.name, "ibv_dealloc_pd failed: {}", crate::sys::rc_errno(rc));
        }
    }
}

/// What memory registrations and queue pairs are made in.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) pd: Arc<Pd>,
}

impl Hca {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        // SAFETY: the context is open (the Hca holds it).
        let pd = unsafe { rdma_sys::ibv_alloc_pd(self.ctx.ctx) };
        if pd.is_null() {
            return Err(Error::AllocPd {
                call: "ibv_alloc_pd",
                errno: Errno::last(),
            });
        }
        Ok(ProtectionDomain {
            pd: Arc::new(Pd {
                pd,
                ctx: self.ctx.clone(),
            }),
        })
    }
}

impl ProtectionDomain {
    /// Registers `[ptr, ptr + len)` for local writes and remote reads and
    /// writes. A failure with `EPERM` or `ENOMEM` is almost always the
    /// locked-memory limit, and the error says so.
    ///
    /// # Safety
    /// The memory must stay allocated until the returned region is dropped
    /// and every work request using it has completed; and while it is
    /// registered it must not be read or written through Rust references
    /// in a way that races with a transfer the device may be doing into or
    /// out of it (including a peer's one-sided write: a peer holding the
    /// `rkey` may write at any time the caller's protocol allows).
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<MemoryRegion> {
        // SAFETY: the pd is alive; the caller promised the range is valid
        // memory of this process for as long as the registration lives.
        let mr = unsafe { rdma_sys::ibv_reg_mr(self.pd.pd, ptr.cast(), len, ACCESS as i32) };
        if mr.is_null() {
            return Err(Error::RegMr {
                call: "ibv_reg_mr",
                addr: ptr as u64,
                len,
                errno: Errno::last(),
            });
        }
        // SAFETY: ibv_reg_mr succeeded, so mr points to a valid ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(MemoryRegion {
            mr,
            addr: ptr as u64,
            len,
            lkey,
            rkey,
            _pd: self.pd.clone(),
        })
    }

    /// Allocates `len` zeroed bytes (page-aligned, at least one byte) and
    /// registers them.
    pub fn alloc_buffer(&self, len: usize) -> Result<RegisteredBuffer> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::InvalidArgument(format!("a buffer of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::InvalidArgument(format!(
                "could not allocate a buffer of {len} bytes"
            )));
        }
        // SAFETY: the allocation lives until RegisteredBuffer's drop, which
        // deregisters first; Rust code reaches it only through the buffer's
        // unsafe accessors, whose callers promise no transfer is racing.
        match unsafe { self.register(ptr, len.max(1)) } {
            Ok(mr) => Ok(RegisteredBuffer {
                mr: ManuallyDrop::new(mr),
                ptr,
                layout,
            }),
            Err(e) => {
                // SAFETY: allocated above with this layout, never registered.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Err(e)
            }
        }
    }
}

/// A registered memory range; deregistered on drop.
pub struct MemoryRegion {
    mr: *mut rdma_sys::ibv_mr,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    _pd: Arc<Pd>,
}

// SAFETY: a registration may be used and dropped from any thread; the raw
// pointer is only passed back to libibverbs.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared use only reads the keys and bounds copied out at creation.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: mr came from ibv_reg_mr and is deregistered once.
        let rc = unsafe { rdma_sys::ibv_dereg_mr(self.mr) };
        if rc != 0 {
            tracing::warn!(
                "ibv_dereg_mr of {} bytes at {:#x} failed: {}",
                self.len,
                self.addr,
                crate::sys::rc_errno(rc)
            );
        }
    }
}

/// A peer's registered memory, as its grant or published region says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

/// A bounds-checked part of a local registration, for one work request.
#[derive(Clone, Copy, Debug)]
pub struct Slice<'a> {
    addr: u64,
    len: u32,
    lkey: u32,
    _region: PhantomData<&'a MemoryRegion>,
}

impl Slice<'_> {
    /// The bytes `[addr, addr + len)` of a registration whose local key is
    /// `lkey`, for callers that keep registrations apart from the pointers
    /// into them (a transport's table of regions).
    ///
    /// # Safety
    /// The range lies inside a live registration with that key, which
    /// outlives every work request posted with the slice.
    pub unsafe fn from_raw(addr: u64, len: u32, lkey: u32) -> Slice<'static> {
        Slice {
            addr,
            len,
            lkey,
            _region: PhantomData,
        }
    }

    /// The scatter-gather entry naming it.
    pub(crate) fn sge(&self) -> rdma_sys::ibv_sge {
        rdma_sys::ibv_sge {
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Checks that `[offset, offset + len)` lies within a region of
/// `region_len` bytes and that one work request can carry it (2^31 bytes,
/// the largest message verbs allow).
pub fn check_slice(region_len: usize, offset: usize, len: usize) -> Result<u32> {
    let end = offset.checked_add(len);
    if end.is_none_or(|e| e > region_len) {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes at offset {offset} run past the end of a {region_len}-byte registration"
        )));
    }
    if len > 1 << 31 {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes is more than one work request carries (2 GiB): cut it into segments"
        )));
    }
    Ok(len as u32)
}

impl MemoryRegion {
    /// Its start address, as peers name it in writes.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The key a peer needs to write into or read from it.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Where a peer writes to reach `offset` in it.
    pub fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr + offset,
            rkey: self.rkey,
        }
    }

    /// `len` bytes at `offset`, for a work request.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Slice<'_>> {
        let len = check_slice(self.len, offset, len)?;
        Ok(Slice {
            addr: self.addr + offset as u64,
            len,
            lkey: self.lkey,
            _region: PhantomData,
        })
    }
}

/// Registered memory this crate allocated; freed after it is deregistered.
pub struct RegisteredBuffer {
    /// Dropped by hand, before the memory is freed.
    mr: ManuallyDrop<MemoryRegion>,
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer owns its allocation; moving it to another thread moves
// that ownership.
unsafe impl Send for RegisteredBuffer {}

impl RegisteredBuffer {
    /// Its registration.
    pub fn region(&self) -> &MemoryRegion {
        &self.mr
    }

    pub fn len(&self) -> usize {
        self.region().len()
    }

    pub fn is_empty(&self) -> bool {
        self.region().is_empty()
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its bytes.
    ///
    /// # Safety
    /// No transfer into the buffer (a posted receive, a peer's write) may be
    /// in progress while the slice lives.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of at least len bytes, and the
        // caller promised nothing writes it meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len()) }
    }

    /// Its bytes, to fill before a send or write.
    ///
    /// # Safety
    /// No transfer into or out of the buffer may be in progress while the
    /// slice lives.
    pub unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for bytes, and &mut self makes this the only Rust
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len()) }
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        // SAFETY: the region is dropped exactly once, here, and never used
        // after.
        unsafe { ManuallyDrop::drop(&mut self.mr) };
        // SAFETY: allocated in alloc_buffer with this layout, and no longer
        // registered, so the device can no longer reach it.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_inside_their_region() {
        assert_eq!(check_slice(4096, 0, 4096).unwrap(), 4096);
        assert_eq!(check_slice(4096, 4096, 0).unwrap(), 0);
        assert_eq!(check_slice(4096, 100, 10).unwrap(), 10);
        let e = check_slice(4096, 4000, 100).unwrap_err().to_string();
        assert_eq!(
            e,
            "100 bytes at offset 4000 run past the end of a 4096-byte registration"
        );
        assert!(check_slice(4096, usize::MAX, 2).is_err());
        assert!(check_slice(usize::MAX, 0, (1 << 31) + 1).is_err());
        assert_eq!(check_slice(usize::MAX, 0, 1 << 31).unwrap(), 1 << 31);
    }
}
