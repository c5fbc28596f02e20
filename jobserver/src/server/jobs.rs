//! Jobs as stored: submit, status, cancel, global-batch changes, placement
//! of pending jobs and the end of a job. Every function takes the open
//! transaction of the request it serves, so a request's changes commit
//! together or not at all.

use crate::launcher::spawn::random_hex;
use crate::server::db::{event, now};
use crate::server::error::{ApiError, ApiResult, corrupt};
use crate::server::placement::{FreeNode, place};
use crate::server::plan::{FIT_FORGET, Plan, PlanKind};
use crate::server::validate;
use gw_jobapi::types::{
    JobState, JobStatus, PlannerKind, RankStatus, SetGlobalBatch, SubmitReply, SubmitRequest,
};
use gw_planner::{Linear, NoiseScale, RankFit, plan_even};
use rusqlite::{OptionalExtension, Row, Transaction, params};
use serde::Serialize;

/// A job's row, decoded.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: String,
    pub spec: SubmitRequest,
    pub state: JobState,
    pub reason: Option<String>,
    pub job_token: String,
    pub store_token: String,
    pub store_addr: Option<String>,
    pub completed_step: Option<u64>,
    pub noise: Option<String>,
}

impl Job {
    pub fn workers(&self) -> u32 {
        self.spec.workers
    }
    /// The all-reduce algorithm the job's env asks for, else "auto".
    pub fn algo(&self) -> String {
        self.spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "GW_ALGO")
            .map_or_else(|| "auto".to_owned(), |(_, v)| v.clone())
    }
    /// The 409 message for a job that is not running.
    pub fn not_running(&self) -> String {
        let reason = self.reason.as_deref().unwrap_or("no reason recorded");
        match self.state {
            JobState::Pending => format!("job {} is not running yet (pending placement)", self.id),
            JobState::Running => format!("job {} is running", self.id),
            JobState::Succeeded => format!("job {} has already succeeded", self.id),
            JobState::Failed => format!("job {} failed: {reason}", self.id),
            JobState::Cancelled => format!("job {} was cancelled: {reason}", self.id),
        }
    }
}

pub fn state_str(s: JobState) -> &'static str {
    match s {
        JobState::Pending => "pending",
        JobState::Running => "running",
        JobState::Succeeded => "succeeded",
        JobState::Failed => "failed",
        JobState::Cancelled => "cancelled",
    }
}

fn parse_state(s: &str) -> ApiResult<JobState> {
    Ok(match s {
        "pending" => JobState::Pending,
        "running" => JobState::Running,
        "succeeded" => JobState::Succeeded,
        "failed" => JobState::Failed,
        "cancelled" => JobState::Cancelled,
        other => return Err(corrupt("job state", other)),
    })
}

fn planner_str(p: PlannerKind) -> &'static str {
    match p {
        PlannerKind::Even => "even",
        PlannerKind::Optperf => "optperf",
    }
}

const JOB_COLUMNS: &str =
    "id, spec, state, reason, job_token, store_token, store_addr, completed_step, noise";

/// A job row as read, before its JSON and enum columns are decoded (which
/// can fail with a message, unlike a row mapper).
struct RawJob {
    id: String,
    spec: String,
    state: String,
    reason: Option<String>,
    job_token: String,
    store_token: String,
    store_addr: Option<String>,
    completed_step: Option<u64>,
    noise: Option<String>,
}

fn job_from_row(r: &Row<'_>) -> rusqlite::Result<RawJob> {
    Ok(RawJob {
        id: r.get(0)?,
        spec: r.get(1)?,
        state: r.get(2)?,
        reason: r.get(3)?,
        job_token: r.get(4)?,
        store_token: r.get(5)?,
        store_addr: r.get(6)?,
        completed_step: r.get(7)?,
        noise: r.get(8)?,
    })
}

fn decode(raw: RawJob) -> ApiResult<Job> {
    Ok(Job {
        spec: serde_json::from_str(&raw.spec).map_err(|e| corrupt("job spec", e))?,
        state: parse_state(&raw.state)?,
        id: raw.id,
        reason: raw.reason,
        job_token: raw.job_token,
        store_token: raw.store_token,
        store_addr: raw.store_addr,
        completed_step: raw.completed_step,
        noise: raw.noise,
    })
}

/// The job, or None.
pub fn find(tx: &Transaction<'_>, id: &str) -> ApiResult<Option<Job>> {
    let row = tx
        .query_row(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"),
            params![id],
            job_from_row,
        )
        .optional()?;
    row.map(decode).transpose()
}

/// The job, or 404.
pub fn get(tx: &Transaction<'_>, id: &str) -> ApiResult<Job> {
    find(tx, id)?.ok_or_else(|| ApiError::not_found(format!("job {id} not found")))
}

/// Jobs in `state`, oldest first.
fn with_state(tx: &Transaction<'_>, state: JobState) -> ApiResult<Vec<Job>> {
    let mut st = tx.prepare(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE state = ?1 ORDER BY seq"
    ))?;
    let rows = st
        .query_map(params![state_str(state)], job_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(decode).collect()
}

/// `POST /v1/jobs`: validates, stores the job (pending) and tries to place
/// it at once.
pub fn submit(tx: &Transaction<'_>, req: &SubmitRequest) -> ApiResult<SubmitReply> {
    validate::submission(req)?;
    let seq: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs", [], |r| {
        r.get(0)
    })?;
    let random = |n| random_hex(n).map_err(|e| ApiError::internal(format!("/dev/urandom: {e}")));
    let id = format!("j{seq}-{}", random(3)?);
    let spec = to_json(req)?;
    tx.execute(
        "INSERT INTO jobs(seq, id, name, spec, workers, planner, state, job_token, store_token, submitted_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8, ?9)",
        params![
            seq,
            id,
            req.name,
            spec,
            req.workers,
            planner_str(req.planner),
            random(16)?,
            random(16)?,
            now()
        ],
    )?;
    for c in &req.schedule {
        tx.execute(
            "INSERT INTO batch_changes(job_id, step, global_batch, source) VALUES (?1, ?2, ?3, 'schedule')",
            params![id, c.step, c.global_batch],
        )?;
    }
    event(
        tx,
        Some(&id),
        None,
        &format!(
            "job {id} submitted: {} workers, global batch {}, planner {}",
            req.workers,
            req.global_batch,
            planner_str(req.planner)
        ),
    )?;
    place_pending(tx)?;
    Ok(SubmitReply { job_id: id })
}

/// Places every pending job that fits now, oldest first (a job that does not
/// fit does not block smaller ones behind it).
pub fn place_pending(tx: &Transaction<'_>) -> ApiResult<()> {
    let pending = with_state(tx, JobState::Pending)?;
    if pending.is_empty() {
        return Ok(());
    }
    let mut free = free_nodes(tx)?;
    for job in pending {
        let Some(nodes) = place(&free, job.workers()) else {
            continue;
        };
        let fit = to_json(&RankFit::new(FIT_FORGET))?;
        for (rank, node) in nodes.iter().enumerate() {
            tx.execute(
                "INSERT INTO ranks(job_id, rank, node, fit) VALUES (?1, ?2, ?3, ?4)",
                params![job.id, rank as i64, node, fit],
            )?;
            if let Some(f) = free.iter_mut().find(|f| &f.name == node) {
                f.free = f.free.saturating_sub(1);
            }
        }
        tx.execute(
            "UPDATE jobs SET state = 'running' WHERE id = ?1",
            params![job.id],
        )?;
        let mut groups: Vec<(&str, usize)> = Vec::new();
        for n in &nodes {
            match groups.last_mut() {
                Some((m, k)) if *m == n.as_str() => *k += 1,
                _ => groups.push((n, 1)),
            }
        }
        let summary: Vec<String> = groups.iter().map(|(n, k)| format!("{n} x{k}")).collect();
        event(
            tx,
            Some(&job.id),
            None,
            &format!("job {} placed on {}", job.id, summary.join(", ")),
        )?;
    }
    Ok(())
}

/// Up nodes with their free slots, in registration order.
fn free_nodes(tx: &Transaction<'_>) -> ApiResult<Vec<FreeNode>> {
    let mut st = tx.prepare(
        "SELECT n.name, n.rack, n.slots,
                (SELECT COUNT(*) FROM ranks r WHERE r.node = n.name AND r.released = 0)
         FROM nodes n WHERE n.state = 'up' ORDER BY n.reg_seq",
    )?;
    let rows = st.query_map([], |r| {
        let slots: i64 = r.get(2)?;
        let used: i64 = r.get(3)?;
        Ok(FreeNode {
            name: r.get(0)?,
            rack: r.get(1)?,
            free: u32::try_from((slots - used).max(0)).unwrap_or(0),
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Ends a running or pending job. Ranks never launched free their slots
/// now; launched ones when their exit is reported (or their node is lost).
pub fn end(
    tx: &Transaction<'_>,
    job: &Job,
    state: JobState,
    reason: Option<&str>,
) -> ApiResult<()> {
    tx.execute(
        "UPDATE jobs SET state = ?2, reason = ?3, ended_at = ?4 WHERE id = ?1",
        params![job.id, state_str(state), reason, now()],
    )?;
    tx.execute(
        "UPDATE ranks SET released = 1 WHERE job_id = ?1 AND launched = 0",
        params![job.id],
    )?;
    let line = match reason {
        Some(r) => format!("job {} {}: {r}", job.id, state_str(state)),
        None => format!("job {} {}", job.id, state_str(state)),
    };
    event(tx, Some(&job.id), None, &line)
}

/// `POST /v1/jobs/{id}/cancel`. Cancelling a cancelled job is a no-op; a
/// job that already ended otherwise cannot be cancelled (409).
pub fn cancel(tx: &Transaction<'_>, id: &str) -> ApiResult<JobStatus> {
    let job = get(tx, id)?;
    match job.state {
        JobState::Pending | JobState::Running => {
            end(
                tx,
                &job,
                JobState::Cancelled,
                Some("cancelled by the administrator"),
            )?;
        }
        JobState::Cancelled => {}
        JobState::Succeeded | JobState::Failed => {
            return Err(ApiError::conflict(job.not_running()));
        }
    }
    status(tx, id)
}

/// The global batch in force at `step`: the latest change at or before it,
/// else the submitted one.
pub fn batch_at(tx: &Transaction<'_>, job: &Job, step: u64) -> ApiResult<u64> {
    let b: Option<u64> = tx
        .query_row(
            "SELECT global_batch FROM batch_changes WHERE job_id = ?1 AND step <= ?2
             ORDER BY step DESC LIMIT 1",
            params![job.id, step],
            |r| r.get(0),
        )
        .optional()?;
    Ok(b.unwrap_or(job.spec.global_batch))
}

/// `POST /v1/jobs/{id}/global_batch`: B from `step` on (until the next
/// scheduled change). Steps already planned cannot change (409).
pub fn set_global_batch(
    tx: &Transaction<'_>,
    id: &str,
    req: &SetGlobalBatch,
) -> ApiResult<JobStatus> {
    let job = get(tx, id)?;
    if !matches!(job.state, JobState::Pending | JobState::Running) {
        return Err(ApiError::conflict(job.not_running()));
    }
    validate::global_batch(
        job.workers(),
        job.spec.batch_lo,
        job.spec.batch_hi,
        req.global_batch,
    )
    .map_err(|e| ApiError::bad_request(format!("global_batch: {}", e.message)))?;
    if req.step > i64::MAX as u64 {
        return Err(ApiError::bad_request(format!(
            "step {} is too large",
            req.step
        )));
    }
    if let Some(last) = latest_plan_step(tx, &job.id)?
        && req.step <= last
    {
        return Err(ApiError::conflict(format!(
            "step {} of job {id} is already planned (latest planned step is {last}); \
             choose step {} or later",
            req.step,
            last + 1
        )));
    }
    tx.execute(
        "INSERT INTO batch_changes(job_id, step, global_batch, source) VALUES (?1, ?2, ?3, 'api')
         ON CONFLICT(job_id, step) DO UPDATE SET global_batch = excluded.global_batch, source = 'api'",
        params![job.id, req.step, req.global_batch],
    )?;
    event(
        tx,
        Some(&job.id),
        None,
        &format!(
            "job {id}: global batch set to {} from step {}",
            req.global_batch, req.step
        ),
    )?;
    status(tx, id)
}

pub fn latest_plan_step(tx: &Transaction<'_>, id: &str) -> ApiResult<Option<u64>> {
    Ok(tx.query_row(
        "SELECT MAX(step) FROM plans WHERE job_id = ?1",
        params![id],
        |r| r.get(0),
    )?)
}

/// The stored plan of `step`, if any.
pub fn load_plan(tx: &Transaction<'_>, id: &str, step: u64) -> ApiResult<Option<Plan>> {
    plan_query(tx, "WHERE job_id = ?1 AND step = ?2", params![id, step])
}

/// The latest stored plan, if any.
pub fn latest_plan(tx: &Transaction<'_>, id: &str) -> ApiResult<Option<Plan>> {
    plan_query(
        tx,
        "WHERE job_id = ?1 ORDER BY step DESC LIMIT 1",
        params![id],
    )
}

fn plan_query(
    tx: &Transaction<'_>,
    tail: &str,
    p: impl rusqlite::Params,
) -> ApiResult<Option<Plan>> {
    let row = tx
        .query_row(
            &format!(
                "SELECT step, global_batch, batches, kind, basis, predicted_step_s, algo FROM plans {tail}"
            ),
            p,
            |r| {
                Ok((
                    r.get::<_, u64>(0)?,
                    r.get::<_, u64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<f64>>(5)?,
                    r.get::<_, String>(6)?,
                ))
            },
        )
        .optional()?;
    let Some((step, global_batch, batches, kind, basis, predicted_step_s, algo)) = row else {
        return Ok(None);
    };
    Ok(Some(Plan {
        step,
        global_batch,
        batches: serde_json::from_str(&batches).map_err(|e| corrupt("plan batches", e))?,
        kind: PlanKind::parse(&kind).ok_or_else(|| corrupt("plan kind", &kind))?,
        basis: basis
            .map(|b| serde_json::from_str::<Vec<Linear>>(&b))
            .transpose()
            .map_err(|e| corrupt("plan basis", e))?,
        predicted_step_s,
        algo,
    }))
}

pub fn store_plan(tx: &Transaction<'_>, id: &str, p: &Plan) -> ApiResult<()> {
    tx.execute(
        "INSERT INTO plans(job_id, step, global_batch, batches, kind, basis, predicted_step_s, algo)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            id,
            p.step,
            p.global_batch,
            to_json(&p.batches)?,
            p.kind.as_str(),
            p.basis.as_ref().map(to_json).transpose()?,
            p.predicted_step_s,
            p.algo
        ],
    )?;
    Ok(())
}

/// Serialising our own values cannot fail in practice; if it does, it is a
/// server bug reported as a 500 rather than a panic.
pub fn to_json<T: Serialize + ?Sized>(v: &T) -> ApiResult<String> {
    serde_json::to_string(v).map_err(|e| ApiError::internal(format!("cannot encode: {e}")))
}

/// A rank's row, decoded.
pub struct RankRow {
    pub rank: u32,
    pub node: String,
    pub fit: RankFit,
    pub last_compute_s: Option<f64>,
    pub exit: Option<i32>,
}

/// Every placed rank of the job, by rank.
pub fn ranks(tx: &Transaction<'_>, id: &str) -> ApiResult<Vec<RankRow>> {
    let mut st = tx.prepare(
        "SELECT rank, node, fit, last_compute_s, exited, exit_code, exit_signal
         FROM ranks WHERE job_id = ?1 ORDER BY rank",
    )?;
    let rows = st
        .query_map(params![id], |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<f64>>(3)?,
                r.get::<_, bool>(4)?,
                r.get::<_, Option<i32>>(5)?,
                r.get::<_, Option<i32>>(6)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|(rank, node, fit, last, exited, code, signal)| {
            Ok(RankRow {
                rank,
                node,
                fit: serde_json::from_str(&fit).map_err(|e| corrupt("rank fit", e))?,
                last_compute_s: last,
                exit: match (exited, code, signal) {
                    (false, _, _) => None,
                    (true, Some(c), _) => Some(c),
                    (true, None, Some(s)) => Some(-s),
                    (true, None, None) => Some(-1),
                },
            })
        })
        .collect()
}

/// `GET /v1/jobs/{id}`.
pub fn status(tx: &Transaction<'_>, id: &str) -> ApiResult<JobStatus> {
    let job = get(tx, id)?;
    status_of(tx, &job)
}

/// `GET /v1/jobs`: every job, oldest first.
pub fn list(tx: &Transaction<'_>) -> ApiResult<Vec<JobStatus>> {
    let mut st = tx.prepare(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY seq"))?;
    let rows = st
        .query_map([], job_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|r| decode(r).and_then(|j| status_of(tx, &j)))
        .collect()
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
    })
}

/// One line of a job's event log (`GET /v1/jobs/{id}/events`).
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct EventLine {
    /// Seconds since the Unix epoch.
    pub at: f64,
    pub node: Option<String>,
    pub message: String,
}

/// The job's events, oldest first.
pub fn events(tx: &Transaction<'_>, id: &str) -> ApiResult<Vec<EventLine>> {
    get(tx, id)?;
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
