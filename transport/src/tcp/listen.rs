//! The data plane's listening socket, and the connections taken from it
//! that have not said who they are yet.
//!
//! Anyone who can reach the port can connect, long before the job key in a
//! hello can be checked, so what a stranger makes this rank hold must be
//! bounded and must never end the job: a connection that has not sent its
//! whole hello within the hello deadline is closed; at most `max_pending`
//! such connections are held, and past that the oldest is closed; and a
//! failed `accept` (out of descriptors, a connection aborted before it was
//! taken) costs strangers their place, not the communicator. Only an error
//! that says the listener itself is broken is fatal.

use super::lane::HELLO_LEN;
use crate::error::{Error, Result};
use gw_rendezvous::ratelimit::{RateLimited, suppressed};
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What a rank's listener lets strangers hold (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptLimits {
    /// How long an accepted connection may take to send its hello. A peer
    /// rank writes it as soon as its connect completes, so this only has
    /// to cover a loaded host.
    pub hello_deadline: Duration,
    /// Connections waiting for their hello at once; at least 1.
    pub max_pending: usize,
}

impl Default for AcceptLimits {
    fn default() -> Self {
        AcceptLimits {
            hello_deadline: Duration::from_secs(10),
            max_pending: 64,
        }
    }
}

/// Accepts per progress call: a stranger connecting as fast as this rank
/// accepts must not keep one call from returning to the job's own work.
const ACCEPTS_PER_CALL: usize = 64;

/// How long accepting pauses when descriptors ran out and no waiting
/// connection could be closed to free one. The listener stays readable
/// meanwhile, so retrying at once would only spin on the same error.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// How often waiting connections are read for their hello. Each costs a
/// read per look, and progress is called in a spin: looked at every time,
/// 64 strangers would make every call 64 system calls slower. A peer
/// rank's hello is mostly taken at accept already.
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// Warnings about strangers: one per this interval, the next one counting
/// those left out, so that a flood does not fill the log.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// An accepted connection whose hello has come in whole.
pub(crate) struct Hailed {
    pub sock: TcpStream,
    pub addr: SocketAddr,
    pub hello: [u8; HELLO_LEN],
}

/// An accepted connection still waiting for its hello.
struct Waiting {
    sock: TcpStream,
    addr: SocketAddr,
    buf: [u8; HELLO_LEN],
    got: usize,
    since: Instant,
}

/// What reading a waiting connection's hello came to.
enum Heard {
    Whole,
    Partial,
    /// Closed or failed; the text says how, for the log.
    Gone(String),
}

impl Waiting {
    fn read(&mut self) -> Heard {
        loop {
            match self.sock.read(&mut self.buf[self.got..]) {
                Ok(0) => return Heard::Gone("closed before its hello".into()),
                Ok(n) => {
                    self.got += n;
                    if self.got == HELLO_LEN {
                        return Heard::Whole;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Heard::Partial,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Heard::Gone(format!("failed before its hello: {e}")),
            }
        }
    }
}

pub(crate) struct Listener {
    sock: TcpListener,
    addr: SocketAddr,
    limits: AcceptLimits,
    /// Oldest first, which is the order they are shed in.
    waiting: VecDeque<Waiting>,
    /// Connections may wait in the kernel's queue. Readiness is edge
    /// triggered, so this stays set until `accept` says the queue is empty.
    readable: bool,
    /// Accepting pauses until then (see [`RETRY_AFTER`]).
    retry_at: Option<Instant>,
    /// Waiting connections are read again from then on (see [`LOOK_EVERY`]).
    next_look: Instant,
    warned: Warned,
}

/// The listener's warnings, at most one per [`WARN_EVERY`] (strangers can
/// cause them), through the project's one limiter.
struct Warned(RateLimited);

impl Warned {
    fn warn(&mut self, text: impl FnOnce() -> String) {
        if let Some(n) = self.0.admit() {
            tracing::warn!("tcp: {}{}", text(), suppressed(n));
        }
    }
}

impl Listener {
    pub fn bind(at: SocketAddr) -> Result<Listener> {
        let sock = TcpListener::bind(at)
            .map_err(|e| Error::sys("bind", format!("data-plane listener on {at}"), e))?;
        let addr = sock
            .local_addr()
            .map_err(|e| Error::sys("getsockname", "data-plane listener", e))?;
        Ok(Listener {
            sock,
            addr,
            limits: AcceptLimits::default(),
            waiting: VecDeque::new(),
            readable: true,
            retry_at: None,
            next_look: Instant::now(),
            warned: Warned(RateLimited::new(WARN_EVERY)),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_limits(&mut self, limits: AcceptLimits) -> Result<()> {
        if limits.max_pending == 0 || limits.hello_deadline.is_zero() {
            return Err(Error::Config(format!(
                "data-plane accept limits need at least one pending connection and a nonzero hello deadline, got {limits:?}"
            )));
        }
        self.limits = limits;
        while self.waiting.len() > limits.max_pending {
            self.shed_oldest("the limit of waiting connections was lowered");
        }
        Ok(())
    }

    pub fn register(&mut self, reg: &Registry, token: Token) -> Result<()> {
        reg.register(&mut self.sock, token, Interest::READABLE)
            .map_err(|e| Error::sys("epoll_ctl", "registering the TCP listener", e))
    }

    /// The poller reported the listener readable.
    pub fn mark_readable(&mut self) {
        self.readable = true;
    }

    /// Whether a progress call has anything to do here.
    pub fn busy(&self) -> bool {
        self.readable || !self.waiting.is_empty()
    }

    /// Connections accepted and waiting for their hello now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Accepts what waits in the kernel's queue and reads hellos; appends
    /// the connections whose hello is whole to `out`. Returns whether
    /// anything moved. `unpolled`: no poller reports readiness, so the
    /// queue is looked at every time.
    pub fn progress(&mut self, out: &mut Vec<Hailed>, unpolled: bool) -> Result<bool> {
        self.readable |= unpolled;
        let now = Instant::now();
        let mut moved = self.accept(now, out)?;
        if now < self.next_look {
            return Ok(moved);
        }
        self.next_look = now + LOOK_EVERY;
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &mut self.waiting[i];
            match w.read() {
                Heard::Whole => {
                    if let Some(w) = self.waiting.remove(i) {
                        out.push(hailed(w));
                    }
                    moved = true;
                }
                Heard::Gone(how) => {
                    let addr = w.addr;
                    self.warned.warn(|| format!("connection from {addr} {how}"));
                    self.waiting.remove(i);
                    moved = true;
                }
                Heard::Partial if now.duration_since(w.since) >= self.limits.hello_deadline => {
                    let (addr, got) = (w.addr, w.got);
                    let deadline = self.limits.hello_deadline;
                    self.warned.warn(|| format!(
                        "closed the connection from {addr}: no hello within {deadline:?} ({got} of {HELLO_LEN} bytes came)"
                    ));
                    self.waiting.remove(i);
                    moved = true;
                }
                Heard::Partial => i += 1,
            }
        }
        Ok(moved)
    }

    fn accept(&mut self, now: Instant, out: &mut Vec<Hailed>) -> Result<bool> {
        if !self.readable || self.retry_at.is_some_and(|t| now < t) {
            return Ok(false);
        }
        self.retry_at = None;
        let mut moved = false;
        for _ in 0..ACCEPTS_PER_CALL {
            match self.sock.accept() {
                Ok((sock, addr)) => {
                    moved = true;
                    let mut w = Waiting {
                        sock,
                        addr,
                        buf: [0; HELLO_LEN],
                        got: 0,
                        since: now,
                    };
                    // A peer rank's hello is usually in already: taken now,
                    // it never competes with strangers for a place.
                    match w.read() {
                        Heard::Whole => out.push(hailed(w)),
                        Heard::Gone(how) => {
                            self.warned.warn(|| format!("connection from {addr} {how}"))
                        }
                        Heard::Partial => {
                            if self.waiting.len() == self.limits.max_pending {
                                self.shed_oldest(&format!(
                                    "{} connections were already waiting for their hello",
                                    self.limits.max_pending
                                ));
                            }
                            self.waiting.push_back(w);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if out_of_descriptors(&e) => {
                    if self.waiting.is_empty() {
                        let at = self.addr;
                        self.warned.warn(|| format!(
                            "accept on the data-plane listener {at}: {e}; trying again in {RETRY_AFTER:?}"
                        ));
                        self.retry_at = Some(now + RETRY_AFTER);
                        break;
                    }
                    // The connection in the queue may be a peer rank's:
                    // a stranger's descriptor is worth less.
                    self.shed_oldest(&format!("accept ran out of descriptors ({e})"));
                    moved = true;
                }
                Err(e) if connection_failed(&e) => {
                    let at = self.addr;
                    self.warned.warn(|| format!(
                        "accept on the data-plane listener {at}: a connection failed before it was taken: {e}"
                    ));
                }
                Err(e) => {
                    return Err(Error::sys(
                        "accept",
                        format!("data-plane listener {}", self.addr),
                        e,
                    ));
                }
            }
        }
        Ok(moved)
    }

    fn shed_oldest(&mut self, why: &str) {
        if let Some(w) = self.waiting.pop_front() {
            self.warned.warn(|| {
                format!(
                    "closed the connection from {} ({} of {HELLO_LEN} hello bytes after {:?}): {why}",
                    w.addr,
                    w.got,
                    w.since.elapsed()
                )
            });
        }
    }
}

fn hailed(w: Waiting) -> Hailed {
    Hailed {
        sock: w.sock,
        addr: w.addr,
        hello: w.buf,
    }
}

/// `accept` failed for want of descriptors or memory, which closing
/// connections gives back.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// `accept` failed because of one connection, not the listener: accept(2)
/// says to treat these like `EAGAIN` and try again.
fn connection_failed(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EPROTO
                | libc::EPERM
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
                | libc::ETIMEDOUT
        )
    )
}
