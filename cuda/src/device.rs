//! One GPU as gradwire uses it: its primary context (the one the CUDA
//! runtime, PyTorch and CuPy share), the reduction kernels compiled for it
//! once per process, and kernel launches.

use crate::api::{CUcontext, CUdeviceptr, CUfunction, CUmodule, CUstream};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::kernels::{self, Elem, Op};
use crate::nvrtc::Nvrtc;
use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::sync::{Mutex, OnceLock};

const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;

/// Threads per block of every kernel launch.
const BLOCK: u32 = 256;

/// A GPU and its primary context.
pub struct Gpu {
    drv: &'static Driver,
    pub ordinal: i32,
    ctx: CUcontext,
    /// Multiprocessors, for grid sizes.
    pub sms: u32,
    /// The virtual architecture kernels are compiled for (`compute_90`).
    pub arch: String,
    /// The GPU's UUID: the same physical GPU in every process, whatever
    /// `CUDA_VISIBLE_DEVICES` numbers it there.
    pub uuid: [u8; 16],
    kernels: OnceLock<std::result::Result<Kernels, Error>>,
}

// SAFETY: a CUcontext may be made current on any thread; the module's
// function handles are immutable once loaded.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("arch", &self.arch)
            .field("sms", &self.sms)
            .finish_non_exhaustive()
    }
}

struct Kernels {
    _module: CUmodule,
    functions: HashMap<String, CUfunction>,
}

/// A kernel's scale and division arguments, in the compute type of its
/// element (see `kernels`: the weights and divisor are rounded to it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Scaling {
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub div: Option<f64>,
}

/// How many GPUs the driver sees.
pub fn count() -> Result<i32> {
    let drv = Driver::global()?;
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    let code = unsafe { (drv.api().device_get_count)(&mut n) };
    drv.check("cuDeviceGetCount", code, "")?;
    Ok(n)
}

impl Gpu {
    /// GPU `ordinal`, set up once per process (its context retained, never
    /// released: other libraries in the process share it).
    pub fn get(ordinal: i32) -> Result<&'static Gpu> {
        static GPUS: Mutex<Vec<&'static Gpu>> = Mutex::new(Vec::new());
        let mut all = GPUS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = all.iter().find(|g| g.ordinal == ordinal) {
            return Ok(g);
        }
        let g: &'static Gpu = Box::leak(Box::new(Gpu::open(ordinal)?));
        all.push(g);
        Ok(g)
    }

    fn open(ordinal: i32) -> Result<Gpu> {
        let drv = Driver::global()?;
        let api = drv.api();
        let mut count = 0;
        // SAFETY: valid out-pointers throughout.
        drv.check(
            "cuDeviceGetCount",
            unsafe { (api.device_get_count)(&mut count) },
            "",
        )?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "GPU {ordinal}: this machine has {count}"
            )));
        }
        let mut dev = 0;
        drv.check(
            "cuDeviceGet",
            unsafe { (api.device_get)(&mut dev, ordinal) },
            "",
        )?;
        let attr = |a: c_int| -> Result<c_int> {
            let mut v = 0;
            drv.check(
                "cuDeviceGetAttribute",
                unsafe { (api.device_get_attribute)(&mut v, a, dev) },
                "",
            )?;
            Ok(v)
        };
        let sms = attr(ATTR_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        let arch = format!("compute_{}{}", attr(ATTR_CC_MAJOR)?, attr(ATTR_CC_MINOR)?);
        let mut uuid = [0u8; 16];
        drv.check(
            "cuDeviceGetUuid",
            unsafe { (api.device_get_uuid)(&mut uuid, dev) },
            "",
        )?;
        let mut ctx = std::ptr::null_mut();
        drv.check(
            "cuDevicePrimaryCtxRetain",
            unsafe { (api.primary_ctx_retain)(&mut ctx, dev) },
            "",
        )?;
        Ok(Gpu {
            drv,
            ordinal,
            ctx,
            sms,
            arch,
            uuid,
            kernels: OnceLock::new(),
        })
    }

    pub fn driver(&self) -> &'static Driver {
        self.drv
    }

    /// Makes this GPU's primary context current on the calling thread.
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: a retained context.
        let code = unsafe { (self.drv.api().ctx_set_current)(self.ctx) };
        self.drv.check("cuCtxSetCurrent", code, "")
    }

    /// Waits for all work queued in this process's context.
    pub fn synchronize(&self) -> Result<()> {
        self.make_current()?;
        // SAFETY: a current context.
        let code = unsafe { (self.drv.api().ctx_synchronize)() };
        self.drv.check("cuCtxSynchronize", code, "")
    }

    /// Creates a non-blocking stream in this context.
    pub fn new_stream(&self) -> Result<CUstream> {
        self.make_current()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; flag 1 is CU_STREAM_NON_BLOCKING.
        let code = unsafe { (self.drv.api().stream_create)(&mut s, 1) };
        self.drv.check("cuStreamCreate", code, "")?;
        Ok(s)
    }

    /// Compiles (NVRTC) and loads the kernels, once per process and GPU.
    fn kernels(&self) -> Result<&Kernels> {
        self.kernels
            .get_or_init(|| self.load_kernels())
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load_kernels(&self) -> Result<Kernels> {
        let nvrtc = Nvrtc::load_for_driver(self.drv.version())?;
        let ptx = nvrtc.ptx(&kernels::source(), "gw_kernels.cu", &self.arch)?;
        let image =
            CString::new(ptx).map_err(|_| Error::InvalidArgument("PTX holds a NUL byte".into()))?;
        self.make_current()?;
        let api = self.drv.api();
        let mut module = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image; a current context.
        let code = unsafe { (api.module_load_data)(&mut module, image.as_ptr().cast()) };
        self.drv.check("cuModuleLoadData", code, &self.arch)?;
        let mut functions = HashMap::new();
        for name in kernels::entry_names() {
            let c = CString::new(name.clone()).map_err(|_| Error::InvalidArgument(name.clone()))?;
            let mut f = std::ptr::null_mut();
            // SAFETY: a loaded module and a C string.
            let code = unsafe { (api.module_get_function)(&mut f, module, c.as_ptr()) };
            self.drv.check("cuModuleGetFunction", code, &name)?;
            functions.insert(name, f);
        }
        Ok(Kernels {
            _module: module,
            functions,
        })
    }

    /// Compiles the kernels now (the first reduction would otherwise pay
    /// for it), returning any error.
    pub fn prepare(&self) -> Result<()> {
        self.kernels().map(|_| ())
    }

    fn grid(&self, n: u64) -> u32 {
        let blocks = n.div_ceil(BLOCK as u64).max(1);
        blocks.min(self.sms as u64 * 8) as u32
    }

    /// Queues `dst[i] = op(a[i] scaled, b[i] scaled) / div` for `n`
    /// elements on `stream`. `dst` may be `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        e: Elem,
        op: Op,
        dst: CUdeviceptr,
        a: CUdeviceptr,
        b: CUdeviceptr,
        n: u64,
        s: Scaling,
        stream: CUstream,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&kernels::reduce_name(e, op))?;
        let (wa, sa) = flag(e, s.a);
        let (wb, sb) = flag(e, s.b);
        let (fin, div) = flag(e, s.div);
        let (mut dst, mut a, mut b, mut n64) = (dst, a, b, n);
        let (mut wa, mut sa, mut wb, mut sb, mut fin, mut div) = (wa, sa, wb, sb, fin, div);
        let mut params: [*mut c_void; 10] = [
            (&mut dst as *mut u64).cast(),
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut n64 as *mut u64).cast(),
            (&mut wa as *mut c_int).cast(),
            sa.ptr(),
            (&mut wb as *mut c_int).cast(),
            sb.ptr(),
            (&mut fin as *mut c_int).cast(),
            div.ptr(),
        ];
        self.launch(f, n, &mut params, stream)
    }

    /// Queues one fan kernel on `stream`: every output gets
    /// `((ins[0] ∘ ins[1]) ∘ …)`, the last step divided by `div` (avg).
    /// Outputs may be inputs. At most [`kernels::MAX_FAN`] of each.
    #[allow(clippy::too_many_arguments)]
    pub fn fan(
        &self,
        e: Elem,
        op: Op,
        outs: &[CUdeviceptr],
        ins: &[CUdeviceptr],
        n: u64,
        div: Option<f64>,
        stream: CUstream,
    ) -> Result<()> {
        if outs.len() > kernels::MAX_FAN || ins.len() > kernels::MAX_FAN || ins.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "a fan kernel takes 1 to {} inputs and outputs, not {} and {}",
                kernels::MAX_FAN,
                ins.len(),
                outs.len()
            )));
        }
        if n == 0 || outs.is_empty() {
            return Ok(());
        }
        let f = self.function(&kernels::fan_name(e, op))?;
        let mut o = [0u64; kernels::MAX_FAN];
        o[..outs.len()].copy_from_slice(outs);
        let mut i = [0u64; kernels::MAX_FAN];
        i[..ins.len()].copy_from_slice(ins);
        let (mut no, mut ni, mut n64) = (outs.len() as c_int, ins.len() as c_int, n);
        let (fin, dv) = flag(e, div);
        let (mut fin, mut dv) = (fin, dv);
        let mut params: [*mut c_void; 7] = [
            o.as_mut_ptr().cast(),
            (&mut no as *mut c_int).cast(),
            i.as_mut_ptr().cast(),
            (&mut ni as *mut c_int).cast(),
            (&mut n64 as *mut u64).cast(),
            (&mut fin as *mut c_int).cast(),
            dv.ptr(),
        ];
        self.launch(f, n, &mut params, stream)
    }

    /// Queues `dst[i] = src[i] scaled / div` on `stream`; `dst` may be `src`.
    #[allow(clippy::too_many_arguments)]
    pub fn copy(
        &self,
        e: Elem,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: u64,
        scale: Option<f64>,
        div: Option<f64>,
        stream: CUstream,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&kernels::copy_name(e))?;
        let (ws, sc) = flag(e, scale);
        let (fin, dv) = flag(e, div);
        let (mut dst, mut src, mut n64) = (dst, src, n);
        let (mut ws, mut sc, mut fin, mut dv) = (ws, sc, fin, dv);
        let mut params: [*mut c_void; 7] = [
            (&mut dst as *mut u64).cast(),
            (&mut src as *mut u64).cast(),
            (&mut n64 as *mut u64).cast(),
            (&mut ws as *mut c_int).cast(),
            sc.ptr(),
            (&mut fin as *mut c_int).cast(),
            dv.ptr(),
        ];
        self.launch(f, n, &mut params, stream)
    }

    fn function(&self, name: &str) -> Result<CUfunction> {
        self.kernels()?
            .functions
            .get(name)
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("no kernel {name}")))
    }

    fn launch(
        &self,
        f: CUfunction,
        n: u64,
        params: &mut [*mut c_void],
        stream: CUstream,
    ) -> Result<()> {
        self.make_current()?;
        let grid = self.grid(n);
        // SAFETY: `params` points at values of the kernel's parameter types,
        // alive until the launch returns (the driver copies them).
        let code = unsafe {
            (self.drv.api().launch_kernel)(
                f,
                grid,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.drv
            .check("cuLaunchKernel", code, &format!("{n} elements"))
    }
}

/// A value in an element's compute type, passed to a kernel by address.
enum Scalar {
    F32(f32),
    F64(f64),
    U32(u32),
    U64(u64),
    U8(u8),
}

impl Scalar {
    fn ptr(&mut self) -> *mut c_void {
        match self {
            Scalar::F32(v) => (v as *mut f32).cast(),
            Scalar::F64(v) => (v as *mut f64).cast(),
            Scalar::U32(v) => (v as *mut u32).cast(),
            Scalar::U64(v) => (v as *mut u64).cast(),
            Scalar::U8(v) => (v as *mut u8).cast(),
        }
    }
}

/// (present, value in the compute type): weights are rounded to the
/// compute type as the host kernels round them.
fn flag(e: Elem, v: Option<f64>) -> (c_int, Scalar) {
    let x = v.unwrap_or(0.0);
    let s = match e {
        Elem::F64 => Scalar::F64(x),
        Elem::F32 | Elem::F16 | Elem::Bf16 => Scalar::F32(x as f32),
        Elem::I32 => Scalar::U32(0),
        Elem::I64 => Scalar::U64(0),
        Elem::U8 => Scalar::U8(0),
    };
    (c_int::from(v.is_some()), s)
}
