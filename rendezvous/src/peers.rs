//! What each rank publishes about itself at rendezvous, and host identity.
//!
//! Ranks exchange one small record each through the store: where they listen
//! for TCP, which host they are on, and their pid. Two ranks with the same
//! host id may use shared memory; the pid lets a rank notice that a
//! same-host peer died without any socket telling it.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// One rank's published bring-up information.
///
/// The field names are the record's JSON keys on the wire: renaming one breaks
/// bring-up between ranks built before and after the change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    pub rank: u32,
    /// Equal for ranks that can share memory.
    pub host_id: String,
    /// Human-readable host name, for error messages.
    #[serde(default)]
    pub hostname: String,
    pub pid: u32,
    /// Addresses the rank accepts data-plane TCP connections on.
    #[serde(default)]
    pub tcp: Vec<SocketAddr>,
    /// How much the rank buffers of a TCP peer's frames that come before
    /// their receive: `frames` buffers of `frame_bytes` each, which is how
    /// many credits, and how large an eager frame, a sender to it gets.
    #[serde(default)]
    pub tcp_eager: Eager,
    /// The rank's libfabric endpoint name (hex), under `GW_TRANSPORT=ofi`.
    #[serde(default)]
    pub ofi: String,
    /// Processors the rank's host lets it run on (0: unknown). Ranks that
    /// outnumber their host's processors share them, and the cost model
    /// must know it to predict (and choose) the same on every rank.
    #[serde(default)]
    pub cores: u32,
    /// The processors themselves (the rank's affinity mask, ascending;
    /// empty: unknown). Ranks that a launcher binds to cores of their own
    /// each see only a few, so only the union over a host's ranks says how
    /// many processors the host gives the job.
    #[serde(default)]
    pub cpus: Vec<u32>,
    /// The rank's `GW_FANOUT` (none: a build from before it, which never
    /// fans out). Large all-gathers and broadcasts fan out only where every
    /// rank says so: ranks running different schedules would wait for
    /// messages that never come, or pair up the wrong ones.
    #[serde(default)]
    pub fan_out: Option<bool>,
}

/// A receiver's eager buffers (see [`PeerInfo::tcp_eager`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eager {
    pub frames: u32,
    pub frame_bytes: u32,
    /// Small buffers, for messages of at most `small_bytes`: a sender
    /// gets this many small credits, and sends every message that fits one
    /// on them (none: every message takes frame credits).
    #[serde(default)]
    pub small_frames: u32,
    #[serde(default)]
    pub small_bytes: u32,
}

impl Default for Eager {
    /// None: a peer that published no buffers receives announced messages
    /// only.
    fn default() -> Eager {
        Eager {
            frames: 0,
            frame_bytes: 0,
            small_frames: 0,
            small_bytes: 0,
        }
    }
}

/// Longest part of a bad record (or of its parse error) quoted in an error:
/// records come from the store, whose values may be megabytes long.
const QUOTE_BYTES: usize = 256;

impl PeerInfo {
    /// Encodes as one JSON object.
    pub fn encode(&self) -> String {
        serde_json::to_string(self)
            .expect("a PeerInfo always serializes: no maps, no fallible impls")
    }

    /// Decodes what [`PeerInfo::encode`] wrote; anything else is a protocol
    /// error naming the record. Fields this version does not know are
    /// ignored, so that peers built later may add some.
    pub fn decode(s: &str) -> Result<PeerInfo> {
        serde_json::from_str(s).map_err(|e| {
            // serde_json's message quotes the offending value, which can be
            // as long as the record; its end says where and what was expected.
            let rec = match clip(s) {
                Some((h, t)) => format!("{h:?} ... {t:?} ({} bytes)", s.len()),
                None => format!("{s:?}"),
            };
            let why = e.to_string();
            let why = match clip(&why) {
                Some((h, t)) => format!("{h} ... {t}"),
                None => why,
            };
            Error::Protocol(format!("malformed peer record {rec}: {why}"))
        })
    }
}

/// The start and the end of `s` if it is longer than [`QUOTE_BYTES`].
fn clip(s: &str) -> Option<(&str, &str)> {
    if s.len() <= QUOTE_BYTES {
        return None;
    }
    let mut head = QUOTE_BYTES * 3 / 4;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - QUOTE_BYTES / 4;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    Some((&s[..head], &s[tail..]))
}

/// The processors this process may run on (its affinity mask), ascending;
/// empty if the kernel will not say.
pub fn own_cpus() -> Vec<u32> {
    // SAFETY: cpu_set_t is plain bits, valid zeroed; sched_getaffinity
    // writes at most size_of::<cpu_set_t>() bytes into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, the set's capacity.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .map(|i| i as u32)
        .collect()
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
        return v;
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

    fn sample() -> PeerInfo {
        PeerInfo {
            rank: 3,
            host_id: "abc-123".into(),
            hostname: "node1".into(),
            pid: 42,
            tcp: vec![
                "127.0.0.1:5000".parse().unwrap(),
                "[::1]:6000".parse().unwrap(),
            ],
            tcp_eager: Eager {
                frames: 4,
                frame_bytes: 1 << 20,
                small_frames: 32,
                small_bytes: 4096,
            },
            ofi: "0a0b".into(),
            cores: 8,
            cpus: vec![0, 1, 4],
            fan_out: None,
        }
    }

    #[test]
    fn own_cpus_are_at_least_the_processors_rust_counts() {
        let cpus = own_cpus();
        let n = std::thread::available_parallelism().map_or(0, |n| n.get());
        // A CPU quota (cgroup) can make Rust count fewer than the mask.
        assert!(n >= 1 && cpus.len() >= n, "{cpus:?} against {n}");
        assert!(cpus.windows(2).all(|w| w[0] < w[1]), "{cpus:?}");
    }

    #[test]
    fn roundtrip() {
        let p = sample();
        assert_eq!(PeerInfo::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn host_id_with_any_characters_roundtrips() {
        // GW_HOST_ID is copied verbatim, and the old `k=v;` format had to
        // mangle these (making "a;b" and "a_b" the same host).
        for id in [
            "a;b=c,d",
            "rack=3;slot=7",
            "quote\"back\\slash",
            "{\"json\":[1]}",
            "tab\tnew\nline\r\u{0}\u{1f}",
            "h\u{e9}te-\u{4e2d}-\u{1f600}",
            " ",
        ] {
            let p = PeerInfo {
                host_id: id.into(),
                hostname: id.into(),
                ..sample()
            };
            let enc = p.encode();
            assert!(!enc.contains('\n'), "one line: {enc}");
            assert_eq!(PeerInfo::decode(&enc).unwrap(), p, "{enc}");
        }
    }

    #[test]
    fn missing_fields_are_errors() {
        let e = PeerInfo::decode(r#"{"rank":1,"host_id":"x"}"#).unwrap_err();
        assert!(matches!(e, Error::Protocol(_)), "{e}");
        assert!(e.to_string().contains("missing field `pid`"), "{e}");
        assert!(e.to_string().contains("host_id"), "names the record: {e}");
    }

    #[test]
    fn optional_fields_default() {
        let p = PeerInfo::decode(r#"{"rank":1,"host_id":"x","pid":7}"#).unwrap();
        assert_eq!(p.hostname, "");
        assert!(p.tcp.is_empty());
        // A record from a build without small eager buffers gives none.
        let p = PeerInfo::decode(
            r#"{"rank":1,"host_id":"x","pid":7,"tcp_eager":{"frames":4,"frame_bytes":64}}"#,
        )
        .unwrap();
        assert_eq!((p.tcp_eager.frames, p.tcp_eager.small_frames), (4, 0));
    }

    #[test]
    fn unknown_fields_from_newer_peers_are_ignored() {
        let p = sample();
        let mut enc = p.encode();
        enc.pop();
        enc.push_str(r#","rdma":{"gid":"fe80::1","port":1},"shm":true}"#);
        assert_eq!(PeerInfo::decode(&enc).unwrap(), p);
    }

    #[test]
    fn malformed_values_are_errors_that_name_the_field() {
        for (rec, what) in [
            (r#"{"rank":"one","host_id":"x","pid":7}"#, "invalid type"),
            (r#"{"rank":-1,"host_id":"x","pid":7}"#, "invalid value"),
            (
                r#"{"rank":1,"host_id":"x","pid":7,"tcp":["nowhere"]}"#,
                "address",
            ),
            ("rank=1;host=x;pid=7", "expected value"),
            ("", "EOF"),
        ] {
            let e = PeerInfo::decode(rec).unwrap_err();
            assert!(matches!(e, Error::Protocol(_)), "{e}");
            let msg = e.to_string();
            assert!(msg.contains(what), "{rec}: {msg}");
            assert!(msg.contains(&format!("{rec:?}")), "{rec}: {msg}");
        }
    }

    #[test]
    fn a_huge_bad_record_is_quoted_in_part() {
        let rec = format!("{{\"rank\":\"{}\u{e9}\"}}", "x".repeat(1 << 20));
        let msg = PeerInfo::decode(&rec).unwrap_err().to_string();
        assert!(msg.len() < 1024, "{} bytes", msg.len());
        assert!(msg.contains(&format!("({} bytes)", rec.len())), "{msg}");
        assert!(msg.contains("expected u32"), "keeps the reason: {msg}");
    }

    fn peer() -> impl Strategy<Value = PeerInfo> {
        let addr =
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port)));
        let addr6 =
            (any::<[u16; 8]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port)));
        (
            any::<u32>(),
            any::<String>(),
            any::<String>(),
            any::<u32>(),
            prop::collection::vec(prop_oneof![addr, addr6], 0..4),
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
        )
            .prop_map(
                |(
                    rank,
                    host_id,
                    hostname,
                    pid,
                    tcp,
                    (frames, frame_bytes, small_frames, small_bytes),
                )| PeerInfo {
                    rank,
                    host_id,
                    hostname,
                    pid,
                    tcp,
                    tcp_eager: Eager {
                        frames,
                        frame_bytes,
                        small_frames,
                        small_bytes,
                    },
                    ofi: String::new(),
                    cores: 0,
                    cpus: Vec::new(),
                    fan_out: None,
                },
            )
    }

    proptest! {
        #[test]
        fn decode_never_panics(s in ".{0,200}") {
            let _ = PeerInfo::decode(&s);
        }

        #[test]
        fn any_record_roundtrips(p in peer()) {
            prop_assert_eq!(PeerInfo::decode(&p.encode())?, p);
        }
    }
}
