//! gwrun's ranks: the launch environment of each, and starting them.

use crate::bind;
use crate::child::{self, Group};
use gw_rendezvous::LaunchEnv;
use gw_rendezvous::launch_env::Launcher;
use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// What every rank of one job shares.
#[derive(Debug, Clone)]
pub struct RankPlan {
    /// Resolved program path.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub world: u32,
    /// `host:port` of the job's store, as ranks reach it.
    pub store: String,
    pub token: String,
    pub job_id: String,
    /// Settings passed on from gwrun's flags (`GW_TRANSPORT`, ...).
    pub settings: Vec<(&'static str, String)>,
    /// Pipe stdout/stderr to gwrun (for tagging) or let ranks inherit them.
    pub pipe_output: bool,
    /// The processors of each rank, if bound (see [`crate::bind`]).
    pub cpus: Option<Vec<Vec<u32>>>,
}

/// The host part of a `host:port` store address, without IPv6 brackets.
pub fn store_host(store: &str) -> &str {
    let host = store.rsplit_once(':').map_or(store, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

impl RankPlan {
    /// What rank `rank` is told. gwrun runs every rank on this host.
    pub fn launch_env(&self, rank: u32) -> LaunchEnv {
        LaunchEnv {
            rank,
            world: self.world,
            local_rank: rank,
            local_size: self.world,
            store: self.store.clone(),
            token: self.token.clone(),
            job_id: self.job_id.clone(),
            job_server: None,
            launcher: Launcher::Gwrun,
            host_store: false,
        }
    }

    /// Starts rank `rank`. `pgid` is `None` for the first rank, which becomes
    /// the leader of a new process group; later ranks join `Some(leader)`.
    pub fn spawn(&self, rank: u32, pgid: Option<i32>) -> io::Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in self
            .launch_env(rank)
            .vars()
            .into_iter()
            .chain(self.settings.iter().cloned())
        {
            cmd.env(k, v);
        }
        // torchrun's per-rank variables (MASTER_ADDR and MASTER_PORT are
        // among the settings).
        use gw_rendezvous::launch_env::var::torchrun as tr;
        cmd.env(tr::RANK, rank.to_string())
            .env(tr::WORLD_SIZE, self.world.to_string())
            .env(tr::LOCAL_RANK, rank.to_string())
            .env(tr::LOCAL_WORLD_SIZE, self.world.to_string());
        if self.pipe_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        child::prepare(&mut cmd, pgid.map_or(Group::New, Group::Join));
        if let Some(share) = self.cpus.as_ref().and_then(|c| c.get(rank as usize)) {
            let set = bind::cpu_set(share)?;
            let what = bind::list(share);
            // SAFETY: the closure runs between fork and exec; `apply` is one
            // system call on the set built above, and the error path only
            // moves an io::Error out (the message is formatted by the parent).
            unsafe {
                cmd.pre_exec(move || bind::apply(&set));
            }
            return cmd.spawn().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{e} (it was to run on processors {what})"),
                )
            });
        }
        cmd.spawn()
    }
}
