//! What kind of memory a pointer names, and memory owned by gradwire on
//! the device or pinned on the host.
//!
//! The C ABI takes `void *` for every buffer, as NCCL does, so each call
//! asks the driver what a pointer is (`cuPointerGetAttributes`, which,
//! unlike `cuPointerGetAttribute`, answers "unknown to CUDA" for ordinary
//! host memory instead of failing). Pageable and pinned host memory and
//! managed memory are all readable by the CPU and go the host path;
//! device memory goes the device path.

use crate::api::{CUdeviceptr, CUstream};
use crate::driver::Driver;
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void};

const ATTR_MEMORY_TYPE: c_int = 2;
const ATTR_BUFFER_ID: c_int = 7;
const ATTR_IS_MANAGED: c_int = 8;
const ATTR_DEVICE_ORDINAL: c_int = 9;
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
const MEMORYTYPE_UNIFIED: u32 = 4;

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Ordinary (pageable) host memory, unknown to CUDA.
    Host,
    /// Host memory pinned by CUDA (`cudaHostAlloc`, `cudaHostRegister`).
    PinnedHost,
    /// Managed (unified) memory: CPU-readable once the device is idle.
    Managed,
    /// Device memory of GPU `ordinal`.
    Device { ordinal: i32 },
}

impl MemKind {
    /// True for memory only the device can touch.
    pub fn is_device(self) -> bool {
        matches!(self, MemKind::Device { .. })
    }
}

/// Classifies `ptr` with the driver.
pub fn classify(drv: &Driver, ptr: *const c_void) -> Result<MemKind> {
    if ptr.is_null() {
        return Ok(MemKind::Host);
    }
    // Each value gets eight zeroed bytes: the attributes are a u32, a
    // bool and an int, all read from the low bytes (little-endian).
    let mut vals = [0u64; 3];
    let mut attrs = [ATTR_MEMORY_TYPE, ATTR_IS_MANAGED, ATTR_DEVICE_ORDINAL];
    let mut data: [*mut c_void; 3] = [
        (&mut vals[0] as *mut u64).cast(),
        (&mut vals[1] as *mut u64).cast(),
        (&mut vals[2] as *mut u64).cast(),
    ];
    // SAFETY: three attributes, three valid out-pointers of 8 bytes each.
    let code = unsafe {
        (drv.api().pointer_get_attributes)(
            3,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr as CUdeviceptr,
        )
    };
    drv.check("cuPointerGetAttributes", code, &format!("{ptr:p}"))?;
    let memtype = vals[0] as u32;
    let managed = vals[1] & 0xff != 0;
    let ordinal = vals[2] as u32 as i32;
    Ok(match memtype {
        _ if managed => MemKind::Managed,
        MEMORYTYPE_UNIFIED => MemKind::Managed,
        MEMORYTYPE_DEVICE => MemKind::Device { ordinal },
        MEMORYTYPE_HOST => MemKind::PinnedHost,
        _ => MemKind::Host,
    })
}

/// The driver's id of the allocation holding device pointer `ptr`, unique
/// for the life of the process (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): a
/// freed allocation's address may come back, its id does not.
pub fn buffer_id(drv: &Driver, ptr: CUdeviceptr) -> Result<u64> {
    let mut id = 0u64;
    let mut attr = [ATTR_BUFFER_ID];
    let mut data: [*mut c_void; 1] = [(&mut id as *mut u64).cast()];
    // SAFETY: one attribute, one 8-byte out-pointer.
    let code =
        unsafe { (drv.api().pointer_get_attributes)(1, attr.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    drv.check("cuPointerGetAttributes", code, &format!("{ptr:#x}"))?;
    Ok(id)
}

/// Whether this process can read the first and last byte of host range
/// `[ptr, ptr + bytes)`: a freed device pointer is unknown to CUDA, like
/// ordinary host memory, but lies in the driver's reserved, unreadable
/// address range. Asked of the kernel (`process_vm_readv` on this
/// process), so nothing faults.
pub fn host_readable(ptr: *const u8, bytes: usize) -> bool {
    if bytes == 0 || ptr.is_null() {
        return true;
    }
    let probe = |p: *const u8| {
        let mut byte = 0u8;
        let local = libc::iovec {
            iov_base: (&mut byte as *mut u8).cast(),
            iov_len: 1,
        };
        let remote = libc::iovec {
            iov_base: p as *mut c_void,
            iov_len: 1,
        };
        // SAFETY: reads one byte of our own address space into `byte`;
        // an unreadable address is an EFAULT, not a fault.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        // EPERM and the like (a sandbox without the call): assume readable.
        n == 1 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EFAULT)
    };
    probe(ptr) && probe(ptr.wrapping_add(bytes - 1))
}

/// The allocation `ptr` lies in: (base, size).
pub fn address_range(drv: &Driver, ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: two valid out-pointers.
    let code = unsafe { (drv.api().mem_get_address_range)(&mut base, &mut size, ptr) };
    drv.check("cuMemGetAddressRange", code, &format!("{ptr:#x}"))?;
    Ok((base, size))
}

/// Checks that `[ptr, ptr + bytes)` lies inside one device allocation, so
/// that a pointer freed or too short is named instead of faulting a kernel.
pub fn check_extent(drv: &Driver, ptr: CUdeviceptr, bytes: usize, what: &str) -> Result<()> {
    let (base, size) = address_range(drv, ptr).map_err(|e| {
        Error::Memory(format!(
            "{what} {ptr:#x} is not a live device allocation ({e})"
        ))
    })?;
    let end = ptr.checked_add(bytes as u64);
    if end.is_none_or(|end| end > base + size as u64) {
        return Err(Error::Memory(format!(
            "{what} {ptr:#x}: {bytes} bytes run past the end of its allocation \
             ({base:#x}, {size} bytes)"
        )));
    }
    Ok(())
}

/// Device memory owned by gradwire (`cuMemAlloc`), freed on drop.
#[derive(Debug)]
pub struct DeviceBuf {
    drv: &'static Driver,
    ptr: CUdeviceptr,
    bytes: usize,
}

impl DeviceBuf {
    /// Allocates `bytes` (at least 1) in the current context.
    pub fn new(drv: &'static Driver, bytes: usize) -> Result<DeviceBuf> {
        let mut ptr = 0;
        // SAFETY: a valid out-pointer; the caller made a context current.
        let code = unsafe { (drv.api().mem_alloc)(&mut ptr, bytes.max(1)) };
        drv.check("cuMemAlloc", code, &format!("{bytes} bytes"))?;
        Ok(DeviceBuf { drv, ptr, bytes })
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copies `src` in (synchronously).
    pub fn upload(&self, src: &[u8]) -> Result<()> {
        assert!(src.len() <= self.bytes, "upload past the buffer");
        // SAFETY: both ranges checked; synchronous.
        unsafe { copy_htod(self.drv, self.ptr, src.as_ptr(), src.len(), None) }
    }

    /// Copies the first `dst.len()` bytes out (synchronously).
    pub fn download(&self, dst: &mut [u8]) -> Result<()> {
        assert!(dst.len() <= self.bytes, "download past the buffer");
        // SAFETY: both ranges checked; synchronous.
        unsafe { copy_dtoh(self.drv, dst.as_mut_ptr(), self.ptr, dst.len(), None) }
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc, freed once.
        unsafe { (self.drv.api().mem_free)(self.ptr) };
    }
}

/// Host memory pinned by the driver (`cuMemAllocHost`), so that copies to
/// and from the device run at full speed and asynchronously.
#[derive(Debug)]
pub struct PinnedBuf {
    drv: &'static Driver,
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: plain memory; access is synchronised by its users.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    pub fn new(drv: &'static Driver, bytes: usize) -> Result<PinnedBuf> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; a context is current.
        let code = unsafe { (drv.api().mem_alloc_host)(&mut p, bytes.max(1)) };
        drv.check("cuMemAllocHost", code, &format!("{bytes} bytes"))?;
        Ok(PinnedBuf {
            drv,
            ptr: p.cast(),
            bytes,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAllocHost, freed once.
        unsafe { (self.drv.api().mem_free_host)(self.ptr.cast()) };
    }
}

/// Host → device, on `stream` (not waited for) or synchronously.
///
/// # Safety
/// `src` holds `bytes` readable bytes and `dst` that many device bytes,
/// both alive until the copy has run; `stream` is a live stream.
pub unsafe fn copy_htod(
    drv: &Driver,
    dst: CUdeviceptr,
    src: *const u8,
    bytes: usize,
    stream: Option<CUstream>,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller guarantees both ranges.
    let code = unsafe {
        match stream {
            Some(s) => (drv.api().memcpy_htod_async)(dst, src.cast(), bytes, s),
            None => (drv.api().memcpy_htod)(dst, src.cast(), bytes),
        }
    };
    drv.check("cuMemcpyHtoD", code, &format!("{dst:#x}, {bytes} bytes"))
}

/// Device → host, as [`copy_htod`].
///
/// # Safety
/// As [`copy_htod`], with `dst` writable.
pub unsafe fn copy_dtoh(
    drv: &Driver,
    dst: *mut u8,
    src: CUdeviceptr,
    bytes: usize,
    stream: Option<CUstream>,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller guarantees both ranges.
    let code = unsafe {
        match stream {
            Some(s) => (drv.api().memcpy_dtoh_async)(dst.cast(), src, bytes, s),
            None => (drv.api().memcpy_dtoh)(dst.cast(), src, bytes),
        }
    };
    drv.check("cuMemcpyDtoH", code, &format!("{src:#x}, {bytes} bytes"))
}

/// Device → device on `stream` (not waited for).
///
/// # Safety
/// Both ranges are live device memory of `bytes` bytes; `stream` is live.
pub unsafe fn copy_dtod(
    drv: &Driver,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller guarantees both ranges.
    let code = unsafe { (drv.api().memcpy_dtod_async)(dst, src, bytes, stream) };
    drv.check(
        "cuMemcpyDtoDAsync",
        code,
        &format!("{src:#x} → {dst:#x}, {bytes} bytes"),
    )
}

/// Waits for everything queued on `stream` (null: the legacy default stream).
///
/// # Safety
/// `stream` is null or a live stream of the current context.
pub unsafe fn sync_stream(drv: &Driver, stream: CUstream) -> Result<()> {
    // SAFETY: a stream handle from the caller or null.
    let code = unsafe { (drv.api().stream_synchronize)(stream) };
    drv.check("cuStreamSynchronize", code, "")
}

/// Queues `*addr = value` on `stream`, after the work before it (with a
/// memory fence: the work's writes are visible first).
///
/// # Safety
/// `addr` is 4 live device bytes; `stream` is live.
pub unsafe fn write_flag(
    drv: &Driver,
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
) -> Result<()> {
    // SAFETY: per the contract; flag 0 is CU_STREAM_WRITE_VALUE_DEFAULT.
    let code = unsafe { (drv.api().stream_write_value32)(stream, addr, value, 0) };
    drv.check("cuStreamWriteValue32", code, &format!("{addr:#x}"))
}

/// Queues a wait on `stream` until `(int32)(*addr - value) >= 0`: the flag
/// has reached `value`, counting with wrap-around.
///
/// # Safety
/// As [`write_flag`].
pub unsafe fn wait_flag(
    drv: &Driver,
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
) -> Result<()> {
    // SAFETY: per the contract; flag 0 is CU_STREAM_WAIT_VALUE_GEQ.
    let code = unsafe { (drv.api().stream_wait_value32)(stream, addr, value, 0) };
    drv.check("cuStreamWaitValue32", code, &format!("{addr:#x}"))
}

/// Whether everything queued on `stream` has run (`cuStreamQuery`).
///
/// # Safety
/// `stream` is null or live.
pub unsafe fn stream_done(drv: &Driver, stream: CUstream) -> Result<bool> {
    // SAFETY: per the contract.
    let code = unsafe { (drv.api().stream_query)(stream) };
    if code == 600 {
        // CUDA_ERROR_NOT_READY
        return Ok(false);
    }
    drv.check("cuStreamQuery", code, "").map(|_| true)
}

/// Sets `bytes` device bytes at `ptr` to `value`, synchronously.
///
/// # Safety
/// `[ptr, ptr + bytes)` is live device memory.
pub unsafe fn memset(drv: &Driver, ptr: CUdeviceptr, value: u8, bytes: usize) -> Result<()> {
    // SAFETY: per the contract.
    let code = unsafe { (drv.api().memset_d8)(ptr, value, bytes) };
    drv.check("cuMemsetD8", code, &format!("{ptr:#x}"))
}

#[cfg(test)]
mod tests {
    use super::host_readable;

    #[test]
    fn readable_memory_is_told_from_a_reserved_range() {
        let v = vec![7u8; 10_000];
        assert!(host_readable(v.as_ptr(), v.len()));
        assert!(host_readable(std::ptr::null(), 0));
        // An address range reserved without access, as the CUDA driver
        // reserves its virtual address space.
        // SAFETY: a fresh anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 16,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(!host_readable(p.cast(), 4096));
        // Readable start, unreadable end.
        // SAFETY: the first page of our mapping.
        unsafe { libc::mprotect(p, 4096, libc::PROT_READ) };
        assert!(host_readable(p.cast(), 4096));
        assert!(!host_readable(p.cast(), 8192));
        // SAFETY: our mapping, once.
        unsafe { libc::munmap(p, 1 << 16) };
    }
}
