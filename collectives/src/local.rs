//! Communicators of every rank of a world inside one process, one thread
//! each, over a store on loopback: what tests and examples use to run real
//! collectives (real sockets, real shared memory) without launching ranks.

use crate::comm_key::CommKey;
use crate::communicator::Communicator;
use crate::config::Config;
use gw_rendezvous::launch_env::{LaunchEnv, Launcher};
use gw_rendezvous::{StoreConfig, StoreServer};
use gw_transport::{Error, Result};

/// Brings up `world` communicators, rank `r` configured by `configure(r, cfg)`
/// from the defaults. `key` tells apart the jobs of one process (shared
/// memory segments and doorbells are named after it). The store must
/// outlive the communicators.
pub fn local_world(
    world: u32,
    key: &str,
    configure: impl Fn(u32, &mut Config),
) -> Result<(StoreServer, Vec<Communicator>)> {
    let token = "local-world";
    let addr = "127.0.0.1:0"
        .parse()
        .map_err(|e| Error::Internal(format!("loopback address: {e}")))?;
    let store = StoreServer::start(addr, token, StoreConfig::default())?;
    let store_addr = store.local_addr().to_string();
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let env = LaunchEnv {
                rank: r,
                world,
                local_rank: r,
                local_size: world,
                store: store_addr.clone(),
                token: token.into(),
                job_id: format!("lw{}{key}", std::process::id()),
                job_server: None,
                launcher: Launcher::Api,
                host_store: false,
            };
            let mut cfg = Config::default();
            configure(r, &mut cfg);
            let key = CommKey::exact(key);
            std::thread::spawn(move || Communicator::init(env, key?, cfg))
        })
        .collect();
    // Every thread is joined before an error is returned, so no rank is
    // left starting up in the background.
    let results: Vec<Result<Communicator>> = handles
        .into_iter()
        .enumerate()
        .map(|(r, h)| {
            h.join()
                .map_err(|_| Error::Internal(format!("rank {r}'s init thread panicked")))?
        })
        .collect();
    let comms = results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok((store, comms))
}
