//! The store's client: blocking calls over one TCP connection.
//!
//! Bring-up code runs before anything else works, so its failures must be
//! unmistakable: every call has a deadline turned into socket timeouts (a dead
//! or wedged server is an error, never a hang), errors name the store's
//! address, and a timed-out `wait` names the keys that never appeared, which
//! is usually the list of ranks that did not start.
//!
//! A store at its connection cap answers `Busy` (or, racing with our Hello,
//! just closes); the client then reconnects with backoff until its deadline,
//! so a job whose ranks all arrive at once still comes up.

use super::codec::{
    Decoder, Limits, MAX_TOKEN_BYTES, Message, PROTOCOL_VERSION, Request, Response,
};
use crate::error::{Error, Result};
use std::io::{self, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Deadline of calls that do not take one (everything but `connect` and `wait`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The server answers a `wait` at the deadline it was sent; allow this much
/// for that reply to arrive before calling the server dead.
const WAIT_GRACE: Duration = Duration::from_secs(5);
/// The hello exchange gets at least this long even if the connect deadline is
/// nearly spent, so a short deadline does not fail a healthy but busy server.
const HELLO_MIN: Duration = Duration::from_secs(2);
/// Upper bound of a single connect attempt, so an unroutable address is
/// retried instead of eating the whole deadline in one SYN timeout.
const ATTEMPT_MAX: Duration = Duration::from_secs(5);
const READ_CHUNK: usize = 64 * 1024;
/// Stand-in for "forever" where a deadline must be an `Instant`.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// First and longest pause between reconnects (unreachable or busy store).
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// A blocking connection to a [`super::StoreServer`].
pub struct StoreClient {
    addr: String,
    stream: TcpStream,
    dec: Decoder<Response>,
    buf: Vec<u8>,
    timeout: Duration,
    /// Set once a call fails mid-exchange: a late reply could then be taken
    /// for the answer to the next request, so the connection is not reused.
    broken: Option<String>,
}

impl StoreClient {
    /// Connects to `addr` ("host:port"), retrying until `deadline` while the
    /// server is not up yet, and presents `token`.
    pub fn connect(addr: &str, token: &str, deadline: Instant) -> Result<StoreClient> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Error::InvalidArgument(format!(
                "store job token of {} bytes exceeds {MAX_TOKEN_BYTES}",
                token.len()
            )));
        }
        let mut retry = Retry::new(deadline);
        loop {
            match Self::connect_once(addr, token, deadline)? {
                Ok(c) => return Ok(c),
                Err(reason) => retry.after_failure(|n| {
                    format!(
                        "connecting to the rendezvous store at {addr}: turned away {n} times; last: {reason}"
                    )
                })?,
            }
        }
    }

    /// One connection and Hello. The inner `Err` is a turn-away worth
    /// retrying (the store is busy), with the store's reason.
    fn connect_once(
        addr: &str,
        token: &str,
        deadline: Instant,
    ) -> Result<std::result::Result<StoreClient, String>> {
        let stream = connect_with_retry(addr, deadline)?;
        stream
            .set_nodelay(true)
            .map_err(|e| Error::sys("setsockopt", format!("TCP_NODELAY to store at {addr}"), e))?;
        let mut c = StoreClient {
            addr: addr.to_owned(),
            stream,
            dec: Decoder::new(Limits::default()),
            buf: vec![0u8; READ_CHUNK],
            timeout: DEFAULT_TIMEOUT,
            broken: None,
        };
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            token: token.to_owned(),
        };
        let hello_deadline = deadline.max(Instant::now() + HELLO_MIN);
        let reply = match c.call(&hello, hello_deadline) {
            Ok(r) => r,
            // A busy store may close before our Hello arrives, and the close
            // then resets the connection, taking its `Busy` reply with it.
            Err(e) if turned_away(&e) => return Ok(Err(e.to_string())),
            Err(e) => return Err(e),
        };
        match reply {
            Response::Busy(reason) => Ok(Err(reason)),
            Response::Welcome {
                max_key_bytes,
                max_value_bytes,
            } => {
                c.dec.set_limits(Limits {
                    max_key_bytes: usize::try_from(max_key_bytes).unwrap_or(usize::MAX),
                    max_value_bytes: usize::try_from(max_value_bytes).unwrap_or(usize::MAX),
                });
                Ok(Ok(c))
            }
            Response::Refused(reason) => Err(Error::Store(format!("{addr} refused: {reason}"))),
            other => Err(c.unexpected(&hello, other)),
        }
    }

    /// The address this client was given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The server's caps, learnt when connecting.
    pub fn limits(&self) -> Limits {
        self.dec.limits()
    }

    /// Changes the deadline of calls that do not take one (default 60 s).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.check_key(key)?;
        let max = self.limits().max_value_bytes;
        if value.len() > max {
            return Err(Error::InvalidArgument(format!(
                "store value for key {key:?} is {} bytes; the store at {} accepts at most {max}",
                value.len(),
                self.addr
            )));
        }
        let req = Request::Set {
            key: key.to_owned(),
            value: value.to_vec(),
        };
        match self.call_default(&req)? {
            Response::Ok => Ok(()),
            other => Err(self.answer_error(&req, other)),
        }
    }

    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        self.check_key(key)?;
        let req = Request::Get {
            key: key.to_owned(),
        };
        match self.call_default(&req)? {
            Response::Value(v) => Ok(v),
            other => Err(self.answer_error(&req, other)),
        }
    }

    /// Blocks until every key exists or `deadline`; returns values in order.
    /// On timeout: `Error::Timeout` whose message lists the missing keys.
    pub fn wait(&mut self, keys: &[&str], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let start = Instant::now();
        let req = Request::Wait {
            keys: self.check_keys(keys)?,
            timeout_ms: u64::try_from(deadline.saturating_duration_since(start).as_millis())
                .unwrap_or(u64::MAX),
        };
        let reply_deadline = deadline
            .max(start)
            .checked_add(WAIT_GRACE)
            .unwrap_or(deadline);
        match self.call(&req, reply_deadline)? {
            Response::Values(v) if v.len() == keys.len() => Ok(v),
            Response::TimedOut { missing } => Err(Error::Timeout {
                secs: start.elapsed().as_secs_f64(),
                what: format!(
                    "waiting for keys in the store at {}; still missing: {}",
                    self.addr,
                    missing.join(", ")
                ),
            }),
            other => Err(self.answer_error(&req, other)),
        }
    }

    /// Which of `keys` exist now (no blocking).
    pub fn check(&mut self, keys: &[&str]) -> Result<Vec<bool>> {
        let req = Request::Check {
            keys: self.check_keys(keys)?,
        };
        match self.call_default(&req)? {
            Response::Exists(v) if v.len() == keys.len() => Ok(v),
            other => Err(self.answer_error(&req, other)),
        }
    }

    /// Atomically adds `delta` to the counter at `key` (missing counts as 0,
    /// stored as decimal text) and returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        self.check_key(key)?;
        let req = Request::Add {
            key: key.to_owned(),
            delta,
        };
        match self.call_default(&req)? {
            Response::Counter(n) => Ok(n),
            other => Err(self.answer_error(&req, other)),
        }
    }

    /// Removes `key`; returns whether it existed.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        self.check_key(key)?;
        let req = Request::Delete {
            key: key.to_owned(),
        };
        match self.call_default(&req)? {
            Response::Deleted(d) => Ok(d),
            other => Err(self.answer_error(&req, other)),
        }
    }

    fn check_key(&self, key: &str) -> Result<()> {
        let max = self.limits().max_key_bytes;
        if key.len() > max {
            return Err(Error::InvalidArgument(format!(
                "store key of {} bytes exceeds the store's limit of {max}",
                key.len()
            )));
        }
        Ok(())
    }

    fn check_keys(&self, keys: &[&str]) -> Result<Vec<String>> {
        let mut size = 4usize;
        for k in keys {
            self.check_key(k)?;
            size = size.saturating_add(4 + k.len());
        }
        // The server caps a key list at one value's size (see codec).
        let max = self.limits().max_value_bytes.saturating_add(4);
        if size > max {
            return Err(Error::InvalidArgument(format!(
                "{} store keys ({size} bytes encoded) exceed the store's limit of {max} bytes per request",
                keys.len()
            )));
        }
        Ok(keys.iter().map(|k| (*k).to_owned()).collect())
    }

    /// Turns a reply other than the expected one into an error. The server's
    /// own `Error` leaves the connection usable; anything else means the two
    /// sides are out of step, so the connection is retired.
    fn answer_error(&mut self, req: &Request, resp: Response) -> Error {
        match resp {
            Response::Error(m) => {
                Error::Store(format!("{}: {} failed: {m}", self.addr, req.name()))
            }
            other => self.unexpected(req, other),
        }
    }

    fn unexpected(&mut self, req: &Request, resp: Response) -> Error {
        let e = Error::Protocol(format!(
            "store at {} answered {} with an unexpected {}",
            self.addr,
            req.name(),
            resp.name()
        ));
        self.broken = Some(e.to_string());
        e
    }

    fn call_default(&mut self, req: &Request) -> Result<Response> {
        let now = Instant::now();
        // `set_timeout(Duration::MAX)` means "no practical limit", not a panic.
        let deadline = now.checked_add(self.timeout).unwrap_or(now + FAR);
        self.call(req, deadline)
    }

    fn call(&mut self, req: &Request, deadline: Instant) -> Result<Response> {
        if let Some(why) = &self.broken {
            return Err(Error::Store(format!(
                "connection to {} is unusable after an earlier failure ({why}); reconnect",
                self.addr
            )));
        }
        let r = self.exchange(req, deadline);
        if let Err(e) = &r {
            self.broken = Some(e.to_string());
        }
        r
    }

    fn exchange(&mut self, req: &Request, deadline: Instant) -> Result<Response> {
        let start = Instant::now();
        let bytes = req.encode()?;
        let name = req.name();
        let timeout = |what: String| Error::Timeout {
            secs: start.elapsed().as_secs_f64(),
            what,
        };
        self.stream
            .set_write_timeout(Some(left(deadline)))
            .map_err(|e| Error::sys("setsockopt", format!("store at {}", self.addr), e))?;
        if let Err(e) = crate::nosignal::send_all(&self.stream, &bytes) {
            return Err(if is_timeout(&e) {
                timeout(format!("sending {name} to the store at {}", self.addr))
            } else {
                Error::sys("send", format!("{name} to the store at {}", self.addr), e)
            });
        }
        loop {
            match self.dec.next_frame() {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => {
                    return Err(Error::Protocol(format!(
                        "reply from the store at {}: {e}",
                        self.addr
                    )));
                }
            }
            self.stream
                .set_read_timeout(Some(left(deadline)))
                .map_err(|e| Error::sys("setsockopt", format!("store at {}", self.addr), e))?;
            match self.stream.read(&mut self.buf) {
                Ok(0) => {
                    return Err(Error::Store(format!(
                        "connection to {} {CLOSED_BY_SERVER} while waiting for the reply to {name}",
                        self.addr
                    )));
                }
                Ok(n) => self.dec.push(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {
                    return Err(timeout(format!(
                        "waiting for the reply to {name} from the store at {}",
                        self.addr
                    )));
                }
                Err(e) => {
                    return Err(Error::sys(
                        "recv",
                        format!("reply to {name} from the store at {}", self.addr),
                        e,
                    ));
                }
            }
        }
    }
}

/// Whether a failed Hello looks like a store that closed on us before
/// answering (what a busy store does when our Hello races its close).
fn turned_away(e: &Error) -> bool {
    match e {
        Error::Sys { source, .. } => matches!(
            source.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        ),
        Error::Store(m) => m.contains(CLOSED_BY_SERVER),
        _ => false,
    }
}

const CLOSED_BY_SERVER: &str = "closed by the server";

/// Time to `deadline` as a socket timeout, which must be non-zero.
fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Connects to `addr`, retrying every failure until `deadline`: in bring-up
/// the store's process may simply not be listening (or resolvable) yet. At
/// least one attempt is made even if the deadline has passed.
fn connect_with_retry(addr: &str, deadline: Instant) -> Result<TcpStream> {
    let mut retry = Retry::new(deadline);
    let mut last = String::from("no attempt made");
    loop {
        match addr.to_socket_addrs() {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(Error::InvalidArgument(format!(
                    "store address {addr:?} is not host:port: {e}"
                )));
            }
            Err(e) => last = format!("cannot resolve: {e}"),
            Ok(candidates) => {
                for sa in candidates {
                    let t = deadline
                        .saturating_duration_since(Instant::now())
                        .clamp(Duration::from_millis(100), ATTEMPT_MAX);
                    match TcpStream::connect_timeout(&sa, t) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = format!("{sa}: {e}"),
                    }
                }
            }
        }
        retry.after_failure(|n| {
            format!(
                "connecting to the rendezvous store at {addr} ({n} attempts; last error: {last})"
            )
        })?;
    }
}

/// Paces the retries of one `connect` up to its deadline, with doubling
/// pauses so a store that is slow to start or busy is not hammered.
struct Retry {
    start: Instant,
    deadline: Instant,
    backoff: Duration,
    failures: u32,
}

impl Retry {
    fn new(deadline: Instant) -> Self {
        Retry {
            start: Instant::now(),
            deadline,
            backoff: BACKOFF_MIN,
            failures: 0,
        }
    }

    /// Counts a failed try and pauses before the next one; past the
    /// deadline, the timeout instead, described by `what(failures so far)`.
    fn after_failure(&mut self, what: impl FnOnce(u32) -> String) -> Result<()> {
        self.failures += 1;
        let now = Instant::now();
        if now >= self.deadline {
            return Err(Error::Timeout {
                secs: self.start.elapsed().as_secs_f64(),
                what: what(self.failures),
            });
        }
        std::thread::sleep(self.backoff.min(self.deadline - now));
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{StoreConfig, StoreServer};
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn free_port() -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    #[test]
    fn store_unreachable_error_names_the_address() {
        let addr = free_port().to_string();
        let t0 = Instant::now();
        let err = StoreClient::connect(&addr, "t", Instant::now() + Duration::from_millis(300))
            .err()
            .unwrap();
        let el = t0.elapsed();
        assert!(
            el >= Duration::from_millis(290) && el < Duration::from_secs(3),
            "{el:?}"
        );
        let msg = err.to_string();
        assert!(matches!(err, Error::Timeout { .. }), "{msg}");
        assert!(msg.contains(&addr), "{msg}");
        assert!(msg.contains("attempts"), "{msg}");
    }

    #[test]
    fn store_connect_with_past_deadline_still_tries_once() {
        let addr = free_port().to_string();
        let err = StoreClient::connect(&addr, "t", Instant::now())
            .err()
            .unwrap();
        assert!(err.to_string().contains("1 attempts"), "{err}");
    }

    #[test]
    fn store_malformed_address_is_invalid_argument() {
        let err =
            StoreClient::connect("no-port-here", "t", Instant::now() + Duration::from_secs(5))
                .err()
                .unwrap();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("no-port-here"), "{err}");
    }

    #[test]
    fn store_connect_retries_until_the_server_starts() {
        let addr = free_port();
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            StoreServer::start(addr, "tok", StoreConfig::default())
        });
        let mut c = StoreClient::connect(
            &addr.to_string(),
            "tok",
            Instant::now() + Duration::from_secs(10),
        )
        .unwrap();
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
        let s = server.join().unwrap().unwrap();
        s.shutdown();
    }

    /// A fake server that welcomes the client and then never answers.
    #[test]
    fn store_silent_server_is_a_timeout_not_a_hang() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf);
            let w = Response::Welcome {
                max_key_bytes: 64,
                max_value_bytes: 64,
            };
            s.write_all(&w.encode().unwrap()).unwrap();
            // Hold the connection open, silently, until the client gives up.
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
            }
        });
        let mut c =
            StoreClient::connect(&addr, "t", Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(c.limits().max_value_bytes, 64);
        assert!(matches!(
            c.set("k", &[0; 65]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            c.get(&"k".repeat(65)),
            Err(Error::InvalidArgument(_))
        ));
        c.set_timeout(Duration::from_millis(200));
        let t0 = Instant::now();
        let err = c.get("k").unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(err.to_string().contains(&addr), "{err}");
        // A late reply could now be misattributed: the connection is retired.
        let err = c.get("k").unwrap_err();
        assert!(err.to_string().contains("unusable"), "{err}");
        drop(c);
        fake.join().unwrap();
    }

    #[test]
    fn store_empty_wait_and_check() {
        let s = StoreServer::start("127.0.0.1:0".parse().unwrap(), "t", StoreConfig::default())
            .unwrap();
        let mut c = StoreClient::connect(
            &s.local_addr().to_string(),
            "t",
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(c.wait(&[], Instant::now()).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(c.check(&[]).unwrap(), Vec::<bool>::new());
        // A wait whose deadline has passed still reports keys that exist.
        c.set("k", b"1").unwrap();
        assert_eq!(c.wait(&["k"], Instant::now()).unwrap(), vec![b"1".to_vec()]);
    }
}
