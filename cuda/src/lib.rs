//! gradwire's GPU side, as far as it runs without a GPU: the reduction
//! kernels, generated as CUDA C++ with the host path's exact semantics
//! ([`kernels`]), their compilation to PTX at run time ([`nvrtc`]), and the
//! CUDA driver loaded at run time so that a binary without a GPU beneath it
//! says so instead of crashing ([`driver`]).
//!
//! Nothing here links against CUDA: both libraries are opened with
//! `dlopen` when first needed, so every gradwire binary builds and starts on
//! machines without them. Device buffers in the collectives, IPC and the
//! stream-ordered calls build on this (issue 25; see `docs/gpu.md`).

pub mod api;
pub mod device;
pub mod driver;
pub mod error;
pub mod event;
pub mod kernels;
pub mod memory;
pub mod nvrtc;
pub mod pipeline;

pub use device::{Gpu, Scaling};
pub use driver::Driver;
pub use error::{Error, Result};
pub use event::Event;
pub use kernels::{Elem, Op};
pub use memory::{DeviceBuf, MemKind, PinnedBuf};
pub use nvrtc::Nvrtc;
