//! `gradwire::device::DeviceComm` (gwbench's `--device cuda`) is for calls
//! with device memory: given host buffers only, each of its calls says so
//! and posts nothing, so the communicator goes on as if it had not been
//! called. Two ranks are threads of this process over a real store on
//! loopback and real shared memory; no GPU is needed (in a process that has
//! not loaded the CUDA driver every buffer is host memory).

use gradwire::device::DeviceComm;
use gw_collectives::launch_env::Launcher;
use gw_collectives::{
    CommKey, Communicator, Config, DType, LaunchEnv, OpKind, RawOp, RedOp, TransportChoice,
};
use gw_rendezvous::{StoreConfig, StoreServer};
use std::time::Duration;

const TOKEN: &str = "device-host-token";

#[test]
fn device_calls_on_host_memory_are_refused_and_post_nothing() {
    let store = StoreServer::start(
        "127.0.0.1:0".parse().expect("loopback"),
        TOKEN,
        StoreConfig::default(),
    )
    .expect("store");
    let job = format!("devicehost{}", std::process::id());
    let ranks: Vec<_> = (0..2u32)
        .map(|rank| {
            let env = LaunchEnv {
                rank,
                world: 2,
                local_rank: rank,
                local_size: 2,
                store: store.local_addr().to_string(),
                token: TOKEN.into(),
                job_id: job.clone(),
                job_server: None,
                launcher: Launcher::Api,
                host_store: false,
            };
            std::thread::spawn(move || one_rank(rank, env))
        })
        .collect();
    for (rank, h) in ranks.into_iter().enumerate() {
        match h.join() {
            Ok(r) => r.unwrap_or_else(|e| panic!("rank {rank}: {e}")),
            Err(_) => panic!("rank {rank} panicked"),
        }
    }
}

fn one_rank(rank: u32, env: LaunchEnv) -> Result<(), String> {
    let mut cfg = Config::default();
    cfg.transport.set(TransportChoice::Shm);
    // Generous: ranks are threads on a shared, busy machine.
    cfg.timeout.set(Duration::from_secs(60));
    let comm = CommKey::exact("devhost")
        .and_then(|k| Communicator::init(env, k, cfg))
        .map_err(|e| format!("init: {e}"))?;
    let dc = DeviceComm::new(&comm);
    let peer = 1 - rank;
    let send = [rank as u8 + 1; 64];
    let mut recv = [0u8; 64];
    let host = "the buffers are host memory";

    // SAFETY: both arrays outlive the calls, which refuse before posting.
    let e = unsafe {
        dc.sendrecv(
            Some((peer, send.as_ptr(), send.len())),
            Some((peer, recv.as_mut_ptr(), recv.len())),
        )
    }
    .expect_err("a host-memory exchange through the device path");
    if !e.contains(host) {
        return Err(format!("sendrecv said {e:?}"));
    }
    let op = RawOp {
        kind: OpKind::AllReduce,
        dtype: DType::U8,
        redop: RedOp::Sum,
        count: send.len(),
        root: 0,
        send: send.as_ptr().cast(),
        recv: recv.as_mut_ptr().cast(),
        weight: None,
    };
    // SAFETY: as above.
    let e = unsafe { dc.run(&op) }.expect_err("a host-memory all-reduce through the device path");
    if !e.contains("host memory") {
        return Err(format!("run said {e:?}"));
    }

    // Nothing was posted: the next message pairs with the peer's next one,
    // of another length and other bytes than the refused one's (a stray
    // 64-byte message would fail this receive as a size mismatch).
    let mine = [rank as u8 + 101; 32];
    let mut theirs = [0u8; 32];
    comm.sendrecv(&mine, peer, &mut theirs, peer)
        .map_err(|e| format!("host exchange: {e}"))?;
    if theirs != [peer as u8 + 101; 32] {
        return Err(format!("received {:?}, not the peer's bytes", &theirs[..4]));
    }
    Ok(())
}
