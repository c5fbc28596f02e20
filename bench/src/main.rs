//! `gwbench`: nccl-tests-style collective benchmarks and point-to-point
//! bandwidth/latency, run as one process per rank under `gwrun`.
//!
//! ```text
//! gwrun -n 4 gwbench allreduce -b 8 -e 64M -f 2 -d float -o sum
//! gwrun -n 2 gwbench p2p -b 1 -e 4M
//! ```
//!
//! The logic lives in the modules: [`args`] (the command line, with clap),
//! [`nccl`] (the collective benchmark), [`p2p`], [`check`] (patterns and
//! verification) and [`report`] (table and JSON). Only rank 0 prints results;
//! errors are one line `gwbench: error: ...`.

mod args;
mod calibrate;
mod check;
mod model;
mod nccl;
mod on_device;
mod p2p;
mod pages;
mod perftest;
mod report;

use gw_collectives::{Communicator, Error};
use std::process::ExitCode;
use std::time::Duration;

/// Why a run stopped.
#[derive(Debug)]
pub enum Fail {
    /// A usage mistake found after start-up (root or world size): exit 2.
    Usage(String),
    /// The library failed `what`: exit 1.
    Lib { what: String, err: Error },
    /// Anything else (memory, files): exit 1.
    Other(String),
}

impl Fail {
    pub fn lib(what: &str, err: Error) -> Fail {
        Fail::Lib {
            what: what.into(),
            err,
        }
    }
}

const EXIT_WRONG: u8 = 1;
const EXIT_USAGE: u8 = 2;

/// This process's rank as the launcher set it, before the communicator exists.
fn launch_rank() -> u32 {
    [
        gw_collectives::launch_env::var::RANK,
        "SLURM_PROCID",
        "RANK",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok())
    .and_then(|v| v.trim().parse().ok())
    .unwrap_or(0)
}

/// Prints `msg` as gwbench's one error line. When every rank hits the same
/// error, only rank 0 prints it; the others wait a moment before exiting, so
/// that the launcher does not stop rank 0 before its line is out.
fn die(rank: u32, same_everywhere: bool, code: u8, msg: &str) -> ExitCode {
    if rank == 0 || !same_everywhere {
        eprintln!("gwbench: error: {}", msg.replace('\n', "; "));
    } else {
        std::thread::sleep(Duration::from_millis(300));
    }
    ExitCode::from(code)
}

fn main() -> ExitCode {
    gw_logging::init();
    let rank = launch_rank();
    let cmd = match args::parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(e) => return die(rank, true, EXIT_USAGE, &e.0),
    };
    match cmd {
        // Every rank would print the same text; gwrun would interleave it.
        args::Command::Help(text) => {
            if rank == 0 {
                print!("{text}");
            }
            return ExitCode::SUCCESS;
        }
        args::Command::Completions(shell) => {
            if rank == 0
                && let Err(e) = gw_cli::print_script(&args::completion_script(shell))
            {
                let msg = format!("cannot write the completion script: {e}");
                return die(rank, false, EXIT_WRONG, &msg);
            }
            return ExitCode::SUCCESS;
        }
        args::Command::Calibrate => {
            return match calibrate::run() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => die(rank, false, EXIT_WRONG, &format!("calibrate: {e}")),
            };
        }
        args::Command::Model(o) => {
            return match model::run(&o) {
                Ok(out) => {
                    print!("{out}");
                    ExitCode::SUCCESS
                }
                Err(e) => die(rank, false, EXIT_WRONG, &format!("model: {e}")),
            };
        }
        args::Command::Coll(_) | args::Command::P2p(_) => {}
    }
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            return die(
                rank,
                false,
                EXIT_WRONG,
                &format!("cannot bring up the communicator: {e}"),
            );
        }
    };
    let rank = comm.rank();
    let result = match &cmd {
        args::Command::Coll(o) => nccl::run(&comm, o),
        args::Command::P2p(o) => p2p::run(&comm, o),
        args::Command::Help(_)
        | args::Command::Completions(_)
        | args::Command::Calibrate
        | args::Command::Model(_) => Ok(true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_WRONG),
        Err(Fail::Usage(m)) => die(rank, true, EXIT_USAGE, &m),
        Err(Fail::Lib { what, err }) => {
            // Argument errors are found identically by every rank at submission;
            // anything else (timeouts, dead peers) each rank reports as it saw it.
            let same = matches!(
                err,
                Error::InvalidArgument(_) | Error::InvalidUsage(_) | Error::Config(_)
            );
            die(rank, same, EXIT_WRONG, &format!("{what}: {err}"))
        }
        Err(Fail::Other(m)) => die(rank, false, EXIT_WRONG, &m),
    }
}
