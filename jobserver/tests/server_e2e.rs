//! The server with real `gwjob agent` processes and real workers (`sh`):
//! a job runs to success, a worker killed by a signal fails its job and the
//! other workers are stopped, and a `kill -9` of the server while workers
//! run is survived: after a restart on the same database and address the
//! agents reconnect, report the exits, and no rank is started twice.

mod server_support;

use gw_jobapi::types::*;
use server_support::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(dir: &Path, s: &Server, node: &str, rack: &str, slots: u32) -> Agent {
        let log = dir.join(format!("agent-{node}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(GWJOB)
            .args(["agent", "--server", &s.url, "--node", node, "--rack", rack])
            .args(["--slots", &slots.to_string()])
            .env("GW_ADMIN_TOKEN", &s.token)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("spawn gwjob agent");
        Agent { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(script: &str) -> SubmitRequest {
    let mut r = job(3, 12);
    r.program = "/bin/sh".into();
    r.args = vec!["-c".into(), script.into()];
    r
}

fn wait_state(
    s: &Server,
    id: &str,
    limit: Duration,
    done: impl Fn(&JobStatus) -> bool,
) -> JobStatus {
    wait_for(limit, || {
        let st = s.status(id);
        done(&st).then_some(st)
    })
    .unwrap_or_else(|| panic!("job {id} stuck: {:?}\n{}", s.status(id), s.stderr()))
}

fn ended(st: &JobStatus) -> bool {
    !matches!(st.state, JobState::Pending | JobState::Running)
}

#[test]
fn real_agents_run_jobs_to_success_and_failure() {
    let dir = TempDir::new("e2e");
    let s = Server::start(dir.path(), &["--node-timeout", "5"]);
    let a1 = Agent::start(dir.path(), &s, "n1", "r1", 2);
    let a2 = Agent::start(dir.path(), &s, "n2", "r1", 2);
    wait_for(Duration::from_secs(10), || {
        (a1.log().contains("registered") && a2.log().contains("registered")).then_some(())
    })
    .expect("agents register");

    let ok = s.submit(&sh(
        "test \"$GW_WORLD_SIZE\" = 3 && test -n \"$GW_STORE\" && test -n \"$GW_JOB_TOKEN\" \
         && test \"$MY_VAR\" = 1 && echo \"env ok rank $GW_RANK\"",
    ));
    let st = wait_state(&s, &ok, Duration::from_secs(20), ended);
    assert_eq!(
        st.state,
        JobState::Succeeded,
        "{st:?}\n{}\n{}",
        a1.log(),
        a2.log()
    );
    let logs = a1.log() + &a2.log();
    for r in 0..3 {
        assert!(logs.contains(&format!("env ok rank {r}")), "{logs}");
    }

    let bad = s.submit(&sh(
        "if [ \"$GW_RANK\" = 2 ]; then sleep 0.3; kill -9 $$; fi; sleep 60",
    ));
    let st = wait_state(&s, &bad, Duration::from_secs(20), ended);
    assert_eq!(st.state, JobState::Failed);
    let reason = st.reason.unwrap_or_default();
    assert!(
        reason.starts_with("rank 2 on node n") && reason.ends_with("was killed by signal 9"),
        "{reason}"
    );
    // The other ranks are stopped (their exits come back as signals).
    let st = wait_state(&s, &bad, Duration::from_secs(20), |st| {
        st.ranks.iter().all(|r| r.exit.is_some())
    });
    assert!(
        st.ranks[..2].iter().all(|r| r.exit.is_some_and(|e| e < 0)),
        "{st:?}"
    );
}

#[test]
fn kill_9_of_the_server_while_workers_run() {
    let dir = TempDir::new("e2e-restart");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let args = ["--node-timeout", "5"];
    let mut s = Server::start_on(dir.path(), &listen, &args);
    let a1 = Agent::start(dir.path(), &s, "n1", "r1", 2);
    let a2 = Agent::start(dir.path(), &s, "n2", "r1", 2);
    let id = s.submit(&sh("sleep 3; echo done $GW_RANK"));
    wait_state(&s, &id, Duration::from_secs(20), |st| {
        st.state == JobState::Running
            && a1.log().contains("started job")
            && a2.log().contains("started job")
    });
    s.kill();
    std::thread::sleep(Duration::from_millis(1500));
    let s = Server::start_on(dir.path(), &listen, &args);
    let st = wait_state(&s, &id, Duration::from_secs(30), ended);
    assert_eq!(
        st.state,
        JobState::Succeeded,
        "{st:?}\n{}\n{}",
        a1.log(),
        a2.log()
    );
    let logs = a1.log() + &a2.log();
    for r in 0..3 {
        let started = logs.matches(&format!("started job {id} rank {r} ")).count();
        assert_eq!(started, 1, "rank {r} started {started} times:\n{logs}");
    }
}
