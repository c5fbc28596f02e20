//! The command lines of `gwjob submit`, `status` and `cancel`, parsed into
//! plain data before anything talks to the server, so mistakes exit 2 with a
//! message and nothing submitted.
//!
//! clap parses the flags ([`SubmitArgs`], [`StatusArgs`], [`CancelArgs`], each
//! a subcommand of [`crate::cli::command::Gwjob`]); the rules that span
//! several of them (the global batch given twice, the default batch bounds)
//! are applied by [`SubmitArgs::request`].

use crate::cli::flags::number;
use crate::cli::sim_args::{GenTrace, Simulate};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueHint};
use gw_jobapi::types::{BatchChange, DeviceThroughput, PlannerKind, Role, SubmitRequest};
use std::path::PathBuf;

/// Where the server is and how to sign requests (shared by all three).
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct Conn {
    /// The job server (default: $GW_JOB_SERVER_URL, else http://127.0.0.1:7070)
    #[arg(long, value_name = "URL", allow_hyphen_values = true, value_hint = ValueHint::Url)]
    pub server: Option<String>,
    /// File holding a submit token or the admin token (default:
    /// $GW_ADMIN_TOKEN)
    #[arg(long = "token-file", value_name = "PATH", allow_hyphen_values = true)]
    pub token_file: Option<PathBuf>,
}

/// A client command, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Client {
    Submit(Conn, SubmitRequest),
    Status {
        conn: Conn,
        job: Option<String>,
        json: bool,
    },
    Cancel(Conn, String),
    /// `node-token` or `token`: issue a token, printed or written to `out`.
    Issue {
        conn: Conn,
        role: Role,
        name: String,
        out: Option<PathBuf>,
    },
    /// `node-token --revoke` or `token --revoke`.
    Revoke {
        conn: Conn,
        role: Role,
        name: String,
    },
    /// `simulate`: runs offline, no server.
    Simulate(Simulate),
    /// `gen-trace`: runs offline, no server.
    GenTrace(GenTrace),
}

impl Client {
    /// The subcommand's name, which prefixes its error lines.
    pub fn name(&self) -> &'static str {
        match self {
            Client::Submit(..) => "submit",
            Client::Status { .. } => "status",
            Client::Cancel(..) => "cancel",
            Client::Simulate(..) => "simulate",
            Client::GenTrace(..) => "gen-trace",
            Client::Issue { role, .. } | Client::Revoke { role, .. } => match role {
                Role::Node => "node-token",
                _ => "token",
            },
        }
    }
}

/// clap would write `[OPTIONS] [PROGRAM]...`; the old help's synopsis says
/// which options are required and where PROGRAM goes.
pub const SUBMIT_USAGE: &str = "\
gwjob submit --workers N --global-batch B [--batch-bounds LO:HI]
                    [--batch-schedule B0@0,B1@S1,...] [--planner optperf|even]
                    [--name NAME] [--env KEY=VALUE]... [--steps N]
                    [--throughput TYPE=STEPS_PER_S,...] [--server URL]
                    [--token-file PATH] -- PROGRAM [ARGS...]";

pub const SUBMIT_AFTER_HELP: &str = "\
Everything after PROGRAM (or after '--') is passed to the program untouched.
submit prints the new job's id.";

/// `gwjob submit`'s flags as typed.
///
/// `--workers` and the global batch are checked by [`SubmitArgs::request`],
/// not by clap, so that each missing piece is named in gwjob's words and the
/// global batch may come from `--batch-schedule` instead.
#[derive(Args, Clone, Debug)]
pub struct SubmitArgs {
    /// Number of ranks (world size)
    #[arg(long, value_name = "N", value_parser = number::<u32>(), allow_hyphen_values = true)]
    workers: Option<u32>,

    /// Samples per step over all ranks (may instead be given as B@0 in
    /// --batch-schedule)
    #[arg(
        long = "global-batch",
        value_name = "B",
        value_parser = number::<u64>(),
        allow_hyphen_values = true
    )]
    global_batch: Option<u64>,

    /// Bounds on every rank's local batch (default 1:B, with B the largest
    /// global batch of the schedule)
    #[arg(
        long = "batch-bounds",
        value_name = "LO:HI",
        value_parser = parse_bounds,
        allow_hyphen_values = true
    )]
    batch_bounds: Option<(u64, u64)>,

    /// Global batch changes, B@STEP separated by commas: from STEP on the
    /// global batch is B
    #[arg(
        long = "batch-schedule",
        value_name = "LIST",
        value_parser = parse_schedule,
        allow_hyphen_values = true
    )]
    batch_schedule: Option<Schedule>,

    /// Optperf (local batches fitted to each rank's speed) or even (equal
    /// shares)
    #[arg(
        long,
        value_name = "KIND",
        default_value = "optperf",
        value_parser = planner_parser(),
        allow_hyphen_values = true
    )]
    planner: PlannerKind,

    /// A label shown by status
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    name: Option<String>,

    /// Extra environment for the workers (repeatable)
    #[arg(
        long,
        value_name = "KEY=VALUE",
        value_parser = parse_env,
        allow_hyphen_values = true
    )]
    env: Vec<(String, String)>,

    /// Steps the job runs in all (a server with a scheduling policy needs
    /// it)
    #[arg(
        long,
        value_name = "N",
        value_parser = number::<u64>(),
        allow_hyphen_values = true
    )]
    steps: Option<u64>,

    /// The job's speed per device type, TYPE=STEPS_PER_S separated by
    /// commas (the scheduling policy's T[j][k]; a type not listed is one the
    /// job cannot use; default: the same speed on every type)
    #[arg(
        long,
        value_name = "LIST",
        value_parser = parse_throughput,
        allow_hyphen_values = true
    )]
    throughput: Option<Throughputs>,

    #[command(flatten)]
    conn: Conn,

    /// The program the workers run, and its arguments
    #[arg(
        value_name = "PROGRAM",
        trailing_var_arg = true,
        value_hint = ValueHint::CommandWithArguments
    )]
    program: Vec<String>,
}

/// `--batch-schedule`'s value: one option holding a list, so that a repeated
/// `--batch-schedule` replaces the list as it always has, instead of adding
/// to it (clap appends when the field itself is a `Vec`).
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule(Vec<BatchChange>);

/// `--throughput`'s value, one list for the same reason as [`Schedule`].
#[derive(Clone, Debug, PartialEq)]
pub struct Throughputs(Vec<DeviceThroughput>);

impl SubmitArgs {
    /// The request these flags describe, or what is missing or inconsistent.
    pub fn request(self) -> Result<Client, String> {
        let workers = self.workers.ok_or("--workers N is required")?;
        let mut global = self.global_batch;
        let mut schedule = self.batch_schedule.map(|s| s.0).unwrap_or_default();
        if let Some(at0) = schedule.iter().find(|c| c.step == 0) {
            match global {
                Some(g) if g != at0.global_batch => {
                    return Err(format!(
                        "--global-batch {g} disagrees with {}@0 in --batch-schedule",
                        at0.global_batch
                    ));
                }
                _ => global = Some(at0.global_batch),
            }
        }
        schedule.retain(|c| c.step != 0);
        let global = global.ok_or("--global-batch B (or B@0 in --batch-schedule) is required")?;
        let largest = schedule
            .iter()
            .map(|c| c.global_batch)
            .fold(global, u64::max);
        let (batch_lo, batch_hi) = self.batch_bounds.unwrap_or((1, largest.max(1)));
        let mut program = self.program.into_iter();
        let prog = program.next().ok_or("PROGRAM is required (after '--')")?;
        Ok(Client::Submit(
            self.conn,
            SubmitRequest {
                name: self.name,
                workers,
                global_batch: global,
                batch_lo,
                batch_hi,
                schedule,
                planner: self.planner,
                program: prog,
                args: program.collect(),
                env: self.env,
                steps: self.steps,
                throughput: self.throughput.map(|t| t.0).unwrap_or_default(),
            },
        ))
    }
}

/// `gwjob status`'s flags.
#[derive(Args, Clone, Debug)]
pub struct StatusArgs {
    /// Show this job's ranks, step times and recent events instead of the
    /// list of jobs
    #[arg(value_name = "JOB")]
    job: Option<String>,

    /// Print the server's JSON reply instead of a table
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    conn: Conn,
}

impl StatusArgs {
    pub fn request(self) -> Client {
        Client::Status {
            conn: self.conn,
            job: self.job,
            json: self.json,
        }
    }
}

/// `gwjob cancel`'s flags.
#[derive(Args, Clone, Debug)]
pub struct CancelArgs {
    /// The job to cancel
    #[arg(value_name = "JOB")]
    job: String,

    #[command(flatten)]
    conn: Conn,
}

impl CancelArgs {
    pub fn request(self) -> Client {
        Client::Cancel(self.conn, self.job)
    }
}

fn planner_parser() -> impl TypedValueParser<Value = PlannerKind> {
    PossibleValuesParser::new(["optperf", "even"]).map(|s| match s.as_str() {
        "even" => PlannerKind::Even,
        _ => PlannerKind::Optperf,
    })
}

fn parse_env(kv: &str) -> Result<(String, String), String> {
    let (k, v) = kv
        .split_once('=')
        .ok_or_else(|| format!("--env needs KEY=VALUE, not {kv:?}"))?;
    Ok((k.to_owned(), v.to_owned()))
}

fn parse_throughput(s: &str) -> Result<Throughputs, String> {
    s.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let bad = || format!("--throughput entries are TYPE=STEPS_PER_S, not {e:?}");
            let (k, v) = e.split_once('=').ok_or_else(bad)?;
            let steps_per_s: f64 = v.trim().parse().map_err(|_| bad())?;
            if k.trim().is_empty() || !steps_per_s.is_finite() || steps_per_s < 0.0 {
                return Err(bad());
            }
            Ok(DeviceThroughput {
                device_type: k.trim().to_owned(),
                steps_per_s,
            })
        })
        .collect::<Result<Vec<_>, String>>()
        .map(Throughputs)
}

fn parse_bounds(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--batch-bounds needs LO:HI (two numbers), not {s:?}");
    let (lo, hi) = s.split_once(':').ok_or_else(bad)?;
    Ok((
        lo.trim().parse().map_err(|_| bad())?,
        hi.trim().parse().map_err(|_| bad())?,
    ))
}

fn parse_schedule(s: &str) -> Result<Schedule, String> {
    s.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let bad = || format!("--batch-schedule entries are B@STEP, not {e:?}");
            let (b, step) = e.split_once('@').ok_or_else(bad)?;
            Ok(BatchChange {
                step: step.trim().parse().map_err(|_| bad())?,
                global_batch: b.trim().parse().map_err(|_| bad())?,
            })
        })
        .collect::<Result<_, String>>()
        .map(Schedule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::command::{Gwjob, parse};

    fn p(cmd: &str, a: &[&str]) -> Result<Client, String> {
        let args = std::iter::once(cmd)
            .chain(a.iter().copied())
            .map(Into::into);
        match parse(args, None) {
            Ok(Gwjob::Client(c)) => Ok(c),
            Ok(other) => panic!("{cmd} {a:?}: {other:?}"),
            Err(e) => {
                assert_eq!(e.command, format!("gwjob {cmd}"));
                Err(e.message)
            }
        }
    }

    fn submit(a: &[&str]) -> (Conn, SubmitRequest) {
        match p("submit", a) {
            Ok(Client::Submit(conn, r)) => (conn, r),
            other => panic!("{a:?}: {other:?}"),
        }
    }

    #[test]
    fn submit_with_everything() {
        let (conn, r) = submit(&[
            "--workers",
            "4",
            "--batch-schedule",
            "64@0,128@100",
            "--batch-bounds",
            "2:64",
            "--planner=even",
            "--env",
            "A=b=c",
            "--server",
            "http://s:1",
            "--name",
            "x",
            "--steps",
            "500",
            "--throughput",
            "v100=3, k80=0.5",
            "--",
            "train",
            "--lr",
            "0.1",
        ]);
        assert_eq!(conn.server.as_deref(), Some("http://s:1"));
        assert_eq!(
            (r.workers, r.global_batch, r.batch_lo, r.batch_hi),
            (4, 64, 2, 64)
        );
        assert_eq!(
            r.schedule,
            vec![BatchChange {
                step: 100,
                global_batch: 128
            }]
        );
        assert_eq!(r.planner, PlannerKind::Even);
        assert_eq!(r.env, vec![("A".to_owned(), "b=c".to_owned())]);
        assert_eq!(r.steps, Some(500));
        let t: Vec<(&str, f64)> = r
            .throughput
            .iter()
            .map(|t| (t.device_type.as_str(), t.steps_per_s))
            .collect();
        assert_eq!(t, [("v100", 3.0), ("k80", 0.5)]);
        assert_eq!(
            (r.program.as_str(), r.args.clone()),
            ("train", vec!["--lr".to_owned(), "0.1".to_owned()])
        );
    }

    #[test]
    fn submit_defaults() {
        let (conn, r) = submit(&["--workers", "2", "--global-batch", "8", "prog", "-x"]);
        assert_eq!(conn, Conn::default());
        assert_eq!(
            (r.batch_lo, r.batch_hi, r.planner),
            (1, 8, PlannerKind::Optperf)
        );
        assert_eq!((r.name, r.env), (None, vec![]));
        assert_eq!((r.steps, r.throughput), (None, vec![]));
        assert_eq!(r.args, vec!["-x"]);
        // The schedule's largest batch bounds the local batches by default.
        let (_, r) = submit(&[
            "--workers=2",
            "--global-batch=8",
            "--batch-schedule=16@3",
            "p",
        ]);
        assert_eq!((r.batch_lo, r.batch_hi), (1, 16));
    }

    #[test]
    fn repeats_and_values_that_look_like_options() {
        let (conn, r) = submit(&[
            "--workers",
            "2",
            "--workers",
            "3",
            "--global-batch",
            "8",
            "--env",
            "A=1",
            "--env=B=2",
            "--batch-schedule",
            "9@5",
            "--batch-schedule",
            "10@6",
            "--name",
            "--odd",
            "--token-file",
            "t",
            "p",
            "--workers",
            "9",
        ]);
        assert_eq!(r.workers, 3);
        assert_eq!(r.env, [("A".into(), "1".into()), ("B".into(), "2".into())]);
        assert_eq!(
            r.schedule,
            [BatchChange {
                step: 6,
                global_batch: 10
            }]
        );
        assert_eq!(r.name.as_deref(), Some("--odd"));
        assert_eq!(conn.token_file, Some(PathBuf::from("t")));
        assert_eq!(r.args, ["--workers", "9"]);
    }

    #[test]
    fn status_and_cancel() {
        assert_eq!(
            p("status", &["--json"]),
            Ok(Client::Status {
                conn: Conn::default(),
                job: None,
                json: true
            })
        );
        assert_eq!(
            p("status", &["--server", "http://h:1", "j1"]),
            Ok(Client::Status {
                conn: Conn {
                    server: Some("http://h:1".into()),
                    token_file: None
                },
                job: Some("j1".into()),
                json: false
            })
        );
        assert_eq!(
            p("cancel", &["j2", "--token-file=f"]),
            Ok(Client::Cancel(
                Conn {
                    server: None,
                    token_file: Some("f".into())
                },
                "j2".into()
            ))
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (cmd, a, want) in [
            ("submit", &["--global-batch", "8", "p"][..], "--workers"),
            ("submit", &["--workers", "2", "p"][..], "--global-batch"),
            (
                "submit",
                &["--workers", "2", "--global-batch", "8"][..],
                "PROGRAM",
            ),
            (
                "submit",
                &[
                    "--workers",
                    "2",
                    "--global-batch",
                    "8",
                    "--planner",
                    "fast",
                    "p",
                ][..],
                "optperf or even",
            ),
            (
                "submit",
                &[
                    "--workers",
                    "2",
                    "--global-batch",
                    "8",
                    "--batch-bounds",
                    "3",
                    "p",
                ][..],
                "LO:HI",
            ),
            (
                "submit",
                &["--workers", "2", "--batch-schedule", "8@x", "p"][..],
                "B@STEP",
            ),
            (
                "submit",
                &[
                    "--workers",
                    "2",
                    "--global-batch",
                    "8",
                    "--batch-schedule",
                    "9@0",
                    "p",
                ][..],
                "disagrees",
            ),
            ("submit", &["--workers", "x"][..], "needs a number"),
            ("submit", &["--env", "A"][..], "KEY=VALUE"),
            (
                "submit",
                &["--throughput", "v100"][..],
                "TYPE=STEPS_PER_S, not \"v100\"",
            ),
            (
                "submit",
                &["--throughput", "v100=-1"][..],
                "TYPE=STEPS_PER_S",
            ),
            ("submit", &["--throughput", "=2"][..], "TYPE=STEPS_PER_S"),
            ("submit", &["--steps", "x"][..], "needs a number"),
            ("submit", &["--json"][..], "unknown option --json"),
            ("submit", &["--workers"][..], "--workers needs a value"),
            ("status", &["a", "b"][..], "at most one"),
            ("status", &["--workers", "2"][..], "unknown option"),
            ("status", &["--json=1"][..], "takes no value"),
            ("cancel", &[][..], "exactly one"),
            ("cancel", &["a", "b"][..], "exactly one"),
        ] {
            let e = p(cmd, a).expect_err("a mistake");
            assert!(e.contains(want), "{cmd} {a:?}: {e}");
            assert!(!e.contains('\n'), "{cmd} {a:?}: {e}");
        }
        assert_eq!(
            p("submit", &["--planner", "fast"]).expect_err("a bad planner"),
            r#"--planner must be optperf or even, not "fast""#
        );
        assert_eq!(
            p("status", &["--workers", "2"]).expect_err("not a status flag"),
            "unknown option --workers for gwjob status"
        );
    }
}
