//! plan_optperf and plan_even: optimality against brute force on small
//! cases, invariants and an optimality certificate on large ones, every
//! error with its message, and the predictions built on plans.

use gw_planner::{
    Linear, PlanError, needs_replan, needs_replan_within, plan_even, plan_optperf, predict_step,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn objective(models: &[Linear], plan: &[u64]) -> f64 {
    predict_step(models, plan, 0.0)
}

/// The best objective over every integer vector in [lo, hi]^n summing to
/// `global`, or None when there is none.
fn brute_force(models: &[Linear], global: u64, lo: u64, hi: u64) -> Option<f64> {
    fn walk(models: &[Linear], left: u64, lo: u64, hi: u64, worst: f64) -> Option<f64> {
        match models.split_first() {
            None => (left == 0).then_some(worst),
            Some((m, rest)) => {
                let mut best: Option<f64> = None;
                for b in lo..=hi.min(left) {
                    if let Some(v) = walk(rest, left - b, lo, hi, worst.max(m.time(b))) {
                        best = Some(best.map_or(v, |x: f64| x.min(v)));
                    }
                }
                best
            }
        }
    }
    walk(models, global, lo, hi, 0.0)
}

fn random_model(rng: &mut StdRng) -> Linear {
    // Mix of continuous values and a few repeated ones, so that exact ties
    // between ranks (and a = 0, "free" samples) occur often.
    let a = match rng.random_range(0..4) {
        0 => 0.0,
        1 => [0.25, 0.5, 1.0][rng.random_range(0..3)],
        _ => rng.random_range(0.0..2.0),
    };
    let c = match rng.random_range(0..3) {
        0 => 0.0,
        1 => [0.5, 1.0][rng.random_range(0..2)],
        _ => rng.random_range(0.0..5.0),
    };
    Linear { a, c }
}

fn check_plan(models: &[Linear], global: u64, lo: u64, hi: u64, plan: &[u64]) {
    assert_eq!(plan.len(), models.len());
    assert_eq!(plan.iter().sum::<u64>(), global);
    assert!(
        plan.iter().all(|&b| lo <= b && b <= hi),
        "{plan:?} outside [{lo}, {hi}]"
    );
}

#[test]
fn optperf_matches_brute_force_on_small_cases() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut solved = 0;
    for _ in 0..6000 {
        let n = rng.random_range(1..=4);
        let lo = rng.random_range(0..=5);
        let hi = lo + rng.random_range(0..=12);
        let global = rng.random_range(0..=24);
        let models: Vec<Linear> = (0..n).map(|_| random_model(&mut rng)).collect();
        let expect = brute_force(&models, global, lo, hi);
        match (plan_optperf(&models, global, lo, hi), expect) {
            (Ok(plan), Some(best)) => {
                check_plan(&models, global, lo, hi, &plan);
                let got = objective(&models, &plan);
                assert!(
                    (got - best).abs() <= 1e-12 * best.abs(),
                    "{models:?} global {global} in [{lo}, {hi}]: plan {plan:?} gives {got}, optimum {best}"
                );
                solved += 1;
            }
            (Err(_), None) => {}
            (got, want) => panic!(
                "{models:?} global {global} in [{lo}, {hi}]: {got:?} but brute force {want:?}"
            ),
        }
    }
    assert!(solved > 2000, "only {solved} feasible cases");
}

/// The textbook greedy, one sample at a time to the rank that would finish
/// soonest (a heap): slow, but obviously optimal, and big enough cases
/// exercise the bracket search that brute-force sizes never reach.
fn greedy(models: &[Linear], global: u64, lo: u64, hi: u64) -> f64 {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    #[derive(PartialEq)]
    struct Time(f64);
    impl Eq for Time {}
    impl PartialOrd for Time {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Time {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.0.total_cmp(&other.0)
        }
    }
    let mut plan = vec![lo; models.len()];
    let mut worst = objective(models, &plan);
    let mut heap: BinaryHeap<_> = models
        .iter()
        .enumerate()
        .filter(|_| lo < hi)
        .map(|(i, m)| Reverse((Time(m.time(lo + 1)), i)))
        .collect();
    for _ in 0..global - lo * models.len() as u64 {
        let Some(Reverse((Time(t), i))) = heap.pop() else {
            break;
        };
        worst = worst.max(t);
        plan[i] += 1;
        if plan[i] < hi {
            heap.push(Reverse((Time(models[i].time(plan[i] + 1)), i)));
        }
    }
    worst
}

#[test]
fn optperf_matches_the_greedy_on_medium_cases() {
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..600 {
        let n = rng.random_range(1..=40);
        let lo = rng.random_range(0..=20);
        let hi = lo + rng.random_range(1..=300);
        let global = rng.random_range(n as u64 * lo..=n as u64 * hi);
        let models: Vec<Linear> = match rng.random_range(0..3) {
            // Realistic spreads, extreme scales, and heavy ties.
            0 => (0..n)
                .map(|_| Linear {
                    a: rng.random_range(0.5e-3..4e-3),
                    c: rng.random_range(0.0..5e-3),
                })
                .collect(),
            1 => (0..n)
                .map(|_| Linear {
                    a: 10f64.powf(rng.random_range(-12.0..6.0)),
                    c: 10f64.powf(rng.random_range(-12.0..6.0)),
                })
                .collect(),
            _ => (0..n)
                .map(|_| Linear {
                    a: [0.0, 1e-3, 2e-3][rng.random_range(0..3)],
                    c: [0.0, 0.1][rng.random_range(0..2)],
                })
                .collect(),
        };
        let plan = plan_optperf(&models, global, lo, hi).expect("feasible");
        check_plan(&models, global, lo, hi, &plan);
        let (got, want) = (objective(&models, &plan), greedy(&models, global, lo, hi));
        assert!(
            got == want,
            "{models:?} global {global} in [{lo}, {hi}]: {got} vs greedy {want}"
        );
    }
}

/// Items (one more sample on one rank) of value below `t`, counted by
/// binary search on each rank: fewer than `global − n·lo` of them proves no
/// plan finishes before `t`.
fn items_below(models: &[Linear], lo: u64, hi: u64, t: f64) -> u128 {
    models
        .iter()
        .map(|m| {
            let (mut l, mut h) = (lo, hi); // largest k with k == lo or time(k) < t
            while l < h {
                let mid = l + (h - l).div_ceil(2);
                if m.time(mid) < t {
                    l = mid
                } else {
                    h = mid - 1
                }
            }
            (l - lo) as u128
        })
        .sum()
}

fn arb_model() -> impl Strategy<Value = Linear> {
    prop_oneof![
        (0.0f64..10.0, 0.0f64..1.0).prop_map(|(a, c)| Linear { a: a * 1e-3, c }),
        (0u8..3, 0u8..3).prop_map(|(a, c)| Linear {
            a: a as f64 * 0.5e-3,
            c: c as f64 * 0.1
        }),
        Just(Linear { a: 0.0, c: 0.0 }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn optperf_invariants_and_certificate(
        models in prop::collection::vec(arb_model(), 1..300),
        lo in 0u64..50,
        span in 0u64..500,
        fill in 0.0f64..=1.0,
    ) {
        let n = models.len() as u64;
        let hi = lo + span;
        let global = n * lo + ((n * span) as f64 * fill) as u64;
        let plan = plan_optperf(&models, global, lo, hi).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_plan(&models, global, lo, hi, &plan);
        let t = objective(&models, &plan);
        let base = objective(&models, &vec![lo; models.len()]);
        // Optimal: either nobody can beat the all-lower-bound time, or too
        // few cheaper samples exist to make up the global batch.
        prop_assert!(t <= base || items_below(&models, lo, hi, t) < (global - n * lo) as u128);
        // Deterministic.
        prop_assert_eq!(plan_optperf(&models, global, lo, hi).ok(), Some(plan));
    }

    #[test]
    fn even_invariants(workers in 1usize..500, lo in 0u64..100, span in 0u64..100, fill in 0.0f64..=1.0) {
        let n = workers as u64;
        let hi = lo + span;
        let global = n * lo + ((n * span) as f64 * fill) as u64;
        let plan = plan_even(workers, global, lo, hi).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(plan.len(), workers);
        prop_assert_eq!(plan.iter().sum::<u64>(), global);
        prop_assert!(plan.iter().all(|&b| lo <= b && b <= hi));
        prop_assert!(plan.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
    }
}

#[test]
fn even_gives_the_remainder_to_the_lowest_ranks() {
    assert_eq!(plan_even(4, 10, 0, 10).ok(), Some(vec![3, 3, 2, 2]));
    assert_eq!(plan_even(3, 9, 3, 3).ok(), Some(vec![3, 3, 3]));
}

#[test]
fn optperf_is_proportional_to_speed_without_overhead() {
    let models = [
        Linear { a: 1.0, c: 0.0 },
        Linear { a: 2.0, c: 0.0 },
        Linear { a: 4.0, c: 0.0 },
    ];
    assert_eq!(
        plan_optperf(&models, 70, 0, 100).ok(),
        Some(vec![40, 20, 10])
    );
}

#[test]
fn identical_models_split_evenly() {
    let models = vec![Linear { a: 0.01, c: 0.2 }; 5];
    assert_eq!(
        plan_optperf(&models, 12, 0, 10).ok(),
        Some(vec![3, 3, 2, 2, 2])
    );
}

#[test]
fn free_samples_fill_up_and_are_shared() {
    // Two ranks whose samples cost nothing take everything they can, evenly.
    let models = [
        Linear { a: 0.0, c: 0.1 },
        Linear { a: 1.0, c: 0.0 },
        Linear { a: 0.0, c: 0.1 },
    ];
    let plan = plan_optperf(&models, 20, 0, 1_000_000).ok();
    assert_eq!(plan, Some(vec![10, 0, 10]));
    // With huge bounds the tie is still shared without listing samples.
    let plan = plan_optperf(&models, u64::MAX, 0, u64::MAX).ok();
    assert_eq!(plan, Some(vec![u64::MAX / 2 + 1, 0, u64::MAX / 2]));
}

#[test]
fn huge_bounds_and_batches() {
    let models = [
        Linear { a: 1e-9, c: 0.0 },
        Linear { a: 3e-9, c: 1.0 },
        Linear { a: 2e-9, c: 0.5 },
    ];
    let global = 1u64 << 60;
    let plan = plan_optperf(&models, global, 0, u64::MAX).expect("feasible");
    assert_eq!(
        plan.iter().map(|&b| b as u128).sum::<u128>(),
        global as u128
    );
    let t = objective(&models, &plan);
    assert!(items_below(&models, 0, u64::MAX, t) < global as u128);
}

#[test]
fn hundred_thousand_ranks() {
    let mut rng = StdRng::seed_from_u64(3);
    let models: Vec<Linear> = (0..100_000)
        .map(|_| Linear {
            a: rng.random_range(0.5e-3..4e-3),
            c: rng.random_range(0.0..5e-3),
        })
        .collect();
    let global = 64 * models.len() as u64;
    let plan = plan_optperf(&models, global, 1, 1024).expect("feasible");
    check_plan(&models, global, 1, 1024, &plan);
    let t = objective(&models, &plan);
    assert!(items_below(&models, 1, 1024, t) < (global - models.len() as u64) as u128);
}

#[test]
fn errors_name_the_problem() {
    let m = Linear { a: 1.0, c: 0.0 };
    let msg = |r: Result<Vec<u64>, PlanError>| r.err().map(|e| e.to_string()).unwrap_or_default();

    assert_eq!(plan_even(0, 10, 0, 5), Err(PlanError::NoWorkers));
    assert_eq!(msg(plan_optperf(&[], 10, 0, 5)), "no workers to plan for");

    assert_eq!(
        plan_even(2, 10, 6, 5),
        Err(PlanError::BoundsInverted { lo: 6, hi: 5 })
    );
    assert_eq!(
        msg(plan_optperf(&[m; 2], 10, 6, 5)),
        "lower bound 6 is above upper bound 5 for the local batch"
    );

    assert_eq!(
        msg(plan_even(4, 10, 3, 8)),
        "global batch 10 is below 4 workers × lower bound 3"
    );
    assert_eq!(
        msg(plan_optperf(&[m; 4], 10, 3, 8)),
        "global batch 10 is below 4 workers × lower bound 3"
    );

    assert_eq!(
        msg(plan_even(4, 33, 0, 8)),
        "global batch 33 is above 4 workers × upper bound 8"
    );
    assert_eq!(
        msg(plan_optperf(&[m; 4], 33, 0, 8)),
        "global batch 33 is above 4 workers × upper bound 8"
    );
    // Products that overflow u64 are still compared correctly.
    assert!(plan_even(4, u64::MAX, u64::MAX / 2, u64::MAX).is_err());
    assert!(plan_even(2, u64::MAX, 0, u64::MAX).is_ok());

    for (bad, shown) in [(f64::NAN, "NaN"), (-1.0, "-1"), (f64::INFINITY, "inf")] {
        let models = [m, Linear { a: bad, c: 0.5 }];
        assert_eq!(
            msg(plan_optperf(&models, 4, 0, 4)),
            format!(
                "rank 1 has an invalid timing model t(b) = {shown}·b + 0.5: both coefficients must be finite and non-negative"
            )
        );
        let models = [Linear { a: 1.0, c: bad }];
        assert!(matches!(
            plan_optperf(&models, 1, 0, 4),
            Err(PlanError::InvalidModel { rank: 0, .. })
        ));
    }
    // PlanError is a std error.
    let e: Box<dyn std::error::Error> = Box::new(PlanError::NoWorkers);
    assert_eq!(e.to_string(), "no workers to plan for");
}

#[test]
fn predict_step_adds_communication_to_the_slowest_rank() {
    let models = [Linear { a: 0.01, c: 0.1 }, Linear { a: 0.02, c: 0.0 }];
    assert_eq!(predict_step(&models, &[10, 10], 0.5), 0.2 + 0.5);
    assert_eq!(predict_step(&[], &[], 0.25), 0.25);
}

#[test]
fn replan_when_fits_move_or_the_plan_is_no_longer_best() {
    let planned = vec![Linear { a: 0.01, c: 0.0 }; 4];
    let plan = plan_optperf(&planned, 400, 1, 1000).expect("feasible");
    assert!(!needs_replan(&planned, &planned, &plan, 0.05));
    // Everyone 2% slower: neither the time nor the best plan moves enough.
    let slower: Vec<Linear> = planned
        .iter()
        .map(|m| Linear {
            a: m.a * 1.02,
            c: m.c,
        })
        .collect();
    assert!(!needs_replan(&planned, &slower, &plan, 0.05));
    // One rank 3× slower: the step slows down a lot.
    let mut now = planned.clone();
    now[2].a *= 3.0;
    assert!(needs_replan(&planned, &now, &plan, 0.05));
    // One rank 3× faster: the step time is unchanged, but shifting work to
    // that rank now pays.
    let mut now = planned.clone();
    now[0].a /= 3.0;
    assert!(needs_replan(&planned, &now, &plan, 0.05));
    assert!(needs_replan_within(&planned, &now, &plan, 1, 1000, 0.05));
    // ... unless the bounds forbid it.
    assert!(!needs_replan_within(&planned, &now, &plan, 1, 100, 0.05));
    // Ranks came or went.
    assert!(needs_replan(&planned, &now[..3], &plan, 0.05));
    // No plan can come from a broken fit.
    let mut broken = planned.clone();
    broken[1].a = f64::NAN;
    assert!(!needs_replan(&planned, &broken, &plan, 0.05));
}

#[test]
fn binding_bounds_do_not_trigger_replans_forever() {
    // The slow rank is pinned at the lower bound: without bounds it would
    // get far less, so a bound-free optimum always looks better.
    let planned = [Linear { a: 0.001, c: 0.0 }, Linear { a: 0.1, c: 0.0 }];
    let plan = plan_optperf(&planned, 100, 40, 100).expect("feasible");
    assert_eq!(plan, vec![60, 40]);
    assert!(!needs_replan(&planned, &planned, &plan, 0.05));
    let now = [Linear { a: 0.00101, c: 0.0 }, Linear { a: 0.1002, c: 0.0 }];
    assert!(!needs_replan(&planned, &now, &plan, 0.05));
    assert!(!needs_replan_within(&planned, &now, &plan, 40, 100, 0.05));
    // 3% slower again on the pinned rank: still nothing a re-plan can fix.
    let now = [Linear { a: 0.001, c: 0.0 }, Linear { a: 0.103, c: 0.0 }];
    assert!(!needs_replan(&planned, &now, &plan, 0.05));
}
