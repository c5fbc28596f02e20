//! OptPerf, the step planner: pure computation, no I/O, so the job server,
//! tests and benchmarks drive it the same way.
//!
//! * [`RankFit`] learns each rank's compute time t(b) = a·b + c online;
//! * [`plan_optperf`] turns the fits into local batch sizes that make the
//!   slowest rank as fast as possible ([`plan_even`] is the baseline);
//! * [`predict_step`] and [`needs_replan`] say what a plan costs and when it
//!   has gone stale;
//! * [`NoiseScale`] tracks the gradient noise scale, which tells the server
//!   how large the global batch may usefully be.

mod allocate;
mod error;
mod fit;
mod model;
mod noise;
mod replan;

pub use allocate::{plan_even, plan_optperf};
pub use error::PlanError;
pub use fit::RankFit;
pub use model::Linear;
pub use noise::NoiseScale;
pub use replan::{needs_replan, needs_replan_within, predict_step};
