//! The live server's cluster scheduler: at every round boundary the chosen
//! `gw_scheduler` policy (`gwjob serve --policy`) sees the inventory and the
//! jobs, as the simulator shows them to it, and its decision is carried out
//! through the database:
//!
//! * a pending job the policy runs gets `want` (slots per device type) and
//!   is placed on nodes of those types as soon as they are free;
//! * a running job whose allocation changes, or that the policy stops, is
//!   preempted: at the next step nobody has a plan for, its workers are
//!   told to checkpoint and exit (`steps.rs`), and once they all have, it
//!   waits as pending for its next placement, which resumes from that step
//!   (`jobs::requeue`). Nothing is lost or repeated: plans are per step, so
//!   every rank stops at the same one, and a resumed placement may not ask
//!   for an earlier step.
//!
//! The policy is the very code the simulator calls (`gwjob simulate`). Each
//! job's attained service is in SQLite (`job_service`) with everything
//! correctness needs (placements, checkpoints, resume steps), so a restart
//! keeps fairness; only what a policy caches between rounds (Gavel's last
//! LP) lives in memory and restarts empty.
//! HadarE's forks are not run live: its policy is refused at start. A job
//! submitted without its speed per device type is profiled first
//! (`profile.rs`), out of the policy's sight.

use crate::server::db::{event, now};
use crate::server::error::{ApiError, ApiResult};
use crate::server::jobs::{self, Job};
use crate::server::profile::{self, inventory};
use gw_jobapi::types::{DeviceService, DeviceThroughput, JobState};
use gw_scheduler::policy::{self, JobState as PolicyJob, Policy, Round};
use rusqlite::{OptionalExtension, Transaction, params};

/// The policy the server runs, as recorded in the database at start (so
/// that request handlers know jobs wait for a round); None without one.
pub fn policy_name(tx: &Transaction<'_>) -> ApiResult<Option<String>> {
    Ok(tx
        .query_row("SELECT value FROM meta WHERE key = 'policy'", [], |r| {
            r.get(0)
        })
        .optional()?)
}

pub fn set_policy_name(tx: &Transaction<'_>, name: Option<&str>) -> ApiResult<()> {
    match name {
        Some(n) => tx.execute(
            "INSERT INTO meta(key, value) VALUES ('policy', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![n],
        )?,
        None => tx.execute("DELETE FROM meta WHERE key = 'policy'", [])?,
    };
    Ok(())
}

/// A policy the live server can run, or why not.
pub fn live_policy(name: &str) -> Result<Box<dyn Policy + Send>, String> {
    if name == "hadare" {
        return Err(
            "--policy hadare: the live server does not run HadarE's forked copies; \
             use hadar (gwjob simulate runs hadare)"
                .into(),
        );
    }
    policy::by_name(name).map_err(|e| format!("--policy: {e}"))
}

/// The policy and what the server remembers between rounds.
pub struct Rounds {
    policy: Box<dyn Policy + Send>,
    round_s: f64,
    /// Unix time the server started: the policy's clock starts there.
    start: f64,
    round: u64,
}

/// A job as this round sees it.
struct Seen {
    job: Job,
    /// Slots per device type its workers hold now (in the round's type order).
    placed: Vec<u32>,
    /// Its speed per type: submitted or profiled (empty: the same on all).
    tput: Vec<DeviceThroughput>,
}

impl Rounds {
    pub fn new(policy: Box<dyn Policy + Send>, round_s: f64) -> Rounds {
        Rounds {
            policy,
            round_s,
            start: now(),
            round: 0,
        }
    }

    /// One round boundary: decide, then preempt and place accordingly.
    pub fn run(&mut self, tx: &Transaction<'_>) -> ApiResult<()> {
        self.round += 1;
        let (types, total) = inventory(tx)?;
        if types.is_empty() {
            return Ok(());
        }
        let profile_steps = profile::steps(tx)?;
        // Jobs being profiled hold (or wait for) their slots outside the
        // policy: what it may hand out is what they leave.
        let mut avail = total.clone();
        let mut seen = Vec::new();
        let mut order = Vec::new();
        for state in [JobState::Running, JobState::Pending] {
            for job in jobs::with_state(tx, state)? {
                let placed = placed(tx, &job.id, &types)?;
                let todo = profile::todo(tx, &job, &types, &total, profile_steps)?;
                if !todo.is_empty() {
                    self.profile(tx, &job, &placed, &todo, &types, &mut avail)?;
                    continue;
                }
                let tput = profile::throughput(tx, &job)?;
                order.push(seq_and_arrival(tx, &job.id)?);
                seen.push(Seen { job, placed, tput });
            }
        }
        if seen.is_empty() {
            return Ok(());
        }
        // Arrival order, as the simulator presents jobs.
        let mut both: Vec<(Seen, (i64, f64))> = seen.into_iter().zip(order).collect();
        both.sort_by_key(|(_, (seq, _))| *seq);
        let (seen, order): (Vec<Seen>, Vec<(i64, f64)>) = both.into_iter().unzip();
        self.account(tx, &seen, &types)?;
        let mut policy_jobs = Vec::with_capacity(seen.len());
        for (s, (seq, arrival)) in seen.iter().zip(&order) {
            let had = service(tx, &s.job.id)?;
            let attained: Vec<f64> = types
                .iter()
                .map(|t| {
                    had.iter()
                        .find(|d| &d.device_type == t)
                        .map_or(0.0, |d| d.seconds)
                })
                .collect();
            policy_jobs.push(self.policy_job(s, *seq, *arrival, &types, attained));
        }
        let now_s = now() - self.start;
        let round = Round {
            now_s,
            round_s: self.round_s,
            total: &avail,
            free: &avail,
            jobs: &policy_jobs,
        };
        let decision = self.policy.decide(&round);
        if let Err(e) = decision.check(&round) {
            tracing::error!(
                "round {}: the {} policy's decision is invalid ({e}); nothing changes",
                self.round,
                self.policy.name()
            );
            return Ok(());
        }
        for (s, alloc) in seen.iter().zip(&decision.run) {
            self.apply(tx, s, alloc, &types)?;
        }
        jobs::place_pending(tx)
    }

    /// A job still to be profiled: a pending one waits for the next type
    /// on its list, a running one not on such a type (a type that came up
    /// after it was profiled) is sent there; either way its slots are kept
    /// from the policy.
    fn profile(
        &self,
        tx: &Transaction<'_>,
        job: &Job,
        placed: &[u32],
        todo: &[String],
        types: &[String],
        avail: &mut [u32],
    ) -> ApiResult<()> {
        let want = vec![(todo[0].clone(), job.workers())];
        let hold: Vec<u32> = match job.state {
            JobState::Running => {
                let on: Vec<&String> = types
                    .iter()
                    .zip(placed)
                    .filter(|(_, n)| **n > 0)
                    .map(|(t, _)| t)
                    .collect();
                let profiling_here = matches!(on.as_slice(), [t] if todo.contains(t));
                if !profiling_here && !job.sched.preempt {
                    jobs::set_want(tx, &job.id, Some(&want))?;
                    jobs::set_preempt(tx, &job.id, true)?;
                    event(
                        tx,
                        Some(&job.id),
                        None,
                        &format!(
                            "round {}: job {} preempted: to be profiled on {}",
                            self.round,
                            job.id,
                            describe(Some(&want))
                        ),
                    )?;
                }
                placed.to_vec()
            }
            _ => {
                if job.sched.want.as_ref() != Some(&want) {
                    jobs::set_want(tx, &job.id, Some(&want))?;
                    event(
                        tx,
                        Some(&job.id),
                        None,
                        &format!(
                            "round {}: job {} to be profiled on {} (not yet measured on {})",
                            self.round,
                            job.id,
                            describe(Some(&want)),
                            todo.join(", ")
                        ),
                    )?;
                }
                types
                    .iter()
                    .map(|t| if *t == todo[0] { job.workers() } else { 0 })
                    .collect()
            }
        };
        for (a, h) in avail.iter_mut().zip(hold) {
            *a = a.saturating_sub(h);
        }
        Ok(())
    }

    /// Adds the round just ended to each running job's attained service.
    fn account(&self, tx: &Transaction<'_>, seen: &[Seen], types: &[String]) -> ApiResult<()> {
        for s in seen.iter().filter(|s| s.job.state == JobState::Running) {
            let workers = f64::from(s.job.workers().max(1));
            for (t, n) in types.iter().zip(&s.placed) {
                if *n > 0 {
                    tx.execute(
                        "INSERT INTO job_service(job_id, device_type, seconds) VALUES (?1, ?2, ?3)
                         ON CONFLICT(job_id, device_type)
                         DO UPDATE SET seconds = seconds + excluded.seconds",
                        params![s.job.id, t, self.round_s * f64::from(*n) / workers],
                    )?;
                }
            }
        }
        Ok(())
    }

    fn policy_job(
        &self,
        s: &Seen,
        seq: i64,
        arrival: f64,
        types: &[String],
        attained_s: Vec<f64>,
    ) -> PolicyJob {
        let spec = &s.job.spec;
        let tput: Vec<f64> = types
            .iter()
            .map(|t| {
                if s.tput.is_empty() {
                    1.0
                } else {
                    s.tput
                        .iter()
                        .find(|x| &x.device_type == t)
                        .map_or(0.0, |x| x.steps_per_s)
                }
            })
            .collect();
        let done = s.job.completed_step.map_or(0, |c| c.saturating_add(1));
        // A job submitted without --steps before the policy was enabled
        // counts as about to finish.
        let steps = spec.steps.unwrap_or(done.saturating_add(1));
        PolicyJob {
            id: u64::try_from(seq).unwrap_or(0),
            workers: s.job.workers(),
            tput,
            steps,
            remaining_steps: (steps.saturating_sub(done) as f64).max(0.5),
            arrival_s: arrival - self.start,
            placed: s.placed.clone(),
            attained_s,
        }
    }

    /// Carries out the decision for one job.
    fn apply(
        &self,
        tx: &Transaction<'_>,
        s: &Seen,
        alloc: &[u32],
        types: &[String],
    ) -> ApiResult<()> {
        let id = &s.job.id;
        let want: Vec<(String, u32)> = types
            .iter()
            .zip(alloc)
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        let want = (!want.is_empty()).then_some(want);
        let head = format!("round {} ({} policy)", self.round, self.policy.name());
        match s.job.state {
            JobState::Running if alloc == s.placed.as_slice() => {
                if s.job.sched.preempt && s.job.sched.preempt_step.is_none() {
                    // Not yet told to any worker: keep running where it is.
                    jobs::set_preempt(tx, id, false)?;
                    event(
                        tx,
                        Some(id),
                        None,
                        &format!("{head}: job {id} keeps its nodes; preemption withdrawn"),
                    )?;
                }
                jobs::set_want(tx, id, None)
            }
            JobState::Running => {
                if !s.job.sched.preempt {
                    jobs::set_preempt(tx, id, true)?;
                    event(
                        tx,
                        Some(id),
                        None,
                        &format!(
                            "{head}: job {id} preempted: it runs on {}, the policy gives it {}",
                            describe(Some(&pairs(types, &s.placed))),
                            describe(want.as_deref())
                        ),
                    )?;
                }
                jobs::set_want(tx, id, want.as_deref())
            }
            JobState::Pending => {
                if want.is_some() && want != s.job.sched.want {
                    event(
                        tx,
                        Some(id),
                        None,
                        &format!("{head}: job {id} to run on {}", describe(want.as_deref())),
                    )?;
                }
                jobs::set_want(tx, id, want.as_deref())
            }
            _ => Ok(()),
        }
    }
}

/// The job's attained service per device type, by type name.
pub fn service(tx: &Transaction<'_>, id: &str) -> ApiResult<Vec<DeviceService>> {
    let mut st = tx.prepare(
        "SELECT device_type, seconds FROM job_service WHERE job_id = ?1 ORDER BY device_type",
    )?;
    let rows = st.query_map(params![id], |r| {
        Ok(DeviceService {
            device_type: r.get(0)?,
            seconds: r.get(1)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

fn pairs(types: &[String], n: &[u32]) -> Vec<(String, u32)> {
    types
        .iter()
        .zip(n)
        .filter(|(_, n)| **n > 0)
        .map(|(t, n)| (t.clone(), *n))
        .collect()
}

/// "2 x v100 + 1 x k80", or "nothing".
fn describe(want: Option<&[(String, u32)]>) -> String {
    match want {
        Some(w) if !w.is_empty() => w
            .iter()
            .map(|(t, n)| format!("{n} x {t}"))
            .collect::<Vec<_>>()
            .join(" + "),
        _ => "nothing".into(),
    }
}

/// Slots of each type the job's live ranks hold.
fn placed(tx: &Transaction<'_>, id: &str, types: &[String]) -> ApiResult<Vec<u32>> {
    let mut st = tx.prepare(
        "SELECT n.device_type, COUNT(*) FROM ranks r JOIN nodes n ON n.name = r.node
         WHERE r.job_id = ?1 AND r.released = 0 GROUP BY n.device_type",
    )?;
    let rows = st.query_map(params![id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
    })?;
    let mut out = vec![0u32; types.len()];
    for row in rows {
        let (t, n) = row?;
        if let Some(i) = types.iter().position(|x| *x == t) {
            out[i] = u32::try_from(n).unwrap_or(u32::MAX);
        }
    }
    Ok(out)
}

fn seq_and_arrival(tx: &Transaction<'_>, id: &str) -> ApiResult<(i64, f64)> {
    tx.query_row(
        "SELECT seq, submitted_at FROM jobs WHERE id = ?1",
        params![id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()?
    .ok_or_else(|| ApiError::internal(format!("job {id} vanished during a round")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_says_what_runs_where() {
        let w = vec![("k80".to_owned(), 1), ("v100".to_owned(), 2)];
        assert_eq!(describe(Some(&w)), "1 x k80 + 2 x v100");
        assert_eq!(describe(None), "nothing");
        assert_eq!(describe(Some(&[])), "nothing");
    }

    #[test]
    fn hadare_is_refused_live_and_unknown_names_list_the_policies() {
        let e = live_policy("hadare").err().unwrap_or_default();
        assert!(e.contains("does not run HadarE's forked copies"), "{e}");
        let e = live_policy("lottery").err().unwrap_or_default();
        assert!(
            e.contains("fifo, gavel, gavel-makespan, hadar, hadare"),
            "{e}"
        );
        for ok in ["fifo", "gavel", "gavel-makespan", "hadar"] {
            assert!(live_policy(ok).is_ok(), "{ok}");
        }
    }
}
