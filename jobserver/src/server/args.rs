//! `gwjob serve`'s command line: clap parses the flags ([`ServeArgs`], the
//! `serve` subcommand of [`crate::cli::command::Gwjob`]); [`ServeArgs::options`]
//! checks the ones that depend on each other (the heartbeat must be shorter
//! than the node timeout) before the database is opened, so a mistake exits
//! 2 having touched nothing.

use crate::cli::flags::number;
use crate::server::http::Limits;
use clap::{Args, ValueHint};
use std::path::PathBuf;
use std::time::Duration;

pub const ABOUT: &str = "Run the gradwire job server";

/// clap would write `[OPTIONS]`; `--db` is required.
pub const USAGE: &str = "gwjob serve --db PATH [--listen ADDR] [OPTIONS]";

pub const AFTER_HELP: &str = "\
Keeps nodes, jobs, plans and step reports in the SQLite database PATH and
serves the HTTP/JSON API documented in docs/jobserver.md. Restarting on the
same database resumes every running job where it was.

On start it prints 'gwjob: listening on http://HOST:PORT'.";

/// `gwjob serve`'s flags as typed; `--db` is checked by
/// [`ServeArgs::options`] so that its absence is reported in gwjob's words.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Database file (created if missing; required)
    #[arg(long, value_name = "PATH", allow_hyphen_values = true, value_hint = ValueHint::FilePath)]
    db: Option<PathBuf>,

    /// Address to serve on (port 0 picks a free one)
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7070",
        allow_hyphen_values = true
    )]
    listen: String,

    /// File holding the admin token (else GW_ADMIN_TOKEN, else <db
    /// dir>/admin.token, created on first start)
    #[arg(
        long = "admin-token-file",
        value_name = "PATH",
        allow_hyphen_values = true,
        value_hint = ValueHint::FilePath
    )]
    admin_token_file: Option<PathBuf>,

    /// A node silent this long is lost
    #[arg(
        long = "node-timeout",
        value_name = "SECS",
        default_value = "10",
        value_parser = number::<f64>(),
        allow_hyphen_values = true
    )]
    node_timeout: f64,

    /// Heartbeat interval agents are told (default: a quarter of the node
    /// timeout, at most 1000)
    #[arg(
        long = "heartbeat-ms",
        value_name = "MS",
        value_parser = number::<u64>(),
        allow_hyphen_values = true
    )]
    heartbeat_ms: Option<u64>,

    /// URL given to workers as GW_JOB_SERVER (default: the URL the agent used
    /// to reach this server)
    #[arg(long, value_name = "URL", allow_hyphen_values = true, value_hint = ValueHint::Url)]
    advertise: Option<String>,

    /// HTTP worker threads
    #[arg(
        long,
        value_name = "N",
        default_value = "4",
        value_parser = number::<usize>(),
        allow_hyphen_values = true
    )]
    threads: usize,

    /// Open connections allowed, all clients together
    #[arg(long = "max-connections", value_name = "N", default_value = "1024",
          value_parser = number::<usize>(), allow_hyphen_values = true)]
    max_connections: usize,

    /// Open connections allowed from one IP address
    #[arg(long = "max-connections-per-peer", value_name = "N", default_value = "256",
          value_parser = number::<usize>(), allow_hyphen_values = true)]
    max_per_peer: usize,

    /// Time a client has to send a request's headers (and the longest a
    /// keep-alive connection may wait for its next request)
    #[arg(long = "header-timeout", value_name = "SECS", default_value = "10",
          value_parser = number::<f64>(), allow_hyphen_values = true)]
    header_timeout: f64,

    /// Time a client has to send a request's body
    #[arg(long = "body-timeout", value_name = "SECS", default_value = "10",
          value_parser = number::<f64>(), allow_hyphen_values = true)]
    body_timeout: f64,

    /// A connection on which nothing moved for this long is closed
    #[arg(long = "stall-timeout", value_name = "SECS", default_value = "30",
          value_parser = number::<f64>(), allow_hyphen_values = true)]
    stall_timeout: f64,

    /// Cluster scheduling policy run at every round boundary: fifo, gavel,
    /// gavel-makespan or hadar (default: none, each job placed as soon as
    /// it fits and never preempted)
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    policy: Option<String>,

    /// Seconds between the policy's rounds
    #[arg(long = "round", value_name = "SECS", default_value = "60",
          value_parser = number::<f64>(), allow_hyphen_values = true)]
    round: f64,

    /// With --policy: steps measured on each device type for a job
    /// submitted without --throughput (0: none, such a job counts as equally
    /// fast on every type)
    #[arg(long = "profile-steps", value_name = "N",
          default_value_t = crate::server::profile::DEFAULT_STEPS,
          value_parser = number::<u64>(), allow_hyphen_values = true)]
    profile_steps: u64,
}

/// More profiling steps than this would be most of a job.
const MAX_PROFILE_STEPS: u64 = 10_000;

/// The scheduling policy and its round length.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyOptions {
    pub name: String,
    pub round: Duration,
    /// Steps measured per device type when profiling a job (0: no profiling).
    pub profile_steps: u64,
}

/// What `gwjob serve` runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeOptions {
    pub db: PathBuf,
    pub listen: String,
    pub token_file: Option<PathBuf>,
    pub node_timeout: Duration,
    pub heartbeat_ms: u64,
    pub advertise: Option<String>,
    pub threads: usize,
    pub limits: Limits,
    pub policy: Option<PolicyOptions>,
}

impl ServeArgs {
    /// The server's settings, or the first one that is missing or wrong.
    pub fn options(self) -> Result<ServeOptions, String> {
        let db = self.db.ok_or("--db PATH is required")?;
        let timeout = self.node_timeout;
        if !(timeout.is_finite() && timeout > 0.0 && timeout <= 86_400.0) {
            return Err(format!(
                "--node-timeout must be a positive number of seconds (got {timeout})"
            ));
        }
        let node_timeout = Duration::from_secs_f64(timeout);
        let default_hb = (node_timeout.as_millis() / 4).clamp(1, 1000) as u64;
        let heartbeat_ms = self.heartbeat_ms.unwrap_or(default_hb);
        if heartbeat_ms == 0 || u128::from(heartbeat_ms) >= node_timeout.as_millis() {
            return Err(format!(
                "--heartbeat-ms {heartbeat_ms} must be positive and below the node timeout"
            ));
        }
        if !(1..=64).contains(&self.threads) {
            return Err(format!("--threads must be 1..=64 (got {})", self.threads));
        }
        let limits = Limits {
            max_connections: count("--max-connections", self.max_connections)?,
            max_per_peer: count("--max-connections-per-peer", self.max_per_peer)?,
            header_timeout: secs("--header-timeout", self.header_timeout)?,
            body_timeout: secs("--body-timeout", self.body_timeout)?,
            stall_timeout: secs("--stall-timeout", self.stall_timeout)?,
            ..Limits::default()
        };
        if let Some(a) = &self.advertise
            && !(a.starts_with("http://") || a.starts_with("https://"))
        {
            return Err(format!("--advertise {a:?} must be an http:// URL"));
        }
        let policy = match self.policy {
            Some(name) => {
                crate::server::rounds::live_policy(&name)?;
                if !(self.round.is_finite() && (0.1..=86_400.0).contains(&self.round)) {
                    return Err(format!(
                        "--round must be 0.1..=86400 seconds (got {})",
                        self.round
                    ));
                }
                if self.profile_steps > MAX_PROFILE_STEPS {
                    return Err(format!(
                        "--profile-steps must be 0..={MAX_PROFILE_STEPS} (got {})",
                        self.profile_steps
                    ));
                }
                Some(PolicyOptions {
                    name,
                    round: Duration::from_secs_f64(self.round),
                    profile_steps: self.profile_steps,
                })
            }
            None => None,
        };
        Ok(ServeOptions {
            db,
            policy,
            listen: self.listen,
            token_file: self.admin_token_file,
            node_timeout,
            heartbeat_ms,
            advertise: self.advertise,
            threads: self.threads,
            limits,
        })
    }
}

fn count(flag: &str, n: usize) -> Result<usize, String> {
    if (1..=1 << 20).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{flag} must be 1..=1048576 (got {n})"))
    }
}

fn secs(flag: &str, s: f64) -> Result<Duration, String> {
    if s.is_finite() && (0.01..=3600.0).contains(&s) {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!("{flag} must be 0.01..=3600 seconds (got {s})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::command::{Gwjob, parse};

    fn p(a: &[&str]) -> Result<ServeOptions, String> {
        let args = std::iter::once("serve")
            .chain(a.iter().copied())
            .map(Into::into);
        match parse(args, None) {
            Ok(Gwjob::Serve(o)) => Ok(o),
            Ok(other) => panic!("{a:?}: {other:?}"),
            Err(e) => {
                assert_eq!(e.command, "gwjob serve");
                Err(e.message)
            }
        }
    }

    #[test]
    fn defaults_and_options() {
        let o = p(&["--db", "x.db"]).expect("minimal");
        assert_eq!(o.db, PathBuf::from("x.db"));
        assert_eq!(o.listen, "127.0.0.1:7070");
        assert_eq!(o.node_timeout, Duration::from_secs(10));
        assert_eq!(o.heartbeat_ms, 1000);
        assert_eq!((o.token_file, o.advertise, o.threads), (None, None, 4));
        let o = p(&[
            "--db=x.db",
            "--listen",
            "127.0.0.1:0",
            "--node-timeout",
            "0.4",
            "--advertise",
            "http://h:1",
            "--admin-token-file",
            "t",
            "--threads=8",
        ])
        .expect("every option");
        assert_eq!(o.listen, "127.0.0.1:0");
        assert_eq!(o.heartbeat_ms, 100);
        assert_eq!(o.advertise.as_deref(), Some("http://h:1"));
        assert_eq!(o.token_file, Some(PathBuf::from("t")));
        assert_eq!(o.threads, 8);
        let o = p(&["--db", "x", "--heartbeat-ms", "250"]).expect("heartbeat");
        assert_eq!(o.heartbeat_ms, 250);
        assert_eq!(o.policy, None);
        let o = p(&["--db", "x", "--policy", "gavel"]).expect("policy");
        assert_eq!(
            o.policy,
            Some(PolicyOptions {
                name: "gavel".into(),
                round: Duration::from_secs(60),
                profile_steps: crate::server::profile::DEFAULT_STEPS,
            })
        );
        let o = p(&[
            "--db",
            "x",
            "--policy",
            "hadar",
            "--round",
            "0.5",
            "--profile-steps",
            "0",
        ])
        .expect("policy options");
        let pol = o.policy.expect("a policy");
        assert_eq!(
            (pol.round, pol.profile_steps),
            (Duration::from_millis(500), 0)
        );
        match parse(["serve", "--help"].map(Into::into), None) {
            Ok(Gwjob::Print(text)) => {
                for want in [USAGE, "--node-timeout <SECS>", "gwjob: listening on"] {
                    assert!(text.contains(want), "lacks {want:?}: {text}");
                }
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mistakes() {
        for (a, want) in [
            (&["--listen", "x"][..], "--db PATH is required"),
            (&["--db", "x", "--node-timeout", "0"][..], "--node-timeout"),
            (
                &["--db", "x", "--node-timeout", "-1"][..],
                "positive number",
            ),
            (&["--db", "x", "--node-timeout", "s"][..], "needs a number"),
            (&["--db", "x", "--frob"][..], "unknown option --frob"),
            (&["--db", "x", "extra"][..], "unexpected argument"),
            (
                &["--db", "x", "--heartbeat-ms", "20000"][..],
                "--heartbeat-ms",
            ),
            (&["--db", "x", "--threads", "0"][..], "1..=64"),
            (&["--db", "x", "--advertise", "h:1"][..], "http://"),
            (&["--db"][..], "needs a value"),
            (
                &["--db", "x", "--policy", "gavel", "--round", "0.01"][..],
                "--round must be 0.1..=86400",
            ),
            (
                &["--db", "x", "--policy", "gavel", "--profile-steps", "10001"][..],
                "--profile-steps must be 0..=10000",
            ),
            (&["--db", "x", "--policy", "lottery"][..], "unknown policy"),
        ] {
            let e = p(a).expect_err("a mistake");
            assert!(e.contains(want), "{a:?}: {e}");
        }
    }
}
