//! Small messages moved at once (`send_now` / `recv_now`), and their hand-over
//! to the posted path whenever anything else is pending with the peer.

use super::tests::{pair, pattern, reg, run, sleepy, tag};
use super::*;
use crate::seam::Outstanding;
use proptest::prelude::*;

#[test]
fn a_small_message_goes_and_comes_without_requests() {
    let (mut a, mut b) = pair("now", 4, 64);
    let msg = pattern(40, 1);
    assert_eq!(a.send_now(1, tag(1, 0), &msg, None).unwrap(), Now::Done);
    let mut got = vec![0u8; 40];
    assert_eq!(b.recv_now(0, tag(1, 0), &mut got).unwrap(), Now::Done);
    assert_eq!(got, msg);
    // Nothing left: the next look finds the ring empty.
    assert_eq!(b.recv_now(0, tag(1, 1), &mut got).unwrap(), Now::Empty);
    assert!(
        a.reqs.is_empty() && b.reqs.is_empty(),
        "requests were posted"
    );
}

#[test]
fn anything_else_pending_with_the_peer_hands_over_to_the_posted_path() {
    let (mut a, mut b) = pair("now-later", 4, 64);
    let mut src = pattern(310, 3);
    let mut dst = vec![0u8; 310];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    // Larger than a slot: several frames.
    assert_eq!(
        a.send_now(1, tag(1, 0), &src[..100], None).unwrap(),
        Now::Later
    );
    let big = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 300).unwrap());
    // Four of its five frames fill the ring.
    a.progress().unwrap();
    let mut small = vec![0u8; 10];
    // The head of the ring is the big message's first frame, not step 1,
    // and step 0 comes in several frames: both go the posted way.
    assert_eq!(b.recv_now(0, tag(1, 1), &mut small).unwrap(), Now::Later);
    assert_eq!(
        b.recv_now(0, tag(1, 0), &mut dst[..300]).unwrap(),
        Now::Later
    );
    let r0 = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 300).unwrap());
    b.progress().unwrap();
    // The ring has room again, but the big message's last frame is still
    // queued: a small message may not overtake it.
    assert!(a.peers[1].conn.as_ref().unwrap().tx.free().unwrap() > 0);
    assert_eq!(
        a.send_now(1, tag(1, 1), &src[300..], None).unwrap(),
        Now::Later
    );
    // With a receive posted, nothing is taken at once either.
    assert_eq!(b.recv_now(0, tag(1, 1), &mut small).unwrap(), Now::Later);
    run(&mut a, &mut b, vec![big], vec![r0]);
    assert_eq!(dst[..300], src[..300]);
    // Once nothing is pending, the fast path is open again.
    assert_eq!(
        a.send_now(1, tag(1, 1), &src[300..], None).unwrap(),
        Now::Done
    );
    assert_eq!(b.recv_now(0, tag(1, 1), &mut small).unwrap(), Now::Done);
    assert_eq!(small, src[300..]);
}

#[test]
fn a_full_ring_or_buffered_frames_send_the_caller_to_the_posted_path() {
    let (mut a, mut b) = pair("now-full", 1, 64);
    let mut src = pattern(16, 5);
    let mut dst = vec![0u8; 16];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    assert_eq!(
        a.send_now(1, tag(1, 0), &src[..8], None).unwrap(),
        Now::Done
    );
    // One slot, taken: the next message waits for the posted path.
    assert_eq!(
        a.send_now(1, tag(1, 1), &src[8..], None).unwrap(),
        Now::Later
    );
    let s1 = Outstanding::new(a.isend(1, tag(1, 1), ms, 8, 8).unwrap());
    // b posts step 1 first: step 0 is buffered as early to let it through.
    let r1 = Outstanding::new(b.irecv(0, tag(1, 1), md, 8, 8).unwrap());
    run(&mut a, &mut b, vec![s1], vec![r1]);
    assert!(!b.peers[0].core.is_idle(), "step 0 was not buffered");
    // Only the posted path looks at buffered frames.
    let mut got = vec![0u8; 8];
    assert_eq!(b.recv_now(0, tag(1, 0), &mut got).unwrap(), Now::Later);
    let mut r0 = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 8).unwrap());
    assert!(r0.poll(&mut b).unwrap());
    assert_eq!(dst, src);
    b.abort("test over");
    assert!(matches!(
        b.recv_now(0, tag(1, 2), &mut got),
        Err(Error::Aborted(_))
    ));
}

#[test]
fn disagreements_and_aborts_are_reported_as_on_the_posted_path() {
    let (mut a, mut b) = pair("now-errors", 4, 64);
    let m = pattern(8, 7);
    // Same operation slot, another call: a mismatch naming both.
    let other = crate::test_tags::tag(0xc0, 1, 100, 5, 0);
    assert_eq!(a.send_now(1, other, &m, None).unwrap(), Now::Done);
    let mut got = vec![0u8; 8];
    assert!(matches!(
        b.recv_now(0, tag(1, 0), &mut got),
        Err(Error::Mismatch { .. })
    ));
    let (mut a, mut b) = pair("now-abort", 4, 64);
    a.abort("rank 0 gave up");
    assert!(matches!(
        b.recv_now(0, tag(1, 0), &mut got),
        Err(Error::Remote { what, .. }) if what.contains("rank 0 gave up")
    ));
    assert!(matches!(
        a.send_now(1, tag(1, 0), &m, None),
        Err(Error::Aborted(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Messages of random sizes, each sent at once or posted, received at
    /// once or posted, over rings of one to three slots: every message
    /// arrives whole, in order, by whichever path.
    #[test]
    fn mixed_paths_deliver_every_message_exactly(
        slots in 1usize..4,
        msgs in prop::collection::vec((0usize..150, any::<bool>(), any::<bool>()), 1..12),
    ) {
        let (mut a, mut b) = pair("now-prop", slots, 64);
        let (src, dst) = crate::test_drive::mixed_paths(
            &mut a,
            &mut b,
            &msgs,
            |k| tag(1, k),
            std::time::Duration::from_secs(2),
        );
        prop_assert_eq!(&dst, &src);
    }
}

/// Frames the caller takes (`recv_now`) free their slots for the producer
/// at once, with nothing else run on the consumer's side, as an idle
/// engine runs nothing (it parks without a progress pass): a producer that
/// filled the ring sends on. A consumer that told its head only every half
/// ring left the producer without room here, and a collective that then
/// waited on the producer hung (2742f83, reverted).
#[test]
fn frames_taken_by_the_caller_free_their_slots_at_once() {
    let (mut a, mut b) = pair("now-freed", 8, 64);
    let msgs: Vec<Vec<u8>> = (0..11).map(|i| pattern(8, i)).collect();
    let step = |i: usize| tag(1, i as u32);
    for (i, m) in msgs[..8].iter().enumerate() {
        assert_eq!(a.send_now(1, step(i), m, None).unwrap(), Now::Done, "{i}");
    }
    assert_eq!(
        a.send_now(1, step(8), &msgs[8], None).unwrap(),
        Now::Later,
        "the ring is full"
    );
    let mut got = vec![0u8; 8];
    for (i, m) in msgs[..3].iter().enumerate() {
        assert_eq!(b.recv_now(0, step(i), &mut got).unwrap(), Now::Done);
        assert_eq!(&got, m);
    }
    for (i, m) in msgs.iter().enumerate().skip(8) {
        assert_eq!(a.send_now(1, step(i), m, None).unwrap(), Now::Done, "{i}");
    }
    for (i, m) in msgs.iter().enumerate().skip(3) {
        assert_eq!(b.recv_now(0, step(i), &mut got).unwrap(), Now::Done, "{i}");
        assert_eq!(&got, m);
    }
}

/// A producer asleep on a full ring is woken by a frame the caller takes
/// (`recv_now`), although that pop frees the slot without telling the
/// head (another frame follows): the wake-up follows every pop, and the
/// producer finds the slot by its cleared stamp.
#[test]
fn a_producer_asleep_on_a_full_ring_wakes_when_the_caller_takes_a_frame() {
    let (mut a, mut b) = pair("now-wake", 8, 64);
    let msgs: Vec<Vec<u8>> = (0..9).map(|i| pattern(8, i)).collect();
    let mut srcs: Vec<Vec<u8>> = msgs.clone();
    let sends: Vec<Outstanding> = srcs
        .iter_mut()
        .enumerate()
        .map(|(i, src)| {
            let m = reg(&mut a, src);
            Outstanding::new(a.isend(1, tag(1, i as u32), m, 0, 8).unwrap())
        })
        .collect();
    let start = std::time::Instant::now();
    let h = sleepy(a, sends);
    // The producer fills the ring and falls asleep on the ninth frame: its
    // flag still set 20 ms after it was seen (a producer that finds work
    // after setting it clears it within microseconds).
    let asleep = |b: &ShmTransport| b.peers[0].conn.as_ref().unwrap().rx.writer_asleep();
    let ms = std::time::Duration::from_millis;
    loop {
        assert!(start.elapsed() < ms(2000), "never slept");
        if asleep(&b) {
            std::thread::sleep(ms(20));
            if asleep(&b) {
                break;
            }
        }
        std::thread::sleep(ms(1));
    }
    let mut got = vec![0u8; 8];
    assert_eq!(b.recv_now(0, tag(1, 0), &mut got).unwrap(), Now::Done);
    assert_eq!(got, msgs[0]);
    let (_a, woken) = h.join().unwrap();
    assert!(woken >= 1, "the producer was not woken");
    assert!(
        start.elapsed() < ms(2000),
        "the producer slept {:?}",
        start.elapsed()
    );
    // Its sends are done, so every frame is in the ring, in order.
    for (i, m) in msgs.iter().enumerate().skip(1) {
        let took = b.recv_now(0, tag(1, i as u32), &mut got).unwrap();
        assert_eq!(took, Now::Done, "{i}");
        assert_eq!(&got, m, "{i}");
    }
}
