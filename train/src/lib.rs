//! gw-train: a real data-parallel training worker for gradwire, used to show
//! (and test) what the job server's planner buys on heterogeneous ranks.
//!
//! It trains an MLP by SGD on a deterministic synthetic classification
//! stream, all arithmetic in f64 written here, so that runs with different
//! splits of the same global batches can be compared parameter by parameter.
//! Plans come from the job server's step protocol when the worker runs under
//! `gwjob`, or from a local even split under `gwrun`.

pub mod checkpoint;
pub mod data;
pub mod mlp;
pub mod plan;
pub mod report;
pub mod stop;
pub mod worker;

/// The worker's side of the step protocol (shared with the C ABI and Python).
pub use gw_jobapi::step;
