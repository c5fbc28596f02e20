//! The per-job rows the step protocol and the status both read: stored
//! plans (one per step, returned identically on every ask) and ranks
//! (placement, exit, timing fit).

use crate::server::db::to_json;
use crate::server::error::{ApiResult, corrupt};
use crate::server::plan::{Plan, PlanKind};
use gw_planner::{Linear, RankFit};
use rusqlite::{OptionalExtension, Transaction, params};

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
                fit: serde_json::from_str(&fit)
                    .map_err(|e| corrupt(&format!("rank fit of job {id} rank {rank}"), e))?,
                last_compute_s: last,
                exit: match (exited, code, signal) {
                    (false, _, _) => None,
                    (true, Some(c), _) => Some(c),
                    (true, None, Some(s)) => Some(-s),
                    // Ended without a known status (its agent restarted).
                    (true, None, None) => None,
                },
            })
        })
        .collect()
}
