//! The step protocol end to end, and the agent's tolerance of a server that
//! goes away: workers (this test binary, re-run as `step_worker`) step with
//! `gw_jobapi::step::StepClient` while the server is `kill -9`ed and
//! restarted on the same database; every step must be done exactly once by
//! every rank. And a server replaced by one that never heard of the node
//! (a fresh database) gets the agent registered again.

mod agent_support;

use agent_support::*;
use gw_jobapi::step::{StepClient, StepReport};
use gw_jobapi::types::{JobState, PlannerKind};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const STEPS: u64 = 40;
const GLOBAL: u64 = 12;

/// The worker side, run by the agents as `<this test binary> --exact
/// step_worker`; without AGENT_TEST_STEPS (a normal test run) it does nothing.
#[test]
fn step_worker() {
    let Ok(steps) = std::env::var("AGENT_TEST_STEPS") else {
        return;
    };
    let steps: u64 = steps.parse().expect("AGENT_TEST_STEPS");
    let dir = PathBuf::from(std::env::var("AGENT_TEST_DIR").expect("AGENT_TEST_DIR"));
    let mut c = StepClient::from_env()
        .expect("step client from the agent's variables")
        .expect("GW_JOB_SERVER is set by the agent");
    let rank = c.rank();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("steps-{rank}")))
        .expect("steps file");
    while c.step() < steps {
        let plan = c.begin().expect("step begin");
        // Rank r is (r + 1) times slower per sample than rank 0.
        let compute = 0.002 * plan.local_batch as f64 * f64::from(rank + 1);
        std::thread::sleep(Duration::from_secs_f64(compute));
        let reply = c
            .end(&StepReport {
                samples: plan.local_batch,
                compute_s: compute,
                comm_s: 0.001,
                step_s: compute + 0.001,
                local_grad_sq: None,
                global_grad_sq: None,
            })
            .expect("step end");
        writeln!(
            log,
            "{} {} {} {}",
            plan.step, plan.local_batch, plan.offset, plan.weight
        )
        .expect("write steps file");
        if reply.stop {
            break;
        }
    }
}

fn step_job(dir: &TempDir) -> gw_jobapi::types::SubmitRequest {
    let exe = std::env::current_exe().expect("test binary");
    let mut req = sh_job(3, "");
    req.global_batch = GLOBAL;
    req.batch_hi = GLOBAL;
    req.planner = PlannerKind::Optperf;
    req.program = exe.display().to_string();
    req.args = ["--exact", "step_worker", "--nocapture", "--test-threads=1"]
        .map(String::from)
        .to_vec();
    req.env = vec![
        ("AGENT_TEST_STEPS".into(), STEPS.to_string()),
        ("AGENT_TEST_DIR".into(), dir.path().display().to_string()),
    ];
    req
}

#[test]
fn steps_survive_a_kill_9_of_the_server_none_lost_or_repeated() {
    let dir = TempDir::new("steps");
    let listen = format!("127.0.0.1:{}", free_port());
    let db = dir.path().join("db");
    let log = dir.path().join("server.log");
    let args = ["--node-timeout", "10"];
    let mut s = Server::start(&db, &listen, &log, &args);
    let a = Agent::start(dir.path(), &s.url, "node-a", 2);
    let b = Agent::start(dir.path(), &s.url, "node-b", 1);
    a.wait_log("registered", Duration::from_secs(30));
    b.wait_log("registered", Duration::from_secs(30));
    let logs = || a.log() + &b.log();

    let id = s.submit(&step_job(&dir));
    s.wait_job(
        &id,
        Duration::from_secs(60),
        |st| st.step.is_some_and(|x| x >= 5),
        logs,
    );
    s.kill();
    std::thread::sleep(Duration::from_millis(1500));
    let s = Server::start(&db, &listen, &log, &args);
    let st = s.wait_job(&id, Duration::from_secs(90), ended, logs);
    assert_eq!(
        st.state,
        JobState::Succeeded,
        "{st:?}\n{}\n{}",
        s.log(),
        logs()
    );
    assert_eq!(st.step, Some(STEPS - 1), "{st:?}");
    let l = logs();
    assert!(l.contains("job server unreachable"), "{l}");
    assert!(l.contains("job server back after"), "{l}");

    // Each rank did each step once, and the ranks' samples tile every step.
    let mut per_step: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for rank in 0..3 {
        let text =
            std::fs::read_to_string(dir.path().join(format!("steps-{rank}"))).unwrap_or_default();
        let steps: Vec<u64> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let step: u64 = f[0].parse().unwrap();
                per_step
                    .entry(step)
                    .or_default()
                    .push((f[2].parse().unwrap(), f[1].parse().unwrap()));
                step
            })
            .collect();
        assert_eq!(
            steps,
            (0..STEPS).collect::<Vec<_>>(),
            "rank {rank}:\n{text}"
        );
    }
    for (step, mut parts) in per_step {
        parts.sort();
        let mut next = 0;
        for (offset, local) in parts {
            assert_eq!(offset, next, "step {step}");
            next += local;
        }
        assert_eq!(next, GLOBAL, "step {step}");
    }
}

#[test]
fn an_agent_registers_again_with_a_server_that_forgot_it() {
    let dir = TempDir::new("forgot");
    let listen = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("server.log");
    let mut s = Server::start(&dir.path().join("db1"), &listen, &log, &[]);
    let a = Agent::start(dir.path(), &s.url, "node-f", 1);
    a.wait_log("registered node node-f", Duration::from_secs(30));
    s.kill();
    // A new server on the same address, with an empty database.
    let s = Server::start(&dir.path().join("db2"), &listen, &log, &[]);
    a.wait_log("registering again", Duration::from_secs(30));
    let t = Instant::now();
    while a.log().matches("registered node node-f").count() < 2 {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", a.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let id = s.submit(&sh_job(1, "echo hello from $GW_RANK"));
    let st = s.wait_job(&id, Duration::from_secs(30), ended, || a.log());
    assert_eq!(st.state, JobState::Succeeded, "{st:?}\n{}", a.log());
    assert!(a.log().contains(&format!("[{id}:0] hello from 0")));
}
