//! Wakeups for shared memory: one datagram socket per rank.
//!
//! A peer writing into shared memory raises no poller event by itself, so each
//! rank binds a Unix datagram socket at an abstract address (named from the
//! job's name secret, see `names.rs`) and registers it with the engine's
//! `mio::Poll`. A side that finds its partner asleep (a flag in the ring
//! header) sends it one byte. Abstract addresses leave no file behind and
//! vanish with the process. Any local process can send to one; a stray
//! byte only wakes the engine to look at its rings, which it then finds as
//! they were.

use super::names::doorbell_name;
use crate::error::{Error, Result};
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The doorbell address of `rank` for the job's name `secret` (abstract namespace).
pub(crate) fn doorbell_addr(secret: &str, rank: u32) -> Result<SocketAddr> {
    let name = doorbell_name(secret, rank);
    SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| Error::sys("socket address", format!("abstract name {name:?}"), e))
}

/// This rank's doorbell: a socket to send rings from, and (once attached)
/// the bound socket that receives them.
#[derive(Debug)]
pub(crate) struct Doorbell {
    sender: UnixDatagram,
    bound: Option<mio::net::UnixDatagram>,
    warned: bool,
}

impl Doorbell {
    pub(crate) fn new() -> Result<Doorbell> {
        let sender =
            UnixDatagram::unbound().map_err(|e| Error::sys("socket", "shm doorbell sender", e))?;
        sender
            .set_nonblocking(true)
            .map_err(|e| Error::sys("fcntl", "shm doorbell sender non-blocking", e))?;
        Ok(Doorbell {
            sender,
            bound: None,
            warned: false,
        })
    }

    /// Whether peers can wake us.
    pub(crate) fn is_attached(&self) -> bool {
        self.bound.is_some()
    }

    /// Binds our address and registers it readable at `token`.
    pub(crate) fn attach(
        &mut self,
        addr: &SocketAddr,
        registry: &mio::Registry,
        token: mio::Token,
    ) -> Result<()> {
        if self.bound.is_some() {
            return Err(Error::InvalidUsage(
                "shm transport is already attached to a poller".into(),
            ));
        }
        let sock = UnixDatagram::bind_addr(addr).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AddrInUse {
                " (this rank was started twice, or another process took the name)"
            } else {
                ""
            };
            Error::sys("bind", format!("shm doorbell {addr:?}{hint}"), e)
        })?;
        sock.set_nonblocking(true)
            .map_err(|e| Error::sys("fcntl", "shm doorbell non-blocking", e))?;
        let mut sock = mio::net::UnixDatagram::from_std(sock);
        registry
            .register(&mut sock, token, mio::Interest::READABLE)
            .map_err(|e| Error::sys("epoll_ctl", "registering the shm doorbell", e))?;
        self.bound = Some(sock);
        Ok(())
    }

    /// Sends one wakeup byte to `addr`, best effort: a full queue (the peer
    /// is already being woken) or an unbound peer (it polls) are fine.
    pub(crate) fn ring(&mut self, addr: &SocketAddr) {
        match self.sender.send_to_addr(&[1], addr) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused
                ) || e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(
                        "shm doorbell {addr:?}: sendto failed: {e}; the peer will notice data only when it polls"
                    );
                }
            }
        }
    }

    /// Reads every pending wakeup byte.
    pub(crate) fn drain(&mut self) -> Result<()> {
        let Some(sock) = &self.bound else {
            return Ok(());
        };
        let mut buf = [0u8; 64];
        loop {
            match sock.recv(&mut buf) {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::sys("recv", "draining the shm doorbell", e)),
            }
        }
    }
}
