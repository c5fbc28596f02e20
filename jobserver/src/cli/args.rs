//! The command lines of `gwjob submit`, `status` and `cancel`, parsed into
//! plain data before anything talks to the server, so mistakes exit 2 with a
//! message and nothing submitted.

use crate::cli::flags::{Flags, Item};
use gw_jobapi::types::{BatchChange, PlannerKind, SubmitRequest};
use std::path::PathBuf;

/// Where the server is and how to sign requests (shared by all three).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conn {
    /// `--server URL` (else `GW_JOB_SERVER_URL`).
    pub server: Option<String>,
    /// `--token-file PATH` (else `GW_ADMIN_TOKEN`).
    pub token_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Cli {
    Help,
    Submit(Conn, SubmitRequest),
    Status {
        conn: Conn,
        job: Option<String>,
        json: bool,
    },
    Cancel(Conn, String),
}

pub const HELP: &str = "\
usage:
  gwjob submit --workers N --global-batch B [--batch-bounds LO:HI]
               [--batch-schedule B0@0,B1@S1,...] [--planner optperf|even]
               [--name NAME] [--env KEY=VALUE]... [CONN] -- PROGRAM [ARGS...]
  gwjob status [JOB] [--json] [CONN]
  gwjob cancel JOB [CONN]

submit options:
  --workers N            number of ranks (world size)
  --global-batch B       samples per step over all ranks (may instead be
                         given as B@0 in --batch-schedule)
  --batch-bounds LO:HI   bounds on every rank's local batch (default 1:B,
                         with B the largest global batch of the schedule)
  --batch-schedule LIST  global batch changes, B@STEP separated by commas:
                         from STEP on the global batch is B
  --planner KIND         optperf (default: local batches fitted to each
                         rank's speed) or even (equal shares)
  --name NAME            a label shown by status
  --env KEY=VALUE        extra environment for the workers (repeatable)
submit prints the new job's id.

CONN:
  --server URL           the job server (default: $GW_JOB_SERVER_URL, else
                         http://127.0.0.1:7070)
  --token-file PATH      file holding the admin token (default: $GW_ADMIN_TOKEN)
";

/// Parses `gwjob CMD ARGS` where `cmd` is submit, status or cancel.
pub fn parse(cmd: &str, args: Vec<String>) -> Result<Cli, String> {
    let mut f = Flags::new(args);
    let mut conn = Conn::default();
    let mut positionals = Vec::new();
    let mut json = false;
    let mut workers: Option<u32> = None;
    let mut global: Option<u64> = None;
    let mut bounds: Option<(u64, u64)> = None;
    let mut schedule: Vec<BatchChange> = Vec::new();
    let mut planner = PlannerKind::Optperf;
    let mut name = None;
    let mut env = Vec::new();
    let mut program: Option<Vec<String>> = None;
    let submit = cmd == "submit";
    while let Some(item) = f.next_item() {
        let (flag, inline) = match item {
            Item::Flag(n, v) => (n, v),
            Item::Positional(p) if submit => {
                let mut rest = vec![p];
                rest.extend(f.rest());
                program = Some(rest);
                break;
            }
            Item::Positional(p) => {
                positionals.push(p);
                continue;
            }
            Item::End if submit => {
                program = Some(f.rest());
                break;
            }
            Item::End => return Err("unexpected '--'".into()),
        };
        match (flag.as_str(), submit) {
            ("-h" | "--help", _) => return Ok(Cli::Help),
            ("--server", _) => conn.server = Some(f.value(&flag, inline)?),
            ("--token-file", _) => conn.token_file = Some(f.value(&flag, inline)?.into()),
            ("--json", false) if cmd == "status" => json = true,
            ("--workers", true) => workers = Some(f.number(&flag, inline)?),
            ("--global-batch", true) => global = Some(f.number(&flag, inline)?),
            ("--batch-bounds", true) => bounds = Some(parse_bounds(&f.value(&flag, inline)?)?),
            ("--batch-schedule", true) => schedule = parse_schedule(&f.value(&flag, inline)?)?,
            ("--planner", true) => {
                planner = match f.value(&flag, inline)?.as_str() {
                    "optperf" => PlannerKind::Optperf,
                    "even" => PlannerKind::Even,
                    other => {
                        return Err(format!("--planner must be optperf or even, not {other:?}"));
                    }
                }
            }
            ("--name", true) => name = Some(f.value(&flag, inline)?),
            ("--env", true) => {
                let kv = f.value(&flag, inline)?;
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("--env needs KEY=VALUE, not {kv:?}"))?;
                env.push((k.to_owned(), v.to_owned()));
            }
            _ => return Err(format!("unknown option {flag} for gwjob {cmd}")),
        }
    }
    match cmd {
        "submit" => {
            let workers = workers.ok_or("--workers N is required")?;
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
            let global =
                global.ok_or("--global-batch B (or B@0 in --batch-schedule) is required")?;
            let largest = schedule
                .iter()
                .map(|c| c.global_batch)
                .fold(global, u64::max);
            let (batch_lo, batch_hi) = bounds.unwrap_or((1, largest.max(1)));
            let mut program = program.unwrap_or_default().into_iter();
            let prog = program.next().ok_or("PROGRAM is required (after '--')")?;
            Ok(Cli::Submit(
                conn,
                SubmitRequest {
                    name,
                    workers,
                    global_batch: global,
                    batch_lo,
                    batch_hi,
                    schedule,
                    planner,
                    program: prog,
                    args: program.collect(),
                    env,
                },
            ))
        }
        "status" => {
            if positionals.len() > 1 {
                return Err("gwjob status takes at most one JOB".into());
            }
            Ok(Cli::Status {
                conn,
                job: positionals.pop(),
                json,
            })
        }
        "cancel" => match positionals.as_slice() {
            [job] => Ok(Cli::Cancel(conn, job.clone())),
            _ => Err("gwjob cancel takes exactly one JOB".into()),
        },
        other => Err(format!("unknown command {other:?}")),
    }
}

fn parse_bounds(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--batch-bounds needs LO:HI (two numbers), not {s:?}");
    let (lo, hi) = s.split_once(':').ok_or_else(bad)?;
    Ok((
        lo.trim().parse().map_err(|_| bad())?,
        hi.trim().parse().map_err(|_| bad())?,
    ))
}

fn parse_schedule(s: &str) -> Result<Vec<BatchChange>, String> {
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(cmd: &str, a: &[&str]) -> Result<Cli, String> {
        parse(cmd, a.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn submit_with_everything() {
        let Ok(Cli::Submit(conn, r)) = p(
            "submit",
            &[
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
                "--",
                "train",
                "--lr",
                "0.1",
            ],
        ) else {
            panic!()
        };
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
        assert_eq!(
            (r.program.as_str(), r.args.clone()),
            ("train", vec!["--lr".to_owned(), "0.1".to_owned()])
        );
    }

    #[test]
    fn submit_defaults() {
        let Ok(Cli::Submit(_, r)) = p(
            "submit",
            &["--workers", "2", "--global-batch", "8", "prog", "-x"],
        ) else {
            panic!()
        };
        assert_eq!(
            (r.batch_lo, r.batch_hi, r.planner),
            (1, 8, PlannerKind::Optperf)
        );
        assert_eq!(r.args, vec!["-x"]);
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
            ("status", &["a", "b"][..], "at most one"),
            ("status", &["--workers", "2"][..], "unknown option"),
            ("cancel", &[][..], "exactly one"),
        ] {
            let e = p(cmd, a).unwrap_err();
            assert!(e.contains(want), "{a:?}: {e}");
        }
        assert!(matches!(
            p("status", &["--json"]),
            Ok(Cli::Status {
                json: true,
                job: None,
                ..
            })
        ));
        assert!(matches!(p("cancel", &["-h"]), Ok(Cli::Help)));
    }
}
