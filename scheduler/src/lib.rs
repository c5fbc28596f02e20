//! Which job runs on which device type, and when: the cluster scheduler.
//!
//! The job server places one job at a time and balances its local batches
//! (OptPerf, `gw_planner`); a shared cluster runs many jobs on racks of
//! different GPU types, and who waits how long depends on the order and the
//! types each job gets. This crate is that decision as pure computation,
//! like `gw_planner` is for batches: every [`Policy`] turns one round's
//! inventory and jobs into allocations, and [`simulate`] replays a trace
//! through the very same policy code that a live server would call.
//!
//! * [`Cluster`] and [`Trace`]: the `keyword key=value` files
//!   (`jobserver/traces/`), and [`generate`] for synthetic traces;
//! * [`policy`]: the interface and [`policy::by_name`];
//!   [`fifo`], [`gavel`] (with its [`lp`]), [`hadar`] and [`hadare`];
//! * [`simulate`] and its [`Report`].
//!
//! docs/scheduler.md gives each policy's formulas and sources.

pub mod cluster;
pub mod fifo;
pub mod gavel;
pub mod generate;
pub mod hadar;
pub mod hadare;
pub mod lp;
pub mod policy;
pub mod progress;
pub mod rate;
pub mod report;
mod rng;
pub mod sim;
pub mod trace;

pub use cluster::Cluster;
pub use generate::generate;
pub use gw_linefile::FileError;
pub use policy::{Decision, JobState, Policy, Round, Slots};
pub use report::Report;
pub use sim::{SimError, simulate};
pub use trace::Trace;
