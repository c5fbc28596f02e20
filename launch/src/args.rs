//! gwrun's command line.
//!
//! The grammar is launcher-shaped: options come first, the first word that is
//! not an option is PROGRAM, and everything after it belongs to the program,
//! even words that look like gwrun options (`gwrun -n 2 prog -n 5` gives
//! `-n 5` to `prog`); `--` ends gwrun's options explicitly. clap derives the
//! parser from [`Cli`], where `trailing_var_arg` on PROGRAM gives that rule.
//! [`parse`] adds what clap cannot express: mpirun's single-dash `-np`, the
//! checks that span flags, and gwrun's own wording of every mistake, as one
//! line completing `gwrun: error: ` (the binary prints it), because a
//! launcher's complaint must stay readable beside the ranks' output.
//!
//! Parsing never panics on user input: every problem is a [`UsageError`].

use crate::bind::BindTo;
use clap::error::{ContextKind, ErrorKind};
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, ValueEnum};
use gw_cli::{Shell, context_str, context_strs, err, flag_of, parser_message};
use std::ffi::{OsStr, OsString};
use std::net::{IpAddr, SocketAddr};

/// The largest `-n` accepted: a guard against a typo spawning a million
/// processes, not a limit of the protocol.
pub const MAX_RANKS: usize = 4096;

/// Value of `--transport`, passed to ranks as `GW_TRANSPORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportChoice {
    Auto,
    Tcp,
    Shm,
    Ofi,
}

impl TransportChoice {
    /// The spelling ranks read from `GW_TRANSPORT`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Tcp => "tcp",
            TransportChoice::Shm => "shm",
            TransportChoice::Ofi => "ofi",
        }
    }
}

/// Everything `gwrun` needs to launch a job.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// `-n`: number of ranks (the world size), at least 1.
    pub nprocs: usize,
    /// `--transport`: exported as `GW_TRANSPORT` when given.
    pub transport: Option<TransportChoice>,
    /// `--timeout`: exported as `GW_TIMEOUT` when given, exactly as typed
    /// (after checking that it is a positive number of seconds).
    pub timeout: Option<String>,
    /// `--lanes`: exported as `GW_LANES` when given.
    pub lanes: Option<u32>,
    /// `--tag-output` (default) / `--no-tag-output`.
    pub tag_output: bool,
    /// `--store-bind`: where the rendezvous store listens (default 127.0.0.1:0,
    /// or `GW_STORE_BIND`).
    pub store_bind: Option<SocketAddr>,
    /// `--store-addr`: the address ranks are told (`GW_STORE`), when it differs
    /// from the one the store is bound to.
    pub store_addr: Option<String>,
    /// `--bind-to`: which processors each rank may use (default `share`, or
    /// `GW_BIND_TO`; see [`crate::bind`]).
    pub bind_to: Option<BindTo>,
    /// `--report-bindings`: say on stderr where each rank was bound.
    pub report_bindings: bool,
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// `--help` / `-h`: the text to print on stdout (exit 0).
    Help(String),
    /// `--version`: the line to print on stdout (exit 0).
    Version(String),
    /// `--completions SHELL`: print a completion script (exit 0).
    Completions(Shell),
    /// Launch a job.
    Run(Options),
}

/// A command-line mistake; the message completes `gwrun: error: `.
pub use gw_cli::UsageError;

/// clap would write `[OPTIONS] [PROGRAM]...`; gwrun's rule is that options
/// come first and PROGRAM is required.
const USAGE: &str = "gwrun -n N [OPTIONS] [--] PROGRAM [ARGS...]";

const ABOUT: &str = "\
gwrun - launch a gradwire job on this host (in the style of mpirun/torchrun)

gwrun starts a rendezvous store, runs N copies of PROGRAM (the ranks) with the
environment below, prefixes their output with the rank, forwards SIGINT and
SIGTERM to them, and if one rank fails, stops the others and names it.
Options must come before PROGRAM; everything after PROGRAM is passed to it.";

/// What the flags' one-line help cannot say: the contract with the ranks and
/// the exit statuses scripts depend on.
const AFTER_HELP: &str = "\
Long options also accept --option=VALUE.

PROGRAM without a '/' is looked up first in the directory that holds the gwrun
executable, then on PATH.

environment set for each rank:
  GW_RANK          this rank, 0..N-1
  GW_WORLD_SIZE    N
  GW_LOCAL_RANK    rank among the ranks on this host (= GW_RANK)
  GW_LOCAL_SIZE    ranks on this host (= N)
  GW_STORE         HOST:PORT of the rendezvous store
  GW_TOKEN         per-job secret the store requires (32 hex digits)
  GW_JOB_ID        per-job id (16 hex digits); the ranks name their
                   shared-memory segments by a secret they share instead,
                   and unlink them once mapped; any /dev/shm/gw-<GW_JOB_ID>-*
                   left is removed when the job ends
  GW_TRANSPORT, GW_TIMEOUT, GW_LANES
                   only when the matching option is given; otherwise whatever
                   gwrun inherited is passed on unchanged
  OMP_NUM_THREADS  the rank's share of gwrun's processors, at least 1 (two
                   ranks on 64 get 32 each; torchrun sets 1), so that the
                   ranks' OpenMP threads (PyTorch, BLAS) do not outnumber the
                   cores; only if not inherited (an empty one counts as unset)
  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
                   torchrun's, so that PyTorch's init_process_group works
                   under gwrun with any backend: the rank and sizes as above,
                   the store's host and a port that was free when gwrun
                   started (MASTER_ADDR and MASTER_PORT only if not inherited)
Ranks run in one process group of their own with /dev/null as stdin, and are
killed if gwrun itself dies.

binding:
  Each rank may run only on its share of the processors gwrun may run on (as
  taskset or a cgroup left them): an equal run of consecutive ones, so two
  ranks on 2 processors get one each and two on 64 get 32 each. A rank's
  caller polls for its peers, which only pays when they run elsewhere; bound,
  a busy process beside the job slows it about 2x instead of 5-140x. With
  more ranks than processors nothing is bound. --bind-to none (or
  GW_BIND_TO=none) leaves every rank gwrun's own set.

signals:
  SIGINT/SIGTERM are forwarded to every rank; ranks still running 5 s later are
  killed (SIGKILL). A second SIGINT/SIGTERM kills them at once.

exit status:
  0        every rank exited with status 0
  S        the first rank to fail exited with status S
  128+N    the first rank to fail was killed by signal N, or gwrun received
           signal N (130 for SIGINT, 143 for SIGTERM) and forwarded it
  1        gwrun itself failed (rendezvous store, spawning a rank)
  2        usage error, or PROGRAM not found or not executable
When a rank fails gwrun prints 'gwrun: rank R exited with status S' or
'gwrun: rank R was killed by signal NAME (N)', sends SIGTERM to the other
ranks and SIGKILL to those still running 3 s later.

Shell completion: gwrun --completions bash|zsh|fish|elvish|powershell prints a
script, e.g. gwrun --completions bash > ~/.local/share/bash-completion/completions/gwrun
";

/// gwrun's command line, as clap sees it.
///
/// `-n` and PROGRAM are optional here and required by [`parse`], which names
/// what is missing in gwrun's words, one thing at a time, and lets
/// `--completions` go without them. Every option that takes a value takes the
/// next word whatever it looks like (`allow_hyphen_values`), as mpirun does,
/// so `-n -3` is reported as a bad count rather than as a missing one.
#[derive(Debug, Parser)]
#[command(
    name = "gwrun",
    version,
    about = ABOUT,
    // The doc comment above is for readers of the code, not for --help.
    long_about = None,
    override_usage = USAGE,
    after_help = AFTER_HELP,
    // The old parser let a repeated option's last value win; so does clap
    // when told.
    args_override_self = true,
    // Only --version: -V was never gwrun's, and a PROGRAM's flags come after.
    disable_version_flag = true
)]
struct Cli {
    /// Number of ranks to start (1..=4096; required; also -np N)
    // No primary long name: clap names an option by its long one in errors,
    // and the launcher's option is `-n`.
    #[arg(
        short = 'n',
        visible_aliases = ["np", "nproc"],
        value_name = "N",
        value_parser = parse_nprocs,
        allow_hyphen_values = true
    )]
    nprocs: Option<usize>,

    /// Data-plane transport for the ranks (sets GW_TRANSPORT)
    // The value name lists the choices, as gwrun's help always has; clap's
    // "[possible values: ...]" would say it twice.
    #[arg(
        long,
        value_name = "auto|tcp|shm|ofi",
        value_enum,
        hide_possible_values = true,
        allow_hyphen_values = true
    )]
    transport: Option<TransportChoice>,

    /// Deadline in seconds for each blocking collective call, init included
    /// (sets GW_TIMEOUT); not a wall clock for the job
    #[arg(
        long,
        value_name = "SECS",
        value_parser = parse_timeout,
        allow_hyphen_values = true
    )]
    timeout: Option<String>,

    /// Sockets per peer for TCP (K >= 1; sets GW_LANES)
    #[arg(
        long,
        value_name = "K",
        value_parser = parse_lanes,
        allow_hyphen_values = true
    )]
    lanes: Option<u32>,

    /// Prefix every line a rank writes with "[RANK] " (default)
    #[arg(long = "tag-output", overrides_with = "no_tag_output")]
    tag_output: bool,

    /// Pass rank output through untouched
    #[arg(long = "no-tag-output", overrides_with = "tag_output")]
    no_tag_output: bool,

    /// Address the rendezvous store listens on: IP or IP:PORT (default
    /// 127.0.0.1:0, i.e. loopback and a free port; GW_STORE_BIND sets the
    /// default)
    #[arg(
        long = "store-bind",
        value_name = "ADDR",
        value_parser = parse_store_bind,
        allow_hyphen_values = true
    )]
    store_bind: Option<SocketAddr>,

    /// Address given to ranks as GW_STORE when it differs from the bound one
    /// (e.g. with --store-bind 0.0.0.0); without a port, the bound port is used
    #[arg(
        long = "store-addr",
        value_name = "HOST[:PORT]",
        value_parser = parse_store_addr,
        allow_hyphen_values = true
    )]
    store_addr: Option<String>,

    /// Processors of each rank: an equal run of consecutive ones from
    /// gwrun's own set (share, the default unless GW_BIND_TO says otherwise),
    /// or all of gwrun's (none); ranks outnumbering processors are not bound
    #[arg(
        long = "bind-to",
        value_name = "share|none",
        value_enum,
        hide_possible_values = true,
        allow_hyphen_values = true
    )]
    bind_to: Option<BindTo>,

    /// Say on stderr which processors each rank was bound to
    #[arg(long = "report-bindings")]
    report_bindings: bool,

    /// Print a completion script for SHELL on stdout and exit
    #[arg(long, value_name = "SHELL", value_enum, exclusive = true)]
    completions: Option<Shell>,

    /// Print the version and exit
    #[arg(long, action = ArgAction::Version)]
    version: (),

    /// The program every rank runs, then its arguments; everything from
    /// PROGRAM on is passed to it untouched
    #[arg(
        value_name = "PROGRAM",
        trailing_var_arg = true,
        value_hint = clap::ValueHint::CommandWithArguments
    )]
    command: Vec<OsString>,
}

/// Parses gwrun's arguments (without `argv[0]`).
pub fn parse<I>(args: I) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = OsString>,
{
    let args: Vec<OsString> = args.into_iter().collect();
    let argv = std::iter::once(OsString::from("gwrun")).chain(spell_np(&args));
    let m = match Cli::command().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp => Ok(Command::Help(e.render().to_string())),
                ErrorKind::DisplayVersion => Ok(Command::Version(e.render().to_string())),
                _ => Err(UsageError(message(&e))),
            };
        }
    };
    let cli = Cli::from_arg_matches(&m).map_err(|e| UsageError(message(&e)))?;
    if let Some(shell) = cli.completions {
        return Ok(Command::Completions(shell));
    }
    let Some(nprocs) = cli.nprocs else {
        return err("missing -n N (number of ranks); see gwrun --help");
    };
    let mut command = cli.command.into_iter();
    let Some(program) = command.next() else {
        if args.iter().any(|a| a == "--") {
            return err("missing PROGRAM after '--'");
        }
        return err("missing PROGRAM to run; see gwrun --help");
    };
    if program.is_empty() {
        return err("PROGRAM is empty");
    }
    Ok(Command::Run(Options {
        nprocs,
        transport: cli.transport,
        timeout: cli.timeout,
        lanes: cli.lanes,
        tag_output: !cli.no_tag_output,
        store_bind: cli.store_bind,
        store_addr: cli.store_addr,
        bind_to: cli.bind_to,
        report_bindings: cli.report_bindings,
        program,
        args: command.collect(),
    }))
}

/// The completion script for `shell`, in memory: see
/// [`gw_cli::completion_script`]; the binary writes it.
pub fn completion_script(shell: Shell) -> Vec<u8> {
    gw_cli::completion_script(shell, Cli::command())
}

/// Rewrites mpirun's `-np` to `--np` among gwrun's options.
///
/// clap has no single-dash long options: it would read `-np 4` as `-n` with
/// the value `p` and then take `4` for PROGRAM. Only the words before PROGRAM
/// are gwrun's, so this walks them as clap will (an option that takes a value
/// consumes the next word, whatever it looks like) and stops at `--` or at
/// the first word that is not an option.
fn spell_np(args: &[OsString]) -> Vec<OsString> {
    let cmd = Cli::command();
    let takes_value = |word: &str| {
        cmd.get_arguments()
            .filter(|a| !a.is_positional() && a.get_action().takes_values())
            .any(|a| match word.strip_prefix("--") {
                Some(long) => {
                    a.get_long() == Some(long)
                        || a.get_all_aliases().is_some_and(|al| al.contains(&long))
                }
                None => {
                    let mut c = word.chars();
                    c.next() == Some('-') && c.next() == a.get_short() && c.next().is_none()
                }
            })
    };
    let mut out = Vec::with_capacity(args.len());
    let mut words = args.iter();
    while let Some(a) = words.next() {
        // A word that is not text cannot be one of gwrun's options: clap
        // refuses it, or it is PROGRAM.
        let Some(w) = a.to_str() else {
            out.push(a.clone());
            break;
        };
        if w == "--" || w == "-" || !w.starts_with('-') {
            out.push(a.clone());
            break;
        }
        let value_follows = w == "-np" || takes_value(w);
        out.push(if w == "-np" { "--np".into() } else { a.clone() });
        if value_follows && let Some(v) = words.next() {
            out.push(v.clone());
        }
    }
    out.extend(words.cloned());
    out
}

/// gwrun's one-line message for a clap error: the wording of gwrun's own
/// parser where it had one, else clap's message without its usage block.
fn message(e: &clap::Error) -> String {
    // The value parsers below write whole messages naming their option.
    if let Some(m) = parser_message(e) {
        return m;
    }
    match e.kind() {
        ErrorKind::InvalidValue => {
            let flag = flag_of(e, "an option");
            let value = context_str(e, ContextKind::InvalidValue).unwrap_or_default();
            if value.is_empty() {
                return format!("{flag} requires a value");
            }
            let valid = context_strs(e, ContextKind::ValidValue).join(", ");
            let mut m = format!("{flag}: '{value}' is not one of {valid}");
            if let Some(s) = context_str(e, ContextKind::SuggestedValue) {
                m.push_str(&format!(" (did you mean '{s}'?)"));
            }
            m
        }
        ErrorKind::UnknownArgument => {
            let arg = context_str(e, ContextKind::InvalidArg).unwrap_or_default();
            match context_str(e, ContextKind::SuggestedArg) {
                Some(s) => {
                    format!("unknown option '{arg}'; did you mean '{s}'? (see gwrun --help)")
                }
                None => format!("unknown option '{arg}' (see gwrun --help)"),
            }
        }
        // `--tag-output=yes`
        ErrorKind::TooManyValues => format!("{} takes no value", flag_of(e, "an option")),
        _ => format!("{} (see gwrun --help)", gw_cli::one_line(e)),
    }
}

fn parse_nprocs(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(0) => Err("-n must be at least 1".into()),
        Ok(n) if n > MAX_RANKS => Err(format!("-n {n} is more than {MAX_RANKS} ranks")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("-n: '{v}' is not a positive whole number of ranks")),
    }
}

fn parse_timeout(v: &str) -> Result<String, String> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(v.trim().to_owned()),
        _ => Err(format!(
            "--timeout: '{v}' is not a positive number of seconds"
        )),
    }
}

fn parse_lanes(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(k) if k >= 1 => Ok(k),
        _ => Err(format!(
            "--lanes: '{v}' is not a whole number of at least 1"
        )),
    }
}

fn parse_store_bind(v: &str) -> Result<SocketAddr, String> {
    parse_bind(v).map_err(|e| format!("--store-bind: {e}"))
}

/// Parses a store bind address: `IP:PORT`, `[IPv6]:PORT`, or a bare IP (port 0,
/// i.e. any free port). Shared with the `GW_STORE_BIND` variable.
pub fn parse_bind(v: &str) -> Result<SocketAddr, String> {
    let v = v.trim();
    if let Ok(sa) = v.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let bare = v
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(v);
    match bare.parse::<IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, 0)),
        Err(_) => Err(format!("'{v}' is not an IP address or IP:PORT")),
    }
}

fn parse_store_addr(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.is_empty() || v.chars().any(char::is_whitespace) {
        return Err(format!("--store-addr: '{v}' is not HOST or HOST:PORT"));
    }
    if let Some((_, port)) = split_port(v)
        && port.parse::<u16>().is_err()
    {
        return Err(format!(
            "--store-addr: '{port}' in '{v}' is not a port number"
        ));
    }
    Ok(v.to_owned())
}

/// Splits `HOST:PORT` / `[V6]:PORT` into host and port text; `None` when `v`
/// names only a host (a bare IPv6 address has colons but no port).
pub fn split_port(v: &str) -> Option<(&str, &str)> {
    if let Some(rest) = v.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return after.strip_prefix(':').map(|p| (host, p));
    }
    match v.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Some((host, port)),
        _ => None,
    }
}

/// The `GW_STORE` value ranks get: `--store-addr` completed with the bound port
/// when it names only a host, else the bound address (with an unspecified IP
/// such as 0.0.0.0 replaced by loopback, which is what a local rank can reach).
pub fn advertised_store(store_addr: Option<&str>, bound: SocketAddr) -> String {
    match store_addr {
        Some(a) if split_port(a).is_some() => a.to_owned(),
        Some(a) if a.contains(':') && !a.starts_with('[') => format!("[{a}]:{}", bound.port()),
        Some(a) => format!("{a}:{}", bound.port()),
        None => {
            let ip = match bound.ip() {
                IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
                ip => ip,
            };
            SocketAddr::new(ip, bound.port()).to_string()
        }
    }
}

/// Whether a program name is used as a path (contains '/') rather than looked up.
pub fn is_path(program: &OsStr) -> bool {
    program.as_encoded_bytes().contains(&b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    fn run(args: &[&str]) -> Options {
        match p(args) {
            Ok(Command::Run(o)) => o,
            other => panic!("expected Run for {args:?}, got {other:?}"),
        }
    }

    fn usage(args: &[&str]) -> String {
        match p(args) {
            Err(UsageError(m)) => m,
            other => panic!("expected an error for {args:?}, got {other:?}"),
        }
    }

    fn help(args: &[&str]) -> String {
        match p(args) {
            Ok(Command::Help(text)) => text,
            other => panic!("expected help for {args:?}, got {other:?}"),
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn minimal() {
        let o = run(&["-n", "4", "prog"]);
        assert_eq!(o.nprocs, 4);
        assert_eq!(o.program, "prog");
        assert!(o.args.is_empty());
        assert!(o.tag_output);
        assert_eq!(o.transport, None);
        assert_eq!(o.timeout, None);
        assert_eq!(o.lanes, None);
        assert_eq!(o.store_bind, None);
        assert_eq!(o.store_addr, None);
    }

    #[test]
    fn spellings_of_n() {
        for args in [
            &["-n4", "x"][..],
            &["-n", "4", "x"],
            &["-np", "4", "x"],
            &["--np", "4", "x"],
            &["--np=4", "x"],
            &["--nproc", "4", "x"],
            &["--nproc=4", "x"],
        ] {
            assert_eq!(run(args).nprocs, 4, "{args:?}");
        }
        // -np is gwrun's only before PROGRAM, also after an option's value.
        let o = run(&["--store-addr", "-np", "-np", "2", "x", "-np", "3"]);
        assert_eq!(o.store_addr.as_deref(), Some("-np"));
        assert_eq!(o.nprocs, 2);
        assert_eq!(o.args, ["-np", "3"]);
        assert!(usage(&["-n", "-np", "x"]).contains("'-np' is not a positive whole number"));
    }

    #[test]
    fn all_options() {
        let o = run(&[
            "-n",
            "2",
            "--transport",
            "shm",
            "--timeout=2.5",
            "--lanes",
            "3",
            "--no-tag-output",
            "--store-bind",
            "0.0.0.0",
            "--store-addr=10.0.0.5:7000",
            "prog",
        ]);
        assert_eq!(o.transport, Some(TransportChoice::Shm));
        assert_eq!(o.timeout.as_deref(), Some("2.5"));
        assert_eq!(o.lanes, Some(3));
        assert!(!o.tag_output);
        assert_eq!(o.store_bind, Some("0.0.0.0:0".parse().unwrap()));
        assert_eq!(o.store_addr.as_deref(), Some("10.0.0.5:7000"));
        for t in TransportChoice::value_variants() {
            let o = run(&["-n", "1", "--transport", t.as_str(), "x"]);
            assert_eq!(o.transport, Some(*t));
        }
    }

    #[test]
    fn last_one_wins() {
        let o = run(&["-n", "2", "--no-tag-output", "--tag-output", "-n", "3", "x"]);
        assert_eq!(o.nprocs, 3);
        assert!(o.tag_output);
        let o = run(&["-n", "2", "--tag-output", "--no-tag-output", "x"]);
        assert!(!o.tag_output);
        let o = run(&["-n", "2", "--lanes", "2", "--lanes=5", "x"]);
        assert_eq!(o.lanes, Some(5));
    }

    #[test]
    fn options_after_program_belong_to_it() {
        let o = run(&["-n", "2", "prog", "-n", "5", "--help", "--", "x"]);
        assert_eq!(o.program, "prog");
        assert_eq!(o.args, ["-n", "5", "--help", "--", "x"]);
        let o = run(&["-n", "2", "prog", "--version", "--bogus", "-np"]);
        assert_eq!(o.args, ["--version", "--bogus", "-np"]);
    }

    #[test]
    fn double_dash_ends_options() {
        let o = run(&["-n", "2", "--", "--weird-program", "-a"]);
        assert_eq!(o.program, "--weird-program");
        assert_eq!(o.args, ["-a"]);
        assert!(usage(&["-n", "2", "--"]).contains("missing PROGRAM after '--'"));
        let o = run(&["-n", "2", "-", "x"]);
        assert_eq!((o.program.to_str(), o.args.len()), (Some("-"), 1));
    }

    #[test]
    fn help_and_version() {
        for args in [&["--help"][..], &["-h"], &["-n", "2", "--help", "prog"]] {
            assert!(help(args).contains(USAGE), "{args:?}");
        }
        // -h is as complete as --help, as it has always been.
        assert_eq!(help(&["-h"]), help(&["--help"]));
        assert_eq!(
            p(&["--version"]),
            Ok(Command::Version(format!(
                "gwrun {}\n",
                env!("CARGO_PKG_VERSION")
            )))
        );
        assert!(usage(&["-V"]).contains("unknown option '-V'"));
    }

    #[test]
    fn help_documents_every_flag_and_variable() {
        let text = help(&["--help"]);
        for word in [
            "-n N",
            "-np",
            "--np",
            "--nproc",
            "--transport",
            "--timeout",
            "--lanes",
            "--tag-output",
            "--no-tag-output",
            "--store-bind",
            "--store-addr",
            "--help",
            "--version",
            "--completions",
            "GW_RANK",
            "GW_WORLD_SIZE",
            "GW_LOCAL_RANK",
            "GW_LOCAL_SIZE",
            "GW_STORE ",
            "GW_TOKEN",
            "GW_JOB_ID",
            "GW_TRANSPORT",
            "GW_TIMEOUT",
            "GW_LANES",
            "GW_STORE_BIND",
            "OMP_NUM_THREADS",
            "exit status",
            "128+N",
            "auto|tcp|shm|ofi",
        ] {
            assert!(text.contains(word), "help lacks {word}\n{text}");
        }
    }

    #[test]
    fn bad_n() {
        assert!(usage(&["-n", "0", "x"]).contains("at least 1"));
        assert!(usage(&["-n", "-3", "x"]).contains("not a positive whole number"));
        assert!(usage(&["-n", "abc", "x"]).contains("'abc'"));
        assert!(usage(&["-n", "99999", "x"]).contains("more than"));
        assert_eq!(usage(&["-n"]), "-n requires a value");
        assert_eq!(usage(&["--nproc"]), "-n requires a value");
        assert!(usage(&["x"]).contains("missing -n"));
        assert!(usage(&[]).contains("missing -n"));
        assert!(usage(&["-n", "2"]).contains("missing PROGRAM to run"));
        assert_eq!(usage(&["-n", "2", ""]), "PROGRAM is empty");
    }

    #[test]
    fn bad_values() {
        assert_eq!(
            usage(&["-n", "2", "--transport", "udp", "x"]),
            "--transport: 'udp' is not one of auto, tcp, shm, ofi"
        );
        assert!(usage(&["-n", "2", "--transport", "shn", "x"]).contains("did you mean 'shm'"));
        assert!(usage(&["-n", "2", "--timeout", "-1", "x"]).contains("positive number"));
        assert!(usage(&["-n", "2", "--timeout", "inf", "x"]).contains("positive number"));
        assert!(usage(&["-n", "2", "--timeout=", "x"]).contains("positive number"));
        assert!(usage(&["-n", "2", "--lanes", "0", "x"]).contains("at least 1"));
        assert!(usage(&["-n", "2", "--store-bind", "nowhere", "x"]).contains("--store-bind"));
        assert!(usage(&["-n", "2", "--store-addr", "h:99999", "x"]).contains("port"));
        assert!(usage(&["-n", "2", "--store-addr", "a b", "x"]).contains("HOST or HOST:PORT"));
        assert_eq!(
            usage(&["-n", "2", "--tag-output=yes", "x"]),
            "--tag-output takes no value"
        );
        assert_eq!(
            usage(&["-n", "2", "--bogus", "x"]),
            "unknown option '--bogus' (see gwrun --help)"
        );
        assert!(usage(&["-x", "x"]).contains("unknown option"));
        assert!(usage(&["-n", "2", "--lane", "3", "x"]).contains("did you mean '--lanes'?"));
        assert!(usage(&["--completions", "bash", "-n", "2"]).contains("cannot be used"));
    }

    #[test]
    fn messages_are_one_line() {
        for args in [
            &["-n", "0", "x"][..],
            &["--bogus"],
            &[],
            &["-n", "2", "--lanes", "q", "x"],
            &["-n", "2", "--transport", "udp", "x"],
            &["--completions", "tcsh"],
            &["--completions", "bash", "-n", "2"],
        ] {
            let m = usage(args);
            assert!(!m.contains('\n'), "{args:?}: {m:?}");
            assert!(!m.starts_with("error:"), "{args:?}: {m:?}");
        }
    }

    #[test]
    fn non_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let weird = OsString::from_vec(vec![b'p', 0xff]);
        let o = match parse([
            OsString::from("-n"),
            OsString::from("1"),
            weird.clone(),
            weird.clone(),
        ]) {
            Ok(Command::Run(o)) => o,
            other => panic!("{other:?}"),
        };
        assert_eq!(o.program, weird);
        assert_eq!(o.args, std::slice::from_ref(&weird));
        let bad_opt = OsString::from_vec(vec![b'-', 0xff]);
        assert!(parse([bad_opt]).is_err());
        let bad_value = parse([OsString::from("-n"), weird, OsString::from("x")]);
        assert!(bad_value.is_err(), "{bad_value:?}");
    }

    #[test]
    fn completion_scripts() {
        assert_eq!(
            p(&["--completions", "bash"]),
            Ok(Command::Completions(Shell::Bash))
        );
        let script = String::from_utf8(completion_script(Shell::Bash)).expect("the script is text");
        for want in ["gwrun", "--store-bind", "--no-tag-output", "shm"] {
            assert!(script.contains(want), "completion lacks {want}");
        }
    }

    #[test]
    fn bind_addresses() {
        assert_eq!(
            parse_bind("127.0.0.1:5000"),
            Ok("127.0.0.1:5000".parse().unwrap())
        );
        assert_eq!(parse_bind("0.0.0.0"), Ok("0.0.0.0:0".parse().unwrap()));
        assert_eq!(parse_bind("::1"), Ok("[::1]:0".parse().unwrap()));
        assert_eq!(parse_bind("[::]:7"), Ok("[::]:7".parse().unwrap()));
        assert!(parse_bind("localhost:5").is_err());
    }

    #[test]
    fn advertising() {
        let b: SocketAddr = "0.0.0.0:4242".parse().unwrap();
        assert_eq!(advertised_store(None, b), "127.0.0.1:4242");
        assert_eq!(
            advertised_store(None, "10.1.2.3:9".parse().unwrap()),
            "10.1.2.3:9"
        );
        assert_eq!(advertised_store(None, "[::]:9".parse().unwrap()), "[::1]:9");
        assert_eq!(advertised_store(Some("10.0.0.1"), b), "10.0.0.1:4242");
        assert_eq!(advertised_store(Some("node7:80"), b), "node7:80");
        assert_eq!(advertised_store(Some("fe80::1"), b), "[fe80::1]:4242");
        assert_eq!(advertised_store(Some("[fe80::1]"), b), "[fe80::1]:4242");
        assert_eq!(advertised_store(Some("[fe80::1]:5"), b), "[fe80::1]:5");
    }

    #[test]
    fn paths() {
        assert!(is_path(OsStr::new("./x")));
        assert!(is_path(OsStr::new("/bin/sh")));
        assert!(!is_path(OsStr::new("sh")));
    }
}
