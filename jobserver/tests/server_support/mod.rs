//! Shared by the `server_*` integration tests: a real `gwjob serve` child
//! process on 127.0.0.1:0 with its own temporary database, driven over HTTP
//! with the same client code the agents and workers use, plus fake agents.
#![allow(dead_code)]

use gw_jobapi::http::{HttpError, call};
use gw_jobapi::types::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const GWJOB: &str = env!("CARGO_BIN_EXE_gwjob");

/// The `gwjob` under test: this build's, or `GW_TEST_GWJOB` (to run the
/// same tests against another build, e.g. to see a test fail before a fix).
pub fn gwjob() -> String {
    std::env::var("GW_TEST_GWJOB").unwrap_or_else(|_| GWJOB.to_owned())
}
pub const T: Duration = Duration::from_secs(10);

#[path = "../common/tempdir.rs"]
mod tempdir;
pub use tempdir::TempDir;

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        TempDir::named("server", tag)
    }
}

/// A running `gwjob serve`.
pub struct Server {
    child: Child,
    pub url: String,
    pub token: String,
    pub db: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts a server on `dir/server.db` with `extra` options; the admin
    /// token is the one it generates in `dir/admin.token`.
    pub fn start(dir: &Path, extra: &[&str]) -> Server {
        Self::start_on(dir, "127.0.0.1:0", extra)
    }

    /// Like [`Server::start`], listening on `listen` (a restarted server
    /// must keep its address for real agents to find it again).
    pub fn start_on(dir: &Path, listen: &str, extra: &[&str]) -> Server {
        let db = dir.join("server.db");
        let mut child = Command::new(gwjob())
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--db")
            .arg(&db)
            .args(extra)
            .env_remove("GW_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gwjob serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + T;
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    if let Some(u) = l.strip_prefix("gwjob: listening on ") {
                        break u.to_owned();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "gwjob serve did not start; stderr:\n{}",
                        stderr.lock().unwrap()
                    );
                }
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || while rx.recv().is_ok() {});
        let token = std::fs::read_to_string(dir.join("admin.token"))
            .expect("admin.token")
            .trim()
            .to_owned();
        Server {
            child,
            url,
            token,
            db,
            stderr,
        }
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The server's log once `ready` holds for it. The server writes a line
    /// before it answers, but this side reads its stderr on a thread of its
    /// own, so the line can reach `stderr()` after the answer does: a test
    /// that checks a log line waits a bounded while for it instead of
    /// reading once. Panics with the log if `ready` never holds.
    pub fn stderr_when(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + T;
        loop {
            let log = self.stderr();
            if ready(&log) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "the server never logged {what} within {T:?}; its log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&B>,
    ) -> Result<R, HttpError> {
        call(method, &self.url, path, token, body, T)
    }

    pub fn post<B: Serialize, R: DeserializeOwned>(&self, path: &str, body: &B) -> R {
        match self.call("POST", path, &self.token, Some(body)) {
            Ok(r) => r,
            Err(e) => panic!("POST {path}: {e}\nserver stderr:\n{}", self.stderr()),
        }
    }

    pub fn get<R: DeserializeOwned>(&self, path: &str) -> R {
        match self.call::<(), R>("GET", path, &self.token, None) {
            Ok(r) => r,
            Err(e) => panic!("GET {path}: {e}\nserver stderr:\n{}", self.stderr()),
        }
    }

    pub fn status(&self, job: &str) -> JobStatus {
        self.get(&format!("/v1/jobs/{job}"))
    }

    pub fn register(&self, node: &str, rack: &str, slots: u32) {
        self.register_typed(node, rack, slots, "cpu");
    }

    pub fn register_typed(&self, node: &str, rack: &str, slots: u32, device_type: &str) {
        let _: RegisterReply = self.post(
            "/v1/nodes/register",
            &RegisterNode {
                node: node.into(),
                rack: rack.into(),
                slots,
                device_type: device_type.into(),
                addr: "127.0.0.1".into(),
            },
        );
    }

    pub fn heartbeat(&self, node: &str, hb: &Heartbeat) -> HeartbeatReply {
        self.post(&format!("/v1/nodes/{node}/heartbeat"), hb)
    }

    pub fn submit(&self, req: &SubmitRequest) -> String {
        let r: SubmitReply = self.post("/v1/jobs", req);
        r.job_id
    }

    pub fn step_begin(
        &self,
        job: &str,
        token: &str,
        rank: u32,
        step: u64,
    ) -> Result<StepPlan, HttpError> {
        self.call(
            "POST",
            &format!("/v1/jobs/{job}/step/begin"),
            token,
            Some(&StepBegin { rank, step }),
        )
    }

    pub fn step_end(
        &self,
        job: &str,
        token: &str,
        end: &StepEnd,
    ) -> Result<StepEndReply, HttpError> {
        self.call(
            "POST",
            &format!("/v1/jobs/{job}/step/end"),
            token,
            Some(end),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A job request that passes validation.
pub fn job(workers: u32, global: u64) -> SubmitRequest {
    SubmitRequest {
        name: Some("test".into()),
        workers,
        global_batch: global,
        batch_lo: 1,
        batch_hi: global,
        schedule: vec![],
        planner: PlannerKind::Optperf,
        program: "/bin/true".into(),
        args: vec!["a".into()],
        env: vec![("MY_VAR".into(), "1".into())],
        steps: None,
        throughput: Vec::new(),
    }
}

/// The value of `key` in a launch's environment.
pub fn env<'a>(l: &'a Launch, key: &str) -> Option<&'a str> {
    l.env
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Runs the store/launch handshake for `job` whose ranks are all on the
/// registered nodes in `nodes` (rank 0 on the first one): returns the
/// launches each node got, in the order of `nodes`.
pub fn launch(server: &Server, job: &str, nodes: &[&str]) -> Vec<Vec<Launch>> {
    let first = server.heartbeat(nodes[0], &Heartbeat::default());
    assert!(
        first.open_stores.iter().any(|o| o.job_id == job),
        "{} should be asked to open the store of {job}: {first:?}",
        nodes[0]
    );
    let hb = Heartbeat {
        stores: vec![StoreOpened {
            job_id: job.into(),
            attempt: 0,
            addr: "127.0.0.1:5555".into(),
        }],
        exits: vec![],
    };
    let mut out = vec![server.heartbeat(nodes[0], &hb).launches];
    for n in &nodes[1..] {
        out.push(server.heartbeat(n, &Heartbeat::default()).launches);
    }
    out
}

/// Places and launches a job on one node `node` (registered here with just
/// enough slots); returns (job id, worker token).
pub fn running_job(server: &Server, node: &str, req: &SubmitRequest) -> (String, String) {
    server.register(node, "r1", req.workers);
    let id = server.submit(req);
    let launches = launch(server, &id, &[node]);
    let token = launches[0]
        .iter()
        .find(|l| l.job_id == id)
        .and_then(|l| env(l, "GW_JOB_TOKEN"))
        .expect("launch with GW_JOB_TOKEN")
        .to_owned();
    (id, token)
}

/// A step/end report with `compute_s` compute time.
pub fn end(rank: u32, step: u64, samples: u64, compute_s: f64) -> StepEnd {
    StepEnd {
        rank,
        step,
        samples,
        compute_s,
        comm_s: 0.01,
        step_s: compute_s + 0.01,
        local_grad_sq: None,
        global_grad_sq: None,
    }
}

/// HTTP status of a failed call (0 when it succeeded or never got one).
pub fn status_of<R>(r: &Result<R, HttpError>) -> u16 {
    match r {
        Err(HttpError::Status { status, .. }) => *status,
        _ => 0,
    }
}

pub fn message_of<R>(r: &Result<R, HttpError>) -> String {
    match r {
        Err(HttpError::Status { message, .. }) => message.clone(),
        Err(e) => e.to_string(),
        Ok(_) => String::from("<ok>"),
    }
}

/// Polls `f` until it returns Some or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
