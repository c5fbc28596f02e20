//! The driver entry points gradwire calls, bound once when the driver is
//! loaded. A missing symbol (a driver older than CUDA 12) is an error at
//! load time naming the symbol, so no later call can find a null pointer.
//!
//! Signatures are those of `cuda.h` (the `_v2` names are what the header's
//! macros map the plain names to).

use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

impl std::fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcMemHandle(")?;
        for b in &self.reserved[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

macro_rules! api {
    ($($field:ident = $sym:literal : fn($($arg:ty),*);)*) => {
        /// The bound entry points.
        #[allow(non_snake_case)]
        pub struct Api {
            $(pub $field: unsafe extern "C" fn($($arg),*) -> CUresult,)*
        }

        impl Api {
            /// Binds every entry point from `lib` (named `name` in errors).
            pub fn bind(lib: &Library, name: &str) -> Result<Api> {
                // SAFETY: each symbol is given its cuda.h signature above.
                unsafe {
                    Ok(Api {
                        $($field: *lib
                            .get::<unsafe extern "C" fn($($arg),*) -> CUresult>(concat!($sym, "\0").as_bytes())
                            .map_err(|e| Error::Symbol {
                                lib: name.to_string(),
                                symbol: $sym,
                                reason: e.to_string(),
                            })?,)*
                    })
                }
            }
        }
    };
}

api! {
    init = "cuInit": fn(c_uint);
    driver_get_version = "cuDriverGetVersion": fn(*mut c_int);
    get_error_string = "cuGetErrorString": fn(CUresult, *mut *const c_char);
    get_error_name = "cuGetErrorName": fn(CUresult, *mut *const c_char);
    device_get_count = "cuDeviceGetCount": fn(*mut c_int);
    device_get = "cuDeviceGet": fn(*mut CUdevice, c_int);
    device_get_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, CUdevice);
    device_get_uuid = "cuDeviceGetUuid_v2": fn(*mut [u8; 16], CUdevice);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut CUcontext, CUdevice);
    ctx_set_current = "cuCtxSetCurrent": fn(CUcontext);
    ctx_get_current = "cuCtxGetCurrent": fn(*mut CUcontext);
    ctx_synchronize = "cuCtxSynchronize": fn();
    mem_alloc = "cuMemAlloc_v2": fn(*mut CUdeviceptr, usize);
    mem_free = "cuMemFree_v2": fn(CUdeviceptr);
    mem_alloc_host = "cuMemAllocHost_v2": fn(*mut *mut c_void, usize);
    mem_free_host = "cuMemFreeHost": fn(*mut c_void);
    memcpy_htod = "cuMemcpyHtoD_v2": fn(CUdeviceptr, *const c_void, usize);
    memcpy_dtoh = "cuMemcpyDtoH_v2": fn(*mut c_void, CUdeviceptr, usize);
    memcpy_dtod = "cuMemcpyDtoD_v2": fn(CUdeviceptr, CUdeviceptr, usize);
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(CUdeviceptr, *const c_void, usize, CUstream);
    memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2": fn(*mut c_void, CUdeviceptr, usize, CUstream);
    memcpy_dtod_async = "cuMemcpyDtoDAsync_v2": fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    memset_d8 = "cuMemsetD8_v2": fn(CUdeviceptr, u8, usize);
    mem_get_address_range = "cuMemGetAddressRange_v2": fn(*mut CUdeviceptr, *mut usize, CUdeviceptr);
    pointer_get_attributes = "cuPointerGetAttributes": fn(c_uint, *mut c_int, *mut *mut c_void, CUdeviceptr);
    stream_create = "cuStreamCreate": fn(*mut CUstream, c_uint);
    stream_destroy = "cuStreamDestroy_v2": fn(CUstream);
    stream_synchronize = "cuStreamSynchronize": fn(CUstream);
    stream_query = "cuStreamQuery": fn(CUstream);
    stream_wait_value32 = "cuStreamWaitValue32_v2": fn(CUstream, CUdeviceptr, u32, c_uint);
    stream_write_value32 = "cuStreamWriteValue32_v2": fn(CUstream, CUdeviceptr, u32, c_uint);
    event_create = "cuEventCreate": fn(*mut CUevent, c_uint);
    event_record = "cuEventRecord": fn(CUevent, CUstream);
    event_synchronize = "cuEventSynchronize": fn(CUevent);
    event_elapsed_time = "cuEventElapsedTime": fn(*mut f32, CUevent, CUevent);
    event_destroy = "cuEventDestroy_v2": fn(CUevent);
    module_load_data = "cuModuleLoadData": fn(*mut CUmodule, *const c_void);
    module_get_function = "cuModuleGetFunction": fn(*mut CUfunction, CUmodule, *const c_char);
    launch_kernel = "cuLaunchKernel": fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    ipc_get_mem_handle = "cuIpcGetMemHandle": fn(*mut IpcMemHandle, CUdeviceptr);
    ipc_open_mem_handle = "cuIpcOpenMemHandle_v2": fn(*mut CUdeviceptr, IpcMemHandle, c_uint);
    ipc_close_mem_handle = "cuIpcCloseMemHandle": fn(CUdeviceptr);
}
