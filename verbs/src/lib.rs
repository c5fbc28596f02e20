//! gradwire's InfiniBand/RoCE verbs layer: devices, ports and GIDs, memory
//! registration, reliable-connected queue pairs, one-sided writes with
//! immediate, and completions. The transport backend `GW_TRANSPORT=verbs`
//! (not written yet) will drive it: that backend implements the seam's
//! one-sided path (`remote_region`, `write_imm`) with this crate's writes,
//! and two-sided messages through `gw_transport::rma`'s protocol.
//!
//! # Layout
//!
//! Everything that decides something is pure and built without the `verbs`
//! feature, so that it is tested on any machine: the GID choice ([`gid`]),
//! the port and device choice ([`port`]), the queue-pair transition plans
//! ([`qp_plan`]), the endpoint codec ([`endpoint`]), the registration cache
//! ([`reg_cache`]), completion decoding ([`completion`]) and status advice
//! ([`status`]), the settings ([`config`]) and the errors ([`error`]). The
//! modules that call the device (`device`, `mr`, `cq`, `qp`) only translate
//! between those types and libibverbs' structs, and exist only with the
//! feature. Without it, [`open`] is a stub that says how to rebuild, so
//! gradwire's default build needs neither rdma-core's headers nor libclang.
//!
//! # Why rdma-sys
//!
//! This crate binds libibverbs through `rdma-sys` 0.3 (bindgen over the
//! installed `<infiniband/verbs.h>`, plus hand-written Rust for the header's
//! inline functions: `ibv_post_send`, `ibv_poll_cq`, `ibv_req_notify_cq`,
//! `ibv_query_port`) and keeps its own safe layer small and shaped for
//! gradwire. The alternatives:
//!
//! - `ibverbs` 0.9 has a safe API, but its queue pair cannot post RDMA
//!   WRITE WITH IMM (it posts sends and receives only), which is the whole
//!   one-sided protocol, and it registers only memory it allocates itself
//!   (`ProtectionDomain::allocate` returning a `MemoryRegion<T>` that owns
//!   its buffer), where gradwire must register the caller's buffers
//!   (`Transport::register` takes a pointer). Using only its FFI half would
//!   be rdma-sys with a safe layer we cannot use.
//! - `sideway` is a maintained safe wrapper built on `rdma-mummy-sys`,
//!   which compiles stub symbols and loads the real libibverbs at run time
//!   (dlopen). So one binary starts on any machine and its build needs no
//!   rdma-core headers, and it exposes the newer `ibv_wr_*` posting API.
//!   The cost: a missing or old rdma-core shows up only at run time, as
//!   every verbs call failing with `EOPNOTSUPP` rather than a link error
//!   or "no RDMA device: …"; its build needs CMake and Clang; and its
//!   own ownership model and buffer types, centred on `ibv_wr_*` (its
//!   README makes no performance promise for the classic `ibv_post_send`
//!   path), sit between the engine and the device. gradwire gets the
//!   "builds anywhere" half differently: the `verbs` feature is off by
//!   default. The trade-off kept: a binary built with it links
//!   libibverbs.so.1 and will not start where rdma-core is not installed,
//!   even if no RDMA transport is used; a transport backend that must not
//!   have that dependency would switch to sideway (or dlopen itself).
//!
//! # Unsafe
//!
//! `unsafe` appears only at FFI calls and where the device's access to
//! memory cannot be checked (`ProtectionDomain::register` and the
//! accessors of `RegisteredBuffer`), each with a `// SAFETY:` comment
//! (enforced by `clippy::undocumented_unsafe_blocks`). Nothing that comes
//! from the device, a file or a peer is unwrapped.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(feature = "verbs"), forbid(unsafe_code))]

pub mod completion;
pub mod config;
pub mod endpoint;
pub mod error;
pub mod gid;
pub mod port;
pub mod qp_plan;
pub mod reg_cache;
pub mod status;

#[cfg(feature = "verbs")]
mod cq;
#[cfg(feature = "verbs")]
mod device;
#[cfg(feature = "verbs")]
mod mr;
#[cfg(feature = "verbs")]
mod qp;
#[cfg(feature = "verbs")]
mod srq;
#[cfg(feature = "verbs")]
mod sys;

pub use completion::{Completion, Opcode};
pub use config::Config;
pub use endpoint::{ENDPOINT_LEN, QpEndpoint};
pub use error::{Errno, Error, Result};
pub use gid::{GidChoice, GidEntry, GidTable, GidType, choose_gid};
pub use port::{LinkLayer, Mtu, PortInfo, PortState};
pub use qp_plan::{DeviceLimits, LocalPath, QpOptions};
pub use reg_cache::RegCache;

#[cfg(feature = "verbs")]
pub use cq::{CompChannel, CompletionQueue};
#[cfg(feature = "verbs")]
pub use device::{Hca, device_names, open};
#[cfg(feature = "verbs")]
pub use mr::{MemoryRegion, ProtectionDomain, RegisteredBuffer, RemoteAddr, Slice, check_slice};
#[cfg(feature = "verbs")]
pub use qp::{Init, Qp, ReadyToReceive, ReadyToSend, Receiving, Reset};
#[cfg(feature = "verbs")]
pub use srq::SharedReceiveQueue;

/// Whether this build can talk to a device (the `verbs` feature).
pub const ENABLED: bool = cfg!(feature = "verbs");

/// In a build without the `verbs` feature there is no device to open; this
/// type has no values.
#[cfg(not(feature = "verbs"))]
#[derive(Debug)]
pub enum Hca {}

/// Opens an RDMA device. This build has no verbs support, so it always
/// fails with [`Error::NotBuilt`].
#[cfg(not(feature = "verbs"))]
pub fn open(_cfg: &Config) -> Result<Hca> {
    Err(Error::NotBuilt)
}

#[cfg(all(test, not(feature = "verbs")))]
mod stub_tests {
    use super::*;

    #[test]
    fn open_says_how_to_rebuild() {
        let e = open(&Config::default()).unwrap_err();
        assert!(matches!(e, Error::NotBuilt));
        assert_eq!(
            e.to_string(),
            "gradwire was built without the verbs feature: rebuild with --features verbs"
        );
        const { assert!(!ENABLED) };
    }
}
