//! Predictions from a plan, and the decision whether a plan has gone stale.
//!
//! The job server re-fits every rank's timing as steps complete; a plan made
//! from older fits stays in force until re-planning would actually pay, so
//! that ranks are not re-sent batch sizes on every wobble of a measurement.

use crate::allocate::plan_optperf;
use crate::model::Linear;

/// Predicted step time: `max_i t_i(b_i) + comm_s`, where `comm_s` is the
/// all-reduce time that does not overlap with compute.
///
/// Pairs `models[i]` with `batches[i]`; entries without a partner are
/// ignored. With no pairs at all the step is just `comm_s`.
pub fn predict_step(models: &[Linear], batches: &[u64], comm_s: f64) -> f64 {
    slowest(models, batches) + comm_s
}

/// The slowest rank's predicted compute time, 0 with no ranks.
fn slowest(models: &[Linear], batches: &[u64]) -> f64 {
    models
        .iter()
        .zip(batches)
        .map(|(m, &b)| m.time(b))
        .fold(0.0, f64::max)
}

/// How many times slower `batches` is under `models` than the best plan
/// for the same global batch within `[lo, hi]` (1 = optimal); None when no
/// plan can be made (invalid model, bounds that exclude the global batch).
fn slowdown(models: &[Linear], batches: &[u64], lo: u64, hi: u64) -> Option<f64> {
    let global = batches.iter().try_fold(0u64, |s, &b| s.checked_add(b))?;
    let best = plan_optperf(models, global, lo, hi).ok()?;
    let (current, optimum) = (slowest(models, batches), slowest(models, &best));
    // current ≥ optimum ≥ 0; an optimum of 0 leaves ratio 1 only if equal.
    Some(if current <= optimum {
        1.0
    } else {
        current / optimum
    })
}

/// Whether the fits moved enough since `batches` was planned from `planned`
/// that re-planning pays. True when
///
/// * the ranks changed: the three slices differ in length;
/// * the plan's predicted compute time under `now` differs from the one
///   under `planned` by more than `tol` (relative): the fits moved; or
/// * the plan is no longer optimal: under `now`, its slowdown against the
///   best plan (time / best time) exceeds the slowdown it had under
///   `planned` by more than a factor 1 + `tol`.
///
/// The per-rank bounds the plan was made under are not known here, so the
/// best plan is taken without them (any b_i in `[0, Σ b]`). Bounds that
/// bind make even a fresh plan look improvable that way; dividing by the
/// slowdown the plan already had under `planned` — the fits it was optimal
/// for — cancels that, so a bound-limited plan is not re-planned on every
/// call, while a rank that became much faster or slower is still noticed.
/// With the real bounds, [`needs_replan_within`] compares against the true
/// best plan directly.
///
/// Never true because of a model the planner rejects (NaN, negative) in
/// `now`: no plan can come from it, and plan_optperf names the problem when
/// the server tries.
pub fn needs_replan(planned: &[Linear], now: &[Linear], batches: &[u64], tol: f64) -> bool {
    if let Some(moved) = moved(planned, now, batches, tol) {
        return moved;
    }
    let total = batches.iter().try_fold(0u64, |s, &b| s.checked_add(b));
    let Some(total) = total else { return false };
    let Some(now_ratio) = slowdown(now, batches, 0, total) else {
        return false;
    };
    let then_ratio = slowdown(planned, batches, 0, total).unwrap_or(1.0);
    now_ratio > then_ratio * (1.0 + tol.max(0.0))
}

/// [`needs_replan`] knowing the bounds `[lo, hi]` the plan was made under:
/// the optimality test then asks directly whether the best plan under `now`
/// is more than `tol` faster.
pub fn needs_replan_within(
    planned: &[Linear],
    now: &[Linear],
    batches: &[u64],
    lo: u64,
    hi: u64,
    tol: f64,
) -> bool {
    if let Some(moved) = moved(planned, now, batches, tol) {
        return moved;
    }
    slowdown(now, batches, lo, hi).is_some_and(|ratio| ratio > 1.0 + tol.max(0.0))
}

/// The checks both variants share: Some(answer) when it is already known
/// from the shapes or from the predicted time alone, None when the
/// optimality test must decide.
fn moved(planned: &[Linear], now: &[Linear], batches: &[u64], tol: f64) -> Option<bool> {
    if planned.len() != batches.len() || now.len() != batches.len() {
        return Some(true);
    }
    if batches.is_empty() {
        return Some(false);
    }
    let then = slowest(planned, batches);
    let current = slowest(now, batches);
    if (current - then).abs() > tol.max(0.0) * then {
        return Some(true);
    }
    None
}
