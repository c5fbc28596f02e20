//! Helpers shared by the multi-process tests: launching real rank processes,
//! either through `gwrun` (as users do) or directly with hand-made `GW_*`
//! variables (for scenarios `gwrun` would cut short, such as watching every
//! survivor's own error after a rank dies), always with a hard deadline so a
//! hang fails the test instead of stalling CI.

pub mod coll;
pub mod jobs;
pub mod netns;
pub mod slurm;

use gw_rendezvous::{StoreConfig, StoreServer};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What one process printed and how it ended.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    /// stdout and stderr together, for assertions and failure messages.
    pub fn all(&self) -> String {
        format!("--- stdout\n{}--- stderr\n{}", self.stdout, self.stderr)
    }
}

/// The directory holding the workspace's binaries (gwrun, gwtest, gwbench).
/// Test executables live in `target/<profile>/deps`, the binaries one level up.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a workspace binary; panics with a hint if it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace's binaries first (cargo build --workspace --bins)",
        p.display()
    );
    p
}

pub fn collect(mut child: Child, deadline: Duration, what: &str) -> Run {
    let start = Instant::now();
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_end(&mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_end(&mut s);
        }
        s
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                let o = t_out.join().unwrap_or_default();
                let e = t_err.join().unwrap_or_default();
                panic!(
                    "{what} hung for more than {deadline:?}\n--- stdout\n{}--- stderr\n{}",
                    String::from_utf8_lossy(&o),
                    String::from_utf8_lossy(&e)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    };
    Run {
        status,
        stdout: String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned(),
        stderr: String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned(),
        elapsed: start.elapsed(),
    }
}

/// Runs `gwrun -n N PROGRAM ARGS` with extra environment, failing the test if
/// it takes longer than `deadline`.
pub fn gwrun(
    n: u32,
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
    deadline: Duration,
) -> Run {
    let mut cmd = Command::new(bin("gwrun"));
    cmd.arg("-n").arg(n.to_string()).arg(program).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning gwrun: {e}"));
    collect(
        child,
        deadline,
        &format!("gwrun -n {n} {program} {}", args.join(" ")),
    )
}

/// A job whose ranks are started directly, with a store run by the test.
pub struct DirectJob {
    store: StoreServer,
    pub token: String,
    pub job_id: String,
}

impl DirectJob {
    pub fn new() -> DirectJob {
        let token = format!("tok{}", std::process::id());
        let store = StoreServer::start(
            "127.0.0.1:0".parse().unwrap(),
            &token,
            StoreConfig::default(),
        )
        .unwrap_or_else(|e| panic!("starting a store: {e}"));
        let job_id = format!("t{}x{}", std::process::id(), store.local_addr().port());
        DirectJob {
            store,
            token,
            job_id,
        }
    }

    pub fn store_addr(&self) -> String {
        self.store.local_addr().to_string()
    }

    /// Spawns one rank of a `world`-rank job running `gwtest ARGS`.
    pub fn spawn(&self, rank: u32, world: u32, args: &[&str], env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new(bin("gwtest"));
        cmd.args(args)
            .env("GW_RANK", rank.to_string())
            .env("GW_WORLD_SIZE", world.to_string())
            .env("GW_LOCAL_RANK", rank.to_string())
            .env("GW_LOCAL_SIZE", world.to_string())
            .env("GW_STORE", self.store_addr())
            .env("GW_TOKEN", &self.token)
            .env("GW_JOB_ID", &self.job_id);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning gwtest: {e}"))
    }

    /// Spawns the given ranks of a `world`-rank job and collects each.
    pub fn run(
        &self,
        ranks: &[u32],
        world: u32,
        args: &[&str],
        env: &[(&str, &str)],
        deadline: Duration,
    ) -> Vec<Run> {
        let children: Vec<Child> = ranks
            .iter()
            .map(|&r| self.spawn(r, world, args, env))
            .collect();
        children
            .into_iter()
            .zip(ranks)
            .map(|(c, r)| {
                collect(
                    c,
                    deadline,
                    &format!("rank {r} of gwtest {}", args.join(" ")),
                )
            })
            .collect()
    }
}

impl Default for DirectJob {
    fn default() -> Self {
        Self::new()
    }
}
