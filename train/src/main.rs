//! gwtrain: trains an MLP data-parallel, one rank per process (under `gwrun`
//! or a `gwjob` agent), and `gwtrain report` summarises finished runs.
//!
//! This file is the command line and the process boundary: clap derives the
//! parser from [`Cli`], [`parse`] adds the checks clap cannot express and
//! words every mistake as one line, and [`main`] prints and picks the exit
//! status. The training itself is [`gw_train::worker`].

use clap::error::{ContextKind, ErrorKind};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use gw_cli::{Number, Shell, context_str, flag_of, parser_message};
use gw_collectives::launch_env::var;
use gw_train::report;
use gw_train::worker::{self, Stop, TrainConfig};
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

/// clap would write `[OPTIONS] [COMMAND]`; this says which is which.
const USAGE: &str = "\
gwtrain [--steps N] [--lr X] [--seed S] [--dims 32,128,128,10]
               [--global-batch B] [--slow-rank R] [--slowdown K] [--out DIR]
               [--print-every N] [--checkpoint DIR]
       gwtrain report [--warmup W] [--slowdown K] [--check] NAME=DIR [NAME=DIR...]
       gwtrain completions SHELL";

const ABOUT: &str = "\
Trains an MLP on a synthetic classification stream, one rank per process.
Plans come from the job server when GW_JOB_SERVER is set, else from the even
split of --global-batch. Rank R = --slow-rank repeats its forward/backward
K = --slowdown times per sample. With --out, every rank writes
DIR/steps-rank<R>.log and rank 0 DIR/steps.jsonl and DIR/params.bin.
When a job server's scheduling policy preempts the job, rank 0 saves the
parameters and the data position in --checkpoint DIR/checkpoint.bin and every
rank exits 0; started again with GW_RESUME_STEP=S, gwtrain resumes at step S
from that file and appends to the --out logs.";

/// What `report` does, on both its own help and gwtrain's.
const REPORT_ABOUT: &str = "\
`report` prints mean step times after W warm-up steps (default 5), predicted
beside measured step times, the local batches chosen, and the largest relative
difference of the runs' final parameters. From the first run's per-rank
compute speeds it prints how much slower the slowest rank computed (beside
--slowdown K, what the runs asked for) and the optimum step: the global batch
split in proportion to those speeds, plus the rest of the step no split
removes. Its last line is the ratio of the last run's mean step time to the
first's. --check also checks the demo's criteria (the last run's mean step
time within 10% of that optimum and within 15% of the predicted, parameters
equal within 1e-5 relative) and exits 1 if one is not met.";

const EXIT_STATUS: &str = "\
Exit status: 0 success, or preempted with the checkpoint saved; 1 training
failed, or report --check found a criterion not met; 2 usage error, or report
could not read a run; 3 the job server stopped the job.";

/// gwtrain's command line, as clap sees it.
#[derive(Debug, Parser)]
#[command(
    name = "gwtrain",
    about = ABOUT,
    // The doc comments here are for readers of the code, not for --help.
    long_about = None,
    override_usage = USAGE,
    after_help = format!("{REPORT_ABOUT}\n\n{EXIT_STATUS}"),
    // A training flag before `report` is a mistake, not an option of it.
    args_conflicts_with_subcommands = true,
    // The old parser let a repeated flag's last value win.
    args_override_self = true,
    // "help" is not a command of gwtrain; -h and --help are the ways to ask.
    disable_help_subcommand = true
)]
struct Cli {
    #[command(flatten)]
    train: TrainArgs,

    #[command(subcommand)]
    sub: Option<Sub>,
}

/// The training flags; defaults are [`TrainConfig::default`]'s. Values may
/// start with '-' (`--lr -0.1`), as the old parser took the next word
/// whatever it was.
#[derive(Debug, Args)]
struct TrainArgs {
    /// Training steps
    #[arg(long, value_name = "N", default_value_t = TrainConfig::default().steps,
          value_parser = number::<u64>(), allow_hyphen_values = true)]
    steps: u64,

    /// Learning rate (finite)
    #[arg(long, value_name = "X", default_value_t = TrainConfig::default().lr,
          value_parser = number::<f64>(), allow_hyphen_values = true)]
    lr: f64,

    /// Seed of the data stream and of the initial parameters
    #[arg(long, value_name = "S", default_value_t = TrainConfig::default().seed,
          value_parser = number::<u64>(), allow_hyphen_values = true)]
    seed: u64,

    /// Layer widths, input to output, separated by commas
    #[arg(long, value_name = "LIST", default_value_t = Dims(TrainConfig::default().dims),
          value_parser = parse_dims, allow_hyphen_values = true)]
    dims: Dims,

    /// Global batch when there is no job server (at least 1; the server's
    /// plan wins otherwise)
    #[arg(long = "global-batch", value_name = "B",
          default_value_t = TrainConfig::default().global_batch,
          value_parser = number::<u64>(), allow_hyphen_values = true)]
    global_batch: u64,

    /// The rank made slow
    #[arg(long = "slow-rank", value_name = "R", value_parser = number::<u32>(),
          allow_hyphen_values = true)]
    slow_rank: Option<u32>,

    /// How many times the slow rank repeats its work per sample (at least 1)
    #[arg(long, value_name = "K", default_value_t = TrainConfig::default().slowdown,
          value_parser = number::<u32>(), allow_hyphen_values = true)]
    slowdown: u32,

    /// Directory for the step logs and the final parameters
    #[arg(long, value_name = "DIR", allow_hyphen_values = true,
          value_hint = clap::ValueHint::DirPath)]
    out: Option<PathBuf>,

    /// Rank 0 prints progress every N steps (0: never)
    #[arg(long = "print-every", value_name = "N",
          default_value_t = TrainConfig::default().print_every,
          value_parser = number::<u64>(), allow_hyphen_values = true)]
    print_every: u64,

    /// Directory where a preempted job saves its state and resumes from
    #[arg(long, value_name = "DIR", allow_hyphen_values = true,
          value_hint = clap::ValueHint::DirPath)]
    checkpoint: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Summarise finished runs: step times, predictions, local batches and
    /// how far the runs' final parameters differ
    #[command(
        long_about = None,
        override_usage = "gwtrain report [--warmup W] [--slowdown K] [--check] NAME=DIR [NAME=DIR...]",
        after_help = REPORT_ABOUT,
        args_override_self = true
    )]
    Report(ReportArgs),
    /// Print a completion script for SHELL on stdout
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// Steps left out of the means at the start of each run
    #[arg(long, value_name = "W", default_value_t = 5,
          value_parser = number::<usize>(), allow_hyphen_values = true)]
    warmup: usize,

    /// The slowdown the runs were started with (gwtrain --slowdown),
    /// printed beside the one measured
    #[arg(long, value_name = "K", value_parser = number::<u32>(), allow_hyphen_values = true)]
    slowdown: Option<u32>,

    /// Also check the demo's criteria; exit 1 if one is not met
    #[arg(long)]
    check: bool,

    /// A run to report on: its name and its --out directory
    #[arg(value_name = "NAME=DIR", value_parser = parse_run,
          value_hint = clap::ValueHint::DirPath)]
    runs: Vec<(String, PathBuf)>,
}

/// `--dims`: one flag holding the whole list.
#[derive(Clone, Debug, PartialEq)]
struct Dims(Vec<usize>);

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&text.join(","))
    }
}

/// What the command line asks for.
#[derive(Debug)]
enum Command {
    /// `-h` / `--help` anywhere: print this on stdout.
    Help(String),
    Train(TrainConfig),
    Report {
        warmup: usize,
        slowdown: Option<u32>,
        check: bool,
        runs: Vec<(String, PathBuf)>,
    },
    Completions(Shell),
}

/// A command-line mistake, in `gwtrain` or in `gwtrain report`.
#[derive(Debug, PartialEq, Eq)]
struct UsageError {
    command: &'static str,
    message: String,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.command;
        write!(f, "{c}: error: {} (see {c} --help)", self.message)
    }
}

/// A number whose error names the flag as the old parser did: `--steps "x"
/// is not a valid number`. Surrounding blanks are allowed.
fn number<T>() -> Number<T> {
    gw_cli::number(|flag, v| format!("{flag} {v:?} is not a valid number")).allow_blanks()
}

fn parse_dims(s: &str) -> Result<Dims, String> {
    s.split(',')
        .map(|d| number().parse_str("--dims", d))
        .collect::<Result<_, _>>()
        .map(Dims)
}

fn parse_run(a: &str) -> Result<(String, PathBuf), String> {
    match a.split_once('=') {
        Some((name, dir)) => Ok((name.to_owned(), PathBuf::from(dir))),
        None => Err(format!("expected NAME=DIR, got {a:?}")),
    }
}

/// gwtrain's one-line message for a clap error.
fn message(e: &clap::Error) -> String {
    if let Some(m) = parser_message(e) {
        return m;
    }
    // clap describes a flag as `--steps <N>`; the message wants `--steps`.
    let flag = || flag_of(e, "a flag");
    match e.kind() {
        ErrorKind::InvalidValue
            if context_str(e, ContextKind::InvalidValue).is_some_and(str::is_empty) =>
        {
            format!("{} needs a value", flag())
        }
        ErrorKind::UnknownArgument => {
            let arg = context_str(e, ContextKind::InvalidArg).unwrap_or_default();
            match context_str(e, ContextKind::SuggestedArg) {
                Some(s) => format!("unknown argument {arg:?} (did you mean {s}?)"),
                None => format!("unknown argument {arg:?}"),
            }
        }
        // A stray word where a command could stand.
        ErrorKind::InvalidSubcommand => {
            let word = context_str(e, ContextKind::InvalidSubcommand).unwrap_or_default();
            format!("unknown argument {word:?}")
        }
        ErrorKind::TooManyValues => format!("{} takes no value", flag()),
        _ => gw_cli::one_line(e),
    }
}

/// Parses gwtrain's arguments (without `argv[0]`).
fn parse(args: Vec<OsString>) -> Result<Command, UsageError> {
    let in_report = args.first().is_some_and(|a| a == "report");
    let command = if in_report {
        "gwtrain report"
    } else {
        "gwtrain"
    };
    let usage = |message: String| UsageError { command, message };
    // gwtrain has always answered -h and --help wherever they appear, even
    // after a mistake: report's help when the first word is `report`.
    if let Some(text) = gw_cli::help_anywhere(Cli::command(), &args) {
        return Ok(Command::Help(text));
    }
    let argv = std::iter::once(OsString::from("gwtrain")).chain(args);
    let m = Cli::command()
        .try_get_matches_from(argv)
        .map_err(|e| usage(message(&e)))?;
    let cli = Cli::from_arg_matches(&m).map_err(|e| usage(message(&e)))?;
    match cli.sub {
        Some(Sub::Report(r)) => {
            if r.runs.is_empty() {
                return Err(usage("report needs at least one NAME=DIR".into()));
            }
            if r.slowdown == Some(0) {
                return Err(usage("--slowdown must be at least 1".into()));
            }
            Ok(Command::Report {
                warmup: r.warmup,
                slowdown: r.slowdown,
                check: r.check,
                runs: r.runs,
            })
        }
        Some(Sub::Completions { shell }) => Ok(Command::Completions(shell)),
        None => {
            let t = cli.train;
            if !t.lr.is_finite() {
                return Err(usage(format!("--lr {} is not finite", t.lr)));
            }
            if t.slowdown == 0 {
                return Err(usage("--slowdown must be at least 1".into()));
            }
            if t.global_batch == 0 {
                return Err(usage("--global-batch must be at least 1".into()));
            }
            Ok(Command::Train(TrainConfig {
                steps: t.steps,
                lr: t.lr,
                seed: t.seed,
                dims: t.dims.0,
                global_batch: t.global_batch,
                slow_rank: t.slow_rank,
                slowdown: t.slowdown,
                out: t.out,
                checkpoint: t.checkpoint,
                print_every: t.print_every,
            }))
        }
    }
}

/// The completion script for `shell`, in memory: see
/// [`gw_cli::completion_script`].
fn completion_script(shell: Shell) -> Vec<u8> {
    gw_cli::completion_script(shell, Cli::command())
}

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_STOPPED: u8 = 3;

fn main() -> ExitCode {
    gw_logging::init();
    let cmd = match parse(std::env::args_os().skip(1).collect()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let cfg = match cmd {
        Command::Help(text) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Command::Completions(shell) => {
            return match gw_cli::print_script(&completion_script(shell)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gwtrain: error: cannot write the completion script: {e}");
                    ExitCode::from(EXIT_FAILED)
                }
            };
        }
        Command::Report {
            warmup,
            slowdown,
            check,
            runs,
        } => {
            let criteria = check.then_some(report::DEMO_CRITERIA);
            return match report::report(&runs, warmup, slowdown, criteria) {
                Ok(rep) => {
                    println!("{}", rep.text);
                    if rep.failed.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(EXIT_FAILED)
                    }
                }
                Err(e) => {
                    eprintln!("gwtrain report: {e}");
                    ExitCode::from(EXIT_USAGE)
                }
            };
        }
        Command::Train(cfg) => cfg,
    };
    // The communicator that knows the rank may not exist when a message is
    // due (it failed to come up); the launcher's variable always does.
    let rank = std::env::var(var::RANK).unwrap_or_else(|_| "?".into());
    match worker::run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        // The policy's preemption is part of the job's life, not a failure:
        // exit 0 tells the agent the state is saved and the job may move.
        Err(Stop::Preempted { step }) => {
            eprintln!("gwtrain rank {rank}: preempted at step {step}, checkpoint saved");
            ExitCode::SUCCESS
        }
        Err(Stop::ByServer { step, reason }) => {
            eprintln!("gwtrain rank {rank}: stopped at step {step}: {reason}");
            ExitCode::from(EXIT_STOPPED)
        }
        Err(Stop::Failed(e)) => {
            eprintln!("gwtrain rank {rank}: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, UsageError> {
        parse(s.split_whitespace().map(OsString::from).collect())
    }

    fn train(s: &str) -> TrainConfig {
        match p(s) {
            Ok(Command::Train(c)) => c,
            other => panic!("{s}: {other:?}"),
        }
    }

    fn usage(s: &str) -> UsageError {
        match p(s) {
            Err(e) => e,
            other => panic!("{s}: expected an error, got {other:?}"),
        }
    }

    fn help(s: &str) -> String {
        match p(s) {
            Ok(Command::Help(text)) => text,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_train_configs() {
        let c = train("");
        let d = TrainConfig::default();
        assert_eq!(
            (c.steps, c.lr, c.seed, &c.dims, c.global_batch),
            (d.steps, d.lr, d.seed, &d.dims, d.global_batch)
        );
        assert_eq!(
            (
                c.slow_rank,
                c.slowdown,
                &c.out,
                c.print_every,
                &c.checkpoint
            ),
            (
                d.slow_rank,
                d.slowdown,
                &d.out,
                d.print_every,
                &d.checkpoint
            )
        );
    }

    #[test]
    fn every_flag() {
        let c = train(
            "--steps 7 --lr 0.5 --seed 3 --dims 4,8,2 --global-batch 64 --slow-rank 1 \
             --slowdown 3 --out /tmp/o --print-every 0 --checkpoint /tmp/c",
        );
        assert_eq!(c.checkpoint, Some(PathBuf::from("/tmp/c")));
        assert_eq!((c.steps, c.lr, c.seed), (7, 0.5, 3));
        assert_eq!(c.dims, [4, 8, 2]);
        assert_eq!((c.global_batch, c.slow_rank, c.slowdown), (64, Some(1), 3));
        assert_eq!(c.out, Some(PathBuf::from("/tmp/o")));
        assert_eq!(c.print_every, 0);
        // Values that look like flags, a repeated flag, blanks around numbers.
        let c = train("--lr -0.25 --steps 3 --steps 4");
        assert_eq!((c.lr, c.steps), (-0.25, 4));
        match parse(
            ["--steps", " 5 ", "--dims", "4, 2"]
                .map(OsString::from)
                .to_vec(),
        ) {
            Ok(Command::Train(c)) => assert_eq!((c.steps, c.dims), (5, vec![4, 2])),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn report_arguments() {
        match p("report --warmup 2 --slowdown 3 --check a=/x b=y=z") {
            Ok(Command::Report {
                warmup,
                slowdown,
                check,
                runs,
            }) => {
                assert_eq!((warmup, slowdown, check), (2, Some(3), true));
                assert_eq!(
                    runs,
                    [
                        ("a".to_owned(), PathBuf::from("/x")),
                        ("b".to_owned(), PathBuf::from("y=z"))
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
        match p("report a=b") {
            Ok(Command::Report {
                warmup,
                slowdown,
                check,
                ..
            }) => assert_eq!((warmup, slowdown, check), (5, None, false)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn help_anywhere_documents_everything() {
        let top = help("--help");
        assert_eq!(help("-h"), top);
        assert_eq!(help("--steps x -h"), top);
        assert_eq!(help("--bogus --help"), top);
        for want in [
            "--steps <N>",
            "--lr <X>",
            "--seed <S>",
            "--dims <LIST>",
            "--global-batch <B>",
            "--slow-rank <R>",
            "--slowdown <K>",
            "--out <DIR>",
            "--print-every <N>",
            "--checkpoint <DIR>",
            "GW_RESUME_STEP=S",
            "[default: 100]",
            "[default: 512]",
            "gwtrain report [--warmup W] [--slowdown K] [--check] NAME=DIR [NAME=DIR...]",
            "GW_JOB_SERVER",
            "DIR/steps-rank<R>.log",
            "within 10% of that optimum",
            "Exit status",
        ] {
            assert!(top.contains(want), "--help lacks {want:?}\n{top}");
        }
        let rep = help("report x --help");
        assert_eq!(help("report -h"), rep);
        for want in [
            "Usage: gwtrain report",
            "--warmup <W>",
            "--slowdown <K>",
            "--check",
            "NAME=DIR",
        ] {
            assert!(rep.contains(want), "report --help lacks {want:?}\n{rep}");
        }
    }

    #[test]
    fn mistakes_are_one_line() {
        for (args, command, want) in [
            ("--steps", "gwtrain", "--steps needs a value"),
            (
                "--steps x",
                "gwtrain",
                r#"--steps "x" is not a valid number"#,
            ),
            (
                "--steps -1",
                "gwtrain",
                r#"--steps "-1" is not a valid number"#,
            ),
            (
                "--dims 4,x",
                "gwtrain",
                r#"--dims "x" is not a valid number"#,
            ),
            ("--lr NaN", "gwtrain", "--lr NaN is not finite"),
            ("--slowdown 0", "gwtrain", "--slowdown must be at least 1"),
            (
                "--global-batch 0",
                "gwtrain",
                "--global-batch must be at least 1",
            ),
            ("--bogus", "gwtrain", r#"unknown argument "--bogus""#),
            ("--step 3", "gwtrain", "(did you mean --steps?)"),
            ("stray", "gwtrain", r#"unknown argument "stray""#),
            ("--steps 3 report a=b", "gwtrain", "report"),
            (
                "report",
                "gwtrain report",
                "report needs at least one NAME=DIR",
            ),
            (
                "report nodir",
                "gwtrain report",
                r#"expected NAME=DIR, got "nodir""#,
            ),
            (
                "report --warmup x a=b",
                "gwtrain report",
                r#"--warmup "x" is not"#,
            ),
            (
                "report --slowdown 0 a=b",
                "gwtrain report",
                "--slowdown must be at least 1",
            ),
            (
                "report --check=1 a=b",
                "gwtrain report",
                "--check takes no value",
            ),
            ("completions tcsh", "gwtrain", "invalid value 'tcsh'"),
            ("completions", "gwtrain", "not provided: <SHELL>"),
        ] {
            let e = usage(args);
            assert_eq!(e.command, command, "{args}");
            assert!(e.message.contains(want), "{args}: {e}");
            let line = e.to_string();
            assert!(!line.contains('\n'), "{args}: {line}");
            assert!(line.starts_with(&format!("{command}: error: ")), "{line}");
        }
    }

    #[test]
    fn completion_scripts() {
        assert!(matches!(
            p("completions bash"),
            Ok(Command::Completions(Shell::Bash))
        ));
        let script = String::from_utf8(completion_script(Shell::Bash)).expect("the script is text");
        for want in ["--slow-rank", "report", "--warmup"] {
            assert!(script.contains(want), "completion lacks {want}");
        }
    }
}
