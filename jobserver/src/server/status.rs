//! What `GET /v1/jobs[/{id}]` and `GET /v1/jobs/{id}/events` show: a job's
//! state assembled from its rows (latest plan, ranks and fits, last
//! measured step, noise scale), read-only.

use crate::server::error::{ApiResult, corrupt};
use crate::server::jobs::{self, Job};
use crate::server::store::{latest_plan, ranks};
use gw_jobapi::types::{JobStatus, RankStatus};
use gw_planner::{NoiseScale, plan_even};
use rusqlite::{OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};

/// `GET /v1/jobs/{id}`.
pub fn status(tx: &Transaction<'_>, id: &str) -> ApiResult<JobStatus> {
    let job = jobs::get(tx, id)?;
    Ok(status_or_error(tx, &job))
}

/// `GET /v1/jobs`: every job, oldest first.
pub fn list(tx: &Transaction<'_>) -> ApiResult<Vec<JobStatus>> {
    Ok(jobs::all(tx)?
        .iter()
        .map(|j| status_or_error(tx, j))
        .collect())
}

/// The job's status; if a row it is assembled from cannot be read, what
/// the job row itself says, with the error — one damaged job must not hide
/// the others, nor stop an operator from seeing or cancelling it.
fn status_or_error(tx: &Transaction<'_>, job: &Job) -> JobStatus {
    status_of(tx, job).unwrap_or_else(|e| {
        tracing::error!("job {}: {}", job.id, e.message);
        JobStatus {
            job_id: job.id.clone(),
            name: job.spec.name.clone(),
            state: job.state,
            reason: job.reason.clone(),
            workers: job.workers(),
            planner: job.spec.planner,
            global_batch: job.spec.global_batch,
            step: job.completed_step,
            predicted_step_s: None,
            measured_step_s: None,
            noise_scale: None,
            ranks: Vec::new(),
            attempt: job.sched.attempt,
            resume_step: job.sched.resume_step,
            preempting: job.sched.preempt,
            measured_throughput: Vec::new(),
            service: Vec::new(),
            error: Some(e.message),
        }
    })
}

fn status_of(tx: &Transaction<'_>, job: &Job) -> ApiResult<JobStatus> {
    let plan = latest_plan(tx, &job.id)?;
    let global_batch = match &plan {
        Some(p) => p.global_batch,
        None => job.spec.global_batch,
    };
    // Before the first plan, show the even split the first step will use.
    let batches = match &plan {
        Some(p) => p.batches.clone(),
        None => plan_even(
            job.workers() as usize,
            global_batch,
            job.spec.batch_lo,
            job.spec.batch_hi,
        )
        .unwrap_or_default(),
    };
    let measured: Option<f64> = tx
        .query_row(
            "SELECT measured_step_s FROM steps WHERE job_id = ?1 ORDER BY step DESC LIMIT 1",
            params![job.id],
            |r| r.get(0),
        )
        .optional()?;
    let noise_scale = match &job.noise {
        Some(n) => serde_json::from_str::<NoiseScale>(n)
            .map_err(|e| corrupt("noise scale", e))?
            .estimate(),
        None => None,
    };
    let ranks = ranks(tx, &job.id)?
        .into_iter()
        .map(|r| {
            let model = r.fit.model();
            RankStatus {
                rank: r.rank,
                local_batch: batches.get(r.rank as usize).copied().unwrap_or(0),
                node: r.node,
                fit_a: model.map(|m| m.a),
                fit_c: model.map(|m| m.c),
                last_compute_s: r.last_compute_s,
                exit: r.exit,
            }
        })
        .collect();
    Ok(JobStatus {
        job_id: job.id.clone(),
        name: job.spec.name.clone(),
        state: job.state,
        reason: job.reason.clone(),
        workers: job.workers(),
        planner: job.spec.planner,
        global_batch,
        step: job.completed_step,
        predicted_step_s: plan.and_then(|p| p.predicted_step_s),
        measured_step_s: measured,
        noise_scale,
        ranks,
        attempt: job.sched.attempt,
        resume_step: job.sched.resume_step,
        preempting: job.sched.preempt,
        measured_throughput: crate::server::profile::measured(tx, &job.id)?,
        service: crate::server::rounds::service(tx, &job.id)?,
        error: None,
    })
}

/// One line of a job's event log (`GET /v1/jobs/{id}/events`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventLine {
    /// Seconds since the Unix epoch.
    pub at: f64,
    pub node: Option<String>,
    pub message: String,
}

/// The job's events, oldest first.
pub fn events(tx: &Transaction<'_>, id: &str) -> ApiResult<Vec<EventLine>> {
    jobs::get(tx, id)?;
    let mut st =
        tx.prepare("SELECT at, node, message FROM events WHERE job_id = ?1 ORDER BY id")?;
    let rows = st.query_map(params![id], |r| {
        Ok(EventLine {
            at: r.get(0)?,
            node: r.get(1)?,
            message: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}
