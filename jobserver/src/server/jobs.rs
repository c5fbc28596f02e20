//! Jobs as stored: submit, cancel, global-batch changes, placement of
//! pending jobs and the end of a job. Every function takes the open
//! transaction of the request it serves, so a request's changes commit
//! together or not at all.

use crate::server::db::{event, now, to_json};
use crate::server::error::{ApiError, ApiResult, corrupt};
use crate::server::placement::{FreeNode, place};
use crate::server::plan::FIT_FORGET;
use crate::server::validate;
use gw_jobapi::types::{JobState, PlannerKind, SetGlobalBatch, SubmitReply, SubmitRequest};
use gw_planner::RankFit;
use gw_rendezvous::token::random_hex;
use rusqlite::{OptionalExtension, Row, Transaction, params};

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

/// Every job, oldest first.
pub fn all(tx: &Transaction<'_>) -> ApiResult<Vec<Job>> {
    let mut st = tx.prepare(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY seq"))?;
    let rows = st
        .query_map([], job_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(decode).collect()
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
    let id = format!("j{seq}-{}", random(12)?);
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
pub fn cancel(tx: &Transaction<'_>, id: &str) -> ApiResult<()> {
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
    Ok(())
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
pub fn set_global_batch(tx: &Transaction<'_>, id: &str, req: &SetGlobalBatch) -> ApiResult<()> {
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
    if let Some(last) = crate::server::store::latest_plan_step(tx, &job.id)?
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
    Ok(())
}
