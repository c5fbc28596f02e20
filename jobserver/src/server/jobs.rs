//! Jobs as stored: submit, cancel, global-batch changes, placement of
//! pending jobs and the end of a job. Every function takes the open
//! transaction of the request it serves, so a request's changes commit
//! together or not at all.

use crate::server::db::{event, now, to_json};
use crate::server::error::{ApiError, ApiResult, corrupt};
use crate::server::placement::FreeNode;
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
    pub sched: Placement,
}

/// Where a job is in its placements under a scheduling policy
/// (`job_attempts`; all defaults without a policy).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// 0 for the first placement, one more after each preemption.
    pub attempt: u32,
    /// The step the current placement starts from.
    pub resume_step: u64,
    /// The policy asked the workers to checkpoint and exit.
    pub preempt: bool,
    /// The step whose plan was the checkpoint order (the first step the
    /// placement did not start); None until a rank asked for it.
    pub preempt_step: Option<u64>,
    /// Slots per device type the policy chose for the next placement.
    pub want: Option<Vec<(String, u32)>>,
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

const JOB_COLUMNS: &str = "id, spec, state, reason, job_token, store_token, store_addr, \
     completed_step, noise, COALESCE(a.attempt, 0), COALESCE(a.resume_step, 0), \
     COALESCE(a.preempt, 0), a.preempt_step, a.want";

/// Every job query reads its placement row with it.
const JOB_FROM: &str = "jobs LEFT JOIN job_attempts a ON a.job_id = jobs.id";

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
    attempt: u32,
    resume_step: u64,
    preempt: bool,
    preempt_step: Option<u64>,
    want: Option<String>,
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
        attempt: r.get(9)?,
        resume_step: r.get(10)?,
        preempt: r.get(11)?,
        preempt_step: r.get(12)?,
        want: r.get(13)?,
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
        sched: Placement {
            attempt: raw.attempt,
            resume_step: raw.resume_step,
            preempt: raw.preempt,
            preempt_step: raw.preempt_step,
            want: raw
                .want
                .map(|w| serde_json::from_str(&w).map_err(|e| corrupt("job placement", e)))
                .transpose()?,
        },
    })
}

/// The job, or None.
pub fn find(tx: &Transaction<'_>, id: &str) -> ApiResult<Option<Job>> {
    let row = tx
        .query_row(
            &format!("SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE id = ?1"),
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
    let mut st = tx.prepare(&format!(
        "SELECT {JOB_COLUMNS} FROM {JOB_FROM} ORDER BY seq"
    ))?;
    let rows = st
        .query_map([], job_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(decode).collect()
}

/// Jobs in `state`, oldest first.
pub fn with_state(tx: &Transaction<'_>, state: JobState) -> ApiResult<Vec<Job>> {
    let mut st = tx.prepare(&format!(
        "SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE state = ?1 ORDER BY seq"
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
    if let Some(policy) = crate::server::rounds::policy_name(tx)?
        && req.steps.is_none()
    {
        return Err(ApiError::bad_request(format!(
            "steps: this server schedules jobs with the {policy} policy, which needs each \
             job's total steps (gwjob submit --steps N)"
        )));
    }
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
/// fit does not block smaller ones behind it). Under a scheduling policy a
/// job is placed only once a round has chosen its device types (`want`),
/// and then only on nodes of those types.
pub fn place_pending(tx: &Transaction<'_>) -> ApiResult<()> {
    let pending = with_state(tx, JobState::Pending)?;
    if pending.is_empty() {
        return Ok(());
    }
    let policy = crate::server::rounds::policy_name(tx)?.is_some();
    let mut free = free_nodes(tx)?;
    for job in pending {
        let nodes = match (&job.sched.want, policy) {
            (_, false) => place(&free, job.workers()),
            (None, true) => None,
            (Some(want), true) => place_typed(&free, want),
        };
        let Some(nodes) = nodes else {
            continue;
        };
        if policy {
            set_want(tx, &job.id, None)?;
        }
        let fit = to_json(&RankFit::new(FIT_FORGET))?;
        for (rank, node) in nodes.iter().enumerate() {
            tx.execute(
                "INSERT INTO ranks(job_id, rank, node, fit) VALUES (?1, ?2, ?3, ?4)",
                params![job.id, rank as i64, node, fit],
            )?;
            if let Some(f) = free.iter_mut().find(|f| &f.node.name == node) {
                f.node.free = f.node.free.saturating_sub(1);
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

/// An up node's free slots and its device type.
struct TypedNode {
    node: FreeNode,
    device_type: String,
}

/// Up nodes with their free slots, in registration order.
fn free_nodes(tx: &Transaction<'_>) -> ApiResult<Vec<TypedNode>> {
    let mut st = tx.prepare(
        "SELECT n.name, n.rack, n.slots,
                (SELECT COUNT(*) FROM ranks r WHERE r.node = n.name AND r.released = 0),
                n.device_type
         FROM nodes n WHERE n.state = 'up' ORDER BY n.reg_seq",
    )?;
    let rows = st.query_map([], |r| {
        let slots: i64 = r.get(2)?;
        let used: i64 = r.get(3)?;
        Ok(TypedNode {
            node: FreeNode {
                name: r.get(0)?,
                rack: r.get(1)?,
                free: u32::try_from((slots - used).max(0)).unwrap_or(0),
            },
            device_type: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

fn place(free: &[TypedNode], workers: u32) -> Option<Vec<String>> {
    let nodes: Vec<FreeNode> = free.iter().map(|t| t.node.clone()).collect();
    crate::server::placement::place(&nodes, workers)
}

/// Ranks on nodes of the chosen types: `want`'s counts in its order, each
/// type's share placed as [`place`] places a job.
fn place_typed(free: &[TypedNode], want: &[(String, u32)]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for (device_type, n) in want.iter().filter(|(_, n)| *n > 0) {
        let nodes: Vec<FreeNode> = free
            .iter()
            .filter(|t| &t.device_type == device_type)
            .map(|t| t.node.clone())
            .collect();
        out.extend(crate::server::placement::place(&nodes, *n)?);
    }
    (!out.is_empty()).then_some(out)
}

/// The job's placement row, created with its defaults if missing.
fn attempts_row(tx: &Transaction<'_>, id: &str) -> ApiResult<()> {
    tx.execute(
        "INSERT INTO job_attempts(job_id) VALUES (?1) ON CONFLICT(job_id) DO NOTHING",
        params![id],
    )?;
    Ok(())
}

/// The device types and counts the policy chose for the job's next
/// placement (None: not to be placed).
pub fn set_want(tx: &Transaction<'_>, id: &str, want: Option<&[(String, u32)]>) -> ApiResult<()> {
    let text = want.map(to_json).transpose()?;
    update_attempt(tx, id, "want = ?2", text)
}

/// Asks (or stops asking) the job's workers to checkpoint and exit at the
/// next step nobody has a plan for.
pub fn set_preempt(tx: &Transaction<'_>, id: &str, on: bool) -> ApiResult<()> {
    update_attempt(tx, id, "preempt = ?2, preempt_step = NULL", on)
}

pub fn set_preempt_step(tx: &Transaction<'_>, id: &str, step: u64) -> ApiResult<()> {
    update_attempt(tx, id, "preempt_step = ?2", step)
}

/// Sets columns of the job's `job_attempts` row (made first if missing);
/// `set` is a fixed SQL assignment list with `?2` for `value`.
fn update_attempt(
    tx: &Transaction<'_>,
    id: &str,
    set: &'static str,
    value: impl rusqlite::ToSql,
) -> ApiResult<()> {
    attempts_row(tx, id)?;
    tx.execute(
        &format!("UPDATE job_attempts SET {set} WHERE job_id = ?1"),
        params![id, value],
    )?;
    Ok(())
}

/// A preempted job whose workers all checkpointed and exited: it leaves its
/// nodes and waits for its next placement, which resumes from the step its
/// workers were stopped at.
pub fn requeue(tx: &Transaction<'_>, job: &Job, step: u64) -> ApiResult<()> {
    tx.execute("DELETE FROM ranks WHERE job_id = ?1", params![job.id])?;
    tx.execute(
        "UPDATE jobs SET state = 'pending', store_addr = NULL WHERE id = ?1",
        params![job.id],
    )?;
    attempts_row(tx, &job.id)?;
    let next = job.sched.attempt.saturating_add(1);
    tx.execute(
        "UPDATE job_attempts SET attempt = ?2, resume_step = ?3, preempt = 0, preempt_step = NULL
         WHERE job_id = ?1",
        params![job.id, next, step],
    )?;
    event(
        tx,
        Some(&job.id),
        None,
        &format!(
            "job {}: checkpointed at step {step} and left its nodes; placement {next} \
             resumes from step {step}",
            job.id
        ),
    )?;
    place_pending(tx)
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
