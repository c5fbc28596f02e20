//! The step protocol: per step, each worker asks for its plan (`begin`) and
//! reports its timings (`end`) — two small messages per rank and step,
//! whatever the world size.
//!
//! The plan of a step is made once, by the first rank that asks, and stored;
//! every rank (and every retry, across server restarts) gets that same row.
//! A report is stored once per (rank, step): the timing fit and the step's
//! completion are updated in the same transaction as the report, so a retried
//! report neither double-counts nor gets lost.

use crate::server::auth;
use crate::server::db::event;
use crate::server::db::to_json;
use crate::server::error::{ApiError, ApiResult};
use crate::server::jobs::{self, Job};
use crate::server::plan::{self, Inputs, Plan};
use crate::server::profile;
use crate::server::store;
use crate::server::validate::MAX_BATCH;
use gw_jobapi::types::{JobState, StepBegin, StepEnd, StepEndReply, StepPlan};
use gw_planner::{NoiseScale, RankFit};
use rusqlite::{Transaction, params};

/// Completed steps whose all-reduce times feed the typical `comm_s`.
const COMM_WINDOW: u32 = 20;

/// The job, if `token` is its worker token. An unknown job gets the same
/// 401 as a wrong token, so the step endpoints cannot be used to learn
/// which job ids exist.
pub fn authorize(tx: &Transaction<'_>, id: &str, token: &str) -> ApiResult<Job> {
    let refused = || ApiError::unauthorized(format!("no job {id} with this worker token"));
    let Some(job) = jobs::find(tx, id)? else {
        return Err(refused());
    };
    if !auth::same(token, &job.job_token) {
        return Err(refused());
    }
    Ok(job)
}

fn check_rank(job: &Job, rank: u32) -> ApiResult<()> {
    if rank >= job.workers() {
        return Err(ApiError::bad_request(format!(
            "rank {rank} is out of range: job {} has {} workers",
            job.id,
            job.workers()
        )));
    }
    Ok(())
}

fn reply(p: &Plan, rank: u32) -> ApiResult<StepPlan> {
    let i = rank as usize;
    let local = p.batches.get(i).copied().ok_or_else(|| {
        ApiError::internal(format!("stored plan of step {} has no rank {rank}", p.step))
    })?;
    let total: u64 = p.batches.iter().sum();
    Ok(StepPlan {
        step: p.step,
        global_batch: p.global_batch,
        local_batch: local,
        offset: p.batches[..i].iter().sum(),
        weight: if total > 0 {
            local as f64 / total as f64
        } else {
            0.0
        },
        algo: p.algo.clone(),
        predicted_step_s: p.predicted_step_s,
        checkpoint: false,
    })
}

/// `POST /v1/jobs/{id}/step/begin`.
pub fn begin(tx: &Transaction<'_>, job: &Job, req: &StepBegin) -> ApiResult<StepPlan> {
    if job.state != JobState::Running {
        return Err(ApiError::conflict(job.not_running()));
    }
    check_rank(job, req.rank)?;
    check_step(req.step)?;
    if req.step < job.sched.resume_step {
        return Err(ApiError::conflict(format!(
            "step {} of job {} was run by an earlier placement: this one (attempt {}) \
             resumes from step {} (GW_RESUME_STEP)",
            req.step, job.id, job.sched.attempt, job.sched.resume_step
        )));
    }
    // The rank is alive: its launch need not be re-sent (see nodes.rs).
    tx.execute(
        "UPDATE ranks SET launched = 2 WHERE job_id = ?1 AND rank = ?2 AND launched = 1",
        params![job.id, req.rank],
    )?;
    if let Some(p) = store::load_plan(tx, &job.id, req.step)? {
        return reply(&p, req.rank);
    }
    let prev = store::latest_plan(tx, &job.id)?;
    if let Some(p) = &prev {
        if req.step > p.step + 1 {
            return Err(ApiError::conflict(format!(
                "step {} of job {} is ahead of the job: the latest planned step is {}, \
                 the next one is {}",
                req.step,
                job.id,
                p.step,
                p.step + 1
            )));
        }
        if req.step < p.step {
            let first: u64 = tx.query_row(
                "SELECT MIN(step) FROM plans WHERE job_id = ?1",
                params![job.id],
                |r| r.get(0),
            )?;
            return Err(ApiError::conflict(format!(
                "step {} of job {} is behind the job: it was never planned \
                 (the job's steps run from {first} to {})",
                req.step, job.id, p.step
            )));
        }
    }
    let global_batch = jobs::batch_at(tx, job, req.step)?;
    if job.sched.preempt {
        // The first step no rank has a plan for is where every rank stops:
        // plans are per step, so all ranks get the same answer.
        let stop = match job.sched.preempt_step {
            Some(s) => s,
            None => {
                jobs::set_preempt_step(tx, &job.id, req.step)?;
                event(
                    tx,
                    Some(&job.id),
                    None,
                    &format!(
                        "job {}: workers told to checkpoint at step {} and exit",
                        job.id, req.step
                    ),
                )?;
                req.step
            }
        };
        if req.step == stop {
            return Ok(StepPlan {
                step: req.step,
                global_batch,
                local_batch: 0,
                offset: 0,
                weight: 0.0,
                algo: job.algo(),
                predicted_step_s: None,
                checkpoint: true,
            });
        }
    }
    let fits: Vec<RankFit> = store::ranks(tx, &job.id)?
        .into_iter()
        .map(|r| r.fit)
        .collect();
    if fits.len() != job.workers() as usize {
        return Err(ApiError::internal(format!(
            "job {} has {} placed ranks, expected {}",
            job.id,
            fits.len(),
            job.workers()
        )));
    }
    // Only "fewer than the warm-up or not" matters: count no further.
    let plans_before: u64 = tx.query_row(
        "SELECT COUNT(*) FROM (SELECT 1 FROM plans WHERE job_id = ?1 LIMIT ?2)",
        params![job.id, plan::WARMUP_STEPS],
        |r| r.get(0),
    )?;
    let algo = job.algo();
    let decision = plan::decide(&Inputs {
        step: req.step,
        planner: job.spec.planner,
        global_batch,
        lo: job.spec.batch_lo,
        hi: job.spec.batch_hi,
        plans_before,
        fits: &fits,
        prev: prev.as_ref(),
        comm_s: typical_comm(tx, &job.id)?,
        algo: &algo,
    })
    .map_err(|e| {
        ApiError::conflict(format!(
            "job {}: cannot plan step {}: {e}",
            job.id, req.step
        ))
    })?;
    store::store_plan(tx, &job.id, &decision.plan)?;
    if let Some(note) = &decision.note {
        event(tx, Some(&job.id), None, &format!("job {}: {note}", job.id))?;
    }
    reply(&decision.plan, req.rank)
}

/// Median over recent completed steps of the slowest rank's `comm_s`.
fn typical_comm(tx: &Transaction<'_>, id: &str) -> ApiResult<Option<f64>> {
    let mut st =
        tx.prepare("SELECT comm_s FROM steps WHERE job_id = ?1 ORDER BY step DESC LIMIT ?2")?;
    let mut v = st
        .query_map(params![id, COMM_WINDOW], |r| r.get::<_, f64>(0))?
        .collect::<rusqlite::Result<Vec<f64>>>()?;
    if v.is_empty() {
        return Ok(None);
    }
    v.sort_by(f64::total_cmp);
    Ok(Some(v[v.len() / 2]))
}

/// Longest time a report may carry: eleven days of one step is already
/// absurd, and anything larger could only overflow the timing fit's sums.
pub const MAX_SECONDS: f64 = 1e6;
/// Largest squared gradient norm a report may carry; real ones are many
/// orders of magnitude below, and the noise scale's products stay finite.
pub const MAX_NORM_SQ: f64 = 1e100;

/// A reported time: in (0, MAX_SECONDS], or [0, MAX_SECONDS] when
/// `zero_ok` (a world of one spends nothing in its all-reduce).
fn check_time(what: &str, x: f64, zero_ok: bool) -> ApiResult<()> {
    let low_ok = if zero_ok { x >= 0.0 } else { x > 0.0 };
    if x.is_finite() && low_ok && x <= MAX_SECONDS {
        return Ok(());
    }
    let low = if zero_ok { "[0" } else { "(0" };
    Err(ApiError::bad_request(format!(
        "{what} = {x} is out of range: a time in seconds in {low}, {MAX_SECONDS:e}]"
    )))
}

fn check_norm(what: &str, x: Option<f64>) -> ApiResult<()> {
    match x {
        Some(v) if !(v.is_finite() && (0.0..=MAX_NORM_SQ).contains(&v)) => {
            Err(ApiError::bad_request(format!(
                "{what} = {v} is out of range: a squared norm in [0, {MAX_NORM_SQ:e}]"
            )))
        }
        _ => Ok(()),
    }
}

fn check_report(job: &Job, req: &StepEnd) -> ApiResult<()> {
    check_rank(job, req.rank)?;
    check_step(req.step)?;
    if req.samples > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "samples = {} is out of range: at most {MAX_BATCH}",
            req.samples
        )));
    }
    check_time("compute_s", req.compute_s, false)?;
    check_time("comm_s", req.comm_s, true)?;
    check_time("step_s", req.step_s, false)?;
    check_norm("local_grad_sq", req.local_grad_sq)?;
    check_norm("global_grad_sq", req.global_grad_sq)
}

/// Steps are stored as SQLite integers.
fn check_step(step: u64) -> ApiResult<()> {
    if step > i64::MAX as u64 {
        return Err(ApiError::bad_request(format!(
            "step = {step} is out of range: at most {}",
            i64::MAX
        )));
    }
    Ok(())
}

/// `POST /v1/jobs/{id}/step/end`.
pub fn end(tx: &Transaction<'_>, job: &Job, req: &StepEnd) -> ApiResult<StepEndReply> {
    if job.state != JobState::Running {
        return Ok(StepEndReply { stop: true });
    }
    check_report(job, req)?;
    let Some(plan) = store::load_plan(tx, &job.id, req.step)? else {
        return Err(ApiError::conflict(format!(
            "step {} of job {} was never planned (call step/begin first)",
            req.step, job.id
        )));
    };
    let inserted = tx.execute(
        "INSERT INTO step_ends(job_id, step, rank, samples, compute_s, comm_s, step_s,
                               local_grad_sq, global_grad_sq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT(job_id, step, rank) DO NOTHING",
        params![
            job.id,
            req.step,
            req.rank,
            req.samples,
            req.compute_s,
            req.comm_s,
            req.step_s,
            req.local_grad_sq,
            req.global_grad_sq
        ],
    )?;
    if inserted == 0 {
        // A retry of a report already counted.
        return Ok(StepEndReply { stop: false });
    }
    let fit: String = tx.query_row(
        "SELECT fit FROM ranks WHERE job_id = ?1 AND rank = ?2",
        params![job.id, req.rank],
        |r| r.get(0),
    )?;
    let mut fit: RankFit =
        serde_json::from_str(&fit).map_err(|e| crate::server::error::corrupt("rank fit", e))?;
    fit.observe(req.samples, req.compute_s);
    tx.execute(
        "UPDATE ranks SET fit = ?3, last_compute_s = ?4 WHERE job_id = ?1 AND rank = ?2",
        params![job.id, req.rank, to_json(&fit)?, req.compute_s],
    )?;
    complete_if_all_reported(tx, job, &plan)?;
    Ok(StepEndReply { stop: false })
}

/// Once every rank reported a step: its measured time, the job's completed
/// step and (when norms were reported) the noise scale.
fn complete_if_all_reported(tx: &Transaction<'_>, job: &Job, plan: &Plan) -> ApiResult<()> {
    // Counting in the primary-key index is cheap; the reports themselves are
    // read once per step, by the last rank to report.
    let count: u64 = tx.query_row(
        "SELECT COUNT(*) FROM step_ends WHERE job_id = ?1 AND step = ?2",
        params![job.id, plan.step],
        |r| r.get(0),
    )?;
    if count < u64::from(job.workers()) {
        return Ok(());
    }
    let reports = {
        let mut st = tx.prepare(
            "SELECT samples, step_s, comm_s, local_grad_sq, global_grad_sq
             FROM step_ends WHERE job_id = ?1 AND step = ?2 ORDER BY rank",
        )?;
        let rows = st.query_map(params![job.id, plan.step], |r| {
            Ok((
                r.get::<_, u64>(0)?,
                r.get::<_, f64>(1)?,
                r.get::<_, f64>(2)?,
                r.get::<_, Option<f64>>(3)?,
                r.get::<_, Option<f64>>(4)?,
            ))
        })?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    if reports.len() < job.workers() as usize {
        return Ok(());
    }
    let measured = reports.iter().map(|r| r.1).fold(0.0, f64::max);
    // The all-reduce's own cost is what the rank that arrived last paid: the
    // others' comm_s also holds their wait for it, which the compute part of
    // the prediction already counts (the max would count imbalance twice).
    let comm = reports.iter().map(|r| r.2).fold(f64::INFINITY, f64::min);
    let comm = if comm.is_finite() { comm } else { 0.0 };
    tx.execute(
        "INSERT INTO steps(job_id, step, measured_step_s, comm_s) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(job_id, step) DO NOTHING",
        params![job.id, plan.step, measured, comm],
    )?;
    tx.execute(
        "UPDATE jobs SET completed_step = MAX(COALESCE(completed_step, ?2), ?2) WHERE id = ?1",
        params![job.id, plan.step],
    )?;
    profile::on_step_complete(tx, job, plan.step)?;
    let samples: Vec<u64> = reports.iter().map(|r| r.0).collect();
    let local: Option<Vec<f64>> = reports.iter().map(|r| r.3).collect();
    let global: Vec<f64> = reports.iter().filter_map(|r| r.4).collect();
    if let (Some(local), false) = (local, global.is_empty()) {
        let mut noise = match &job.noise {
            Some(n) => serde_json::from_str::<NoiseScale>(n)
                .map_err(|e| crate::server::error::corrupt("noise scale", e))?,
            None => NoiseScale::default(),
        };
        // Every rank holds the same all-reduced gradient; average what came.
        let g = global.iter().sum::<f64>() / global.len() as f64;
        noise.observe(&samples, &local, g);
        tx.execute(
            "UPDATE jobs SET noise = ?2 WHERE id = ?1",
            params![job.id, to_json(&noise)?],
        )?;
    }
    Ok(())
}
