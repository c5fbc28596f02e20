//! Shared-memory names come from a secret rank 0 hands out through the
//! store, not from the job id: with every name a job id used to predict
//! already taken (a directory at the segment's old file name, sockets
//! bound at the old doorbell names, as another local user could), two
//! ranks still bring up a communicator over shared memory and all-reduce.
//! The ranks are threads of this process over a real store on loopback,
//! real shared memory and real abstract sockets.

use gw_collectives::launch_env::Launcher;
use gw_collectives::{CommKey, Communicator, Config, LaunchEnv, RedOp, TransportChoice};
use gw_rendezvous::{StoreConfig, StoreServer};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

/// Removes the squatted directory even when the test fails.
struct Squatted(PathBuf);

impl Drop for Squatted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn names_a_job_id_predicts_can_be_taken_without_harm() {
    let store = StoreServer::start(
        "127.0.0.1:0".parse().expect("loopback"),
        "shm-names-token",
        StoreConfig::default(),
    )
    .expect("store");
    let job = format!("shmnames{}", std::process::id());
    let key = "squat";
    // The names every rank of this job used: gw-<job>-<key>-<lo>-<hi> in
    // /dev/shm and @gw-<job>-<key>-<rank>.
    let old = format!("{job}-{key}");
    let dir = PathBuf::from(format!("/dev/shm/gw-{old}-0-1"));
    std::fs::create_dir(&dir).expect("squat the old segment name");
    let _dir = Squatted(dir);
    let _bells: Vec<UnixDatagram> = (0..2)
        .map(|r| {
            let addr = SocketAddr::from_abstract_name(format!("gw-{old}-{r}").as_bytes())
                .expect("abstract name");
            UnixDatagram::bind_addr(&addr).expect("squat an old doorbell name")
        })
        .collect();

    let ranks: Vec<_> = (0..2u32)
        .map(|rank| {
            let env = LaunchEnv {
                rank,
                world: 2,
                local_rank: rank,
                local_size: 2,
                store: store.local_addr().to_string(),
                token: "shm-names-token".into(),
                job_id: job.clone(),
                job_server: None,
                launcher: Launcher::Api,
                host_store: false,
            };
            std::thread::spawn(move || -> Result<f32, String> {
                let mut cfg = Config::default();
                cfg.transport.set(TransportChoice::Shm);
                // Generous: ranks are threads on a shared, busy machine.
                cfg.timeout.set(Duration::from_secs(60));
                let comm = CommKey::exact(key)
                    .and_then(|k| Communicator::init(env, k, cfg))
                    .map_err(|e| format!("rank {rank}: init: {e}"))?;
                let mut v = vec![(rank + 1) as f32; 1000];
                comm.all_reduce_in_place(&mut v, RedOp::Sum)
                    .map_err(|e| format!("rank {rank}: all-reduce: {e}"))?;
                if v.iter().any(|&x| x != v[0]) {
                    return Err(format!("rank {rank}: uneven result"));
                }
                Ok(v[0])
            })
        })
        .collect();
    for t in ranks {
        assert_eq!(t.join().expect("rank thread"), Ok(3.0));
    }
}
