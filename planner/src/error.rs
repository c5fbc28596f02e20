//! Why a plan could not be made. The job server shows these messages to
//! whoever submitted the job, so each one names the numbers that conflict
//! rather than just the rule that was broken.

use std::fmt;

/// A planning request that has no valid answer.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    /// There is no rank to give samples to.
    NoWorkers,
    /// The per-rank bounds are empty: `lo > hi`.
    BoundsInverted { lo: u64, hi: u64 },
    /// Even giving every rank its lower bound needs more samples than the
    /// global batch holds.
    GlobalBelowMinimum {
        global: u64,
        workers: usize,
        lo: u64,
    },
    /// Even giving every rank its upper bound leaves samples over.
    GlobalAboveMaximum {
        global: u64,
        workers: usize,
        hi: u64,
    },
    /// A timing model that cannot describe a real rank: `a` or `c` is NaN,
    /// infinite or negative.
    InvalidModel { rank: usize, a: f64, c: f64 },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoWorkers => write!(f, "no workers to plan for"),
            PlanError::BoundsInverted { lo, hi } => write!(
                f,
                "lower bound {lo} is above upper bound {hi} for the local batch"
            ),
            PlanError::GlobalBelowMinimum {
                global,
                workers,
                lo,
            } => write!(
                f,
                "global batch {global} is below {workers} workers × lower bound {lo}"
            ),
            PlanError::GlobalAboveMaximum {
                global,
                workers,
                hi,
            } => write!(
                f,
                "global batch {global} is above {workers} workers × upper bound {hi}"
            ),
            PlanError::InvalidModel { rank, a, c } => write!(
                f,
                "rank {rank} has an invalid timing model t(b) = {a}·b + {c}: \
                 both coefficients must be finite and non-negative"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// The checks every planner shares: workers, bounds and whether the global
/// batch fits between `workers × lo` and `workers × hi`. Products are taken
/// in u128 so that large bounds cannot overflow into a wrong verdict.
pub(crate) fn check_shape(workers: usize, global: u64, lo: u64, hi: u64) -> Result<(), PlanError> {
    if workers == 0 {
        return Err(PlanError::NoWorkers);
    }
    if lo > hi {
        return Err(PlanError::BoundsInverted { lo, hi });
    }
    let n = workers as u128;
    if (global as u128) < n * lo as u128 {
        return Err(PlanError::GlobalBelowMinimum {
            global,
            workers,
            lo,
        });
    }
    if (global as u128) > n * hi as u128 {
        return Err(PlanError::GlobalAboveMaximum {
            global,
            workers,
            hi,
        });
    }
    Ok(())
}
