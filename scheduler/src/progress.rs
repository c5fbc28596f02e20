//! How far a job gets in one round, counted in whole samples, and how its
//! copies' parameters are merged (HadarE).
//!
//! A job needs `steps × batch` samples. A single copy credits every sample
//! it processes. m > 1 copies train on separate shards and average their
//! parameters at the round's end, which is local SGD with one sync per
//! round: a sample then moves the model less than in synchronous SGD. We
//! charge that as an efficiency e(m) = 1 / (1 + β (m − 1)) on the samples
//! credited (β = [`COPY_COST`]); docs/scheduler.md says where β comes from.
//! Counting in integers makes the totals exact: a job is credited exactly
//! its samples when it finishes, and the samples its copies process sum to
//! exactly what the merge weighs.

/// β: the statistical cost of each extra copy of a job.
pub const COPY_COST: f64 = 0.1;

/// e(m): the fraction of samples credited when `copies` copies train.
pub fn efficiency(copies: usize) -> f64 {
    if copies <= 1 {
        1.0
    } else {
        1.0 / (1.0 + COPY_COST * (copies - 1) as f64)
    }
}

/// One round of progress.
#[derive(Clone, Debug, PartialEq)]
pub struct Advance {
    /// Samples each copy processed, in the order of the rates given.
    pub samples: Vec<u64>,
    /// Samples credited to the job (≤ the remaining ones).
    pub credited: u64,
    /// Seconds into the round at which the job finished, if it did.
    pub finished_after_s: Option<f64>,
}

/// Progress of a job with `remaining` samples to credit whose copies
/// process `rates` samples/s each, over `dt` seconds.
pub fn advance(remaining: u64, rates: &[f64], dt: f64) -> Advance {
    let running = rates.iter().filter(|r| **r > 0.0).count();
    let total: f64 = rates.iter().filter(|r| **r > 0.0).sum();
    let none = Advance {
        samples: vec![0; rates.len()],
        credited: 0,
        finished_after_s: None,
    };
    if remaining == 0 || total <= 0.0 || dt <= 0.0 {
        return none;
    }
    let e = efficiency(running);
    let need = (remaining as f64 / e).ceil().max(remaining as f64) as u64;
    if total * dt >= need as f64 {
        let samples = apportion(need, rates);
        return Advance {
            samples,
            credited: remaining,
            finished_after_s: Some((need as f64 / total).min(dt)),
        };
    }
    let samples: Vec<u64> = rates
        .iter()
        .map(|r| (r.max(0.0) * dt).floor() as u64)
        .collect();
    let raw: u64 = samples.iter().sum();
    let credited = ((raw as f64 * e).floor() as u64).min(remaining - 1);
    Advance {
        samples,
        credited,
        finished_after_s: None,
    }
}

/// `n` split in proportion to `weights` (largest remainders, ties to the
/// lower index), summing to exactly `n`.
fn apportion(n: u64, weights: &[f64]) -> Vec<u64> {
    let total: f64 = weights.iter().filter(|w| **w > 0.0).sum();
    let mut out: Vec<u64> = Vec::with_capacity(weights.len());
    let mut rest: Vec<(usize, f64)> = Vec::with_capacity(weights.len());
    for (i, w) in weights.iter().enumerate() {
        let exact = if *w > 0.0 { n as f64 * w / total } else { 0.0 };
        out.push(exact.floor() as u64);
        rest.push((i, exact - exact.floor()));
    }
    let mut given: u64 = out.iter().sum();
    // Floating error can only make the floors sum past n by a hair.
    while given > n {
        if let Some(x) = out.iter_mut().rev().find(|x| **x > 0) {
            *x -= 1;
        }
        given -= 1;
    }
    rest.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (i, _) in rest
        .iter()
        .filter(|(i, _)| weights[*i] > 0.0)
        .cycle()
        .take((n - given) as usize)
    {
        out[*i] += 1;
    }
    out
}

/// One copy's contribution at a round's end.
#[derive(Clone, Debug, PartialEq)]
pub struct Copy {
    pub samples: u64,
    pub params: Vec<f64>,
}

/// The merged model: parameters averaged with weights samples / total.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    pub samples: u64,
    pub params: Vec<f64>,
}

/// HadarE's weighted parameter averaging. Copies that processed nothing
/// carry no weight; with no samples at all the first copy's parameters
/// stand. Copies must have parameters of one length (the longer ones'
/// tails are ignored otherwise).
pub fn average(copies: &[Copy]) -> Merged {
    let samples: u64 = copies.iter().map(|c| c.samples).sum();
    let len = copies.iter().map(|c| c.params.len()).min().unwrap_or(0);
    if samples == 0 {
        let params = copies
            .first()
            .map(|c| c.params[..len].to_vec())
            .unwrap_or_default();
        return Merged { samples, params };
    }
    let mut params = vec![0.0; len];
    for c in copies {
        let w = c.samples as f64 / samples as f64;
        for (p, x) in params.iter_mut().zip(&c.params) {
            *p += w * x;
        }
    }
    Merged { samples, params }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However the copies come and go, a job is credited exactly its
        /// samples, and the merge weighs exactly the samples processed.
        #[test]
        fn copies_keep_the_total_exact(
            total in 1u64..5_000_000,
            rounds in prop::collection::vec(prop::collection::vec(0.0f64..5_000.0, 1..5), 1..40),
            dt in 1.0f64..400.0,
        ) {
            let mut remaining = total;
            let mut credited = 0u64;
            for rates in rounds.iter().cycle().take(10_000) {
                let a = advance(remaining, rates, dt);
                let copies: Vec<Copy> = a.samples.iter().map(|s| Copy { samples: *s, params: vec![1.0, 2.0] }).collect();
                let merged = average(&copies);
                prop_assert_eq!(merged.samples, a.samples.iter().sum::<u64>());
                if merged.samples > 0 {
                    prop_assert!((merged.params[0] - 1.0).abs() < 1e-9);
                }
                prop_assert!(a.credited <= remaining);
                prop_assert!(a.credited <= merged.samples);
                remaining -= a.credited;
                credited += a.credited;
                if a.finished_after_s.is_some() {
                    prop_assert_eq!(remaining, 0);
                    break;
                }
                prop_assert!(remaining > 0);
            }
            prop_assert_eq!(credited + remaining, total);
        }
    }

    #[test]
    fn one_copy_is_exact_and_the_merge_weighs_by_samples() {
        let a = advance(1000, &[10.0], 60.0);
        assert_eq!(
            (a.samples.as_slice(), a.credited, a.finished_after_s),
            (&[600][..], 600, None)
        );
        let a = advance(400, &[10.0], 60.0);
        assert_eq!(
            (a.samples.as_slice(), a.credited, a.finished_after_s),
            (&[400][..], 400, Some(40.0))
        );
        // Two copies: e = 1/1.1, so 1000 credited samples need 1100.
        let a = advance(1000, &[30.0, 10.0], 100.0);
        assert_eq!(a.samples.iter().sum::<u64>(), 1100);
        assert_eq!(a.samples, [825, 275]);
        assert_eq!(a.credited, 1000);
        let m = average(&[
            Copy {
                samples: 3,
                params: vec![1.0, 0.0],
            },
            Copy {
                samples: 1,
                params: vec![5.0, 4.0],
            },
            Copy {
                samples: 0,
                params: vec![100.0, 100.0],
            },
        ]);
        assert_eq!((m.samples, m.params), (4, vec![2.0, 1.0]));
    }
}
