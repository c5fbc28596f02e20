//! Nodes: registration, the heartbeat through which agents learn what to
//! run (open a store, launch ranks, stop a job) and report what happened
//! (stores opened, workers exited), and liveness.
//!
//! Delivery rules, chosen so that neither a lost reply nor a server restart
//! (a `kill -9` between a commit and its reply included) loses an
//! instruction or starts a rank twice. Agents start each (job, rank) at most
//! once per agent process and ignore a store they already run, so the server
//! repeats what it cannot know was received:
//! * `open_stores` is repeated in every heartbeat of rank 0's node until the
//!   store's address is reported;
//! * `launches` are repeated until each rank is *confirmed*: it called
//!   step/begin or its exit was reported. The `ranks.launched` column says
//!   where a rank is: 0 never sent, 1 sent (repeated), 2 confirmed (no more
//!   sends). A launch always lists all of the job's ranks on the node, so
//!   the agent's local ranks (index in the list) never shift. A node that
//!   registers again runs a new agent process, and the old one's workers died
//!   with it: its sent, unexited ranks are recorded as ended (never re-sent)
//!   and their running jobs fail naming the rank and node;
//! * `stops` are repeated while the job has ended and a launched rank on the
//!   node has not reported its exit;
//! * `exits` may arrive more than once; only the first report of a rank
//!   counts.
//!
//! Liveness is deliberately in memory: when the server starts, every node's
//! timer starts from that moment, so downtime of the server itself never
//! makes nodes look lost.

use crate::server::db::event;
use crate::server::error::{ApiError, ApiResult};
use crate::server::jobs::{self, Job};
use gw_jobapi::types::{
    Heartbeat, HeartbeatReply, JobState, Launch, OpenStore, RegisterNode, RegisterReply,
    StoreOpened, WorkerExit,
};
use gw_rendezvous::launch_env::{JobServerEnv, job_vars, var};
use rusqlite::{OptionalExtension, Transaction, params};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// When each node last heartbeated, since this server started.
pub struct Liveness {
    pub timeout: Duration,
    seen: Mutex<HashMap<String, Instant>>,
}

impl Liveness {
    /// Every node in `up` counts as just seen.
    pub fn new(timeout: Duration, up: Vec<String>) -> Liveness {
        let now = Instant::now();
        Liveness {
            timeout,
            seen: Mutex::new(up.into_iter().map(|n| (n, now)).collect()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn touch(&self, node: &str) {
        self.map().insert(node.to_owned(), Instant::now());
    }

    /// Nodes silent for longer than the timeout.
    pub fn expired(&self) -> Vec<String> {
        let now = Instant::now();
        self.map()
            .iter()
            .filter(|(_, t)| now.duration_since(**t) > self.timeout)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Stops watching these nodes (they were marked lost), unless one
    /// heartbeated in the meantime; a later heartbeat brings a node back.
    pub fn forget_if_silent(&self, nodes: &[String]) {
        let mut m = self.map();
        let now = Instant::now();
        for n in nodes {
            if m.get(n)
                .is_some_and(|t| now.duration_since(*t) > self.timeout)
            {
                m.remove(n);
            }
        }
    }
}

/// Names of nodes currently up, for [`Liveness::new`] at startup.
pub fn up_nodes(tx: &Transaction<'_>) -> ApiResult<Vec<String>> {
    let mut st = tx.prepare("SELECT name FROM nodes WHERE state = 'up'")?;
    let rows = st.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<Vec<String>>>()?)
}

/// Node names travel in URL paths and environment variables: keep them to
/// hostname characters.
pub(crate) fn check_name(what: &str, s: &str) -> ApiResult<()> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{what} {s:?} must be 1..=128 characters of A-Z a-z 0-9 . _ -"
        )))
    }
}

/// `POST /v1/nodes/register`: adds the node or updates it (same name), and
/// marks it up. Ranks it was running died with its old agent (see
/// [`workers_lost_with_agent`]).
pub fn register(
    tx: &Transaction<'_>,
    live: &Liveness,
    req: &RegisterNode,
    heartbeat_ms: u64,
) -> ApiResult<RegisterReply> {
    check_name("node", &req.node)?;
    check_name("rack", &req.rack)?;
    if req.slots == 0 || req.slots > 4096 {
        return Err(ApiError::bad_request(format!(
            "slots must be 1..=4096 (got {})",
            req.slots
        )));
    }
    if req.addr.trim().is_empty() {
        return Err(ApiError::bad_request("addr must not be empty"));
    }
    crate::server::validate::printable("addr", &req.addr, 256)?;
    crate::server::validate::printable("device_type", &req.device_type, 128)?;
    tx.execute(
        "INSERT INTO racks(name) VALUES (?1) ON CONFLICT(name) DO NOTHING",
        params![req.rack],
    )?;
    let seq: i64 = tx.query_row("SELECT COALESCE(MAX(reg_seq), 0) + 1 FROM nodes", [], |r| {
        r.get(0)
    })?;
    tx.execute(
        "INSERT INTO nodes(name, rack, slots, device_type, addr, state, reason, reg_seq, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'up', NULL, ?6, ?7)
         ON CONFLICT(name) DO UPDATE SET rack = excluded.rack, slots = excluded.slots,
             device_type = excluded.device_type, addr = excluded.addr, state = 'up',
             reason = NULL, updated_at = excluded.updated_at",
        params![req.node, req.rack, req.slots, req.device_type, req.addr, seq, crate::server::db::now()],
    )?;
    live.touch(&req.node);
    event(
        tx,
        None,
        Some(&req.node),
        &format!(
            "node {} registered: rack {}, {} slots of {}, addr {}",
            req.node, req.rack, req.slots, req.device_type, req.addr
        ),
    )?;
    workers_lost_with_agent(tx, &req.node)?;
    jobs::place_pending(tx)?;
    Ok(RegisterReply {
        heartbeat_ms,
        role: None,
    })
}

/// A node registers again when a new agent process starts there, and an
/// agent's workers die with it: every rank sent to the node that has not
/// exited is gone (and must never be re-sent). Running jobs among them fail
/// naming the rank and the node.
fn workers_lost_with_agent(tx: &Transaction<'_>, node: &str) -> ApiResult<()> {
    let lost: Vec<(String, u32)> = {
        let mut st = tx.prepare(
            "SELECT job_id, rank FROM ranks WHERE node = ?1 AND launched > 0 AND exited = 0
             ORDER BY job_id, rank",
        )?;
        let rows = st.query_map(params![node], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    tx.execute(
        "UPDATE ranks SET exited = 1, released = 1 WHERE node = ?1 AND launched > 0 AND exited = 0",
        params![node],
    )?;
    let mut done: Vec<&str> = Vec::new();
    for (id, rank) in &lost {
        if done.contains(&id.as_str()) {
            continue;
        }
        done.push(id);
        let reason = format!("rank {rank} on node {node} was lost: the node's agent restarted");
        event(tx, Some(id), Some(node), &format!("job {id}: {reason}"))?;
        let job = jobs::get(tx, id)?;
        if job.state == JobState::Running {
            jobs::end(tx, &job, JobState::Failed, Some(&reason))?;
        }
    }
    Ok(())
}

/// `POST /v1/nodes/{node}/heartbeat`. `server_url` is what workers are told
/// as `GW_JOB_SERVER`.
pub fn heartbeat(
    tx: &Transaction<'_>,
    live: &Liveness,
    node: &str,
    hb: &Heartbeat,
    server_url: &str,
) -> ApiResult<HeartbeatReply> {
    let state: Option<String> = tx
        .query_row(
            "SELECT state FROM nodes WHERE name = ?1",
            params![node],
            |r| r.get(0),
        )
        .optional()?;
    let Some(state) = state else {
        return Err(ApiError::not_found(format!(
            "node {node} is not registered (POST /v1/nodes/register first)"
        )));
    };
    live.touch(node);
    if state == "lost" {
        tx.execute(
            "UPDATE nodes SET state = 'up', reason = NULL, updated_at = ?2 WHERE name = ?1",
            params![node, crate::server::db::now()],
        )?;
        event(
            tx,
            None,
            Some(node),
            &format!("node {node} is heartbeating again"),
        )?;
    }
    for s in &hb.stores {
        store_opened(tx, node, s)?;
    }
    for e in &hb.exits {
        worker_exited(tx, node, e)?;
    }
    jobs::place_pending(tx)?;
    Ok(HeartbeatReply {
        open_stores: open_stores(tx, node)?,
        launches: launches(tx, node, server_url)?,
        stops: stops(tx, node)?,
    })
}

/// Records the store address of a job whose rank 0 is on `node`; later
/// reports for the same job are ignored (the first store stays).
fn store_opened(tx: &Transaction<'_>, node: &str, s: &StoreOpened) -> ApiResult<()> {
    let Some(job) = jobs::find(tx, &s.job_id)? else {
        tracing::warn!("node {node} reported a store for unknown job {}", s.job_id);
        return Ok(());
    };
    let rank0: Option<String> = tx
        .query_row(
            "SELECT node FROM ranks WHERE job_id = ?1 AND rank = 0",
            params![job.id],
            |r| r.get(0),
        )
        .optional()?;
    if rank0.as_deref() != Some(node) {
        tracing::warn!(
            "node {node} reported a store for job {}, whose rank 0 is not on it; ignored",
            job.id
        );
        return Ok(());
    }
    if job.state != JobState::Running
        || job.store_addr.is_some()
        || s.addr.trim().is_empty()
        || s.attempt != job.sched.attempt
    {
        return Ok(());
    }
    tx.execute(
        "UPDATE jobs SET store_addr = ?2 WHERE id = ?1",
        params![job.id, s.addr],
    )?;
    event(
        tx,
        Some(&job.id),
        Some(node),
        &format!(
            "job {}: rendezvous store at {} on node {node}",
            job.id, s.addr
        ),
    )
}

/// The failure text for a worker that did not exit cleanly.
pub fn exit_reason(node: &str, e: &WorkerExit) -> Option<String> {
    match (e.code, e.signal) {
        (Some(0), _) => None,
        (Some(c), _) => Some(format!(
            "rank {} on node {node} exited with status {c}",
            e.rank
        )),
        (None, Some(s)) => Some(format!(
            "rank {} on node {node} was killed by signal {s}",
            e.rank
        )),
        (None, None) => Some(format!(
            "rank {} on node {node} exited with an unknown status",
            e.rank
        )),
    }
}

fn worker_exited(tx: &Transaction<'_>, node: &str, e: &WorkerExit) -> ApiResult<()> {
    // A repeated report from a placement the job has left: its ranks' rows
    // are gone, or belong to the next placement.
    if jobs::find(tx, &e.job_id)?.is_some_and(|j| j.sched.attempt != e.attempt) {
        return Ok(());
    }
    let row: Option<bool> = tx
        .query_row(
            "SELECT exited FROM ranks WHERE job_id = ?1 AND rank = ?2 AND node = ?3",
            params![e.job_id, e.rank, node],
            |r| r.get(0),
        )
        .optional()?;
    match row {
        None => {
            tracing::warn!(
                "node {node} reported an exit of rank {} of job {}, which is not on it; ignored",
                e.rank,
                e.job_id
            );
            return Ok(());
        }
        Some(true) => return Ok(()), // a duplicate report
        Some(false) => {}
    }
    tx.execute(
        "UPDATE ranks SET exited = 1, exit_code = ?3, exit_signal = ?4, released = 1
         WHERE job_id = ?1 AND rank = ?2",
        params![e.job_id, e.rank, e.code, e.signal],
    )?;
    let job = jobs::get(tx, &e.job_id)?;
    let reason = exit_reason(node, e);
    let line = reason
        .clone()
        .unwrap_or_else(|| format!("rank {} on node {node} exited with status 0", e.rank));
    event(
        tx,
        Some(&job.id),
        Some(node),
        &format!("job {}: {line}", job.id),
    )?;
    if job.state != JobState::Running {
        return Ok(());
    }
    match reason {
        Some(r) => jobs::end(tx, &job, JobState::Failed, Some(&r)),
        None => {
            let (left, failed): (i64, i64) = tx.query_row(
                "SELECT SUM(exited = 0), SUM(exited = 1 AND (exit_code IS NULL OR exit_code != 0))
                 FROM ranks WHERE job_id = ?1",
                params![job.id],
                |r| {
                    Ok((
                        r.get::<_, Option<i64>>(0)?.unwrap_or(0),
                        r.get::<_, Option<i64>>(1)?.unwrap_or(0),
                    ))
                },
            )?;
            if left == 0 && failed == 0 {
                // Workers told to checkpoint exit 0 too; a job whose workers
                // finished before any of them was told is simply done.
                match job.sched.preempt_step.filter(|_| job.sched.preempt) {
                    Some(step) => jobs::requeue(tx, &job, step)?,
                    None => jobs::end(tx, &job, JobState::Succeeded, None)?,
                }
            }
            Ok(())
        }
    }
}

/// Running jobs with rank 0 here whose store is not known yet.
fn open_stores(tx: &Transaction<'_>, node: &str) -> ApiResult<Vec<OpenStore>> {
    let mut st = tx.prepare(
        "SELECT j.id, j.store_token, COALESCE(a.attempt, 0)
         FROM jobs j JOIN ranks r ON r.job_id = j.id AND r.rank = 0
         LEFT JOIN job_attempts a ON a.job_id = j.id
         WHERE j.state = 'running' AND j.store_addr IS NULL AND r.node = ?1 ORDER BY j.seq",
    )?;
    let rows = st.query_map(params![node], |r| {
        Ok(OpenStore {
            job_id: r.get(0)?,
            store_token: r.get(1)?,
            attempt: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Running jobs with a rank on this node that is not confirmed yet (see
/// the module doc), whose store is known: one launch each, listing all of
/// the job's ranks on this node.
fn launches(tx: &Transaction<'_>, node: &str, server_url: &str) -> ApiResult<Vec<Launch>> {
    let ids: Vec<String> = {
        let mut st = tx.prepare(
            "SELECT DISTINCT j.id FROM jobs j JOIN ranks r ON r.job_id = j.id
             WHERE j.state = 'running' AND j.store_addr IS NOT NULL AND r.node = ?1
               AND r.launched < 2 AND r.exited = 0
             ORDER BY j.seq",
        )?;
        let rows = st.query_map(params![node], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    let mut out = Vec::new();
    for id in ids {
        let job = jobs::get(tx, &id)?;
        let ranks: Vec<u32> = {
            let mut st =
                tx.prepare("SELECT rank FROM ranks WHERE job_id = ?1 AND node = ?2 ORDER BY rank")?;
            let rows = st.query_map(params![id, node], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
        };
        let first = tx.execute(
            "UPDATE ranks SET launched = 1 WHERE job_id = ?1 AND node = ?2 AND launched = 0",
            params![id, node],
        )?;
        if first > 0 {
            event(
                tx,
                Some(&id),
                Some(node),
                &format!("job {id}: launching ranks {ranks:?} on node {node}"),
            )?;
        }
        let local = ranks.len();
        out.push(launch(&job, ranks, local, server_url));
    }
    Ok(out)
}

fn launch(job: &Job, ranks: Vec<u32>, local: usize, server_url: &str) -> Launch {
    let mut env = job.spec.env.clone();
    let server = JobServerEnv {
        url: server_url.to_owned(),
        job_token: job.job_token.clone(),
        retry: None,
    };
    env.extend(
        job_vars(
            job.workers(),
            local as u32,
            job.store_addr.as_deref().unwrap_or_default(),
            &job.store_token,
            &job.id,
            Some(&server),
        )
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v)),
    );
    env.push((
        var::RESUME_STEP.to_owned(),
        job.sched.resume_step.to_string(),
    ));
    Launch {
        job_id: job.id.clone(),
        attempt: job.sched.attempt,
        ranks,
        world: job.workers(),
        program: job.spec.program.clone(),
        args: job.spec.args.clone(),
        env,
    }
}

/// Ended jobs with a launched rank on this node that has not exited.
fn stops(tx: &Transaction<'_>, node: &str) -> ApiResult<Vec<String>> {
    let mut st = tx.prepare(
        "SELECT DISTINCT j.id FROM jobs j JOIN ranks r ON r.job_id = j.id
         WHERE j.state IN ('failed', 'cancelled', 'succeeded') AND r.node = ?1
           AND r.launched > 0 AND r.exited = 0
         ORDER BY j.seq",
    )?;
    let rows = st.query_map(params![node], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Seconds as people write them: "10 s", "0.5 s".
pub fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Marks `node` lost (if it is up): its running jobs with ranks still alive
/// there fail with a reason naming it, and its slots are released.
pub fn mark_lost(tx: &Transaction<'_>, node: &str, timeout: Duration) -> ApiResult<()> {
    let reason = format!("node {node} lost (no heartbeat for {})", seconds(timeout));
    let changed = tx.execute(
        "UPDATE nodes SET state = 'lost', reason = ?2, updated_at = ?3 WHERE name = ?1 AND state = 'up'",
        params![node, reason, crate::server::db::now()],
    )?;
    if changed == 0 {
        return Ok(());
    }
    event(tx, None, Some(node), &reason)?;
    let ids: Vec<String> = {
        let mut st = tx.prepare(
            "SELECT DISTINCT j.id FROM jobs j JOIN ranks r ON r.job_id = j.id
             WHERE j.state = 'running' AND r.node = ?1 AND r.exited = 0 ORDER BY j.seq",
        )?;
        let rows = st.query_map(params![node], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    for id in ids {
        let job = jobs::get(tx, &id)?;
        jobs::end(tx, &job, JobState::Failed, Some(&reason))?;
    }
    tx.execute(
        "UPDATE ranks SET released = 1 WHERE node = ?1",
        params![node],
    )?;
    Ok(())
}
