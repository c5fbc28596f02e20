//! How fast a job trains on an allocation.
//!
//! T[j][k] is the job's steps/s with all W workers on type k, so one worker
//! of type k computes a local batch of B/W samples in 1/T[j][k] seconds: a
//! per-sample time of W / (B · T[j][k]). On a mix of types every rank waits
//! for the slowest at the all-reduce, so the local batches come from the
//! OptPerf planner ([`gw_planner::plan_optperf`]) and a step takes its
//! slowest rank's time. The policies rank thousands of candidate
//! allocations per round and use [`estimate`], the planner's continuous
//! bound (throughputs add up); the simulator charges [`actual`], the
//! integer plan.

use gw_planner::{Linear, plan_optperf};

/// Steps/s of `alloc` (slots per type, summing to `workers`), ignoring the
/// rounding of local batches.
pub fn estimate(tput: &[f64], workers: u32, alloc: &[u32]) -> f64 {
    let w = f64::from(workers.max(1));
    alloc
        .iter()
        .zip(tput)
        .map(|(n, t)| f64::from(*n) * t / w)
        .sum()
}

/// Steps/s of `alloc` with the integer local batches OptPerf would give a
/// global batch of `batch` samples.
pub fn actual(tput: &[f64], workers: u32, batch: u64, alloc: &[u32]) -> f64 {
    let mut used = alloc.iter().zip(tput).filter(|(n, _)| **n > 0);
    let single = match (used.next(), used.next()) {
        (Some((n, t)), None) if *n == workers => Some(*t),
        (None, _) => return 0.0,
        _ => None,
    };
    if let Some(t) = single {
        return t;
    }
    let w = f64::from(workers);
    let mut models = Vec::with_capacity(workers as usize);
    for (n, t) in alloc.iter().zip(tput) {
        if *n > 0 && *t <= 0.0 {
            return 0.0;
        }
        let a = w / (batch as f64 * t);
        models.extend((0..*n).map(|_| Linear { a, c: 0.0 }));
    }
    match plan_optperf(&models, batch, 1, batch) {
        Ok(b) => {
            let step = models
                .iter()
                .zip(&b)
                .map(|(m, b)| m.time(*b))
                .fold(0.0f64, f64::max);
            if step > 0.0 { 1.0 / step } else { 0.0 }
        }
        // Only when the batch is smaller than the ranks, which the trace
        // parser refuses: treat as not running rather than guess.
        Err(_) => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_type_is_the_table_and_a_mix_is_near_the_sum() {
        let t = [4.0, 1.0];
        assert_eq!(actual(&t, 4, 128, &[4, 0]), 4.0);
        assert_eq!(actual(&t, 4, 128, &[0, 4]), 1.0);
        assert_eq!(actual(&t, 4, 128, &[0, 0]), 0.0);
        // Two fast ranks (1 step/s each worth) and two slow: the estimate is
        // 2 + 0.5; OptPerf's integer plan can only lose a little to rounding.
        let mix = actual(&t, 4, 128, &[2, 2]);
        let est = estimate(&t, 4, &[2, 2]);
        assert_eq!(est, 2.5);
        assert!(mix <= est + 1e-12 && mix > 0.97 * est, "{mix} vs {est}");
        // Even split would run at the slow ranks' pace, 4 × 0.25 = 1 step/s.
        assert!(mix > 1.0);
    }
}
