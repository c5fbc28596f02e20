//! What each rank publishes about itself at rendezvous, and host identity.
//!
//! Ranks exchange one small record each through the store: where they listen
//! for TCP, which host they are on, and their pid. Two ranks with the same
//! host id may use shared memory; the pid lets a rank notice that a
//! same-host peer died without any socket telling it.

use crate::error::{Error, Result};
use std::net::SocketAddr;

/// One rank's published bring-up information.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub rank: u32,
    /// Equal for ranks that can share memory.
    pub host_id: String,
    /// Human-readable host name, for error messages.
    pub hostname: String,
    pub pid: u32,
    /// Addresses the rank accepts data-plane TCP connections on.
    pub tcp: Vec<SocketAddr>,
}

impl PeerInfo {
    /// Encodes as one line of `key=value` pairs.
    pub fn encode(&self) -> String {
        let tcp: Vec<String> = self.tcp.iter().map(|a| a.to_string()).collect();
        format!(
            "rank={};host={};name={};pid={};tcp={}",
            self.rank,
            self.host_id,
            self.hostname,
            self.pid,
            tcp.join(",")
        )
    }

    /// Decodes what [`PeerInfo::encode`] wrote; anything else is a protocol error.
    pub fn decode(s: &str) -> Result<PeerInfo> {
        let bad = |why: &str| Error::Protocol(format!("malformed peer record {s:?}: {why}"));
        let (mut rank, mut host, mut name, mut pid, mut tcp) = (None, None, None, None, None);
        for part in s.split(';') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("field without '='"))?;
            match k {
                "rank" => rank = Some(v.parse::<u32>().map_err(|_| bad("rank is not a number"))?),
                "host" => host = Some(v.to_string()),
                "name" => name = Some(v.to_string()),
                "pid" => pid = Some(v.parse::<u32>().map_err(|_| bad("pid is not a number"))?),
                "tcp" => {
                    let mut addrs = Vec::new();
                    for a in v.split(',').filter(|a| !a.is_empty()) {
                        addrs.push(a.parse().map_err(|_| bad("bad tcp address"))?);
                    }
                    tcp = Some(addrs)
                }
                _ => {} // newer peers may add fields
            }
        }
        Ok(PeerInfo {
            rank: rank.ok_or_else(|| bad("no rank"))?,
            host_id: host.ok_or_else(|| bad("no host"))?,
            hostname: name.unwrap_or_default(),
            pid: pid.ok_or_else(|| bad("no pid"))?,
            tcp: tcp.unwrap_or_default(),
        })
    }
}

/// This machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// An id shared by exactly the processes that can map the same shared memory
/// and reach each other over loopback: the boot id plus the network namespace.
/// `GW_HOST_ID` overrides it (tests use that to pretend ranks are on different hosts).
pub fn host_id() -> String {
    if let Ok(v) = std::env::var("GW_HOST_ID")
        && !v.is_empty()
    {
        return v.replace([';', '='], "_");
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| hostname());
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let netns: String = netns.chars().filter(|c| c.is_ascii_digit()).collect();
    format!("{boot}-{netns}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let p = PeerInfo {
            rank: 3,
            host_id: "abc-123".into(),
            hostname: "node1".into(),
            pid: 42,
            tcp: vec![
                "127.0.0.1:5000".parse().unwrap(),
                "[::1]:6000".parse().unwrap(),
            ],
        };
        assert_eq!(PeerInfo::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn missing_fields_are_errors() {
        let e = PeerInfo::decode("rank=1;host=x").unwrap_err();
        assert!(e.to_string().contains("no pid"), "{e}");
    }

    proptest! {
        #[test]
        fn decode_never_panics(s in ".{0,200}") {
            let _ = PeerInfo::decode(&s);
        }
    }
}
