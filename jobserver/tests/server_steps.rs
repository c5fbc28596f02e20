//! The step protocol over HTTP: one stored plan per step for every rank,
//! idempotent reports, OptPerf following a rank that becomes 3× slower,
//! global batch changes (schedule and API) at the right step, the noise
//! scale, and the refusals (steps out of window, bad ranks, bad numbers).

mod server_support;

use gw_jobapi::types::*;
use server_support::*;

#[test]
fn every_rank_gets_the_same_stored_plan_and_reports_count_once() {
    let dir = TempDir::new("plan");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let mut req = job(3, 10);
    req.planner = PlannerKind::Even;
    let (id, token) = running_job(&s, "n1", &req);
    let plans: Vec<StepPlan> = (0..3)
        .map(|r| s.step_begin(&id, &token, r, 0).unwrap())
        .collect();
    assert_eq!(
        plans.iter().map(|p| p.local_batch).collect::<Vec<_>>(),
        [4, 3, 3]
    );
    assert_eq!(
        plans.iter().map(|p| p.offset).collect::<Vec<_>>(),
        [0, 4, 7]
    );
    let w: f64 = plans.iter().map(|p| p.weight).sum();
    assert!((w - 1.0).abs() < 1e-12);
    assert!((plans[0].weight - 0.4).abs() < 1e-12);
    for p in &plans {
        assert_eq!((p.step, p.global_batch, p.algo.as_str()), (0, 10, "auto"));
    }
    // Asking again gives the identical answer.
    assert_eq!(s.step_begin(&id, &token, 1, 0).unwrap(), plans[1]);
    // Reports: a retry (even with other numbers) is not counted again.
    for r in 0..3 {
        let first = end(r, 0, plans[r as usize].local_batch, 0.1 + r as f64 * 0.01);
        assert!(!s.step_end(&id, &token, &first).unwrap().stop);
        let mut retry = first.clone();
        retry.compute_s = 9.0;
        retry.step_s = 9.0;
        assert!(!s.step_end(&id, &token, &retry).unwrap().stop);
        if r < 2 {
            assert_eq!(
                s.status(&id).step,
                None,
                "step 0 is not complete before rank 2"
            );
        }
    }
    let st = s.status(&id);
    assert_eq!(st.step, Some(0));
    let last = st.ranks[2].last_compute_s.unwrap_or(f64::NAN);
    assert!((last - (0.1 + 2.0 * 0.01)).abs() < 1e-15, "{st:?}");
    assert!((st.measured_step_s.unwrap() - 0.13).abs() < 1e-12, "{st:?}");
    // Window: the next step is fine, skipping ahead or going back is not.
    let ahead = s.step_begin(&id, &token, 0, 2);
    assert_eq!(status_of(&ahead), 409);
    assert!(message_of(&ahead).contains("ahead"), "{ahead:?}");
    assert_eq!(s.step_begin(&id, &token, 0, 1).unwrap().step, 1);
    // Bad requests.
    let r = s.step_begin(&id, &token, 3, 1);
    assert_eq!(status_of(&r), 400);
    assert!(message_of(&r).contains("rank 3 is out of range"));
    let r = s.step_end(&id, &token, &end(0, 7, 4, 0.1));
    assert_eq!(status_of(&r), 409);
    assert!(message_of(&r).contains("never planned"));
    let r = s.step_end(&id, &token, &end(0, 1, 4, -1.0));
    assert_eq!(status_of(&r), 400);
    assert!(message_of(&r).contains("compute_s"));
}

#[test]
fn a_job_may_start_at_a_later_step_but_not_go_back() {
    let dir = TempDir::new("resume");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let (id, token) = running_job(&s, "n1", &job(1, 4));
    assert_eq!(s.step_begin(&id, &token, 0, 100).unwrap().step, 100);
    let r = s.step_begin(&id, &token, 0, 5);
    assert_eq!(status_of(&r), 409);
    assert!(message_of(&r).contains("behind"), "{r:?}");
}

/// Runs `steps` steps of a 2-rank job whose true compute times are
/// `a[i]·b + c`; returns the local batches of each step.
fn run_steps(
    s: &Server,
    id: &str,
    token: &str,
    range: std::ops::Range<u64>,
    a: [f64; 2],
) -> Vec<Vec<u64>> {
    let c = 0.002;
    range
        .map(|step| {
            let plans: Vec<StepPlan> = (0..2)
                .map(|r| s.step_begin(id, token, r, step).unwrap())
                .collect();
            for (r, p) in plans.iter().enumerate() {
                let t = a[r] * p.local_batch as f64 + c;
                let mut e = end(r as u32, step, p.local_batch, t);
                e.step_s = 0.011 + a[0].max(a[1]) * 64.0;
                s.step_end(id, token, &e).unwrap();
            }
            plans.iter().map(|p| p.local_batch).collect()
        })
        .collect()
}

#[test]
fn optperf_moves_samples_away_from_a_rank_that_became_3x_slower() {
    let dir = TempDir::new("optperf");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let mut req = job(2, 64);
    req.batch_lo = 4;
    req.batch_hi = 60;
    let (id, token) = running_job(&s, "n1", &req);
    // Equal ranks: even shares during warm-up, and OptPerf keeps them equal.
    let first = run_steps(&s, &id, &token, 0..8, [0.001, 0.001]);
    assert!(first.iter().all(|b| b == &[32, 32]), "{first:?}");
    let st = s.status(&id);
    assert!(st.predicted_step_s.is_some(), "{st:?}");
    // Rank 1 becomes 3× slower: the plan follows within a few steps.
    let later = run_steps(&s, &id, &token, 8..24, [0.001, 0.003]);
    let last = later.last().unwrap();
    assert_eq!(last.iter().sum::<u64>(), 64);
    assert!(last[0] >= 44 && last[1] <= 20, "{later:?}");
    let st = s.status(&id);
    assert_eq!(st.step, Some(23));
    assert_eq!(st.ranks[0].local_batch, last[0]);
    let (a0, a1) = (st.ranks[0].fit_a.unwrap(), st.ranks[1].fit_a.unwrap());
    assert!(a1 > 2.0 * a0, "fits {a0} {a1}");
    // Predicted vs measured are both shown and close for this exact model.
    let (p, m) = (st.predicted_step_s.unwrap(), st.measured_step_s.unwrap());
    assert!(p > 0.0 && m > 0.0, "{st:?}");
    let events: serde_json::Value = s.get(&format!("/v1/jobs/{id}/events"));
    assert!(
        events.to_string().contains("optperf plan from step"),
        "{events}"
    );
}

#[test]
fn global_batch_changes_at_the_scheduled_step_and_through_the_api() {
    let dir = TempDir::new("batch");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let mut req = job(2, 16);
    req.planner = PlannerKind::Even;
    req.batch_hi = 32;
    req.schedule = vec![BatchChange {
        step: 3,
        global_batch: 32,
    }];
    let (id, token) = running_job(&s, "n1", &req);
    let globals = |range: std::ops::Range<u64>| -> Vec<u64> {
        range
            .map(|step| {
                let p0 = s.step_begin(&id, &token, 0, step).unwrap();
                let p1 = s.step_begin(&id, &token, 1, step).unwrap();
                assert_eq!(p0.local_batch + p1.local_batch, p0.global_batch);
                for (r, p) in [p0.clone(), p1].iter().enumerate() {
                    s.step_end(&id, &token, &end(r as u32, step, p.local_batch, 0.01))
                        .unwrap();
                }
                p0.global_batch
            })
            .collect()
    };
    assert_eq!(globals(0..5), [16, 16, 16, 32, 32]);
    assert_eq!(s.status(&id).global_batch, 32);
    // Through the API, from a future step.
    let st: JobStatus = s.post(
        &format!("/v1/jobs/{id}/global_batch"),
        &SetGlobalBatch {
            step: 7,
            global_batch: 24,
        },
    );
    assert_eq!(st.global_batch, 32, "not yet in force");
    assert_eq!(globals(5..9), [32, 32, 24, 24]);
    assert_eq!(s.status(&id).global_batch, 24);
    // Steps already planned cannot change; absurd sizes are refused.
    let r = s.call::<_, JobStatus>(
        "POST",
        &format!("/v1/jobs/{id}/global_batch"),
        &s.token,
        Some(&SetGlobalBatch {
            step: 8,
            global_batch: 20,
        }),
    );
    assert_eq!(status_of(&r), 409, "{r:?}");
    assert!(message_of(&r).contains("already planned"));
    let r = s.call::<_, JobStatus>(
        "POST",
        &format!("/v1/jobs/{id}/global_batch"),
        &s.token,
        Some(&SetGlobalBatch {
            step: 20,
            global_batch: 100,
        }),
    );
    assert_eq!(status_of(&r), 400, "{r:?}");
    assert!(message_of(&r).contains("more than workers × HI"));
}

#[test]
fn the_noise_scale_appears_in_status() {
    let dir = TempDir::new("noise");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let mut req = job(2, 30);
    req.planner = PlannerKind::Even;
    let (id, token) = running_job(&s, "n1", &req);
    // Exact expectations for tr(Σ) = 100, |G|² = 1: B_noise = 100.
    let (trace, g2) = (100.0, 1.0);
    for step in 0..3 {
        let plans: Vec<StepPlan> = (0..2)
            .map(|r| s.step_begin(&id, &token, r, step).unwrap())
            .collect();
        if step == 0 {
            assert_eq!(s.status(&id).noise_scale, None);
        }
        for (r, p) in plans.iter().enumerate() {
            let mut e = end(r as u32, step, p.local_batch, 0.01);
            e.local_grad_sq = Some(g2 + trace / p.local_batch as f64);
            e.global_grad_sq = Some(g2 + trace / 30.0);
            s.step_end(&id, &token, &e).unwrap();
        }
    }
    let n = s.status(&id).noise_scale.expect("noise scale");
    assert!((n - 100.0).abs() < 1e-6, "{n}");
}
