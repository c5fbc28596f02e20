//! Communicators meet by key, not by creation order: two communicators
//! created by two threads of each rank, in opposite orders on the two
//! ranks, pair up correctly; one thread that creates them in opposite
//! orders on the two ranks (a deadlock in any library with blocking init)
//! fails within the timeout, each rank saying which communicator the other
//! is bringing up. The ranks are threads of this process over real sockets
//! and a real store on loopback.

use gw_collectives::launch_env::Launcher;
use gw_collectives::{CommKey, Communicator, Config, Error, LaunchEnv, RedOp};
use gw_rendezvous::{StoreConfig, StoreServer};
use std::time::{Duration, Instant};

fn store() -> StoreServer {
    let addr = "127.0.0.1:0".parse().expect("loopback");
    StoreServer::start(addr, "keys", StoreConfig::default()).expect("store")
}

fn env(store: &StoreServer, rank: u32, job: &str) -> LaunchEnv {
    LaunchEnv {
        rank,
        world: 2,
        local_rank: rank,
        local_size: 2,
        store: store.local_addr().to_string(),
        token: "keys".into(),
        job_id: format!("{job}{}", std::process::id()),
        job_server: None,
        launcher: Launcher::Api,
        host_store: false,
    }
}

fn init(env: LaunchEnv, key: &str, timeout: Duration) -> gw_collectives::Result<Communicator> {
    let mut cfg = Config::default();
    cfg.timeout.set(timeout);
    Communicator::init(env, CommKey::exact(key)?, cfg)
}

/// Sums `scale * (rank + 1)` over the two ranks of `comm`.
fn sum(comm: &Communicator, scale: f32) -> f32 {
    let mut v = vec![scale * (comm.rank() + 1) as f32; 16];
    comm.all_reduce_in_place(&mut v, RedOp::Sum)
        .expect("all-reduce");
    assert!(v.iter().all(|&x| x == v[0]));
    v[0]
}

#[test]
fn communicators_created_by_threads_in_opposite_orders_pair_by_key() {
    let s = store();
    let ranks: Vec<_> = (0..2u32)
        .map(|r| {
            let (ga, pa) = (env(&s, r, "kt"), env(&s, r, "kt"));
            std::thread::spawn(move || {
                // Rank 0 starts "grads" first, rank 1 "params" first.
                let first_grads = r == 0;
                let grads = std::thread::spawn(move || {
                    if !first_grads {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    init(ga, "grads-0", Duration::from_secs(30))
                });
                let params = std::thread::spawn(move || {
                    if first_grads {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    init(pa, "params-0", Duration::from_secs(30))
                });
                let grads = grads.join().expect("grads thread").expect("grads init");
                let params = params.join().expect("params thread").expect("params init");
                (grads, params)
            })
        })
        .collect();
    let comms: Vec<(Communicator, Communicator)> = ranks
        .into_iter()
        .map(|t| t.join().expect("rank thread"))
        .collect();
    let checks: Vec<_> = comms
        .into_iter()
        .map(|(g, p)| {
            std::thread::spawn(move || {
                assert_eq!(
                    (g.key().as_str(), p.key().as_str()),
                    ("grads-0", "params-0")
                );
                // Each communicator sums with its own partner: 1+2 and 10+20.
                (sum(&g, 1.0), sum(&p, 10.0))
            })
        })
        .collect();
    for c in checks {
        assert_eq!(c.join().expect("check thread"), (3.0, 30.0));
    }
}

#[test]
fn one_thread_creating_them_in_opposite_orders_fails_naming_the_other_communicator() {
    let s = store();
    let timeout = Duration::from_secs(3);
    let ranks: Vec<_> = (0..2u32)
        .map(|r| {
            let e = env(&s, r, "kd");
            let (first, second) = if r == 0 {
                ("grads-0", "params-0")
            } else {
                ("params-0", "grads-0")
            };
            std::thread::spawn(move || {
                let start = Instant::now();
                let err = match init(e, first, timeout) {
                    Ok(_) => panic!("rank {r}: {first} came up without its peer"),
                    Err(err) => err,
                };
                (err, second, start.elapsed())
            })
        })
        .collect();
    for (r, t) in ranks.into_iter().enumerate() {
        let (err, other, took) = t.join().expect("rank thread");
        let msg = err.to_string();
        assert!(matches!(err, Error::Timeout { .. }), "rank {r}: {msg}");
        assert!(
            msg.contains(&format!("is bringing up communicator {other}")),
            "rank {r} must say what its peer is doing: {msg}"
        );
        assert!(
            took < timeout + Duration::from_secs(5),
            "rank {r} took {took:?}"
        );
    }
}
