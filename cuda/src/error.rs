//! What can go wrong on the GPU side, one variant per failing step.

/// gw-cuda's errors.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// `libcuda.so.1` could not be loaded: no NVIDIA driver on this machine.
    #[error("CUDA driver not found ({lib}: {reason})")]
    DriverNotFound { lib: String, reason: String },
    /// A driver call failed.
    #[error("CUDA driver: {call} failed with {name} ({code}){}", if what.is_empty() { String::new() } else { format!(" on {what}") })]
    Driver {
        call: &'static str,
        code: i32,
        /// The driver's name for the code (`CUDA_ERROR_INVALID_VALUE`).
        name: String,
        /// What the call was about (a pointer, a size), or empty.
        what: String,
    },
    /// Memory that a device operation cannot use, named.
    #[error("{0}")]
    Memory(String),
    /// NVRTC could not be loaded.
    #[error(
        "NVRTC not found: {tried}; install it (pip install nvidia-cuda-nvrtc) or set GW_NVRTC_LIB to libnvrtc.so"
    )]
    NvrtcNotFound { tried: String },
    /// An NVRTC call failed; `log` is the compiler's log, if any.
    #[error("NVRTC: {call} failed with error {code}{}", if log.is_empty() { String::new() } else { format!(":\n{log}") })]
    Nvrtc {
        call: &'static str,
        code: i32,
        log: String,
    },
    /// A symbol the library should export is missing (an old version).
    #[error("{lib} has no {symbol}: {reason}")]
    Symbol {
        lib: String,
        symbol: &'static str,
        reason: String,
    },
    /// An argument that cannot be used (an architecture name, say).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

pub type Result<T> = std::result::Result<T, Error>;
