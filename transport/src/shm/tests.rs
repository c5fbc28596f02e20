//! Two `ShmTransport`s in one process (ranks 0 and 1), over real shared memory.

use super::*;
use crate::seam::Outstanding;
use proptest::prelude::*;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

const HOST: &str = "testhost";

pub(super) fn job(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub(super) fn infos(n: u32) -> Vec<PeerInfo> {
    (0..n)
        .map(|rank| PeerInfo {
            rank,
            host_id: "same-host".into(),
            hostname: HOST.into(),
            pid: std::process::id(),
            tcp: vec![],
            tcp_eager: Default::default(),
            ofi: String::new(),
            cores: 0,
            cpus: Vec::new(),
            fan_out: None,
        })
        .collect()
}

/// The name secret of test job `j`: every rank of a test (and a child
/// process given `j`) derives the same one, and no two jobs share it.
pub(super) fn secret(j: &str) -> String {
    let mut s: String = j.bytes().map(|b| format!("{b:02x}")).collect();
    while s.len() < names::MIN_SECRET {
        s.push('0');
    }
    s.truncate(names::MAX_SECRET);
    s
}

/// Slot geometry without single-copy pulls: every byte goes through slots.
pub(super) fn cfg(job_id: &str, slots: usize, slot_bytes: usize) -> ShmConfig {
    cfg_pull(job_id, slots, slot_bytes, 0)
}

pub(super) fn cfg_pull(
    job_id: &str,
    slots: usize,
    slot_bytes: usize,
    pull_bytes: usize,
) -> ShmConfig {
    ShmConfig {
        job_id: job_id.into(),
        name_secret: secret(job_id),
        slot_bytes,
        slots,
        pull_bytes,
        p2p_pull_bytes: pull_bytes,
        pull_region_max: usize::MAX,
        eager_frames: crate::recv_core::DEFAULT_EAGER_FRAMES,
        // The tests below count pulls: the size rules alone decide.
        adaptive: false,
    }
}

/// Ranks 0 and 1 of a fresh job, connected.
pub(super) fn pair(name: &str, slots: usize, slot_bytes: usize) -> (ShmTransport, ShmTransport) {
    pair_pull(name, slots, slot_bytes, 0)
}

/// Like `pair`, with messages of at least `pull_bytes` pulled in one copy.
pub(super) fn pair_pull(
    name: &str,
    slots: usize,
    slot_bytes: usize,
    pull_bytes: usize,
) -> (ShmTransport, ShmTransport) {
    let j = job(name);
    connected_pair(cfg_pull(&j, slots, slot_bytes, pull_bytes))
}

/// Ranks 0 and 1 of a job with config `c`, connected.
fn connected_pair(c: ShmConfig) -> (ShmTransport, ShmTransport) {
    let mut a = ShmTransport::new(0, infos(2), c.clone()).unwrap();
    let mut b = ShmTransport::new(1, infos(2), c).unwrap();
    assert_eq!(a.connect(1).unwrap(), Readiness::Ready);
    assert_eq!(b.connect(0).unwrap(), Readiness::Ready);
    (a, b)
}

/// Operation slot `seq` of a 100-element operation (see `test_tags`).
pub(super) fn tag(seq: u64, step: u32) -> Tag {
    crate::test_tags::tag(0xc0, seq, 100, 0, step)
}

pub(super) use crate::test_drive::{offsets, pattern, reg};

/// Progresses both sides until every request completes (at most 2 s).
pub(super) fn run(
    a: &mut ShmTransport,
    b: &mut ShmTransport,
    ra: Vec<impl Into<Outstanding>>,
    rb: Vec<impl Into<Outstanding>>,
) {
    crate::test_drive::run_both(a, b, ra, rb, Duration::from_secs(2));
}

#[test]
fn sizes_both_ways() {
    let (mut a, mut b) = pair("sizes", 2, 64);
    let sizes = [0usize, 1, 63, 64, 65, 128, 300];
    let total: usize = sizes.iter().sum();
    let mut sa = pattern(total, 1);
    let mut sb = pattern(total, 2);
    let mut da = vec![0u8; total];
    let mut db = vec![0u8; total];
    let (msa, mda) = (reg(&mut a, &mut sa), reg(&mut a, &mut da));
    let (msb, mdb) = (reg(&mut b, &mut sb), reg(&mut b, &mut db));
    let (mut ra, mut rb) = (vec![], vec![]);
    let mut off = 0;
    for (i, &n) in sizes.iter().enumerate() {
        let t = tag(1, i as u32);
        ra.push(a.isend(1, t, msa, off, n).unwrap());
        ra.push(a.irecv(1, t, mda, off, n).unwrap());
        rb.push(b.isend(0, t, msb, off, n).unwrap());
        rb.push(b.irecv(0, t, mdb, off, n).unwrap());
        off += n;
    }
    run(&mut a, &mut b, ra, rb);
    assert_eq!(db, sa);
    assert_eq!(da, sb);
}

#[test]
fn recvs_posted_in_another_order_than_arrivals() {
    let (mut a, mut b) = pair("order", 4, 32);
    let mut src = pattern(150, 7);
    let mut dst = vec![0u8; 150];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    // Steps 0, 1, 2 sent in that order; received posted as 2, 0, 1.
    let parts = [(0, 0usize, 40usize), (1, 40, 70), (2, 110, 40)];
    let ra: Vec<_> = parts
        .iter()
        .map(|&(s, o, n)| a.isend(1, tag(9, s), ms, o, n).unwrap())
        .collect();
    let mut rb = vec![];
    for &i in &[2usize, 0, 1] {
        let (s, o, n) = parts[i];
        rb.push(b.irecv(0, tag(9, s), md, o, n).unwrap());
    }
    run(&mut a, &mut b, ra, rb);
    assert_eq!(dst, src);
}

#[test]
fn unmatched_frame_waits_in_its_slot_until_its_recv_is_posted() {
    let (mut a, mut b) = pair("early", 2, 16);
    let mut src = pattern(16, 3);
    let mut dst = vec![0u8; 16];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let mut s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 16).unwrap());
    assert!(a.progress().unwrap());
    assert!(s.poll(&mut a).unwrap());
    // Nothing posted on b and no send of b's stuck: the frame stays in the
    // ring (no copy), there is nothing to do, and b may sleep.
    assert!(!b.progress().unwrap());
    assert!(b.prepare_sleep());
    b.finish_sleep();
    assert_eq!(
        dst,
        vec![0u8; 16],
        "nothing is written before the receive is posted"
    );
    let mut r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 16).unwrap());
    assert!(b.progress().unwrap());
    assert!(
        r.poll(&mut b).unwrap(),
        "the waiting frame completes the receive"
    );
    assert_eq!(dst, src);
    // A completed request is gone: polling it again asks the transport nothing.
    assert!(r.is_done() && r.poll(&mut b).unwrap());
}

#[test]
fn unmatched_frame_is_buffered_while_a_send_is_stuck() {
    // Two 16-byte slots per ring: b's three sends to a fill b's ring and the
    // third is stuck until a reads. Then a frame from a that b has not asked
    // for must leave a's ring (a cycle of full rings through other ranks
    // could otherwise deadlock), into the early buffer.
    let (mut a, mut b) = pair("stuck", 2, 16);
    let mut src = pattern(48, 5);
    let mut back = pattern(16, 9);
    let mut dst = vec![0u8; 16];
    let ms = reg(&mut b, &mut src);
    let mb = reg(&mut a, &mut back);
    let md = reg(&mut b, &mut dst);
    let mut sends: Vec<Outstanding> = (0..3)
        .map(|k| {
            b.isend(0, tag(2, k), ms, 16 * k as usize, 16)
                .unwrap()
                .into()
        })
        .collect();
    b.progress().unwrap();
    assert!(
        !sends[2].poll(&mut b).unwrap(),
        "the third send waits for a slot"
    );
    let mut s = Outstanding::new(a.isend(1, tag(3, 0), mb, 0, 16).unwrap());
    a.progress().unwrap();
    assert!(s.poll(&mut a).unwrap());
    assert!(b.progress().unwrap(), "the frame is buffered");
    let mut r = Outstanding::new(b.irecv(0, tag(3, 0), md, 0, 16).unwrap());
    assert!(
        r.poll(&mut b).unwrap(),
        "the buffered frame completes the receive at once"
    );
    assert_eq!(dst, back);
}

/// A message too large for the sender's credits is announced (`Rts`); its
/// clearance (`Cts`) then comes behind whatever the receiver had sent the
/// sender before it. The sender has no receive posted for that frame (its
/// caller posts it only once the send is done, as a schedule whose reduce
/// overwrites the buffer being sent does) and no send stuck on a full
/// ring: it must still take the frame out of the ring to reach the
/// clearance, or both wait for ever (an rd all-reduce on four ranks hung
/// so, once in a few hundred runs of `in_place.rs`).
#[test]
fn a_clearance_behind_an_early_frame_reaches_the_sender() {
    // Two 16-byte slots and 4 eager frames: 6 credits, so a 200-byte
    // message (13 frames) is announced at once.
    let (mut a, mut b) = pair("ctsbehind", 2, 16);
    let mut big = pattern(200, 4);
    let mut early = pattern(16, 8);
    let (mut got_big, mut got_early) = (vec![0u8; 200], vec![0u8; 16]);
    let m_big = reg(&mut a, &mut big);
    let m_got_early = reg(&mut a, &mut got_early);
    let m_early = reg(&mut b, &mut early);
    let m_got_big = reg(&mut b, &mut got_big);
    // b's frame for a, which a has not asked for: it waits in the ring.
    let s_early = b.isend(0, tag(4, 1), m_early, 0, 16).unwrap();
    b.progress().unwrap();
    let send = a.isend(1, tag(4, 0), m_big, 0, 200).unwrap();
    a.progress().unwrap();
    assert_eq!(a.peers[1].announced.len(), 1, "the large send is announced");
    // b posts the receive; its clearance goes into b's ring behind the frame.
    let recv = b.irecv(0, tag(4, 0), m_got_big, 0, 200).unwrap();
    run(&mut a, &mut b, vec![send], vec![recv, s_early]);
    assert_eq!(got_big, big);
    // The frame taken out of the way waits in a buffer for its receive.
    let r = a.irecv(1, tag(4, 1), m_got_early, 0, 16).unwrap();
    run(&mut a, &mut b, vec![r], Vec::<Outstanding>::new());
    assert_eq!(got_early, early);
}

#[test]
fn mismatched_fingerprint_names_both_ranks() {
    let (mut a, mut b) = pair("mismatch", 2, 16);
    let mut src = vec![0u8; 8];
    let mut dst = vec![0u8; 8];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let _ = a
        .isend(1, crate::test_tags::tag(0xc0, 5, 10, 0, 0), ms, 0, 8)
        .unwrap();
    let _ = b
        .irecv(0, crate::test_tags::tag(0xc0, 5, 20, 0, 0), md, 0, 8)
        .unwrap();
    a.progress().unwrap();
    let e = b.progress().unwrap_err();
    match &e {
        Error::Mismatch {
            me,
            peer,
            local,
            remote,
        } => {
            assert_eq!((*me, *peer), (1, 0));
            assert!(
                local.contains("count=20") && remote.contains("count=10"),
                "{e}"
            );
        }
        other => panic!("expected a mismatch, got {other}"),
    }
    let s = e.to_string();
    assert!(s.contains("rank 0") && s.contains("rank 1"), "{s}");
    // prepare_sleep must not hide the error.
    assert!(!b.prepare_sleep());
}

#[test]
fn mismatched_length_is_a_mismatch() {
    let (mut a, mut b) = pair("mislen", 2, 16);
    let mut src = vec![0u8; 8];
    let mut dst = vec![0u8; 8];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let _ = a.isend(1, tag(5, 0), ms, 0, 8).unwrap();
    let _ = b.irecv(0, tag(5, 0), md, 0, 4).unwrap();
    a.progress().unwrap();
    assert!(matches!(
        b.progress(),
        Err(Error::Mismatch { me: 1, peer: 0, .. })
    ));
}

#[test]
fn abort_reaches_the_peer() {
    let (mut a, mut b) = pair("abort", 2, 16);
    a.abort("out of memory on the GPU"); // longer than a slot: cut
    match b.progress().unwrap_err() {
        Error::Remote { rank, addr, what } => {
            assert_eq!((rank, addr.as_str()), (0, HOST));
            assert_eq!(what, "aborted: out of memory on");
        }
        other => panic!("expected remote, got {other}"),
    }
}

#[test]
fn corrupt_header_is_a_protocol_error_naming_the_peer() {
    let (mut a, mut b) = pair("corrupt", 2, 16);
    let conn = a.peers[1].conn.as_mut().unwrap();
    assert!(conn.tx.push(&[0xEE; HEADER_LEN], &[]).unwrap());
    let e = b.progress().unwrap_err();
    assert!(matches!(e, Error::Protocol(_)), "{e}");
    assert!(e.to_string().contains("rank 0 (testhost)"), "{e}");
}

#[test]
fn a_peer_on_another_host_is_refused_by_name() {
    let j = job("otherhost");
    let mut ps = infos(3);
    ps[2].host_id = "elsewhere".into();
    ps[2].hostname = "node7".into();
    let mut a = ShmTransport::new(0, ps, cfg(&j, 1, 8)).unwrap();
    match a.connect(2) {
        Err(Error::InvalidArgument(m)) => {
            assert!(m.contains("another host") && m.contains("node7"), "{m}");
        }
        other => panic!("connect to a rank elsewhere: {other:?}"),
    }
    // The ranks on this host stay reachable.
    assert!(a.connect(1).is_ok());
}

#[test]
fn dead_peer_is_reported() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let j = job("dead");
    let mut ps = infos(2);
    ps[1].pid = dead;
    let mut a = ShmTransport::new(0, ps, cfg(&j, 1, 8)).unwrap();
    a.check_peers().unwrap(); // not connected: not watched
    a.connect(1).unwrap();
    match a.check_peers().unwrap_err() {
        Error::Remote {
            rank: 1,
            addr,
            what,
        } => {
            assert_eq!(addr, HOST);
            assert_eq!(what, format!("process {dead} died"));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn segment_files_are_removed() {
    let j = job("files");
    let path = segment_path(&secret(&j), 0, 1);
    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 2, 64)).unwrap();
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 2, 64)).unwrap();
    assert_eq!(b.connect(0).unwrap(), Readiness::Pending);
    assert!(!path.exists());
    assert_eq!(a.connect(1).unwrap(), Readiness::Ready);
    assert!(path.exists());
    // Owner-only permissions.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(b.connect(0).unwrap(), Readiness::Ready);
    assert!(!path.exists(), "the opener unlinks the name");
    assert_eq!(a.connect(1).unwrap(), Readiness::Ready);
    drop(a);
    drop(b);
    assert!(!path.exists());

    // A creator whose peer never came removes the name itself.
    let j = job("files2");
    let path = segment_path(&secret(&j), 0, 1);
    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 2, 64)).unwrap();
    a.connect(1).unwrap();
    assert!(path.exists());
    drop(a);
    assert!(!path.exists());
}

/// A lower rank that sent into a segment its peer has not opened yet, and
/// then leaves (a barrier's last message, sent just before it returns),
/// keeps the segment's name until the peer opens it: the peer still finds
/// the frames. Unlinked at once, the peer waited for the connection until
/// its timeout.
#[test]
fn frames_sent_before_the_peer_opened_survive_the_senders_exit() {
    let j = job("linger");
    let path = segment_path(&secret(&j), 0, 1);
    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 4, 64)).unwrap();
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 4, 64)).unwrap();
    let mut src = pattern(20, 1);
    let ms = reg(&mut a, &mut src);
    assert_eq!(a.connect(1).unwrap(), Readiness::Ready);
    let mut s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 20).unwrap());
    let deadline = Instant::now() + Duration::from_secs(2);
    while !s.poll(&mut a).unwrap() {
        a.progress().unwrap();
        assert!(Instant::now() < deadline, "the eager send did not finish");
    }
    let t0 = Instant::now();
    let leaving = std::thread::spawn(move || drop(a));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        path.exists(),
        "the name is kept while frames wait for rank 1"
    );
    let mut dst = vec![0u8; 20];
    let md = reg(&mut b, &mut dst);
    let mut r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 20).unwrap());
    while !r.poll(&mut b).unwrap() {
        b.progress().unwrap();
        assert!(
            Instant::now() < deadline + Duration::from_secs(1),
            "rank 1 never got the frame"
        );
    }
    leaving.join().unwrap();
    assert!(
        t0.elapsed() < LINGER_MAX,
        "left only after {:?}",
        t0.elapsed()
    );
    assert_eq!(dst, src);
    assert!(!path.exists());
}

#[test]
fn progress_connects_the_higher_rank() {
    let j = job("lazy");
    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 2, 8)).unwrap();
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 2, 8)).unwrap();
    let mut src = pattern(20, 1);
    let mut dst = vec![0u8; 20];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    // Posting before connect is fine: progress brings the pair up.
    let rb = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 20).unwrap());
    assert!(!b.progress().unwrap());
    assert!(!b.prepare_sleep() || !segment_path(&secret(&j), 0, 1).exists());
    let ra = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 20).unwrap());
    run(&mut a, &mut b, vec![ra], vec![rb]);
    assert_eq!(dst, src);
}

#[test]
fn layouts_must_agree() {
    let j = job("layout");
    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 2, 64)).unwrap();
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 4, 64)).unwrap();
    a.connect(1).unwrap();
    let e = b.connect(0).unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
    assert!(e.to_string().contains("rank 0 (testhost)"), "{e}");
}

#[test]
fn usage_errors() {
    assert!(ShmTransport::new(0, infos(2), cfg("bad/id", 2, 8)).is_err());
    assert!(ShmTransport::new(0, infos(2), cfg("ok", 0, 8)).is_err());
    assert!(ShmTransport::new(0, infos(2), cfg("ok", 2, 0)).is_err());
    assert!(ShmTransport::new(2, infos(2), cfg("ok", 2, 8)).is_err());
    let mut ps = infos(3);
    ps[2].host_id = "elsewhere".into();
    let mut a = ShmTransport::new(0, ps, cfg(&job("usage"), 2, 8)).unwrap();
    assert!(matches!(a.connect(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(a.connect(2), Err(Error::InvalidArgument(_))));
    assert!(matches!(a.connect(3), Err(Error::InvalidArgument(_))));
    let mut buf = vec![0u8; 10];
    let m = reg(&mut a, &mut buf);
    assert!(matches!(
        a.isend(1, tag(1, 0), m, 5, 6),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.irecv(1, tag(1, 0), m, usize::MAX, 2),
        Err(Error::InvalidArgument(_))
    ));
    // A handle deregistered, and a handle or request of another transport.
    let mut other = vec![0u8; 4];
    let gone = reg(&mut a, &mut other);
    a.deregister(gone).unwrap();
    assert!(matches!(
        a.isend(1, tag(1, 0), gone, 0, 1),
        Err(Error::InvalidArgument(_))
    ));
    let (mut c, _d) = pair("usage-other", 2, 8);
    let foreign = reg(&mut c, &mut other);
    let e = a.isend(1, tag(1, 0), foreign, 0, 1).unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(_)) && e.to_string().contains("of transport"),
        "{e}"
    );
    let theirs = c.irecv(1, tag(7, 0), foreign, 0, 1).unwrap();
    assert!(matches!(a.test(theirs), Err(Error::InvalidUsage(_))));
    let mut r = Outstanding::new(a.isend(1, tag(1, 0), m, 0, 10).unwrap());
    assert!(matches!(a.deregister(m), Err(Error::InvalidUsage(_))));
    a.connect(1).unwrap();
    a.progress().unwrap();
    assert!(r.poll(&mut a).unwrap());
    a.deregister(m).unwrap();
    assert!(a.deregister(m).is_err());
    let p = a.properties();
    assert_eq!(
        (p.name, p.max_segment, p.one_sided_write, p.gpu_memory),
        ("shm", 8, true, false)
    );
}

#[test]
fn prepare_sleep_sees_waiting_data() {
    let (mut a, mut b) = pair("sleepcheck", 2, 16);
    let poll = mio::Poll::new().unwrap();
    b.attach(poll.registry(), 100).unwrap();
    let mut src = pattern(16, 5);
    let mut dst = vec![0u8; 16];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let mut r = Outstanding::new(b.irecv(0, tag(2, 0), md, 0, 16).unwrap());
    assert!(b.prepare_sleep(), "nothing has arrived yet");
    b.finish_sleep();
    let _ = a.isend(1, tag(2, 0), ms, 0, 16).unwrap();
    a.progress().unwrap();
    assert!(!b.prepare_sleep(), "data is waiting");
    // The flags were cleared again: a's next publish rings nobody.
    assert!(!a.peers[1].conn.as_ref().unwrap().tx.take_reader_sleeping());
    b.progress().unwrap();
    assert!(r.poll(&mut b).unwrap());
}

/// Runs rank `t` in its own thread, sleeping in a mio::Poll whenever it can,
/// until `reqs` complete. Returns how many wakeups came with events.
pub(super) fn sleepy(
    mut t: ShmTransport,
    reqs: Vec<impl Into<Outstanding> + Send + 'static>,
) -> std::thread::JoinHandle<(ShmTransport, usize)> {
    std::thread::spawn(move || {
        let mut poll = mio::Poll::new().unwrap();
        let mut events = mio::Events::with_capacity(8);
        t.attach(poll.registry(), 7 << 32).unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut reqs: Vec<Outstanding> = reqs.into_iter().map(Into::into).collect();
        let mut woken = 0;
        loop {
            t.progress().unwrap();
            reqs.retain_mut(|r| !r.poll(&mut t).unwrap());
            if reqs.is_empty() {
                return (t, woken);
            }
            assert!(Instant::now() < deadline, "not woken");
            if t.prepare_sleep() {
                poll.poll(&mut events, Some(Duration::from_secs(3)))
                    .unwrap();
                t.finish_sleep();
                for ev in events.iter() {
                    assert_eq!(ev.token(), mio::Token(7 << 32));
                    t.on_event(ev).unwrap();
                    woken += 1;
                }
            }
        }
    })
}

#[test]
fn doorbell_wakes_a_sleeping_reader() {
    let (mut a, mut b) = pair("wake", 2, 32);
    let mut src = pattern(100, 9);
    let mut dst = vec![0u8; 100];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let r = Outstanding::new(b.irecv(0, tag(3, 1), md, 0, 100).unwrap());
    let start = Instant::now();
    let h = sleepy(b, vec![r]);
    std::thread::sleep(Duration::from_millis(100));
    let mut s = Outstanding::new(a.isend(1, tag(3, 1), ms, 0, 100).unwrap());
    // 100 bytes need 4 slots of a 2-slot ring: a must also be woken by b
    // freeing slots, which it observes by polling here.
    while !s.poll(&mut a).unwrap() {
        a.progress().unwrap();
        assert!(start.elapsed() < Duration::from_secs(2));
    }
    let (_b, woken) = h.join().unwrap();
    assert!(woken >= 1);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(_b);
    assert_eq!(dst, src);
}

#[test]
fn doorbell_wakes_a_writer_blocked_on_a_full_ring() {
    let (mut a, mut b) = pair("wakew", 1, 16);
    let mut src = pattern(64, 4);
    let mut dst = vec![0u8; 64];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    // Four slots' worth through a one-slot ring: a sleeps after each segment.
    let s = Outstanding::new(a.isend(1, tag(4, 0), ms, 0, 64).unwrap());
    let start = Instant::now();
    let h = sleepy(a, vec![s]);
    std::thread::sleep(Duration::from_millis(50));
    let mut r = Outstanding::new(b.irecv(0, tag(4, 0), md, 0, 64).unwrap());
    while !r.poll(&mut b).unwrap() {
        b.progress().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(start.elapsed() < Duration::from_secs(2));
    }
    let (_a, woken) = h.join().unwrap();
    assert!(woken >= 1);
    assert_eq!(dst, src);
}

#[test]
fn creator_wakes_a_higher_rank_waiting_to_connect() {
    let j = job("wakec");
    let a = ShmTransport::new(0, infos(2), cfg(&j, 2, 8)).unwrap();
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 2, 8)).unwrap();
    let mut dst = vec![0u8; 0];
    let md = reg(&mut b, &mut dst);
    let r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 0).unwrap());
    let start = Instant::now();
    let h = sleepy(b, vec![r]);
    std::thread::sleep(Duration::from_millis(100));
    let mut a = a;
    let mut src = vec![0u8; 0];
    let ms = reg(&mut a, &mut src);
    let mut s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 0).unwrap());
    a.connect(1).unwrap();
    a.progress().unwrap();
    assert!(s.poll(&mut a).unwrap());
    let (_b, _) = h.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// Actions of a random interleaving.
#[derive(Clone, Copy, Debug)]
enum Step {
    ProgA,
    ProgB,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![Just(Step::ProgA), Just(Step::ProgB)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_sizes_and_interleavings_deliver_exact_bytes(
        slot_bytes in prop::sample::select(vec![8usize, 24, 64]),
        slots in 1usize..4,
        pull_frac in prop::sample::select(vec![0.0f64, 0.01, 0.5, 1.0, 2.0]),
        fracs_ab in prop::collection::vec(0.0f64..3.0, 0..6),
        fracs_ba in prop::collection::vec(0.0f64..3.0, 0..6),
        schedule in prop::collection::vec(step(), 0..40),
        reverse_recvs in any::<bool>(),
    ) {
        // 0 never pulls; otherwise messages from this size on are pulled.
        let pull = (pull_frac * slot_bytes as f64) as usize;
        let (mut a, mut b) = pair_pull("prop", slots, slot_bytes, pull.max(pull_frac.ceil() as usize));
        let sizes = |f: &[f64]| -> Vec<usize> { f.iter().map(|x| (x * slot_bytes as f64) as usize).collect() };
        let (sab, sba) = (sizes(&fracs_ab), sizes(&fracs_ba));
        let (tab, tba) = (sab.iter().sum::<usize>(), sba.iter().sum::<usize>());
        let mut a_src = pattern(tab, 11);
        let mut b_src = pattern(tba, 22);
        let mut a_dst = vec![0u8; tba];
        let mut b_dst = vec![0u8; tab];
        let (mas, mad) = (reg(&mut a, &mut a_src), reg(&mut a, &mut a_dst));
        let (mbs, mbd) = (reg(&mut b, &mut b_src), reg(&mut b, &mut b_dst));
        let (mut ra, mut rb) = (vec![], vec![]);
        let (oab, oba) = (offsets(&sab), offsets(&sba));
        for (i, &(o, n)) in oab.iter().enumerate() {
            ra.push(a.isend(1, tag(1, i as u32), mas, o, n).unwrap());
        }
        for (i, &(o, n)) in oba.iter().enumerate() {
            rb.push(b.isend(0, tag(2, i as u32), mbs, o, n).unwrap());
        }
        let mut order: Vec<usize> = (0..oab.len()).collect();
        if reverse_recvs { order.reverse(); }
        for i in order {
            let (o, n) = oab[i];
            rb.push(b.irecv(0, tag(1, i as u32), mbd, o, n).unwrap());
        }
        for (i, &(o, n)) in oba.iter().enumerate() {
            ra.push(a.irecv(1, tag(2, i as u32), mad, o, n).unwrap());
        }
        for s in schedule {
            match s {
                Step::ProgA => { a.progress().unwrap(); }
                Step::ProgB => { b.progress().unwrap(); }
            }
        }
        run(&mut a, &mut b, ra, rb);
        prop_assert_eq!(&b_dst, &a_src);
        prop_assert_eq!(&a_dst, &b_src);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Messages past the credits are announced and wait for a clearance,
    /// large ones may be pulled, and a frame nobody asked for yet waits in
    /// the ring: with receives that wait for their own sends, as an rd
    /// all-reduce's do, every mix must still finish (a clearance stuck
    /// behind such a frame once hung both ranks).
    #[test]
    fn exchanges_whose_receives_wait_for_their_sends_finish(
        slot_bytes in prop::sample::select(vec![8usize, 24, 64]),
        slots in 1usize..4,
        pull_slots in prop::sample::select(vec![0usize, 2, 6]),
        fracs in prop::collection::vec(0.0f64..12.0, 1..12),
        window in 1usize..4,
        ahead in 1usize..12,
        turns in prop::collection::vec(any::<bool>(), 1..48),
    ) {
        let (a, b) = pair_pull("waitsend", slots, slot_bytes, pull_slots * slot_bytes);
        let sizes: Vec<usize> = fracs.iter().map(|x| (x * slot_bytes as f64) as usize).collect();
        let r = crate::test_drive::exchange_waiting_for_sends(
            a, b, &sizes, (window, ahead), &turns, |k| tag(5, k));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

#[test]
fn after_abort_nothing_is_touched_and_posts_fail() {
    let (mut a, mut b) = pair("abort2", 2, 16);
    let mut buf = vec![0u8; 16];
    let m = reg(&mut a, &mut buf);
    let mut r = Outstanding::new(a.irecv(1, tag(1, 0), m, 0, 16).unwrap());
    a.abort("bye");
    assert!(matches!(
        a.isend(1, tag(1, 1), m, 0, 1),
        Err(Error::Aborted(_))
    ));
    assert!(matches!(
        a.irecv(1, tag(1, 1), m, 0, 1),
        Err(Error::Aborted(_))
    ));
    // b's data for the dropped receive is never copied.
    let mut src = vec![7u8; 16];
    let ms = reg(&mut b, &mut src);
    let _ = b.isend(0, tag(1, 0), ms, 0, 16).unwrap();
    assert!(b.progress().is_err(), "b sees the abort");
    assert!(!a.progress().unwrap());
    assert!(!r.poll(&mut a).unwrap());
    assert!(a.prepare_sleep());
    assert_eq!(buf, vec![0u8; 16]);
}

#[test]
fn clean_close_is_not_a_crash() {
    let (mut a, mut b) = pair("close", 2, 16);
    let mut src = pattern(20, 1);
    let mut dst = vec![0u8; 20];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 20).unwrap());
    let r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 20).unwrap());
    run(&mut a, &mut b, vec![s], vec![r]);
    drop(a);
    assert!(!b.prepare_sleep(), "the close notice is work");
    assert!(b.progress().unwrap());
    b.check_peers().unwrap();
    let e = b.irecv(0, tag(1, 1), md, 0, 1).unwrap_err();
    assert!(e.to_string().contains("shut its communicator down"), "{e}");
    assert_eq!(dst, src);
}

#[test]
fn close_while_data_is_expected_is_an_error() {
    let (a, mut b) = pair("close2", 2, 16);
    let mut dst = vec![0u8; 4];
    let md = reg(&mut b, &mut dst);
    let _ = b.irecv(0, tag(1, 0), md, 0, 4).unwrap();
    drop(a);
    match b.progress().unwrap_err() {
        Error::Remote { rank: 0, what, .. } => assert!(what.contains("expected data"), "{what}"),
        other => panic!("{other}"),
    }
}

/// Progresses `t` until `reqs` complete, sleeping in a poller when idle.
pub(super) fn drive_sleeping(
    t: &mut ShmTransport,
    poll: &mut mio::Poll,
    mut reqs: Vec<Outstanding>,
) {
    let mut events = mio::Events::with_capacity(8);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !reqs.is_empty() {
        assert!(Instant::now() < deadline, "transfers did not finish");
        t.progress().unwrap();
        reqs.retain_mut(|r| !r.poll(&mut *t).unwrap());
        if !reqs.is_empty() && t.prepare_sleep() {
            poll.poll(&mut events, Some(Duration::from_millis(500)))
                .unwrap();
            t.finish_sleep();
            for ev in events.iter() {
                t.on_event(ev).unwrap();
            }
        }
    }
}

const CHILD_ENV: &str = "GW_SHM_TEST_CHILD";

/// Rank 1 of `two_processes_*`, run in a child process: echoes one message
/// back, then leaves cleanly or (mode "crash") exits without a word.
#[test]
fn child_rank() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // only meaningful when spawned by a parent test
    };
    let mut it = spec.split(':');
    let (job_id, parent, mode, len) = (
        it.next().unwrap().to_string(),
        it.next().unwrap().parse::<u32>().unwrap(),
        it.next().unwrap().to_string(),
        it.next().unwrap().parse::<usize>().unwrap(),
    );
    let mut ps = infos(2);
    ps[0].pid = parent;
    let pull = if mode == "pull" { 4096 } else { 0 };
    let mut t = ShmTransport::new(1, ps, cfg_pull(&job_id, 4, 64 << 10, pull)).unwrap();
    let mut poll = mio::Poll::new().unwrap();
    t.attach(poll.registry(), 0).unwrap();
    let mut buf = vec![0u8; len];
    let m = reg(&mut t, &mut buf);
    let deadline = Instant::now() + Duration::from_secs(3);
    while t.connect(0).unwrap() == Readiness::Pending {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    if mode == "crash" {
        std::process::exit(0); // no destructors: no close notice
    }
    if mode == "write" {
        super::tests_one_sided::child_writes(&mut t, &mut poll, len);
        return;
    }
    let r = Outstanding::new(t.irecv(0, tag(1, 0), m, 0, len).unwrap());
    drive_sleeping(&mut t, &mut poll, vec![r]);
    let s = Outstanding::new(t.isend(0, tag(1, 1), m, 0, len).unwrap());
    drive_sleeping(&mut t, &mut poll, vec![s]);
}

pub(super) fn spawn_child(job_id: &str, mode: &str, len: usize) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "shm::tests::child_rank",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{job_id}:{}:{mode}:{len}", std::process::id()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn two_processes_echo_and_leave_cleanly() {
    echo_with_child("proc", "echo", 0);
}

/// The same echo with both directions pulled straight out of the other
/// process (one `process_vm_readv` per message instead of slot copies).
#[test]
fn two_processes_echo_with_single_copy_pulls() {
    echo_with_child("pullproc", "pull", 4096);
}

fn echo_with_child(name: &str, mode: &str, pull: usize) {
    let j = job(name);
    let len = (1 << 20) + 123;
    let mut child = spawn_child(&j, mode, len);
    let mut ps = infos(2);
    ps[1].pid = child.id();
    let mut t = ShmTransport::new(0, ps, cfg_pull(&j, 4, 64 << 10, pull)).unwrap();
    let mut poll = mio::Poll::new().unwrap();
    t.attach(poll.registry(), 0).unwrap();
    assert_eq!(t.connect(1).unwrap(), Readiness::Ready);
    let mut src = pattern(len, 77);
    let mut dst = vec![0u8; len];
    let (ms, md) = (reg(&mut t, &mut src), reg(&mut t, &mut dst));
    // Until the child has mapped the segment and probed us, large sends go
    // through the slots; wait so that this test sees the pull path.
    let deadline = Instant::now() + Duration::from_secs(3);
    while pull > 0
        && t.peers[1].conn.as_ref().unwrap().tx.can_pull() == super::ring::CanPull::Unknown
    {
        assert!(Instant::now() < deadline, "the child never probed us");
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = Outstanding::new(t.isend(1, tag(1, 0), ms, 0, len).unwrap());
    let r = Outstanding::new(t.irecv(1, tag(1, 1), md, 0, len).unwrap());
    drive_sleeping(&mut t, &mut poll, vec![s, r]);
    assert_eq!(dst, src);
    let pulled = t.peers[1].next_pull;
    assert_eq!(pulled, u64::from(pull > 0), "rendezvous sends made");
    assert!(child.wait().unwrap().success());
    t.progress().unwrap(); // reads the close notice
    t.check_peers().unwrap();
    assert!(!segment_path(&secret(&j), 0, 1).exists());
}

#[test]
fn two_processes_crash_is_noticed() {
    let j = job("crash");
    let mut child = spawn_child(&j, "crash", 1);
    let mut ps = infos(2);
    ps[1].pid = child.id();
    let mut t = ShmTransport::new(0, ps, cfg(&j, 4, 64 << 10)).unwrap();
    t.connect(1).unwrap();
    assert!(child.wait().unwrap().success());
    t.progress().unwrap();
    let e = t.check_peers().unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("process {} died", child.id())),
        "{e}"
    );
    assert!(
        !segment_path(&secret(&j), 0, 1).exists(),
        "the child unlinked the name"
    );
}

#[test]
fn large_messages_are_pulled_and_small_ones_use_slots() {
    let (mut a, mut b) = pair_pull("pullmix", 2, 64, 100);
    let sizes = [0usize, 1, 99, 100, 101, 4096, 70_000];
    let total: usize = sizes.iter().sum();
    let mut src = pattern(total, 3);
    let mut dst = vec![0u8; total];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    let (mut ra, mut rb) = (vec![], vec![]);
    let mut off = 0;
    for (i, &n) in sizes.iter().enumerate() {
        ra.push(a.isend(1, tag(1, i as u32), ms, off, n).unwrap());
        rb.push(b.irecv(0, tag(1, i as u32), md, off, n).unwrap());
        off += n;
    }
    run(&mut a, &mut b, ra, rb);
    assert_eq!(dst, src);
    // 100, 101, 4096 and 70000 bytes went as rendezvous frames.
    assert_eq!(a.peers[1].next_pull, 4);
    assert!(a.peers[1].pulls_out.is_empty());
}

/// Ranks 0 and 1 of a job with config `c`, connected, once rank 1 has
/// found out that it may pull from rank 0 (until then nothing is pulled).
pub(super) fn probed_pair(c: ShmConfig) -> (ShmTransport, ShmTransport) {
    let (mut a, mut b) = connected_pair(c);
    let deadline = Instant::now() + Duration::from_secs(3);
    while a.peers[1].conn.as_ref().unwrap().tx.can_pull() == super::ring::CanPull::Unknown {
        assert!(Instant::now() < deadline, "b never probed a");
        a.progress().unwrap();
        b.progress().unwrap();
    }
    (a, b)
}

/// A probed pair of job `name` that pulls hinted (stored) messages from
/// 100 bytes and others from 1000, with two 4 KiB slots per ring.
fn stored_pulls_pair(name: &str) -> (ShmTransport, ShmTransport) {
    let j = job(name);
    probed_pair(ShmConfig {
        p2p_pull_bytes: 100,
        ..cfg_pull(&j, 2, 4096, 1000)
    })
}

/// Sends each `(region, length, hint)` from `a` (from the region's start)
/// to receives on `b`, one after another in `md`, and runs them to the end.
pub(super) fn send_hinted(
    a: &mut ShmTransport,
    b: &mut ShmTransport,
    sends: &[(MemHandle, usize, Option<SendHint>)],
    md: MemHandle,
) {
    let (mut ra, mut rb) = (vec![], vec![]);
    let mut off = 0;
    for (i, &(m, n, hint)) in sends.iter().enumerate() {
        let t = tag(1, i as u32);
        ra.push(match hint {
            Some(h) => a.isend_hinted(1, t, m, 0, n, h).unwrap(),
            None => a.isend(1, t, m, 0, n).unwrap(),
        });
        rb.push(b.irecv(0, t, md, off, n).unwrap());
        off += n;
    }
    run(a, b, ra, rb);
}

#[test]
fn large_regions_and_pushed_sends_use_slots_and_exchanged_sends_are_pulled() {
    let j = job("pullregion");
    let c = ShmConfig {
        pull_region_max: 8192,
        ..cfg_pull(&j, 2, 64, 100)
    };
    // A send going through the slots below can only be the region
    // limit's doing.
    let (mut a, mut b) = probed_pair(c);
    // One region just under the limit, one at it; from each, a 1000-byte
    // message (long enough to pull) and the whole region; then the small
    // region's message again, pushed, and the whole large region,
    // exchanged.
    let (small, large) = (8191usize, 8192usize);
    let mut src_small = pattern(small, 5);
    let mut src_large = pattern(large, 6);
    let mut dst = vec![0u8; 3 * 1000 + small + 2 * large];
    let ms = reg(&mut a, &mut src_small);
    let ml = reg(&mut a, &mut src_large);
    let md = reg(&mut b, &mut dst);
    let sends = [
        (ml, 1000, None),
        (ms, 1000, None),
        (ml, large, None),
        (ms, small, None),
        (ms, 1000, Some(SendHint::Pushed)),
        (ml, large, Some(SendHint::Exchanged)),
    ];
    send_hinted(&mut a, &mut b, &sends, md);
    let want = [
        &src_large[..1000],
        &src_small[..1000],
        &src_large[..],
        &src_small[..],
        &src_small[..1000],
        &src_large[..],
    ]
    .concat();
    assert_eq!(dst, want);
    // Only the two plain sends out of the region under the limit and the
    // exchanged one were pulled.
    assert_eq!(a.peers[1].next_pull, 3);
    assert!(a.peers[1].pulls_out.is_empty());
}

#[test]
fn point_to_point_sends_are_pulled_from_their_own_threshold() {
    // Collectives' sends pull from 1000 bytes, point-to-point ones (stored
    // or exchanged) from 100; then, with the point-to-point threshold at
    // 0, only the collectives' ones.
    for (p2p, pulled) in [(100, 4), (0, 1)] {
        let j = job(&format!("p2ppull{p2p}"));
        let c = ShmConfig {
            p2p_pull_bytes: p2p,
            ..cfg_pull(&j, 2, 4096, 1000)
        };
        let (mut a, mut b) = probed_pair(c);
        let mut src = pattern(2000, 7);
        let mut dst = vec![0u8; 500 + 500 + 99 + 500 + 2000 + 100];
        let ms = reg(&mut a, &mut src);
        let md = reg(&mut b, &mut dst);
        let sends = [
            (ms, 500, None),                      // a collective's, under 1000
            (ms, 500, Some(SendHint::Stored)),    // pulled at 100
            (ms, 99, Some(SendHint::Stored)),     // under 100
            (ms, 500, Some(SendHint::Exchanged)), // pulled at 100
            (ms, 2000, None),                     // pulled at 1000
            (ms, 100, Some(SendHint::Stored)),    // pulled at 100
        ];
        send_hinted(&mut a, &mut b, &sends, md);
        let want: Vec<u8> = sends
            .iter()
            .flat_map(|&(_, n, _)| src[..n].iter().copied())
            .collect();
        assert_eq!(dst, want);
        assert_eq!(a.peers[1].next_pull, pulled, "p2p threshold {p2p}");
        assert!(a.peers[1].pulls_out.is_empty());
    }
}

/// A pulled send with nothing queued before it names its address at
/// posting, so that its receiver pulls it while the sender makes no
/// progress call (a broadcast's root copies its own output meanwhile); and
/// `send_now` leaves a message that its hint would have pulled to the
/// posted path.
#[test]
fn a_pulled_send_is_announced_at_posting() {
    let (mut a, mut b) = stored_pulls_pair("pullpost");
    let mut src = pattern(500, 3);
    let mut dst = vec![0u8; 500];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let stored = Some(SendHint::Stored);
    assert_eq!(
        a.send_now(1, tag(1, 0), &src[..99], stored).unwrap(),
        Now::Done
    );
    assert_eq!(a.send_now(1, tag(1, 1), &src, stored).unwrap(), Now::Later);
    let sent = a
        .isend_hinted(1, tag(1, 1), ms, 0, 500, SendHint::Stored)
        .unwrap();
    let mut small = [0u8; 99];
    assert_eq!(b.recv_now(0, tag(1, 0), &mut small).unwrap(), Now::Done);
    assert_eq!(small[..], src[..99]);
    let mut got = Outstanding::new(b.irecv(0, tag(1, 1), md, 0, 500).unwrap());
    let deadline = Instant::now() + Duration::from_secs(3);
    while !got.poll(&mut b).unwrap() {
        assert!(
            Instant::now() < deadline,
            "the receiver never saw the send: it was not announced when posted"
        );
        b.progress().unwrap();
    }
    assert_eq!(dst, src);
    assert_eq!(a.peers[1].next_pull, 1, "not pulled");
    // The sender learns that it was pulled at its next progress.
    run(&mut a, &mut b, vec![sent], Vec::<Request>::new());
    assert!(a.peers[1].pulls_out.is_empty());
}

/// A message announced before its receive was posted is pulled when the
/// receive comes; its sender, asleep with nothing else to wait for, must
/// be woken then, not at its next timeout (the poll below waits 3 s).
#[test]
fn a_sender_asleep_on_an_announced_pull_is_woken_when_it_is_pulled() {
    let (mut a, mut b) = stored_pulls_pair("pullwake");
    let mut src = pattern(500, 5);
    let mut dst = vec![0u8; 500];
    let mut other = vec![0u8; 8];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let mo = reg(&mut b, &mut other);
    // A receive of another message, so that b takes a's rendezvous frame
    // out of the ring as an announcement.
    let later = b.irecv(0, tag(2, 1), mo, 0, 8).unwrap();
    let sent = a
        .isend_hinted(1, tag(2, 0), ms, 0, 500, SendHint::Stored)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while b.peers[0].core.announcements() == 0 {
        assert!(Instant::now() < deadline, "b never took the announcement");
        b.progress().unwrap();
    }
    let h = sleepy(a, vec![sent]);
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let mut got = Outstanding::new(b.irecv(0, tag(2, 0), md, 0, 500).unwrap());
    assert!(got.poll(&mut b).unwrap(), "pulled at posting");
    let (mut a, woken) = h.join().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the sender slept {:?} after its message was pulled",
        start.elapsed()
    );
    assert!(woken >= 1);
    assert_eq!(dst, src);
    let mut tail = [9u8; 8];
    let ms2 = reg(&mut a, &mut tail);
    let s2 = a.isend(1, tag(2, 1), ms2, 0, 8).unwrap();
    run(&mut a, &mut b, vec![s2], vec![later]);
    assert_eq!(other, tail);
}

#[test]
fn a_send_waiting_to_be_pulled_keeps_its_memory_registered() {
    let (mut a, mut b) = pair_pull("pullbusy", 2, 64, 16);
    // Let b find out that it can pull from a.
    b.progress().unwrap();
    let mut src = pattern(1000, 4);
    let ms = reg(&mut a, &mut src);
    let mut s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 1000).unwrap());
    a.progress().unwrap();
    assert!(
        !s.poll(&mut a).unwrap(),
        "complete before the receiver pulled it"
    );
    let e = a.deregister(ms).unwrap_err().to_string();
    assert!(e.contains("still used"), "{e}");
    let mut dst = vec![0u8; 1000];
    let md = reg(&mut b, &mut dst);
    let r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 1000).unwrap());
    run(&mut a, &mut b, vec![s], vec![r]);
    assert_eq!(dst, src);
    a.deregister(ms).unwrap();
}

/// Rendezvous sends complete when their receive pulls them, so each rank
/// posts its receive without waiting for its own send (as MPI's standard
/// mode asks of large messages). Both rendezvous frames are taken out of
/// the rings as announcements, never into buffers, and each message is
/// copied once, straight into its receive.
#[test]
fn crossing_rendezvous_sends_complete_without_buffering() {
    let (mut a, mut b) = pair_pull("pullcross", 2, 64, 16);
    let n = 5000;
    let (mut sa, mut sb) = (pattern(n, 5), pattern(n, 6));
    let (mut da, mut db) = (vec![0u8; n], vec![0u8; n]);
    let (msa, mda) = (reg(&mut a, &mut sa), reg(&mut a, &mut da));
    let (msb, mdb) = (reg(&mut b, &mut sb), reg(&mut b, &mut db));
    let sends = [
        a.isend(1, tag(1, 0), msa, 0, n).unwrap(),
        b.isend(0, tag(1, 1), msb, 0, n).unwrap(),
    ];
    // Both rendezvous frames arrive before either receive is posted.
    for _ in 0..5 {
        a.progress().unwrap();
        b.progress().unwrap();
    }
    let ra = a.irecv(1, tag(1, 1), mda, 0, n).unwrap();
    let rb = b.irecv(0, tag(1, 0), mdb, 0, n).unwrap();
    let [s0, s1] = sends;
    run(&mut a, &mut b, vec![s0, ra], vec![s1, rb]);
    assert_eq!(da, sb);
    assert_eq!(db, sa);
    assert!(a.peers[1].core.is_idle() && b.peers[0].core.is_idle());
}

#[test]
fn a_peer_that_cannot_be_read_gets_its_data_through_slots() {
    let j = job("pullno");
    // A pid that does not exist: every probe fails, so nothing is pulled.
    let mut ps = infos(2);
    ps[0].pid = i32::MAX as u32 - 7;
    ps[1].pid = i32::MAX as u32 - 7;
    let c = cfg_pull(&j, 2, 64, 16);
    let mut a = ShmTransport::new(0, ps.clone(), c.clone()).unwrap();
    let mut b = ShmTransport::new(1, ps, c).unwrap();
    a.connect(1).unwrap();
    b.connect(0).unwrap();
    b.progress().unwrap();
    a.progress().unwrap();
    let mut src = pattern(3000, 7);
    let mut dst = vec![0u8; 3000];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    let s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 3000).unwrap());
    let r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 3000).unwrap());
    run(&mut a, &mut b, vec![s], vec![r]);
    assert_eq!(dst, src);
    assert_eq!(a.peers[1].next_pull, 0, "no rendezvous frame was sent");
}

/// The receiver pulls a message, reports it, and shuts down at once: the
/// sender reads the close notice and the report together, and its send
/// completed (it is not "data still owed to a closed peer").
#[test]
fn a_peer_that_pulled_and_closed_completed_our_send() {
    let (mut a, mut b) = pair_pull("pullclose", 2, 64, 16);
    b.progress().unwrap();
    let mut src = pattern(1000, 8);
    let mut dst = vec![0u8; 1000];
    let ms = reg(&mut a, &mut src);
    let md = reg(&mut b, &mut dst);
    let mut s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 1000).unwrap());
    let mut r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 1000).unwrap());
    // a posts the rendezvous frame; b pulls it and reports it.
    a.progress().unwrap();
    b.progress().unwrap();
    assert!(r.poll(&mut b).unwrap());
    assert_eq!(dst, src);
    drop(b); // close notice
    // As if a's previous progress call had looked for reports just before b
    // made its one, and read the close notice after: a now knows b closed
    // while its send still looks outstanding.
    super::pump_recvs(0, false, &mut a.peers[1], &mut a.bell, &mut a.reqs).unwrap();
    assert!(a.peers[1].closed);
    assert_eq!(a.peers[1].pulls_out.len(), 1);
    a.progress().unwrap();
    assert!(s.poll(&mut a).unwrap());
}
