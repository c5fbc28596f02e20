//! `gwjob`: the job server, node agent and client in one binary, so a
//! cluster needs one executable; see `gwjob --help`.
//!
//! This file is the process boundary. It parses the whole command line with
//! [`gw_jobserver::cli::command::parse`] before anything starts, prints what
//! is printed (help, completion scripts, a usage error as one plain
//! `gwjob CMD: error: ...` line, a client's reply or its failure), and maps
//! outcomes to exit statuses: 0 success, 1 a failure at run time, 2 usage.
//! The log subscriber is installed only for the long-running `serve` and
//! `agent`, once their command line is known to be good, so that usage
//! errors read as an answer to the person who typed them, not as log lines.

use gw_jobserver::agent::args::TOKEN_ENV;
use gw_jobserver::cli::command::{self, Gwjob};
use std::process::ExitCode;

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let env_token = std::env::var(TOKEN_ENV).ok();
    let what = match command::parse(std::env::args_os().skip(1), env_token) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match what {
        Gwjob::Print(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Gwjob::Completions(shell) => {
            match gw_cli::print_script(&command::completion_script(shell)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gwjob completions: error: cannot write the script: {e}");
                    ExitCode::from(EXIT_FAILED)
                }
            }
        }
        Gwjob::Serve(o) => {
            gw_logging::init_service("gwjob");
            match gw_jobserver::server::main(o) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gwjob serve: error: {e}");
                    ExitCode::from(EXIT_FAILED)
                }
            }
        }
        Gwjob::Agent(o) => {
            gw_logging::init_service("gwjob agent");
            // 0 after SIGINT/SIGTERM, 1 on a fatal error (already logged).
            let code = gw_jobserver::agent::run(o);
            ExitCode::from(u8::try_from(code).unwrap_or(EXIT_FAILED))
        }
        Gwjob::Client(client) => {
            let name = client.name();
            match gw_jobserver::cli::run(client) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gwjob {name}: {e}");
                    ExitCode::from(EXIT_FAILED)
                }
            }
        }
    }
}
