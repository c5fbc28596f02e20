//! gw-ofi: gradwire's binding of libfabric (OFI), for an RDMA transport.
//!
//! libfabric is the portable interface over verbs, EFA, TCP, shared memory
//! and others. Most of its calls are `static inline` functions in its
//! headers, so this crate compiles a small C shim (`shim/gw_ofi_shim.c`)
//! that turns the ones gradwire uses into real functions, and wraps them in
//! a small safe API: pick a provider ([`Fabric::open`]), open a [`Domain`]
//! and an RDM [`Endpoint`] with its completion queue and address vector,
//! register memory ([`Mr`], cached by range in [`RegCache`]), post
//! non-blocking sends, receives and one-sided writes (with immediate data)
//! and reads, and read completions ([`Endpoint::poll_cq`]).
//!
//! Nothing is linked from libfabric at build time: the shim resolves the
//! six exported functions it needs with `dlopen("libfabric.so.1")` at run
//! time ([`library`]), so a gradwire binary runs where libfabric is absent
//! and says what to install. Built where the headers are absent, the crate
//! compiles and every constructor returns [`Error::NotBuilt`].
//!
//! Threading: every libfabric object of one domain is used under that
//! domain's lock, which matches `FI_THREAD_DOMAIN` (the application
//! serialises access to a domain's objects), so the handles are `Send` and
//! may move to the engine's thread; data calls take `&mut Endpoint`.

mod cache;
mod endpoint;
pub mod error;
mod fabric;
mod ffi;
mod flags;
mod info;
mod linger;
mod mr;
mod stale;

pub use cache::RegCache;
pub use endpoint::{Completion, Endpoint, EpConfig, FiAddr, Remote, lingering_endpoints};
pub use error::{Error, FiCall, Result};
pub use fabric::{Domain, Fabric};
pub use flags::*;
pub use info::{Info, PREFERRED_PROVIDERS, Progress, hmem_support, providers};
pub use mr::{Mr, MrDesc};

use std::ffi::{CStr, CString, c_char};
use std::sync::OnceLock;

/// The library file [`library`] opens.
pub const LIBRARY: &str = "libfabric.so.1";

/// Loads libfabric once per process; every constructor calls this first.
/// Fails with [`Error::NotFound`] where libfabric.so.1 cannot be opened
/// and [`Error::NotBuilt`] where the crate was compiled without headers.
pub fn library() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    if cfg!(gw_ofi_none) {
        return Err(Error::NotBuilt);
    }
    LOADED
        .get_or_init(|| load(LIBRARY))
        .clone()
        .map_err(Error::NotFound)
}

/// Opens `name` and resolves libfabric's exported functions in it; the
/// error is the shim's "dlopen NAME: TEXT". Only the first library that
/// loads is kept.
fn load(name: &str) -> std::result::Result<(), String> {
    let cname = CString::new(name).map_err(|_| format!("dlopen {name:?}: name holds a NUL"))?;
    let mut err = [0 as c_char; 512];
    // SAFETY: cname is NUL-terminated and err is writable for its length;
    // the shim writes a NUL-terminated message into it on failure.
    let rc = unsafe { ffi::gw_ofi_load(cname.as_ptr(), err.as_mut_ptr(), err.len()) };
    if rc == 0 { Ok(()) } else { Err(c_text(&err)) }
}

/// The loaded library's version as (major, minor), if it is loaded.
pub fn version() -> Option<(u32, u32)> {
    library().ok()?;
    // SAFETY: no arguments; the shim returns 0 before loading.
    let v = unsafe { ffi::gw_ofi_version() };
    (v != 0).then_some((v >> 16, v & 0xffff))
}

/// `fi_strerror(errnum)` for a positive errno.
pub(crate) fn strerror(errnum: i32) -> String {
    // SAFETY: the shim returns a static NUL-terminated string, never NULL.
    let p = unsafe { ffi::gw_ofi_strerror(errnum) };
    if p.is_null() {
        return format!("error {errnum}");
    }
    // SAFETY: p is a NUL-terminated string owned by libfabric (or the shim).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A [`FiCall`] for a negative return value of `call`.
pub(crate) fn fi_call(call: &'static str, ret: isize) -> FiCall {
    let errno = i32::try_from(ret).unwrap_or(i32::MIN);
    FiCall {
        call,
        errno,
        text: strerror(errno.saturating_neg()),
    }
}

/// The text of a NUL-terminated buffer written by the shim.
pub(crate) fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_may_move_to_the_engine_thread() {
        fn send<T: Send>() {}
        send::<Fabric>();
        send::<Domain>();
        send::<Endpoint>();
        send::<Mr>();
        send::<std::sync::Arc<Mr>>();
        send::<RegCache<Mr>>();
        send::<Error>();
    }

    #[test]
    #[cfg_attr(gw_ofi_none, ignore = "built without libfabric headers")]
    fn a_missing_library_names_dlopen_and_its_error() {
        let err = load("libgw-ofi-nosuch.so.1").unwrap_err();
        assert!(err.starts_with("dlopen libgw-ofi-nosuch.so.1: "), "{err}");
        let msg = Error::NotFound(err).to_string();
        assert!(
            msg.starts_with("libfabric not found (dlopen libgw-ofi-nosuch.so.1: "),
            "{msg}"
        );
        assert!(msg.ends_with("): install libfabric1"), "{msg}");
    }

    #[test]
    #[cfg_attr(gw_ofi_none, ignore = "built without libfabric headers")]
    fn loads_and_reports_a_version() {
        match library() {
            Ok(()) => {
                let (major, minor) = version().expect("a loaded library has a version");
                assert!(major >= 1, "version {major}.{minor}");
            }
            Err(e) => println!("skipped: {e}"),
        }
    }
}
