//! A fast sender streaming to a slow receiver, which posts its receives
//! late, for `GW_SLOW_RECEIVER_SECS` seconds (30 by default), over real TCP
//! sockets and real shared memory: the receiver never holds more early
//! frames than its buffers (the sender's credits bound it, and past them
//! messages are announced), and every message arrives exactly.

use gw_rendezvous::PeerInfo;
use gw_transport::seam::Readiness;
use gw_transport::shm::{ShmConfig, ShmTransport};
use gw_transport::tcp::{TcpConfig, TcpTransport};
use gw_transport::{Outstanding, Scope, Signature, Tag, Transport};
use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

fn secs() -> Duration {
    let s = std::env::var("GW_SLOW_RECEIVER_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(30.0);
    Duration::from_secs_f64(s)
}

fn show(t: &Tag, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "stream(message {})", t.step)
}

/// Message `k` of the stream (conversation 1), or the closing count
/// (conversation 2).
fn tag(comm: u64, k: u32) -> Tag {
    Tag {
        comm,
        seq: 1,
        step: k,
        sig: Signature::default(),
        scope: Scope::Message,
        show,
    }
}

/// Message `k`'s length: 0 to 3 frames of `frame` bytes, fixed by `k`.
fn size(k: u32, frame: usize) -> usize {
    let x = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    (x as usize) % (3 * frame + 1)
}

fn byte(k: u32, i: usize) -> u8 {
    (k as usize * 131 + i * 7) as u8
}

/// Runs the stream from `a` (rank 0) to `b` (rank 1); returns how many
/// messages went and the most frames `b` ever held early.
fn stream<T: Transport + 'static>(
    mut a: T,
    mut b: T,
    frame: usize,
    buffered: fn(&T) -> (usize, usize),
) -> (u32, usize) {
    let run_for = secs();
    let sender = std::thread::spawn(move || {
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        let mut inflight: Vec<(Outstanding, usize)> = Vec::new();
        let start = Instant::now();
        let mut k = 0u32;
        while start.elapsed() < run_for {
            a.progress().expect("sender progress");
            inflight.retain_mut(|(s, _)| !s.poll(&mut a).expect("send"));
            while inflight.len() < 32 {
                let n = size(k, frame);
                let mut m: Vec<u8> = (0..n).map(|i| byte(k, i)).collect();
                m.reserve(1);
                // SAFETY: the vector is kept alive in `bufs` until the
                // transport is dropped, and not touched meanwhile.
                let mem = unsafe { a.register(m.as_mut_ptr(), n) }.expect("register");
                let s = a.isend(1, tag(1, k), mem, 0, n).expect("isend");
                bufs.push(m);
                inflight.push((Outstanding::new(s), bufs.len() - 1));
                k += 1;
            }
        }
        // The closing count, then everything left is sent.
        let mut count = k.to_le_bytes().to_vec();
        // SAFETY: as above.
        let mem = unsafe { a.register(count.as_mut_ptr(), 4) }.expect("register");
        let mut last = Outstanding::new(a.isend(1, tag(2, 0), mem, 0, 4).expect("isend"));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(inflight.is_empty() && last.is_done()) {
            assert!(
                Instant::now() < deadline,
                "the sender's last messages never went"
            );
            a.progress().expect("sender progress");
            inflight.retain_mut(|(s, _)| !s.poll(&mut a).expect("send"));
            last.poll(&mut a).expect("send");
        }
        // Keep the connection until the receiver is done with it.
        (a, bufs, count, k)
    });

    let mut got: Vec<u8> = vec![0u8; 3 * frame + 1];
    let mut count_buf = [0u8; 4];
    // SAFETY: both buffers outlive every receive posted into them (the
    // transport is dropped at the end of this function).
    let (mg, mc) = unsafe {
        (
            b.register(got.as_mut_ptr(), got.len()).expect("register"),
            b.register(count_buf.as_mut_ptr(), 4).expect("register"),
        )
    };
    let mut count_req: Option<Outstanding> = Some(Outstanding::new(
        b.irecv(0, tag(2, 0), mc, 0, 4).expect("irecv"),
    ));
    let mut total: Option<u32> = None;
    let mut k = 0u32;
    let mut most = 0usize;
    let mut nap = 0u32;
    let deadline = Instant::now() + run_for + Duration::from_secs(120);
    loop {
        if total.is_some_and(|t| k >= t) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the receiver is stuck at message {k}"
        );
        // Late: every few messages the receiver dawdles before posting.
        nap = nap.wrapping_add(1);
        if nap.is_multiple_of(7) {
            std::thread::sleep(Duration::from_millis(u64::from(nap % 5)));
        }
        let n = size(k, frame);
        let mut r = Outstanding::new(b.irecv(0, tag(1, k), mg, 0, n).expect("irecv"));
        loop {
            assert!(Instant::now() < deadline, "message {k} never came");
            b.progress().expect("receiver progress");
            let (now, cap) = buffered(&b);
            assert!(now <= cap, "{now} early frames held in {cap} buffers");
            most = most.max(now);
            if let Some(c) = count_req.as_mut()
                && c.poll(&mut b).expect("count")
            {
                total = Some(u32::from_le_bytes(count_buf));
                count_req = None;
            }
            if r.poll(&mut b).expect("recv") {
                break;
            }
        }
        for (i, &x) in got[..n].iter().enumerate() {
            assert_eq!(x, byte(k, i), "message {k} byte {i}");
        }
        k += 1;
        if total.is_none()
            && let Some(c) = count_req.as_mut()
            && c.poll(&mut b).expect("count")
        {
            total = Some(u32::from_le_bytes(count_buf));
            count_req = None;
        }
    }
    let (a, _bufs, _count, sent) = sender.join().expect("sender thread");
    assert_eq!(total, Some(sent));
    drop(a);
    (sent, most)
}

fn tcp_pair() -> (TcpTransport, TcpTransport) {
    let cfg = TcpConfig {
        store_ip: Some(Ipv4Addr::LOCALHOST.into()),
        segment_bytes: 4096,
        eager_frames: 4,
        ..TcpConfig::default()
    };
    let mut t: Vec<TcpTransport> = (0..2)
        .map(|r| TcpTransport::new(r, cfg.clone()).expect("tcp transport"))
        .collect();
    let peers: Vec<PeerInfo> = (0..2)
        .map(|r| PeerInfo {
            rank: r,
            host_id: format!("h{r}"),
            hostname: format!("h{r}"),
            pid: std::process::id(),
            tcp: vec![t[r as usize].listen_addr()],
            tcp_eager: t[r as usize].eager(),
            ofi: String::new(),
            cores: 0,
            cpus: Vec::new(),
            fan_out: None,
        })
        .collect();
    for x in &mut t {
        x.set_peers(peers.clone());
    }
    let mut b = t.pop().expect("rank 1");
    let mut a = t.pop().expect("rank 0");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(a.connect(1).expect("connect") == Readiness::Ready
        && b.connect(0).expect("connect") == Readiness::Ready)
    {
        assert!(Instant::now() < deadline, "no connection");
    }
    (a, b)
}

#[test]
fn a_slow_receiver_holds_no_more_than_its_buffers_over_tcp() {
    let (a, b) = tcp_pair();
    let (sent, most) = stream(a, b, 4096, TcpTransport::early_buffered);
    println!("tcp: {sent} messages, at most {most} early frames held");
    assert!(sent > 100, "only {sent} messages in the time");
}

#[test]
fn a_slow_receiver_holds_no_more_than_its_buffers_over_shared_memory() {
    let job = format!("slowrecv{}", std::process::id());
    let cfg = ShmConfig {
        slots: 4,
        slot_bytes: 4096,
        pull_bytes: 0,
        eager_frames: 2,
        ..ShmConfig::new(
            job,
            gw_rendezvous::token::random_hex(16).expect("/dev/urandom"),
        )
    };
    let peers: Vec<PeerInfo> = (0..2)
        .map(|r| PeerInfo {
            rank: r,
            host_id: "one-host".into(),
            hostname: "one-host".into(),
            pid: std::process::id(),
            tcp: vec![],
            tcp_eager: Default::default(),
            ofi: String::new(),
            cores: 0,
            cpus: Vec::new(),
            fan_out: None,
        })
        .collect();
    let mut a = ShmTransport::new(0, peers.clone(), cfg.clone()).expect("shm 0");
    let mut b = ShmTransport::new(1, peers, cfg).expect("shm 1");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(a.connect(1).expect("connect") == Readiness::Ready
        && b.connect(0).expect("connect") == Readiness::Ready)
    {
        assert!(Instant::now() < deadline, "no connection");
    }
    let (sent, most) = stream(a, b, 4096, ShmTransport::early_buffered);
    println!("shm: {sent} messages, at most {most} early frames held");
    assert!(sent > 100, "only {sent} messages in the time");
}
