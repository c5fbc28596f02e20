//! gwtrain: trains an MLP data-parallel, one rank per process (under `gwrun`
//! or a `gwjob` agent), and `gwtrain report` summarises finished runs.

use gw_train::report;
use gw_train::worker::{self, Stop, TrainConfig};
use std::path::PathBuf;

const USAGE: &str = "\
usage: gwtrain [--steps N] [--lr X] [--seed S] [--dims 32,128,128,10]
               [--global-batch B] [--slow-rank R] [--slowdown K] [--out DIR]
               [--print-every N]
       gwtrain report [--warmup W] [--check] NAME=DIR [NAME=DIR...]

Trains an MLP on a synthetic classification stream, one rank per process.
Plans come from the job server when GW_JOB_SERVER is set, else from the even
split of --global-batch (default 512). Rank R = --slow-rank repeats its
forward/backward K = --slowdown times per sample. With --out, every rank
writes DIR/steps-rank<R>.log and rank 0 DIR/steps.jsonl and DIR/params.bin.

`report` prints mean step times after W warm-up steps (default 5), predicted
beside measured step times, the local batches chosen, and the largest relative
difference of the runs' final parameters; its last line is the ratio of the
last run's mean step time to the first's. --check also checks the demo's
criteria (last/first ratio <= 0.6, the last run's measured step time within
15% of the predicted, parameters equal within 1e-5 relative) and exits 1 if
one is not met.";

fn value<'a>(it: &mut impl Iterator<Item = &'a String>, flag: &str) -> Result<&'a String, String> {
    it.next().ok_or_else(|| format!("{flag} needs a value"))
}

fn num<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{flag} {s:?} is not a valid number"))
}

fn parse_train(args: &[String]) -> Result<TrainConfig, String> {
    let mut c = TrainConfig::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let f = a.as_str();
        match f {
            "--steps" => c.steps = num(value(&mut it, f)?, f)?,
            "--lr" => c.lr = num(value(&mut it, f)?, f)?,
            "--seed" => c.seed = num(value(&mut it, f)?, f)?,
            "--global-batch" => c.global_batch = num(value(&mut it, f)?, f)?,
            "--slow-rank" => c.slow_rank = Some(num(value(&mut it, f)?, f)?),
            "--slowdown" => c.slowdown = num(value(&mut it, f)?, f)?,
            "--out" => c.out = Some(PathBuf::from(value(&mut it, f)?)),
            "--print-every" => c.print_every = num(value(&mut it, f)?, f)?,
            "--dims" => {
                c.dims = value(&mut it, f)?
                    .split(',')
                    .map(|d| num(d, f))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    if !c.lr.is_finite() {
        return Err(format!("--lr {} is not finite", c.lr));
    }
    if c.slowdown == 0 {
        return Err("--slowdown must be at least 1".into());
    }
    if c.global_batch == 0 {
        return Err("--global-batch must be at least 1".into());
    }
    Ok(c)
}

type ReportArgs = (usize, bool, Vec<(String, PathBuf)>);

fn parse_report(args: &[String]) -> Result<ReportArgs, String> {
    let mut warmup = 5usize;
    let mut check = false;
    let mut runs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--check" {
            check = true;
        } else if a == "--warmup" {
            warmup = num(value(&mut it, a)?, a)?;
        } else if let Some((name, dir)) = a.split_once('=') {
            runs.push((name.to_string(), PathBuf::from(dir)));
        } else {
            return Err(format!("expected NAME=DIR, got {a:?}"));
        }
    }
    if runs.is_empty() {
        return Err("report needs at least one NAME=DIR".into());
    }
    Ok((warmup, check, runs))
}

fn main() {
    gw_logging::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return;
    }
    if args.first().map(String::as_str) == Some("report") {
        let r = parse_report(&args[1..]).and_then(|(w, check, runs)| {
            report::report(&runs, w, check.then_some(report::DEMO_CRITERIA))
        });
        match r {
            Ok(rep) => {
                println!("{}", rep.text);
                if !rep.failed.is_empty() {
                    std::process::exit(1);
                }
            }
            Err(e) => {
                eprintln!("gwtrain report: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    let cfg = match parse_train(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gwtrain: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let rank = std::env::var("GW_RANK").unwrap_or_else(|_| "?".into());
    match worker::run(&cfg) {
        Ok(()) => {}
        Err(Stop::ByServer { step, reason }) => {
            eprintln!("gwtrain rank {rank}: stopped at step {step}: {reason}");
            std::process::exit(3);
        }
        Err(Stop::Failed(e)) => {
            eprintln!("gwtrain rank {rank}: {e}");
            std::process::exit(1);
        }
    }
}
