//! The trace simulator: the cluster, the jobs and the clock are simulated,
//! the policy is the real one.
//!
//! Time moves in rounds of `round_s`. At each round boundary the jobs that
//! have arrived and not finished are handed to the [`Policy`], exactly as
//! the live server would; its [`Decision`] is checked and then run for the
//! round. A job's copies process samples at their true rates (the declared
//! T[j][k] times a per-job, per-type factor in [0.95, 1.05] drawn from the
//! seed, since profiled throughputs are estimates); a job that finishes
//! mid-round frees its slots only at the next boundary, and a job that
//! arrives mid-round waits for it. Moving a job between rounds costs
//! nothing here (the live server pays a checkpoint); docs/scheduler.md
//! lists the other simplifications. When nothing is present the clock jumps
//! to the round of the next arrival.

use crate::cluster::Cluster;
use crate::lp::fair_share;
use crate::policy::{Decision, JobState, Policy, Round, admissible};
use crate::progress::{Copy, advance, average};
use crate::rate;
use crate::report::{JobOutcome, Report, percentile};
use crate::rng::Rng;
use crate::trace::Trace;
use std::fmt;
use std::time::Instant;

/// How far true throughputs stray from the declared ones.
const NOISE: f64 = 0.05;
/// Rounds in a row in which nothing runs, with jobs waiting and no more to
/// arrive, after which the policy is declared stuck.
const STUCK_ROUNDS: u64 = 10_000;

/// Why a simulation could not run.
#[derive(Clone, Debug, PartialEq)]
pub enum SimError {
    /// A job that could never run on this cluster.
    Refused { job: String, why: String },
    /// The policy broke a rule of [`Decision::check`] or starved every job.
    Policy {
        policy: String,
        at_s: f64,
        why: String,
    },
    /// A round length that is not a positive number of seconds.
    Round(f64),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Refused { job, why } => write!(f, "job {job} is refused: {why}"),
            SimError::Policy { policy, at_s, why } => {
                write!(f, "policy {policy} at t = {at_s} s: {why}")
            }
            SimError::Round(r) => write!(
                f,
                "the round length must be a positive number of seconds, not {r}"
            ),
        }
    }
}

impl std::error::Error for SimError {}

/// A job's simulated state.
struct Sim {
    state: JobState,
    /// True steps/s per type.
    real: Vec<f64>,
    batch: u64,
    needed: u64,
    left: u64,
    processed: u64,
    start: Option<f64>,
    finish: Option<f64>,
    contenders: f64,
    rounds: f64,
}

/// Replays `trace` on `cluster` under `policy`.
pub fn simulate(
    trace: &Trace,
    cluster: &Cluster,
    policy: &mut dyn Policy,
    round_s: f64,
    seed: u64,
) -> Result<Report, SimError> {
    if !(round_s.is_finite() && round_s > 0.0) {
        return Err(SimError::Round(round_s));
    }
    let total = cluster.slots();
    let names = cluster.names();
    let k = total.len();
    let mut rng = Rng::new(seed);
    let mut jobs: Vec<Sim> = Vec::with_capacity(trace.jobs.len());
    for (i, tj) in trace.jobs.iter().enumerate() {
        let tput = tj.tput_for(cluster);
        admissible(&tput, tj.workers, &total, &names).map_err(|why| SimError::Refused {
            job: tj.id.clone(),
            why,
        })?;
        let real = tput
            .iter()
            .map(|t| t * (1.0 + NOISE * (2.0 * rng.unit() - 1.0)))
            .collect();
        let needed = tj.steps.saturating_mul(tj.batch);
        jobs.push(Sim {
            state: JobState {
                id: i as u64,
                workers: tj.workers,
                tput,
                steps: tj.steps,
                remaining_steps: tj.steps as f64,
                arrival_s: tj.arrival_s,
                placed: vec![0; k],
                attained_s: vec![0.0; k],
            },
            real,
            batch: tj.batch,
            needed,
            left: needed,
            processed: 0,
            start: None,
            finish: None,
            contenders: 0.0,
            rounds: 0.0,
        });
    }
    let align = |t: f64| (t / round_s).floor() * round_s;
    let mut now = jobs.first().map_or(0.0, |j| align(j.state.arrival_s));
    let mut next = 0usize;
    let mut active: Vec<usize> = Vec::new();
    let (mut rounds, mut idle, mut busy_slot_s) = (0u64, 0u64, 0.0f64);
    let (mut decide_sum, mut decide_max) = (0.0f64, 0.0f64);
    let mut states: Vec<JobState> = Vec::new();
    while next < jobs.len() || !active.is_empty() {
        while next < jobs.len() && jobs[next].state.arrival_s <= now {
            active.push(next);
            next += 1;
        }
        if active.is_empty() {
            // The first boundary at or after the next arrival.
            now = (jobs[next].state.arrival_s / round_s).ceil() * round_s;
            continue;
        }
        states.clear();
        states.extend(active.iter().map(|i| jobs[*i].state.clone()));
        let round = Round {
            now_s: now,
            round_s,
            total: &total,
            free: &total,
            jobs: &states,
        };
        let clock = Instant::now();
        let decision = policy.decide(&round);
        let ms = clock.elapsed().as_secs_f64() * 1e3;
        decide_sum += ms;
        decide_max = decide_max.max(ms);
        let fail = |why: String| SimError::Policy {
            policy: policy.name().to_owned(),
            at_s: now,
            why,
        };
        decision.check(&round).map_err(fail)?;
        rounds += 1;
        let ran = run_round(
            &mut jobs,
            &active,
            &decision,
            now,
            round_s,
            &mut busy_slot_s,
        );
        idle = if ran { 0 } else { idle + 1 };
        if idle >= STUCK_ROUNDS && next == jobs.len() {
            return Err(fail(format!(
                "nothing ran for {idle} rounds while {} jobs waited",
                active.len()
            )));
        }
        active.retain(|i| jobs[*i].finish.is_none());
        now += round_s;
    }
    Ok(report(
        trace,
        &jobs,
        policy.name(),
        &total,
        busy_slot_s,
        rounds,
        round_s,
        seed,
        (decide_sum / rounds.max(1) as f64, decide_max),
    ))
}

/// Runs one round's decision; true if anything ran.
fn run_round(
    jobs: &mut [Sim],
    active: &[usize],
    d: &Decision,
    now: f64,
    round_s: f64,
    busy: &mut f64,
) -> bool {
    let mut forks: Vec<Vec<(usize, u32)>> = vec![Vec::new(); active.len()];
    for f in &d.forks {
        forks[f.job].push((f.device, f.slots));
    }
    let mut ran = false;
    let present = active.len() as f64;
    for (pos, &i) in active.iter().enumerate() {
        let job = &mut jobs[i];
        let main = &d.run[pos];
        let w = job.state.workers;
        let b = job.batch as f64;
        let mut rates = Vec::with_capacity(1 + forks[pos].len());
        let mut slots = Vec::with_capacity(1 + forks[pos].len());
        if main.iter().any(|n| *n > 0) {
            rates.push(rate::actual(&job.real, w, job.batch, main) * b);
            slots.push(w);
        }
        for (k, s) in &forks[pos] {
            rates.push(job.real[*k] * f64::from(*s) / f64::from(w) * b);
            slots.push(*s);
        }
        job.contenders += present;
        job.rounds += 1.0;
        let step = advance(job.left, &rates, round_s);
        let copies: Vec<Copy> = step
            .samples
            .iter()
            .map(|s| Copy {
                samples: *s,
                params: Vec::new(),
            })
            .collect();
        job.processed += average(&copies).samples;
        job.left -= step.credited;
        job.state.remaining_steps = job.left as f64 / b;
        let span = step.finished_after_s.unwrap_or(round_s);
        *busy += slots.iter().map(|s| f64::from(*s)).sum::<f64>() * span;
        if !rates.is_empty() {
            ran = true;
            job.start.get_or_insert(now);
        }
        for (a, n) in job.state.attained_s.iter_mut().zip(main) {
            *a += span * f64::from(*n) / f64::from(w);
        }
        job.state.placed.clone_from(main);
        if let Some(f) = step.finished_after_s {
            job.finish = Some(now + f);
        }
    }
    ran
}

#[allow(clippy::too_many_arguments)]
fn report(
    trace: &Trace,
    jobs: &[Sim],
    policy: &str,
    total: &[u32],
    busy_slot_s: f64,
    rounds: u64,
    round_s: f64,
    seed: u64,
    decide_ms: (f64, f64),
) -> Report {
    let mut per_job = Vec::with_capacity(jobs.len());
    for (tj, j) in trace.jobs.iter().zip(jobs) {
        let finish = j.finish.unwrap_or(f64::NAN);
        let jct = finish - tj.arrival_s;
        let share = fair_share(
            &j.state.tput,
            j.state.workers,
            total,
            j.contenders / j.rounds.max(1.0),
        );
        let alone = if share > 0.0 {
            tj.steps as f64 / share
        } else {
            f64::INFINITY
        };
        per_job.push(JobOutcome {
            id: tj.id.clone(),
            arrival_s: tj.arrival_s,
            start_s: j.start.unwrap_or(f64::NAN),
            finish_s: finish,
            samples_needed: j.needed,
            samples_credited: j.needed - j.left,
            samples_processed: j.processed,
            ftf: jct / alone,
        });
    }
    let jct: Vec<f64> = per_job.iter().map(|o| o.finish_s - o.arrival_s).collect();
    let n = per_job.len().max(1) as f64;
    let first = per_job
        .iter()
        .map(|o| o.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let last = per_job
        .iter()
        .map(|o| o.finish_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let makespan = (last - first).max(0.0);
    let slots: f64 = total.iter().map(|c| f64::from(*c)).sum();
    Report {
        policy: policy.to_owned(),
        jobs: per_job.len(),
        avg_jct_s: jct.iter().sum::<f64>() / n,
        p99_jct_s: percentile(&jct, 99.0),
        makespan_s: makespan,
        avg_queue_s: per_job.iter().map(|o| o.start_s - o.arrival_s).sum::<f64>() / n,
        utilization: if makespan > 0.0 {
            busy_slot_s / (slots * makespan)
        } else {
            0.0
        },
        ftf: per_job.iter().map(|o| o.ftf).sum::<f64>() / n,
        ftf_max: per_job.iter().map(|o| o.ftf).fold(0.0, f64::max),
        rounds,
        round_s,
        seed,
        decide_ms,
        per_job,
    }
}
