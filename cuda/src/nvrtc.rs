//! NVRTC, CUDA's run-time compiler: the generated kernels become PTX for
//! the device at hand, once per process and architecture, with no CUDA
//! toolkit installed (the library ships in PyPI's `nvidia-cuda-nvrtc`).
//!
//! Loaded with `dlopen` like the driver: `GW_NVRTC_LIB`, else the sonames
//! of CUDA 13 and 12. Compiling needs no GPU and no driver, so CI compiles
//! and inspects every kernel (`tests/nvrtc.rs`).

use crate::driver::loader_reason;
use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{CString, c_char, c_int, c_void};

/// The options every kernel is compiled with: no fused multiply-add, no
/// flush of subnormals, IEEE division, so the device rounds where the host
/// rounds (see `kernels`).
pub const OPTIONS: [&str; 3] = ["--fmad=false", "--ftz=false", "--prec-div=true"];

type Prog = *mut c_void;

/// An opened NVRTC.
pub struct Nvrtc {
    lib: Library,
    /// Where it was found.
    pub path: String,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc").field("path", &self.path).finish()
    }
}

/// The libraries tried, in order.
fn candidates() -> Vec<String> {
    match std::env::var("GW_NVRTC_LIB") {
        Ok(p) if !p.is_empty() => vec![p],
        _ => vec![
            "libnvrtc.so.13".into(),
            "libnvrtc.so.12".into(),
            "libnvrtc.so".into(),
        ],
    }
}

impl Nvrtc {
    /// Opens the first of `GW_NVRTC_LIB`, `libnvrtc.so.13`, `.12`, `.so`.
    pub fn load() -> Result<Nvrtc> {
        Self::load_from(&candidates())
    }

    /// As [`Nvrtc::load`], preferring the NVRTC of the driver's CUDA major
    /// version (`driver`: `cuDriverGetVersion`'s 12080, 13000, ...): a
    /// driver cannot load PTX from a newer NVRTC than itself.
    pub fn load_for_driver(driver: i32) -> Result<Nvrtc> {
        let mut names = candidates();
        let own = format!("libnvrtc.so.{}", driver / 1000);
        if let Some(i) = names.iter().position(|n| *n == own) {
            let n = names.remove(i);
            names.insert(0, n);
        }
        Self::load_from(&names)
    }

    /// Opens the first of `names` that loads.
    pub fn load_from(names: &[String]) -> Result<Nvrtc> {
        let mut tried = Vec::new();
        for name in names.iter().cloned() {
            // SAFETY: NVRTC's initialisers have no preconditions.
            match unsafe { Library::new(&name) } {
                Ok(lib) => return Ok(Nvrtc { lib, path: name }),
                Err(e) => tried.push(format!("{name} ({})", loader_reason(&name, &e))),
            }
        }
        Err(Error::NvrtcNotFound {
            tried: tried.join("; "),
        })
    }

    fn sym<T>(&self, name: &'static [u8]) -> Result<libloading::Symbol<'_, T>> {
        // SAFETY: each caller names T as the function's C signature (nvrtc.h).
        unsafe { self.lib.get::<T>(name) }.map_err(|e| Error::Symbol {
            lib: self.path.clone(),
            symbol: std::str::from_utf8(&name[..name.len() - 1]).unwrap_or("?"),
            reason: e.to_string(),
        })
    }

    /// NVRTC's version, (major, minor).
    pub fn version(&self) -> Result<(i32, i32)> {
        let f =
            self.sym::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int>(b"nvrtcVersion\0")?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        check(
            "nvrtcVersion",
            unsafe { f(&mut major, &mut minor) },
            String::new(),
        )?;
        Ok((major, minor))
    }

    /// Compiles `source` (named `name` in messages) to PTX for `arch`
    /// (`compute_90`, say) with [`OPTIONS`].
    pub fn ptx(&self, source: &str, name: &str, arch: &str) -> Result<String> {
        if !arch.starts_with("compute_")
            || !arch[8..].chars().all(|c| c.is_ascii_digit())
            || arch.len() < 10
        {
            return Err(Error::InvalidArgument(format!(
                "architecture {arch:?}: give a virtual one such as compute_90"
            )));
        }
        let c = |s: &str| {
            CString::new(s).map_err(|_| Error::InvalidArgument(format!("{s:?} holds a NUL byte")))
        };
        let (src, cname) = (c(source)?, c(name)?);
        let mut opts: Vec<CString> = OPTIONS.iter().map(|o| c(o)).collect::<Result<_>>()?;
        opts.push(c(&format!("--gpu-architecture={arch}"))?);
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

        let create = self.sym::<unsafe extern "C" fn(
            *mut Prog,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int>(b"nvrtcCreateProgram\0")?;
        let compile = self
            .sym::<unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int>(
                b"nvrtcCompileProgram\0",
            )?;
        let log_size = self
            .sym::<unsafe extern "C" fn(Prog, *mut usize) -> c_int>(b"nvrtcGetProgramLogSize\0")?;
        let log =
            self.sym::<unsafe extern "C" fn(Prog, *mut c_char) -> c_int>(b"nvrtcGetProgramLog\0")?;
        let ptx_size =
            self.sym::<unsafe extern "C" fn(Prog, *mut usize) -> c_int>(b"nvrtcGetPTXSize\0")?;
        let get_ptx =
            self.sym::<unsafe extern "C" fn(Prog, *mut c_char) -> c_int>(b"nvrtcGetPTX\0")?;
        let destroy =
            self.sym::<unsafe extern "C" fn(*mut Prog) -> c_int>(b"nvrtcDestroyProgram\0")?;

        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers (count 0, null arrays).
        let code = unsafe {
            create(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        check("nvrtcCreateProgram", code, String::new())?;
        // Destroyed on every path from here.
        let out = (|| {
            // SAFETY: a live program; `opt_ptrs` holds opts.len() valid C strings.
            let code = unsafe { compile(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
            let text = read(
                |n| unsafe { log_size(prog, n) },
                |p| unsafe { log(prog, p) },
            );
            check("nvrtcCompileProgram", code, text.unwrap_or_default())?;
            read(
                |n| unsafe { ptx_size(prog, n) },
                |p| unsafe { get_ptx(prog, p) },
            )
        })();
        // SAFETY: the program created above, destroyed once.
        unsafe { destroy(&mut prog) };
        out
    }
}

/// Reads one of NVRTC's NUL-terminated outputs (log, PTX) through its
/// size and copy calls.
fn read(
    size: impl FnOnce(*mut usize) -> c_int,
    copy: impl FnOnce(*mut c_char) -> c_int,
) -> Result<String> {
    let mut n = 0usize;
    check("nvrtcGet…Size", size(&mut n), String::new())?;
    let mut buf = vec![0u8; n.max(1)];
    check("nvrtcGet…", copy(buf.as_mut_ptr().cast()), String::new())?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn check(call: &'static str, code: c_int, log: String) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Nvrtc { call, code, log })
    }
}
