//! Preemption by checkpoint, at the protocol level: a real `gwjob serve
//! --policy gavel` with short rounds, one node driven by hand through its
//! heartbeats, and the workers' step calls made by the test. A job that
//! has run is preempted when a second job arrives (Gavel gives the slots to
//! the job with the least service): every rank gets the checkpoint order at
//! the same step, the workers' exits requeue the job, and its next
//! placement gets a new store and `GW_RESUME_STEP`, and may not ask for an
//! earlier step. Also the refusals: a policy name that does not exist,
//! HadarE live, a job without `steps` under a policy.

mod server_support;

use gw_jobapi::types::*;
use server_support::*;
use std::time::Duration;

/// Heartbeats `node` until `pred` holds for the reply (rounds run on the
/// server's clock); panics after 20 s.
fn heartbeat_until(
    s: &Server,
    node: &str,
    hb: &Heartbeat,
    what: &str,
    pred: impl Fn(&HeartbeatReply) -> bool,
) -> HeartbeatReply {
    wait_for(Duration::from_secs(20), || {
        let r = s.heartbeat(node, hb);
        pred(&r).then_some(r)
    })
    .unwrap_or_else(|| panic!("{what} never happened\n{}", s.stderr()))
}

/// A 2-worker job for a policy, its speed given (so it is not profiled).
fn sched_job(steps: u64) -> SubmitRequest {
    let mut r = job(2, 8);
    r.planner = PlannerKind::Even;
    r.steps = Some(steps);
    r.throughput = vec![DeviceThroughput {
        device_type: "cpu".into(),
        steps_per_s: 1.0,
    }];
    r
}

/// `gwjob serve --policy gavel` with 0.3 s rounds and `extra` flags.
fn gavel_server(dir: &TempDir, extra: &[&str]) -> Server {
    let mut args = vec![
        "--policy",
        "gavel",
        "--round",
        "0.3",
        "--node-timeout",
        "60",
    ];
    args.extend_from_slice(extra);
    Server::start(dir.path(), &args)
}

/// The messages of `job`'s event log, oldest first.
fn event_texts(s: &Server, job: &str) -> Vec<String> {
    let events: Vec<serde_json::Value> = s.get(&format!("/v1/jobs/{job}/events"));
    events
        .iter()
        .filter_map(|e| e["message"].as_str().map(str::to_owned))
        .collect()
}

fn exits(job: &str, attempt: u32) -> Heartbeat {
    Heartbeat {
        stores: vec![],
        exits: (0..2)
            .map(|rank| WorkerExit {
                job_id: job.into(),
                attempt,
                rank,
                code: Some(0),
                signal: None,
            })
            .collect(),
    }
}

fn store(job: &str, attempt: u32, port: u16) -> Heartbeat {
    Heartbeat {
        stores: vec![StoreOpened {
            job_id: job.into(),
            attempt,
            addr: format!("127.0.0.1:{port}"),
        }],
        exits: vec![],
    }
}

#[test]
fn a_preempted_job_checkpoints_at_one_step_and_resumes_from_it() {
    let dir = TempDir::new("preempt");
    let s = gavel_server(&dir, &[]);
    s.register("n1", "r1", 2);
    let a = s.submit(&sched_job(100));
    // A round places it; the node opens its store and gets the launch.
    let r = heartbeat_until(&s, "n1", &Heartbeat::default(), "job A's store", |r| {
        r.open_stores.iter().any(|o| o.job_id == a)
    });
    assert_eq!(r.open_stores[0].attempt, 0);
    let r = s.heartbeat("n1", &store(&a, 0, 5001));
    let l = r.launches.iter().find(|l| l.job_id == a).expect("launch A");
    assert_eq!((l.attempt, env(l, "GW_RESUME_STEP")), (0, Some("0")));
    let token = env(l, "GW_JOB_TOKEN").expect("token").to_owned();
    for step in 0..3 {
        for rank in 0..2 {
            let p = s.step_begin(&a, &token, rank, step).expect("plan");
            assert!(!p.checkpoint);
            s.step_end(&a, &token, &end(rank, step, p.local_batch, 0.01))
                .expect("end");
        }
    }

    // B arrives; a round gives it A's slots.
    let b = s.submit(&sched_job(100));
    let st = wait_for(Duration::from_secs(20), || {
        let st = s.status(&a);
        st.preempting.then_some(st)
    })
    .unwrap_or_else(|| panic!("A was never preempted\n{}", s.stderr()));
    assert_eq!(st.state, JobState::Running);
    // Rank 1 asks first: step 3 has no plan, so it is where both stop.
    let p = s.step_begin(&a, &token, 1, 3).expect("step 3");
    assert!(p.checkpoint, "the first unplanned step is where both stop");
    let p = s.step_begin(&a, &token, 0, 3).expect("step 3 for rank 0");
    assert!(p.checkpoint, "{p:?}");
    assert_eq!((p.step, p.local_batch, p.weight), (3, 0, 0.0));
    // Asked again (a retry), the same answer.
    assert!(s.step_begin(&a, &token, 0, 3).expect("retry").checkpoint);

    // The workers exit 0: A leaves its nodes and B is placed there.
    s.heartbeat("n1", &exits(&a, 0));
    let st = s.status(&a);
    assert_eq!(
        (st.state, st.attempt, st.resume_step, st.preempting),
        (JobState::Pending, 1, 3, false),
        "{st:?}"
    );
    assert!(st.ranks.is_empty());
    // A late repeat of placement 0's exits changes nothing.
    s.heartbeat("n1", &exits(&a, 0));
    assert_eq!(s.status(&a).state, JobState::Pending);
    let r = heartbeat_until(&s, "n1", &Heartbeat::default(), "job B's store", |r| {
        r.open_stores.iter().any(|o| o.job_id == b)
    });
    assert!(r.open_stores.iter().all(|o| o.job_id != a));
    let r = s.heartbeat("n1", &store(&b, 0, 5002));
    let lb = r.launches.iter().find(|l| l.job_id == b).expect("launch B");
    let token_b = env(lb, "GW_JOB_TOKEN").expect("token").to_owned();
    for rank in 0..2 {
        let p = s.step_begin(&b, &token_b, rank, 0).expect("B step 0");
        s.step_end(&b, &token_b, &end(rank, 0, p.local_batch, 0.01))
            .expect("end");
    }

    // B in turn gives way (it has run, A has waited): A's second placement.
    let r = heartbeat_until(
        &s,
        "n1",
        &Heartbeat::default(),
        "B's checkpoint order",
        |_| s.status(&b).preempting,
    );
    assert!(
        r.open_stores.iter().all(|o| o.job_id != a),
        "B still holds the slots"
    );
    let p = s.step_begin(&b, &token_b, 0, 1).expect("B step 1");
    assert!(p.checkpoint);
    assert!(
        s.step_begin(&b, &token_b, 1, 1)
            .expect("B step 1")
            .checkpoint
    );
    s.heartbeat("n1", &exits(&b, 0));
    let r = heartbeat_until(&s, "n1", &Heartbeat::default(), "A's second store", |r| {
        r.open_stores.iter().any(|o| o.job_id == a)
    });
    let o = r.open_stores.iter().find(|o| o.job_id == a).expect("store");
    assert_eq!(o.attempt, 1, "a new placement needs a new store");
    // A report for placement 0's store is ignored; placement 1's counts.
    let r = s.heartbeat("n1", &store(&a, 0, 5001));
    assert!(r.launches.iter().all(|l| l.job_id != a));
    let r = s.heartbeat("n1", &store(&a, 1, 5003));
    let l = r
        .launches
        .iter()
        .find(|l| l.job_id == a)
        .expect("relaunch A");
    assert_eq!(l.attempt, 1);
    assert_eq!(env(l, "GW_RESUME_STEP"), Some("3"));
    assert_eq!(env(l, "GW_STORE"), Some("127.0.0.1:5003"));
    assert_eq!(env(l, "GW_JOB_TOKEN"), Some(token.as_str()));
    // Nothing before step 3 may run again; step 3 is planned afresh.
    let e = s.step_begin(&a, &token, 0, 2);
    assert_eq!(status_of(&e), 409);
    assert!(
        message_of(&e).contains("resumes from step 3"),
        "{}",
        message_of(&e)
    );
    let p = s.step_begin(&a, &token, 0, 3).expect("A step 3");
    assert!(!p.checkpoint);
    assert_eq!(p.local_batch, 4);
    let text = event_texts(&s, &a);
    for want in [
        "preempted: it runs on 2 x cpu, the policy gives it nothing",
        "workers told to checkpoint at step 3 and exit",
        "checkpointed at step 3 and left its nodes; placement 1 resumes from step 3",
    ] {
        assert!(
            text.iter().any(|t| t.contains(want)),
            "{want:?} in {text:#?}"
        );
    }
}

#[test]
fn policy_mistakes_are_named() {
    let dir = TempDir::new("policy-bad");
    let out = std::process::Command::new(gwjob())
        .args(["serve", "--db"])
        .arg(dir.path().join("x.db"))
        .args(["--policy", "lottery"])
        .output()
        .expect("gwjob");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown policy \"lottery\"")
            && err.contains("fifo, gavel, gavel-makespan, hadar, hadare"),
        "{err}"
    );
    let out = std::process::Command::new(gwjob())
        .args(["serve", "--db"])
        .arg(dir.path().join("x.db"))
        .args(["--policy", "hadare"])
        .output()
        .expect("gwjob");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not run HadarE's forked copies"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = Server::start(dir.path(), &["--policy", "fifo", "--round", "0.5"]);
    let mut req = job(2, 8);
    req.steps = None;
    let r: Result<SubmitReply, _> = s.call("POST", "/v1/jobs", &s.token, Some(&req));
    assert_eq!(status_of(&r), 400);
    assert!(
        message_of(&r).contains("the fifo policy, which needs each job's total steps"),
        "{}",
        message_of(&r)
    );
}

/// Both ranks of `job` run `steps`, every report saying the step took
/// `step_s`; none may be a checkpoint order.
fn run_steps(s: &Server, job: &str, token: &str, steps: &[(u64, f64)]) {
    for &(step, step_s) in steps {
        for rank in 0..2 {
            let p = s.step_begin(job, token, rank, step).expect("plan");
            assert!(!p.checkpoint, "step {step}");
            let mut e = end(rank, step, p.local_batch, step_s / 2.0);
            e.step_s = step_s;
            s.step_end(job, token, &e).expect("end");
        }
    }
}

/// Heartbeats `node` until it is asked for a store of `job`'s placement
/// `attempt`, reports one, and returns the launch's worker token.
fn launch_on(s: &Server, node: &str, job: &str, attempt: u32, port: u16) -> (String, String) {
    heartbeat_until(s, node, &Heartbeat::default(), "the job's store", |r| {
        r.open_stores
            .iter()
            .any(|o| o.job_id == job && o.attempt == attempt)
    });
    let r = s.heartbeat(node, &store(job, attempt, port));
    let l = r
        .launches
        .iter()
        .find(|l| l.job_id == job)
        .unwrap_or_else(|| panic!("no launch of {job} on {node}\n{}", s.stderr()));
    let token = env(l, "GW_JOB_TOKEN").expect("token").to_owned();
    let resume = env(l, "GW_RESUME_STEP").expect("resume").to_owned();
    (token, resume)
}

#[test]
fn a_job_without_throughput_is_profiled_on_each_type_before_the_policy_schedules_it() {
    let dir = TempDir::new("profile");
    let s = gavel_server(&dir, &["--profile-steps", "2"]);
    s.register_typed("f1", "r1", 2, "fast");
    s.register_typed("s1", "r2", 2, "slow");
    // One slot cannot hold the job's two workers: never profiled.
    s.register_typed("t1", "r3", 1, "tiny");
    let mut req = sched_job(100);
    req.throughput.clear();
    let a = s.submit(&req);

    // Types in name order: fast first. Step 0 (set-up) is not counted.
    let (token, resume) = launch_on(&s, "f1", &a, 0, 5001);
    assert_eq!(resume, "0");
    run_steps(&s, &a, &token, &[(0, 5.0), (1, 0.25), (2, 0.25)]);
    let st = s.status(&a);
    assert_eq!(
        st.measured_throughput,
        vec![DeviceThroughput {
            device_type: "fast".into(),
            steps_per_s: 4.0
        }]
    );
    assert!(st.preempting, "on to the next type: {st:?}");
    for rank in 0..2 {
        assert!(s.step_begin(&a, &token, rank, 3).expect("3").checkpoint);
    }
    s.heartbeat("f1", &exits(&a, 0));

    // Then slow, resuming at step 3; the median of 1.0 and 0.5 is 0.75.
    let (token, resume) = launch_on(&s, "s1", &a, 1, 5002);
    assert_eq!(resume, "3");
    run_steps(&s, &a, &token, &[(3, 9.0), (4, 1.0), (5, 0.5)]);
    let st = s.status(&a);
    let got: Vec<(String, f64)> = st
        .measured_throughput
        .iter()
        .map(|t| (t.device_type.clone(), t.steps_per_s))
        .collect();
    assert_eq!(
        got,
        vec![("fast".into(), 4.0), ("slow".into(), 1.0 / 0.75)],
        "{st:?}"
    );
    assert!(
        !st.preempting,
        "profiled everywhere: it stays until a round"
    );

    // From now on the policy schedules it with those figures: Gavel moves
    // a lone job to the type where it is three times faster.
    wait_for(Duration::from_secs(20), || {
        s.status(&a).preempting.then_some(())
    })
    .unwrap_or_else(|| panic!("the policy never moved the job\n{}", s.stderr()));
    for rank in 0..2 {
        assert!(s.step_begin(&a, &token, rank, 6).expect("6").checkpoint);
    }
    s.heartbeat("s1", &exits(&a, 1));
    let (token, resume) = launch_on(&s, "f1", &a, 2, 5003);
    assert_eq!(resume, "6");
    run_steps(&s, &a, &token, &[(6, 0.25)]);

    // A type that comes up later is profiled too: the running job is sent
    // there at the next round.
    s.register_typed("h1", "r4", 2, "huge");
    wait_for(Duration::from_secs(20), || {
        s.status(&a).preempting.then_some(())
    })
    .unwrap_or_else(|| panic!("the job was never sent to the new type\n{}", s.stderr()));
    for rank in 0..2 {
        assert!(s.step_begin(&a, &token, rank, 7).expect("7").checkpoint);
    }
    s.heartbeat("f1", &exits(&a, 2));
    let (_, resume) = launch_on(&s, "h1", &a, 3, 5004);
    assert_eq!(resume, "7");
    let text = event_texts(&s, &a);
    for want in [
        "to be profiled on 2 x fast (not yet measured on fast, slow)",
        "profiled on fast: 4.000 steps/s (median of steps 1..=2)",
        "preempted: to be profiled on slow next",
        "profiled on slow: 1.333 steps/s (median of steps 4..=5)",
        "preempted: it runs on 2 x slow, the policy gives it 2 x fast",
        "preempted: to be profiled on 2 x huge",
    ] {
        assert!(
            text.iter().any(|t| t.contains(want)),
            "{want:?} in {text:#?}"
        );
    }
    assert!(!text.iter().any(|t| t.contains("tiny")), "{text:#?}");
}

#[test]
fn attained_service_is_counted_per_type_and_survives_a_restart() {
    let dir = TempDir::new("service");
    let mut s = gavel_server(&dir, &[]);
    s.register("n1", "r1", 2);
    let a = s.submit(&sched_job(100));
    launch_on(&s, "n1", &a, 0, 5001);
    let before = wait_for(Duration::from_secs(20), || {
        let st = s.status(&a);
        st.service.first().filter(|d| d.seconds >= 0.6).cloned()
    })
    .unwrap_or_else(|| panic!("no service counted\n{}", s.stderr()));
    assert_eq!(before.device_type, "cpu");
    s.kill();
    // The policy's view of who has had what must not restart from zero.
    let s = gavel_server(&dir, &[]);
    let after = s.status(&a).service;
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(
        after[0].seconds >= before.seconds,
        "{before:?} then {after:?}"
    );
    let grown = wait_for(Duration::from_secs(20), || {
        let st = s.status(&a);
        (st.service[0].seconds > after[0].seconds).then_some(())
    });
    assert!(
        grown.is_some(),
        "a running job keeps gaining service\n{}",
        s.stderr()
    );
}
