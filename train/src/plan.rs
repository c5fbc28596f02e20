//! Where a step's plan comes from, and the checks every plan must pass.
//!
//! Under the job server the plan is asked for over the step protocol (the
//! server stores one plan per step and hands every rank the same one). Under
//! `gwrun` there is no server, so each rank computes the even split itself;
//! that is deterministic, so the ranks agree without talking. Either way the
//! rest of the worker sees the same [`StepPlan`], so the training loop has one
//! path.

use crate::step::{StepClient, StepError, StepReport};
use crate::stop::Stop;
use gw_jobapi::types::StepPlan;

/// The even split of `global_batch` over `world` ranks: equal shares, the
/// remainder to the lowest ranks (as the server's even planner does).
pub fn even_plan(step: u64, global_batch: u64, rank: u32, world: u32) -> StepPlan {
    let (w, r) = (world.max(1) as u64, rank as u64);
    let (q, rem) = (global_batch / w, global_batch % w);
    let local_batch = q + u64::from(r < rem);
    let offset = q * r + r.min(rem);
    StepPlan {
        step,
        global_batch,
        local_batch,
        offset,
        weight: if global_batch == 0 {
            0.0
        } else {
            local_batch as f64 / global_batch as f64
        },
        algo: "auto".into(),
        predicted_step_s: None,
        checkpoint: false,
    }
}

/// Checks what this rank can check alone: the plan is for the expected step
/// and its share lies inside the global batch with a sane weight.
pub fn check_plan(plan: &StepPlan, step: u64) -> Result<(), String> {
    if plan.step != step {
        return Err(format!(
            "the job server planned step {} where step {step} was due",
            plan.step
        ));
    }
    let end = plan.offset.checked_add(plan.local_batch);
    if plan.global_batch == 0 || end.is_none_or(|e| e > plan.global_batch) {
        return Err(format!(
            "step {step}: local batch {} at offset {} does not fit in the global batch {}",
            plan.local_batch, plan.offset, plan.global_batch
        ));
    }
    if !plan.weight.is_finite() || !(0.0..=1.0).contains(&plan.weight) {
        return Err(format!(
            "step {step}: weight {} is not in [0, 1]",
            plan.weight
        ));
    }
    Ok(())
}

/// Checks what needs every rank's share (after they are gathered): the
/// shares tile the global batch in rank order and the weights are b_i / B.
pub fn check_tiling(
    step: u64,
    global_batch: u64,
    shares: &[(u64, u64, f64)],
) -> Result<(), String> {
    let mut next = 0u64;
    for (r, &(b, off, w)) in shares.iter().enumerate() {
        if off != next {
            return Err(format!(
                "step {step}: rank {r}'s samples start at {off}, expected {next} (plans disagree)"
            ));
        }
        let want = b as f64 / global_batch as f64;
        if (w - want).abs() > 1e-12 {
            return Err(format!(
                "step {step}: rank {r}'s weight {w} is not its share {b}/{global_batch}"
            ));
        }
        next += b;
    }
    if next != global_batch {
        return Err(format!(
            "step {step}: local batches sum to {next}, not the global batch {global_batch}"
        ));
    }
    Ok(())
}

/// A step call's failure: a job the server ended is a stop, not a fault of
/// this worker; anything else is an error naming the step.
fn stop(e: StepError, step: u64, what: &str) -> Stop {
    match e {
        StepError::Stopped { reason, .. } => Stop::ByServer { step, reason },
        StepError::Preempted { step, .. } => Stop::Preempted { step },
        e => Stop::Failed(format!("{what} step {step}: {e}")),
    }
}

/// The source of plans for this worker.
pub enum PlanSource {
    /// No job server: the even split of a fixed global batch.
    Local {
        global_batch: u64,
        rank: u32,
        world: u32,
    },
    /// The job server's step protocol.
    Server(StepClient),
}

impl PlanSource {
    /// Asks for step `step`'s plan.
    pub fn begin(&mut self, step: u64) -> Result<StepPlan, Stop> {
        match self {
            PlanSource::Local {
                global_batch,
                rank,
                world,
            } => Ok(even_plan(step, *global_batch, *rank, *world)),
            PlanSource::Server(c) => c
                .begin()
                .map_err(|e| stop(e, step, "asking for the plan of")),
        }
    }

    /// Reports the step; `Ok(true)` when the server asks the worker to stop.
    pub fn end(&mut self, step: u64, report: &StepReport) -> Result<bool, Stop> {
        match self {
            PlanSource::Local { .. } => Ok(false),
            PlanSource::Server(c) => c
                .end(report)
                .map(|r| r.stop)
                .map_err(|e| stop(e, step, "reporting")),
        }
    }

    /// The first step this worker takes: 0, or where the job server resumes
    /// a preempted job (`GW_RESUME_STEP`).
    pub fn first_step(&self) -> u64 {
        match self {
            PlanSource::Local { .. } => 0,
            PlanSource::Server(c) => c.step(),
        }
    }

    pub fn is_server(&self) -> bool {
        matches!(self, PlanSource::Server(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_tiles_the_batch() {
        for (b, w) in [(10u64, 3u32), (9, 3), (2, 4), (1024, 2), (7, 1)] {
            let plans: Vec<_> = (0..w).map(|r| even_plan(4, b, r, w)).collect();
            let shares: Vec<_> = plans
                .iter()
                .map(|p| (p.local_batch, p.offset, p.weight))
                .collect();
            check_tiling(4, b, &shares).expect("tiles");
            for p in &plans {
                check_plan(p, 4).expect("valid");
            }
            let max = plans.iter().map(|p| p.local_batch).max().unwrap_or(0);
            let min = plans.iter().map(|p| p.local_batch).min().unwrap_or(0);
            assert!(max - min <= 1);
        }
    }

    #[test]
    fn bad_plans_are_refused() {
        let mut p = even_plan(3, 100, 1, 2);
        assert!(check_plan(&p, 4).is_err(), "wrong step");
        p.offset = 60;
        assert!(check_plan(&p, 3).is_err(), "past the end");
        let p = StepPlan {
            weight: f64::NAN,
            ..even_plan(3, 100, 1, 2)
        };
        assert!(check_plan(&p, 3).is_err());
        assert!(check_tiling(0, 10, &[(5, 0, 0.5), (4, 5, 0.4)]).is_err());
        assert!(check_tiling(0, 10, &[(5, 0, 0.5), (5, 4, 0.5)]).is_err());
        assert!(check_tiling(0, 10, &[(5, 0, 0.4), (5, 5, 0.6)]).is_err());
    }
}
