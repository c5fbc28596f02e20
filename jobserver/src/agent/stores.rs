//! Rendezvous stores of the jobs whose rank 0 runs on this node.
//!
//! The store runs inside the agent (as in gwrun) so that its lifetime is
//! the job's on this node and nothing else has to be started or cleaned up.
//! It is closed when the job is stopped, or a while after the last local
//! worker exited: ranks on other nodes may still be finishing (and posting
//! a failure to the store's board), so it lingers rather than vanishing
//! under them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use gw_rendezvous::{StoreConfig, StoreServer};

/// How long a store outlives the job's last local worker.
pub const LINGER: Duration = Duration::from_secs(30);

struct Open {
    /// The job's placement it serves: the next placement of a preempted
    /// job needs a store without the last one's keys.
    attempt: u32,
    server: StoreServer,
    addr: String,
    close_at: Option<Instant>,
}

/// The open stores, by job id.
#[derive(Default)]
pub struct Stores {
    open: HashMap<String, Open>,
}

impl Stores {
    /// The address of the store of `job`'s placement `attempt`, opening it
    /// on `ip:0` if needed; a store of another placement of the job is
    /// closed first.
    pub fn open(
        &mut self,
        job: &str,
        attempt: u32,
        token: &str,
        ip: IpAddr,
    ) -> Result<String, String> {
        if let Some(o) = self.open.get_mut(job) {
            if o.attempt == attempt {
                o.close_at = None;
                return Ok(o.addr.clone());
            }
            self.close(job);
        }
        let bind = SocketAddr::new(ip, 0);
        let server = StoreServer::start(bind, token, StoreConfig::default())
            .map_err(|e| format!("cannot start the rendezvous store on {bind}: {e}"))?;
        let addr = SocketAddr::new(ip, server.local_addr().port()).to_string();
        self.open.insert(
            job.to_owned(),
            Open {
                attempt,
                server,
                addr: addr.clone(),
                close_at: None,
            },
        );
        Ok(addr)
    }

    pub fn addr(&self, job: &str) -> Option<&str> {
        self.open.get(job).map(|o| o.addr.as_str())
    }

    /// Every open store (job, placement, address), for re-announcing them
    /// to a server that forgot us.
    pub fn all(&self) -> impl Iterator<Item = (&str, u32, &str)> {
        self.open
            .iter()
            .map(|(j, o)| (j.as_str(), o.attempt, o.addr.as_str()))
    }

    /// Closes `job`'s store now; whether one was open.
    pub fn close(&mut self, job: &str) -> bool {
        match self.open.remove(job) {
            Some(o) => {
                o.server.shutdown();
                true
            }
            None => false,
        }
    }

    /// Closes `job`'s store at `when` (unless it is reopened first).
    pub fn close_at(&mut self, job: &str, when: Instant) {
        if let Some(o) = self.open.get_mut(job) {
            o.close_at = Some(when);
        }
    }

    /// Closes the stores whose time has come; returns their jobs and the
    /// next closing time.
    pub fn tick(&mut self, now: Instant) -> (Vec<String>, Option<Instant>) {
        let due: Vec<String> = self
            .open
            .iter()
            .filter(|(_, o)| o.close_at.is_some_and(|t| t <= now))
            .map(|(j, _)| j.clone())
            .collect();
        for j in &due {
            self.close(j);
        }
        let next = self.open.values().filter_map(|o| o.close_at).min();
        (due, next)
    }

    pub fn close_all(&mut self) {
        for (_, o) in self.open.drain() {
            o.server.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gw_rendezvous::StoreClient;
    use std::net::Ipv4Addr;

    const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn open_is_idempotent_and_the_store_answers() {
        let mut s = Stores::default();
        let a = s.open("j1", 0, "tok", LO).unwrap();
        assert_eq!(s.open("j1", 0, "tok", LO).unwrap(), a);
        assert!(a.starts_with("127.0.0.1:"));
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = StoreClient::connect(&a, "tok", deadline).unwrap();
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k").unwrap().as_deref(), Some(&b"v"[..]));
        assert!(s.close("j1"));
        assert!(!s.close("j1"));
        assert!(s.addr("j1").is_none());
    }

    #[test]
    fn a_new_placement_gets_a_fresh_store() {
        let mut s = Stores::default();
        let a = s.open("j1", 0, "tok", LO).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = StoreClient::connect(&a, "tok", deadline).unwrap();
        c.set("k", b"old").unwrap();
        s.close_at("j1", Instant::now() + Duration::from_secs(60));
        let b = s.open("j1", 1, "tok", LO).unwrap();
        assert_ne!(a, b, "the lingering store of placement 0 was reused");
        let mut c = StoreClient::connect(&b, "tok", deadline).unwrap();
        assert_eq!(c.get("k").unwrap(), None, "a key of the last placement");
        assert_eq!(s.all().collect::<Vec<_>>(), [("j1", 1, b.as_str())]);
        let (closed, _) = s.tick(Instant::now() + Duration::from_secs(120));
        assert!(
            closed.is_empty(),
            "the new store kept the old one's closing time"
        );
    }

    #[test]
    fn lingering_stores_close_on_time() {
        let mut s = Stores::default();
        s.open("a", 0, "t", LO).unwrap();
        s.open("b", 0, "t", LO).unwrap();
        let now = Instant::now();
        s.close_at("a", now + Duration::from_millis(10));
        let (closed, next) = s.tick(now);
        assert!(closed.is_empty());
        assert_eq!(next, Some(now + Duration::from_millis(10)));
        let (closed, next) = s.tick(now + Duration::from_millis(10));
        assert_eq!(closed, ["a"]);
        assert_eq!(next, None);
        assert_eq!(s.all().count(), 1);
        s.close_all();
        assert_eq!(s.all().count(), 0);
    }
}
