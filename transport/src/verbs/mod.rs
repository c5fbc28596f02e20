//! The direct verbs backend (`GW_TRANSPORT=verbs`): the protocol of
//! [`crate::nic`] on reliable-connected queue pairs of `gw-verbs`.
//!
//! Each rank makes one queue pair per peer when it opens, all on one shared
//! receive queue that holds the driver's bounce buffers (so a peer's burst
//! of frames and immediates draws on the whole pool, as on a libfabric
//! endpoint, and a failed queue pair flushes no receives), and publishes
//! their endpoints as one name ([`names`]). Once every rank's record is in,
//! [`VerbsTransport::connect_all`] brings every queue pair to RTS (the
//! typestate of `gw_verbs::Qp`): a queue pair still in INIT drops what
//! arrives, so connecting lazily, as libfabric's rxm may, would leave a
//! sender retrying into a peer that has not looked yet. One completion
//! queue with a completion channel serves every queue pair, so the engine
//! sleeps on one descriptor; queue sizes, reads in flight and the largest
//! message follow what the device reports.
//!
//! Built only with the `verbs` feature (rdma-core's headers and libclang);
//! the encoding of the published name and the handling of completions
//! are pure and always built, and tested.

pub mod completions;
pub mod names;

#[cfg(feature = "verbs")]
mod device;
#[cfg(all(test, feature = "verbs"))]
mod tests_device;

#[cfg(feature = "verbs")]
pub use device::{VerbsNic, VerbsTransport};
