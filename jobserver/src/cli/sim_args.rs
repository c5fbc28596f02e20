//! The command lines of `gwjob simulate` and `gwjob gen-trace`: the
//! scheduler's trace simulator and trace generator (`gw_scheduler`). They
//! need no server; they are [`Client`] commands only in that they run to
//! completion and print, like the others. The files are read when the
//! command runs ([`crate::cli::sim`]), so a bad line exits 1 naming the
//! line and field, while a bad flag exits 2 here.

use crate::cli::args::Client;
use crate::cli::flags::number;
use clap::builder::PossibleValuesParser;
use clap::{Args, ValueHint};
use gw_scheduler::policy::NAMES;
use std::path::PathBuf;

pub const SIMULATE_AFTER_HELP: &str = "\
Replays the trace on the cluster with the chosen policy (the policy code a
live server calls each round, gw_scheduler) and prints average and p99 job completion time,
makespan, queueing delay, utilisation and finish-time fairness. The seed
draws how far each job's real throughput strays from its declared one.
Trace and cluster files: see docs/scheduler.md and jobserver/traces/.";

pub const GEN_TRACE_AFTER_HELP: &str = "\
Jobs arrive as a Poisson process; models, worker counts, durations and
throughputs on v100, p100 and k80 follow Gavel's measured table and
workload (docs/scheduler.md). The same seed gives the same trace.";

/// `gwjob simulate`'s request.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulate {
    pub trace: PathBuf,
    pub cluster: PathBuf,
    pub policy: String,
    pub round_s: f64,
    pub seed: u64,
    pub json: bool,
}

/// `gwjob gen-trace`'s request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenTrace {
    pub jobs: usize,
    pub seed: u64,
    /// Jobs per hour.
    pub rate: f64,
    pub out: Option<PathBuf>,
}

/// `gwjob simulate`'s flags.
#[derive(Args, Clone, Debug)]
pub struct SimulateArgs {
    /// The trace: one `job` line per job
    #[arg(long, value_name = "FILE", allow_hyphen_values = true, value_hint = ValueHint::FilePath)]
    trace: PathBuf,

    /// The cluster: `nodes` lines of device type, count and slots
    #[arg(long, value_name = "FILE", allow_hyphen_values = true, value_hint = ValueHint::FilePath)]
    cluster: PathBuf,

    /// The scheduling policy
    #[arg(long, value_name = "POLICY", value_parser = PossibleValuesParser::new(NAMES))]
    policy: String,

    /// Seconds per scheduling round
    #[arg(long, value_name = "SECS", default_value = "360", value_parser = number::<f64>(),
        allow_hyphen_values = true
    )]
    round: f64,

    /// Seed of the simulation's random draws
    #[arg(long, value_name = "N", default_value = "0", value_parser = number::<u64>(),
        allow_hyphen_values = true
    )]
    seed: u64,

    /// Print one JSON object instead of a table
    #[arg(long)]
    json: bool,
}

impl SimulateArgs {
    pub fn request(self) -> Result<Client, String> {
        if !(self.round.is_finite() && self.round > 0.0) {
            return Err(format!(
                "--round must be a positive number of seconds, not {}",
                self.round
            ));
        }
        Ok(Client::Simulate(Simulate {
            trace: self.trace,
            cluster: self.cluster,
            policy: self.policy,
            round_s: self.round,
            seed: self.seed,
            json: self.json,
        }))
    }
}

/// `gwjob gen-trace`'s flags.
#[derive(Args, Clone, Debug)]
pub struct GenTraceArgs {
    /// Number of jobs
    #[arg(long, value_name = "N", value_parser = number::<usize>(),
        allow_hyphen_values = true
    )]
    jobs: usize,

    /// Seed of the random draws
    #[arg(long, value_name = "S", value_parser = number::<u64>(),
        allow_hyphen_values = true
    )]
    seed: u64,

    /// Mean arrivals per hour
    #[arg(long = "arrival-rate", value_name = "R", default_value = "3", value_parser = number::<f64>(),
        allow_hyphen_values = true
    )]
    arrival_rate: f64,

    /// Write the trace to this file instead of stdout
    #[arg(long, value_name = "FILE", allow_hyphen_values = true, value_hint = ValueHint::FilePath)]
    out: Option<PathBuf>,
}

/// Most jobs one trace may have: far beyond any study, small enough that a
/// typo cannot fill the disk.
const MAX_JOBS: usize = 10_000_000;

impl GenTraceArgs {
    pub fn request(self) -> Result<Client, String> {
        if self.jobs == 0 || self.jobs > MAX_JOBS {
            return Err(format!(
                "--jobs must be between 1 and {MAX_JOBS}, not {}",
                self.jobs
            ));
        }
        if !(self.arrival_rate.is_finite() && self.arrival_rate > 0.0) {
            return Err(format!(
                "--arrival-rate must be a positive number of jobs per hour, not {}",
                self.arrival_rate
            ));
        }
        Ok(Client::GenTrace(GenTrace {
            jobs: self.jobs,
            seed: self.seed,
            rate: self.arrival_rate,
            out: self.out,
        }))
    }
}
