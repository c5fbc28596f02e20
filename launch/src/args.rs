//! gwrun's command line, parsed by hand.
//!
//! The grammar is launcher-shaped and tiny: options come first, the first
//! word that is not an option is PROGRAM, and everything after it belongs to
//! the program, even words that look like gwrun options (`gwrun -n 2 prog -n 5`
//! gives `-n 5` to `prog`). `--` ends gwrun's options explicitly. A general
//! argument-parsing crate would have to be configured to do exactly this and
//! would add a dependency to every build of the control plane, so we write the
//! forty lines ourselves and test them here.
//!
//! Parsing never panics on user input: every problem is a [`UsageError`] whose
//! text completes the sentence `gwrun: error: ...`.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// The largest `-n` accepted: a guard against a typo spawning a million
/// processes, not a limit of the protocol.
pub const MAX_RANKS: usize = 4096;

/// Value of `--transport`, passed to ranks as `GW_TRANSPORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    Auto,
    Tcp,
    Shm,
}

impl TransportChoice {
    /// The spelling ranks read from `GW_TRANSPORT`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Tcp => "tcp",
            TransportChoice::Shm => "shm",
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
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// `--help` / `-h`: print [`HELP`] and exit 0.
    Help,
    /// `--version`: print the version and exit 0.
    Version,
    /// Launch a job.
    Run(Options),
}

/// A command-line mistake; the message completes `gwrun: error: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// The text of `gwrun --help`.
pub const HELP: &str = "\
gwrun - launch a gradwire job on this host (in the style of mpirun/torchrun)

usage: gwrun -n N [OPTIONS] [--] PROGRAM [ARGS...]

gwrun starts a rendezvous store, runs N copies of PROGRAM (the ranks) with the
environment below, prefixes their output with the rank, forwards SIGINT and
SIGTERM to them, and if one rank fails, stops the others and names it.
Options must come before PROGRAM; everything after PROGRAM is passed to it.

options:
  -n N, -np N, --np N, --nproc N
                         number of ranks to start (1..=4096; required)
  --transport auto|tcp|shm
                         data-plane transport for the ranks (sets GW_TRANSPORT)
  --timeout SECS         deadline in seconds for each blocking collective call,
                         init included (sets GW_TIMEOUT); not a wall clock for
                         the job
  --lanes K              sockets per peer for TCP (K >= 1; sets GW_LANES)
  --tag-output           prefix every line a rank writes with \"[RANK] \" (default)
  --no-tag-output        pass rank output through untouched
  --store-bind ADDR      address the rendezvous store listens on: IP or IP:PORT
                         (default 127.0.0.1:0, i.e. loopback and a free port;
                         GW_STORE_BIND sets the default)
  --store-addr HOST[:PORT]
                         address given to ranks as GW_STORE when it differs from
                         the bound one (e.g. with --store-bind 0.0.0.0); without
                         a port, the bound port is used
  -h, --help             print this help and exit
  --version              print the version and exit
  --                     end of gwrun's options; the next word is PROGRAM
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
  GW_JOB_ID        per-job id (16 hex digits); shared-memory files are named
                   /dev/shm/gw-<GW_JOB_ID>-* and removed when the job ends
  GW_TRANSPORT, GW_TIMEOUT, GW_LANES
                   only when the matching option is given; otherwise whatever
                   gwrun inherited is passed on unchanged
Ranks run in one process group of their own with /dev/null as stdin, and are
killed if gwrun itself dies.

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
";

/// Parses gwrun's arguments (without `argv[0]`).
pub fn parse<I>(args: I) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = OsString>,
{
    let mut it = args.into_iter();
    let mut nprocs: Option<usize> = None;
    let mut transport = None;
    let mut timeout = None;
    let mut lanes = None;
    let mut tag_output = true;
    let mut store_bind = None;
    let mut store_addr = None;
    let mut program: Option<OsString> = None;

    while let Some(arg) = it.next() {
        let Some(text) = arg.to_str() else {
            if arg.as_encoded_bytes().starts_with(b"-") {
                return err(format!("unknown option '{}'", arg.to_string_lossy()));
            }
            program = Some(arg);
            break;
        };
        if text == "--" {
            match it.next() {
                Some(p) => program = Some(p),
                None => return err("missing PROGRAM after '--'"),
            }
            break;
        }
        if !text.starts_with('-') || text == "-" {
            program = Some(arg);
            break;
        }

        // Split "--name=value"; short options take "-nVALUE" or a separate word.
        let (name, inline): (&str, Option<&str>) = if text.starts_with("--") {
            match text.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (text, None),
            }
        } else if text == "-np" {
            ("-n", None)
        } else if text.len() > 2 && text.is_char_boundary(2) {
            (&text[..2], Some(&text[2..]))
        } else {
            (text, None)
        };

        let mut value = |opt: &str| -> Result<String, UsageError> {
            if let Some(v) = inline {
                return Ok(v.to_owned());
            }
            match it.next() {
                Some(v) => v.into_string().or_else(|v| {
                    err(format!(
                        "{opt}: value '{}' is not valid UTF-8",
                        v.to_string_lossy()
                    ))
                }),
                None => err(format!("{opt} requires a value")),
            }
        };

        match name {
            "-h" | "--help" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "-n" | "--np" | "--nproc" => nprocs = Some(parse_nprocs(&value(name)?)?),
            "--transport" => transport = Some(parse_transport(&value(name)?)?),
            "--timeout" => timeout = Some(parse_timeout(&value(name)?)?),
            "--lanes" => lanes = Some(parse_lanes(&value(name)?)?),
            "--store-bind" => {
                store_bind = Some(
                    parse_bind(&value(name)?)
                        .map_err(|e| UsageError(format!("--store-bind: {e}")))?,
                )
            }
            "--store-addr" => store_addr = Some(parse_store_addr(&value(name)?)?),
            "--tag-output" | "--no-tag-output" => {
                if inline.is_some() {
                    return err(format!("{name} takes no value"));
                }
                tag_output = name == "--tag-output";
            }
            _ => return err(format!("unknown option '{text}' (see gwrun --help)")),
        }
    }

    let Some(nprocs) = nprocs else {
        return err("missing -n N (number of ranks); see gwrun --help");
    };
    let Some(program) = program else {
        return err("missing PROGRAM to run; see gwrun --help");
    };
    if program.is_empty() {
        return err("PROGRAM is empty");
    }
    Ok(Command::Run(Options {
        nprocs,
        transport,
        timeout,
        lanes,
        tag_output,
        store_bind,
        store_addr,
        program,
        args: it.collect(),
    }))
}

fn parse_nprocs(v: &str) -> Result<usize, UsageError> {
    match v.trim().parse::<usize>() {
        Ok(0) => err("-n must be at least 1"),
        Ok(n) if n > MAX_RANKS => err(format!("-n {n} is more than {MAX_RANKS} ranks")),
        Ok(n) => Ok(n),
        Err(_) => err(format!("-n: '{v}' is not a positive whole number of ranks")),
    }
}

fn parse_transport(v: &str) -> Result<TransportChoice, UsageError> {
    match v {
        "auto" => Ok(TransportChoice::Auto),
        "tcp" => Ok(TransportChoice::Tcp),
        "shm" => Ok(TransportChoice::Shm),
        _ => err(format!("--transport: '{v}' is not one of auto, tcp, shm")),
    }
}

fn parse_timeout(v: &str) -> Result<String, UsageError> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(v.trim().to_owned()),
        _ => err(format!(
            "--timeout: '{v}' is not a positive number of seconds"
        )),
    }
}

fn parse_lanes(v: &str) -> Result<u32, UsageError> {
    match v.trim().parse::<u32>() {
        Ok(k) if k >= 1 => Ok(k),
        _ => err(format!(
            "--lanes: '{v}' is not a whole number of at least 1"
        )),
    }
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

fn parse_store_addr(v: &str) -> Result<String, UsageError> {
    let v = v.trim();
    if v.is_empty() || v.chars().any(char::is_whitespace) {
        return err(format!("--store-addr: '{v}' is not HOST or HOST:PORT"));
    }
    if let Some((_, port)) = split_port(v)
        && port.parse::<u16>().is_err()
    {
        return err(format!(
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
    }

    #[test]
    fn last_one_wins() {
        let o = run(&["-n", "2", "--no-tag-output", "--tag-output", "-n", "3", "x"]);
        assert_eq!(o.nprocs, 3);
        assert!(o.tag_output);
    }

    #[test]
    fn options_after_program_belong_to_it() {
        let o = run(&["-n", "2", "prog", "-n", "5", "--help", "--", "x"]);
        assert_eq!(o.program, "prog");
        assert_eq!(o.args, ["-n", "5", "--help", "--", "x"]);
    }

    #[test]
    fn double_dash_ends_options() {
        let o = run(&["-n", "2", "--", "--weird-program", "-a"]);
        assert_eq!(o.program, "--weird-program");
        assert_eq!(o.args, ["-a"]);
        assert!(usage(&["-n", "2", "--"]).contains("missing PROGRAM"));
    }

    #[test]
    fn help_and_version() {
        assert_eq!(p(&["--help"]), Ok(Command::Help));
        assert_eq!(p(&["-h"]), Ok(Command::Help));
        assert_eq!(p(&["-n", "2", "--help", "prog"]), Ok(Command::Help));
        assert_eq!(p(&["--version"]), Ok(Command::Version));
    }

    #[test]
    fn help_documents_every_flag_and_variable() {
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
            "exit status",
        ] {
            assert!(HELP.contains(word), "help lacks {word}");
        }
    }

    #[test]
    fn bad_n() {
        assert!(usage(&["-n", "0", "x"]).contains("at least 1"));
        assert!(usage(&["-n", "-3", "x"]).contains("not a positive whole number"));
        assert!(usage(&["-n", "abc", "x"]).contains("'abc'"));
        assert!(usage(&["-n", "99999", "x"]).contains("more than"));
        assert!(usage(&["-n"]).contains("requires a value"));
        assert!(usage(&["x"]).contains("missing -n"));
        assert!(usage(&[]).contains("missing -n"));
        assert!(usage(&["-n", "2"]).contains("missing PROGRAM"));
    }

    #[test]
    fn bad_values() {
        assert!(usage(&["-n", "2", "--transport", "udp", "x"]).contains("auto, tcp, shm"));
        assert!(usage(&["-n", "2", "--timeout", "-1", "x"]).contains("positive number"));
        assert!(usage(&["-n", "2", "--timeout", "inf", "x"]).contains("positive number"));
        assert!(usage(&["-n", "2", "--timeout=", "x"]).contains("positive number"));
        assert!(usage(&["-n", "2", "--lanes", "0", "x"]).contains("at least 1"));
        assert!(usage(&["-n", "2", "--store-bind", "nowhere", "x"]).contains("--store-bind"));
        assert!(usage(&["-n", "2", "--store-addr", "h:99999", "x"]).contains("port"));
        assert!(usage(&["-n", "2", "--tag-output=yes", "x"]).contains("takes no value"));
        assert!(usage(&["-n", "2", "--bogus", "x"]).contains("unknown option '--bogus'"));
        assert!(usage(&["-x", "x"]).contains("unknown option"));
    }

    #[test]
    fn messages_are_one_line() {
        for args in [
            &["-n", "0", "x"][..],
            &["--bogus"],
            &[],
            &["-n", "2", "--lanes", "q", "x"],
        ] {
            assert!(!usage(args).contains('\n'));
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
        assert_eq!(o.args, [weird]);
        let bad_opt = OsString::from_vec(vec![b'-', 0xff]);
        assert!(parse([bad_opt]).is_err());
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
