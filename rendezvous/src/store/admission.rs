//! Which new connections the store takes on, and how many it holds.
//!
//! Every connection costs the store a thread, a socket and a read buffer, and
//! anyone who can reach the port can open one, token or not. Two caps keep
//! that cheap: one on all connections (descriptors and threads), and one per
//! IP address on connections that have not yet presented the job token, so
//! that one host holding idle sockets open cannot take the slots of the ranks
//! of the job. Authenticated connections are not counted per address: a node
//! may run many ranks, and they hold their connection for the whole job.
//!
//! Over a cap the store answers `Busy` at once and closes; the client retries
//! with backoff until its deadline, so a job that arrives all at once (or
//! while a stranger's sockets age out) still comes up.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// The caps and the counts they are held against.
pub(super) struct Admission {
    max_connections: usize,
    max_unauthenticated_per_ip: usize,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    open: usize,
    unauthenticated: HashMap<IpAddr, usize>,
}

/// One admitted connection; dropping it gives its slots back.
pub(super) struct Ticket {
    admission: Arc<Admission>,
    ip: IpAddr,
    authenticated: bool,
}

impl Admission {
    pub(super) fn new(max_connections: usize, max_unauthenticated_per_ip: usize) -> Arc<Self> {
        Arc::new(Admission {
            max_connections,
            max_unauthenticated_per_ip,
            counts: Mutex::default(),
        })
    }

    /// Counts did not go half-updated when another thread panicked.
    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A ticket for a new connection from `ip`, or why it is refused.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, String> {
        let mut c = self.counts();
        if c.open >= self.max_connections {
            return Err(format!(
                "store busy: {} connections open, the most it holds",
                c.open
            ));
        }
        let waiting = c.unauthenticated.entry(ip).or_insert(0);
        if *waiting >= self.max_unauthenticated_per_ip {
            return Err(format!(
                "store busy: {waiting} connections from {ip} have not yet presented the job token, the most it holds per address"
            ));
        }
        *waiting += 1;
        c.open += 1;
        Ok(Ticket {
            admission: Arc::clone(self),
            ip,
            authenticated: false,
        })
    }

    /// (all open connections, those from `ip` still to authenticate).
    #[cfg(test)]
    pub(super) fn count(&self, ip: IpAddr) -> (usize, usize) {
        let c = self.counts();
        (c.open, c.unauthenticated.get(&ip).copied().unwrap_or(0))
    }
}

impl Ticket {
    /// The connection has presented its Hello (accepted or not): it no
    /// longer counts against its address's cap on waiting connections.
    pub(super) fn hello_done(&mut self) {
        if !self.authenticated {
            self.authenticated = true;
            release_waiting(&mut self.admission.counts(), self.ip);
        }
    }
}

fn release_waiting(c: &mut Counts, ip: IpAddr) {
    if let Some(n) = c.unauthenticated.get_mut(&ip) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            // Keep the map as small as the set of addresses now waiting.
            c.unauthenticated.remove(&ip);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.admission.counts();
        c.open = c.open.saturating_sub(1);
        if !self.authenticated {
            release_waiting(&mut c, self.ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn waiting_connections_are_capped_per_address_and_released_by_the_hello() {
        let adm = Admission::new(100, 2);
        let mut a1 = adm.admit(A).unwrap();
        let _a2 = adm.admit(A).unwrap();
        let err = adm.admit(A).err().unwrap();
        assert!(err.contains("10.0.0.1") && err.contains("busy"), "{err}");
        // Another address is unaffected.
        let _b1 = adm.admit(B).unwrap();
        // A Hello frees the slot for the address but not the connection.
        a1.hello_done();
        a1.hello_done();
        assert_eq!(adm.count(A), (3, 1));
        let a3 = adm.admit(A).unwrap();
        assert_eq!(adm.count(A), (4, 2));
        drop((a1, a3));
        assert_eq!(adm.count(A), (2, 1));
    }

    #[test]
    fn all_connections_are_capped_authenticated_or_not() {
        let adm = Admission::new(2, 10);
        let mut a = adm.admit(A).unwrap();
        a.hello_done();
        let b = adm.admit(B).unwrap();
        let err = adm.admit(B).err().unwrap();
        assert!(err.contains("2 connections open"), "{err}");
        drop(b);
        let _b = adm.admit(B).unwrap();
        drop(a);
        assert_eq!(adm.count(A), (1, 0));
        assert!(!adm.counts().unauthenticated.contains_key(&A));
    }
}
