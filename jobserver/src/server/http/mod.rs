//! The HTTP front door of the job server, built so that no client — however
//! slow, silent or hostile — can take the server away from the agents and
//! workers that need it.
//!
//! hyper on a small tokio runtime: a connection costs a task and a socket,
//! never a thread, so clients that stall in their headers or body stall
//! only themselves. Every phase runs under a deadline ([`Limits`]): the
//! request head (which also bounds an idle keep-alive connection), the
//! body, and any stretch with no progress in either direction (a client
//! that never reads its reply). Connections are capped in total and per
//! peer address, and a request is routed and its token checked before a
//! byte of its body is read (`request.rs`). The handlers themselves touch
//! SQLite, so they run on tokio's blocking pool, capped at `--threads`.

mod conn;
mod request;
mod watched;

use crate::server::app::App;
use gw_rendezvous::ratelimit::{RateLimited, suppressed};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Largest request body accepted; real ones are a few hundred bytes.
pub const MAX_BODY: usize = 1 << 20;

/// Every bound the front door enforces, with the defaults `gwjob serve`
/// starts with (`docs/security.md` lists them and their flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open connections, all peers together.
    pub max_connections: usize,
    /// Open connections from one IP address (agents and workers of one
    /// node share one).
    pub max_per_peer: usize,
    /// To send a request's whole head; also how long a keep-alive
    /// connection may sit idle between requests.
    pub header_timeout: Duration,
    /// To send a request's whole body, once its head was accepted.
    pub body_timeout: Duration,
    /// Longest stretch with no byte moving either way while a request is
    /// in flight (a client that does not read its reply).
    pub stall_timeout: Duration,
    /// Request line and headers together, bytes.
    pub max_header_bytes: usize,
    /// Number of header fields.
    pub max_headers: usize,
    /// Request body, bytes.
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_per_peer: 256,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(30),
            max_header_bytes: 16 << 10,
            max_headers: 32,
            max_body: MAX_BODY,
        }
    }
}

/// Serves requests on `listener` until the process ends; `threads` bounds
/// how many requests run their handler at once.
pub fn serve(
    app: Arc<App>,
    listener: std::net::TcpListener,
    threads: usize,
    limits: Limits,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(threads.max(1))
        .thread_name("gwjob-http")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    rt.block_on(accept_loop(app, listener, Arc::new(limits)))
}

async fn accept_loop(
    app: Arc<App>,
    listener: std::net::TcpListener,
    limits: Arc<Limits>,
) -> Result<(), String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot make the listener non-blocking: {e}"))?;
    let listener =
        TcpListener::from_std(listener).map_err(|e| format!("cannot use the listener: {e}"))?;
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(PeerCount::default());
    let mut refusals = RateLimited::new(Duration::from_secs(10));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE, ECONNABORTED and the like pass; the listener
                // stays. A short pause lets descriptors come back.
                if let Some(n) = refusals.admit() {
                    tracing::warn!("accepting a connection failed: {e}{}", suppressed(n));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            if let Some(n) = refusals.admit() {
                tracing::warn!(
                    "refused {peer}: {} connections open, the most allowed{}",
                    limits.max_connections,
                    suppressed(n)
                );
            }
            conn::refuse(stream);
            continue;
        };
        let Some(slot) = PeerSlot::take(&peers, peer, limits.max_per_peer) else {
            if let Some(n) = refusals.admit() {
                tracing::warn!(
                    "refused {peer}: {} connections open from {}, the most allowed{}",
                    limits.max_per_peer,
                    peer.ip(),
                    suppressed(n)
                );
            }
            conn::refuse(stream);
            continue;
        };
        let (app, limits) = (app.clone(), limits.clone());
        tokio::spawn(async move {
            conn::serve(app, limits, stream, peer).await;
            drop((permit, slot));
        });
    }
}

/// Open connections per peer IP address.
#[derive(Default)]
struct PeerCount(Mutex<HashMap<IpAddr, usize>>);

/// One counted connection; dropping it gives the slot back.
struct PeerSlot {
    peers: Arc<PeerCount>,
    ip: IpAddr,
}

impl PeerSlot {
    fn take(peers: &Arc<PeerCount>, peer: SocketAddr, max: usize) -> Option<PeerSlot> {
        let mut map = peers.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(peer.ip()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: peers.clone(),
            ip: peer.ip(),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.peers.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_slots_are_counted_per_address_and_given_back() {
        let peers = Arc::new(PeerCount::default());
        let a: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let a2: SocketAddr = "10.0.0.1:5001".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:5000".parse().unwrap();
        let s1 = PeerSlot::take(&peers, a, 2).unwrap();
        let s2 = PeerSlot::take(&peers, a2, 2).unwrap();
        assert!(PeerSlot::take(&peers, a, 2).is_none());
        let s3 = PeerSlot::take(&peers, b, 2).unwrap();
        drop(s1);
        let s4 = PeerSlot::take(&peers, a, 2).unwrap();
        drop((s2, s3, s4));
        assert!(peers.0.lock().unwrap().is_empty());
    }
}
