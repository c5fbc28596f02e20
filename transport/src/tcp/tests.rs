//! Two `TcpTransport`s in one process (ranks 0 and 1), over real loopback
//! sockets: how a frame whose receive is not posted yet is handled.

use super::*;
use crate::seam::Outstanding;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

pub(super) const LIMIT: Duration = Duration::from_secs(20);

pub(super) fn tag(step: u32) -> Tag {
    crate::test_tags::tag(7, 3, 0, 0, step)
}

/// Ranks 0 and 1 with `lanes` sockets between them, connected.
pub(super) fn pair(lanes: usize) -> (TcpTransport, TcpTransport) {
    pair_with(TcpConfig {
        lanes,
        ..TcpConfig::default()
    })
}

pub(super) fn pair_with(cfg: TcpConfig) -> (TcpTransport, TcpTransport) {
    pair_polled(cfg, None)
}

/// As [`pair_with`]; with `poll`, rank 1 learns of input only from it, as the
/// engine thread does.
fn pair_polled(cfg: TcpConfig, poll: Option<&mio::Poll>) -> (TcpTransport, TcpTransport) {
    let cfg = TcpConfig {
        store_ip: Some(Ipv4Addr::LOCALHOST.into()),
        ..cfg
    };
    let mut t: Vec<TcpTransport> = (0..2)
        .map(|r| TcpTransport::new(r, cfg.clone()).unwrap())
        .collect();
    if let Some(p) = poll {
        t[1].attach(p.registry(), 0).unwrap();
    }
    let infos: Vec<PeerInfo> = (0..2)
        .map(|r| PeerInfo {
            rank: r,
            host_id: format!("host{r}"),
            hostname: format!("host{r}"),
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
        x.set_peers(infos.clone());
    }
    let mut b = t.pop().unwrap();
    let mut a = t.pop().unwrap();
    let start = Instant::now();
    loop {
        let ra = a.connect(1).unwrap();
        let rb = b.connect(0).unwrap();
        if ra == Readiness::Ready && rb == Readiness::Ready {
            return (a, b);
        }
        a.progress().unwrap();
        b.progress().unwrap();
        assert!(start.elapsed() < LIMIT, "the pair did not connect");
    }
}

pub(super) use crate::test_drive::{Messages, reg};

pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Progresses both until `done` holds, or fails naming `what`.
pub(super) fn until(
    a: &mut TcpTransport,
    b: &mut TcpTransport,
    what: &str,
    mut done: impl FnMut(&mut TcpTransport, &mut TcpTransport) -> bool,
) {
    let start = Instant::now();
    while !done(a, b) {
        a.progress().unwrap();
        b.progress().unwrap();
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
    }
}

/// Rank 1 reads the header of a frame it has no receive for, then posts the
/// receive before its next progress call (as the engine does between two):
/// the payload goes straight into the receive, with no buffer on the way.
#[test]
fn a_frame_waits_one_progress_call_for_its_receive() {
    let (mut a, mut b) = pair(1);
    let len = 200 * 1024;
    let src = pattern(len, 1);
    let mut dst = vec![0u8; len];
    // SAFETY: both vectors outlive the transports' use of them (every
    // request completes below, and the transports are dropped first).
    let (ms, md) = unsafe {
        (
            a.register(src.as_ptr().cast_mut(), len).unwrap(),
            b.register(dst.as_mut_ptr(), len).unwrap(),
        )
    };
    let mut s = Outstanding::new(a.isend(1, tag(5), ms, 0, len).unwrap());
    // Until rank 1 has taken in the header (it moves exactly then: nothing
    // else is posted or pending on its side). Every progress call of rank 1
    // is looked at: one more would let the frame go on to a buffer.
    let start = Instant::now();
    loop {
        a.progress().unwrap();
        if b.progress().unwrap() {
            break;
        }
        assert!(start.elapsed() < LIMIT, "rank 1 never read the header");
    }
    let parked = b.conns[&0].lanes[0]
        .as_ref()
        .is_some_and(|l| matches!(l.rx, Rx::Parked { .. }));
    assert!(parked, "rank 1 did not hold the frame back");
    let mut r = Outstanding::new(b.irecv(0, tag(5), md, 0, len).unwrap());
    let mut sent = false;
    until(&mut a, &mut b, "the transfer", |a, b| {
        sent = sent || s.poll(a).unwrap();
        sent && r.poll(b).unwrap()
    });
    assert_eq!(dst, src);
    assert_eq!(b.early_frames(), 0, "the frame went through a buffer");
    drop((a, b));
}

/// A frame whose receive is still not posted at the next progress call is
/// buffered, so that frames behind it on the same socket keep moving, and a
/// receive posted later gets it from the buffer.
#[test]
fn a_parked_frame_never_holds_up_the_frames_behind_it() {
    let (mut a, mut b) = pair(1);
    let len = 300 * 1024;
    let (x, y) = (pattern(len, 2), pattern(len, 3));
    let (mut dx, mut dy) = (vec![0u8; len], vec![0u8; len]);
    // SAFETY: as in the test above.
    let (mx, my, mdx, mdy) = unsafe {
        (
            a.register(x.as_ptr().cast_mut(), len).unwrap(),
            a.register(y.as_ptr().cast_mut(), len).unwrap(),
            b.register(dx.as_mut_ptr(), len).unwrap(),
            b.register(dy.as_mut_ptr(), len).unwrap(),
        )
    };
    // One lane: y queues behind x on the same socket.
    let mut sx = Outstanding::new(a.isend(1, tag(1), mx, 0, len).unwrap());
    let mut sy = Outstanding::new(a.isend(1, tag(2), my, 0, len).unwrap());
    let mut ry = Outstanding::new(b.irecv(0, tag(2), mdy, 0, len).unwrap());
    until(&mut a, &mut b, "y behind the unposted x", |_, b| {
        ry.poll(b).unwrap()
    });
    assert_eq!(dy, y);
    assert_eq!(b.early_frames(), 1, "x is buffered, y is not");
    let mut rx = Outstanding::new(b.irecv(0, tag(1), mdx, 0, len).unwrap());
    let mut sent = [false; 2];
    until(&mut a, &mut b, "x from the buffer", |a, b| {
        sent[0] = sent[0] || sx.poll(a).unwrap();
        sent[1] = sent[1] || sy.poll(a).unwrap();
        sent == [true; 2] && rx.poll(b).unwrap()
    });
    assert_eq!(dx, x);
    drop((a, b));
}

/// Polls rank 1's events for up to `wait` and hands them to it.
fn dispatch(b: &mut TcpTransport, poll: &mut mio::Poll, wait: Duration) {
    let mut events = mio::Events::with_capacity(16);
    poll.poll(&mut events, Some(wait)).unwrap();
    for e in events.iter() {
        b.on_event(e).unwrap();
    }
}

/// Rank 1 reads two small frames in one read (the second into the lane's
/// stage, which found the socket empty then) and holds the second back for
/// its receive. A third frame arrives meanwhile and its readiness event is
/// handed over. Finishing the staged frame must not clear that: the third
/// frame is read without any further event. (It was not, and a tree
/// all-reduce over TCP hung waiting for a frame that sat in the socket.)
#[test]
fn a_readiness_event_is_not_lost_while_the_stage_drains() {
    let mut poll = mio::Poll::new().unwrap();
    let (mut a, mut b) = pair_polled(
        TcpConfig {
            lanes: 1,
            ..TcpConfig::default()
        },
        Some(&poll),
    );
    let len = 100;
    let src: Vec<Vec<u8>> = (1..=3).map(|k| pattern(len, k)).collect();
    let mut dst = vec![vec![0u8; len]; 3];
    // SAFETY: the vectors outlive the transports' use of them (every request
    // completes or the test fails, and the transports are dropped first).
    let (ms, md): (Vec<_>, Vec<_>) = unsafe {
        (
            src.iter()
                .map(|v| a.register(v.as_ptr().cast_mut(), len).unwrap())
                .collect(),
            dst.iter_mut()
                .map(|v| b.register(v.as_mut_ptr(), len).unwrap())
                .collect(),
        )
    };
    let send = |a: &mut TcpTransport, k: usize| {
        let mut s = Outstanding::new(a.isend(1, tag(k as u32), ms[k], 0, len).unwrap());
        let start = Instant::now();
        while !s.poll(a).unwrap() {
            a.progress().unwrap();
            assert!(start.elapsed() < LIMIT, "frame {k} was not sent");
        }
    };
    send(&mut a, 0);
    send(&mut a, 1);
    let mut r0 = Outstanding::new(b.irecv(0, tag(0), md[0], 0, len).unwrap());
    let start = Instant::now();
    while !r0.poll(&mut b).unwrap() {
        dispatch(&mut b, &mut poll, Duration::from_millis(50));
        b.progress().unwrap();
        assert!(start.elapsed() < LIMIT, "frame 0 never arrived");
    }
    let lane = b.conns[&0].lanes[0].as_ref().unwrap();
    assert!(
        matches!(lane.rx, Rx::Parked { .. }) && lane.stage.pending() && lane.stage.drained,
        "frame 1 was not held back in the stage"
    );
    send(&mut a, 2);
    dispatch(&mut b, &mut poll, LIMIT);
    let mut r1 = Outstanding::new(b.irecv(0, tag(1), md[1], 0, len).unwrap());
    let mut r2 = Outstanding::new(b.irecv(0, tag(2), md[2], 0, len).unwrap());
    let start = Instant::now();
    let mut done = [false; 2];
    loop {
        for (d, r) in done.iter_mut().zip([&mut r1, &mut r2]) {
            *d = *d || r.poll(&mut b).unwrap();
        }
        if done == [true; 2] {
            break;
        }
        b.progress().unwrap();
        dispatch(&mut b, &mut poll, Duration::from_millis(10));
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "frame 2 sits in the socket, its event lost"
        );
    }
    assert_eq!(dst, src);
    drop((a, b));
}

fn sysctl(name: &str) -> usize {
    let path = format!("/proc/sys/net/core/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

/// Every lane, dialed or accepted, gets the configured buffers (which the
/// kernel doubles, up to its maximum), each its own size.
#[test]
fn every_lane_gets_the_configured_socket_buffers() {
    let (want_snd, want_rcv) = (192 * 1024, 320 * 1024);
    let (a, b) = pair_with(TcpConfig {
        lanes: 3,
        send_buffer_bytes: want_snd,
        recv_buffer_bytes: want_rcv,
        ..TcpConfig::default()
    });
    let (snd, rcv) = (
        2 * want_snd.min(sysctl("wmem_max")),
        2 * want_rcv.min(sysctl("rmem_max")),
    );
    for (t, peer) in [(&a, 1), (&b, 0)] {
        for lane in t.conns[&peer].lanes.iter() {
            let s = socket2::SockRef::from(&lane.as_ref().unwrap().sock);
            assert_eq!(s.send_buffer_size().unwrap(), snd, "rank {}", t.me);
            assert_eq!(s.recv_buffer_size().unwrap(), rcv, "rank {}", t.me);
        }
    }
}

/// One-sided writes over TCP (`FrameKind::Put`): bytes land at the offset
/// of the published region, over several lanes and in any order among
/// themselves, each immediate delivered (naming the writer) once its bytes
/// are in; bad targets are refused by the writer, and a stale descriptor
/// (the slot registered anew since) by the receiver.
#[test]
fn one_sided_writes_land_with_their_immediates() {
    let (mut a, mut b) = pair(3);
    assert!(a.properties().one_sided_write && !a.properties().offloaded_writes);
    let len = 3 << 20;
    let src = pattern(len, 9);
    let mut dst = vec![0u8; len + 100];
    // SAFETY: both vectors outlive the transports' use of them.
    let (ms, md) = unsafe {
        (
            a.register(src.as_ptr().cast_mut(), len).unwrap(),
            b.register(dst.as_mut_ptr(), len + 100).unwrap(),
        )
    };
    let region = b.remote_region(md).unwrap().unwrap();
    assert_eq!((region.rank, region.len), (1, (len + 100) as u64));
    let seg = 256 << 10;
    let mut reqs = Vec::new();
    let mut want = Vec::new();
    for (k, off) in (0..len).step_by(seg).enumerate() {
        let w = WriteImm {
            mem: ms,
            offset: off,
            len: seg.min(len - off),
            remote: region,
            remote_offset: (50 + off) as u64,
            imm: 0x8000_0000 | k as u32,
        };
        reqs.push(Outstanding::new(a.write_imm(1, &w).unwrap()));
        want.push(w.imm);
    }
    let mut got = Vec::new();
    until(&mut a, &mut b, "the writes", |a, b| {
        reqs.retain_mut(|r| !r.poll(&mut *a).unwrap());
        while let Some(v) = b.next_imm().unwrap() {
            assert_eq!(v.from, Some(0));
            got.push(v.imm);
        }
        reqs.is_empty() && got.len() == want.len()
    });
    got.sort_unstable();
    assert_eq!(got, want);
    assert!(dst[..50].iter().all(|&x| x == 0));
    assert!(dst[50..50 + len] == src[..]);
    assert!(dst[50 + len..].iter().all(|&x| x == 0));
    let w = WriteImm {
        mem: ms,
        offset: 0,
        len: 200,
        remote: region,
        remote_offset: len as u64 - 50,
        imm: 1,
    };
    let e = a.write_imm(1, &w).unwrap_err().to_string();
    assert!(e.contains("outside its published region"), "{e}");
    let e = a
        .write_imm(
            1,
            &WriteImm {
                remote: RemoteRegion { rank: 0, ..region },
                ..w
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 0 published"), "{e}");
    // The slot goes and comes back: the old descriptor is stale.
    b.deregister(md).unwrap();
    // SAFETY: as above.
    let md2 = unsafe { b.register(dst.as_mut_ptr(), len + 100) }.unwrap();
    assert_ne!(b.remote_region(md2).unwrap().unwrap().key, region.key);
    let mut r = Outstanding::new(
        a.write_imm(
            1,
            &WriteImm {
                remote_offset: 0,
                ..w
            },
        )
        .unwrap(),
    );
    let start = Instant::now();
    let e = loop {
        let _ = r.poll(&mut a);
        a.progress().unwrap();
        if let Err(e) = b.progress() {
            break e.to_string();
        }
        assert!(start.elapsed() < LIMIT, "the stale write was not refused");
    };
    assert!(
        e.contains("stale descriptor") && e.contains("rank 0"),
        "{e}"
    );
}

mod put_frames {
    use super::*;
    use proptest::prelude::*;

    /// Offsets and lengths around the regions' sizes, and far past them.
    fn extent() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..12_000, any::<u64>()]
    }

    proptest! {
        /// Whatever a peer's `Put` header says, the receiver either refuses
        /// it or writes inside the one registration its key names, at the
        /// current generation.
        #[test]
        fn a_put_header_never_reaches_outside_its_region(
            index in 0u32..8,
            generation_matches: bool,
            imm: u32,
            offset in extent(),
            len in extent(),
            sizes in proptest::collection::vec(0usize..10_000, 1..6),
            gens in proptest::collection::vec(any::<u16>(), 6),
        ) {
            let mut backing: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
            let mems: Vec<Option<(MemPtr, usize)>> = backing
                .iter_mut()
                .enumerate()
                .map(|(i, b)| (i % 3 != 2).then_some((MemPtr(b.as_mut_ptr()), b.len())))
                .collect();
            let gens = &gens[..mems.len()];
            let g = gens.get(index as usize).copied().unwrap_or(0);
            let g = if generation_matches { g } else { g.wrapping_add(1) };
            let key = (u32::from(g) << 16) | index;
            let hdr = FrameHeader {
                offset,
                len,
                total: (u64::from(key) << 32) | u64::from(imm),
                ..FrameHeader::control(FrameKind::Put, 0, 0)
            };
            let slot = mems.get(index as usize).copied().flatten();
            let fits = offset.checked_add(len).is_some_and(|e| slot.is_some_and(|(_, n)| e <= n as u64));
            match put_target(&mems, gens, hdr) {
                Err(e) => prop_assert!(!(generation_matches && fits), "refused a good write: {e}"),
                Ok(Rx::Put { dst, .. }) => {
                    let (base, _) = slot.expect("a registered slot");
                    prop_assert!(generation_matches && fits);
                    prop_assert_eq!((dst.0 as usize - base.0 as usize) as u64, offset);
                }
                Ok(_) => prop_assert!(false, "not a Put state"),
            }
        }
    }
}

mod batch;
mod exchange;
mod finished;
mod gone;
mod now;
mod small;

/// Rank 1 watches a poller but nobody polls it (a caller drives the
/// operation itself, as a small all-reduce does), and it asks for the
/// connection before rank 0 dials: its first look at the accept queue finds
/// it empty. Rank 0's dial must still be accepted; its readiness event,
/// edge triggered, waits in the unpolled poller (found by a four-rank job
/// under Slurm whose ranks timed out "connecting to" a lower rank).
#[test]
fn a_caller_that_does_not_poll_accepts_a_dial_that_comes_later() {
    let poll = mio::Poll::new().unwrap();
    let cfg = TcpConfig {
        store_ip: Some(Ipv4Addr::LOCALHOST.into()),
        lanes: 2,
        ..TcpConfig::default()
    };
    let mut a = TcpTransport::new(0, cfg.clone()).unwrap();
    let mut b = TcpTransport::new(1, cfg).unwrap();
    b.attach(poll.registry(), 0).unwrap();
    let infos: Vec<PeerInfo> = [&a, &b]
        .iter()
        .enumerate()
        .map(|(r, t)| PeerInfo {
            rank: r as u32,
            host_id: format!("host{r}"),
            hostname: format!("host{r}"),
            pid: std::process::id(),
            tcp: vec![t.listen_addr()],
            tcp_eager: t.eager(),
            ofi: String::new(),
            cores: 0,
            cpus: Vec::new(),
            fan_out: None,
        })
        .collect();
    a.set_peers(infos.clone());
    b.set_peers(infos);
    assert_eq!(b.connect(0).unwrap(), Readiness::Pending);
    let start = Instant::now();
    loop {
        let ra = a.connect(1).unwrap();
        let rb = b.connect(0).unwrap();
        if ra == Readiness::Ready && rb == Readiness::Ready {
            break;
        }
        a.progress().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "rank 1 never accepted rank 0's dial without polling"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
