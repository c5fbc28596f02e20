//! The launch contract: every `GW_*` variable a launcher hands a rank, typed.
//!
//! Launchers (gwrun, the job server's agent) write these variables and ranks
//! (the communicator's bring-up, the step client) read them. Each name is
//! spelled once, in [`var`], and both directions go through [`LaunchEnv`], so
//! a producer and a consumer can never disagree about a name or a format.
//! Programs started by Slurm (`SLURM_PROCID`, `SLURM_NTASKS`,
//! `SLURM_LOCALID`, and where the ranks are from `SLURM_NODEID`,
//! `SLURM_STEP_NODELIST` and `SLURM_STEP_TASKS_PER_NODE`: see [`slurm`]) or
//! torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`) are read too; those launchers run no store, so rank 0
//! hosts it, as torch's TCPStore does: at `MASTER_ADDR:MASTER_PORT`, or
//! under Slurm without `MASTER_ADDR`, on the step's first node.
//!
//! Neither Slurm nor torchrun hands its tasks anything secret (job ids, run
//! ids and ports show in `squeue` and `ps`), and a token cannot be drawn at
//! random by each rank, since all must present the same. So under them the
//! token is `GW_TOKEN`, set by the user for every rank. Without one, a job
//! on one host (a loopback store address, or as many local ranks as ranks)
//! keeps its store on loopback, and a job across hosts is refused, with a
//! message saying how to set `GW_TOKEN`.

use crate::error::{Error, Result};
use crate::slurm;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use var::torchrun as tr;

/// The name of every variable of the contract.
pub mod var {
    /// This process's rank in the job.
    pub const RANK: &str = "GW_RANK";
    /// Ranks in the job.
    pub const WORLD_SIZE: &str = "GW_WORLD_SIZE";
    /// This process's rank among the job's ranks on its host.
    pub const LOCAL_RANK: &str = "GW_LOCAL_RANK";
    /// The job's ranks on this host.
    pub const LOCAL_SIZE: &str = "GW_LOCAL_SIZE";
    /// `host:port` of the rendezvous store.
    pub const STORE: &str = "GW_STORE";
    /// The job's secret, presented to the store and hashed into data-plane hellos.
    pub const TOKEN: &str = "GW_TOKEN";
    /// Names the job's shared-memory segments and store keys.
    pub const JOB_ID: &str = "GW_JOB_ID";
    /// `http://host:port` of the job server whose step protocol the worker follows.
    pub const JOB_SERVER: &str = "GW_JOB_SERVER";
    /// The job's token for the job server's worker endpoints.
    pub const JOB_TOKEN: &str = "GW_JOB_TOKEN";
    /// Seconds the step client keeps retrying a job server that does not answer.
    pub const JOB_RETRY_S: &str = "GW_JOB_RETRY_S";
    /// Where gwrun's store listens (`host:port`), when not on loopback.
    pub const STORE_BIND: &str = "GW_STORE_BIND";
    /// gwrun's default `--bind-to` (`share` or `none`).
    pub const BIND_TO: &str = "GW_BIND_TO";
    /// The step a worker of a preempted job resumes from (its checkpoint
    /// holds everything before it); set by the job server on every launch,
    /// 0 for a fresh start.
    pub const RESUME_STEP: &str = "GW_RESUME_STEP";

    /// torchrun's variables, which ranks also read (as do launchers that
    /// speak torchrun's contract: a Kubernetes Indexed Job's manifest in
    /// `deploy/kubernetes/` sets these).
    pub mod torchrun {
        pub const RANK: &str = "RANK";
        pub const WORLD_SIZE: &str = "WORLD_SIZE";
        pub const LOCAL_RANK: &str = "LOCAL_RANK";
        pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
        /// Rank 0's host: it runs the store there.
        pub const MASTER_ADDR: &str = "MASTER_ADDR";
        pub const MASTER_PORT: &str = "MASTER_PORT";
        pub const ALL: &[&str] = &[
            RANK,
            WORLD_SIZE,
            LOCAL_RANK,
            LOCAL_WORLD_SIZE,
            MASTER_ADDR,
            MASTER_PORT,
        ];
    }

    /// What a launcher sets for every rank, and so what a job's own
    /// environment may not override.
    pub const RESERVED: &[&str] = &[
        RANK,
        WORLD_SIZE,
        LOCAL_RANK,
        LOCAL_SIZE,
        STORE,
        TOKEN,
        JOB_ID,
        JOB_SERVER,
        JOB_TOKEN,
        RESUME_STEP,
    ];
}

/// Which launcher's variables a rank was started with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Gwrun,
    Slurm,
    Torchrun,
    /// Not from variables: a program passed the store and its rank itself
    /// (the C ABI's unique id, tests).
    Api,
}

impl Launcher {
    pub fn as_str(self) -> &'static str {
        match self {
            Launcher::Gwrun => "gwrun",
            Launcher::Slurm => "slurm",
            Launcher::Torchrun => "torchrun",
            Launcher::Api => "api",
        }
    }
}

/// The job server a worker reports its steps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobServerEnv {
    /// `http://host:port`.
    pub url: String,
    /// The job's token for the worker endpoints.
    pub job_token: String,
    /// How long to keep retrying a server that does not answer (`None`: the
    /// client's default).
    pub retry: Option<Duration>,
}

/// Who a rank is in its job and how it reaches the job's store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: u32,
    pub world: u32,
    pub local_rank: u32,
    pub local_size: u32,
    /// `host:port` of the rendezvous store.
    pub store: String,
    /// Job secret presented to the store.
    pub token: String,
    /// Names this job's shared-memory segments.
    pub job_id: String,
    /// Set when the rank was started by a job server's agent.
    pub job_server: Option<JobServerEnv>,
    /// Which launcher's variables were read (`Gwrun` for a written one).
    pub launcher: Launcher,
    /// Whether rank 0 must run the store itself (Slurm and torchrun launches).
    pub host_store: bool,
}

/// A variable lookup: the process environment, or a map in tests.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

impl LaunchEnv {
    /// The variables a launcher sets for this rank, in a fixed order.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            (var::RANK, self.rank.to_string()),
            (var::WORLD_SIZE, self.world.to_string()),
            (var::LOCAL_RANK, self.local_rank.to_string()),
            (var::LOCAL_SIZE, self.local_size.to_string()),
            (var::STORE, self.store.clone()),
            (var::TOKEN, self.token.clone()),
            (var::JOB_ID, self.job_id.clone()),
        ];
        if let Some(js) = &self.job_server {
            v.push((var::JOB_SERVER, js.url.clone()));
            v.push((var::JOB_TOKEN, js.job_token.clone()));
            if let Some(r) = js.retry {
                v.push((var::JOB_RETRY_S, r.as_secs_f64().to_string()));
            }
        }
        v
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads any variable lookup: gwrun's variables first, then Slurm's, then
    /// torchrun's. Every missing or malformed variable is named.
    pub fn from_lookup(env: Lookup<'_>) -> Result<LaunchEnv> {
        let token = env(var::TOKEN).unwrap_or_default();
        let (rank, world, local_rank, local_size, store, host_store, launcher);
        if env(var::RANK).is_some() || env(var::WORLD_SIZE).is_some() {
            launcher = Launcher::Gwrun;
            rank = need(num(env, var::RANK)?, var::RANK, launcher)?;
            world = need(num(env, var::WORLD_SIZE)?, var::WORLD_SIZE, launcher)?;
            local_rank = num(env, var::LOCAL_RANK)?.unwrap_or(rank);
            local_size = num(env, var::LOCAL_SIZE)?.unwrap_or(world);
            store = env(var::STORE).ok_or_else(|| {
                Error::Config(format!(
                    "{} is not set (run the program under gwrun)",
                    var::STORE
                ))
            })?;
            host_store = false;
        } else if env("SLURM_PROCID").is_some() {
            launcher = Launcher::Slurm;
            rank = need(num(env, "SLURM_PROCID")?, "SLURM_PROCID", launcher)?;
            world = need(num(env, "SLURM_NTASKS")?, "SLURM_NTASKS", launcher)?;
            local_rank = num(env, "SLURM_LOCALID")?.unwrap_or(0);
            local_size = slurm::local_size(env)?.unwrap_or(1);
            (store, host_store) = if env(var::STORE).is_none() && env(tr::MASTER_ADDR).is_none() {
                (slurm::store_from_nodelist(env, rank)?, true)
            } else {
                store_from_master(env, launcher)?
            };
        } else if env(tr::RANK).is_some() || env(tr::WORLD_SIZE).is_some() {
            launcher = Launcher::Torchrun;
            rank = need(num(env, tr::RANK)?, tr::RANK, launcher)?;
            world = need(num(env, tr::WORLD_SIZE)?, tr::WORLD_SIZE, launcher)?;
            local_rank = num(env, tr::LOCAL_RANK)?.unwrap_or(0);
            local_size = num(env, tr::LOCAL_WORLD_SIZE)?.unwrap_or(1);
            (store, host_store) = store_from_master(env, launcher)?;
        } else {
            return Err(Error::Config(format!(
                "no launch variables: set {}, {} and {} (gwrun does), or run under Slurm or torchrun",
                var::RANK,
                var::WORLD_SIZE,
                var::STORE
            )));
        }
        if world == 0 {
            return Err(Error::Config("world size is 0".into()));
        }
        if rank >= world {
            return Err(Error::Config(format!(
                "rank {rank} is not below the world size {world}"
            )));
        }
        if local_size == 0 || local_rank >= local_size {
            return Err(Error::Config(format!(
                "local rank {local_rank} is not below the local size {local_size}"
            )));
        }
        let store = if host_store && token.is_empty() {
            tokenless_store(launcher, store, world, local_size)?
        } else {
            store
        };
        let job_id = match env(var::JOB_ID) {
            Some(j) if !j.is_empty() => sanitize(&j),
            _ => format!("{:016x}", fnv1a(&[&store, &token])),
        };
        Ok(LaunchEnv {
            rank,
            world,
            local_rank,
            local_size,
            store,
            token,
            job_id,
            // A malformed job-server part is the step client's to report,
            // when the program asks for a step: a communicator needs none of it.
            job_server: JobServerEnv::from_lookup(env)
                .ok()
                .flatten()
                .map(|(js, _)| js),
            launcher,
            host_store,
        })
    }
}

impl LaunchEnv {
    /// Where rank 0 binds the store it hosts (`host_store`): the store's own
    /// address when that is loopback, so that no other host can reach it,
    /// else every interface.
    pub fn store_bind(&self) -> Result<SocketAddr> {
        let host = store_host(&self.store);
        let port = self
            .store
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or_else(|| {
                Error::Config(format!(
                    "store address {:?} does not end in :port",
                    self.store
                ))
            })?;
        let ip = if host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            match host.parse::<IpAddr>() {
                Ok(ip) if ip.is_loopback() => ip,
                _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            }
        };
        Ok(SocketAddr::new(ip, port))
    }
}

/// The host part of a `host:port` store address, without IPv6 brackets.
fn store_host(store: &str) -> &str {
    let host = store.rsplit_once(':').map_or(store, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Whether `host` names this machine's loopback interface, which other
/// hosts cannot reach.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Where a store rank 0 hosts without a token may listen: only where no
/// other host reaches it. That is the store's own address when it is
/// loopback, or loopback when the launcher says every rank is on this host
/// (all ranks read the same variables, so all agree on the address). A
/// store the ranks of several hosts must reach is refused.
fn tokenless_store(
    launcher: Launcher,
    store: String,
    world: u32,
    local_size: u32,
) -> Result<String> {
    if is_loopback(store_host(&store)) {
        return Ok(store);
    }
    if local_size == world {
        let port = store.rsplit_once(':').map_or("", |(_, p)| p);
        return Ok(format!("127.0.0.1:{port}"));
    }
    Err(no_token(launcher, &store))
}

fn no_token(launcher: Launcher, store: &str) -> Error {
    let l = launcher.as_str();
    Error::Config(format!(
        "{} is not set: under {l}, rank 0 hosts the rendezvous store at {store}, which the \
         ranks of other hosts must reach (so can anyone else there), and nothing {l} provides \
         is secret, so any process that can reach it could join the job; give every rank the \
         same secret, e.g. \
         `export {}=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')` before running {}",
        var::TOKEN,
        var::TOKEN,
        match launcher {
            Launcher::Slurm => "srun (which passes the environment on)",
            _ => "torchrun (on every node)",
        }
    ))
}

/// A launch variable that is missing or malformed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VarError {
    pub var: &'static str,
    /// Completes "`var` ...": "is not set (...)", "is empty", ...
    pub detail: String,
}

impl std::fmt::Display for VarError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.var, self.detail)
    }
}

impl JobServerEnv {
    /// The job server of a worker started by a gwjob agent, and the job's
    /// id; `None` when `GW_JOB_SERVER` is unset or empty (the program was
    /// not started by a gwjob agent).
    pub fn from_lookup(
        env: Lookup<'_>,
    ) -> std::result::Result<Option<(JobServerEnv, String)>, VarError> {
        if env(var::JOB_SERVER).is_none_or(|v| v.is_empty()) {
            return Ok(None);
        }
        let needed = |name: &'static str| match env(name) {
            Some(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
            Some(_) => Err(VarError {
                var: name,
                detail: "is empty".into(),
            }),
            None => Err(VarError {
                var: name,
                detail: format!(
                    "is not set ({} is, so a gwjob agent should have set it)",
                    var::JOB_SERVER
                ),
            }),
        };
        let url = needed(var::JOB_SERVER)?;
        let job_id = needed(var::JOB_ID)?;
        let job_token = needed(var::JOB_TOKEN)?;
        let retry = match env(var::JOB_RETRY_S) {
            Some(t) if !t.trim().is_empty() => {
                Some(parse_retry(&t).map_err(|detail| VarError {
                    var: var::JOB_RETRY_S,
                    detail,
                })?)
            }
            _ => None,
        };
        Ok(Some((
            JobServerEnv {
                url,
                job_token,
                retry,
            },
            job_id,
        )))
    }

    /// Reads the process environment (a variable that is not valid UTF-8
    /// counts as unset).
    pub fn from_env() -> std::result::Result<Option<(JobServerEnv, String)>, VarError> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }
}

/// Parses `GW_JOB_RETRY_S`: seconds, fractions allowed, > 0.
pub fn parse_retry(text: &str) -> std::result::Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!("'{text}' is not a positive number of seconds")),
    }
}

/// The variables common to every rank of a job before ranks are numbered:
/// what a job server sends an agent, which adds each rank's own numbers.
pub fn job_vars(
    world: u32,
    local_size: u32,
    store: &str,
    token: &str,
    job_id: &str,
    job_server: Option<&JobServerEnv>,
) -> Vec<(&'static str, String)> {
    let mut v = vec![
        (var::WORLD_SIZE, world.to_string()),
        (var::LOCAL_SIZE, local_size.to_string()),
        (var::STORE, store.to_owned()),
        (var::TOKEN, token.to_owned()),
        (var::JOB_ID, job_id.to_owned()),
    ];
    if let Some(js) = job_server {
        v.push((var::JOB_SERVER, js.url.clone()));
        v.push((var::JOB_TOKEN, js.job_token.clone()));
    }
    v
}

pub(crate) fn num(env: Lookup<'_>, name: &str) -> Result<Option<u32>> {
    match env(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}={v:?} is not a non-negative integer"))),
    }
}

fn need(v: Option<u32>, name: &str, launcher: Launcher) -> Result<u32> {
    v.ok_or_else(|| {
        Error::Config(format!(
            "{name} is not set (the {} launch variables are incomplete)",
            launcher.as_str()
        ))
    })
}

/// A short stable id derived from text (FNV-1a), for job ids and
/// communicator ids: every rank computes the same value from the same words.
pub fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Keeps what is safe in a file name and a store key, at most 64 characters.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

fn store_from_master(env: Lookup<'_>, launcher: Launcher) -> Result<(String, bool)> {
    let launcher = launcher.as_str();
    if let Some(s) = env(var::STORE) {
        return Ok((s, false));
    }
    let addr = env(tr::MASTER_ADDR).ok_or_else(|| {
        Error::Config(format!(
            "MASTER_ADDR (or {}) is not set for a {launcher} launch",
            var::STORE
        ))
    })?;
    let port = num(env, tr::MASTER_PORT)?
        .ok_or_else(|| Error::Config(format!("MASTER_PORT is not set for a {launcher} launch")))?;
    if port == 0 || port > 65535 {
        return Err(Error::Config(format!(
            "MASTER_PORT={port} is not a TCP port"
        )));
    }
    Ok((format!("{addr}:{port}"), true))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A variable lookup over fixed pairs.
    pub(crate) fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn boot(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        LaunchEnv::from_lookup(&lookup(pairs))
    }

    #[test]
    fn gwrun_variables() {
        let b = boot(&[
            ("GW_RANK", "2"),
            ("GW_WORLD_SIZE", "4"),
            ("GW_LOCAL_RANK", "0"),
            ("GW_LOCAL_SIZE", "2"),
            ("GW_STORE", "127.0.0.1:999"),
            ("GW_TOKEN", "t"),
            ("GW_JOB_ID", "abc"),
        ])
        .unwrap();
        assert_eq!((b.rank, b.world, b.local_rank, b.local_size), (2, 4, 0, 2));
        assert_eq!(
            (b.store.as_str(), b.token.as_str(), b.job_id.as_str()),
            ("127.0.0.1:999", "t", "abc")
        );
        assert!(!b.host_store);
        assert_eq!(b.job_server, None);
    }

    #[test]
    fn what_a_launcher_writes_a_rank_reads_back() {
        let written = LaunchEnv {
            rank: 3,
            world: 8,
            local_rank: 1,
            local_size: 2,
            store: "10.1.2.3:4000".into(),
            token: "secret".into(),
            job_id: "j-1".into(),
            job_server: Some(JobServerEnv {
                url: "http://10.0.0.1:7000".into(),
                job_token: "jt".into(),
                retry: Some(Duration::from_millis(2500)),
            }),
            launcher: Launcher::Gwrun,
            host_store: false,
        };
        let vars: Vec<(String, String)> = written
            .vars()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(boot(&pairs).unwrap(), written);
        // Everything written is reserved from a job's own environment.
        for (k, _) in &vars {
            assert!(
                var::RESERVED.contains(&k.as_str()) || k == var::JOB_RETRY_S,
                "{k}"
            );
        }
    }

    #[test]
    fn job_vars_plus_a_rank_make_a_launch_env() {
        let js = JobServerEnv {
            url: "http://h:1".into(),
            job_token: "jt".into(),
            retry: None,
        };
        let mut vars: Vec<(String, String)> = job_vars(4, 2, "h:2", "tok", "job", Some(&js))
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        vars.push((var::RANK.into(), "3".into()));
        vars.push((var::LOCAL_RANK.into(), "1".into()));
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let e = boot(&pairs).unwrap();
        assert_eq!((e.rank, e.world, e.local_rank, e.local_size), (3, 4, 1, 2));
        assert_eq!(e.job_server, Some(js));
    }

    #[test]
    fn job_server_variables_are_named_when_wrong() {
        let server = JobServerEnv::from_lookup;
        assert_eq!(server(&lookup(&[])), Ok(None));
        let e = server(&lookup(&[
            ("GW_JOB_SERVER", "http://h:1"),
            ("GW_JOB_ID", "j"),
        ]))
        .unwrap_err();
        assert_eq!(e.var, "GW_JOB_TOKEN");
        assert!(e.detail.contains("is not set"), "{e}");
        let e = server(&lookup(&[
            ("GW_JOB_SERVER", "http://h:1"),
            ("GW_JOB_ID", " "),
            ("GW_JOB_TOKEN", "t"),
        ]))
        .unwrap_err();
        assert_eq!((e.var, e.detail.as_str()), ("GW_JOB_ID", "is empty"));
        let e = server(&lookup(&[
            ("GW_JOB_SERVER", "http://h:1"),
            ("GW_JOB_ID", "j"),
            ("GW_JOB_TOKEN", "t"),
            ("GW_JOB_RETRY_S", "-2"),
        ]))
        .unwrap_err();
        assert_eq!(e.var, "GW_JOB_RETRY_S");
        // A communicator does not need the job server: a bad one is left to
        // the step client.
        let env = boot(&[
            ("GW_RANK", "0"),
            ("GW_WORLD_SIZE", "1"),
            ("GW_STORE", "a:1"),
            ("GW_JOB_SERVER", "http://h:1"),
        ])
        .unwrap();
        assert_eq!(env.job_server, None);
    }

    #[test]
    fn slurm_and_torchrun_variables() {
        let s = boot(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("GW_TOKEN", "s3cret"),
        ])
        .unwrap();
        assert_eq!(
            (s.rank, s.world, s.launcher, s.host_store),
            (1, 2, Launcher::Slurm, true)
        );
        assert_eq!(
            (s.store.as_str(), s.token.as_str()),
            ("10.0.0.1:29500", "s3cret")
        );
        let t = boot(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "3"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
            ("GW_TOKEN", "t"),
        ])
        .unwrap();
        assert_eq!((t.rank, t.world, t.launcher), (0, 3, Launcher::Torchrun));
    }

    /// What srun hands task 3 of `srun -N 2 -n 4` on a cluster of two
    /// 4-CPU nodes (copied from a real step): no MASTER_ADDR, three tasks on
    /// the first node and one on the second.
    #[test]
    fn srun_variables_alone_place_the_store_on_the_first_node() {
        let task = |procid: &'static str, nodeid: &'static str, localid: &'static str| {
            vec![
                ("SLURM_PROCID", procid),
                ("SLURM_NTASKS", "4"),
                ("SLURM_NODEID", nodeid),
                ("SLURM_LOCALID", localid),
                ("SLURM_STEP_NODELIST", "gwnode[1-2]"),
                ("SLURM_STEP_TASKS_PER_NODE", "3,1"),
                ("SLURM_TASKS_PER_NODE", "3,1"),
                ("SLURM_JOB_ID", "1"),
                ("SLURM_STEP_ID", "0"),
            ]
        };
        let with_token = |mut v: Vec<(&'static str, &'static str)>| {
            v.push(("GW_TOKEN", "0123abcd"));
            v
        };
        let last = boot(&with_token(task("3", "1", "0"))).unwrap();
        assert_eq!(
            (last.rank, last.world, last.local_rank, last.local_size),
            (3, 4, 0, 1)
        );
        assert!(
            last.host_store && last.store.starts_with("gwnode1:"),
            "{last:?}"
        );
        let first = boot(&with_token(task("0", "0", "0"))).unwrap();
        assert_eq!((first.local_rank, first.local_size), (0, 3));
        assert_eq!(first.store, last.store);
        assert_eq!(first.job_id, last.job_id);
        assert!(first.store_bind().unwrap().ip().is_unspecified());
        // Across nodes without a token: refused, saying how to set one.
        let e = boot(&task("2", "0", "2")).unwrap_err().to_string();
        assert!(
            e.contains("GW_TOKEN is not set") && e.contains("srun"),
            "{e}"
        );
        // A step on one node needs none: the store stays on loopback.
        let one = boot(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "gwnode2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2"),
        ])
        .unwrap();
        assert!(one.store.starts_with("127.0.0.1:"), "{one:?}");
    }

    /// Slurm and torchrun give their tasks nothing secret: a store other
    /// hosts could reach needs GW_TOKEN, and the error says how to set it.
    #[test]
    fn a_reachable_store_without_a_token_is_refused() {
        let slurm = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let torch = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node-a"),
            ("MASTER_PORT", "29500"),
        ];
        for (env, launcher, how) in [
            (&slurm[..], "slurm", "srun"),
            (&torch[..], "torchrun", "torchrun"),
        ] {
            let e = boot(env).unwrap_err().to_string();
            assert!(e.contains("GW_TOKEN is not set"), "{e}");
            assert!(e.contains(&format!("under {launcher}")), "{e}");
            assert!(e.contains("export GW_TOKEN="), "{e}");
            assert!(e.contains(how), "{e}");
            // An empty GW_TOKEN is no token either.
            let mut empty = env.to_vec();
            empty.push(("GW_TOKEN", ""));
            assert!(boot(&empty).unwrap_err().to_string().contains("GW_TOKEN"));
            let mut with = env.to_vec();
            with.push(("GW_TOKEN", "00112233445566778899aabbccddeeff"));
            let b = boot(&with).unwrap();
            assert_eq!(b.token, "00112233445566778899aabbccddeeff");
            assert_eq!(b.store_bind().unwrap(), "0.0.0.0:29500".parse().unwrap());
        }
        // A store someone else runs (GW_STORE) is not rank 0's to open up.
        let mut given = slurm.to_vec();
        given.push(("GW_STORE", "10.0.0.2:7"));
        assert!(!boot(&given).unwrap().host_store);
    }

    /// On one host the store can stay on loopback, out of other hosts'
    /// reach: no token is needed there, and rank 0 binds loopback alone.
    /// (These launches say nothing of local ranks, so count as one rank a
    /// host.)
    #[test]
    fn a_loopback_store_needs_no_token_and_binds_loopback_only() {
        for (addr, bind) in [
            ("127.0.0.1", "127.0.0.1:29500"),
            ("localhost", "127.0.0.1:29500"),
            ("LocalHost", "127.0.0.1:29500"),
            ("127.0.0.2", "127.0.0.2:29500"),
            ("::1", "[::1]:29500"),
            ("[::1]", "[::1]:29500"),
        ] {
            let b = boot(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", addr),
                ("MASTER_PORT", "29500"),
            ])
            .unwrap_or_else(|e| panic!("{addr}: {e}"));
            assert!(b.host_store && b.token.is_empty(), "{addr}");
            assert_eq!(b.store_bind().unwrap(), bind.parse().unwrap(), "{addr}");
        }
        // Every rank on this host (as many local ranks as ranks): the store
        // moves to loopback whatever MASTER_ADDR says (torchrun sets the
        // host's name), unless a token lets it stay where it was put.
        let one_host = |token: Option<&str>| {
            let mut v = vec![
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "1"),
                ("SLURM_NTASKS_PER_NODE", "2"),
                ("MASTER_ADDR", "node-a.example.com"),
                ("MASTER_PORT", "29500"),
            ];
            if let Some(t) = token {
                v.push(("GW_TOKEN", t));
            }
            boot(&v).unwrap()
        };
        let b = one_host(None);
        assert_eq!(b.store, "127.0.0.1:29500");
        assert_eq!(b.store_bind().unwrap(), "127.0.0.1:29500".parse().unwrap());
        assert_eq!(one_host(Some("t")).store, "node-a.example.com:29500");
        // Addresses that merely look local are not loopback.
        for addr in ["0.0.0.0", "localhost.example.com", "10.127.0.1"] {
            let e = boot(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", addr),
                ("MASTER_PORT", "29500"),
            ])
            .unwrap_err();
            assert!(e.to_string().contains("GW_TOKEN is not set"), "{addr}: {e}");
        }
    }

    #[test]
    fn bad_environments_are_named() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "no launch variables"),
            (&[("GW_RANK", "0"), ("GW_WORLD_SIZE", "2")], "GW_STORE"),
            (
                &[
                    ("GW_RANK", "x"),
                    ("GW_WORLD_SIZE", "2"),
                    ("GW_STORE", "a:1"),
                ],
                "GW_RANK=\"x\"",
            ),
            (
                &[
                    ("GW_RANK", "2"),
                    ("GW_WORLD_SIZE", "2"),
                    ("GW_STORE", "a:1"),
                ],
                "not below the world size",
            ),
            (&[("RANK", "0"), ("WORLD_SIZE", "2")], "MASTER_ADDR"),
        ];
        for (env, want) in cases {
            let e = boot(env).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        }
    }
}
