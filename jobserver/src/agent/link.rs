//! The agent's conversation with the job server: register, heartbeat, and
//! what to do when the server does not answer.
//!
//! The server is allowed to be down (restarted, upgraded, `kill -9`): that
//! must cost the running workers nothing. So every failure here only
//! schedules the next try ([`Backoff`], doubling up to a few seconds), and
//! the news the agent has to deliver (stores opened, workers exited) stays
//! queued in [`Outbox`] until a heartbeat carrying it gets a reply. The
//! server accepts duplicates, so resending after a lost reply is safe.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use gw_jobapi::http::{Client, HttpError};
use gw_jobapi::types::{
    Heartbeat, HeartbeatReply, RegisterNode, RegisterReply, Role, StoreOpened, WorkerExit,
};

/// Limit of one call to the server; a hung server is treated as a down one.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The node's identity and the server it talks to.
pub struct Link {
    pub server: String,
    token: String,
    pub node: RegisterNode,
    /// One kept-alive connection for every heartbeat.
    http: Client,
}

impl Link {
    pub fn new(server: &str, token: &str, node: RegisterNode) -> Link {
        Link {
            server: server.to_owned(),
            token: token.to_owned(),
            node,
            http: Client::new(CALL_TIMEOUT),
        }
    }

    /// Registers the node; returns the heartbeat period the server wants
    /// and the role the server gave this agent's token (if it says).
    pub fn register(&self) -> Result<(Duration, Option<Role>), HttpError> {
        let r: RegisterReply = self.http.call(
            "POST",
            &self.server,
            "/v1/nodes/register",
            &self.token,
            Some(&self.node),
        )?;
        // A zero or absurd period from a confused server must not make us spin.
        let period = Duration::from_millis(r.heartbeat_ms.clamp(50, 60_000));
        Ok((period, r.role))
    }

    pub fn heartbeat(&self, hb: &Heartbeat) -> Result<HeartbeatReply, HttpError> {
        self.http.call(
            "POST",
            &self.server,
            &format!("/v1/nodes/{}/heartbeat", self.node.node),
            &self.token,
            Some(hb),
        )
    }
}

/// Whether the server answered that it does not know this node (it lost its
/// database, or declared the node lost): the cure is to register again.
pub fn is_unknown_node(e: &HttpError) -> bool {
    matches!(e, HttpError::Status { status: 404, .. })
}

/// Pauses between failed calls: `first`, doubling up to `max`.
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The pause before the next try, after one more failure.
    pub fn fail(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// News for the server, kept until a heartbeat that carried it is answered.
#[derive(Default)]
pub struct Outbox {
    pub stores: Vec<StoreOpened>,
    pub exits: Vec<WorkerExit>,
}

impl Outbox {
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty() && self.exits.is_empty()
    }

    /// The heartbeat to send now (everything queued).
    pub fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            stores: self.stores.clone(),
            exits: self.exits.clone(),
        }
    }

    /// Drops what `sent` carried: the server has it.
    pub fn delivered(&mut self, sent: &Heartbeat) {
        self.stores.retain(|s| !sent.stores.contains(s));
        self.exits.retain(|e| !sent.exits.contains(e));
    }

    /// Queues a store address unless the same one is queued already.
    pub fn push_store(&mut self, s: StoreOpened) {
        if !self.stores.contains(&s) {
            self.stores.push(s);
        }
    }
}

/// `host:port` of an `http://host[:port][/...]` URL.
pub fn url_authority(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let auth = rest.split('/').next()?;
    if auth.is_empty() {
        return None;
    }
    // A bracketed IPv6 address keeps its brackets; a port is added if absent.
    let has_port = match auth.rfind(']') {
        Some(i) => auth[i..].contains(':'),
        None => auth.contains(':'),
    };
    Some(if has_port {
        auth.to_owned()
    } else {
        format!("{auth}:80")
    })
}

/// The local address of the route to `server`: what the server (and nodes
/// on its network) can reach this node on. Connecting a UDP socket sends
/// nothing; it only asks the kernel for the route. Falls back to 127.0.0.1.
pub fn route_addr(server: &str) -> IpAddr {
    let fallback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let Some(target) = url_authority(server)
        .and_then(|a| a.to_socket_addrs().ok())
        .and_then(|mut it| it.next())
    else {
        return fallback;
    };
    let bind: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    UdpSocket::bind(bind)
        .and_then(|s| {
            s.connect(target)?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let got: Vec<u128> = (0..5).map(|_| b.fail().as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 700, 700]);
        b.reset();
        assert_eq!(b.fail(), Duration::from_millis(100));
    }

    #[test]
    fn outbox_keeps_what_arrived_after_the_send() {
        let exit = |rank| WorkerExit {
            job_id: "j".into(),
            attempt: 0,
            rank,
            code: Some(0),
            signal: None,
        };
        let mut o = Outbox::default();
        o.exits.push(exit(0));
        let store = StoreOpened {
            job_id: "j".into(),
            attempt: 0,
            addr: "1.2.3.4:5".into(),
        };
        o.push_store(store.clone());
        o.push_store(store.clone());
        assert_eq!(o.stores.len(), 1);
        let sent = o.heartbeat();
        o.exits.push(exit(1));
        o.delivered(&sent);
        assert!(o.stores.is_empty());
        assert_eq!(o.exits, [exit(1)]);
        assert!(!o.is_empty());
    }

    #[test]
    fn authority_of_urls() {
        assert_eq!(url_authority("http://h:7070").as_deref(), Some("h:7070"));
        assert_eq!(url_authority("http://h/x").as_deref(), Some("h:80"));
        assert_eq!(url_authority("http://[::1]:9/").as_deref(), Some("[::1]:9"));
        assert_eq!(url_authority("http://[::1]").as_deref(), Some("[::1]:80"));
        assert_eq!(url_authority("https://h"), None);
        assert_eq!(url_authority("http://"), None);
    }

    #[test]
    fn route_to_loopback_is_loopback() {
        assert_eq!(
            route_addr("http://127.0.0.1:1"),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(route_addr("http://"), IpAddr::V4(Ipv4Addr::LOCALHOST));
    }

    #[test]
    fn unknown_node_is_a_404() {
        let e = |status| HttpError::Status {
            url: "u".into(),
            status,
            message: "m".into(),
        };
        assert!(is_unknown_node(&e(404)));
        assert!(!is_unknown_node(&e(401)));
        assert!(!is_unknown_node(&HttpError::Transport {
            url: "u".into(),
            detail: "refused".into()
        }));
    }
}
