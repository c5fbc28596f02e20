//! `gwrun -n N PROGRAM ARGS...`: the launcher; see `gwrun --help`.
//!
//! The logic lives in [`gw_launch`] so that it can be tested; this file is
//! the process boundary: it turns the command line into a [`Command`],
//! prints what is printed before a job exists (help, version, completion
//! scripts, a usage error as one `gwrun: error: ` line) and exits with the
//! status [`gw_launch::run`] returns.

use gw_launch::args::{self, Command};
use gw_launch::{EXIT_INTERNAL, EXIT_USAGE};

fn main() {
    let code = match args::parse(std::env::args_os().skip(1)) {
        Ok(Command::Help(text)) | Ok(Command::Version(text)) => {
            print!("{text}");
            0
        }
        Ok(Command::Completions(shell)) => {
            match gw_cli::print_script(&args::completion_script(shell)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("gwrun: error: cannot write the completion script: {e}");
                    EXIT_INTERNAL
                }
            }
        }
        Ok(Command::Run(opts)) => {
            // The rendezvous store runs in this process; its warnings
            // (refused clients) are worth seeing.
            gw_logging::init();
            gw_launch::run(opts)
        }
        Err(e) => {
            eprintln!("gwrun: error: {e}");
            EXIT_USAGE
        }
    };
    std::process::exit(code);
}
