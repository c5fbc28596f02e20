//! A torchrun-style launch (`RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`; rank 0 hosts the store) with and without
//! `GW_TOKEN`, in two real rank processes: this test executable started
//! again as each rank. A job on one host (a loopback `MASTER_ADDR`, or both
//! ranks local) needs no token and keeps its store on loopback. A job that
//! says it spans hosts (one local rank each; both are on this host really,
//! and 0.0.0.0 reaches the store from here) is refused by every rank
//! without a token, with a message saying how to set one, and runs with one.

use gw_collectives::{CommKey, Communicator, Config, LaunchEnv, RedOp};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "GW_TEST_TORCHRUN_RANK";

/// One rank, when started by `launch`; nothing otherwise.
#[test]
fn child_rank() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let result = LaunchEnv::from_env()
        .map_err(|e| e.to_string())
        .and_then(|env| {
            let rank = env.rank;
            let mut cfg = Config::default();
            // Generous: ranks share a busy machine.
            cfg.timeout.set(Duration::from_secs(60));
            let comm = CommKey::exact("torchrun")
                .and_then(|k| Communicator::init(env, k, cfg))
                .map_err(|e| e.to_string())?;
            let mut v = vec![(rank + 1) as f32; 64];
            comm.all_reduce_in_place(&mut v, RedOp::Sum)
                .map_err(|e| e.to_string())?;
            Ok(v[0])
        });
    match result {
        Ok(sum) => println!("sum={sum}"),
        Err(e) => {
            println!("error: {e}");
            std::process::exit(3);
        }
    }
}

/// A port nobody listens on now (the store binds it shortly after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Starts two ranks with torchrun's variables, `local` of them a host (and
/// `GW_TOKEN` if given), and returns each one's exit success and output,
/// killing any still running after two minutes.
fn launch(master: &str, local: u32, token: Option<&str>) -> Vec<(bool, String)> {
    let exe = std::env::current_exe().expect("test executable");
    let port = free_port().to_string();
    let children: Vec<_> = (0..2)
        .map(|rank: u32| {
            let mut c = Command::new(&exe);
            c.args(["--exact", "child_rank", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", (rank % local).to_string())
                .env("LOCAL_WORLD_SIZE", local.to_string())
                .env("MASTER_ADDR", master)
                .env("MASTER_PORT", &port)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // Only torchrun's variables: none of gwrun's or Slurm's, which
            // would be read first.
            for v in gw_collectives::launch_env::var::RESERVED {
                c.env_remove(v);
            }
            c.env_remove("SLURM_PROCID");
            if let Some(t) = token {
                c.env("GW_TOKEN", t);
            }
            c.spawn().expect("start a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    children
        .into_iter()
        .map(|mut child| {
            let status = loop {
                match child.try_wait().expect("wait for a rank") {
                    Some(s) => break Some(s),
                    None if Instant::now() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            let mut out = String::new();
            for pipe in [
                child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
                child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
            ]
            .into_iter()
            .flatten()
            {
                let mut p = pipe;
                let _ = p.read_to_string(&mut out);
            }
            (status.is_some_and(|s| s.success()), out)
        })
        .collect()
}

fn all_ran(runs: Vec<(bool, String)>) {
    // Every rank's output when one fails: the cause is often in another's.
    let all: String = runs
        .iter()
        .enumerate()
        .map(|(rank, (ok, out))| format!("rank {rank} (ok: {ok}):\n{out}\n"))
        .collect();
    for (ok, out) in &runs {
        assert!(*ok && out.contains("sum=3"), "{all}");
    }
}

#[test]
fn a_loopback_store_runs_without_a_token() {
    all_ran(launch("127.0.0.1", 1, None));
}

/// torchrun sets MASTER_ADDR to the host's name even on one host; with
/// every rank local the store moves to loopback, so the name is not even
/// looked up (this one would not resolve).
#[test]
fn a_one_host_job_keeps_its_store_on_loopback_without_a_token() {
    all_ran(launch("node-a.invalid", 2, None));
}

#[test]
fn a_reachable_store_without_a_token_is_refused_by_every_rank() {
    for (rank, (ok, out)) in launch("0.0.0.0", 1, None).into_iter().enumerate() {
        assert!(!ok, "rank {rank} ran without a token:\n{out}");
        assert!(
            out.contains("GW_TOKEN is not set") && out.contains("export GW_TOKEN="),
            "rank {rank}:\n{out}"
        );
    }
}

#[test]
fn a_reachable_store_with_a_token_runs() {
    let token = gw_rendezvous::token::random_hex(16).expect("/dev/urandom");
    all_ran(launch("0.0.0.0", 1, Some(&token)));
}
