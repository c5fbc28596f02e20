//! Who this process is in the job: rank, world size, and where the store is.
//!
//! `gwrun` sets `GW_*` variables. Programs started by Slurm (`SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_LOCALID`) or torchrun (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) are accepted too; they have no
//! launcher-run store, so rank 0 hosts it, as torch's TCPStore does.

use gw_transport::{Error, Result};

/// Identity of this rank and how to reach the rendezvous store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
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
    /// Whether rank 0 must run the store itself (Slurm / torchrun launches).
    pub host_store: bool,
    /// Which launcher's variables were used: "gwrun", "slurm" or "torchrun".
    pub launcher: &'static str,
    /// Names this communicator's store keys. When `None`, communicators are
    /// numbered in creation order per process (every rank must create them in
    /// the same order); a unique id (C ABI) names its communicator itself.
    pub comm_key: Option<String>,
}

fn num(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Option<u32>> {
    match env(var) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| Error::Config(format!("{var}={v:?} is not a non-negative integer"))),
    }
}

fn need(v: Option<u32>, var: &str, launcher: &str) -> Result<u32> {
    v.ok_or_else(|| {
        Error::Config(format!(
            "{var} is not set (the {launcher} launch variables are incomplete)"
        ))
    })
}

/// A short stable id derived from text (FNV-1a), for job ids and communicator ids.
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

impl Bootstrap {
    /// Reads the process environment.
    pub fn from_env() -> Result<Bootstrap> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads any variable lookup (tests pass a map).
    pub fn from_lookup(env: &dyn Fn(&str) -> Option<String>) -> Result<Bootstrap> {
        let token = env("GW_TOKEN").unwrap_or_default();
        let (rank, world, local_rank, local_size, store, host_store, launcher);
        if env("GW_RANK").is_some() || env("GW_WORLD_SIZE").is_some() {
            launcher = "gwrun";
            rank = need(num(env, "GW_RANK")?, "GW_RANK", launcher)?;
            world = need(num(env, "GW_WORLD_SIZE")?, "GW_WORLD_SIZE", launcher)?;
            local_rank = num(env, "GW_LOCAL_RANK")?.unwrap_or(rank);
            local_size = num(env, "GW_LOCAL_SIZE")?.unwrap_or(world);
            store = env("GW_STORE").ok_or_else(|| {
                Error::Config("GW_STORE is not set (run the program under gwrun)".into())
            })?;
            host_store = false;
        } else if env("SLURM_PROCID").is_some() {
            launcher = "slurm";
            rank = need(num(env, "SLURM_PROCID")?, "SLURM_PROCID", launcher)?;
            world = need(num(env, "SLURM_NTASKS")?, "SLURM_NTASKS", launcher)?;
            local_rank = num(env, "SLURM_LOCALID")?.unwrap_or(0);
            local_size = num(env, "SLURM_NTASKS_PER_NODE")?.unwrap_or(1);
            (store, host_store) = store_from_master(env, launcher)?;
        } else if env("RANK").is_some() || env("WORLD_SIZE").is_some() {
            launcher = "torchrun";
            rank = need(num(env, "RANK")?, "RANK", launcher)?;
            world = need(num(env, "WORLD_SIZE")?, "WORLD_SIZE", launcher)?;
            local_rank = num(env, "LOCAL_RANK")?.unwrap_or(0);
            local_size = num(env, "LOCAL_WORLD_SIZE")?.unwrap_or(1);
            (store, host_store) = store_from_master(env, launcher)?;
        } else {
            return Err(Error::Config(
                "no launch variables: set GW_RANK, GW_WORLD_SIZE and GW_STORE (gwrun does), or run under Slurm or torchrun"
                    .into(),
            ));
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
        let job_id = match env("GW_JOB_ID") {
            Some(j) if !j.is_empty() => sanitize(&j),
            _ => format!("{:016x}", fnv1a(&[&store, &token])),
        };
        Ok(Bootstrap {
            rank,
            world,
            local_rank,
            local_size,
            store,
            token,
            job_id,
            host_store,
            launcher,
            comm_key: None,
        })
    }
}

fn sanitize(s: &str) -> String {
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

fn store_from_master(
    env: &dyn Fn(&str) -> Option<String>,
    launcher: &str,
) -> Result<(String, bool)> {
    if let Some(s) = env("GW_STORE") {
        return Ok((s, false));
    }
    let addr = env("MASTER_ADDR").ok_or_else(|| {
        Error::Config(format!(
            "MASTER_ADDR (or GW_STORE) is not set for a {launcher} launch"
        ))
    })?;
    let port = num(env, "MASTER_PORT")?
        .ok_or_else(|| Error::Config(format!("MASTER_PORT is not set for a {launcher} launch")))?;
    if port == 0 || port > 65535 {
        return Err(Error::Config(format!(
            "MASTER_PORT={port} is not a TCP port"
        )));
    }
    Ok((format!("{addr}:{port}"), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn boot(pairs: &[(&str, &str)]) -> Result<Bootstrap> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Bootstrap::from_lookup(&move |k| m.get(k).cloned())
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
        ])
        .unwrap();
        assert_eq!(
            (s.rank, s.world, s.launcher, s.host_store),
            (1, 2, "slurm", true)
        );
        assert_eq!(s.store, "10.0.0.1:29500");
        let t = boot(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "3"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap();
        assert_eq!((t.rank, t.world, t.launcher), (0, 3, "torchrun"));
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
