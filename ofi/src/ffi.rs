//! The C shim's functions and structs, declared by hand.
//!
//! `shim/gw_ofi_shim.c` exposes libfabric's inline calls as real functions
//! taking pointers, integers and the small `gw_ofi_*` structs mirrored
//! here; libfabric's own structs stay on the C side, so nothing below
//! depends on their layout. Object pointers are opaque types, one per kind
//! of libfabric object, so that an endpoint cannot be passed where a
//! completion queue is expected. The flag values are checked against the
//! headers by `_Static_assert`s in the shim.
//!
//! Built without the headers (`cfg(gw_ofi_none)`), the same functions are
//! stubs that are never reached: [`crate::library`] fails first.

#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void};

macro_rules! opaque {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}

opaque! {
    /// `struct fi_info`.
    FiInfo;
    /// `struct fid_fabric`.
    FidFabric;
    /// `struct fid_domain`.
    FidDomain;
    /// `struct fid_cq`.
    FidCq;
    /// `struct fid_av`.
    FidAv;
    /// `struct fid_ep`.
    FidEp;
    /// `struct fid_mr`.
    FidMr;
    /// `struct fid`, the header of every object above.
    Fid;
}

/// `struct gw_ofi_hints`.
#[repr(C)]
pub struct GwHints {
    pub prov_name: *const c_char,
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: u64,
    pub ep_type: i32,
    pub threading: i32,
    pub no_hints: i32,
    pub pad: i32,
}

/// `struct gw_ofi_attr`.
#[repr(C)]
pub struct GwAttr {
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: u64,
    pub cq_data_size: u64,
    pub max_msg_size: u64,
    pub inject_size: u64,
    pub tx_size: u64,
    pub rx_size: u64,
    pub mr_key_size: u64,
    pub max_rma_size: u64,
    pub cq_cnt: u64,
    pub ep_cnt: u64,
    pub prov_version: u32,
    pub ep_type: i32,
    pub data_progress: i32,
    pub control_progress: i32,
    pub threading: i32,
    pub addr_format: u32,
    pub prov_name: [c_char; 64],
    pub fabric_name: [c_char; 64],
    pub domain_name: [c_char; 64],
}

/// `struct gw_ofi_cqe`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct GwCqe {
    pub ctx: u64,
    pub flags: u64,
    pub len: u64,
    pub data: u64,
}

/// `struct gw_ofi_cqerr`.
#[repr(C)]
pub struct GwCqErr {
    pub ctx: u64,
    pub flags: u64,
    pub len: u64,
    pub data: u64,
    pub err: i32,
    pub prov_errno: i32,
    pub text: [c_char; 256],
}

const _: () = assert!(std::mem::size_of::<GwHints>() == 48);
const _: () = assert!(std::mem::size_of::<GwAttr>() == 12 * 8 + 6 * 4 + 3 * 64);
const _: () = assert!(std::mem::size_of::<GwCqe>() == 32);
const _: () = assert!(std::mem::size_of::<GwCqErr>() == 32 + 8 + 256);

/// How many entries one `gw_ofi_cq_read` returns at most (`GW_CQ_BATCH`).
pub const CQ_BATCH: usize = 64;

// libfabric's errno values (fi_errno.h), positive.
pub const FI_EPERM: i32 = 1;
pub const FI_EAGAIN: i32 = 11;
pub const FI_ENOMEM: i32 = 12;
pub const FI_EFAULT: i32 = 14;
pub const FI_ENOSYS: i32 = 38;
pub const FI_ENODATA: i32 = 61;
pub const FI_EAVAIL: i32 = 259;
pub const FI_ETOOSMALL: i32 = 257;

/// `FI_EP_RDM` (enum fi_ep_type).
pub const FI_EP_RDM: i32 = 3;
/// `FI_THREAD_DOMAIN` (enum fi_threading).
pub const FI_THREAD_DOMAIN: i32 = 3;
/// `FI_KEY_NOTAVAIL`.
pub const FI_KEY_NOTAVAIL: u64 = u64::MAX;

macro_rules! shim {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*) => {
        #[cfg(not(gw_ofi_none))]
        unsafe extern "C" {
            $(pub fn $name($($arg: $ty),*) -> $ret;)*
        }

        $(
            /// Stub of the shim function of the same name, never called:
            /// `library()` fails before anything else runs.
            #[cfg(gw_ofi_none)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                $(let _ = $arg;)*
                <$ret as Stub>::stub()
            }
        )*
    };
}

/// What a stub returns: an error, a null pointer or zero.
#[cfg(gw_ofi_none)]
trait Stub {
    fn stub() -> Self;
}

#[cfg(gw_ofi_none)]
mod stub_impls {
    use super::*;
    impl Stub for c_int {
        fn stub() -> Self {
            -FI_ENOSYS
        }
    }
    impl Stub for isize {
        fn stub() -> Self {
            -(FI_ENOSYS as isize)
        }
    }
    impl Stub for u32 {
        fn stub() -> Self {
            0
        }
    }
    impl Stub for u64 {
        fn stub() -> Self {
            0
        }
    }
    impl Stub for () {
        fn stub() -> Self {}
    }
    impl<T> Stub for *mut T {
        fn stub() -> Self {
            std::ptr::null_mut()
        }
    }
    impl<T> Stub for *const T {
        fn stub() -> Self {
            std::ptr::null()
        }
    }
}

shim! {
    fn gw_ofi_load(name: *const c_char, err: *mut c_char, errlen: usize) -> c_int;
    fn gw_ofi_version() -> u32;
    fn gw_ofi_header_version() -> u32;
    fn gw_ofi_strerror(errnum: c_int) -> *const c_char;

    fn gw_ofi_getinfo(hints: *const GwHints, out: *mut *mut FiInfo) -> c_int;
    fn gw_ofi_info_next(info: *const FiInfo) -> *mut FiInfo;
    fn gw_ofi_info_dup(info: *const FiInfo) -> *mut FiInfo;
    fn gw_ofi_freeinfo(info: *mut FiInfo) -> ();
    fn gw_ofi_info_attr(info: *const FiInfo, attr: *mut GwAttr) -> ();

    fn gw_ofi_fabric_open(info: *mut FiInfo, fabric: *mut *mut FidFabric) -> c_int;
    fn gw_ofi_domain_open(fabric: *mut FidFabric, info: *mut FiInfo, domain: *mut *mut FidDomain) -> c_int;
    fn gw_ofi_cq_open(domain: *mut FidDomain, size: usize, wait_fd: c_int, cq: *mut *mut FidCq) -> c_int;
    fn gw_ofi_cq_wait_fd(cq: *mut FidCq, fd: *mut c_int) -> c_int;
    fn gw_ofi_trywait(fabric: *mut FidFabric, cq: *mut FidCq) -> c_int;
    fn gw_ofi_av_open(domain: *mut FidDomain, count: usize, av: *mut *mut FidAv) -> c_int;
    fn gw_ofi_ep_open(domain: *mut FidDomain, info: *mut FiInfo, ep: *mut *mut FidEp) -> c_int;
    fn gw_ofi_ep_setup(ep: *mut FidEp, cq: *mut FidCq, av: *mut FidAv) -> c_int;
    fn gw_ofi_close(fid: *mut Fid) -> c_int;
    fn gw_ofi_getname(ep: *mut FidEp, buf: *mut c_void, len: *mut usize) -> c_int;
    fn gw_ofi_av_insert(av: *mut FidAv, addr: *const c_void, out: *mut u64) -> c_int;

    fn gw_ofi_mr_reg(domain: *mut FidDomain, buf: *const c_void, len: usize, access: u64, requested_key: u64, mr: *mut *mut FidMr) -> c_int;
    fn gw_ofi_mr_reg_hmem(domain: *mut FidDomain, buf: *const c_void, len: usize, access: u64, requested_key: u64, iface: c_int, device: c_int, mr: *mut *mut FidMr) -> c_int;
    fn gw_ofi_mr_bind_ep(mr: *mut FidMr, ep: *mut FidEp) -> c_int;
    fn gw_ofi_mr_key(mr: *mut FidMr) -> u64;
    fn gw_ofi_mr_desc(mr: *mut FidMr) -> *mut c_void;

    fn gw_ofi_send(ep: *mut FidEp, buf: *const c_void, len: usize, desc: *mut c_void, dest: u64, ctx: *mut c_void) -> isize;
    fn gw_ofi_inject(ep: *mut FidEp, buf: *const c_void, len: usize, dest: u64) -> isize;
    fn gw_ofi_recv(ep: *mut FidEp, buf: *mut c_void, len: usize, desc: *mut c_void, ctx: *mut c_void) -> isize;
    fn gw_ofi_write(ep: *mut FidEp, buf: *const c_void, len: usize, desc: *mut c_void, dest: u64, addr: u64, key: u64, ctx: *mut c_void) -> isize;
    fn gw_ofi_writedata(ep: *mut FidEp, buf: *const c_void, len: usize, desc: *mut c_void, data: u64, dest: u64, addr: u64, key: u64, ctx: *mut c_void) -> isize;
    fn gw_ofi_read(ep: *mut FidEp, buf: *mut c_void, len: usize, desc: *mut c_void, src: u64, addr: u64, key: u64, ctx: *mut c_void) -> isize;

    fn gw_ofi_cq_read(cq: *mut FidCq, out: *mut GwCqe, count: usize) -> isize;
    fn gw_ofi_cq_readerr(cq: *mut FidCq, out: *mut GwCqErr) -> isize;
}
