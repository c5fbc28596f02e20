//! How the server turns a job's state into the plan for one step, using the
//! OptPerf planner: a pure decision (no database), so its policy — warm-up
//! with even shares, re-plan only when the fits drift or the global batch
//! changes — is tested directly. `steps.rs` stores what it decides.

use gw_jobapi::types::PlannerKind;
use gw_planner::{
    Linear, PlanError, RankFit, needs_replan_within, plan_even, plan_optperf, predict_step,
};
use serde::{Deserialize, Serialize};

/// Steps planned with even shares before OptPerf takes over: the fits need
/// a few reports from every rank first.
pub const WARMUP_STEPS: u64 = 3;
/// Reports every rank must have made before its fit is trusted.
pub const MIN_OBSERVATIONS: u64 = 2;
/// Forgetting factor of every rank's timing fit (about the last 20 steps).
pub const FIT_FORGET: f64 = 0.95;
/// Relative drift of the fits (or loss against the best plan) that makes
/// re-planning worth sending ranks new batch sizes.
pub const REPLAN_TOLERANCE: f64 = 0.10;

/// How a stored plan was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanKind {
    Even,
    Optperf,
}

impl PlanKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanKind::Even => "even",
            PlanKind::Optperf => "optperf",
        }
    }
    pub fn parse(s: &str) -> Option<PlanKind> {
        match s {
            "even" => Some(PlanKind::Even),
            "optperf" => Some(PlanKind::Optperf),
            _ => None,
        }
    }
}

/// One step's plan as stored (identical for every rank that asks).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub step: u64,
    pub global_batch: u64,
    pub batches: Vec<u64>,
    pub kind: PlanKind,
    /// The fits an OptPerf plan was computed from; a later plan reuses the
    /// batches until the current fits drift away from these.
    pub basis: Option<Vec<Linear>>,
    pub predicted_step_s: Option<f64>,
    pub algo: String,
}

/// What the server knows when the first rank asks for `step`.
pub struct Inputs<'a> {
    pub step: u64,
    pub planner: PlannerKind,
    pub global_batch: u64,
    pub lo: u64,
    pub hi: u64,
    /// Plans stored before this one (the server counts at most
    /// [`WARMUP_STEPS`]: only whether the warm-up is over matters).
    pub plans_before: u64,
    /// Every rank's fit, by rank.
    pub fits: &'a [RankFit],
    /// The latest plan before this step.
    pub prev: Option<&'a Plan>,
    /// Typical non-overlapped all-reduce time (median of recent steps).
    pub comm_s: Option<f64>,
    pub algo: &'a str,
}

/// The plan and, when it differs in kind from just reusing the previous
/// one, a line for the event log saying why.
pub struct Decision {
    pub plan: Plan,
    pub note: Option<String>,
}

/// Every rank's model, if every rank has a trusted one.
pub fn models(fits: &[RankFit]) -> Option<Vec<Linear>> {
    fits.iter().map(RankFit::model).collect()
}

/// Decides the plan for `inp.step`.
pub fn decide(inp: &Inputs<'_>) -> Result<Decision, PlanError> {
    let workers = inp.fits.len();
    let now = models(inp.fits);
    let trusted = inp
        .fits
        .iter()
        .all(|f| f.observations() >= MIN_OBSERVATIONS);
    let optperf_ready = inp.planner == PlannerKind::Optperf
        && inp.plans_before >= WARMUP_STEPS
        && trusted
        && now.is_some();
    let predicted = |batches: &[u64]| {
        now.as_ref()
            .map(|m| predict_step(m, batches, inp.comm_s.unwrap_or(0.0)))
            .filter(|t| t.is_finite())
    };
    let finish = |batches: Vec<u64>, kind, basis, note| Decision {
        plan: Plan {
            step: inp.step,
            global_batch: inp.global_batch,
            predicted_step_s: predicted(&batches),
            batches,
            kind,
            basis,
            algo: inp.algo.to_owned(),
        },
        note,
    };
    let batch_changed = inp.prev.is_some_and(|p| p.global_batch != inp.global_batch);
    let change_note = inp.prev.filter(|_| batch_changed).map(|p| {
        format!(
            "global batch {} -> {} from step {}",
            p.global_batch, inp.global_batch, inp.step
        )
    });
    let Some(now) = now.clone().filter(|_| optperf_ready) else {
        let batches = plan_even(workers, inp.global_batch, inp.lo, inp.hi)?;
        return Ok(finish(batches, PlanKind::Even, None, change_note));
    };
    if let Some(prev) = inp.prev
        && let (PlanKind::Optperf, Some(basis), false) = (prev.kind, &prev.basis, batch_changed)
        && !needs_replan_within(basis, &now, &prev.batches, inp.lo, inp.hi, REPLAN_TOLERANCE)
    {
        return Ok(finish(
            prev.batches.clone(),
            PlanKind::Optperf,
            Some(basis.clone()),
            None,
        ));
    }
    let why = match inp.prev {
        _ if batch_changed => change_note.unwrap_or_default(),
        Some(p) if p.kind == PlanKind::Optperf => "timing fits drifted".to_owned(),
        _ => "fits ready after warm-up".to_owned(),
    };
    match plan_optperf(&now, inp.global_batch, inp.lo, inp.hi) {
        Ok(batches) => {
            let note = format!("optperf plan from step {} ({why}): {batches:?}", inp.step);
            Ok(finish(batches, PlanKind::Optperf, Some(now), Some(note)))
        }
        Err(e) => {
            // A fit the planner rejects must not stop the job: even shares
            // always work, and the event log says why.
            let batches = plan_even(workers, inp.global_batch, inp.lo, inp.hi)?;
            let note = format!(
                "optperf failed at step {} ({e}); using even shares",
                inp.step
            );
            Ok(finish(batches, PlanKind::Even, None, Some(note)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fits(per_rank: &[(f64, f64)], batches: &[u64]) -> Vec<RankFit> {
        per_rank
            .iter()
            .map(|&(a, c)| {
                let mut f = RankFit::new(FIT_FORGET);
                for &b in batches {
                    f.observe(b, a * b as f64 + c);
                }
                f
            })
            .collect()
    }

    fn inputs<'a>(
        fits: &'a [RankFit],
        prev: Option<&'a Plan>,
        plans_before: u64,
        b: u64,
    ) -> Inputs<'a> {
        Inputs {
            step: plans_before,
            planner: PlannerKind::Optperf,
            global_batch: b,
            lo: 1,
            hi: 1000,
            plans_before,
            fits,
            prev,
            comm_s: Some(0.01),
            algo: "auto",
        }
    }

    #[test]
    fn even_during_warm_up_and_for_the_even_planner() {
        let f = fits(&[(0.001, 0.0), (0.003, 0.0)], &[32, 32, 32]);
        let d = decide(&inputs(&f, None, 1, 64)).unwrap();
        assert_eq!(
            (d.plan.kind, d.plan.batches.clone()),
            (PlanKind::Even, vec![32, 32])
        );
        let mut inp = inputs(&f, None, 5, 64);
        inp.planner = PlannerKind::Even;
        assert_eq!(decide(&inp).unwrap().plan.kind, PlanKind::Even);
        // Without reports, no prediction.
        let empty = vec![RankFit::new(FIT_FORGET), RankFit::new(FIT_FORGET)];
        let d = decide(&inputs(&empty, None, 0, 64)).unwrap();
        assert_eq!(d.plan.predicted_step_s, None);
    }

    #[test]
    fn optperf_gives_the_faster_rank_more_and_keeps_a_good_plan() {
        let f = fits(&[(0.001, 0.0), (0.003, 0.0)], &[32, 32, 32]);
        let d = decide(&inputs(&f, None, 3, 64)).unwrap();
        assert_eq!(d.plan.kind, PlanKind::Optperf);
        assert_eq!(d.plan.batches, vec![48, 16]);
        assert!(d.note.is_some());
        let p = d.plan.clone();
        // Same fits: the plan is reused, silently.
        let d2 = decide(&inputs(&f, Some(&p), 4, 64)).unwrap();
        assert_eq!(d2.plan.batches, p.batches);
        assert!(d2.note.is_none());
        // Global batch changes: re-planned for the new B.
        let d3 = decide(&inputs(&f, Some(&p), 4, 128)).unwrap();
        assert_eq!(d3.plan.batches, vec![96, 32]);
        assert!(d3.note.unwrap().contains("global batch 64 -> 128"));
        // The slow rank becomes as fast as the other: re-planned to equal.
        let g = fits(&[(0.001, 0.0), (0.001, 0.0)], &[32, 32, 32]);
        let d4 = decide(&inputs(&g, Some(&p), 4, 64)).unwrap();
        assert_eq!(d4.plan.batches, vec![32, 32]);
        assert!(d4.note.unwrap().contains("drifted"));
    }

    #[test]
    fn a_batch_change_during_warm_up_is_noted() {
        let f = fits(&[(0.001, 0.0)], &[]);
        let prev = Plan {
            step: 0,
            global_batch: 8,
            batches: vec![8],
            kind: PlanKind::Even,
            basis: None,
            predicted_step_s: None,
            algo: "auto".into(),
        };
        let d = decide(&inputs(&f, Some(&prev), 1, 16)).unwrap();
        assert_eq!(d.plan.batches, vec![16]);
        assert!(d.note.unwrap().contains("8 -> 16"));
    }
}
