//! What a stranger can make the rendezvous store hold: a stranger here is
//! anything that reaches the port without the job token, and it must neither
//! make the store buffer its bytes, nor hold every connection slot, nor stop
//! a real job from coming up. Real sockets on loopback and, for memory, the
//! store in its own process, measured from the kernel's view of it.

use gw_rendezvous::store::codec::{
    Decoder, Limits, MAX_HELLO_BODY, Message, PROTOCOL_VERSION, Request, Response,
};
use gw_rendezvous::{StoreClient, StoreConfig, StoreServer};
use socket2::{Domain, Socket, Type};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "admission-test-token";

/// A TCP connection to `dst` from the loopback address `src`, so that one
/// test can play several hosts (Linux routes all of 127/8 to `lo`).
fn connect_from(src: Ipv4Addr, dst: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::from((src, 0)).into())
        .unwrap_or_else(|e| panic!("bind {src}: {e}"));
    s.connect(&dst.into())
        .unwrap_or_else(|e| panic!("connect {src} -> {dst}: {e}"));
    let t = TcpStream::from(s);
    t.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("SO_RCVTIMEO");
    t
}

/// What a client heard from the store first.
#[derive(Debug)]
enum Heard {
    Frame(Response),
    /// The store closed (or reset) the connection without a whole frame.
    Closed,
    /// Nothing within the socket's read timeout.
    Silent,
}

fn first_response(t: &mut TcpStream) -> Heard {
    let mut dec = Decoder::<Response>::new(Limits::default());
    let mut buf = [0u8; 4096];
    for _ in 0..1000 {
        match dec.next_frame() {
            Ok(Some(r)) => return Heard::Frame(r),
            Ok(None) => {}
            Err(e) => panic!("the store sent a frame that does not decode: {e}"),
        }
        match t.read(&mut buf) {
            Ok(0) => return Heard::Closed,
            Ok(n) => dec.push(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Heard::Silent;
            }
            Err(_) => return Heard::Closed,
        }
    }
    panic!("no complete frame in 1000 reads");
}

/// Checks that the store ended a stranger that never sent its Hello.
fn closed_for_want_of_a_token(t: &mut TcpStream) {
    match first_response(t) {
        Heard::Frame(Response::Refused(m)) => assert!(m.contains("no job token within"), "{m}"),
        Heard::Closed => {}
        h => panic!("an idle stranger heard {h:?}"),
    }
}

fn hello() -> Vec<u8> {
    Request::Hello {
        version: PROTOCOL_VERSION,
        token: TOKEN.into(),
    }
    .encode()
    .expect("encode Hello")
}

/// A 16 MiB pre-Hello `Wait` for 4 Mi empty keys, within the store's caps
/// for an authenticated client: decoded, it would cost 96 MiB of `String`s.
fn wait_frame_16_mib() -> Vec<u8> {
    let keys = 4usize << 20;
    let body = 1 + 8 + 4 + 4 * keys;
    let mut f = Vec::with_capacity(4 + body);
    f.extend_from_slice(&(body as u32).to_le_bytes());
    f.push(0x04);
    f.extend_from_slice(&60_000u64.to_le_bytes());
    f.extend_from_slice(&(keys as u32).to_le_bytes());
    f.resize(4 + body, 0);
    f
}

#[test]
fn pre_hello_frame_over_the_hello_cap_is_refused_before_its_body() {
    let s = StoreServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        TOKEN,
        StoreConfig::default(),
    )
    .expect("start store");
    let frame = wait_frame_16_mib();
    let mut t = connect_from(Ipv4Addr::LOCALHOST, s.local_addr());
    t.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("SO_RCVTIMEO");
    t.set_write_timeout(Some(Duration::from_secs(20)))
        .expect("SO_SNDTIMEO");
    // Exactly as much as the largest Hello: the refusal must come without
    // another byte.
    t.write_all(&frame[..4 + MAX_HELLO_BODY])
        .expect("send the first 4 KiB");
    match first_response(&mut t) {
        Heard::Frame(Response::Refused(m)) => assert!(m.contains("before authentication"), "{m}"),
        other => panic!("expected a refusal before the body, got {other:?}"),
    }
    // The store has closed: the other 16 MiB cannot be delivered.
    assert!(t.write_all(&frame[4 + MAX_HELLO_BODY..]).is_err());
    let mut c = StoreClient::connect(
        &s.local_addr().to_string(),
        TOKEN,
        Instant::now() + Duration::from_secs(30),
    )
    .expect("a real client still gets in");
    c.set("k", b"v").expect("set");
    assert_eq!(c.get("k").expect("get"), Some(b"v".to_vec()));
}

#[test]
fn waiting_connections_are_capped_per_address_and_a_real_client_still_gets_in() {
    let auth = Duration::from_secs(2);
    let s = StoreServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        TOKEN,
        StoreConfig {
            auth_timeout: auth,
            max_unauthenticated_per_ip: 4,
            ..StoreConfig::default()
        },
    )
    .expect("start store");
    let addr = s.local_addr();
    let mut idle: Vec<TcpStream> = (0..4)
        .map(|_| connect_from(Ipv4Addr::LOCALHOST, addr))
        .collect();
    // The fifth from the same address is turned away at once, and told why.
    let mut fifth = connect_from(Ipv4Addr::LOCALHOST, addr);
    match first_response(&mut fifth) {
        Heard::Frame(Response::Busy(m)) => assert!(m.contains("127.0.0.1"), "{m}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    // Another host is not held up by them.
    let mut other = connect_from(Ipv4Addr::new(127, 0, 0, 2), addr);
    other.write_all(&hello()).expect("send Hello");
    assert!(matches!(
        first_response(&mut other),
        Heard::Frame(Response::Welcome { .. })
    ));
    // A real client on the crowded address retries through Busy until the
    // idle ones have used up their time to authenticate.
    let t0 = Instant::now();
    let mut c = StoreClient::connect(&addr.to_string(), TOKEN, t0 + Duration::from_secs(60))
        .expect("the client retries until a slot frees");
    c.set("k", b"v").expect("set");
    for t in &mut idle {
        closed_for_want_of_a_token(t);
    }
}

/// Set in the environment of the child that runs the store for
/// [`a_real_job_starts_beside_200_idle_strangers_and_16_mib_pre_hello_frames`].
const CHILD: &str = "GW_TEST_STORE_ADMISSION_CHILD";
const PORT_LINE: &str = "store-port=";
/// How long the child store gives a connection to present the token.
const AUTH: Duration = Duration::from_secs(10);
/// How far the store's peak resident memory may rise over the whole scenario.
/// 200 waiting connections cost a thread stack's touched pages and a 4 KiB
/// buffer each; a stranger's frame costs at most one Hello.
const RSS_BOUND_KIB: u64 = 32 * 1024;

/// Kills the child store if the test fails before it is shut down.
struct Store(Child);

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn store_child() -> ! {
    let cfg = StoreConfig {
        auth_timeout: AUTH,
        ..StoreConfig::default()
    };
    let s = StoreServer::start("127.0.0.1:0".parse().expect("addr"), TOKEN, cfg)
        .expect("start store in the child");
    // Straight to the descriptor: the test harness may capture `println!`.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{PORT_LINE}{}", s.local_addr().port()).expect("write the port line");
    out.flush().expect("flush the port line");
    drop(out);
    // Serve until the parent closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    s.shutdown();
    std::process::exit(0);
}

fn spawn_store() -> (Store, SocketAddr) {
    let exe = std::env::current_exe().expect("current_exe");
    let child = Command::new(exe)
        .args([
            "--exact",
            "a_real_job_starts_beside_200_idle_strangers_and_16_mib_pre_hello_frames",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the store process");
    let mut store = Store(child);
    let out = store.0.stdout.take().expect("child stdout");
    // Read on a thread, so that a child that never names its port is a
    // timeout here rather than a hang.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().take(100) {
            let Ok(line) = line else { break };
            // The harness prints the test's name on the same line, first.
            if let Some((_, p)) = line.split_once(PORT_LINE) {
                let _ = tx.send(p.trim().parse::<u16>());
                return;
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(port)) => (store, SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
        other => panic!("the store process did not name its port within 60 s: {other:?}"),
    }
}

/// Peak resident memory of `pid`, from the kernel (`VmHWM`, KiB).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"))
}

/// What a rank does at bring-up: claim its rank, publish, wait for all.
fn rank(addr: SocketAddr, me: usize, world: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut c = StoreClient::connect(&addr.to_string(), TOKEN, deadline)
        .unwrap_or_else(|e| panic!("rank {me}: {e}"));
    let claims = c.add(&format!("claim/{me}"), 1).expect("claim");
    assert_eq!(claims, 1, "rank {me} claimed twice");
    c.set(&format!("peer/{me}"), format!("rank {me}").as_bytes())
        .expect("publish");
    let keys: Vec<String> = (0..world).map(|r| format!("peer/{r}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    c.wait(&keys, deadline)
        .unwrap_or_else(|e| panic!("rank {me}: {e}"))
}

#[test]
fn a_real_job_starts_beside_200_idle_strangers_and_16_mib_pre_hello_frames() {
    if std::env::var_os(CHILD).is_some() {
        store_child();
    }
    let (mut store, addr) = spawn_store();
    let pid = store.0.id();
    let before = peak_rss_kib(pid);
    // 200 strangers that connect and say nothing, from four hosts (50 each,
    // under the per-address cap on waiting connections).
    let idle: Vec<TcpStream> = (0..200u8)
        .map(|i| connect_from(Ipv4Addr::new(127, 0, 0, 2 + i % 4), addr))
        .collect();
    // Two strangers that each send a 16 MiB frame instead of a Hello.
    let attackers: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut t = connect_from(Ipv4Addr::new(127, 0, 0, 9), addr);
                t.set_write_timeout(Some(Duration::from_secs(30)))
                    .expect("SO_SNDTIMEO");
                // Whether it all goes through is the store's choice.
                let _ = t.write_all(&wait_frame_16_mib());
                first_response(&mut t)
            })
        })
        .collect();
    let world = 8;
    let t0 = Instant::now();
    let ranks: Vec<_> = (0..world)
        .map(|me| std::thread::spawn(move || rank(addr, me, world)))
        .collect();
    for (me, r) in ranks.into_iter().enumerate() {
        let vals = r.join().expect("rank thread");
        assert_eq!(vals.len(), world, "rank {me}");
        assert_eq!(vals[3], b"rank 3".to_vec(), "rank {me}");
    }
    let startup = t0.elapsed();
    // The job did not have to wait for the strangers to age out.
    assert!(startup < AUTH, "start-up took {startup:?}");
    for a in attackers {
        match a.join().expect("attacker thread") {
            Heard::Frame(Response::Refused(m)) => {
                assert!(m.contains("before authentication"), "{m}")
            }
            // Closing on unread bytes resets, which may drop the refusal.
            Heard::Closed => {}
            h => panic!("a 16 MiB stranger heard {h:?}"),
        }
    }
    let grew = peak_rss_kib(pid).saturating_sub(before);
    assert!(
        grew <= RSS_BOUND_KIB,
        "store's peak RSS grew by {grew} KiB (bound {RSS_BOUND_KIB} KiB)"
    );
    // Every idle stranger is closed once its time to authenticate is up.
    let deadline = Instant::now() + AUTH + Duration::from_secs(30);
    for mut t in idle {
        let left = deadline.saturating_duration_since(Instant::now());
        t.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("SO_RCVTIMEO");
        closed_for_want_of_a_token(&mut t);
    }
    eprintln!("store peak RSS grew by {grew} KiB; job start-up took {startup:?}");
    drop(store.0.stdin.take());
    let status = store.0.wait().expect("wait for the store process");
    assert!(status.success(), "store process: {status}");
}
