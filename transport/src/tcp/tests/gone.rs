//! A peer that finished and closed its connection while this rank still
//! owed it a control frame (a `Credit`): the write that finds the socket
//! closed fails nothing, what the peer sent before leaving is still
//! delivered, and a message posted to the peer afterwards fails, naming it.
//! (At 8 ranks, a rank that finished a reduce first and exited made a
//! slower one fail with "Broken pipe" on such a frame.)

use super::*;
use std::os::fd::AsRawFd;

const SIZE: usize = 100;

/// Waits until the socket of `t`'s lane 0 to rank 1 reports one of
/// `events`; false if it never does.
fn socket_reports(t: &TcpTransport, events: i16) -> bool {
    let Some(lane) = t.conns[&1].lanes[0].as_ref() else {
        return false;
    };
    let start = Instant::now();
    while start.elapsed() < LIMIT {
        let mut p = libc::pollfd {
            fd: lane.sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        if unsafe { libc::poll(&mut p, 1, 100) } > 0 && p.revents & events != 0 {
            return true;
        }
    }
    false
}

/// Rank 1 sends `msgs.len()` one-frame messages eagerly, waits until they
/// are written, and leaves (close notice, then the socket is closed), before
/// rank 0 has read any of them. Returns rank 1's address as rank 0 names it.
fn send_and_leave(a: &mut TcpTransport, mut b: TcpTransport, msgs: &[Vec<u8>]) -> String {
    // SAFETY: the vectors outlive b, which is dropped below.
    let mems: Vec<_> = msgs
        .iter()
        .map(|m| unsafe { b.register(m.as_ptr().cast_mut(), m.len()) }.unwrap())
        .collect();
    let mut sends: Vec<_> = mems
        .iter()
        .enumerate()
        .map(|(k, &m)| Outstanding::new(b.isend(0, tag(k as u32), m, 0, SIZE).unwrap()))
        .collect();
    let start = Instant::now();
    while !sends.is_empty() {
        b.progress().unwrap();
        sends.retain_mut(|s| !s.poll(&mut b).unwrap());
        assert!(start.elapsed() < LIMIT, "rank 1's sends never went");
    }
    drop(b);
    // Everything rank 1 wrote is in rank 0's socket once its FIN is.
    assert!(
        socket_reports(a, libc::POLLRDHUP),
        "rank 1's close never reached rank 0"
    );
    a.conns[&1].addr.clone()
}

fn assert_sends_to_rank_1_fail(a: &mut TcpTransport, addr: &str) {
    let buf = [0u8; SIZE];
    // SAFETY: buf outlives the transport's use of it: the send is refused.
    let m = unsafe { a.register(buf.as_ptr().cast_mut(), SIZE) }.unwrap();
    let e = a.isend(1, tag(9), m, 0, SIZE).unwrap_err().to_string();
    assert!(
        e.contains("rank 1") && e.contains(addr) && e.contains("nothing more can be sent"),
        "{e}"
    );
}

/// The flake, step by step. Rank 1 sends two eager messages (all its
/// credits) and leaves. Rank 0 takes the first, and the credit it owes
/// for it goes out on the closed socket, whose answer is a reset. It takes
/// the second from its buffer and owes a credit again: that write fails
/// with `EPIPE`, while nothing is going rank 1's way.
#[test]
fn a_credit_to_a_peer_that_left_fails_nothing() {
    // Frame credits (no small buffers), so that one frame owes a credit
    // frame at once.
    let (mut a, b) = pair_with(TcpConfig {
        lanes: 1,
        eager_frames: 2,
        small_frames: 0,
        ..TcpConfig::default()
    });
    let msgs = [pattern(SIZE, 1), pattern(SIZE, 2)];
    let addr = send_and_leave(&mut a, b, &msgs);
    let mut dst = [vec![0u8; SIZE], vec![0u8; SIZE]];
    // SAFETY: the vectors outlive a.
    let md: Vec<_> = dst
        .iter_mut()
        .map(|d| unsafe { a.register(d.as_mut_ptr(), SIZE) }.unwrap())
        .collect();
    let mut r = Outstanding::new(a.irecv(1, tag(0), md[0], 0, SIZE).unwrap());
    let start = Instant::now();
    while !r.poll(&mut a).unwrap() {
        a.progress().unwrap();
        assert!(start.elapsed() < LIMIT, "the first message never came");
    }
    // The credit for it: written into the closed socket, which resets.
    let start = Instant::now();
    while a.conns[&1].core.owed() > 0
        || a.conns[&1].lanes[0]
            .as_ref()
            .is_some_and(|l| !l.sendq.is_empty())
    {
        a.progress().unwrap();
        assert!(start.elapsed() < LIMIT, "the first credit never went");
    }
    assert!(
        socket_reports(&a, libc::POLLHUP | libc::POLLERR),
        "rank 1's socket did not reset the connection"
    );
    let mut r = Outstanding::new(a.irecv(1, tag(1), md[1], 0, SIZE).unwrap());
    assert!(
        r.poll(&mut a).unwrap(),
        "the second message was not buffered"
    );
    assert_eq!(a.conns[&1].core.owed(), 1, "no second credit is owed");
    // The second credit meets the reset.
    for _ in 0..10 {
        a.progress().unwrap();
    }
    assert_eq!(dst, msgs);
    assert_sends_to_rank_1_fail(&mut a, &addr);
    let e = a.irecv(1, tag(9), md[0], 0, SIZE).unwrap_err().to_string();
    assert!(e.contains("rank 1") && e.contains(&addr), "{e}");
}

/// As above, but when the control frame meets the reset, a receive from
/// the peer is posted and its data sits in this rank's socket: it is still
/// delivered.
#[test]
fn a_receive_whose_data_came_before_the_peer_left_completes() {
    let (mut a, b) = pair_with(TcpConfig {
        lanes: 1,
        ..TcpConfig::default()
    });
    let msgs = [pattern(SIZE, 3)];
    let addr = send_and_leave(&mut a, b, &msgs);
    let credit = a.control(FrameKind::Credit);
    // First control frame: written, answered with a reset. The message's
    // header is read and held back (no receive yet), so the close notice
    // behind it is not read.
    TcpTransport::queue_control(a.conns.get_mut(&1).unwrap(), credit);
    a.progress().unwrap();
    assert!(
        socket_reports(&a, libc::POLLHUP | libc::POLLERR),
        "rank 1's socket did not reset the connection"
    );
    let mut dst = vec![0u8; SIZE];
    // SAFETY: dst outlives a.
    let md = unsafe { a.register(dst.as_mut_ptr(), SIZE) }.unwrap();
    let mut r = Outstanding::new(a.irecv(1, tag(0), md, 0, SIZE).unwrap());
    // Second control frame: meets the reset, with the receive posted.
    TcpTransport::queue_control(a.conns.get_mut(&1).unwrap(), credit);
    let start = Instant::now();
    while !r.poll(&mut a).unwrap() {
        a.progress().unwrap();
        assert!(start.elapsed() < LIMIT, "the message never came");
    }
    assert_eq!(dst, msgs[0]);
    assert_sends_to_rank_1_fail(&mut a, &addr);
}
