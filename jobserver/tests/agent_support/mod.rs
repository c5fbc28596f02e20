//! Shared by the `agent_*` integration tests: a real `gwjob serve` and real
//! `gwjob agent` processes on 127.0.0.1, each with its own temporary
//! directory, log file and admin token (`GW_ADMIN_TOKEN`).
#![allow(dead_code)]

use gw_jobapi::http::{HttpError, call};
use gw_jobapi::types::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const GWJOB: &str = env!("CARGO_BIN_EXE_gwjob");
pub const TOKEN: &str = "agent-test-admin-token";

#[path = "../common/tempdir.rs"]
mod tempdir;
pub use tempdir::TempDir;

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        TempDir::named("agent", tag)
    }
}

/// A free port on 127.0.0.1 (closed again at once).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("local addr").port()
}

/// A running `gwjob serve`.
pub struct Server {
    child: Child,
    pub url: String,
    pub log: PathBuf,
}

impl Server {
    /// Starts a server listening on `listen` (e.g. `127.0.0.1:0`) with the
    /// database `db`; stderr goes to `log` (appended).
    pub fn start(db: &Path, listen: &str, log: &Path, extra: &[&str]) -> Server {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("server log");
        let mut child = Command::new(GWJOB)
            .args(["serve", "--listen", listen, "--db"])
            .arg(db)
            .args(extra)
            .env("GW_ADMIN_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .expect("spawn gwjob serve");
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
        let url = loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(l) => {
                    if let Some(u) = l.strip_prefix("gwjob: listening on ") {
                        break u.to_owned();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "gwjob serve did not start:\n{}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    );
                }
            }
        };
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Server {
            child,
            url,
            log: log.to_path_buf(),
        }
    }

    /// `kill -9`, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn try_status(&self, job: &str) -> Result<JobStatus, HttpError> {
        call::<(), JobStatus>(
            "GET",
            &self.url,
            &format!("/v1/jobs/{job}"),
            TOKEN,
            None,
            Duration::from_secs(10),
        )
    }

    pub fn status(&self, job: &str) -> JobStatus {
        self.try_status(job)
            .unwrap_or_else(|e| panic!("status of {job}: {e}\n{}", self.log()))
    }

    pub fn submit(&self, req: &SubmitRequest) -> String {
        let r: Result<SubmitReply, _> = call(
            "POST",
            &self.url,
            "/v1/jobs",
            TOKEN,
            Some(req),
            Duration::from_secs(10),
        );
        r.unwrap_or_else(|e| panic!("submit: {e}\n{}", self.log()))
            .job_id
    }

    /// Polls the job until `done` holds (or panics after `limit`).
    pub fn wait_job(
        &self,
        id: &str,
        limit: Duration,
        done: impl Fn(&JobStatus) -> bool,
        logs: impl Fn() -> String,
    ) -> JobStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(st) = self.try_status(id)
                && done(&st)
            {
                return st;
            }
            if Instant::now() > deadline {
                panic!(
                    "job {id} stuck: {:?}\nserver:\n{}\nagents:\n{}",
                    self.try_status(id),
                    self.log(),
                    logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn ended(st: &JobStatus) -> bool {
    !matches!(st.state, JobState::Pending | JobState::Running)
}

/// A running `gwjob agent`; stdout and stderr go to one log file.
pub struct Agent {
    pub child: Child,
    pub log: PathBuf,
}

impl Agent {
    pub fn start(dir: &Path, server: &str, node: &str, slots: u32) -> Agent {
        let log = dir.join(format!("agent-{node}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("agent log");
        let child = Command::new(GWJOB)
            .args(["agent", "--server", server, "--node", node, "--rack", "r1"])
            .args(["--slots", &slots.to_string(), "--device-type", "cpu"])
            .env("GW_ADMIN_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("spawn gwjob agent");
        Agent { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `text` (panics after `limit`).
    pub fn wait_log(&self, text: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.log().contains(text) {
            assert!(
                Instant::now() < deadline,
                "agent log never said {text:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions; the child is unreaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// Waits for the agent to exit; its status code (None: killed, or still
    /// running after `limit`, in which case it is killed).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A job of `workers` ranks running `/bin/sh -c script`.
pub fn sh_job(workers: u32, script: &str) -> SubmitRequest {
    SubmitRequest {
        name: Some("agent-test".into()),
        workers,
        global_batch: 4 * u64::from(workers),
        batch_lo: 1,
        batch_hi: 4 * u64::from(workers),
        schedule: vec![],
        planner: PlannerKind::Even,
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
        steps: None,
        throughput: Vec::new(),
    }
}

/// Whether process `pid` still exists (zombies count as gone: they run nothing).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Pids written one per line into the files of `dir` named `pid-*`.
pub fn pids_in(dir: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("pid-")
                && let Ok(s) = std::fs::read_to_string(e.path())
            {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out
}
