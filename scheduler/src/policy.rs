//! The one interface every policy implements: a round's decision.
//!
//! At each round boundary the caller (the simulator, or the live server)
//! hands a [`Policy`] the inventory — slots per device type, total and
//! free — and the jobs waiting or running, each with its throughput per
//! type T[j][k], workers, remaining steps and what it ran on so far. The
//! policy answers with a [`Decision`]: how many of each type every job's
//! main copy runs on this round (all of its workers or none: jobs are
//! gang-scheduled), and, for HadarE, extra copies ([`Fork`]s). A policy
//! keeps whatever state it likes between rounds, but everything it needs to
//! be correct arrives in the [`Round`], so a restarted server can resume.

use crate::{fifo, gavel, hadar, hadare};

/// A count per device type, in the cluster's type order.
pub type Slots = Vec<u32>;

/// A job as the policy sees it at a round boundary.
#[derive(Clone, Debug, PartialEq)]
pub struct JobState {
    /// Unique among the round's jobs; stable across rounds.
    pub id: u64,
    pub workers: u32,
    /// T[j][k]: steps/s with all `workers` on type k; 0 where it cannot run.
    pub tput: Vec<f64>,
    pub steps: u64,
    pub remaining_steps: f64,
    pub arrival_s: f64,
    /// The main copy's allocation in the round just ended (zeros if none).
    pub placed: Slots,
    /// Seconds run so far on each type; a round on a mix of types counts
    /// its share of workers on each.
    pub attained_s: Vec<f64>,
}

/// Everything one round's decision depends on.
#[derive(Clone, Copy, Debug)]
pub struct Round<'a> {
    pub now_s: f64,
    pub round_s: f64,
    pub total: &'a [u32],
    /// Slots the policy may hand out this round (≤ total).
    pub free: &'a [u32],
    pub jobs: &'a [JobState],
}

/// A copy of job `job` (an index into the round's jobs) on `slots` slots
/// of type `device`, training on its own data shard (HadarE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fork {
    pub job: usize,
    pub device: usize,
    pub slots: u32,
}

/// One round's answer.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Decision {
    /// Per job (same order as the round's jobs): the main copy's slots of
    /// each type; all zero, or summing to the job's workers.
    pub run: Vec<Slots>,
    pub forks: Vec<Fork>,
}

/// A round's decision, and what a policy may keep between rounds.
pub trait Policy {
    fn name(&self) -> &'static str;
    fn decide(&mut self, round: &Round<'_>) -> Decision;
}

/// The policies [`by_name`] knows.
pub const NAMES: [&str; 5] = ["fifo", "gavel", "gavel-makespan", "hadar", "hadare"];

/// A fresh policy by name, or an error listing the valid names.
pub fn by_name(name: &str) -> Result<Box<dyn Policy + Send>, String> {
    Ok(match name {
        "fifo" => Box::new(fifo::Fifo),
        "gavel" => Box::new(gavel::Gavel::new(gavel::Objective::MaxMinFairness)),
        "gavel-makespan" => Box::new(gavel::Gavel::new(gavel::Objective::MinTotalDuration)),
        "hadar" => Box::new(hadar::Hadar),
        "hadare" => Box::new(hadare::HadarE),
        _ => {
            return Err(format!(
                "unknown policy {name:?}; the policies are {}",
                NAMES.join(", ")
            ));
        }
    })
}

/// Ok if a job of `workers` with throughputs `tput` could ever run on a
/// cluster with `total` slots of the types `names`; else why not, for the
/// person who submitted it.
pub fn admissible(tput: &[f64], workers: u32, total: &[u32], names: &[&str]) -> Result<(), String> {
    if tput.iter().all(|t| *t <= 0.0) {
        return Err(format!(
            "its throughput is 0 on every device type the cluster has ({}), so it could never run",
            names.join(", ")
        ));
    }
    let usable = usable(tput, total);
    if u64::from(workers) > usable {
        return Err(format!(
            "it needs {workers} workers but the cluster has only {usable} slots of the types it runs on"
        ));
    }
    Ok(())
}

/// Slots among `slots` on the types where `value` (a throughput, a
/// utility) is positive.
pub fn usable(value: &[f64], slots: &[u32]) -> u64 {
    value
        .iter()
        .zip(slots)
        .filter(|(v, _)| **v > 0.0)
        .map(|(_, n)| u64::from(*n))
        .sum()
}

impl Decision {
    /// Nothing runs.
    pub fn idle(round: &Round<'_>) -> Decision {
        Decision {
            run: vec![vec![0; round.total.len()]; round.jobs.len()],
            forks: Vec::new(),
        }
    }

    /// Slots of each type this decision uses, main copies and forks.
    pub fn used(&self, types: usize) -> Slots {
        let mut used = vec![0u32; types];
        for a in &self.run {
            for (u, n) in used.iter_mut().zip(a) {
                *u = u.saturating_add(*n);
            }
        }
        for f in &self.forks {
            if let Some(u) = used.get_mut(f.device) {
                *u = u.saturating_add(f.slots);
            }
        }
        used
    }

    /// Ok if the decision keeps every rule the simulator and server rely
    /// on: within the free slots of each type, whole gangs, no slot on a type
    /// where the job cannot run, copies no larger than the job.
    pub fn check(&self, round: &Round<'_>) -> Result<(), String> {
        let k = round.free.len();
        if self.run.len() != round.jobs.len() {
            return Err(format!(
                "{} allocations for {} jobs",
                self.run.len(),
                round.jobs.len()
            ));
        }
        for (a, j) in self.run.iter().zip(round.jobs) {
            if a.len() != k {
                return Err(format!(
                    "job {}: {} types in its allocation, not {k}",
                    j.id,
                    a.len()
                ));
            }
            let sum: u64 = a.iter().map(|n| u64::from(*n)).sum();
            if sum != 0 && sum != u64::from(j.workers) {
                return Err(format!(
                    "job {}: {sum} slots for {} workers",
                    j.id, j.workers
                ));
            }
            if let Some(d) = (0..k).find(|d| a[*d] > 0 && j.tput[*d] <= 0.0) {
                return Err(format!(
                    "job {}: placed on type {d} where it cannot run",
                    j.id
                ));
            }
        }
        for f in &self.forks {
            let Some(j) = round.jobs.get(f.job) else {
                return Err(format!(
                    "a fork of job index {} which does not exist",
                    f.job
                ));
            };
            if f.device >= k || f.slots == 0 || f.slots > j.workers || j.tput[f.device] <= 0.0 {
                return Err(format!(
                    "job {}: bad fork of {} slots on type {}",
                    j.id, f.slots, f.device
                ));
            }
        }
        let used = self.used(k);
        for (d, (u, free)) in used.iter().zip(round.free).enumerate() {
            if u > free {
                return Err(format!("type {d}: {u} slots allocated, {free} free"));
            }
        }
        Ok(())
    }
}
