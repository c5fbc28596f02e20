//! Who may do what, against a real `gwjob serve` on loopback: a node token
//! (from `gwjob node-token`) acts as its own node and nothing else; a
//! submit token (from `gwjob token`) runs jobs but is no node and issues
//! nothing; re-issuing or revoking a token ends it, a restart does not; the
//! database keeps no usable copy; real agents run with a node token, and an
//! agent still started with the admin token works but says what it risks.

mod server_support;

use gw_jobapi::types::*;
use serde_json::{Value, json};
use server_support::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// `gwjob ARGS --server URL --token-file admin.token`.
fn gwjob_admin(s: &Server, dir: &Path, args: &[&str]) -> Output {
    Command::new(gwjob())
        .args(args)
        .arg("--server")
        .arg(&s.url)
        .arg("--token-file")
        .arg(dir.join("admin.token"))
        .env_remove("GW_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run gwjob")
}

/// `gwjob node-token --node NODE --out FILE`.
fn node_token_to(s: &Server, dir: &Path, node: &str, file: &Path) -> Output {
    let file = file.to_str().expect("a UTF-8 temporary path");
    gwjob_admin(s, dir, &["node-token", "--node", node, "--out", file])
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Issues a token with `gwjob ARGS` (printed on stdout) and returns it.
fn issue(s: &Server, dir: &Path, args: &[&str]) -> String {
    let o = gwjob_admin(s, dir, args);
    assert_eq!(o.status.code(), Some(0), "gwjob {args:?}: {}", stderr(&o));
    let t = stdout(&o).trim().to_owned();
    assert!(t.len() >= 32, "gwjob {args:?} printed {t:?}");
    t
}

fn register_body(node: &str) -> RegisterNode {
    RegisterNode {
        node: node.into(),
        rack: "r1".into(),
        slots: 1,
        device_type: "cpu".into(),
        addr: "127.0.0.1".into(),
    }
}

fn register(
    s: &Server,
    token: &str,
    node: &str,
) -> Result<RegisterReply, gw_jobapi::http::HttpError> {
    s.call(
        "POST",
        "/v1/nodes/register",
        token,
        Some(&register_body(node)),
    )
}

fn heartbeat(
    s: &Server,
    token: &str,
    node: &str,
) -> Result<HeartbeatReply, gw_jobapi::http::HttpError> {
    s.call(
        "POST",
        &format!("/v1/nodes/{node}/heartbeat"),
        token,
        Some(&Heartbeat::default()),
    )
}

/// The job-side endpoints, each with a body that would pass.
fn job_calls(job: &str) -> Vec<(&'static str, String, Option<Value>)> {
    vec![
        (
            "POST",
            "/v1/jobs".into(),
            Some(serde_json::to_value(job_req()).expect("a job encodes")),
        ),
        ("GET", "/v1/jobs".into(), None),
        ("GET", format!("/v1/jobs/{job}"), None),
        ("GET", format!("/v1/jobs/{job}/events"), None),
        ("POST", format!("/v1/jobs/{job}/cancel"), None),
        (
            "POST",
            format!("/v1/jobs/{job}/global_batch"),
            Some(json!({"step": 5, "global_batch": 8})),
        ),
    ]
}

/// The token endpoints.
fn token_calls() -> Vec<(&'static str, String, Option<Value>)> {
    vec![
        (
            "POST",
            "/v1/tokens".into(),
            Some(json!({"role": "node", "name": "n9"})),
        ),
        (
            "POST",
            "/v1/tokens".into(),
            Some(json!({"role": "submit", "name": "me"})),
        ),
        ("DELETE", "/v1/tokens/node/n1".into(), None),
        ("DELETE", "/v1/tokens/submit/ci".into(), None),
    ]
}

fn job_req() -> SubmitRequest {
    job(1, 8)
}

#[test]
fn a_node_token_acts_as_its_own_node_and_nothing_else() {
    let dir = TempDir::new("roles-node");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    // Written by gwjob to a new file only its owner can read.
    let file = dir.path().join("n1.token");
    let o = node_token_to(&s, dir.path(), "n1", &file);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("node token for n1 written to"),
        "{}",
        stdout(&o)
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file)
            .expect("token file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let n1 = std::fs::read_to_string(&file)
        .expect("token file")
        .trim()
        .to_owned();
    // An existing file is never overwritten, and nothing is issued then
    // (the token in the file still registers n1 below).
    let o = node_token_to(&s, dir.path(), "n1", &file);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stderr(&o).contains("cannot create"), "{}", stderr(&o));

    // Another node, registered by the admin, with a job on it.
    let (job_id, worker_token) = running_job(&s, "n2", &job_req());
    let reply = register(&s, &n1, "n1").expect("n1 registers with its own token");
    assert_eq!(reply.role, Some(Role::Node));
    heartbeat(&s, &n1, "n1").expect("n1 heartbeats with its own token");

    let r = register(&s, &n1, "n2");
    assert_eq!(status_of(&r), 403, "{r:?}");
    let m = message_of(&r);
    assert!(m.contains("node n1") && m.contains("node n2"), "{m}");
    let r = heartbeat(&s, &n1, "n2");
    assert_eq!(status_of(&r), 403, "{r:?}");
    assert!(message_of(&r).contains("cannot act as node n2"), "{r:?}");
    for (method, path, body) in job_calls(&job_id).into_iter().chain(token_calls()) {
        let r = s.call::<Value, Value>(method, &path, &n1, body.as_ref());
        assert_eq!(status_of(&r), 403, "{method} {path} with n1's token: {r:?}");
    }
    // The workers' endpoints answer a node token as any stranger: 401.
    let r = s.step_begin(&job_id, &n1, 0, 0);
    assert_eq!(status_of(&r), 401, "{r:?}");

    // Nothing the refused calls asked for happened.
    let st = s.status(&job_id);
    assert_eq!(st.state, JobState::Running, "{st:?}");
    let jobs: Vec<JobStatus> = s.get("/v1/jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(s.step_begin(&job_id, &worker_token, 0, 0).is_ok());
    // Refusals are logged with the peer, like wrong tokens.
    s.stderr_when("the 403 with its peer", |l| {
        l.contains("403 for 127.0.0.1:")
    });
}

#[test]
fn a_submit_token_runs_jobs_but_is_no_node_and_issues_nothing() {
    let dir = TempDir::new("roles-submit");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let ci = issue(
        &s,
        dir.path(),
        &["token", "--role", "submit", "--name", "ci"],
    );
    s.register("n1", "r1", 4);

    let id: SubmitReply = s
        .call("POST", "/v1/jobs", &ci, Some(&job_req()))
        .expect("a submit token submits");
    let st: JobStatus = s
        .call::<(), _>("GET", &format!("/v1/jobs/{}", id.job_id), &ci, None)
        .expect("and reads its job");
    assert_eq!(st.job_id, id.job_id);
    // Jobs submitted by others too (documented: submit tokens see all jobs).
    let other = s.submit(&job_req());
    let list: Vec<JobStatus> = s.call::<(), _>("GET", "/v1/jobs", &ci, None).expect("list");
    assert_eq!(list.len(), 2, "{list:?}");
    // The gwjob client takes a submit token from --token-file.
    let tok = dir.path().join("ci.token");
    std::fs::write(&tok, format!("{ci}\n")).expect("write token");
    let o = Command::new(gwjob())
        .args(["cancel", &other, "--server", &s.url, "--token-file"])
        .arg(&tok)
        .env_remove("GW_ADMIN_TOKEN")
        .output()
        .expect("gwjob cancel");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(s.status(&other).state, JobState::Cancelled);

    for r in [register(&s, &ci, "n1"), register(&s, &ci, "n7")] {
        assert_eq!(status_of(&r), 403, "{r:?}");
        assert!(message_of(&r).contains("submit token ci"), "{r:?}");
    }
    assert_eq!(status_of(&heartbeat(&s, &ci, "n1")), 403);
    for (method, path, body) in token_calls() {
        let r = s.call::<Value, Value>(method, &path, &ci, body.as_ref());
        assert_eq!(
            status_of(&r),
            403,
            "{method} {path} with a submit token: {r:?}"
        );
    }
    // The refused registration did not add a node.
    let r = heartbeat(&s, &s.token, "n7");
    assert_eq!(status_of(&r), 404, "{r:?}");
    // A submit token cannot be issued under a role that does not exist.
    let r = s.call::<Value, Value>(
        "POST",
        "/v1/tokens",
        &s.token,
        Some(&json!({"role": "admin", "name": "x"})),
    );
    assert_eq!(status_of(&r), 400, "{r:?}");
}

#[test]
fn reissued_and_revoked_tokens_stop_working_and_a_restart_changes_nothing() {
    let dir = TempDir::new("roles-revoke");
    let mut s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let old = issue(&s, dir.path(), &["node-token", "--node", "n1"]);
    register(&s, &old, "n1").expect("registers");
    let ci = issue(&s, dir.path(), &["token", "--name", "ci"]);

    // Only hashes are stored: neither token appears in the database files.
    let mut stored = Vec::new();
    for f in ["server.db", "server.db-wal"] {
        stored.extend(std::fs::read(dir.path().join(f)).unwrap_or_default());
    }
    assert!(!stored.is_empty());
    for t in [&old, &ci] {
        let found = stored.windows(t.len()).any(|w| w == t.as_bytes());
        assert!(!found, "a token is stored in the clear");
    }

    // Issuing again replaces the token.
    let new = issue(&s, dir.path(), &["node-token", "--node", "n1"]);
    assert_ne!(old, new);
    assert_eq!(status_of(&heartbeat(&s, &old, "n1")), 401);
    heartbeat(&s, &new, "n1").expect("the new token works");

    // Tokens survive a restart (kill -9) of the server.
    s.kill();
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    heartbeat(&s, &new, "n1").expect("the node token works after a restart");
    s.call::<(), Vec<JobStatus>>("GET", "/v1/jobs", &ci, None)
        .expect("the submit token works after a restart");

    let o = gwjob_admin(&s, dir.path(), &["node-token", "--revoke", "n1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "node token for n1 revoked\n");
    let r = heartbeat(&s, &new, "n1");
    assert_eq!(status_of(&r), 401, "{r:?}");
    let o = gwjob_admin(&s, dir.path(), &["token", "--revoke", "ci"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = s.call::<(), Vec<JobStatus>>("GET", "/v1/jobs", &ci, None);
    assert_eq!(status_of(&r), 401, "{r:?}");
    // Revoking what is not there says so.
    let o = gwjob_admin(&s, dir.path(), &["node-token", "--revoke", "n1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no node token for n1"),
        "{}",
        stderr(&o)
    );
    // The admin's node is untouched by its token's revocation.
    heartbeat(&s, &s.token, "n1").expect("the admin token still acts as n1");
}

/// A real `gwjob agent` for `node`, with the token in `token_file`, or
/// `GW_ADMIN_TOKEN` when it is None; output to `dir/agent-NODE.log`.
fn agent(dir: &Path, s: &Server, node: &str, token_file: Option<&Path>) -> (Child, PathBuf) {
    let log = dir.join(format!("agent-{node}.log"));
    let file = std::fs::File::create(&log).expect("agent log");
    let mut c = Command::new(gwjob());
    c.args(["agent", "--server", &s.url, "--node", node, "--slots", "1"])
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file);
    match token_file {
        Some(f) => c.arg("--token-file").arg(f).env_remove("GW_ADMIN_TOKEN"),
        None => c.env("GW_ADMIN_TOKEN", &s.token),
    };
    (c.spawn().expect("spawn gwjob agent"), log)
}

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

#[test]
fn agents_run_jobs_with_their_node_token_and_the_admin_token_still_works() {
    const LONG: Duration = Duration::from_secs(60);
    let dir = TempDir::new("roles-agents");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let file = dir.path().join("a.token");
    let o = node_token_to(&s, dir.path(), "a", &file);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let (a, a_log) = agent(dir.path(), &s, "a", Some(&file));
    let _a = Reaped(a);
    let (b, b_log) = agent(dir.path(), &s, "b", None);
    let _b = Reaped(b);
    let registered = |log: &Path, node: &str| {
        wait_for(LONG, || {
            read(log)
                .contains(&format!("registered node {node}"))
                .then_some(())
        })
    };
    assert!(registered(&a_log, "a").is_some(), "{}", read(&a_log));
    assert!(registered(&b_log, "b").is_some(), "{}", read(&b_log));
    assert!(
        read(&b_log).contains("runs with the admin token"),
        "{}",
        read(&b_log)
    );
    assert!(!read(&a_log).contains("admin token"), "{}", read(&a_log));
    s.stderr_when("the admin-token warning for node b", |l| {
        l.contains("node b registered with the admin token")
    });

    // One job on each node (one slot each), both run to success.
    let ids = [s.submit(&job_req()), s.submit(&job_req())];
    for id in &ids {
        let done = wait_for(LONG, || {
            let st = s.status(id);
            (!matches!(st.state, JobState::Pending | JobState::Running)).then_some(st)
        });
        let st =
            done.unwrap_or_else(|| panic!("{id} did not end:\n{}\n{}", read(&a_log), read(&b_log)));
        assert_eq!(st.state, JobState::Succeeded, "{st:?}");
    }
    let nodes: Vec<String> = ids
        .iter()
        .map(|id| s.status(id).ranks[0].node.clone())
        .collect();
    assert!(
        nodes.contains(&"a".to_owned()) && nodes.contains(&"b".to_owned()),
        "{nodes:?}"
    );

    // An agent whose token is another node's is refused and exits 1,
    // naming both nodes, instead of retrying forever.
    let (mut c, c_log) = agent(dir.path(), &s, "c", Some(&file));
    let code = wait_for(LONG, || c.try_wait().ok().flatten());
    let _ = c.kill();
    let _ = c.wait();
    let code = code.and_then(|st| st.code());
    assert_eq!(code, Some(1), "{}", read(&c_log));
    let log = read(&c_log);
    assert!(
        log.contains("403") && log.contains("node a") && log.contains("node c"),
        "{log}"
    );

    // Revoked, agent a is refused from its next heartbeat on, and says why
    // (it keeps retrying, as for a server that is down).
    let o = gwjob_admin(&s, dir.path(), &["node-token", "--revoke", "a"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let refused = wait_for(LONG, || {
        read(&a_log)
            .contains("the job server refuses this agent's token")
            .then_some(())
    });
    assert!(refused.is_some(), "{}", read(&a_log));
}
