//! `gwjob`: the job server, node agent and client in one binary, so a
//! cluster needs one executable. This file only picks the subcommand.

const USAGE: &str = "\
usage: gwjob COMMAND [ARGS...]

commands:
  serve    run the job server (gwjob serve --help)
  agent    run a node's agent (gwjob agent --help)
  submit   submit a job (gwjob submit --help)
  status   show jobs, or one job's ranks and step times
  cancel   cancel a job
";

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprint!("{USAGE}");
        std::process::exit(2);
    }
    let cmd = args.remove(0);
    let code = match cmd.as_str() {
        "serve" => {
            gw_logging::init_service("gwjob");
            gw_jobserver::server::main(args)
        }
        "agent" => {
            gw_logging::init_service("gwjob agent");
            gw_jobserver::agent::main(args)
        }
        "submit" | "status" | "cancel" => gw_jobserver::cli::main(&cmd, args),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            0
        }
        "--version" => {
            println!("gwjob {}", env!("CARGO_PKG_VERSION"));
            0
        }
        other => {
            eprint!("gwjob: unknown command {other:?}\n{USAGE}");
            2
        }
    };
    std::process::exit(code);
}
