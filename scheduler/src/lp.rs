//! Gavel's linear programs over time fractions.
//!
//! X[j][k] is the fraction of a round job j spends on device type k (all
//! its W_j workers there). Both of Gavel's objectives used here are a
//! max-min of a linear score per job, so one program serves them:
//!
//! ```text
//! maximise  t + ε Σ_j s_j(X)        with s_j(X) = Σ_k a[j][k] X[j][k]
//! subject to s_j(X) ≥ t                       for every job j
//!            Σ_k X[j][k] ≤ 1                  for every job j
//!            Σ_j W_j X[j][k] ≤ C_k            for every type k
//!            0 ≤ X[j][k] ≤ 1, X[j][k] = 0 where a[j][k] = 0 or W_j > C_k
//! ```
//!
//! * max-min fairness: a[j][k] = T[j][k] / T_eq[j], throughput relative to
//!   the job's throughput on an equal share of the cluster ([`fair_share`]);
//! * minimum total duration: a[j][k] = T[j][k] / R_j, so t = 1 / (the
//!   time until the last job finishes at these rates).
//!
//! The small ε term spends capacity the bottleneck job cannot use on the
//! others instead of leaving it to the solver's whim; it is 10⁻³ of what one
//! unit of t is worth, so it moves t by at most that. The solver is
//! `microlp`, a pure-Rust simplex (see docs/scheduler.md for why).

use microlp::{ComparisonOp, OptimizationDirection, Problem};

/// A solved program: X[j][k] and the max-min value t.
#[derive(Clone, Debug, PartialEq)]
pub struct Fractions {
    pub x: Vec<Vec<f64>>,
    pub t: f64,
}

/// Weight of the efficiency term relative to t.
const EPSILON: f64 = 1e-3;
/// Coefficients below this fraction of the largest are raised to it, to
/// keep the simplex within its numerical range (microlp asks for 10⁶).
const SMALLEST: f64 = 1e-5;

/// Solves the program for scores `a` (jobs × types), `workers` and
/// `capacity` (slots per type). Jobs that cannot run anywhere take no part
/// in the minimum and get no time.
pub fn max_min(a: &[Vec<f64>], workers: &[u32], capacity: &[u32]) -> Result<Fractions, String> {
    let k_types = capacity.len();
    let allowed = |j: usize, k: usize| a[j][k] > 0.0 && workers[j] <= capacity[k];
    let top = a.iter().flatten().fold(0.0f64, |m, x| m.max(*x));
    if top <= 0.0 || !top.is_finite() {
        return Ok(Fractions {
            x: vec![vec![0.0; k_types]; a.len()],
            t: 0.0,
        });
    }
    let scale = |x: f64| (x / top).max(SMALLEST);
    let mut p = Problem::new(OptimizationDirection::Maximize);
    // Scaled scores are ≤ 1 and Σ_k X[j][k] ≤ 1, so t ≤ 1; the bound also
    // keeps t finite when no job can run anywhere.
    let t = p.add_var(1.0, (0.0, 1.0));
    let share = EPSILON / a.len() as f64;
    let mut vars: Vec<Vec<Option<microlp::Variable>>> = Vec::with_capacity(a.len());
    for (j, row) in a.iter().enumerate() {
        let v: Vec<_> = (0..k_types)
            .map(|k| allowed(j, k).then(|| p.add_var(share * scale(row[k]), (0.0, 1.0))))
            .collect();
        vars.push(v);
    }
    let mut live = false;
    for (j, row) in a.iter().enumerate() {
        let mut terms: Vec<(microlp::Variable, f64)> = Vec::new();
        for (k, v) in vars[j].iter().enumerate() {
            if let Some(v) = v {
                terms.push((*v, scale(row[k])));
            }
        }
        if terms.is_empty() {
            continue;
        }
        live = true;
        let ones: Vec<_> = terms.iter().map(|(v, _)| (*v, 1.0)).collect();
        p.add_constraint(&ones[..], ComparisonOp::Le, 1.0);
        terms.push((t, -1.0));
        p.add_constraint(&terms[..], ComparisonOp::Ge, 0.0);
    }
    for (k, cap) in capacity.iter().enumerate() {
        let terms: Vec<_> = (0..a.len())
            .filter_map(|j| vars[j][k].map(|v| (v, f64::from(workers[j]))))
            .collect();
        if !terms.is_empty() {
            p.add_constraint(&terms[..], ComparisonOp::Le, f64::from(*cap));
        }
    }
    let solution = p
        .solve()
        .map_err(|e| format!("the time-fraction LP failed: {e}"))?
        .into_solution()
        .map_err(|e| format!("the time-fraction LP stopped early: {e:?}"))?;
    let x = vars
        .iter()
        .map(|row| {
            row.iter()
                .map(|v| v.map_or(0.0, |v| solution.var_value(v).clamp(0.0, 1.0)))
                .collect()
        })
        .collect();
    let t = if live {
        solution.var_value(t) * top
    } else {
        0.0
    };
    Ok(Fractions { x, t })
}

/// T_eq[j]: job j's throughput on an equal 1/`contenders` share of the
/// cluster — that fraction of the slot-time, spread over the types it can
/// run on in proportion to their size, and never more than its W workers
/// can use.
pub fn fair_share(tput: &[f64], workers: u32, capacity: &[u32], contenders: f64) -> f64 {
    let usable = crate::policy::usable(tput, capacity) as f64;
    if usable <= 0.0 {
        return 0.0;
    }
    let total: f64 = capacity.iter().map(|c| f64::from(*c)).sum();
    let time = (total / (contenders.max(1.0) * f64::from(workers.max(1)))).min(1.0);
    let mean: f64 = tput
        .iter()
        .zip(capacity)
        .map(|(t, c)| t * f64::from(*c))
        .sum::<f64>()
        / usable;
    time * mean
}

/// The max-min fairness scores: T[j][k] / T_eq[j] with all jobs contending.
pub fn fairness_scores(tput: &[Vec<f64>], workers: &[u32], capacity: &[u32]) -> Vec<Vec<f64>> {
    let n = tput.len() as f64;
    tput.iter()
        .zip(workers)
        .map(|(t, w)| {
            let eq = fair_share(t, *w, capacity, n);
            t.iter()
                .map(|x| if eq > 0.0 { x / eq } else { 0.0 })
                .collect()
        })
        .collect()
}

/// The minimum-total-duration scores: T[j][k] / R_j.
pub fn duration_scores(tput: &[Vec<f64>], remaining: &[f64]) -> Vec<Vec<f64>> {
    tput.iter()
        .zip(remaining)
        .map(|(t, r)| t.iter().map(|x| x / r.max(1e-9)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// min_j s_j(X).
    fn score(a: &[Vec<f64>], x: &[Vec<f64>], live: &[bool]) -> f64 {
        a.iter()
            .zip(x)
            .zip(live)
            .filter(|(_, l)| **l)
            .map(|((r, x), _)| r.iter().zip(x).map(|(a, x)| a * x).sum::<f64>())
            .fold(f64::INFINITY, f64::min)
    }

    fn feasible(x: &[Vec<f64>], workers: &[u32], cap: &[u32]) -> bool {
        let rows = x.iter().all(|r| r.iter().sum::<f64>() <= 1.0 + 1e-7);
        let cols = (0..cap.len()).all(|k| {
            x.iter()
                .zip(workers)
                .map(|(r, w)| r[k] * f64::from(*w))
                .sum::<f64>()
                <= f64::from(cap[k]) + 1e-6
        });
        rows && cols && x.iter().flatten().all(|v| (-1e-9..=1.0 + 1e-9).contains(v))
    }

    /// The best min score over the grid X ∈ {0, 1/g, …, 1}^(J×K).
    fn brute(a: &[Vec<f64>], workers: &[u32], cap: &[u32], g: usize, live: &[bool]) -> f64 {
        let (j, k) = (a.len(), cap.len());
        let cells = j * k;
        let mut best = f64::NEG_INFINITY;
        let mut idx = vec![0usize; cells];
        loop {
            let x: Vec<Vec<f64>> = (0..j)
                .map(|r| (0..k).map(|c| idx[r * k + c] as f64 / g as f64).collect())
                .collect();
            let allowed = (0..j)
                .all(|r| (0..k).all(|c| x[r][c] == 0.0 || (a[r][c] > 0.0 && workers[r] <= cap[c])));
            if allowed && feasible(&x, workers, cap) {
                best = best.max(score(a, &x, live));
            }
            let mut i = 0;
            while i < cells && idx[i] == g {
                idx[i] = 0;
                i += 1;
            }
            if i == cells {
                return best;
            }
            idx[i] += 1;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// On 2–3 jobs × 2 types the LP's t is at least the best grid point's
        /// and at most that plus what rounding X down to the grid can cost
        /// (rounding down keeps every ≤ constraint, and loses ≤ Σ_k a[j][k]/g).
        #[test]
        fn lp_matches_brute_force(
            a in prop::collection::vec(prop::collection::vec(prop_oneof![Just(0.0), 0.1f64..10.0], 2), 2..4),
            w in prop::collection::vec(1u32..4, 3),
            cap in prop::collection::vec(1u32..6, 2),
        ) {
            let workers = &w[..a.len()];
            let g = 12;
            let live: Vec<bool> = (0..a.len()).map(|j| (0..2).any(|k| a[j][k] > 0.0 && workers[j] <= cap[k])).collect();
            let lp = max_min(&a, workers, &cap).expect("a tiny LP solves");
            prop_assert!(feasible(&lp.x, workers, &cap));
            if !live.iter().any(|l| *l) {
                prop_assert_eq!(lp.t, 0.0);
                return Ok(());
            }
            let got = score(&a, &lp.x, &live);
            let best = brute(&a, workers, &cap, g, &live);
            let slack = a.iter().map(|r| r.iter().sum::<f64>()).fold(0.0, f64::max) / g as f64;
            prop_assert!(got >= best - 1e-6, "LP {got} below grid {best}");
            prop_assert!(got <= best + slack + 1e-6, "LP {got} above grid {best} + {slack}");
            // The reported t is the achieved minimum, to the ε term's effect.
            prop_assert!((lp.t - got).abs() <= 1e-6 * got.max(1.0) + EPSILON * got, "t {} vs {got}", lp.t);
        }
    }

    #[test]
    fn scores_follow_their_definitions() {
        // Two types of 4 slots; a 2-worker job gets 8/(2·2) ≥ 1 of the time.
        assert_eq!(fair_share(&[4.0, 2.0], 2, &[4, 4], 2.0), 3.0);
        // Eight contenders: half the time.
        assert_eq!(fair_share(&[4.0, 2.0], 2, &[4, 4], 8.0), 1.5);
        // Types it cannot use do not dilute its share.
        assert_eq!(fair_share(&[4.0, 0.0], 1, &[4, 4], 8.0), 4.0);
        assert_eq!(
            duration_scores(&[vec![2.0, 1.0]], &[100.0]),
            [vec![0.02, 0.01]]
        );
        // One job, one type: all of its time there.
        let f = max_min(&[vec![1.0, 0.0]], &[2], &[2, 2]).expect("solves");
        assert!((f.x[0][0] - 1.0).abs() < 1e-9 && f.x[0][1] == 0.0, "{f:?}");
    }
}
