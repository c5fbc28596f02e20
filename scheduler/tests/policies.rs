//! Every policy against random clusters and job sets: whatever it decides,
//! no device type is ever over-allocated and every job gets all of its
//! workers or none — the rules the simulator and a live server rely on.

use gw_scheduler::policy::{self, JobState, NAMES, Round};
use proptest::prelude::*;

fn jobs(types: usize, widths: std::ops::Range<u32>) -> impl Strategy<Value = Vec<JobState>> {
    let job = (
        widths,
        prop::collection::vec(prop_oneof![Just(0.0), 0.01f64..100.0], types),
        1.0f64..1e6,
        0.0f64..1e4,
        prop::collection::vec(0u32..3, types),
        prop::collection::vec(0.0f64..1e4, types),
    );
    prop::collection::vec(job, 0..40).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(
                |(i, (workers, tput, remaining, arrival, placed, attained))| JobState {
                    id: i as u64,
                    workers,
                    tput,
                    steps: remaining.ceil() as u64,
                    remaining_steps: remaining,
                    arrival_s: arrival,
                    // Last round's placement, often stale or impossible now.
                    placed,
                    attained_s: attained,
                },
            )
            .collect()
    })
}

fn case() -> impl Strategy<Value = (Vec<u32>, Vec<u32>, Vec<JobState>)> {
    cases(1..9)
}

/// Narrow jobs: many of one width, so that policies that trade places
/// between jobs of equal width (hadar's exchange) have trades to make.
fn narrow_case() -> impl Strategy<Value = (Vec<u32>, Vec<u32>, Vec<JobState>)> {
    cases(1..3)
}

fn cases(
    widths: std::ops::Range<u32>,
) -> impl Strategy<Value = (Vec<u32>, Vec<u32>, Vec<JobState>)> {
    (1usize..4).prop_flat_map(move |k| {
        (
            prop::collection::vec(0u32..24, k),
            prop::collection::vec(0u32..24, k),
            jobs(k, widths.clone()),
        )
            .prop_map(|(total, taken, jobs)| {
                let free = total
                    .iter()
                    .zip(&taken)
                    .map(|(t, x)| t - x.min(t))
                    .collect();
                (total, free, jobs)
            })
    })
}

fn check_every_policy(
    total: &[u32],
    free: &[u32],
    jobs: &[JobState],
    rounds: usize,
) -> Result<(), TestCaseError> {
    for name in NAMES {
        let mut p = policy::by_name(name).expect("a known policy");
        let mut now = 1e4;
        // Several rounds in a row, as stateful policies see them.
        for _ in 0..rounds {
            let round = Round {
                now_s: now,
                round_s: 360.0,
                total,
                free,
                jobs,
            };
            let d = p.decide(&round);
            if let Err(e) = d.check(&round) {
                prop_assert!(false, "{name}: {e}\nfree {free:?}\njobs {jobs:?}\n{d:?}");
            }
            let used = d.used(total.len());
            prop_assert!(
                used.iter().zip(free).all(|(u, f)| u <= f),
                "{name}: {used:?} > {free:?}"
            );
            now += 360.0;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]
    #[test]
    fn no_policy_over_allocates((total, free, jobs) in case(), rounds in 1usize..4) {
        check_every_policy(&total, &free, &jobs, rounds)?;
    }

    #[test]
    fn no_policy_over_allocates_narrow_jobs((total, free, jobs) in narrow_case(), rounds in 1usize..4) {
        check_every_policy(&total, &free, &jobs, rounds)?;
    }
}

#[test]
fn unknown_policies_list_the_valid_ones() {
    let e = policy::by_name("srtf").err().expect("no such policy");
    assert_eq!(
        e,
        "unknown policy \"srtf\"; the policies are fifo, gavel, gavel-makespan, hadar, hadare"
    );
}

#[test]
fn a_job_that_can_run_nowhere_is_refused() {
    let e =
        policy::admissible(&[0.0, 0.0], 1, &[4, 4], &["v100", "k80"]).expect_err("zero everywhere");
    assert!(
        e.contains("throughput is 0 on every device type the cluster has (v100, k80)"),
        "{e}"
    );
    let e = policy::admissible(&[1.0, 0.0], 5, &[4, 4], &["v100", "k80"]).expect_err("too wide");
    assert!(
        e.contains("needs 5 workers but the cluster has only 4 slots"),
        "{e}"
    );
    assert_eq!(
        policy::admissible(&[1.0, 0.0], 4, &[4, 4], &["v100", "k80"]),
        Ok(())
    );
}
