//! The cluster scheduler in the live job server, with real processes:
//! `gwjob serve --policy gavel`, agents of two device types and 2-worker
//! `gwtrain` jobs on four slots. A job the policy takes off its nodes is
//! preempted through the step protocol: its workers checkpoint and exit,
//! and its next placement resumes from that step. What must hold:
//! - a placement changes at a round boundary (a job is preempted and placed
//!   again later), and every job finishes;
//! - no step is lost or repeated: every rank's step log, across all its
//!   placements, is exactly 0..N;
//! - the model is what an uninterrupted run makes: each job's final
//!   parameters are bit-identical to the same training under `gwrun`
//!   (two ranks, even split: the same sums in the same order);
//! - a job submitted without its speed per device type is profiled on each
//!   type first, through the same checkpoints.

use gw_tests::jobs::{Cluster, step_log};
use gw_tests::{bin, gwrun};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// About 90 steps a second under the job server here (two step calls a
/// rank and step): long enough that the 1 s rounds preempt with margin.
const STEPS: u64 = 800;

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

/// Agents fast1 and slow1, two slots each, under `gwjob serve --policy
/// gavel` with 1 s rounds and `extra` server flags.
fn cluster(tag: &str, extra: &[&str]) -> Cluster {
    let mut args = vec!["--policy", "gavel", "--round", "1", "--heartbeat-ms", "100"];
    args.extend_from_slice(extra);
    let mut c = Cluster::start_with(tag, "127.0.0.1:0", &[], &args);
    c.add_typed_agent("fast1", 2, "fast", None, &[]);
    c.add_typed_agent("slow1", 2, "slow", None, &[]);
    c
}

/// Submits job `j` (2 workers, even split); `throughput` as for `gwjob
/// submit --throughput`, or None to leave it to profiling.
fn submit(c: &Cluster, j: usize, throughput: Option<&str>) -> (String, PathBuf) {
    let out = c.dir.path().join(format!("out{j}"));
    let ckpt = c.dir.path().join(format!("ckpt{j}"));
    let args = train_args(&out, &ckpt);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let steps = STEPS.to_string();
    let name = format!("job{j}");
    let mut submit = vec![
        "--workers",
        "2",
        "--global-batch",
        "128",
        "--planner",
        "even",
        "--steps",
        &steps,
        "--name",
        &name,
    ];
    if let Some(t) = throughput {
        submit.extend_from_slice(&["--throughput", t]);
    }
    (c.submit_gwtrain(&submit, &args), out)
}

/// Every job succeeded, every rank ran each step once across its
/// placements, and the final parameters are an uninterrupted run's.
/// Returns the server's log.
fn check_jobs(c: &Cluster, jobs: &[(String, PathBuf)]) -> String {
    for (id, _) in jobs {
        let (state, js) = c.wait_end(id, Duration::from_secs(240));
        assert_eq!(state, "succeeded", "{js}\n{}", c.logs());
    }
    let all: Vec<u64> = (0..STEPS).collect();
    for (id, out) in jobs {
        for r in 0..2 {
            assert_eq!(
                step_log(out, r),
                all,
                "job {id} rank {r} lost or repeated a step across its placements\n{}",
                c.logs()
            );
        }
    }
    let reference = c.dir.path().join("reference");
    let args = train_args(&reference, &c.dir.path().join("unused"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gwtrain = bin("gwtrain").display().to_string();
    let run = gwrun(2, &gwtrain, &args, &[], Duration::from_secs(120));
    assert!(run.status.success(), "{}{}", run.stdout, run.stderr);
    let want = read(&reference.join("params.bin"));
    for (id, out) in jobs {
        assert!(
            read(&out.join("params.bin")) == want,
            "job {id}'s final parameters differ from an uninterrupted run's"
        );
    }
    c.server.output()
}

fn count(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

#[test]
fn a_policy_preempts_through_checkpoints_and_no_step_is_lost_or_repeated() {
    let mut c = cluster("policy", &[]);
    let start = Instant::now();
    let jobs: Vec<_> = (0..3)
        .map(|j| submit(&c, j, Some("fast=2,slow=1")))
        .collect();
    let log = check_jobs(&c, &jobs);
    println!(
        "three jobs of {STEPS} steps done in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let mut resumed = 0;
    for (id, _) in &jobs {
        let preempted = count(&log, &format!("job {id} preempted"));
        let requeued = count(&log, &format!("job {id}: checkpointed at step"));
        let placed = count(&log, &format!("job {id} placed on"));
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
    let (ok, text, _) = c.client("status", &[]);
    assert!(ok && text.matches("succeeded").count() >= 3, "{text}");
    c.shutdown();
}

#[test]
fn a_job_without_throughput_is_profiled_on_each_type_and_loses_no_step() {
    let mut c = cluster("profile", &["--profile-steps", "5"]);
    let jobs = vec![submit(&c, 0, None), submit(&c, 1, Some("fast=2,slow=1"))];
    let log = check_jobs(&c, &jobs);
    let id = &jobs[0].0;
    for t in ["fast", "slow"] {
        assert_eq!(
            count(&log, &format!("job {id}: profiled on {t}: ")),
            1,
            "job {id} was not profiled once on {t}\n{log}"
        );
    }
    let js = c.status_json(id).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&js).unwrap_or_default();
    let measured = v["measured_throughput"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let types: Vec<&str> = measured
        .iter()
        .filter_map(|m| m["device_type"].as_str())
        .collect();
    println!("job {id} profiled: {measured:?}");
    assert_eq!(types, ["fast", "slow"], "{js}");
    assert!(
        measured
            .iter()
            .all(|m| m["steps_per_s"].as_f64().is_some_and(|s| s > 0.0)),
        "{js}"
    );
    let (ok, text, _) = c.client("status", &[id]);
    assert!(ok && text.contains("profiled steps/s: fast "), "{text}");
    c.shutdown();
}
