//! Helpers for the job-server end-to-end tests: a real `gwjob serve`, real
//! `gwjob agent`s and real `gwtrain` workers, driven through the `gwjob`
//! client exactly as an operator would, optionally inside network namespaces
//! (a command prefix such as `ip netns exec NS`).
//!
//! Every process writes into a log file in the test's temporary directory
//! rather than a pipe, so nothing blocks on an unread pipe and the logs can be
//! read (for pids, for failure messages) while the processes run. Daemons are
//! stopped on drop (SIGTERM, then SIGKILL), and every wait has a deadline, so
//! a failing test neither hangs nor leaves processes behind.
//!
//! gw-tests has no JSON dependency, so the few fields the tests need are
//! picked out of `gwjob status --json`'s pretty-printed text.

use crate::bin;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A temporary directory, removed on drop unless the test failed (then its
/// logs are kept and the path printed).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "gw-e2e-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            println!("logs kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A long-running child process with its output in a log file.
pub struct Daemon {
    child: Child,
    pub name: String,
    pub log: PathBuf,
    stopped: bool,
}

impl Daemon {
    /// Runs `prefix... program args...` with `env`, output to `log`.
    pub fn spawn(
        name: &str,
        prefix: &[String],
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: PathBuf,
    ) -> Daemon {
        let out = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("duplicating a log file handle: {e}"));
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        Daemon {
            child,
            name: name.to_string(),
            log,
            stopped: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it is still running (reaping it if it exited).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `kill -9`, and reap it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stopped = true;
    }

    /// SIGTERM, then SIGKILL after `grace`; returns whether it exited on
    /// the SIGTERM.
    pub fn stop(&mut self, grace: Duration) -> bool {
        if self.stopped {
            return true;
        }
        self.stopped = true;
        if !self.running() {
            return true;
        }
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < grace {
            if !self.running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
        false
    }

    /// Polls its log until `pred` finds what it wants in it.
    pub fn wait_for<T>(
        &mut self,
        deadline: Duration,
        mut pred: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let start = Instant::now();
        loop {
            if let Some(t) = pred(&self.output()) {
                return t;
            }
            let running = self.running();
            if start.elapsed() > deadline || !running {
                panic!(
                    "{} did not print what was awaited within {deadline:?} (running: {running}); output:\n{}",
                    self.name,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Whether process `pid` exists (a zombie counts; workers are reaped by
/// their agent, so one that lingers as a zombie is a finding too).
pub fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Pids of the processes whose environment names job `job` (GW_JOB_ID):
/// the job's workers, wherever they run on this machine.
pub fn processes_of_job(job: &str) -> Vec<u32> {
    let want = format!("GW_JOB_ID={job}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// The step numbers a gwtrain rank logged in `DIR/steps-rank<R>.log`.
pub fn step_log(dir: &Path, rank: u32) -> Vec<u64> {
    let p = dir.join(format!("steps-rank{rank}.log"));
    std::fs::read_to_string(&p)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            l.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{}: bad line {l:?}", p.display()))
        })
        .collect()
}

/// The value of `"key": "..."` in pretty-printed JSON, unescaped enough for
/// assertions (`\"` and `\\`).
pub fn json_str(json: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\": \"");
    let start = json.find(&pat)? + pat.len();
    let mut out = String::new();
    let mut chars = json[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    None
}

/// The job server, its agents and its client, on one machine.
pub struct Cluster {
    pub dir: TempDir,
    pub token: String,
    pub url: String,
    /// Prefix of every server and client command (e.g. `ip netns exec NS`).
    prefix: Vec<String>,
    pub server: Daemon,
    pub agents: Vec<Daemon>,
    restarts: usize,
    /// Extra `gwjob serve` flags, kept for restarts.
    server_args: Vec<String>,
}

impl Cluster {
    /// Starts `gwjob serve --listen LISTEN --db DIR/gw.db`.
    pub fn start(tag: &str, listen: &str, prefix: &[&str]) -> Cluster {
        Self::start_with(tag, listen, prefix, &[])
    }

    /// As [`Cluster::start`], with extra `gwjob serve` flags (a policy, say).
    pub fn start_with(tag: &str, listen: &str, prefix: &[&str], server_args: &[&str]) -> Cluster {
        let dir = TempDir::new(tag);
        let token = format!("e2e-admin-token-{}", std::process::id());
        let prefix: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        let server_args: Vec<String> = server_args.iter().map(|s| s.to_string()).collect();
        let (server, url) = Self::serve(dir.path(), &token, &prefix, &server_args, listen, 0);
        Cluster {
            dir,
            token,
            url,
            prefix,
            server,
            agents: Vec::new(),
            restarts: 0,
            server_args,
        }
    }

    fn env(token: &str) -> Vec<(String, String)> {
        vec![("GW_ADMIN_TOKEN".to_string(), token.to_string())]
    }

    fn serve(
        dir: &Path,
        token: &str,
        prefix: &[String],
        extra: &[String],
        listen: &str,
        n: usize,
    ) -> (Daemon, String) {
        let args: Vec<String> = ["serve", "--listen", listen, "--db"]
            .iter()
            .map(|s| s.to_string())
            .chain([dir.join("gw.db").display().to_string()])
            .chain(extra.iter().cloned())
            .collect();
        let mut d = Daemon::spawn(
            "gwjob serve",
            prefix,
            &bin("gwjob"),
            &args,
            &Self::env(token),
            dir.join(format!("server{n}.log")),
        );
        let url = d.wait_for(Duration::from_secs(30), |out| {
            out.lines()
                .find_map(|l| l.strip_prefix("gwjob: listening on "))
                .map(|u| u.trim().to_string())
        });
        (d, url)
    }

    /// `kill -9` of the server.
    pub fn kill_server(&mut self) {
        self.server.kill9();
    }

    /// A new server on the same address and database.
    pub fn restart_server(&mut self) {
        self.restarts += 1;
        let listen = self.url.trim_start_matches("http://").to_string();
        let (d, url) = Self::serve(
            self.dir.path(),
            &self.token,
            &self.prefix,
            &self.server_args,
            &listen,
            self.restarts,
        );
        assert_eq!(url, self.url, "the restarted server must keep its address");
        self.server = d;
    }

    /// Starts an agent for node `node` with `slots`, under `prefix` (its own
    /// namespace, say), reachable at `addr` when given.
    pub fn add_agent(&mut self, node: &str, slots: u32, addr: Option<&str>, prefix: &[&str]) {
        self.add_typed_agent(node, slots, "cpu", addr, prefix);
    }

    /// As [`Cluster::add_agent`], for a node of `device_type`.
    pub fn add_typed_agent(
        &mut self,
        node: &str,
        slots: u32,
        device_type: &str,
        addr: Option<&str>,
        prefix: &[&str],
    ) {
        let mut args: Vec<String> = [
            "agent",
            "--server",
            &self.url,
            "--node",
            node,
            "--rack",
            "r0",
            "--slots",
            &slots.to_string(),
            "--device-type",
            device_type,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(a) = addr {
            args.extend(["--addr".to_string(), a.to_string()]);
        }
        let prefix: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        let mut d = Daemon::spawn(
            &format!("gwjob agent {node}"),
            &prefix,
            &bin("gwjob"),
            &args,
            &Self::env(&self.token),
            self.dir.path().join(format!("agent-{node}.log")),
        );
        d.wait_for(Duration::from_secs(30), |out| {
            out.contains(&format!("registered node {node}"))
                .then_some(())
        });
        self.agents.push(d);
    }

    /// Runs `gwjob CMD ARGS --server URL`; returns (success, stdout, stderr).
    pub fn client(&self, cmd: &str, args: &[&str]) -> (bool, String, String) {
        let mut c = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin("gwjob"));
                c
            }
            None => Command::new(bin("gwjob")),
        };
        c.arg(cmd).arg("--server").arg(&self.url).args(args);
        let out = c
            .env("GW_ADMIN_TOKEN", &self.token)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running gwjob {cmd}: {e}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Submits `submit_args -- gwtrain train_args`; returns the job id.
    pub fn submit_gwtrain(&self, submit_args: &[&str], train_args: &[&str]) -> String {
        let gwtrain = bin("gwtrain").display().to_string();
        let mut args: Vec<&str> = submit_args.to_vec();
        args.push("--");
        args.push(&gwtrain);
        args.extend_from_slice(train_args);
        let (ok, out, err) = self.client("submit", &args);
        assert!(ok, "gwjob submit failed: {out}{err}");
        out.trim().to_string()
    }

    /// `gwjob status JOB --json`, or None while the server cannot answer.
    pub fn status_json(&self, job: &str) -> Option<String> {
        let (ok, out, _) = self.client("status", &[job, "--json"]);
        ok.then_some(out)
    }

    /// The job's state and status JSON once it has ended (succeeded, failed
    /// or cancelled); panics with every log after `deadline`.
    pub fn wait_end(&self, job: &str, deadline: Duration) -> (String, String) {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < deadline {
            if let Some(js) = self.status_json(job) {
                if let Some(state) = json_str(&js, "state")
                    && matches!(state.as_str(), "succeeded" | "failed" | "cancelled")
                {
                    return (state, js);
                }
                last = js;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "job {job} did not end within {deadline:?}; last status:\n{last}\n{}",
            self.logs()
        );
    }

    /// Every daemon's output, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = format!("--- server\n{}", self.server.output());
        for a in &self.agents {
            s.push_str(&format!("--- {}\n{}", a.name, a.output()));
        }
        s
    }

    /// (rank, pid) of the workers of `job` that the agents started so far.
    pub fn worker_pids(&self, job: &str) -> Vec<(u32, u32)> {
        let pat = format!("started job {job} rank ");
        let mut v: Vec<(u32, u32)> = self
            .agents
            .iter()
            .flat_map(|a| {
                a.output()
                    .lines()
                    .filter_map(|l| {
                        let rest = &l[l.find(&pat)? + pat.len()..];
                        let (rank, rest) = rest.split_once(" (pid ")?;
                        let pid = rest.strip_suffix(')')?;
                        Some((rank.trim().parse().ok()?, pid.trim().parse().ok()?))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Stops the agents, then the server; asserts they all exit on SIGTERM.
    pub fn shutdown(&mut self) {
        for a in &mut self.agents {
            let name = a.name.clone();
            assert!(a.stop(Duration::from_secs(15)), "{name} ignored SIGTERM");
        }
        assert!(
            self.server.stop(Duration::from_secs(15)),
            "gwjob serve ignored SIGTERM"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_are_found_and_unescaped() {
        let js = "{\n  \"job_id\": \"j1\",\n  \"reason\": \"rank 1 on \\\"n\\\" died\",\n  \"state\": \"failed\"\n}";
        assert_eq!(json_str(js, "state").as_deref(), Some("failed"));
        assert_eq!(
            json_str(js, "reason").as_deref(),
            Some("rank 1 on \"n\" died")
        );
        assert_eq!(json_str(js, "name"), None);
    }
}
