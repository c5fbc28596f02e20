//! The receive core against a simulated sender and network: messages of
//! random sizes, receives posted in any order, frames delivered in any
//! order (as over several TCP lanes), credits and clearances handed back
//! late. Every message must arrive exactly, the buffers must never be
//! exceeded, and nothing may be left waiting.

use super::*;
use crate::seam::MemPtr;
use crate::test_tags;
use crate::wire::FrameKind;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const FRAME: usize = 16;
/// The small buffers' size in [`run_with_small`]: messages of 0 to 5 bytes
/// take small credits there.
const SMALL_CAP: usize = 5;

fn data(tag: Tag, offset: u64, len: u64, total: u64, cleared: bool) -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Data,
        cleared,
        credits: 0,
        src_rank: 1,
        tag: Tag::raw(tag.comm, tag.seq, tag.step, tag.sig, tag.scope),
        offset,
        len,
        total,
    }
}

fn rts(tag: Tag, total: u64, id: u64) -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Rts,
        offset: id,
        total,
        tag: Tag::raw(tag.comm, tag.seq, tag.step, tag.sig, tag.scope),
        ..FrameHeader::control(FrameKind::Rts, 1, 0)
    }
}

/// Message `k`'s bytes.
fn payload(k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (k * 31 + i) as u8).collect()
}

/// What crosses from the sender to the receiver.
#[derive(Clone, Copy, Debug)]
enum Wire {
    Frame {
        msg: usize,
        frame: usize,
        cleared: bool,
    },
    Announce {
        msg: usize,
    },
}

/// Runs `sizes.len()` messages from a sender holding `credits` credits;
/// the receiver posts in `post_order`. Panics on any violation.
fn run(sizes: &[usize], credits: usize, post_order: &[usize], seed: u64) {
    run_with_small(sizes, credits, 0, post_order, seed);
}

/// [`run`] with `small` small buffers of [`SMALL_CAP`] bytes at the
/// receiver, and as many small credits at the sender.
fn run_with_small(sizes: &[usize], credits: usize, small: usize, post_order: &[usize], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = sizes.len();
    let tags: Vec<Tag> = (0..n)
        .map(|k| test_tags::tag(5, 1, 100, 0, k as u32))
        .collect();
    let frames_of = |k: usize| sizes[k].div_ceil(FRAME).max(1);
    let mut core: RecvCore<usize> = RecvCore::with_small(0, 1, credits, FRAME, small, SMALL_CAP);
    assert_eq!(
        core.small_credits(),
        (small, if small > 0 { SMALL_CAP } else { 0 })
    );
    let mut sender = Credits::new(credits);
    let mut sender_small = Credits::new(small);
    let is_small = |k: usize| small > 0 && sizes[k] <= SMALL_CAP;
    let mut dst: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
    let mut done = vec![false; n];
    let mut next_send = 0;
    let mut next_post = 0;
    let mut wire: Vec<Wire> = Vec::new();
    // Back to the sender: clearances and credits, delivered late.
    let mut clears: Vec<usize> = Vec::new();
    let mut owed_back: u16 = 0;
    let mut owed_small_back: u16 = 0;
    let mut steps = 0;
    while done.iter().any(|d| !d) {
        steps += 1;
        assert!(steps < 100_000, "stuck: {done:?}");
        match rng.random_range(0..5) {
            0 if next_send < n => {
                let k = next_send;
                next_send += 1;
                let eager = if is_small(k) {
                    sender_small.take(1)
                } else {
                    sender.take(frames_of(k))
                };
                if eager {
                    for f in 0..frames_of(k) {
                        wire.push(Wire::Frame {
                            msg: k,
                            frame: f,
                            cleared: false,
                        });
                    }
                } else {
                    wire.push(Wire::Announce { msg: k });
                }
            }
            1 if !wire.is_empty() => {
                let w = wire.swap_remove(rng.random_range(0..wire.len()));
                match w {
                    Wire::Announce { msg } => {
                        if let Some((_, id, ())) = core
                            .announce(rts(tags[msg], sizes[msg] as u64, msg as u64), ())
                            .unwrap()
                        {
                            clears.push(id as usize);
                        }
                    }
                    Wire::Frame {
                        msg,
                        frame,
                        cleared,
                    } => {
                        let off = frame * FRAME;
                        let len = (sizes[msg] - off.min(sizes[msg])).min(FRAME);
                        let h = data(
                            tags[msg],
                            off as u64,
                            len as u64,
                            sizes[msg] as u64,
                            cleared,
                        );
                        let bytes = &payload(msg, sizes[msg])[off..off + len];
                        match core.find(&h).unwrap() {
                            Some(i) => {
                                let p = &core.posted()[i];
                                assert_eq!(p.extra, msg);
                                // SAFETY: the destination vector outlives the copy.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        bytes.as_ptr(),
                                        p.dst.0.add(off),
                                        len,
                                    )
                                };
                                if let Some(p) = core.delivered(i, &h, len) {
                                    done[p.extra] = true;
                                }
                            }
                            None => {
                                let (b, buf) = core.early_buffer(&h).unwrap();
                                buf.copy_from_slice(bytes);
                                if let Some(p) = core.file(h, b).unwrap() {
                                    done[p.extra] = true;
                                }
                            }
                        }
                    }
                }
            }
            2 if next_post < n => {
                let k = post_order[next_post];
                next_post += 1;
                let p = Posted::new(k as u64, tags[k], MemPtr(dst[k].as_mut_ptr()), sizes[k], k);
                // SAFETY: dst[k] lives to the end of the run.
                match unsafe { core.post(p) }.unwrap() {
                    Posting::Done => done[k] = true,
                    Posting::Pending => {}
                    Posting::Clear { id, a: () } => clears.push(id as usize),
                }
            }
            3 => {
                owed_back = owed_back.saturating_add(core.take_owed(1));
                owed_small_back = owed_small_back.saturating_add(core.take_owed_small(1));
                if rng.random_bool(0.5) {
                    sender.give_back(owed_back, 0).unwrap();
                    sender_small.give_back(owed_small_back, 0).unwrap();
                    owed_back = 0;
                    owed_small_back = 0;
                }
            }
            4 if !clears.is_empty() => {
                let k = clears.swap_remove(rng.random_range(0..clears.len()));
                for f in 0..frames_of(k) {
                    wire.push(Wire::Frame {
                        msg: k,
                        frame: f,
                        cleared: true,
                    });
                }
            }
            _ => {}
        }
    }
    for k in 0..n {
        assert_eq!(dst[k], payload(k, sizes[k]), "message {k}");
    }
    assert!(core.is_idle(), "left over: {core:?}");
    // Every credit comes home once the owed ones are returned.
    let owed = core.take_owed(1);
    sender.give_back(owed_back, 0).unwrap();
    sender.give_back(owed, 0).unwrap();
    assert_eq!(sender.available(), credits);
    let owed_small = core.take_owed_small(1);
    sender_small.give_back(owed_small_back, 0).unwrap();
    sender_small.give_back(owed_small, 0).unwrap();
    assert_eq!(sender_small.available(), small);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_message_arrives_whatever_the_orders(
        sizes in prop::collection::vec(0usize..70, 1..24),
        credits in 1usize..6,
        seed in any::<u64>(),
    ) {
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x5eed));
        run(&sizes, credits, &order, seed);
    }

    #[test]
    fn every_message_arrives_with_small_credits_too(
        sizes in prop::collection::vec(0usize..40, 1..32),
        credits in 1usize..4,
        small in 1usize..8,
        seed in any::<u64>(),
    ) {
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x5ea1));
        run_with_small(&sizes, credits, small, &order, seed);
    }
}

#[test]
fn small_messages_run_ahead_on_small_credits_and_frames_on_their_own() {
    // 3 small buffers and 1 frame-sized one: three 4-byte messages and one
    // 16-byte message are all buffered before any receive is posted.
    let mut core: RecvCore<()> = RecvCore::with_small(0, 1, 1, FRAME, 3, SMALL_CAP);
    assert_eq!(core.buffers(), 4);
    let tags: Vec<Tag> = (0..5).map(|k| test_tags::tag(5, 1, 100, 0, k)).collect();
    let sizes = [4usize, 4, 4, 16];
    for (k, &n) in sizes.iter().enumerate() {
        let h = data(tags[k], 0, n as u64, n as u64, false);
        let (b, buf) = core.early_buffer(&h).unwrap();
        buf.copy_from_slice(&payload(k, n));
        assert!(core.file(h, b).unwrap().is_none());
    }
    assert_eq!(core.buffered(), 4);
    // A fourth small one is over the small credits, and named so, even
    // with the frame-sized buffer free again.
    let mut big = vec![0u8; 16];
    let p = Posted::new(3, tags[3], MemPtr(big.as_mut_ptr()), 16, ());
    // SAFETY: `big` outlives the core's use of it (the copy in post).
    assert_eq!(unsafe { core.post(p) }.unwrap(), Posting::Done);
    assert_eq!(big, payload(3, 16));
    let h = data(tags[4], 0, 2, 2, false);
    let e = core.early_buffer(&h).unwrap_err().to_string();
    assert!(e.contains("3 small credits"), "{e}");
    // Taken in another order than sent, each small message comes out whole,
    // and each class owes its own credits.
    for k in [2usize, 0, 1] {
        let mut got = vec![0u8; 4];
        let p = Posted::new(k as u64, tags[k], MemPtr(got.as_mut_ptr()), 4, ());
        // SAFETY: as above.
        assert_eq!(unsafe { core.post(p) }.unwrap(), Posting::Done);
        assert_eq!(got, payload(k, 4), "message {k}");
    }
    assert_eq!((core.owed(), core.owed_small()), (1, 3));
    assert_eq!(core.take_owed_small(4), 0, "fewer than asked for stay owed");
    assert_eq!(core.take_owed_small(1), 3);
    assert_eq!(core.take_owed(1), 1);
    assert!(core.is_idle());
}

#[test]
fn without_small_buffers_every_frame_takes_a_frame_credit() {
    let mut core: RecvCore<()> = RecvCore::with_small(0, 1, 2, FRAME, 0, SMALL_CAP);
    assert_eq!(core.small_credits(), (0, 0));
    let tag = test_tags::tag(5, 1, 100, 0, 0);
    let h = data(tag, 0, 1, 1, false);
    let (b, _) = core.early_buffer(&h).unwrap();
    core.file(h, b).unwrap();
    let mut got = [0u8; 1];
    let p = Posted::new(0, tag, MemPtr(got.as_mut_ptr()), 1, ());
    // SAFETY: `got` outlives the copy in post.
    assert_eq!(unsafe { core.post(p) }.unwrap(), Posting::Done);
    assert_eq!((core.owed(), core.owed_small()), (1, 0));
}

#[test]
fn one_credit_and_receives_posted_in_reverse_still_complete() {
    let sizes: Vec<usize> = (0..20).map(|k| k * 7 % 50).collect();
    let order: Vec<usize> = (0..sizes.len()).rev().collect();
    for seed in 0..50 {
        run(&sizes, 1, &order, seed);
    }
}

#[test]
fn a_sender_over_its_credits_is_named() {
    let mut core: RecvCore<()> = RecvCore::new(0, 3, 1, FRAME);
    let t = test_tags::tag(5, 1, 100, 0, 0);
    let h = data(t, 0, 4, 4, false);
    let (b, _) = core.early_buffer(&h).unwrap();
    core.file(h, b).unwrap();
    let e = core
        .early_buffer(&data(t, 0, 4, 4, false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 3") && e.contains("1 credits"), "{e}");
    let e = core
        .early_buffer(&data(t, 0, FRAME as u64 + 1, FRAME as u64 + 1, false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 16"), "{e}");
}

#[test]
fn cleared_data_without_a_cleared_receive_is_a_violation() {
    let mut core: RecvCore<()> = RecvCore::new(0, 2, 2, FRAME);
    let t = test_tags::tag(5, 1, 100, 0, 0);
    let e = core.find(&data(t, 0, 4, 4, true)).unwrap_err().to_string();
    assert!(e.contains("no receive is posted"), "{e}");
    let mut buf = [0u8; 4];
    let p = Posted::new(1, t, MemPtr(buf.as_mut_ptr()), 4, ());
    // SAFETY: buf outlives the core's use of it in this test.
    assert_eq!(unsafe { core.post(p) }.unwrap(), Posting::Pending);
    let e = core.find(&data(t, 0, 4, 4, true)).unwrap_err().to_string();
    assert!(e.contains("before it was told"), "{e}");
}

#[test]
fn a_disagreeing_buffered_frame_is_a_mismatch_when_its_receive_is_posted() {
    let mut core: RecvCore<()> = RecvCore::new(0, 1, 2, FRAME);
    let theirs = test_tags::tag(5, 1, 99, 0, 0);
    let h = data(theirs, 0, 4, 4, false);
    let (b, _) = core.early_buffer(&h).unwrap();
    core.file(h, b).unwrap();
    let mut buf = [0u8; 4];
    let p = Posted {
        req: 1,
        tag: test_tags::tag(5, 1, 4, 0, 0),
        dst: MemPtr(buf.as_mut_ptr()),
        len: 4,
        got: 0,
        cleared: false,
        extra: (),
    };
    // SAFETY: as above.
    let e = unsafe { core.post(p) }.unwrap_err().to_string();
    assert!(e.contains("count=99") && e.contains("count=4"), "{e}");
}

#[test]
fn credits_cannot_be_returned_twice() {
    let mut c = Credits::new(2);
    assert!(c.take(2) && !c.take(1));
    c.give_back(2, 7).unwrap();
    let e = c.give_back(1, 7).unwrap_err().to_string();
    assert!(e.contains("rank 7 returned 1 credits"), "{e}");
}
