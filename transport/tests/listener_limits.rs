//! Strangers connecting to a rank's data-plane port and saying nothing,
//! over real loopback sockets: they are closed after the hello deadline,
//! past the cap of waiting connections the oldest is closed, and a rank
//! process short of file descriptors (150 silent connections under a limit
//! of 96 or fewer, which ended a job with "Too many open files") still
//! connects to its peer and completes its transfers.

use gw_rendezvous::PeerInfo;
use gw_transport::seam::Readiness;
use gw_transport::tcp::{AcceptLimits, TcpConfig, TcpTransport};
use gw_transport::{Outstanding, Scope, Signature, Tag, Transport};
use std::fmt;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
const CHILD_ENV: &str = "GW_LISTENER_CHILD_NOFILE";
const LEN: usize = 1 << 20;
/// The child rank's hello deadline: short, so the test does not wait long.
const CHILD_DEADLINE: Duration = Duration::from_secs(3);

fn show(t: &Tag, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "listener test message {}", t.step)
}

fn tag(k: u32) -> Tag {
    Tag {
        comm: 5,
        seq: 1,
        step: k,
        sig: Signature::default(),
        scope: Scope::Message,
        show,
    }
}

fn cfg() -> TcpConfig {
    TcpConfig {
        store_ip: Some(Ipv4Addr::LOCALHOST.into()),
        ..TcpConfig::default()
    }
}

fn infos(addrs: [SocketAddr; 2], eager: [gw_rendezvous::peers::Eager; 2]) -> Vec<PeerInfo> {
    (0..2u32)
        .map(|r| PeerInfo {
            rank: r,
            host_id: format!("h{r}"),
            hostname: format!("h{r}"),
            pid: std::process::id(),
            tcp: vec![addrs[r as usize]],
            tcp_eager: eager[r as usize],
            ofi: String::new(),
            cores: 0,
            cpus: Vec::new(),
            fan_out: None,
        })
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed)
        .collect()
}

/// Whether the other end closed `s` (nonblocking): end of stream or reset.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => panic!("a rank sent bytes to a silent stranger"),
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
        Err(e) => panic!("reading a stranger's socket: {e}"),
    }
}

fn connect_silently(to: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(to).unwrap_or_else(|e| panic!("connect to {to}: {e}"));
    s.set_nonblocking(true).expect("O_NONBLOCK");
    s
}

/// Ranks 0 and 1 in this process, connected, rank 1 driven by `poll` as the
/// engine thread drives it.
fn polled_pair(poll: &mio::Poll) -> (TcpTransport, TcpTransport) {
    let mut a = TcpTransport::new(0, cfg()).expect("rank 0");
    let mut b = TcpTransport::new(1, cfg()).expect("rank 1");
    b.attach(poll.registry(), 0).expect("attach");
    join(&mut a, &mut b);
    (a, b)
}

/// Tells ranks 0 and 1 of each other and connects them.
fn join(a: &mut TcpTransport, b: &mut TcpTransport) {
    let peers = infos([a.listen_addr(), b.listen_addr()], [a.eager(), b.eager()]);
    a.set_peers(peers.clone());
    b.set_peers(peers);
    let start = Instant::now();
    while !(a.connect(1).expect("connect") == Readiness::Ready
        && b.connect(0).expect("connect") == Readiness::Ready)
    {
        assert!(start.elapsed() < LIMIT, "ranks 0 and 1 did not connect");
    }
}

fn dispatch(b: &mut TcpTransport, poll: &mut mio::Poll) {
    let mut events = mio::Events::with_capacity(16);
    poll.poll(&mut events, Some(Duration::from_millis(10)))
        .expect("epoll_wait");
    for e in events.iter() {
        b.on_event(e).expect("on_event");
    }
}

/// After bring-up, with the poller telling rank 1 about its listener: a
/// stranger that says nothing, and one that sends part of a hello, are
/// accepted and closed once the deadline passed, not before.
#[test]
fn a_silent_connection_is_closed_after_the_hello_deadline() {
    let mut poll = mio::Poll::new().expect("epoll_create");
    let (mut a, mut b) = polled_pair(&poll);
    let deadline = Duration::from_millis(500);
    b.set_accept_limits(AcceptLimits {
        hello_deadline: deadline,
        max_pending: 64,
    })
    .expect("limits");
    let start = Instant::now();
    let mut strangers = [
        connect_silently(b.listen_addr()),
        connect_silently(b.listen_addr()),
    ];
    strangers[1]
        .write_all(b"GWH1\0\0")
        .expect("part of a hello");
    let mut seen = 0;
    let mut open = [true; 2];
    while open.iter().any(|&o| o) {
        dispatch(&mut b, &mut poll);
        b.progress().expect("rank 1 progress");
        a.progress().expect("rank 0 progress");
        seen = seen.max(b.waiting_connections());
        for (o, s) in open.iter_mut().zip(strangers.iter_mut()) {
            if *o && closed(s) {
                *o = false;
                assert!(
                    start.elapsed() >= deadline,
                    "a stranger was closed after {:?}, before the deadline",
                    start.elapsed()
                );
            }
        }
        assert!(
            start.elapsed() < deadline + Duration::from_secs(20),
            "a silent stranger is still connected after {:?}",
            start.elapsed()
        );
    }
    assert_eq!(seen, 2, "the strangers were never accepted");
    assert_eq!(b.waiting_connections(), 0);
}

/// With a cap of 4 waiting connections, the fifth and sixth stranger close
/// the two oldest; the four newest stay, and rank 0 still connects.
#[test]
fn past_the_cap_the_oldest_waiting_connection_is_closed() {
    let mut b = TcpTransport::new(1, cfg()).expect("rank 1");
    b.set_accept_limits(AcceptLimits {
        hello_deadline: LIMIT,
        max_pending: 4,
    })
    .expect("limits");
    let mut strangers = Vec::new();
    for k in 0..6 {
        strangers.push(connect_silently(b.listen_addr()));
        // Accepted before the next connects, so the oldest is known.
        let start = Instant::now();
        while b.waiting_connections() < (k + 1).min(4) {
            b.progress().expect("rank 1 progress");
            assert!(start.elapsed() < LIMIT, "stranger {k} was never accepted");
        }
    }
    let start = Instant::now();
    while !(closed(&mut strangers[0]) && closed(&mut strangers[1])) {
        b.progress().expect("rank 1 progress");
        assert!(start.elapsed() < LIMIT, "the oldest strangers stay");
    }
    for (k, s) in strangers.iter_mut().enumerate().skip(2) {
        assert!(!closed(s), "stranger {k} was closed, not one of the oldest");
    }
    assert_eq!(b.waiting_connections(), 4);
    let mut a = TcpTransport::new(0, cfg()).expect("rank 0");
    join(&mut a, &mut b);
}

#[test]
fn limits_of_zero_are_refused() {
    let mut b = TcpTransport::new(1, cfg()).expect("rank 1");
    for limits in [
        AcceptLimits {
            max_pending: 0,
            ..AcceptLimits::default()
        },
        AcceptLimits {
            hello_deadline: Duration::ZERO,
            ..AcceptLimits::default()
        },
    ] {
        let e = b.set_accept_limits(limits).unwrap_err().to_string();
        assert!(e.contains("accept limits"), "{e}");
    }
}

// ---- a rank process short of descriptors ----

/// The child rank: rank 1, with `RLIMIT_NOFILE` lowered to the number in
/// `CHILD_ENV` (only when run by a test below, with that variable set).
#[test]
fn child_rank() {
    let Ok(nofile) = std::env::var(CHILD_ENV) else {
        return;
    };
    let nofile: u64 = nofile.parse().expect("GW_LISTENER_CHILD_NOFILE");
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to write into and read from.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = nofile;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0, "setrlimit");
    }
    let mut t = TcpTransport::new(1, cfg()).expect("rank 1");
    t.set_accept_limits(AcceptLimits {
        hello_deadline: CHILD_DEADLINE,
        ..AcceptLimits::default()
    })
    .expect("limits");
    println!("gw: listening {}", t.listen_addr());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    let mut words = line.split_whitespace().skip(1);
    let peer: SocketAddr = words.next().expect("address").parse().expect("address");
    let frames: u32 = words.next().expect("frames").parse().expect("frames");
    let frame_bytes: u32 = words.next().expect("frame bytes").parse().expect("bytes");
    let theirs = gw_rendezvous::peers::Eager {
        frames,
        frame_bytes,
        ..Default::default()
    };
    t.set_peers(infos([peer, t.listen_addr()], [theirs, t.eager()]));
    let most = std::cell::Cell::new(0);
    let step = |t: &mut TcpTransport, what: &str, start: Instant| {
        t.progress()
            .unwrap_or_else(|e| panic!("rank 1, {what}: {e}"));
        most.set(most.get().max(t.waiting_connections()));
        assert!(start.elapsed() < LIMIT, "rank 1: {what} timed out");
    };
    let start = Instant::now();
    while t.connect(0).expect("connect") != Readiness::Ready {
        step(&mut t, "connecting", start);
    }
    let src = pattern(LEN, 1);
    let mut dst = vec![0u8; LEN];
    let mut bye = [0u8; 4];
    // SAFETY: the buffers outlive t, dropped at the end of this function.
    let (ms, md, mb) = unsafe {
        (
            t.register(src.as_ptr().cast_mut(), LEN).expect("register"),
            t.register(dst.as_mut_ptr(), LEN).expect("register"),
            t.register(bye.as_mut_ptr(), 4).expect("register"),
        )
    };
    let mut reqs = vec![
        Outstanding::new(t.isend(0, tag(1), ms, 0, LEN).expect("isend")),
        Outstanding::new(t.irecv(0, tag(0), md, 0, LEN).expect("irecv")),
    ];
    let mut last = Outstanding::new(t.irecv(0, tag(2), mb, 0, 4).expect("irecv"));
    let start = Instant::now();
    while !reqs.is_empty() {
        step(&mut t, "exchanging", start);
        reqs.retain_mut(|r| !r.poll(&mut t).expect("request"));
    }
    assert!(dst == pattern(LEN, 0), "rank 1 got wrong bytes");
    // Kept going (closing strangers) until rank 0 saw them all closed.
    let start = Instant::now();
    while !last.poll(&mut t).expect("request") {
        step(&mut t, "waiting for rank 0 to finish", start);
    }
    assert!(most.get() <= 64, "{} connections waited", most.get());
    println!("gw: ok, at most {} strangers held", most.get());
}

struct Rank1 {
    proc: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Rank1 {
    fn spawn(nofile: u32) -> Rank1 {
        let exe = std::env::current_exe().expect("current_exe");
        let mut proc = Command::new(exe)
            .args(["--exact", "child_rank", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, nofile.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning rank 1");
        let stdin = proc.stdin.take().expect("stdin");
        let out = proc.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // The harness prints "test child_rank ... " ahead of it.
                if let Some(at) = line.find("gw: ")
                    && tx.send(line[at + 4..].to_string()).is_err()
                {
                    break;
                }
            }
        });
        Rank1 { proc, stdin, lines }
    }

    fn line(&mut self) -> String {
        self.lines
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("rank 1 said nothing ({:?})", self.proc.try_wait()))
    }

    fn alive(&mut self) {
        if let Ok(Some(st)) = self.proc.try_wait() {
            panic!("rank 1 exited early: {st}");
        }
    }
}

impl Drop for Rank1 {
    fn drop(&mut self) {
        if let Ok(None) = self.proc.try_wait() {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}

/// Rank 1 runs with `nofile` descriptors. 120 strangers connect before it
/// accepts anything, then rank 0 dials, then 30 more strangers come. Rank 1
/// connects, exchanges 1 MiB each way, and closes every stranger while it
/// runs.
fn flood(nofile: u32) {
    let mut child = Rank1::spawn(nofile);
    let line = child.line();
    let addr: SocketAddr = line
        .strip_prefix("listening ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("rank 1 said {line:?}"));
    // Within the listen backlog (128): none of these waits for an accept.
    let mut strangers: Vec<TcpStream> = (0..120).map(|_| connect_silently(addr)).collect();
    let mut a = TcpTransport::new(0, cfg()).expect("rank 0");
    let e = a.eager();
    writeln!(
        child.stdin,
        "peer {} {} {}",
        a.listen_addr(),
        e.frames,
        e.frame_bytes
    )
    .expect("writing to rank 1");
    child.stdin.flush().expect("writing to rank 1");
    // Rank 1's own eager settings are the defaults, as rank 0's.
    a.set_peers(infos([a.listen_addr(), addr], [e, e]));
    let start = Instant::now();
    while a.connect(1).expect("connect") != Readiness::Ready {
        child.alive();
        assert!(start.elapsed() < LIMIT, "rank 0 could not connect");
    }
    // These wait for accepts when the backlog is full: not on this thread.
    let late =
        std::thread::spawn(move || (0..30).map(|_| connect_silently(addr)).collect::<Vec<_>>());
    let src = pattern(LEN, 0);
    let mut dst = vec![0u8; LEN];
    let bye = [1u8; 4];
    // SAFETY: the buffers outlive a, dropped at the end of this function.
    let (ms, md, mb) = unsafe {
        (
            a.register(src.as_ptr().cast_mut(), LEN).expect("register"),
            a.register(dst.as_mut_ptr(), LEN).expect("register"),
            a.register(bye.as_ptr().cast_mut(), 4).expect("register"),
        )
    };
    let mut reqs = vec![
        Outstanding::new(a.isend(1, tag(0), ms, 0, LEN).expect("isend")),
        Outstanding::new(a.irecv(1, tag(1), md, 0, LEN).expect("irecv")),
    ];
    let start = Instant::now();
    while !reqs.is_empty() {
        child.alive();
        a.progress().expect("rank 0 progress");
        reqs.retain_mut(|r| !r.poll(&mut a).expect("request"));
        assert!(start.elapsed() < LIMIT, "the exchange did not complete");
    }
    assert!(dst == pattern(LEN, 1), "rank 0 got wrong bytes");
    strangers.extend(late.join().expect("the late strangers"));
    assert_eq!(strangers.len(), 150);
    let start = Instant::now();
    let mut open: Vec<usize> = (0..strangers.len()).collect();
    while !open.is_empty() {
        child.alive();
        a.progress().expect("rank 0 progress");
        open.retain(|&k| !closed(&mut strangers[k]));
        assert!(
            start.elapsed() < CHILD_DEADLINE + LIMIT,
            "{} strangers are still connected to rank 1",
            open.len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut last = Outstanding::new(a.isend(1, tag(2), mb, 0, 4).expect("isend"));
    let start = Instant::now();
    while !last.poll(&mut a).expect("request") {
        a.progress().expect("rank 0 progress");
        assert!(start.elapsed() < LIMIT, "the last message did not go");
    }
    let said = child.line();
    assert!(said.starts_with("ok"), "rank 1 said {said:?}");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.proc.try_wait().expect("waitpid") {
            break st;
        }
        assert!(start.elapsed() < LIMIT, "rank 1 did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "rank 1: {status}");
}

/// 96 descriptors: the cap of 64 waiting connections holds before they run
/// out.
#[test]
fn a_rank_with_96_descriptors_outlasts_150_silent_connections() {
    flood(96);
}

/// 40 descriptors: they run out before the cap, and `accept`'s `EMFILE`
/// closes the oldest stranger instead of ending the communicator.
#[test]
fn a_rank_out_of_descriptors_sheds_strangers_and_carries_on() {
    flood(40);
}
