//! `gwjob`'s whole command line: one clap definition ([`Cli`]) whose
//! subcommands are the server, the agent and the client commands, so that
//! `gwjob --help`, `gwjob submit --help` and the completion scripts all come
//! from the same place.
//!
//! [`parse`] turns the words into a [`Gwjob`]: something to print, or settings
//! checked in full, because nothing must start (no database opened, no node
//! registered, no job submitted) on a line with a mistake. Mistakes are a
//! [`UsageError`]: one line naming the subcommand, which the binary prints
//! and exits 2 with.

use crate::agent::args::{self as agent_args, AgentArgs};
use crate::cli::args::{CancelArgs, Client, StatusArgs, SubmitArgs};
use crate::cli::args::{SUBMIT_AFTER_HELP, SUBMIT_USAGE};
use crate::cli::flags;
use crate::cli::sim_args::{GEN_TRACE_AFTER_HELP, GenTraceArgs, SIMULATE_AFTER_HELP, SimulateArgs};
use crate::cli::token_args::{NODE_TOKEN_AFTER_HELP, NodeTokenArgs, TOKEN_AFTER_HELP, TokenArgs};
use crate::server::args::{self as serve_args, ServeArgs, ServeOptions};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};
use gw_cli::Shell;
use std::ffi::OsString;
use std::fmt;

const AFTER_HELP: &str = "\
Each command has its own help: gwjob COMMAND --help.

Shell completion: gwjob completions bash|zsh|fish|elvish|powershell prints a
script, e.g. gwjob completions bash > ~/.local/share/bash-completion/completions/gwjob

Exit status: 0 success; 1 the server refused a request or could not be
reached, or the server or agent failed; 2 usage error.";

/// `gwjob`, as clap sees it.
#[derive(Debug, Parser)]
#[command(
    name = "gwjob",
    version,
    about = "gwjob - the gradwire job server, node agent and client",
    // The doc comments here are for readers of the code, not for --help.
    long_about = None,
    after_help = AFTER_HELP,
    subcommand_required = true,
    // Only --version: -V was never gwjob's.
    disable_version_flag = true
)]
pub struct Cli {
    /// Print the version and exit
    #[arg(long, action = ArgAction::Version)]
    version: (),

    #[command(subcommand)]
    cmd: Cmd,
}

// Each subcommand lets a repeated option's last value win, as gwjob's old
// parser did (clap refuses repeats unless told).
#[derive(Debug, Subcommand)]
enum Cmd {
    #[command(
        about = serve_args::ABOUT,
        long_about = None,
        override_usage = serve_args::USAGE,
        after_help = serve_args::AFTER_HELP,
        args_override_self = true
    )]
    Serve(ServeArgs),

    #[command(
        about = agent_args::ABOUT,
        long_about = None,
        override_usage = agent_args::USAGE,
        after_help = agent_args::AFTER_HELP,
        args_override_self = true
    )]
    Agent(AgentArgs),

    /// Submit a job; prints its id
    #[command(
        long_about = None,
        override_usage = SUBMIT_USAGE,
        after_help = SUBMIT_AFTER_HELP,
        args_override_self = true
    )]
    Submit(SubmitArgs),

    /// Show jobs, or one job's ranks and step times
    #[command(long_about = None, args_override_self = true)]
    Status(StatusArgs),

    /// Cancel a job
    #[command(long_about = None, args_override_self = true)]
    Cancel(CancelArgs),

    /// Issue (or revoke) a node agent's own token
    #[command(long_about = None, after_help = NODE_TOKEN_AFTER_HELP, args_override_self = true)]
    NodeToken(NodeTokenArgs),

    /// Issue (or revoke) a submit token
    #[command(long_about = None, after_help = TOKEN_AFTER_HELP, args_override_self = true)]
    Token(TokenArgs),

    /// Replay a job trace on a cluster under a scheduling policy
    #[command(long_about = None, after_help = SIMULATE_AFTER_HELP, args_override_self = true)]
    Simulate(SimulateArgs),

    /// Write a synthetic job trace
    #[command(long_about = None, after_help = GEN_TRACE_AFTER_HELP, args_override_self = true)]
    GenTrace(GenTraceArgs),

    /// Print a completion script for SHELL on stdout
    #[command(long_about = None)]
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Gwjob {
    /// Help or the version: print on stdout, exit 0.
    Print(String),
    /// `gwjob completions SHELL`.
    Completions(Shell),
    Serve(ServeOptions),
    Agent(agent_args::Options),
    /// `submit`, `status`, `cancel`, `node-token`, `token`, `simulate` or
    /// `gen-trace`.
    Client(Client),
}

/// A command-line mistake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError {
    /// `gwjob`, or `gwjob submit` when the subcommand is known.
    pub command: String,
    /// One line, without the command.
    pub message: String,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{c}: error: {m} (see '{c} --help')",
            c = self.command,
            m = self.message
        )
    }
}

impl std::error::Error for UsageError {}

/// Parses gwjob's arguments (without `argv[0]`); `env_token` is
/// `$GW_ADMIN_TOKEN`, which the agent needs when it has no `--token-file`.
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    env_token: Option<String>,
) -> Result<Gwjob, UsageError> {
    let args: Vec<OsString> = args.into_iter().collect();
    // gwjob has no option that takes a value before the subcommand, so the
    // first word names it, even when clap stops before knowing.
    let sub = args
        .first()
        .and_then(|a| a.to_str())
        .filter(|a| Cli::command().find_subcommand(a).is_some())
        .map(str::to_owned);
    let command = match &sub {
        Some(s) => format!("gwjob {s}"),
        None => "gwjob".to_owned(),
    };
    let usage = |message: String| UsageError {
        command: command.clone(),
        message,
    };
    let argv = std::iter::once(OsString::from("gwjob")).chain(args.iter().cloned());
    let m = match Cli::command().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            return Ok(Gwjob::Print(e.render().to_string()));
        }
        Err(e) => return Err(usage(message(sub.as_deref(), &command, &e))),
    };
    let cli =
        Cli::from_arg_matches(&m).map_err(|e| usage(message(sub.as_deref(), &command, &e)))?;
    match cli.cmd {
        Cmd::Serve(a) => a.options().map(Gwjob::Serve).map_err(usage),
        Cmd::Agent(a) => a.options(env_token).map(Gwjob::Agent).map_err(usage),
        Cmd::Submit(a) => a.request().map(Gwjob::Client).map_err(usage),
        Cmd::Status(a) => Ok(Gwjob::Client(a.request())),
        Cmd::Cancel(a) => Ok(Gwjob::Client(a.request())),
        Cmd::NodeToken(a) => a.request().map(Gwjob::Client).map_err(usage),
        Cmd::Token(a) => a.request().map(Gwjob::Client).map_err(usage),
        Cmd::Simulate(a) => a.request().map(Gwjob::Client).map_err(usage),
        Cmd::GenTrace(a) => a.request().map(Gwjob::Client).map_err(usage),
        Cmd::Completions { shell } => Ok(Gwjob::Completions(shell)),
    }
}

/// The completion script for `shell`, in memory: see
/// [`gw_cli::completion_script`]; the binary writes it.
pub fn completion_script(shell: Shell) -> Vec<u8> {
    gw_cli::completion_script(shell, Cli::command())
}

fn subcommand_names() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .filter(|n| n != "help")
        .collect()
}

/// The one-line message for a clap error in `sub`: what gwjob's old parser
/// said about the JOB operand and the command word, else [`flags::message`].
fn message(sub: Option<&str>, command: &str, e: &clap::Error) -> String {
    let stray_word = e.kind() == ErrorKind::UnknownArgument
        && matches!(e.get(ContextKind::InvalidArg),
            Some(ContextValue::String(a)) if !a.starts_with('-'));
    match (sub, e.kind()) {
        (Some("status"), _) if stray_word => "gwjob status takes at most one JOB".into(),
        (Some("cancel"), ErrorKind::MissingRequiredArgument) => {
            "gwjob cancel takes exactly one JOB".into()
        }
        (Some("cancel"), _) if stray_word => "gwjob cancel takes exactly one JOB".into(),
        // clap's derive shows the help when the subcommand is missing; under
        // the one-line rule, the choices are enough.
        (
            None,
            ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand,
        ) => {
            format!("missing COMMAND ({})", subcommand_names().join(", "))
        }
        (_, ErrorKind::InvalidSubcommand) => {
            let word = match e.get(ContextKind::InvalidSubcommand) {
                Some(ContextValue::String(w)) => w.as_str(),
                _ => "",
            };
            match e.get(ContextKind::SuggestedSubcommand) {
                Some(ContextValue::Strings(s)) if !s.is_empty() => {
                    format!(
                        "unknown command {word:?} (did you mean {}?)",
                        s.join(" or ")
                    )
                }
                _ => format!(
                    "unknown command {word:?}; the commands are {}",
                    subcommand_names().join(", ")
                ),
            }
        }
        _ => flags::message(command, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Gwjob, UsageError> {
        parse(args.iter().map(OsString::from), None)
    }

    fn printed(args: &[&str]) -> String {
        match p(args) {
            Ok(Gwjob::Print(text)) => text,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_for_gwjob_and_each_command() {
        let top = printed(&["--help"]);
        assert_eq!(printed(&["-h"]), top);
        assert_eq!(printed(&["help"]), top);
        for want in [
            "serve",
            "agent",
            "submit",
            "status",
            "cancel",
            "node-token",
            "completions",
            "Exit status",
        ] {
            assert!(top.contains(want), "gwjob --help lacks {want:?}: {top}");
        }
        for (sub, wants) in [
            (
                "serve",
                &["--db <PATH>", "--admin-token-file", "--heartbeat-ms"][..],
            ),
            (
                "agent",
                &["--server <URL>", "--slots <N>", "GW_* variables"],
            ),
            (
                "submit",
                &[
                    "--workers <N>",
                    "--global-batch <B>",
                    "--batch-bounds <LO:HI>",
                    "--batch-schedule <LIST>",
                    "--planner <KIND>",
                    "--name <NAME>",
                    "--env <KEY=VALUE>",
                    "--server <URL>",
                    "--token-file <PATH>",
                    "-- PROGRAM [ARGS...]",
                    "GW_JOB_SERVER_URL",
                    "GW_ADMIN_TOKEN",
                    "prints the new job's id",
                ],
            ),
            ("status", &["[JOB]", "--json", "--server <URL>"]),
            ("cancel", &["<JOB>", "--token-file <PATH>"]),
            (
                "node-token",
                &[
                    "--node <NAME>",
                    "--revoke <NAME>",
                    "--out <PATH>",
                    "as that node and nothing else",
                ],
            ),
            (
                "token",
                &["--role <ROLE>", "--name <NAME>", "run any program there"],
            ),
            (
                "simulate",
                &[
                    "--trace <FILE>",
                    "--cluster <FILE>",
                    "--policy <POLICY>",
                    "hadare",
                    "--round <SECS>",
                    "--json",
                ],
            ),
            (
                "gen-trace",
                &[
                    "--jobs <N>",
                    "--seed <S>",
                    "--arrival-rate <R>",
                    "--out <FILE>",
                    "Poisson",
                ],
            ),
        ] {
            let text = printed(&[sub, "--help"]);
            assert_eq!(printed(&[sub, "-h"]), text, "{sub}");
            assert_eq!(printed(&["help", sub]), text, "{sub}");
            assert!(text.contains(&format!("Usage: gwjob {sub}")), "{text}");
            for want in wants {
                assert!(
                    text.contains(want),
                    "gwjob {sub} --help lacks {want:?}: {text}"
                );
            }
        }
        // Help wins over a mistake later on the line.
        assert!(printed(&["cancel", "-h", "--bogus"]).contains("Usage: gwjob cancel"));
    }

    #[test]
    fn version() {
        assert_eq!(
            printed(&["--version"]),
            format!("gwjob {}\n", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn completions_for_every_shell() {
        assert!(matches!(
            p(&["completions", "zsh"]),
            Ok(Gwjob::Completions(Shell::Zsh))
        ));
        let script = String::from_utf8(completion_script(Shell::Bash)).expect("the script is text");
        for want in [
            "gwjob",
            "submit",
            "--batch-schedule",
            "--device-type",
            "optperf",
        ] {
            assert!(script.contains(want), "completion lacks {want}");
        }
    }

    #[test]
    fn command_mistakes() {
        for (args, command, want) in [
            (
                &[][..],
                "gwjob",
                "missing COMMAND (serve, agent, submit, status, cancel, node-token, token, simulate, gen-trace, completions)",
            ),
            (&["frobnicate"], "gwjob", "unknown command \"frobnicate\""),
            // clap also offers simulate, which is as many edits away.
            (&["sumbit"], "gwjob", "(did you mean simulate or submit?)"),
            (&["--frob"], "gwjob", "unknown option --frob for gwjob"),
            (&["-V"], "gwjob", "unknown option -V"),
            (
                &["completions", "tcsh"],
                "gwjob completions",
                "must be bash, elvish",
            ),
            (&["completions"], "gwjob completions", "<SHELL>"),
            (&["serve"], "gwjob serve", "--db PATH is required"),
        ] {
            match p(args) {
                Err(e) => {
                    assert_eq!(e.command, command, "{args:?}");
                    assert!(e.message.contains(want), "{args:?}: {e}");
                    let line = e.to_string();
                    assert!(!line.contains('\n'), "{args:?}: {line}");
                    assert!(
                        line.starts_with(&format!("{command}: error: ")),
                        "{args:?}: {line}"
                    );
                    assert!(
                        line.ends_with(&format!("(see '{command} --help')")),
                        "{args:?}: {line}"
                    );
                }
                other => panic!("{args:?}: {other:?}"),
            }
        }
    }
}
