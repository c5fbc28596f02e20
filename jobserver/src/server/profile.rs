//! Profiling runs: a job submitted to a server with a scheduling policy but
//! without its speed per device type (`throughput`, the policy's T[j][k])
//! is measured before the policy schedules it, as Gavel and Hadar assume.
//!
//! The job runs on each device type that can hold all its workers, one type
//! per placement: after the placement's first step (connection set-up and
//! warm-up, not counted) and `--profile-steps` more, its steps/s on that
//! type is 1 / the median of those steps' measured times (the slowest
//! rank's), and it is preempted through a checkpoint and placed on the next
//! type. Nothing is lost: profiling steps are the job's own steps, and each
//! move is the ordinary checkpoint-and-resume. After the last type the job
//! keeps running where it is, and from the next round the policy schedules
//! it with the measured figures. While it is profiled the policy does not
//! see it, and the slots it holds or waits for are taken out of what the
//! policy may hand out, so other jobs make room for it.

use crate::server::db::event;
use crate::server::error::ApiResult;
use crate::server::jobs::{self, Job};
use gw_jobapi::types::DeviceThroughput;
use rusqlite::{OptionalExtension, Transaction, params};

/// Steps measured per device type unless `--profile-steps` says otherwise.
pub const DEFAULT_STEPS: u64 = 5;

/// The server's profiling steps per type (0: no profiling, as without a
/// policy), recorded at start so that request handlers see it.
pub fn steps(tx: &Transaction<'_>) -> ApiResult<u64> {
    let v: Option<String> = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'profile_steps'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
}

pub fn set_steps(tx: &Transaction<'_>, n: u64) -> ApiResult<()> {
    tx.execute(
        "INSERT INTO meta(key, value) VALUES ('profile_steps', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![n.to_string()],
    )?;
    Ok(())
}

/// What was measured for the job, by device type name.
pub fn measured(tx: &Transaction<'_>, id: &str) -> ApiResult<Vec<DeviceThroughput>> {
    let mut st = tx.prepare(
        "SELECT device_type, steps_per_s FROM job_profile WHERE job_id = ?1
         ORDER BY device_type",
    )?;
    let rows = st.query_map(params![id], |r| {
        Ok(DeviceThroughput {
            device_type: r.get(0)?,
            steps_per_s: r.get(1)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The job's speed per type for the policy: as submitted, else as
/// measured; empty means "the same on every type" (nothing to go by).
pub fn throughput(tx: &Transaction<'_>, job: &Job) -> ApiResult<Vec<DeviceThroughput>> {
    if !job.spec.throughput.is_empty() {
        return Ok(job.spec.throughput.clone());
    }
    measured(tx, &job.id)
}

/// The device types the job still has to be profiled on, in `types`' order:
/// those with room for all its workers (`total` slots up) not measured yet.
/// Empty when profiling is off (`n` = 0) or the job gave its throughput.
pub fn todo(
    tx: &Transaction<'_>,
    job: &Job,
    types: &[String],
    total: &[u32],
    n: u64,
) -> ApiResult<Vec<String>> {
    if n == 0 || !job.spec.throughput.is_empty() {
        return Ok(Vec::new());
    }
    let done = measured(tx, &job.id)?;
    Ok(types
        .iter()
        .zip(total)
        .filter(|(t, n)| **n >= job.workers() && !done.iter().any(|d| &d.device_type == *t))
        .map(|(t, _)| t.clone())
        .collect())
}

/// The median of `v` (not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Called when every rank has reported `step`: if that completes the
/// profile of the type the job runs on, records it and sends the job on to
/// the next type to profile.
pub fn on_step_complete(tx: &Transaction<'_>, job: &Job, step: u64) -> ApiResult<()> {
    let n = steps(tx)?;
    if n == 0 || !job.spec.throughput.is_empty() || job.sched.preempt {
        return Ok(());
    }
    let first = job.sched.resume_step.saturating_add(1);
    let last = job.sched.resume_step.saturating_add(n);
    if step < last {
        return Ok(());
    }
    let (types, total) = inventory(tx)?;
    let on = placed_types(tx, &job.id)?;
    let [here] = on.as_slice() else {
        return Ok(()); // not placed on one type: not a profiling placement
    };
    if !todo(tx, job, &types, &total, n)?.contains(here) {
        return Ok(());
    }
    let mut times: Vec<f64> = {
        let mut st = tx.prepare(
            "SELECT measured_step_s FROM steps WHERE job_id = ?1 AND step BETWEEN ?2 AND ?3",
        )?;
        let rows = st.query_map(params![job.id, first, last], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<Vec<f64>>>()?
    };
    if (times.len() as u64) < n {
        return Ok(()); // a step of the window is still open
    }
    let speed = 1.0 / median(&mut times).max(1e-9);
    tx.execute(
        "INSERT INTO job_profile(job_id, device_type, steps_per_s) VALUES (?1, ?2, ?3)
         ON CONFLICT(job_id, device_type) DO NOTHING",
        params![job.id, here, speed],
    )?;
    event(
        tx,
        Some(&job.id),
        None,
        &format!(
            "job {}: profiled on {here}: {speed:.3} steps/s (median of steps {first}..={last})",
            job.id
        ),
    )?;
    let left = todo(tx, job, &types, &total, n)?;
    let Some(next) = left.first() else {
        return Ok(()); // profiled everywhere: the policy takes over
    };
    jobs::set_want(tx, &job.id, Some(&[(next.clone(), job.workers())]))?;
    jobs::set_preempt(tx, &job.id, true)?;
    event(
        tx,
        Some(&job.id),
        None,
        &format!("job {} preempted: to be profiled on {next} next", job.id),
    )
}

/// Device types of the up nodes (sorted by name) and their slots.
pub fn inventory(tx: &Transaction<'_>) -> ApiResult<(Vec<String>, Vec<u32>)> {
    let mut st = tx.prepare(
        "SELECT device_type, SUM(slots) FROM nodes WHERE state = 'up'
         GROUP BY device_type ORDER BY device_type",
    )?;
    let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    let mut types = Vec::new();
    let mut total = Vec::new();
    for row in rows {
        let (t, n) = row?;
        types.push(t);
        total.push(u32::try_from(n).unwrap_or(u32::MAX));
    }
    Ok((types, total))
}

/// The device types the job's live ranks are on.
fn placed_types(tx: &Transaction<'_>, id: &str) -> ApiResult<Vec<String>> {
    let mut st = tx.prepare(
        "SELECT DISTINCT n.device_type FROM ranks r JOIN nodes n ON n.name = r.node
         WHERE r.job_id = ?1 AND r.released = 0 ORDER BY n.device_type",
    )?;
    let rows = st.query_map(params![id], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<Vec<String>>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [0.5]), 0.5);
    }
}
