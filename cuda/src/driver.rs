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
use std::ffi::{CStr, c_char, c_int};
use std::sync::OnceLock;

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
pub fn loaded_in_process() -> bool {
    // Once loaded, the driver stays: a yes is remembered, a no asked again
    // (dlopen with RTLD_NOLOAD costs a lookup under the loader's lock).
    static LOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if LOADED.load(std::sync::atomic::Ordering::Relaxed) {
        return true;
    }
    let yes = probe_loaded();
    if yes {
        LOADED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    yes
}

fn probe_loaded() -> bool {
    let name = driver_lib_name();
    // SAFETY: RTLD_NOLOAD opens nothing new: it only finds a library that
    // is already loaded, whose initialisers have run.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(&name),
            libloading::os::unix::RTLD_NOW | 0x4, /* RTLD_NOLOAD */
        )
    };
    lib.is_ok()
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
