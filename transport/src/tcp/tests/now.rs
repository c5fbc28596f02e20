//! Small messages written and taken by the caller (`send_now` / `recv_now`)
//! over real sockets, and their hand-over to the posted path whenever a
//! credit is missing, frames are queued, or anything else is pending.

use super::*;
use crate::seam::Now;
use proptest::prelude::*;

/// Progresses both until every request is done.
fn run(
    a: &mut TcpTransport,
    b: &mut TcpTransport,
    ra: Vec<impl Into<Outstanding>>,
    rb: Vec<impl Into<Outstanding>>,
) {
    crate::test_drive::run_both(a, b, ra, rb, LIMIT);
}

/// Rank 1 looks for message `t` until it comes (`Done` or `Later`),
/// progressing rank 0 meanwhile.
fn take(a: &mut TcpTransport, b: &mut TcpTransport, t: Tag, dst: &mut [u8]) -> Result<Now> {
    crate::test_drive::recv_now_within(a, b, t, dst, LIMIT)
}

#[test]
fn a_small_message_goes_and_comes_without_requests() {
    let (mut a, mut b) = pair(2);
    for (step, len) in [(0u32, 40usize), (1, 0), (2, 4000)] {
        let msg = pattern(len, step as u8);
        assert_eq!(a.send_now(1, tag(step), &msg, None).unwrap(), Now::Done);
        let mut got = vec![0u8; len];
        assert_eq!(
            take(&mut a, &mut b, tag(step), &mut got).unwrap(),
            Now::Done
        );
        assert_eq!(got, msg, "message of {len} bytes");
    }
    // Nothing left: the next look finds the socket empty.
    assert_eq!(b.recv_now(0, tag(3), &mut []).unwrap(), Now::Empty);
    assert!(
        a.reqs.is_empty() && b.reqs.is_empty(),
        "requests were posted"
    );
    // Larger than a small message: posted, both ways.
    let big = pattern(SMALL + 1, 9);
    assert_eq!(a.send_now(1, tag(4), &big, None).unwrap(), Now::Later);
    assert_eq!(
        b.recv_now(0, tag(4), &mut vec![0u8; SMALL + 1]).unwrap(),
        Now::Later
    );
}

#[test]
fn without_a_credit_or_behind_queued_frames_the_send_is_posted() {
    let (mut a, mut b) = pair_with(TcpConfig {
        lanes: 1,
        eager_frames: 1,
        small_frames: 3,
        ..TcpConfig::default()
    });
    let msgs: Vec<Vec<u8>> = (0..8).map(|k| pattern(100, k)).collect();
    for (k, m) in msgs.iter().enumerate().take(3) {
        assert_eq!(a.send_now(1, tag(k as u32), m, None).unwrap(), Now::Done);
    }
    // The small credits are spent and none came back yet.
    assert_eq!(a.send_now(1, tag(3), &msgs[3], None).unwrap(), Now::Later);
    let mut got = vec![0u8; 100];
    for (k, m) in msgs.iter().enumerate().take(3) {
        assert_eq!(
            take(&mut a, &mut b, tag(k as u32), &mut got).unwrap(),
            Now::Done
        );
        assert_eq!(&got, m);
    }
    // Taken at once, they are owed back as if received the posted way, and
    // rank 1 returns them itself (a `Credit` frame) once half are owed,
    // with no progress call of its own; rank 0's `send_now` reads them.
    assert!(b.conns[&0].core.owed_small() < 2, "credits not returned");
    let start = Instant::now();
    while a.send_now(1, tag(3), &msgs[3], None).unwrap() == Now::Later {
        assert!(start.elapsed() < LIMIT, "the credits never came back");
    }
    // A posted message still queued on lane 0 is not overtaken.
    let mut src = msgs[4].clone();
    let ms = reg(&mut a, &mut src);
    let posted = Outstanding::new(a.isend(1, tag(4), ms, 0, 100).unwrap());
    assert_eq!(a.send_now(1, tag(5), &msgs[5], None).unwrap(), Now::Later);
    let mut dst = vec![0u8; 100];
    let md = reg(&mut b, &mut dst);
    assert_eq!(take(&mut a, &mut b, tag(3), &mut got).unwrap(), Now::Done);
    assert_eq!(got, msgs[3]);
    let r = b.irecv(0, tag(4), md, 0, 100).unwrap();
    run(&mut a, &mut b, vec![posted], vec![r]);
    assert_eq!(dst, msgs[4]);
}

#[test]
fn what_the_socket_does_not_take_is_sent_from_a_copy() {
    // Buffers at the kernel's minimum: a few 4000-byte messages fill them.
    let (mut a, mut b) = pair_with(TcpConfig {
        lanes: 1,
        send_buffer_bytes: 4096,
        recv_buffer_bytes: 4096,
        small_frames: 32,
        ..TcpConfig::default()
    });
    let msgs: Vec<Vec<u8>> = (0..32).map(|k| pattern(4000, k)).collect();
    let mut at_once = 0;
    let mut refused = 0;
    let queued = |a: &TcpTransport| {
        a.conns[&1].lanes[0]
            .as_ref()
            .is_some_and(|l| l.sendq.iter().any(|s| s.keep.is_some()))
    };
    // Until a frame goes in part: the socket refuses some writes whole
    // first (then rank 1 reads a little, into its early buffers, and the
    // same message is tried again).
    while !queued(&a) {
        assert!(at_once < msgs.len(), "no write ever went in part");
        // The caller's buffer is gone as soon as the call returns.
        let mut scratch = msgs[at_once].clone();
        match a.send_now(1, tag(at_once as u32), &scratch, None).unwrap() {
            Now::Done => at_once += 1,
            _ => {
                // Refused whole: its credit was given back.
                refused += 1;
                assert_eq!(a.conns[&1].small_credits.available(), 32 - at_once);
                assert!(refused < 1000, "the socket never took more");
                b.progress().unwrap();
            }
        }
        scratch.fill(0);
    }
    // The next message may not overtake the rest: posted way, nothing spent.
    assert_eq!(
        a.send_now(1, tag(at_once as u32), &msgs[at_once], None)
            .unwrap(),
        Now::Later
    );
    assert_eq!(a.conns[&1].small_credits.available(), 32 - at_once);
    // The rest of a partly written frame is the transport's to send.
    assert!(a.unsent());
    let mut dst = vec![vec![0u8; 4000]; at_once];
    let md: Vec<MemHandle> = dst.iter_mut().map(|d| reg(&mut b, d)).collect();
    let recvs: Vec<Request> = (0..at_once)
        .map(|k| b.irecv(0, tag(k as u32), md[k], 0, 4000).unwrap())
        .collect();
    run(&mut a, &mut b, Vec::<Request>::new(), recvs);
    for (k, d) in dst.iter().enumerate() {
        assert_eq!(d, &msgs[k], "message {k}");
    }
    assert!(!a.unsent(), "everything went out");
}

#[test]
fn a_receive_is_taken_at_once_only_when_nothing_else_is_pending() {
    let (mut a, mut b) = pair(2);
    let (m0, m1, m2) = (pattern(8, 0), pattern(8, 1), pattern(8, 2));
    // A posted receive is pending: the next message goes the posted way.
    let mut dst = vec![0u8; 8];
    let md = reg(&mut b, &mut dst);
    let r = b.irecv(0, tag(0), md, 0, 8).unwrap();
    assert_eq!(a.send_now(1, tag(1), &m1, None).unwrap(), Now::Done);
    let mut got = vec![0u8; 8];
    assert_eq!(b.recv_now(0, tag(1), &mut got).unwrap(), Now::Later);
    assert_eq!(a.send_now(1, tag(0), &m0, None).unwrap(), Now::Done);
    run(&mut a, &mut b, Vec::<Request>::new(), vec![r]);
    assert_eq!(dst, m0);
    // Step 1 was filed early meanwhile: taken by a posted receive.
    let r = b.irecv(0, tag(1), md, 0, 8).unwrap();
    run(&mut a, &mut b, Vec::<Request>::new(), vec![r]);
    assert_eq!(dst, m1);
    // Asked for while another message is ahead of it: `Later`. The one
    // ahead is then taken at once, and after it the one asked for.
    assert_eq!(a.send_now(1, tag(2), &m2, None).unwrap(), Now::Done);
    assert_eq!(a.send_now(1, tag(3), &m0, None).unwrap(), Now::Done);
    assert_eq!(take(&mut a, &mut b, tag(3), &mut got).unwrap(), Now::Later);
    assert_eq!(take(&mut a, &mut b, tag(2), &mut got).unwrap(), Now::Done);
    assert_eq!(got, m2);
    assert_eq!(take(&mut a, &mut b, tag(3), &mut got).unwrap(), Now::Done);
    assert_eq!(got, m0);
}

#[test]
fn disagreements_and_aborts_are_reported_as_on_the_posted_path() {
    let (mut a, mut b) = pair(1);
    assert_eq!(
        a.send_now(1, tag(0), &pattern(10, 1), None).unwrap(),
        Now::Done
    );
    // The same message, a different length: a mismatch naming both.
    let e = take(&mut a, &mut b, tag(0), &mut [0u8; 12]).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    let (mut a, mut b) = pair(1);
    a.abort("rank 0 gave up");
    let e = take(&mut a, &mut b, tag(0), &mut [0u8; 8]).unwrap_err();
    assert!(
        matches!(&e, Error::Remote { what, .. } if what.contains("rank 0 gave up")),
        "{e}"
    );
    assert!(matches!(
        a.send_now(1, tag(0), &[1, 2], None),
        Err(Error::Aborted(_))
    ));
    // A peer that shut down: not `Empty` for ever, but the posted path,
    // which says what happened.
    let (a, mut b) = pair(2);
    drop(a);
    let start = Instant::now();
    while b.recv_now(0, tag(0), &mut [0u8; 8]).unwrap() == Now::Empty {
        assert!(start.elapsed() < LIMIT, "the close was never seen");
    }
    // Every lane's close read, the posted path refuses the receive.
    while !b.conns[&0].lanes.iter().flatten().all(|l| l.closed) {
        b.progress().unwrap();
        assert!(start.elapsed() < LIMIT, "a lane's close was never seen");
    }
    let mut dst = [0u8; 8];
    let md = reg(&mut b, &mut dst);
    let e = b.irecv(0, tag(0), md, 0, 8).unwrap_err();
    assert!(e.to_string().contains("shut its communicator down"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Messages of random sizes (some past the small size), each sent at
    /// once or posted and received at once or posted, over one or two
    /// lanes: every message arrives whole, whichever path it took.
    #[test]
    fn mixed_paths_deliver_every_message_exactly(
        lanes in 1usize..3,
        msgs in prop::collection::vec(
            (prop_oneof![0usize..200, 3000usize..5000, SMALL - 2..SMALL + 3], any::<bool>(), any::<bool>()),
            1..12,
        ),
    ) {
        let (mut a, mut b) = pair_with(TcpConfig {
            lanes,
            small_frames: 4,
            ..TcpConfig::default()
        });
        let (src, dst) = crate::test_drive::mixed_paths(&mut a, &mut b, &msgs, tag, LIMIT);
        prop_assert_eq!(&dst, &src);
    }
}
