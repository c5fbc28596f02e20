//! The store's server: one accept thread and one thread per connection.
//!
//! A job has a handful of clients (one per rank, a launcher), so blocking
//! threads are simpler and easier to reason about than an event loop. The
//! server's job beyond answering requests is to stay up: whatever one client
//! sends (garbage, an oversized value, half a frame) ends only that client's
//! connection, and refusals are logged with the peer's address because a
//! refused rank is usually a misconfigured launch that someone must find.
//!
//! Strangers are kept cheap: [`super::admission`] caps the connections, and
//! until a connection presents the job token the server reads no more than
//! one Hello's worth of its bytes, gives it `auth_timeout` for the whole
//! Hello, and logs refusals at most once a second (with a count of the rest).
//!
//! Shutdown must never wait on a client: the accept thread is woken through a
//! mio waker, connection threads blocked in `read` are woken by shutting their
//! sockets down, and threads parked in a server-side `wait` by the condvar.

use super::StoreConfig;
use super::admission::{Admission, Ticket};
use super::codec::{Decoder, MAX_HELLO_BODY, Message, PROTOCOL_VERSION, Request, Response};
use crate::error::{Error, Result};
use crate::ratelimit::{RateLimited, suppressed};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{info, warn};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// How often a server-side `wait` looks up from the condvar to see whether its
/// client is still there, so an abandoned wait does not pin a thread until
/// the client's (possibly very long) deadline.
const WAIT_POLL: Duration = Duration::from_millis(250);
/// A client that stops reading its replies must not pin its thread forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait a client may ask for; keeps `Instant` arithmetic in range
/// whatever the peer sends.
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
const READ_CHUNK: usize = 64 * 1024;
/// Refusals of strangers logged at most this often; the next line counts the
/// ones left out.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(1);
/// What [`read_request`] reports when its deadline passes.
const TIMED_OUT: &str = "timed out";

/// A running store. Dropping it shuts it down.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    waker: Arc<Waker>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    token: Vec<u8>,
    cfg: StoreConfig,
    data: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stopping: AtomicBool,
    conns: Mutex<Conns>,
    admission: Arc<Admission>,
    refusals: Mutex<RateLimited>,
}

#[derive(Default)]
struct Conns {
    next_id: u64,
    /// Clones of the live sockets, so that shutdown can wake their readers.
    open: HashMap<u64, TcpStream>,
    threads: Vec<JoinHandle<()>>,
}

/// Poisoning only means another connection's thread panicked; the map itself
/// is never left half-updated, so keep serving.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StoreServer {
    /// Binds `bind` (port 0 picks one) and serves on background threads.
    pub fn start(bind: SocketAddr, token: &str, cfg: StoreConfig) -> Result<StoreServer> {
        cfg.validate()?;
        if token.len() > super::codec::MAX_TOKEN_BYTES {
            return Err(Error::InvalidArgument(format!(
                "store job token of {} bytes exceeds {}",
                token.len(),
                super::codec::MAX_TOKEN_BYTES
            )));
        }
        if token.is_empty() {
            warn!(
                "store: starting without a job token; any process that can reach {bind} may join"
            );
        }
        let ctx = || format!("rendezvous store on {bind}");
        let std_listener = TcpListener::bind(bind).map_err(|e| Error::sys("bind", ctx(), e))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| Error::sys("getsockname", ctx(), e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| Error::sys("fcntl", ctx(), e))?;
        let mut listener = mio::net::TcpListener::from_std(std_listener);
        let poll = Poll::new().map_err(|e| Error::sys("epoll_create", ctx(), e))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(|e| Error::sys("epoll_ctl", ctx(), e))?;
        let waker = Arc::new(
            Waker::new(poll.registry(), WAKER).map_err(|e| Error::sys("eventfd", ctx(), e))?,
        );
        let shared = Arc::new(Shared {
            token: token.as_bytes().to_vec(),
            data: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            conns: Mutex::new(Conns::default()),
            admission: Admission::new(cfg.max_connections, cfg.max_unauthenticated_per_ip),
            refusals: Mutex::new(RateLimited::new(REFUSAL_LOG_PERIOD)),
            cfg,
        });
        let sh = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("gw-store-accept".into())
            .spawn(move || accept_loop(&sh, poll, listener))
            .map_err(|e| Error::sys("pthread_create", ctx(), e))?;
        info!("store: serving on {addr}");
        Ok(StoreServer {
            addr,
            shared,
            waker,
            accept: Some(accept),
        })
    }

    /// The address actually bound (with the picked port).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection and joins all threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Err(e) = self.waker.wake() {
            warn!("store: cannot wake the accept thread: {e}");
        }
        let _ = accept.join();
        {
            // Taking the lock orders this notify after any waiter's check of
            // `stopping`, so no waiter can miss it.
            let _g = lock(&self.shared.data);
            self.shared.changed.notify_all();
        }
        let threads = {
            let mut c = lock(&self.shared.conns);
            for s in c.open.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut c.threads)
        };
        for t in threads {
            let _ = t.join();
        }
        info!("store: stopped serving on {}", self.addr);
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(shared: &Arc<Shared>, mut poll: Poll, listener: mio::net::TcpListener) {
    let mut events = Events::with_capacity(8);
    while !shared.stopping.load(Ordering::SeqCst) {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            warn!("store: epoll_wait failed, no longer accepting connections: {e}");
            return;
        }
        // Readiness is edge-triggered: drain the backlog before polling again.
        while !shared.stopping.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, peer)) => admit(shared, stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Usually EMFILE; the pending connection stays queued, so
                    // back off and retry rather than spin or lose the edge.
                    warn!("store: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

fn admit(shared: &Arc<Shared>, stream: mio::net::TcpStream, peer: SocketAddr) {
    let stream = TcpStream::from(OwnedFd::from(stream));
    let ticket = match shared.admission.admit(peer.ip()) {
        Ok(t) => t,
        Err(reason) => {
            // Still non-blocking: a reply this small fits in the socket's
            // buffer, and the accept thread must never wait on a stranger.
            if let Ok(bytes) = Response::Busy(reason.clone()).encode() {
                let _ = crate::nosignal::send(&stream, &bytes);
            }
            log_refusal(shared, peer, &reason);
            return;
        }
    };
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
        .and_then(|()| stream.try_clone());
    let clone = match setup {
        Ok(c) => c,
        Err(e) => {
            warn!("store: cannot set up connection from {peer}: {e}");
            return;
        }
    };
    let mut conns = lock(&shared.conns);
    if shared.stopping.load(Ordering::SeqCst) {
        return;
    }
    // Join threads of connections that have ended so handles don't pile up
    // over a long job.
    let (done, live): (Vec<_>, Vec<_>) = std::mem::take(&mut conns.threads)
        .into_iter()
        .partition(|t| t.is_finished());
    conns.threads = live;
    for t in done {
        let _ = t.join();
    }
    let id = conns.next_id;
    conns.next_id += 1;
    let sh = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("gw-store-conn".into())
        .spawn(move || serve(&sh, stream, peer, id, ticket));
    match spawned {
        Ok(t) => {
            conns.open.insert(id, clone);
            conns.threads.push(t);
        }
        Err(e) => warn!("store: cannot start a thread for {peer}: {e}"),
    }
}

/// Logs a refused stranger, at most once per [`REFUSAL_LOG_PERIOD`]: each
/// refusal is one connection anyone can open, so unthrottled lines would let
/// any process fill the job's output.
fn log_refusal(shared: &Shared, peer: SocketAddr, reason: &str) {
    if let Some(n) = lock(&shared.refusals).admit() {
        warn!(
            "store: refused connection from {peer}: {reason}{}",
            suppressed(n)
        );
    }
}

fn serve(shared: &Shared, mut stream: TcpStream, peer: SocketAddr, id: u64, ticket: Ticket) {
    // The accept thread records this connection (and may grow its tables)
    // while holding `conns`; waiting for it here keeps that bookkeeping
    // ahead of the Welcome, like everything else the store does for it.
    drop(lock(&shared.conns));
    match session(shared, &mut stream, peer, ticket) {
        Ok(()) => info!("store: client {peer} disconnected"),
        Err(End::Refused(reason)) => log_refusal(shared, peer, &reason),
        Err(End::Dropped(reason)) => {
            if !shared.stopping.load(Ordering::SeqCst) {
                warn!("store: dropped client {peer}: {reason}");
            }
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
    // Closing our clone too is what lets the peer see the connection end.
    lock(&shared.conns).open.remove(&id);
}

/// Why a session ended early (already answered on the wire where possible).
enum End {
    Refused(String),
    Dropped(String),
}

fn session(
    shared: &Shared,
    stream: &mut TcpStream,
    peer: SocketAddr,
    mut ticket: Ticket,
) -> Result<(), End> {
    let mut dec = Decoder::<Request>::hello_only(shared.cfg.limits());
    // A stranger gets a Hello-sized buffer; the full one comes with the token.
    let mut buf = vec![0u8; 4 + MAX_HELLO_BODY];
    let auth_deadline = Instant::now() + shared.cfg.auth_timeout;
    let refuse = |stream: &mut TcpStream, reason: String| {
        let _ = send(stream, &Response::Refused(reason.clone()));
        Err(End::Refused(reason))
    };
    let hello = read_request(stream, &mut dec, &mut buf, Some(auth_deadline));
    ticket.hello_done();
    match hello {
        Ok(Some(Request::Hello { version, token })) => {
            if version != PROTOCOL_VERSION {
                return refuse(
                    stream,
                    format!(
                        "store protocol version {version}, this store speaks {PROTOCOL_VERSION}"
                    ),
                );
            }
            if !ct_eq(token.as_bytes(), &shared.token) {
                return refuse(stream, "wrong job token".into());
            }
        }
        Ok(Some(other)) => {
            return refuse(
                stream,
                format!(
                    "missing job token (first request was {}, not Hello)",
                    other.name()
                ),
            );
        }
        Ok(None) => return Err(End::Refused("closed before presenting a job token".into())),
        Err(reason) if reason == TIMED_OUT => {
            let t = shared.cfg.auth_timeout;
            return refuse(stream, format!("no job token within {t:?}"));
        }
        Err(reason) => return refuse(stream, format!("no valid job token: {reason}")),
    }
    // Everything this connection sets up is done before the Welcome: once
    // the client has it, its rank goes on to train, and a store hosted in
    // the rank's own process must not be allocating while it does (the
    // process-wide no_alloc test saw this 64 KiB buffer land in its window).
    dec.authenticated();
    buf.resize(READ_CHUNK, 0);
    // Authenticated clients may sit idle for the whole job; shutdown wakes
    // them by closing the socket, not by a timeout.
    stream
        .set_read_timeout(None)
        .map_err(|e| End::Dropped(format!("setsockopt: {e}")))?;
    info!("store: client {peer} joined");
    let limits = shared.cfg.limits();
    send(
        stream,
        &Response::Welcome {
            max_key_bytes: limits.max_key_bytes as u64,
            max_value_bytes: limits.max_value_bytes as u64,
        },
    )
    .map_err(End::Dropped)?;
    loop {
        let req = match read_request(stream, &mut dec, &mut buf, None) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(reason) => {
                let _ = send(stream, &Response::Error(reason.clone()));
                return Err(End::Dropped(reason));
            }
        };
        let Some(resp) = handle(shared, req, stream) else {
            return Err(End::Dropped("went away during a wait".into()));
        };
        send(stream, &resp).map_err(End::Dropped)?;
    }
}

/// Reads until one request is decoded. `Ok(None)` is a clean close between
/// frames; a close inside a frame is an error.
fn read_request(
    stream: &mut TcpStream,
    dec: &mut Decoder<Request>,
    buf: &mut [u8],
    deadline: Option<Instant>,
) -> Result<Option<Request>, String> {
    loop {
        match dec.next_frame() {
            Ok(Some(r)) => return Ok(Some(r)),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        if let Some(d) = deadline {
            // The deadline bounds the whole frame, not each read, so a peer
            // trickling one byte at a time cannot hold the slot open.
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TIMED_OUT.into());
            }
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| format!("setsockopt: {e}"))?;
        }
        // Before authentication read no further than the Hello could reach,
        // so a stranger's bytes beyond it are never taken in.
        let want = dec.read_budget().unwrap_or(buf.len()).clamp(1, buf.len());
        match stream.read(&mut buf[..want]) {
            Ok(0) if dec.is_mid_frame() => {
                return Err("disconnected in the middle of a request".into());
            }
            Ok(0) => return Ok(None),
            Ok(n) => dec.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(TIMED_OUT.into());
            }
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
}

fn send(stream: &mut TcpStream, resp: &Response) -> Result<(), String> {
    let bytes = match resp.encode() {
        Ok(b) => b,
        Err(e) => Response::Error(format!("reply does not fit in a frame: {e}"))
            .encode()
            .map_err(|e| e.to_string())?,
    };
    crate::nosignal::send_all(stream, &bytes).map_err(|e| format!("write failed: {e}"))
}

/// Answers one request. `None` means the client left while we waited for it.
fn handle(shared: &Shared, req: Request, stream: &TcpStream) -> Option<Response> {
    Some(match req {
        Request::Hello { .. } => Response::Error("already authenticated".into()),
        Request::Set { key, value } => {
            lock(&shared.data).insert(key, value);
            shared.changed.notify_all();
            Response::Ok
        }
        Request::Get { key } => Response::Value(lock(&shared.data).get(&key).cloned()),
        Request::Check { keys } => {
            let data = lock(&shared.data);
            Response::Exists(keys.iter().map(|k| data.contains_key(k)).collect())
        }
        Request::Add { key, delta } => add(shared, key, delta),
        Request::Delete { key } => Response::Deleted(lock(&shared.data).remove(&key).is_some()),
        Request::Wait { keys, timeout_ms } => return wait(shared, &keys, timeout_ms, stream),
    })
}

fn add(shared: &Shared, key: String, delta: i64) -> Response {
    let mut data = lock(&shared.data);
    let old = match data.get(&key) {
        None => 0,
        Some(v) => match std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
        {
            Some(n) => n,
            None => {
                return Response::Error(format!(
                    "add on key {key:?}: its value is not a decimal integer"
                ));
            }
        },
    };
    let Some(new) = old.checked_add(delta) else {
        return Response::Error(format!("add on key {key:?}: {old} + {delta} overflows i64"));
    };
    let text = new.to_string().into_bytes();
    if text.len() > shared.cfg.max_value_bytes {
        return Response::Error(format!(
            "add on key {key:?}: result exceeds max_value_bytes"
        ));
    }
    data.insert(key, text);
    shared.changed.notify_all();
    Response::Counter(new)
}

fn wait(shared: &Shared, keys: &[String], timeout_ms: u64, stream: &TcpStream) -> Option<Response> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms).min(MAX_WAIT);
    let mut data = lock(&shared.data);
    loop {
        if keys.iter().all(|k| data.contains_key(k)) {
            let vals = keys.iter().filter_map(|k| data.get(k).cloned()).collect();
            return Some(Response::Values(vals));
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return Some(Response::Error("store is shutting down".into()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let missing = keys
                .iter()
                .filter(|k| !data.contains_key(*k))
                .cloned()
                .collect();
            return Some(Response::TimedOut { missing });
        }
        let (guard, res) = shared
            .changed
            .wait_timeout(data, left.min(WAIT_POLL))
            .unwrap_or_else(|e| e.into_inner());
        data = guard;
        if res.timed_out() {
            drop(data);
            if peer_closed(stream) {
                return None;
            }
            data = lock(&shared.data);
        }
    }
}

/// Whether the client hung up, without consuming anything it sent. Pipelined
/// bytes mean it is still there.
fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let r = stream.peek(&mut [0u8; 1]);
    let _ = stream.set_nonblocking(false);
    match r {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Token comparison whose time does not depend on where the first differing
/// byte is, so the token cannot be guessed byte by byte from response times.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, &x) in a.iter().enumerate() {
        // Index `b` modulo its length so the loop does the same work whatever
        // the contents; a length mismatch is already recorded above.
        let y = if b.is_empty() { 0 } else { b[i % b.len()] };
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::super::codec::{Decoder, HEADER_LEN, Limits};
    use super::super::{StoreClient, StoreConfig};
    use super::*;
    use std::io::Write;
    use std::sync::mpsc;

    const TOKEN: &str = "job-secret-42";

    fn start() -> StoreServer {
        start_with(StoreConfig::default())
    }

    fn start_with(cfg: StoreConfig) -> StoreServer {
        StoreServer::start("127.0.0.1:0".parse().unwrap(), TOKEN, cfg).unwrap()
    }

    fn soon(secs: u64) -> Instant {
        Instant::now() + Duration::from_secs(secs)
    }

    fn client(s: &StoreServer) -> StoreClient {
        StoreClient::connect(&s.local_addr().to_string(), TOKEN, soon(5)).unwrap()
    }

    fn raw(s: &StoreServer) -> TcpStream {
        let t = TcpStream::connect(s.local_addr()).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        t
    }

    fn raw_hello(s: &StoreServer) -> TcpStream {
        let mut t = raw(s);
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            token: TOKEN.into(),
        };
        t.write_all(&hello.encode().unwrap()).unwrap();
        assert!(matches!(
            read_responses(&mut t).first(),
            Some(Response::Welcome { .. })
        ));
        t
    }

    /// Reads frames until the server closes the connection or goes quiet.
    fn read_responses(t: &mut TcpStream) -> Vec<Response> {
        let mut dec = Decoder::<Response>::new(Limits::default());
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            while let Ok(Some(r)) = dec.next_frame() {
                let welcome = matches!(r, Response::Welcome { .. });
                out.push(r);
                if welcome {
                    return out;
                }
            }
            match t.read(&mut buf) {
                Ok(0) | Err(_) => return out,
                Ok(n) => dec.push(&buf[..n]),
            }
        }
    }

    /// Whether the server closed `t` (EOF) within the read timeout.
    fn closed_by_server(t: &mut TcpStream) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match t.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => return e.kind() == io::ErrorKind::ConnectionReset,
            }
        }
    }

    fn still_serves(s: &StoreServer) {
        let mut c = client(s);
        c.set("alive", b"yes").unwrap();
        assert_eq!(c.get("alive").unwrap().as_deref(), Some(&b"yes"[..]));
    }

    #[test]
    fn store_set_get_add_delete_check() {
        let s = start();
        let mut c = client(&s);
        assert_eq!(c.addr(), s.local_addr().to_string());
        assert_eq!(c.get("a").unwrap(), None);
        c.set("a", b"hello").unwrap();
        assert_eq!(c.get("a").unwrap(), Some(b"hello".to_vec()));
        c.set("a", b"").unwrap();
        assert_eq!(c.get("a").unwrap(), Some(vec![]));
        assert_eq!(c.check(&["a", "b"]).unwrap(), vec![true, false]);
        assert_eq!(c.add("n", 5).unwrap(), 5);
        assert_eq!(c.add("n", -7).unwrap(), -2);
        assert_eq!(c.get("n").unwrap(), Some(b"-2".to_vec()));
        assert!(c.delete("n").unwrap());
        assert!(!c.delete("n").unwrap());
        assert_eq!(c.check(&["n"]).unwrap(), vec![false]);
        // A second client sees the first one's writes.
        let mut d = client(&s);
        assert_eq!(d.get("a").unwrap(), Some(vec![]));
        assert_eq!(d.wait(&["a"], soon(1)).unwrap(), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn store_add_on_non_integer_is_an_error_and_connection_survives() {
        let s = start();
        let mut c = client(&s);
        c.set("x", b"not a number").unwrap();
        let err = c.add("x", 1).unwrap_err();
        assert!(matches!(err, Error::Store(_)), "{err}");
        assert!(err.to_string().contains("not a decimal integer"), "{err}");
        c.set("m", i64::MAX.to_string().as_bytes()).unwrap();
        assert!(c.add("m", 1).unwrap_err().to_string().contains("overflows"));
        assert_eq!(c.add("y", 3).unwrap(), 3);
    }

    #[test]
    fn store_wait_returns_when_another_client_sets_later() {
        let s = start();
        let addr = s.local_addr().to_string();
        let setter = std::thread::spawn(move || {
            let mut c = StoreClient::connect(&addr, TOKEN, soon(5)).unwrap();
            std::thread::sleep(Duration::from_millis(150));
            c.set("rank/1", b"10.0.0.2:4000").unwrap();
            std::thread::sleep(Duration::from_millis(100));
            c.set("rank/2", b"10.0.0.3:4000").unwrap();
        });
        let mut c = client(&s);
        c.set("rank/0", b"10.0.0.1:4000").unwrap();
        let t0 = Instant::now();
        let vals = c.wait(&["rank/0", "rank/1", "rank/2"], soon(10)).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert_eq!(
            vals,
            vec![
                b"10.0.0.1:4000".to_vec(),
                b"10.0.0.2:4000".to_vec(),
                b"10.0.0.3:4000".to_vec()
            ]
        );
        setter.join().unwrap();
    }

    #[test]
    fn store_wait_timeout_lists_missing_keys() {
        let s = start();
        let mut c = client(&s);
        c.set("rank/0", b"x").unwrap();
        let t0 = Instant::now();
        let err = c
            .wait(
                &["rank/0", "rank/1", "rank/2"],
                Instant::now() + Duration::from_millis(300),
            )
            .unwrap_err();
        let el = t0.elapsed();
        assert!(
            el >= Duration::from_millis(280) && el < Duration::from_secs(3),
            "{el:?}"
        );
        let msg = err.to_string();
        assert!(matches!(err, Error::Timeout { .. }), "{msg}");
        assert!(msg.contains("rank/1") && msg.contains("rank/2"), "{msg}");
        assert!(!msg.contains("rank/0"), "{msg}");
        // The connection is still usable after a timed-out wait.
        assert_eq!(c.get("rank/0").unwrap(), Some(b"x".to_vec()));
    }

    #[test]
    fn store_wrong_token_is_refused_and_server_keeps_serving() {
        let s = start();
        let err = StoreClient::connect(&s.local_addr().to_string(), "other-job", soon(5))
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(matches!(err, Error::Store(_)), "{msg}");
        assert!(msg.contains("refused: wrong job token"), "{msg}");
        assert!(msg.contains(&s.local_addr().to_string()), "{msg}");
        still_serves(&s);
    }

    #[test]
    fn store_request_before_hello_is_refused() {
        let s = start();
        let mut t = raw(&s);
        t.write_all(&Request::Get { key: "a".into() }.encode().unwrap())
            .unwrap();
        match read_responses(&mut t).as_slice() {
            [Response::Refused(m)] => assert!(m.contains("missing job token"), "{m}"),
            other => panic!("{other:?}"),
        }
        still_serves(&s);
    }

    #[test]
    fn store_silent_connection_is_dropped_after_auth_timeout() {
        let s = start_with(StoreConfig {
            auth_timeout: Duration::from_millis(200),
            ..StoreConfig::default()
        });
        let mut t = raw(&s);
        // Half a hello, then nothing.
        t.write_all(&[9, 0, 0]).unwrap();
        let t0 = Instant::now();
        assert!(closed_by_server(&mut t));
        assert!(t0.elapsed() < Duration::from_secs(3));
        still_serves(&s);
    }

    #[test]
    fn store_garbage_does_not_hurt_other_clients() {
        let s = start();
        let mut good = client(&s);
        good.set("k", b"v").unwrap();
        // Before authenticating.
        let mut t = raw(&s);
        t.write_all(&[0xde, 0xad, 0xbe, 0xef, 0x00, 0x13, 0x37])
            .unwrap();
        assert!(closed_by_server(&mut t));
        // After authenticating: an unknown tag.
        let mut t = raw_hello(&s);
        t.write_all(&[3, 0, 0, 0, 0x7e, 1, 2]).unwrap();
        match read_responses(&mut t).as_slice() {
            [Response::Error(m)] => assert!(m.contains("unknown request tag"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(good.get("k").unwrap(), Some(b"v".to_vec()));
        still_serves(&s);
    }

    #[test]
    fn store_oversized_value_drops_only_that_client() {
        let s = start_with(StoreConfig {
            max_value_bytes: 1024,
            ..StoreConfig::default()
        });
        let mut good = client(&s);
        let mut t = raw_hello(&s);
        // Announce a 1 GiB Set; only the header is sent, which must suffice.
        let mut hdr = (1u32 << 30).to_le_bytes().to_vec();
        hdr.push(0x02);
        t.write_all(&hdr).unwrap();
        match read_responses(&mut t).as_slice() {
            [Response::Error(m)] => assert!(m.contains("exceeds"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A frame within the Set cap (the key is short) whose value is one
        // byte over: refused on the value's length, before the value.
        let mut t = raw_hello(&s);
        let f = Request::Set {
            key: "k".into(),
            value: vec![0; 1025],
        }
        .encode()
        .unwrap();
        t.write_all(&f[..HEADER_LEN + 4 + 1 + 4]).unwrap();
        match read_responses(&mut t).as_slice() {
            [Response::Error(m)] => assert!(m.contains("value of 1025 bytes"), "{m}"),
            other => panic!("{other:?}"),
        }
        good.set("k", &[1; 1024]).unwrap();
        assert_eq!(good.get("k").unwrap(), Some(vec![1; 1024]));
        // The client refuses an oversized value itself, with the server's cap.
        let err = good.set("k", &[1; 1025]).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_eq!(good.get("k").unwrap(), Some(vec![1; 1024]));
    }

    #[test]
    fn store_disconnect_mid_frame_does_not_hurt_other_clients() {
        let s = start();
        let mut good = client(&s);
        {
            let mut t = raw_hello(&s);
            let f = Request::Set {
                key: "half".into(),
                value: vec![5; 1000],
            }
            .encode()
            .unwrap();
            t.write_all(&f[..600]).unwrap();
        }
        // And one that leaves in the middle of a wait.
        {
            let mut t = raw_hello(&s);
            let f = Request::Wait {
                keys: vec!["never".into()],
                timeout_ms: 60_000,
            };
            t.write_all(&f.encode().unwrap()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(good.get("half").unwrap(), None);
        still_serves(&s);
        // The abandoned wait's thread notices and ends well before its deadline.
        let t0 = Instant::now();
        // Only `good` should remain.
        while lock(&s.shared.conns).open.len() > 1 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "abandoned wait still running"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn store_concurrent_add_from_8_threads() {
        let s = start();
        let addr = s.local_addr().to_string();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut c = StoreClient::connect(&addr, TOKEN, soon(5)).unwrap();
                    let mut last = 0;
                    for _ in 0..100 {
                        let n = c.add("count", 1).unwrap();
                        assert!(n > last);
                        last = n;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut c = client(&s);
        assert_eq!(c.add("count", 0).unwrap(), 800);
        assert_eq!(c.get("count").unwrap(), Some(b"800".to_vec()));
    }

    #[test]
    fn store_shutdown_wakes_waiting_client() {
        let s = start();
        let mut c = client(&s);
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            tx.send(()).unwrap();
            c.wait(&["never"], soon(60))
        });
        rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        s.shutdown();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(waiter.join().unwrap().is_err());
    }

    #[test]
    fn store_shutdown_with_idle_clients_is_prompt() {
        let s = start();
        let addr = s.local_addr();
        let mut idle = client(&s);
        let _unauthenticated = raw(&s);
        let t0 = Instant::now();
        drop(s);
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(idle.get("a").is_err());
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn store_constant_time_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(ct_eq(b"", b""));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(!ct_eq(b"abcd", b"abc"));
        assert!(!ct_eq(b"", b"a"));
        assert!(!ct_eq(b"a", b""));
    }
}
