//! Socket writes that cannot kill the process.
//!
//! A write to a TCP connection whose peer has died raises `SIGPIPE`, and
//! the signal's default action ends the process. Rust programs ignore it
//! from their first instruction; a C or Python program using gradwire
//! through its C ABI does not, so a dead peer killed the program instead of
//! being reported as a remote error (seen in the C ABI's kill test). Every
//! socket write of the data plane and the store goes through here, with
//! `MSG_NOSIGNAL`: the write fails with `EPIPE` instead.

use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;

/// `writev` without `SIGPIPE`: as many bytes of `bufs` as the socket takes.
pub fn send_vectored(sock: &impl AsRawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is guaranteed ABI-compatible with iovec on Unix; sendmsg only
    // reads through the pointer.
    msg.msg_iov = bufs.as_ptr().cast::<libc::iovec>().cast_mut();
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: msg points at bufs.len() live iovecs for the duration of the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `write` without `SIGPIPE`.
pub fn send(sock: &impl AsRawFd, buf: &[u8]) -> io::Result<usize> {
    send_vectored(sock, &[IoSlice::new(buf)])
}

/// `write_all` without `SIGPIPE`, for blocking sockets (a write timeout
/// shows as `WouldBlock`/`TimedOut`, as with `Write::write_all`).
pub fn send_all(sock: &impl AsRawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match send(sock, buf) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    /// Writing to a connection the peer closed is an error, not a signal:
    /// with SIGPIPE at its default action (as in a C program), a plain
    /// write would end this test process.
    #[test]
    fn a_closed_peer_is_an_error_even_with_sigpipe_at_default() {
        // SAFETY: restoring the default disposition; the test harness and
        // other tests write only to pipes and sockets that stay open.
        let old = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        drop(b);
        let mut err = None;
        for _ in 0..100 {
            match send_all(&a, &[7u8; 4096]) {
                Ok(()) => std::thread::sleep(std::time::Duration::from_millis(5)),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        // SAFETY: puts back what was there.
        unsafe { libc::signal(libc::SIGPIPE, old) };
        let e = err.expect("writes to a closed peer never failed");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }

    #[test]
    fn vectored_sends_arrive_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (mut b, _) = l.accept().expect("accept");
        let n = send_vectored(&a, &[IoSlice::new(b"head"), IoSlice::new(b"-body")]).expect("send");
        assert_eq!(n, 9);
        let mut got = [0u8; 9];
        b.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"head-body");
    }
}
