//! The CUDA driver, loaded when first asked for.
//!
//! A gradwire binary must start on machines without a GPU, and cudarc's
//! dynamic loading panics on first use when `libcuda.so.1` is absent. So
//! the driver is opened here with `dlopen`, and its absence is an error
//! that says so ("CUDA driver not found (libcuda.so.1: <the loader's
//! reason>)"), never a panic. Every entry point used is bound at load
//! ([`crate::api`]).

use crate::api::{Api, CUresult};
use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The driver library, opened and initialised (`cuInit`).
pub struct Driver {
    // Kept open: `api` points into it.
    _lib: Library,
    api: Api,
    version: c_int,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// The driver's soname (`GW_CUDA_DRIVER_LIB` overrides it, for tests and
/// unusual installs).
pub fn driver_lib_name() -> String {
    std::env::var("GW_CUDA_DRIVER_LIB").unwrap_or_else(|_| "libcuda.so.1".into())
}

/// Whether this process has the driver loaded already (by CUDA's runtime,
/// PyTorch, CuPy, or gradwire). A process that has not cannot hold device
/// or pinned memory, so host-only programs never pay for loading it.
///
/// Asked on every call of the C ABI, for each buffer. A yes is remembered
/// (the driver stays once loaded). A no is asked again only once the
/// process has loaded another shared object since (glibc's count of loads,
/// read through `dl_iterate_phdr` without touching the file system): the
/// `dlopen(RTLD_NOLOAD)` that asks walks the library path, opening and
/// mapping files, about 30 µs a C ABI call on the development VM, where a
/// 4-byte all-reduce takes 0.6.
pub fn loaded_in_process() -> bool {
    static LOADED: AtomicBool = AtomicBool::new(false);
    static NO_AT: AtomicU64 = AtomicU64::new(NEVER);
    if LOADED.load(Ordering::Relaxed) {
        return true;
    }
    let yes = probe_loaded(driver_lib_name, &NO_AT);
    if yes {
        LOADED.store(true, Ordering::Relaxed);
    }
    yes
}

/// No count of loads has this value (it would take 2^64 of them).
const NEVER: u64 = u64::MAX;

/// Whether the library `name()` is loaded in this process; a no is kept
/// in `no_at` as the count of loads it was found at, and holds (without
/// asking, or reading the name) while that count does.
fn probe_loaded(name: impl FnOnce() -> String, no_at: &AtomicU64) -> bool {
    let before = objects_loaded();
    if before.is_some_and(|n| n == no_at.load(Ordering::Relaxed)) {
        return false;
    }
    let name = name();
    // SAFETY: RTLD_NOLOAD opens nothing new: it only finds a library that
    // is already loaded, whose initialisers have run.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(&name),
            libloading::os::unix::RTLD_NOW | 0x4, /* RTLD_NOLOAD */
        )
    };
    let yes = lib.is_ok();
    // A load between the count and the probe leaves an older count kept:
    // the next call sees a newer one and asks again.
    if !yes && let Some(n) = before {
        no_at.store(n, Ordering::Relaxed);
    }
    yes
}

/// How many shared objects this process has loaded so far (glibc's
/// `dlpi_adds`), or `None` where the loader does not say.
fn objects_loaded() -> Option<u64> {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        let need = std::mem::offset_of!(libc::dl_phdr_info, dlpi_adds)
            + std::mem::size_of::<libc::c_ulonglong>();
        if size >= need {
            // SAFETY: the loader passes a valid `info` of `size` bytes, and
            // `data` is the `Option<u64>` below, alive for the call.
            unsafe { *data.cast::<Option<u64>>() = Some((*info).dlpi_adds) };
        }
        // Stop after the first object: the count is the same in each.
        1
    }
    let mut out: Option<u64> = None;
    // SAFETY: `first` only writes `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut out).cast()) };
    out
}

impl Driver {
    /// Opens the driver and calls `cuInit(0)`.
    pub fn load() -> Result<Driver> {
        Self::load_from(&driver_lib_name())
    }

    /// The process's driver, loaded on first use; later calls return the
    /// same driver, or the same error.
    pub fn global() -> Result<&'static Driver> {
        static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
        DRIVER
            .get_or_init(Driver::load)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// [`Driver::load`] from the library `name`.
    pub fn load_from(name: &str) -> Result<Driver> {
        let name = name.to_string();
        // SAFETY: loading the NVIDIA driver runs its initialisers, which have
        // no preconditions; nothing else is called until cuInit.
        let lib = unsafe { Library::new(&name) }.map_err(|e| Error::DriverNotFound {
            lib: name.clone(),
            reason: loader_reason(&name, &e),
        })?;
        let api = Api::bind(&lib, &name)?;
        let mut d = Driver {
            _lib: lib,
            api,
            version: 0,
        };
        // SAFETY: cuInit has no preconditions; the out-pointer is valid.
        d.check("cuInit", unsafe { (d.api.init)(0) }, "")?;
        let mut version = 0;
        d.check(
            "cuDriverGetVersion",
            unsafe { (d.api.driver_get_version)(&mut version) },
            "",
        )?;
        d.version = version;
        Ok(d)
    }

    /// The driver's CUDA version, as `cuDriverGetVersion` gives it (13000 for 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The bound entry points.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// `Ok` for CUDA_SUCCESS, else the error with the driver's name for the code.
    pub fn check(&self, call: &'static str, code: CUresult, what: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string, or
        // leaves it null for an unknown code.
        let name = unsafe {
            if (self.api.get_error_name)(code, &mut p) == 0 && !p.is_null() {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            } else {
                "an unknown error".into()
            }
        };
        Err(Error::Driver {
            call,
            code,
            name,
            what: what.to_string(),
        })
    }
}

/// The loader's own words (dlerror), without the library's name it starts with.
pub(crate) fn loader_reason(name: &str, e: &libloading::Error) -> String {
    let text = e.to_string();
    text.strip_prefix(&format!("{name}: "))
        .map_or(text.clone(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_no_holds_until_the_process_loads_another_object() {
        let no_at = AtomicU64::new(NEVER);
        let absent = || "libgradwire-absent-for-a-test.so.9".to_string();
        assert!(!probe_loaded(absent, &no_at));
        let n = objects_loaded().expect("glibc counts the objects it loads");
        assert!(no_at.load(Ordering::Relaxed) <= n);
        // Kept: the library is not asked for, its name not even read
        // (unless another test's thread loaded something meanwhile).
        let before = objects_loaded();
        let mut asked = false;
        assert!(!probe_loaded(
            || {
                asked = true;
                absent()
            },
            &no_at
        ));
        if before == Some(no_at.load(Ordering::Relaxed)) && objects_loaded() == before {
            assert!(!asked, "the kept no was not used");
        }
        // A library loaded after the no is found: the count moved. One of
        // glibc's small libraries that this test binary does not link.
        let (name, lib) = ["libBrokenLocale.so.1", "libanl.so.1", "libresolv.so.2"]
            .into_iter()
            .find_map(|name| {
                let no = AtomicU64::new(NEVER);
                if probe_loaded(|| name.to_string(), &no) {
                    return None;
                }
                // SAFETY: a glibc library with no initialisers of note.
                unsafe { libloading::Library::new(name) }
                    .ok()
                    .map(|lib| (name, lib))
            })
            .expect("one of glibc's libBrokenLocale, libanl or libresolv, not yet loaded");
        assert!(objects_loaded() > Some(n));
        assert!(probe_loaded(|| name.to_string(), &no_at));
        drop(lib);
    }
}
