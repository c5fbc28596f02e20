//! The cluster scheduler in the live job server, with real processes:
//! `gwjob serve --policy gavel`, agents of two device types and three
//! 2-worker `gwtrain` jobs on four slots, so one job always waits and
//! Gavel's max-min fairness rotates them at round boundaries. A job the
//! policy takes off its nodes is preempted through the step protocol: its
//! workers checkpoint and exit, and its next placement resumes from that
//! step. What must hold:
//! - a placement changes at a round boundary (a job is preempted and placed
//!   again later), and every job finishes;
//! - no step is lost or repeated: every rank's step log, across all its
//!   placements, is exactly 0..N;
//! - the model is what an uninterrupted run makes: each job's final
//!   parameters are bit-identical to the same training under `gwrun`
//!   (two ranks, even split: the same sums in the same order).

use gw_tests::jobs::{Cluster, step_log};
use gw_tests::{bin, gwrun};
use std::path::Path;
use std::time::{Duration, Instant};

const STEPS: u64 = 400;

fn train_args(out: &Path, ckpt: &Path) -> Vec<String> {
    [
        "--steps",
        &STEPS.to_string(),
        "--dims",
        "32,256,10",
        "--seed",
        "5",
        "--print-every",
        "0",
        "--global-batch",
        "128",
        "--out",
        &out.display().to_string(),
        "--checkpoint",
        &ckpt.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

#[test]
fn a_policy_preempts_through_checkpoints_and_no_step_is_lost_or_repeated() {
    let mut c = Cluster::start_with(
        "policy",
        "127.0.0.1:0",
        &[],
        &["--policy", "gavel", "--round", "1", "--heartbeat-ms", "100"],
    );
    c.add_typed_agent("fast1", 2, "fast", None, &[]);
    c.add_typed_agent("slow1", 2, "slow", None, &[]);
    let start = Instant::now();
    let mut jobs = Vec::new();
    for j in 0..3 {
        let out = c.dir.path().join(format!("out{j}"));
        let ckpt = c.dir.path().join(format!("ckpt{j}"));
        let args = train_args(&out, &ckpt);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = c.submit_gwtrain(
            &[
                "--workers",
                "2",
                "--global-batch",
                "128",
                "--planner",
                "even",
                "--steps",
                &STEPS.to_string(),
                "--throughput",
                "fast=2,slow=1",
                "--name",
                &format!("job{j}"),
            ],
            &args,
        );
        jobs.push((id, out));
    }
    for (id, _) in &jobs {
        let (state, js) = c.wait_end(id, Duration::from_secs(240));
        assert_eq!(state, "succeeded", "{js}\n{}", c.logs());
    }
    println!(
        "three jobs of {STEPS} steps done in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let log = c.server.output();
    let all: Vec<u64> = (0..STEPS).collect();
    let mut resumed = 0;
    for (id, out) in &jobs {
        for r in 0..2 {
            assert_eq!(
                step_log(out, r),
                all,
                "job {id} rank {r} lost or repeated a step across its placements\n{}",
                c.logs()
            );
        }
        let preempted = log
            .lines()
            .filter(|l| l.contains(&format!("job {id} preempted")))
            .count();
        let requeued = log
            .lines()
            .filter(|l| l.contains(&format!("job {id}: checkpointed at step")))
            .count();
        let placed = log
            .lines()
            .filter(|l| l.contains(&format!("job {id} placed on")))
            .count();
        println!("job {id}: preempted {preempted}, checkpointed {requeued}, placed {placed}");
        assert_eq!(
            placed,
            requeued + 1,
            "job {id}: every checkpoint is followed by exactly one new placement\n{log}"
        );
        let js = c.status_json(id).unwrap_or_default();
        let attempt = js
            .lines()
            .find_map(|l| l.trim().strip_prefix("\"attempt\": "))
            .and_then(|v| v.trim_end_matches(',').parse::<usize>().ok());
        assert_eq!(attempt, Some(requeued), "{js}");
        resumed += requeued;
    }
    assert!(
        resumed > 0,
        "no job was preempted and resumed: the test did not test preemption \
         (the jobs may have become too short for 1 s rounds)\n{log}"
    );

    // The same training, uninterrupted, under gwrun.
    let reference = c.dir.path().join("reference");
    let ckpt = c.dir.path().join("unused");
    let args = train_args(&reference, &ckpt);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gwtrain = bin("gwtrain").display().to_string();
    let run = gwrun(2, &gwtrain, &args, &[], Duration::from_secs(120));
    assert!(run.status.success(), "{}{}", run.stdout, run.stderr);
    let want = read(&reference.join("params.bin"));
    for (id, out) in &jobs {
        assert!(
            read(&out.join("params.bin")) == want,
            "job {id}'s final parameters differ from an uninterrupted run's"
        );
    }
    let (ok, text, _) = c.client("status", &[]);
    assert!(ok && text.matches("succeeded").count() >= 3, "{text}");
    c.shutdown();
}
