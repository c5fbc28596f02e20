//! `gwjob agent` running real jobs for a real `gwjob serve`: two agents on
//! this machine act as two nodes. What the agent owes its workers and the
//! server is checked from the outside: the variables each worker gets, the
//! `[job:rank]` output, the exit reports that make the server's verdict, and
//! that stopping a job (or the agent) leaves no process behind.

mod agent_support;

use agent_support::*;
use gw_jobapi::types::JobState;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);

fn start(dir: &TempDir) -> Server {
    Server::start(
        &dir.path().join("db"),
        "127.0.0.1:0",
        &dir.path().join("server.log"),
        &["--node-timeout", "10"],
    )
}

#[test]
fn two_agents_run_a_three_worker_job_to_success() {
    let dir = TempDir::new("ok");
    let s = start(&dir);
    let a = Agent::start(dir.path(), &s.url, "node-a", 2);
    let b = Agent::start(dir.path(), &s.url, "node-b", 1);
    a.wait_log("registered node node-a", T);
    b.wait_log("registered node node-b", T);

    let id = s.submit(&sh_job(
        3,
        "echo \"env rank=$GW_RANK local=$GW_LOCAL_RANK/$GW_LOCAL_SIZE world=$GW_WORLD_SIZE \
         store=$GW_STORE job=$GW_JOB_ID jobtoken=${GW_JOB_TOKEN:+set} \
         storetoken=${GW_TOKEN:+set} server=${GW_JOB_SERVER:+set} \
         admin=${GW_ADMIN_TOKEN:-unset}\"",
    ));
    let logs = || a.log() + &b.log();
    let st = s.wait_job(&id, T, ended, logs);
    assert_eq!(st.state, JobState::Succeeded, "{st:?}\n{}", logs());
    assert!(st.ranks.iter().all(|r| r.exit == Some(0)), "{st:?}");

    // Every rank ran once, with its numbers, on the node the server chose.
    let node_of: BTreeMap<u32, String> =
        st.ranks.iter().map(|r| (r.rank, r.node.clone())).collect();
    let store = st
        .ranks
        .iter()
        .find(|r| r.rank == 0)
        .map(|r| if r.node == "node-a" { a.log() } else { b.log() })
        .unwrap_or_default();
    let opened = format!("opened the rendezvous store of job {id} at ");
    let store_addr = store
        .lines()
        .find_map(|l| l.split_once(&opened).map(|(_, a)| a.to_owned()))
        .unwrap_or_else(|| panic!("rank 0's agent did not open the store:\n{store}"));
    for (rank, node) in &node_of {
        let log = if node == "node-a" { a.log() } else { b.log() };
        let mine: Vec<u32> = node_of
            .iter()
            .filter(|(_, n)| *n == node)
            .map(|(r, _)| *r)
            .collect();
        let local = mine.iter().position(|r| r == rank).unwrap_or(usize::MAX);
        let want = format!(
            "[{id}:{rank}] env rank={rank} local={local}/{} world=3 store={store_addr} job={id} \
             jobtoken=set storetoken=set server=set admin=unset",
            mine.len()
        );
        assert_eq!(
            log.matches(&want).count(),
            1,
            "want {want:?} in {node}'s log:\n{log}"
        );
        let started = format!("started job {id} rank {rank} ");
        assert_eq!(log.matches(&started).count(), 1, "{log}");
    }
}

#[test]
fn a_worker_exiting_3_fails_the_job_and_the_others_are_stopped() {
    let dir = TempDir::new("fail");
    let s = start(&dir);
    let a = Agent::start(dir.path(), &s.url, "node-a", 2);
    let b = Agent::start(dir.path(), &s.url, "node-b", 1);
    a.wait_log("registered", T);
    b.wait_log("registered", T);

    // Each worker records its pid and a child's; once all three are running
    // rank 1 exits 3, the others would wait a minute for their child.
    let mut req = sh_job(
        3,
        "f=$AGENT_TEST_DIR/pid-$GW_RANK; echo $$ >> $f; sleep 60 & echo $! >> $f; \
         if [ \"$GW_RANK\" = 1 ]; then \
           n=0; while [ $(cat $AGENT_TEST_DIR/pid-* | wc -l) -lt 6 ] && [ $n -lt 400 ]; do \
             sleep 0.05; n=$((n + 1)); done; \
           exit 3; \
         fi; wait",
    );
    req.env = vec![("AGENT_TEST_DIR".into(), dir.path().display().to_string())];
    let id = s.submit(&req);
    let logs = || a.log() + &b.log();
    let st = s.wait_job(&id, T, ended, logs);
    let failed_at = Instant::now();
    assert_eq!(st.state, JobState::Failed, "{st:?}");
    let node1 = st
        .ranks
        .iter()
        .find(|r| r.rank == 1)
        .map(|r| r.node.clone())
        .unwrap_or_default();
    assert_eq!(
        st.reason.as_deref(),
        Some(format!("rank 1 on node {node1} exited with status 3").as_str()),
        "{st:?}"
    );

    // The other ranks are stopped by their agents and reported as signalled.
    let st = s.wait_job(&id, T, |st| st.ranks.iter().all(|r| r.exit.is_some()), logs);
    assert!(
        failed_at.elapsed() < Duration::from_secs(10),
        "stopping took {:?}",
        failed_at.elapsed()
    );
    for r in &st.ranks {
        let want = if r.rank == 1 {
            Some(3)
        } else {
            Some(-libc::SIGTERM)
        };
        assert_eq!(r.exit, want, "rank {}: {st:?}", r.rank);
    }
    let logs = logs();
    assert!(
        logs.contains(&format!("stopping job {id} (the server asked)")),
        "{logs}"
    );

    // Workers and everything they started are gone.
    let pids = pids_in(dir.path());
    assert_eq!(pids.len(), 6, "{pids:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "processes left: {left:?}\n{logs}");
}

#[test]
fn sigterm_stops_the_agents_workers_reports_them_and_exits_0() {
    let dir = TempDir::new("term");
    let s = start(&dir);
    let mut a = Agent::start(dir.path(), &s.url, "node-t", 2);
    a.wait_log("registered", T);
    // Rank 1 ignores SIGTERM: the agent must escalate to SIGKILL.
    let mut req = sh_job(
        2,
        "echo $$ >> $AGENT_TEST_DIR/pid-$GW_RANK; \
         if [ \"$GW_RANK\" = 1 ]; then trap '' TERM; fi; \
         while :; do sleep 0.1; done",
    );
    req.env = vec![("AGENT_TEST_DIR".into(), dir.path().display().to_string())];
    let id = s.submit(&req);
    a.wait_log(&format!("started job {id} rank 1 "), T);
    std::thread::sleep(Duration::from_millis(300));

    let t = Instant::now();
    a.signal(libc::SIGTERM);
    let code = a.wait_exit(Duration::from_secs(20));
    let log = a.log();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        t.elapsed() >= Duration::from_secs(4),
        "no grace period:\n{log}"
    );
    assert!(
        log.contains("received SIGTERM; stopping 2 worker(s)"),
        "{log}"
    );
    assert!(
        log.contains("still running 5 s after SIGTERM; sending SIGKILL"),
        "{log}"
    );
    let pids = pids_in(dir.path());
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|p| !alive(*p)), "{pids:?}");

    // Its last heartbeat carried the exits: the job failed, naming the node.
    let st = s.wait_job(&id, T, ended, || log.clone());
    assert_eq!(st.state, JobState::Failed);
    let reason = st.reason.unwrap_or_default();
    assert!(
        reason.contains("on node node-t was killed by signal"),
        "{reason}"
    );
}

#[test]
fn a_killed_agent_takes_its_workers_along_and_its_restart_fails_their_job() {
    let dir = TempDir::new("crash");
    let s = start(&dir);
    let mut a = Agent::start(dir.path(), &s.url, "node-k", 1);
    a.wait_log("registered", T);
    let mut req = sh_job(1, "echo $$ > $AGENT_TEST_DIR/pid-0; exec sleep 60");
    req.env = vec![("AGENT_TEST_DIR".into(), dir.path().display().to_string())];
    let id = s.submit(&req);
    a.wait_log(&format!("started job {id} rank 0 "), T);
    let deadline = Instant::now() + T;
    while pids_in(dir.path()).is_empty() {
        assert!(Instant::now() < deadline, "the worker never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));

    // kill -9 of the agent: its worker dies with it, unreported.
    let _ = a.child.kill();
    let _ = a.child.wait();
    let pid = pids_in(dir.path())[0];
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "worker {pid} outlived its agent");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.status(&id).state, JobState::Running);

    // The next agent of the node registers it again: the server then knows
    // the old workers are gone, well before the node would time out.
    let t = Instant::now();
    let b = Agent::start(dir.path(), &s.url, "node-k", 1);
    let st = s.wait_job(&id, T, ended, || b.log());
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(st.state, JobState::Failed);
    let reason = st.reason.unwrap_or_default();
    assert!(reason.starts_with("rank 0 on node node-k "), "{reason}");
}
