//! `kill -9` of the job server in the middle of a job, then a restart on the
//! same database: the job, the plans already issued, the recorded steps and
//! the timing fits are exactly as before, retried reports are not counted
//! twice, launches are not delivered again, nodes are not declared lost for
//! the server's own downtime, and the next step continues.

mod server_support;

use gw_jobapi::types::*;
use server_support::*;
use std::time::Duration;

#[test]
fn kill_9_and_restart_loses_and_repeats_nothing() {
    let dir = TempDir::new("restart");
    let mut s = Server::start(dir.path(), &["--node-timeout", "2"]);
    let (id, token) = running_job(&s, "n1", &job(2, 64));
    let report = |s: &Server, rank: u32, step: u64, b: u64| {
        let a = if rank == 0 { 0.001 } else { 0.002 };
        s.step_end(&id, &token, &end(rank, step, b, a * b as f64 + 0.001))
            .unwrap();
    };
    let mut issued: Vec<[StepPlan; 2]> = Vec::new();
    for step in 0..6 {
        let p = [0, 1].map(|r| s.step_begin(&id, &token, r, step).unwrap());
        report(&s, 0, step, p[0].local_batch);
        report(&s, 1, step, p[1].local_batch);
        issued.push(p);
        s.heartbeat("n1", &Heartbeat::default());
    }
    // Step 6 is half done: both plans issued, only rank 0 reported.
    let p6 = [0, 1].map(|r| s.step_begin(&id, &token, r, 6).unwrap());
    report(&s, 0, 6, p6[0].local_batch);
    issued.push(p6.clone());
    let before = s.status(&id);
    assert_eq!(before.step, Some(5));
    assert_ne!(
        p6[0].local_batch, p6[1].local_batch,
        "OptPerf should be active by now"
    );

    s.kill();
    // Down for longer than the node timeout: must not count against n1.
    std::thread::sleep(Duration::from_millis(2500));
    let s = Server::start(dir.path(), &["--node-timeout", "2"]);
    assert_eq!(s.status(&id), before);
    // Plans already issued come back identically, for every step and rank.
    for (step, p) in issued.iter().enumerate() {
        for r in 0..2 {
            assert_eq!(
                s.step_begin(&id, &token, r, step as u64).unwrap(),
                p[r as usize],
                "step {step} rank {r}"
            );
        }
    }
    // Rank 0's report of step 6 is retried (its reply was lost): not
    // counted again, so the fits and the status do not move.
    report(&s, 0, 6, p6[0].local_batch);
    assert_eq!(s.status(&id), before);
    // The agent's heartbeat resumes; its launch is not delivered again.
    let hb = s.heartbeat("n1", &Heartbeat::default());
    assert!(
        hb.launches.is_empty() && hb.open_stores.is_empty(),
        "{hb:?}"
    );
    // Rank 1 finishes step 6, and the job goes on.
    report(&s, 1, 6, p6[1].local_batch);
    assert_eq!(s.status(&id).step, Some(6));
    let p7 = [0, 1].map(|r| s.step_begin(&id, &token, r, 7).unwrap());
    assert_eq!(p7[0].step, 7);
    assert_eq!(p7[0].local_batch + p7[1].local_batch, 64);
    report(&s, 0, 7, p7[0].local_batch);
    report(&s, 1, 7, p7[1].local_batch);
    s.heartbeat("n1", &Heartbeat::default());
    let after = s.status(&id);
    assert_eq!(after.step, Some(7));
    assert_eq!(after.state, JobState::Running, "{after:?}");
    // The liveness timer still works after the restart.
    let lost = wait_for(Duration::from_secs(8), || {
        let st = s.status(&id);
        (st.state == JobState::Failed).then_some(st)
    })
    .expect("n1 stops heartbeating: lost");
    assert_eq!(
        lost.reason.as_deref(),
        Some("node n1 lost (no heartbeat for 2 s)")
    );
}

#[test]
fn workers_using_the_step_client_ride_out_a_kill_9() {
    use gw_jobapi::step::{StepClient, StepReport};
    use std::sync::{Arc, Barrier};

    let dir = TempDir::new("restart-client");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let args = ["--node-timeout", "60"];
    let mut s = Server::start_on(dir.path(), &listen, &args);
    let (id, token) = running_job(&s, "n1", &job(2, 64));
    const STEPS: u64 = 30;
    let barrier = Arc::new(Barrier::new(2));
    let workers: Vec<_> = (0..2u32)
        .map(|rank| {
            let (url, id, token, barrier) =
                (s.url.clone(), id.clone(), token.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut c = StepClient::new(&url, &id, &token, rank)
                    .with_retry(Duration::from_secs(30))
                    .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
                let mut seen = Vec::new();
                for _ in 0..STEPS {
                    let plan = c.begin().map_err(|e| e.to_string())?;
                    // The all-reduce: both ranks finish a step together.
                    barrier.wait();
                    std::thread::sleep(Duration::from_millis(20));
                    let secs = if rank == 0 { 0.001 } else { 0.003 } * plan.local_batch as f64;
                    let reply = c
                        .end(&StepReport {
                            samples: plan.local_batch,
                            compute_s: secs,
                            comm_s: 0.001,
                            step_s: secs + 0.001,
                            local_grad_sq: None,
                            global_grad_sq: None,
                        })
                        .map_err(|e| e.to_string())?;
                    assert!(!reply.stop);
                    seen.push(plan);
                }
                Ok::<_, String>(seen)
            })
        })
        .collect();
    wait_for(Duration::from_secs(20), || {
        (s.status(&id).step.is_some_and(|st| st >= 5)).then_some(())
    })
    .expect("steps progress");
    s.kill();
    std::thread::sleep(Duration::from_millis(1000));
    let s = Server::start_on(dir.path(), &listen, &args);
    let seen: Vec<Vec<StepPlan>> = workers
        .into_iter()
        .map(|w| w.join().unwrap().unwrap_or_else(|e| panic!("worker: {e}")))
        .collect();
    for (rank, plans) in seen.iter().enumerate() {
        let steps: Vec<u64> = plans.iter().map(|p| p.step).collect();
        assert_eq!(steps, (0..STEPS).collect::<Vec<_>>(), "rank {rank}");
    }
    for (a, b) in seen[0].iter().zip(&seen[1]) {
        assert_eq!(a.local_batch + b.local_batch, 64, "step {}", a.step);
        assert_eq!(a.offset, 0);
        assert_eq!(b.offset, a.local_batch);
    }
    let st = s.status(&id);
    assert_eq!(st.step, Some(STEPS - 1));
    assert_eq!(st.state, JobState::Running);
    // OptPerf noticed rank 1 is 3× slower, before or after the restart.
    let last = (seen[0].last().unwrap(), seen[1].last().unwrap());
    assert!(last.0.local_batch > 2 * last.1.local_batch, "{last:?}");
}
