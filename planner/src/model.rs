//! The per-rank timing model every other part of the planner speaks:
//! compute time grows linearly with the local batch. Evaluation lives here,
//! in one function, so that the planner, the predictions and the tests all
//! round the same way and agree on which plan is optimal to the last bit.

use serde::{Deserialize, Serialize};

use crate::error::PlanError;

/// t(b) = a·b + c seconds for a local batch of b samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Linear {
    pub a: f64,
    pub c: f64,
}

impl Linear {
    /// Predicted seconds for a local batch of `batch` samples.
    ///
    /// Two IEEE operations with no fused multiply-add, so the value is the
    /// same on every machine. Both are monotone in their inputs, so for
    /// `a ≥ 0` the rounded t(b) never decreases as b grows: the planner's
    /// searches rely on that.
    #[inline]
    pub fn time(&self, batch: u64) -> f64 {
        self.a * batch as f64 + self.c
    }

    /// (seconds − prediction) / prediction: timing noise grows with the
    /// time itself, so the fit judges steps relative to what it predicted.
    pub fn relative_residual(&self, batch: u64, seconds: f64) -> f64 {
        let predicted = self.time(batch);
        (seconds - predicted) / predicted.max(f64::MIN_POSITIVE)
    }

    /// Ok if the model can describe a real rank: both coefficients finite
    /// and non-negative (-0.0 counts as 0).
    pub(crate) fn validate(&self, rank: usize) -> Result<(), PlanError> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if ok(self.a) && ok(self.c) {
            Ok(())
        } else {
            Err(PlanError::InvalidModel {
                rank,
                a: self.a,
                c: self.c,
            })
        }
    }
}
