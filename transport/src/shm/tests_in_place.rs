//! Receives left in their ring slot (`irecv_in_place`), over real shared
//! memory between two transports in one process.

use super::tests::{pair, pattern, reg, tag};
use super::*;
use crate::seam::Outstanding;
use proptest::prelude::*;
use std::time::{Duration, Instant};

/// The `len` bytes a receive completed in place left at `at`.
fn held(at: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: the transport keeps `len` bytes at `at` until release, and
    // every caller releases after this returns.
    unsafe { std::slice::from_raw_parts(at, len) }.to_vec()
}

/// Progresses both sides until `req` (posted in place on `b`) completes.
fn land(a: &mut ShmTransport, b: &mut ShmTransport, mut req: Request) -> Landed {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        assert!(Instant::now() < deadline, "request {req:?} never completed");
        a.progress().unwrap();
        b.progress().unwrap();
        match b.test_in_place(req).unwrap() {
            Landed::Pending(r) => req = r,
            l => return l,
        }
    }
}

#[test]
fn a_one_frame_message_stays_in_its_slot_and_holds_the_stream_until_released() {
    let (mut a, mut b) = pair("inplace", 4, 64);
    let mut src = pattern(96, 3);
    let mut dst = vec![0u8; 96];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    let mut s0 = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 48).unwrap());
    let mut s1 = Outstanding::new(a.isend(1, tag(1, 1), ms, 48, 48).unwrap());
    let r0 = b.irecv_in_place(0, tag(1, 0), md, 0, 48).unwrap();
    let mut r1 = Outstanding::new(b.irecv(0, tag(1, 1), md, 48, 48).unwrap());
    let Landed::InPlace { at, held: r0 } = land(&mut a, &mut b, r0) else {
        panic!("a one-frame message was copied, not left in place");
    };
    assert_eq!(held(at, 48), src[..48]);
    assert!(dst.iter().all(|&x| x == 0), "the destination was written");
    // The next message is in the ring but not delivered while the first
    // one's slot is held.
    for _ in 0..20 {
        a.progress().unwrap();
        b.progress().unwrap();
    }
    assert!(s0.poll(&mut a).unwrap() && s1.poll(&mut a).unwrap());
    assert!(!r1.poll(&mut b).unwrap());
    assert!(!b.has_work(), "a held slot counts as work to do");
    b.release_in_place(r0).unwrap();
    // A request that holds nothing (here: one never received in place).
    let plain = b.irecv(0, tag(1, 2), md, 0, 1).unwrap();
    assert!(matches!(
        b.release_in_place(plain),
        Err(Error::InvalidUsage(m)) if m.contains("holds no message")
    ));
    let deadline = Instant::now() + Duration::from_secs(2);
    while !r1.poll(&mut b).unwrap() {
        assert!(
            Instant::now() < deadline,
            "the message behind a released slot never came"
        );
        b.progress().unwrap();
    }
    assert_eq!(dst[48..], src[48..]);
}

#[test]
fn messages_of_several_frames_or_already_buffered_are_written() {
    let (mut a, mut b) = pair("inplace-fallback", 4, 64);
    let mut src = pattern(200, 5);
    let mut dst = vec![0u8; 200];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    // 100 bytes take two 64-byte slots.
    let _ = a.isend(1, tag(1, 0), ms, 0, 100).unwrap();
    let r0 = b.irecv_in_place(0, tag(1, 0), md, 0, 100).unwrap();
    assert_eq!(land(&mut a, &mut b, r0), Landed::Written);
    assert_eq!(dst[..100], src[..100]);
    // Step 1 arrives first and is buffered because a receive for step 2,
    // behind it in the ring, is posted: its in-place receive finds it
    // buffered and copies it.
    let _ = a.isend(1, tag(1, 1), ms, 100, 50).unwrap();
    let _ = a.isend(1, tag(1, 2), ms, 150, 50).unwrap();
    let mut r2 = Outstanding::new(b.irecv(0, tag(1, 2), md, 150, 50).unwrap());
    let deadline = Instant::now() + Duration::from_secs(2);
    while !r2.poll(&mut b).unwrap() {
        assert!(Instant::now() < deadline);
        a.progress().unwrap();
        b.progress().unwrap();
    }
    let r1 = b.irecv_in_place(0, tag(1, 1), md, 100, 50).unwrap();
    assert_eq!(b.test_in_place(r1).unwrap(), Landed::Written);
    assert_eq!(dst, src);
}

#[test]
fn plain_test_refuses_a_message_held_in_place() {
    let (mut a, mut b) = pair("inplace-test", 2, 64);
    let mut src = pattern(32, 9);
    let mut dst = vec![0u8; 32];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    let _ = a.isend(1, tag(1, 0), ms, 0, 32).unwrap();
    let mut r = b.irecv_in_place(0, tag(1, 0), md, 0, 32).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    let err = loop {
        assert!(Instant::now() < deadline);
        a.progress().unwrap();
        b.progress().unwrap();
        match b.test(r) {
            Ok(Tested::Pending(p)) => r = p,
            Ok(Tested::Done) => panic!("a held message was reported written"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::InvalidUsage(m) if m.contains("test_in_place")));
    // The slot stays held (the request that could release it was misused).
    assert!(!b.has_work(), "a held slot counts as work to do");
    // Releasing needs a request of this transport that holds the slot.
    let foreign = a.irecv(1, tag(2, 0), ms, 0, 1).unwrap();
    assert!(b.release_in_place(foreign).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random sizes (some spanning several slots), some receives in place,
    /// slots held for a random number of progress rounds before they are
    /// released, and a ring as small as one slot: every byte arrives, in
    /// place or written, and a held slot loses and reorders nothing.
    #[test]
    fn random_in_place_receives_deliver_exact_bytes(
        slot_bytes in prop::sample::select(vec![8usize, 24, 64]),
        slots in 1usize..4,
        msgs in prop::collection::vec((0.0f64..2.5, any::<bool>(), 0usize..4), 1..10),
    ) {
        let (mut a, mut b) = pair("inplace-prop", slots, slot_bytes);
        let sizes: Vec<usize> = msgs.iter().map(|m| (m.0 * slot_bytes as f64) as usize).collect();
        let total: usize = sizes.iter().sum();
        let mut src = pattern(total, 17);
        let mut dst = vec![0u8; total];
        let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
        let mut off = 0;
        let mut sends = vec![];
        let mut recvs = vec![];
        for (i, (&n, m)) in sizes.iter().zip(&msgs).enumerate() {
            let t = tag(1, i as u32);
            sends.push(Outstanding::new(a.isend(1, t, ms, off, n).unwrap()));
            let r = if m.1 {
                b.irecv_in_place(0, t, md, off, n).unwrap()
            } else {
                b.irecv(0, t, md, off, n).unwrap()
            };
            recvs.push((r, m.1, off, n, m.2));
            off += n;
        }
        // A held slot: (request, where, offset, length, rounds left).
        let mut holding: Option<(Request, *const u8, usize, usize, usize)> = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(recvs.is_empty() && holding.is_none()) {
            prop_assert!(Instant::now() < deadline, "stuck: {recvs:?}");
            a.progress().unwrap();
            b.progress().unwrap();
            sends.retain_mut(|r| !r.poll(&mut a).unwrap());
            if let Some((r, at, o, n, left)) = holding.take() {
                if left == 0 {
                    dst[o..o + n].copy_from_slice(&held(at, n));
                    b.release_in_place(r).unwrap();
                } else {
                    holding = Some((r, at, o, n, left - 1));
                }
            }
            let mut i = 0;
            while i < recvs.len() {
                let (r, in_place, o, n, wait) = recvs.remove(i);
                let l = if in_place {
                    b.test_in_place(r).unwrap()
                } else {
                    match b.test(r).unwrap() {
                        Tested::Done => Landed::Written,
                        Tested::Pending(r) => Landed::Pending(r),
                    }
                };
                match l {
                    Landed::Pending(r) => {
                        recvs.insert(i, (r, in_place, o, n, wait));
                        i += 1;
                    }
                    Landed::Written => {}
                    Landed::InPlace { at, held } => {
                        prop_assert!(holding.is_none(), "two slots held at once");
                        prop_assert!(n > 0 && n <= slot_bytes);
                        holding = Some((held, at, o, n, wait));
                    }
                }
            }
        }
        prop_assert_eq!(&dst, &src);
    }
}
