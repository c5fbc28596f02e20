//! Nodes and the heartbeat flow, with fake agents written here: placement
//! (fill nodes, fewest racks), the store-then-launch handshake with the full
//! worker environment, exits deciding a job's fate, stops for the other
//! nodes, cancel, and nodes that stop heartbeating.

mod server_support;

use gw_jobapi::types::*;
use server_support::*;
use std::time::Duration;

fn nodes_of(st: &JobStatus) -> Vec<String> {
    st.ranks.iter().map(|r| r.node.clone()).collect()
}

#[test]
fn placement_fills_nodes_and_keeps_jobs_in_few_racks() {
    let dir = TempDir::new("place");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    s.register("a1", "ra", 2);
    s.register("a2", "ra", 2);
    s.register("b1", "rb", 3);
    // 4 ranks fit in rack ra alone (b1 is bigger but its rack holds only 3).
    let j1 = s.submit(&job(4, 8));
    assert_eq!(nodes_of(&s.status(&j1)), ["a1", "a1", "a2", "a2"]);
    // 2 more fill b1 (the only free rack); 2 more do not fit: pending.
    let j2 = s.submit(&job(2, 8));
    assert_eq!(nodes_of(&s.status(&j2)), ["b1", "b1"]);
    let j3 = s.submit(&job(2, 8));
    let st3 = s.status(&j3);
    assert_eq!(st3.state, JobState::Pending);
    assert!(st3.ranks.is_empty());
    // A new node makes room: placed on the next heartbeat/registration.
    s.register("c1", "rc", 2);
    assert_eq!(nodes_of(&s.status(&j3)), ["c1", "c1"]);
    assert_eq!(s.status(&j3).state, JobState::Running);
    // Cancelling j2 frees b1 (its ranks were never launched).
    let c: JobStatus = s.post(&format!("/v1/jobs/{j2}/cancel"), &());
    assert_eq!(c.state, JobState::Cancelled);
    let j4 = s.submit(&job(1, 8));
    assert_eq!(nodes_of(&s.status(&j4)), ["b1"]);
}

#[test]
fn store_then_launch_then_exits_decide_the_job() {
    let dir = TempDir::new("flow");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    s.register("n1", "r1", 2);
    s.register("n2", "r1", 2);
    let mut req = job(3, 12);
    req.env.push(("GW_ALGO".into(), "ring".into()));
    let id = s.submit(&req);
    // n2 holds rank 2 only: nothing for it before the store exists.
    let hb2 = s.heartbeat("n2", &Heartbeat::default());
    assert!(
        hb2.open_stores.is_empty() && hb2.launches.is_empty(),
        "{hb2:?}"
    );
    // n1 holds rank 0: asked to open the store, again until it reports it.
    let hb1 = s.heartbeat("n1", &Heartbeat::default());
    assert_eq!(hb1.open_stores.len(), 1);
    assert_eq!(hb1.open_stores[0].job_id, id);
    assert!(hb1.launches.is_empty());
    let again = s.heartbeat("n1", &Heartbeat::default());
    assert_eq!(again.open_stores, hb1.open_stores);
    let store_token = hb1.open_stores[0].store_token.clone();
    let launches = launch(&s, &id, &["n1", "n2"]);
    let (l1, l2) = (&launches[0], &launches[1]);
    assert_eq!(l1.len(), 1, "{l1:?}");
    assert_eq!(l2.len(), 1, "{l2:?}");
    assert_eq!(l1[0].ranks, vec![0, 1]);
    assert_eq!(l2[0].ranks, vec![2]);
    for (l, local) in [(&l1[0], "2"), (&l2[0], "1")] {
        assert_eq!(l.world, 3);
        assert_eq!(l.program, "/bin/true");
        assert_eq!(l.args, vec!["a"]);
        assert_eq!(env(l, "GW_WORLD_SIZE"), Some("3"));
        assert_eq!(env(l, "GW_LOCAL_SIZE"), Some(local));
        assert_eq!(env(l, "GW_STORE"), Some("127.0.0.1:5555"));
        assert_eq!(env(l, "GW_TOKEN"), Some(store_token.as_str()));
        assert_eq!(env(l, "GW_JOB_ID"), Some(id.as_str()));
        assert_eq!(env(l, "GW_JOB_SERVER"), Some(s.url.as_str()));
        assert!(env(l, "GW_JOB_TOKEN").is_some_and(|t| t.len() == 32 && t != s.token));
        assert_eq!(env(l, "MY_VAR"), Some("1"));
        assert_eq!(env(l, "GW_ALGO"), Some("ring"));
    }
    // Launches are repeated (agents start a rank once) until each rank is
    // confirmed by a step/begin or an exit.
    assert_eq!(s.heartbeat("n1", &Heartbeat::default()).launches, *l1);
    assert_eq!(s.heartbeat("n2", &Heartbeat::default()).launches, *l2);
    let token = env(&l1[0], "GW_JOB_TOKEN").unwrap().to_owned();
    // The step plan carries the job's algorithm.
    assert_eq!(s.step_begin(&id, &token, 0, 0).unwrap().algo, "ring");
    assert_eq!(s.heartbeat("n1", &Heartbeat::default()).launches, *l1);
    s.step_begin(&id, &token, 1, 0).unwrap();
    assert!(s.heartbeat("n1", &Heartbeat::default()).launches.is_empty());
    assert_eq!(s.heartbeat("n2", &Heartbeat::default()).launches, *l2);
    // Exits, with a duplicate: success once every rank exited 0.
    let exit = |rank| WorkerExit {
        job_id: id.clone(),
        attempt: 0,
        rank,
        code: Some(0),
        signal: None,
    };
    let hb = |exits| Heartbeat {
        stores: vec![],
        exits,
    };
    s.heartbeat("n1", &hb(vec![exit(0), exit(1), exit(0)]));
    assert_eq!(s.status(&id).state, JobState::Running);
    s.heartbeat("n2", &hb(vec![exit(2)]));
    assert!(s.heartbeat("n2", &Heartbeat::default()).launches.is_empty());
    let st = s.status(&id);
    assert_eq!(st.state, JobState::Succeeded, "{st:?}");
    assert_eq!(
        st.ranks.iter().map(|r| r.exit).collect::<Vec<_>>(),
        [Some(0); 3]
    );
    assert!(s.heartbeat("n1", &Heartbeat::default()).stops.is_empty());
}

#[test]
fn a_failing_worker_fails_the_job_and_stops_the_others() {
    let dir = TempDir::new("fail");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    s.register("n1", "r1", 2);
    s.register("n2", "r1", 2);
    let id = s.submit(&job(3, 12));
    let launches = launch(&s, &id, &["n1", "n2"]);
    let token = env(&launches[0][0], "GW_JOB_TOKEN").unwrap().to_owned();
    s.step_begin(&id, &token, 0, 0).unwrap();
    // Rank 2 on n2 is killed by signal 9 (reported twice).
    let killed = WorkerExit {
        job_id: id.clone(),
        attempt: 0,
        rank: 2,
        code: None,
        signal: Some(9),
    };
    let hb = Heartbeat {
        stores: vec![],
        exits: vec![killed.clone(), killed],
    };
    let r2 = s.heartbeat("n2", &hb);
    assert!(r2.stops.is_empty(), "n2 has no other rank running: {r2:?}");
    let st = s.status(&id);
    assert_eq!(st.state, JobState::Failed);
    assert_eq!(
        st.reason.as_deref(),
        Some("rank 2 on node n2 was killed by signal 9")
    );
    assert_eq!(st.ranks[2].exit, Some(-9));
    // n1 is told to stop the job until its ranks report their exits.
    assert_eq!(
        s.heartbeat("n1", &Heartbeat::default()).stops,
        vec![id.clone()]
    );
    assert_eq!(
        s.heartbeat("n1", &Heartbeat::default()).stops,
        vec![id.clone()]
    );
    // Workers learn it through the step protocol too.
    let b = s.step_begin(&id, &token, 0, 1);
    assert_eq!(status_of(&b), 409);
    assert!(
        message_of(&b).contains("rank 2 on node n2 was killed by signal 9"),
        "{b:?}"
    );
    assert!(s.step_end(&id, &token, &end(0, 0, 4, 0.1)).unwrap().stop);
    let exits = (0..2)
        .map(|rank| WorkerExit {
            job_id: id.clone(),
            attempt: 0,
            rank,
            code: None,
            signal: Some(15),
        })
        .collect();
    let r1 = s.heartbeat(
        "n1",
        &Heartbeat {
            stores: vec![],
            exits,
        },
    );
    assert!(r1.stops.is_empty(), "{r1:?}");
    // The first failure stays the reason.
    assert_eq!(
        s.status(&id).reason.as_deref(),
        Some("rank 2 on node n2 was killed by signal 9")
    );

    // A nonzero exit status reads as such.
    let id2 = s.submit(&job(1, 4));
    let placed = s.status(&id2).ranks[0].node.clone();
    let l = launch(&s, &id2, &[&placed]);
    assert_eq!(l[0].len(), 1);
    s.heartbeat(
        &placed,
        &Heartbeat {
            stores: vec![],
            exits: vec![WorkerExit {
                job_id: id2.clone(),
                attempt: 0,
                rank: 0,
                code: Some(3),
                signal: None,
            }],
        },
    );
    assert_eq!(
        s.status(&id2).reason,
        Some(format!("rank 0 on node {placed} exited with status 3"))
    );
}

#[test]
fn cancel_stops_launched_ranks() {
    let dir = TempDir::new("cancel");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let (id, token) = running_job(&s, "n1", &job(2, 8));
    let st: JobStatus = s.post(&format!("/v1/jobs/{id}/cancel"), &());
    assert_eq!(st.state, JobState::Cancelled);
    assert_eq!(
        s.heartbeat("n1", &Heartbeat::default()).stops,
        vec![id.clone()]
    );
    let b = s.step_begin(&id, &token, 0, 0);
    assert_eq!(status_of(&b), 409);
    assert!(message_of(&b).contains("was cancelled"), "{b:?}");
    // Cancel again: no change; the ranks' exits end the stops.
    let again: JobStatus = s.post(&format!("/v1/jobs/{id}/cancel"), &());
    assert_eq!(again.state, JobState::Cancelled);
    let exits = (0..2)
        .map(|rank| WorkerExit {
            job_id: id.clone(),
            attempt: 0,
            rank,
            code: None,
            signal: Some(15),
        })
        .collect();
    let r = s.heartbeat(
        "n1",
        &Heartbeat {
            stores: vec![],
            exits,
        },
    );
    assert!(r.stops.is_empty());
    assert_eq!(s.status(&id).state, JobState::Cancelled);
}

#[test]
fn a_silent_node_is_lost_and_fails_its_jobs() {
    let dir = TempDir::new("lost");
    let s = Server::start(dir.path(), &["--node-timeout", "1"]);
    s.register("n1", "r1", 1);
    s.register("n2", "r1", 1);
    let id = s.submit(&job(2, 8));
    launch(&s, &id, &["n1", "n2"]);
    // n1 keeps heartbeating, n2 goes silent.
    let st = wait_for(Duration::from_secs(8), || {
        s.heartbeat("n1", &Heartbeat::default());
        let st = s.status(&id);
        (st.state != JobState::Running).then_some(st)
    })
    .expect("job should fail once n2 is lost");
    assert_eq!(st.state, JobState::Failed);
    assert_eq!(
        st.reason.as_deref(),
        Some("node n2 lost (no heartbeat for 1 s)")
    );
    assert_eq!(
        s.heartbeat("n1", &Heartbeat::default()).stops,
        vec![id.clone()]
    );
    // A lost node is not used for placement until it heartbeats again.
    let j2 = s.submit(&job(2, 8));
    assert_eq!(s.status(&j2).state, JobState::Pending);
    let back = s.heartbeat("n2", &Heartbeat::default());
    assert_eq!(
        back.stops,
        vec![id.clone()],
        "n2 must stop the failed job's rank"
    );
    let exit = |rank| Heartbeat {
        stores: vec![],
        exits: vec![WorkerExit {
            job_id: id.clone(),
            attempt: 0,
            rank,
            code: None,
            signal: Some(15),
        }],
    };
    s.heartbeat("n1", &exit(0));
    s.heartbeat("n2", &exit(1));
    assert_eq!(s.status(&j2).state, JobState::Running);
    s.stderr_when("n2's loss", |l| {
        l.contains("node n2 lost (no heartbeat for 1 s)")
    });
}

#[test]
fn an_agent_restart_ends_its_ranks_and_fails_their_job() {
    let dir = TempDir::new("reregister");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    s.register("n1", "r1", 1);
    s.register("n2", "r1", 1);
    let id = s.submit(&job(2, 8));
    launch(&s, &id, &["n1", "n2"]);
    // n2's agent restarts (its workers died with it) and registers again.
    s.register("n2", "r1", 1);
    let st = s.status(&id);
    assert_eq!(st.state, JobState::Failed);
    assert_eq!(
        st.reason.as_deref(),
        Some("rank 1 on node n2 was lost: the node's agent restarted")
    );
    assert_eq!(st.ranks[1].exit, None);
    // Nothing is re-sent to the new agent; n1 is told to stop; n2's slot is
    // free again.
    let hb2 = s.heartbeat("n2", &Heartbeat::default());
    assert!(hb2.launches.is_empty() && hb2.stops.is_empty(), "{hb2:?}");
    assert_eq!(s.heartbeat("n1", &Heartbeat::default()).stops, vec![id]);
    let j2 = s.submit(&job(1, 8));
    assert_eq!(s.status(&j2).ranks[0].node, "n2");
}
