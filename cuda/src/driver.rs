//! The CUDA driver, loaded when first asked for.
//!
//! A gradwire binary must start on machines without a GPU, and cudarc's
//! dynamic loading panics on first use when `libcuda.so.1` is absent. So
//! the driver is opened here with `dlopen`, and its absence is an error
//! that says so ("CUDA driver not found (libcuda.so.1: <the loader's
//! reason>)"), never a panic. Only what is called is bound.

use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::c_int;

/// The driver library, opened and initialised (`cuInit`).
pub struct Driver {
    lib: Library,
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

impl Driver {
    /// Opens the driver and calls `cuInit(0)`.
    pub fn load() -> Result<Driver> {
        Self::load_from(&driver_lib_name())
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
        let symbol = |s: &'static str| Error::Symbol {
            lib: name.clone(),
            symbol: s,
            reason: String::new(),
        };
        // SAFETY: the driver API's signatures (cuda.h): CUresult cuInit(unsigned)
        // and CUresult cuDriverGetVersion(int*).
        unsafe {
            let init = lib
                .get::<unsafe extern "C" fn(u32) -> c_int>(b"cuInit\0")
                .map_err(|_| symbol("cuInit"))?;
            let code = init(0);
            if code != 0 {
                return Err(Error::Driver {
                    call: "cuInit",
                    code,
                });
            }
            let get = lib
                .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"cuDriverGetVersion\0")
                .map_err(|_| symbol("cuDriverGetVersion"))?;
            let mut version = 0;
            let code = get(&mut version);
            if code != 0 {
                return Err(Error::Driver {
                    call: "cuDriverGetVersion",
                    code,
                });
            }
            Ok(Driver { lib, version })
        }
    }

    /// The driver's CUDA version, as `cuDriverGetVersion` gives it (13000 for 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The library, for the calls that later layers bind.
    pub fn library(&self) -> &Library {
        &self.lib
    }
}

/// The loader's own words (dlerror), without the library's name it starts with.
pub(crate) fn loader_reason(name: &str, e: &libloading::Error) -> String {
    let text = e.to_string();
    text.strip_prefix(&format!("{name}: "))
        .map_or(text.clone(), str::to_string)
}
