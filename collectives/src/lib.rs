//! gradwire's collectives layer: combining bytes.
//!
//! A [`Communicator`] is brought up from the environment `gwrun` (or Slurm, or
//! torchrun) sets, and runs collectives on a progress engine thread. Each
//! collective algorithm is a deterministic state machine without I/O
//! ([`algo`]); the engine feeds it transfer completions and carries out the
//! sends, receives and reductions it asks for over whichever transport reaches
//! each peer.

pub mod algo;
mod alltoall;
mod board;
mod bringup;
pub mod comm_key;
pub mod communicator;
pub mod config;
mod deferred;
mod drive;
pub mod element;
mod engine;
mod host_coll;
mod host_rounds;
mod kept_plan;
pub mod local;
mod mailbox;
pub mod model;
pub mod op;
mod operation;
pub mod persistent;
pub mod put;
pub mod reduce;
pub mod registration;
mod sched_cache;
pub mod shared_all_reduce;
pub mod size_curve;
mod trace;

pub use algo::{Algo, MAX_DEPTH};
pub use comm_key::CommKey;
pub use communicator::{Communicator, Handle, Pending, RawOp};
pub use config::{Config, OneSided, TransportChoice};
pub use element::Element;
#[doc(hidden)]
pub use engine::{direct_calls, in_place_reads, messages_posted, registrations, stall_checks};
pub use gw_rendezvous::LaunchEnv;
pub use gw_rendezvous::launch_env;
pub use gw_transport::{Error, Result};
pub use op::{DType, Fingerprint, OpKind, RedOp};
pub use persistent::{Persistent, PersistentAllReduce, RawPersistent};
pub use put::PersistentTransfer;
pub use registration::Registration;
pub use shared_all_reduce::{RawSharedAllReduce, SharedAllReduce};

/// Under `GW_TRACE`, records a span of the program's own work that began at
/// `started` and ends now — a training step's compute, say — on this rank's
/// `compute` lane of the timeline, with `step` in its arguments, so that
/// the trace shows what the collectives overlapped with. Free (one atomic
/// load) when tracing is off or no communicator asked for it.
pub fn trace_span(name: &'static str, started: std::time::Instant, step: u64) {
    if trace::enabled() {
        let start = trace::now_us() - started.elapsed().as_secs_f64() * 1e6;
        trace::record(name, trace::Lane::Compute, start, step, 0, None);
    }
}

/// [`trace_span`] for callers whose names are not compiled in (the C ABI's
/// `gwTraceSpan`, Python): a span of `seconds` that ends now. Names are
/// kept for the process's life, so at most [`TRACE_NAMES`] distinct ones
/// are; spans under further names are recorded as `compute`. A name must
/// be 1 to 64 letters, digits and `_ - . : /` (it goes into JSON as is);
/// `seconds` must be finite, at least 0 and under a day. Checked whether or
/// not tracing is on, so that a wrong call shows at once.
pub fn trace_span_named(name: &str, seconds: f64, step: u64) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "_-.:/".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok_char) {
        return Err(Error::InvalidArgument(format!(
            "trace span name {name:?}: use 1 to 64 letters, digits and _ - . : /"
        )));
    }
    if !(seconds.is_finite() && (0.0..86_400.0).contains(&seconds)) {
        return Err(Error::InvalidArgument(format!(
            "trace span {name:?} of {seconds} seconds: give a duration from 0 to 86400"
        )));
    }
    if trace::enabled() {
        let start = trace::now_us() - seconds * 1e6;
        trace::record(
            trace::intern(name),
            trace::Lane::Compute,
            start,
            step,
            0,
            None,
        );
    }
    Ok(())
}

pub use trace::MAX_NAMES as TRACE_NAMES;
