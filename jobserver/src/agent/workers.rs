//! The worker processes this node runs: starting them, reaping them,
//! stopping them.
//!
//! Each worker gets its own process group, so stopping it reaches whatever
//! it forked too (data loaders, `sh -c` children) and one job's workers can
//! be stopped without touching another's. A worker that exits has its
//! group killed at once: anything left there is an orphan holding our output
//! pipes. As in gwrun, workers ask for SIGKILL when the agent dies
//! (`PR_SET_PDEATHSIG`), so an agent that is killed leaves no orphans.
//!
//! Workers never inherit the agent's own `GW_*` variables (the admin token
//! among them): their environment is the job's, as the server sent it.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use gw_jobapi::types::{Launch, WorkerExit};

use gw_launch::child::{self, Group};
use gw_launch::output::{Stream, pump};
use gw_launch::program::find_program;
use gw_launch::signals::signal_name;
use gw_rendezvous::launch_env::var;

/// How long workers get between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Exit code reported for a worker that could not be started (as a shell does).
pub const EXIT_NOT_STARTED: i32 = 127;

struct Worker {
    /// The job's placement this worker belongs to ([`Launch::attempt`]).
    attempt: u32,
    rank: u32,
    child: Child,
    status: Option<ExitStatus>,
}

impl Worker {
    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }
}

struct Stopping {
    kill_at: Instant,
    killed: bool,
}

struct Job {
    workers: Vec<Worker>,
    stopping: Option<Stopping>,
}

/// A job whose workers on this node have all exited.
#[derive(Debug, PartialEq, Eq)]
pub struct Finished {
    pub job_id: String,
    /// Whether it ended because it was stopped (not by its workers' choice).
    pub stopped: bool,
}

/// Every worker of every job on this node.
#[derive(Default)]
pub struct Workers {
    jobs: BTreeMap<String, Job>,
    /// (job, attempt, rank) ever launched here: a launch sent twice starts
    /// nothing, but a preempted job's next placement starts again.
    seen: HashSet<(String, u32, u32)>,
    /// Jobs stopped here: a late launch of one starts nothing.
    stopped: HashSet<String>,
    grace: Duration,
}

/// How a worker ended, for logs.
pub fn describe(job: &str, rank: u32, st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("job {job} rank {rank} exited with status {c}"),
        (None, Some(s)) => format!(
            "job {job} rank {rank} was killed by signal {} ({s})",
            signal_name(s)
        ),
        (None, None) => format!("job {job} rank {rank} ended with {st}"),
    }
}

fn exit_of(job: &str, attempt: u32, rank: u32, st: ExitStatus) -> WorkerExit {
    WorkerExit {
        job_id: job.to_owned(),
        attempt,
        rank,
        code: st.code(),
        signal: if st.code().is_some() {
            None
        } else {
            st.signal()
        },
    }
}

/// Signals a worker's process group, and the worker itself if it left it.
fn signal_worker(w: &Worker, sig: libc::c_int) {
    let pid = w.pid();
    // SAFETY: kill/getpgid have no memory-safety preconditions; the pid is
    // our unreaped child, so it cannot have been reused.
    unsafe {
        libc::kill(-pid, sig);
        if libc::getpgid(pid) != pid {
            libc::kill(pid, sig);
        }
    }
}

impl Workers {
    pub fn new(grace: Duration) -> Workers {
        Workers {
            grace,
            ..Default::default()
        }
    }

    /// Starts the ranks of `l` not started here before. Ranks that cannot be
    /// started are returned as exits with status 127 (and logged), so the
    /// server fails the job naming them.
    pub fn launch(&mut self, l: &Launch, server: &str) -> Vec<WorkerExit> {
        let mut failed = Vec::new();
        if self.stopped.contains(&l.job_id) {
            // The server repeats a launch until it hears of the rank: say it once.
            let fresh = l
                .ranks
                .iter()
                .filter(|&&r| self.seen.insert((l.job_id.clone(), l.attempt, r)))
                .count();
            if fresh > 0 {
                tracing::warn!("not starting job {}: it was stopped here", l.job_id);
            }
            return failed;
        }
        let program = find_program(OsStr::new(&l.program));
        for (local, &rank) in l.ranks.iter().enumerate() {
            if !self.seen.insert((l.job_id.clone(), l.attempt, rank)) {
                continue;
            }
            let res = match &program {
                Ok(p) => spawn(p, l, rank, local, server),
                Err(e) => Err(io::Error::new(io::ErrorKind::NotFound, e.0.clone())),
            };
            match res {
                Ok(child) => {
                    tracing::info!("started job {} rank {rank} (pid {})", l.job_id, child.id());
                    let job = self.jobs.entry(l.job_id.clone()).or_insert_with(|| Job {
                        workers: Vec::new(),
                        stopping: None,
                    });
                    job.workers.push(Worker {
                        attempt: l.attempt,
                        rank,
                        child,
                        status: None,
                    });
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot start job {} rank {rank} ({}): {e}",
                        l.job_id,
                        l.program
                    );
                    failed.push(WorkerExit {
                        job_id: l.job_id.clone(),
                        attempt: l.attempt,
                        rank,
                        code: Some(EXIT_NOT_STARTED),
                        signal: None,
                    });
                }
            }
        }
        failed
    }

    /// Reaps every worker that exited (logging it) and returns their exits.
    pub fn reap(&mut self) -> Vec<WorkerExit> {
        let mut exits = Vec::new();
        for (id, job) in &mut self.jobs {
            for w in job.workers.iter_mut().filter(|w| w.status.is_none()) {
                let st = match w.child.try_wait() {
                    Ok(Some(st)) => st,
                    Ok(None) => continue,
                    Err(e) => {
                        // Cannot happen for our own unreaped child; do not spin on it.
                        tracing::warn!("cannot wait for job {id} rank {}: {e}", w.rank);
                        ExitStatus::from_raw(1 << 8)
                    }
                };
                w.status = Some(st);
                // Whatever the worker left in its group is an orphan now.
                // SAFETY: kill has no memory-safety preconditions; the group
                // id was our child's pid, reaped just now.
                unsafe {
                    libc::kill(-w.pid(), libc::SIGKILL);
                }
                tracing::info!("{}", describe(id, w.rank, st));
                exits.push(exit_of(id, w.attempt, w.rank, st));
            }
        }
        exits
    }

    /// Removes and returns the jobs whose local workers have all exited.
    pub fn take_finished(&mut self) -> Vec<Finished> {
        let done: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.workers.iter().all(|w| w.status.is_some()))
            .map(|(id, _)| id.clone())
            .collect();
        done.into_iter()
            .filter_map(|id| {
                self.jobs.remove(&id).map(|j| Finished {
                    job_id: id,
                    stopped: j.stopping.is_some(),
                })
            })
            .collect()
    }

    /// SIGTERMs `job`'s workers (SIGKILL after the grace period, see
    /// [`Workers::escalate`]); later launches of it start nothing. Returns
    /// whether the job was not stopped here before.
    pub fn stop(&mut self, job_id: &str) -> bool {
        let fresh = self.stopped.insert(job_id.to_owned());
        let grace = self.grace;
        if let Some(job) = self.jobs.get_mut(job_id)
            && job.stopping.is_none()
        {
            for w in job.workers.iter().filter(|w| w.status.is_none()) {
                signal_worker(w, libc::SIGTERM);
            }
            job.stopping = Some(Stopping {
                kill_at: Instant::now() + grace,
                killed: false,
            });
        }
        fresh
    }

    pub fn stop_all(&mut self) {
        let ids: Vec<String> = self.jobs.keys().cloned().collect();
        for id in ids {
            self.stop(&id);
        }
    }

    /// SIGKILLs every live worker now.
    pub fn kill_all(&mut self) {
        for job in self.jobs.values_mut() {
            for w in job.workers.iter().filter(|w| w.status.is_none()) {
                signal_worker(w, libc::SIGKILL);
            }
            if let Some(s) = &mut job.stopping {
                s.killed = true;
            }
        }
    }

    /// SIGKILLs the workers of stopping jobs whose grace period is over;
    /// returns the next such deadline.
    pub fn escalate(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (id, job) in &mut self.jobs {
            let Some(s) = &mut job.stopping else {
                continue;
            };
            if s.killed {
                continue;
            }
            if now < s.kill_at {
                next = Some(next.map_or(s.kill_at, |n| n.min(s.kill_at)));
                continue;
            }
            let left: Vec<String> = job
                .workers
                .iter()
                .filter(|w| w.status.is_none())
                .map(|w| {
                    signal_worker(w, libc::SIGKILL);
                    w.rank.to_string()
                })
                .collect();
            if !left.is_empty() {
                tracing::warn!(
                    "job {id} rank{} {} still running {} s after SIGTERM; sending SIGKILL",
                    if left.len() == 1 { "" } else { "s" },
                    left.join(", "),
                    self.grace.as_secs_f64()
                );
            }
            s.killed = true;
        }
        next
    }

    /// Live workers on this node.
    pub fn running(&self) -> usize {
        self.jobs
            .values()
            .flat_map(|j| &j.workers)
            .filter(|w| w.status.is_none())
            .count()
    }

    /// Whether `job` has workers here (running or not yet reaped).
    pub fn has_job(&self, job: &str) -> bool {
        self.jobs.contains_key(job)
    }
}

/// Starts one rank of `l` with the job's environment plus its own numbers.
fn spawn(program: &Path, l: &Launch, rank: u32, local: usize, server: &str) -> io::Result<Child> {
    let mut cmd = Command::new(program);
    cmd.args(&l.args);
    for (k, _) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"GW_") {
            cmd.env_remove(k);
        }
    }
    // The server sends these with the job's environment; a launch that lacks
    // them still gets them.
    let has = |name: &str| l.env.iter().any(|(k, _)| k == name);
    let defaults = [
        (var::WORLD_SIZE, l.world.to_string()),
        (var::LOCAL_SIZE, l.ranks.len().to_string()),
        (var::JOB_SERVER, server.to_owned()),
        (var::JOB_ID, l.job_id.clone()),
    ];
    for (k, v) in defaults.iter().filter(|(k, _)| !has(k)) {
        cmd.env(k, v);
    }
    for (k, v) in &l.env {
        cmd.env(k, v);
    }
    cmd.env(var::RANK, rank.to_string());
    cmd.env(var::LOCAL_RANK, local.to_string());
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    child::prepare(&mut cmd, Group::New);
    let mut child = cmd.spawn()?;
    let prefix = format!("[{}:{rank}] ", l.job_id).into_bytes();
    if let Some(out) = child.stdout.take() {
        forward(prefix.clone(), out, Stream::Stdout);
    }
    if let Some(err) = child.stderr.take() {
        forward(prefix, err, Stream::Stderr);
    }
    Ok(child)
}

/// Copies a worker's pipe to the agent's `stream`, each line tagged.
fn forward(prefix: Vec<u8>, src: impl io::Read + Send + 'static, stream: Stream) {
    use std::io::Write;
    let r = std::thread::Builder::new()
        .name("gwagent-out".into())
        .spawn(move || match stream {
            Stream::Stdout => pump(&prefix, src, |l| {
                let mut out = io::stdout().lock();
                out.write_all(l)?;
                out.flush()
            }),
            Stream::Stderr => pump(&prefix, src, |l| io::stderr().lock().write_all(l)),
        });
    if let Err(e) = r {
        // The pipe is dropped with the closure: the worker gets EPIPE rather
        // than blocking on a full pipe.
        tracing::warn!("cannot start an output thread: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(job: &str, ranks: &[u32], script: &str) -> Launch {
        Launch {
            job_id: job.into(),
            attempt: 0,
            ranks: ranks.to_vec(),
            world: 4,
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("GW_STORE".into(), "1.2.3.4:5".into())],
        }
    }

    /// Reaps until `n` exits were seen (or 10 s passed).
    fn reap_n(w: &mut Workers, n: usize) -> Vec<WorkerExit> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < n && Instant::now() < deadline {
            got.extend(w.reap());
            std::thread::sleep(Duration::from_millis(10));
        }
        got.sort_by_key(|e| e.rank);
        got
    }

    #[test]
    fn ranks_get_their_numbers_and_exits_are_reported() {
        let mut w = Workers::new(Duration::from_secs(5));
        // Each rank exits 10 + its rank if its variables are right, else 9.
        let l = launch(
            "jx",
            &[1, 3],
            r#"case "$GW_RANK:$GW_LOCAL_RANK:$GW_LOCAL_SIZE:$GW_WORLD_SIZE:$GW_STORE:$GW_JOB_ID:$GW_JOB_SERVER" in
               1:0:2:4:1.2.3.4:5:jx:http://s|3:1:2:4:1.2.3.4:5:jx:http://s) exit $((GW_RANK + 10));;
               *) exit 9;; esac"#,
        );
        assert!(w.launch(&l, "http://s").is_empty());
        assert!(
            w.launch(&l, "http://s").is_empty(),
            "a repeated launch starts nothing"
        );
        assert_eq!(w.running(), 2);
        let exits = reap_n(&mut w, 2);
        let codes: Vec<(u32, Option<i32>)> = exits.iter().map(|e| (e.rank, e.code)).collect();
        assert_eq!(codes, [(1, Some(11)), (3, Some(13))]);
        assert_eq!(
            w.take_finished(),
            [Finished {
                job_id: "jx".into(),
                stopped: false
            }]
        );
        assert!(!w.has_job("jx"));
    }

    #[test]
    fn a_preempted_jobs_next_placement_starts_the_same_ranks_again() {
        let mut w = Workers::new(Duration::from_secs(5));
        let mut l = launch("jp", &[0, 1], "exit $((GW_RANK + 20))");
        assert!(w.launch(&l, "http://s").is_empty());
        let first = reap_n(&mut w, 2);
        assert!(first.iter().all(|e| e.attempt == 0), "{first:?}");
        assert_eq!(w.take_finished().len(), 1);
        assert!(w.launch(&l, "http://s").is_empty());
        assert_eq!(w.running(), 0, "placement 0 started twice");
        l.attempt = 1;
        assert!(w.launch(&l, "http://s").is_empty());
        assert!(w.launch(&l, "http://s").is_empty());
        assert_eq!(w.running(), 2, "placement 1 not started once");
        let second = reap_n(&mut w, 2);
        let got: Vec<(u32, u32, Option<i32>)> =
            second.iter().map(|e| (e.attempt, e.rank, e.code)).collect();
        assert_eq!(got, [(1, 0, Some(20)), (1, 1, Some(21))]);
    }

    #[test]
    fn a_missing_program_is_reported_as_status_127() {
        let mut w = Workers::new(Duration::from_secs(5));
        let mut l = launch("jm", &[0, 1], "");
        l.program = "/nonexistent/prog".into();
        let failed = w.launch(&l, "http://s");
        assert_eq!(failed.len(), 2);
        assert!(failed.iter().all(|e| e.code == Some(EXIT_NOT_STARTED)));
        assert_eq!(w.running(), 0);
    }

    #[test]
    fn stop_terms_then_kills_and_late_launches_are_refused() {
        let mut w = Workers::new(Duration::from_millis(300));
        // Rank 0 obeys SIGTERM; rank 1 ignores it and must be killed.
        w.launch(&launch("js", &[0], "sleep 30 & wait"), "http://s");
        w.launch(
            &launch("js", &[1], "trap '' TERM; while :; do sleep 0.05; done"),
            "http://s",
        );
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        w.stop("js");
        let mut exits = Vec::new();
        while exits.len() < 2 && t.elapsed() < Duration::from_secs(10) {
            exits.extend(w.reap());
            w.escalate(Instant::now());
            std::thread::sleep(Duration::from_millis(10));
        }
        exits.sort_by_key(|e| e.rank);
        assert_eq!(exits[0].signal, Some(libc::SIGTERM));
        assert_eq!(exits[1].signal, Some(libc::SIGKILL));
        assert!(t.elapsed() >= Duration::from_millis(300));
        let f = w.take_finished();
        assert_eq!(f.len(), 1);
        assert!(f[0].stopped);
        assert!(
            w.launch(&launch("js", &[2], "exit 0"), "http://s")
                .is_empty()
        );
        assert_eq!(w.running(), 0);
    }

    #[test]
    fn describe_names_job_rank_and_cause() {
        assert_eq!(
            describe("j", 2, ExitStatus::from_raw(3 << 8)),
            "job j rank 2 exited with status 3"
        );
        assert_eq!(
            describe("j", 0, ExitStatus::from_raw(9)),
            "job j rank 0 was killed by signal SIGKILL (9)"
        );
    }
}
