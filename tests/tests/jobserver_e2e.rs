//! The job server end to end, with real processes: `gwjob serve`, `gwjob
//! agent`s and a 2-rank `gwtrain` job (a real MLP trained data-parallel over
//! the step protocol). What the control plane promises, checked for
//! correctness rather than speed:
//! - a `kill -9` of the server mid-job and a restart on the same database
//!   loses and repeats no step (every rank's step log is exactly 0..N), and
//!   the model ends bit-identical to an uninterrupted run with the same plan;
//! - a worker killed mid-step fails the job promptly with a reason naming
//!   the rank and node, and no worker of the job is left running;
//! - agents in two network namespaces (each its own address: two "hosts")
//!   run one job across them.

use gw_tests::jobs::{Cluster, alive, json_str, processes_of_job, step_log};
use gw_tests::netns::Namespaces;
use std::path::Path;
use std::time::{Duration, Instant};

/// Steps of the jobs that must finish.
const STEPS: u64 = 60;

fn train_args(out: &Path, steps: u64) -> Vec<String> {
    [
        "--steps",
        &steps.to_string(),
        "--dims",
        "32,64,10",
        "--seed",
        "3",
        "--slow-rank",
        "1",
        "--slowdown",
        "2",
        "--print-every",
        "0",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.display().to_string()])
    .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Waits until `pred` holds, panicking with `what` and the logs after `deadline`.
fn wait_until(c: &Cluster, deadline: Duration, what: &str, mut pred: impl FnMut() -> bool) {
    let start = Instant::now();
    while !pred() {
        assert!(
            start.elapsed() < deadline,
            "{what} did not happen within {deadline:?}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn params(dir: &Path) -> Vec<u8> {
    let p = dir.join("params.bin");
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    assert!(!b.is_empty(), "{} is empty", p.display());
    b
}

#[test]
fn server_kill_9_mid_job_loses_and_repeats_no_step() {
    let mut c = Cluster::start("restart", "127.0.0.1:0", &[]);
    c.add_agent("local", 2, None, &[]);
    let submit = [
        "--workers",
        "2",
        "--global-batch",
        "128",
        "--planner",
        "even",
    ];
    let out = c.dir.path().join("interrupted");
    let job = c.submit_gwtrain(&submit, &strs(&train_args(&out, STEPS)));

    // Kill the server once the job is well under way.
    wait_until(&c, Duration::from_secs(120), "10 steps", || {
        step_log(&out, 0).len() >= 10
    });
    c.kill_server();
    let at_kill = step_log(&out, 0).len() as u64;
    assert!(
        at_kill < STEPS,
        "the job ended before the server was killed; make it longer"
    );
    // The workers wait for the server (retrying with backoff): without it
    // they can finish at most the step they are in.
    std::thread::sleep(Duration::from_secs(2));
    for r in 0..2 {
        let n = step_log(&out, r).len() as u64;
        assert!(
            n <= at_kill + 1,
            "rank {r} ran on to step {n} without a job server\n{}",
            c.logs()
        );
    }
    c.restart_server();
    println!("server killed after step {at_kill} of {STEPS} and restarted 2 s later");
    let (state, js) = c.wait_end(&job, Duration::from_secs(300));
    assert_eq!(state, "succeeded", "{js}\n{}", c.logs());
    let all: Vec<u64> = (0..STEPS).collect();
    for r in 0..2 {
        assert_eq!(
            step_log(&out, r),
            all,
            "rank {r} lost or repeated a step across the restart\n{}",
            c.logs()
        );
    }

    // The same job without interruption ends with the same parameters.
    let reference = c.dir.path().join("uninterrupted");
    let job2 = c.submit_gwtrain(&submit, &strs(&train_args(&reference, STEPS)));
    let (state, js) = c.wait_end(&job2, Duration::from_secs(300));
    assert_eq!(state, "succeeded", "{js}\n{}", c.logs());
    assert!(
        params(&out) == params(&reference),
        "the restarted job's final parameters differ from an uninterrupted run's"
    );
    assert_eq!(processes_of_job(&job), Vec::<u32>::new());
    c.shutdown();
}

#[test]
fn worker_killed_mid_step_fails_the_job_naming_rank_and_node() {
    let mut c = Cluster::start("killworker", "127.0.0.1:0", &[]);
    c.add_agent("e2e-node", 2, None, &[]);
    let out = c.dir.path().join("run");
    // Far more steps than it will get to run; a bounded collective timeout
    // so that even a survivor the agent failed to stop would give up.
    let job = c.submit_gwtrain(
        &[
            "--workers",
            "2",
            "--global-batch",
            "128",
            "--planner",
            "even",
            "--env",
            "GW_TIMEOUT=20",
        ],
        &strs(&train_args(&out, 1_000_000)),
    );
    wait_until(&c, Duration::from_secs(120), "3 steps", || {
        step_log(&out, 1).len() >= 3
    });
    let pids = c.worker_pids(&job);
    assert_eq!(
        pids.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![0, 1],
        "{pids:?}\n{}",
        c.logs()
    );
    let (victim, survivor) = (pids[1].1, pids[0].1);
    // Rank 1 spends nearly all its time computing (slowdown 2), so this
    // lands mid-step.
    // SAFETY: kill(2) of a worker pid the agent reported, alive just above.
    assert_eq!(
        unsafe { libc::kill(victim as libc::pid_t, libc::SIGKILL) },
        0
    );
    let killed = Instant::now();

    let (state, js) = c.wait_end(&job, Duration::from_secs(60));
    let took = killed.elapsed();
    assert_eq!(state, "failed", "{js}\n{}", c.logs());
    let reason = json_str(&js, "reason").unwrap_or_default();
    println!("the job failed {took:?} after the kill: {reason}");
    assert!(
        reason.contains("rank 1") && reason.contains("e2e-node"),
        "the reason must name the rank and the node: {reason:?}\n{js}"
    );
    // Failing takes heartbeats, not the collective timeout.
    assert!(
        took < Duration::from_secs(20),
        "the job took {took:?} to fail\n{}",
        c.logs()
    );
    wait_until(
        &c,
        Duration::from_secs(30),
        "the job's workers ending",
        || !alive(survivor) && !alive(victim) && processes_of_job(&job).is_empty(),
    );
    let (ok, text, _) = c.client("status", &[&job]);
    assert!(ok && text.contains("failed"), "{text}");
    c.shutdown();
}

#[test]
fn one_job_runs_across_agents_in_two_network_namespaces() {
    let Some(ns) = Namespaces::create_or_skip(
        "one_job_runs_across_agents_in_two_network_namespaces",
        "j",
        78,
    ) else {
        return;
    };
    let [a, b] = &ns.names;
    let in_a = ["ip", "netns", "exec", a.as_str()];
    let in_b = ["ip", "netns", "exec", b.as_str()];
    let mut c = Cluster::start("netns", "198.18.78.1:0", &in_a);
    c.add_agent("host-a", 1, Some("198.18.78.1"), &in_a);
    c.add_agent("host-b", 1, Some("198.18.78.2"), &in_b);
    let out = c.dir.path().join("run");
    let steps = 20;
    let job = c.submit_gwtrain(
        &[
            "--workers",
            "2",
            "--global-batch",
            "128",
            "--env",
            "GW_DEBUG=info",
        ],
        &strs(&train_args(&out, steps)),
    );
    let (state, js) = c.wait_end(&job, Duration::from_secs(300));
    assert_eq!(state, "succeeded", "{js}\n{}", c.logs());
    let all: Vec<u64> = (0..steps).collect();
    for r in 0..2 {
        assert_eq!(step_log(&out, r), all, "rank {r}\n{}", c.logs());
    }
    // One rank on each "host", each on its own address, talking over TCP.
    let (la, lb) = (c.agents[0].output(), c.agents[1].output());
    let started = |log: &str| log.matches(&format!("started job {job} rank ")).count();
    assert_eq!((started(&la), started(&lb)), (1, 1), "{}", c.logs());
    assert!(la.contains("listening on 198.18.78.1:"), "{}", c.logs());
    assert!(lb.contains("listening on 198.18.78.2:"), "{}", c.logs());
    assert!(
        la.contains("transports tcp,") && lb.contains("tcp (other host)"),
        "ranks on different hosts must use TCP\n{}",
        c.logs()
    );
    assert!(params(&out).len() > 8);
    c.shutdown();
}
