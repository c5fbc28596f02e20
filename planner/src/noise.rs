//! The gradient noise scale B_noise = tr(Σ)/|G|² (McCandlish et al., "An
//! Empirical Model of Large-Batch Training"): the batch size beyond which
//! larger batches stop buying proportionally fewer steps. The job server
//! tracks it to choose the global batch; this module estimates it from
//! what every step already produces, with the unequal local batches that
//! OptPerf plans (as in Cannikin).
//!
//! # Derivation
//!
//! Per-sample gradients are independent with mean G and covariance Σ; write
//! S = tr(Σ). Rank i averages b_i samples into g_i; the weighted all-reduce
//! forms g = Σ r_i g_i with r_i = b_i/B, B = Σ b_i, i.e. the mean over all B
//! samples. The ranks report X_i = |g_i|² and Y = |g|², and
//!
//! ```text
//! E X_i = |G|² + S/b_i        E Y = |G|² + S/B.
//! ```
//!
//! Pool the ranks with the weights r_i: X̄ = Σ r_i X_i has
//! E X̄ = |G|² + S·Σ r_i/b_i = |G|² + n·S/B. Two linear equations give
//!
//! ```text
//! Ŝ    = B·(X̄ − Y)/(n − 1)        E Ŝ = S
//! Ĝ²   = (n·Y − X̄)/(n − 1)        E Ĝ² = |G|²
//! ```
//!
//! Both are **unbiased** for every step, whatever the b_i. With equal b_i
//! they are McCandlish's two-batch estimators with B_small = B/n and
//! B_big = B.
//!
//! Any weights summing to one would be unbiased too; r_i is the right
//! choice because where the noise scale matters (local batches not far
//! above B_noise) the variance of X_i is dominated by 2·tr(Σ²)/b_i², and the
//! signal-to-noise ratio (Σ w_i/b_i)² / Σ w_i²/b_i² is largest, by
//! Cauchy–Schwarz, when w_i/b_i is constant. (It also means Σ b_i·X_i is one
//! more scalar in the same weighted all-reduce.)
//!
//! The naive formula averages the X_i equally as if every rank had B/n
//! samples. Its expectation carries S·mean(1/b_i), which exceeds S·n/B
//! (arithmetic versus harmonic mean) whenever the b_i differ, so it
//! overstates S and understates |G|²: for local batches 4, 12, 32, 80 it
//! expects 3.7× the true S, and at B_noise = 50 a negative |G|². The tests
//! show both.
//!
//! # Across steps
//!
//! One step's Ĝ² is noisy and often negative, so per-step ratios are
//! useless. As McCandlish does, Ŝ and Ĝ² are averaged separately with an
//! exponential moving average and B_noise is the ratio of the averages.
//! The averages stay unbiased; their ratio is **consistent** (its bias
//! shrinks like 1/(effective number of steps)), not unbiased.

use serde::{Deserialize, Serialize};

/// Default weight per step of the moving averages: about the last 100
/// steps count.
const DEFAULT_DECAY: f64 = 0.99;

/// Gradient noise scale estimated from unequal local batches.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NoiseScale {
    decay: f64,
    /// Σ decay^age over the steps used.
    weight: f64,
    /// Σ decay^age · Ŝ and Σ decay^age · Ĝ².
    trace_sum: f64,
    grad_sq_sum: f64,
    steps: u64,
}

impl Default for NoiseScale {
    fn default() -> NoiseScale {
        NoiseScale::with_decay(DEFAULT_DECAY)
    }
}

impl NoiseScale {
    /// An estimator whose moving averages weight each older step by `decay`
    /// (1 = plain averages over all steps). Clamped to [0.5, 1]; NaN means
    /// the default 0.99.
    pub fn with_decay(decay: f64) -> NoiseScale {
        let decay = if decay.is_nan() {
            DEFAULT_DECAY
        } else {
            decay.clamp(0.5, 1.0)
        };
        NoiseScale {
            decay,
            weight: 0.0,
            trace_sum: 0.0,
            grad_sq_sum: 0.0,
            steps: 0,
        }
    }

    /// Adds one step: `batches[i]` samples on rank i, `local_grad_sq[i]` =
    /// |g_i|² of that rank's mean gradient, `global_grad_sq` = |g|² of the
    /// weighted all-reduced gradient.
    ///
    /// Ranks with no samples carry no gradient and are left out. A step
    /// says nothing about the noise with fewer than two ranks left, and is
    /// ignored when the slices differ in length or a value is NaN, infinite
    /// or negative (a squared norm cannot be).
    pub fn observe(&mut self, batches: &[u64], local_grad_sq: &[f64], global_grad_sq: f64) {
        // Huge but finite norms could overflow the sums: such a step is
        // dropped whole rather than leave an estimate that cannot be stored.
        let before = self.clone();
        self.observe_finite(batches, local_grad_sq, global_grad_sq);
        if ![self.weight, self.trace_sum, self.grad_sq_sum]
            .iter()
            .all(|x| x.is_finite())
        {
            *self = before;
        }
    }

    fn observe_finite(&mut self, batches: &[u64], local_grad_sq: &[f64], global_grad_sq: f64) {
        if batches.len() != local_grad_sq.len()
            || !(global_grad_sq.is_finite() && global_grad_sq >= 0.0)
        {
            return;
        }
        let mut ranks = 0u64;
        let mut total = 0u128;
        let mut weighted = 0.0;
        for (&b, &x) in batches.iter().zip(local_grad_sq) {
            if b == 0 {
                continue;
            }
            if !(x.is_finite() && x >= 0.0) {
                return;
            }
            ranks += 1;
            total += b as u128;
            weighted += b as f64 * x;
        }
        if ranks < 2 {
            return;
        }
        let big = total as f64;
        let n = ranks as f64;
        let pooled = weighted / big;
        let trace = big * (pooled - global_grad_sq) / (n - 1.0);
        let grad_sq = (n * global_grad_sq - pooled) / (n - 1.0);

        self.weight = self.decay * self.weight + 1.0;
        self.trace_sum = self.decay * self.trace_sum + trace;
        self.grad_sq_sum = self.decay * self.grad_sq_sum + grad_sq;
        self.steps += 1;
    }

    /// B_noise = tr(Σ)/|G|², the ratio of the averaged estimates. None
    /// before any usable step, and while either average is ≤ 0 (early on,
    /// noise can push them there; no batch size follows from that).
    pub fn estimate(&self) -> Option<f64> {
        let trace = self.trace_sigma()?;
        let grad_sq = self.grad_sq()?;
        (trace > 0.0 && grad_sq > 0.0).then(|| trace / grad_sq)
    }

    /// The averaged estimate of tr(Σ), the per-sample gradient variance.
    pub fn trace_sigma(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.trace_sum / self.weight)
    }

    /// The averaged estimate of |G|², the squared true gradient norm.
    pub fn grad_sq(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.grad_sq_sum / self.weight)
    }

    /// Steps that were used.
    pub fn steps(&self) -> u64 {
        self.steps
    }
}
