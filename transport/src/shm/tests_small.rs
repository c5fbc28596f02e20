//! Small credits over shared memory: messages of at most
//! `SMALL_FRAME_BYTES` run ahead of their receives on the peer's small
//! credits and never on its frame credits; past them they are announced,
//! and the credits come back through the ring's `small_consumed` counter.

use super::tests::{job, pattern, reg, run, secret, tag};
use super::*;
use crate::seam::Outstanding;

fn pair_small(
    name: &str,
    eager_frames: usize,
    small_frames: usize,
) -> (ShmTransport, ShmTransport) {
    let j = job(name);
    let c = ShmConfig {
        slot_bytes: 8192,
        slots: 2,
        pull_bytes: 0,
        eager_frames,
        small_frames,
        ..ShmConfig::new(j.clone(), secret(&j))
    };
    let mut a = ShmTransport::new(0, super::tests::infos(2), c.clone()).unwrap();
    let mut b = ShmTransport::new(1, super::tests::infos(2), c).unwrap();
    assert_eq!(a.connect(1).unwrap(), Readiness::Ready);
    assert_eq!(b.connect(0).unwrap(), Readiness::Ready);
    (a, b)
}

#[test]
fn small_messages_run_ahead_on_small_credits_and_the_credits_come_back() {
    // Frame credits: a default ring's worth (8, though this ring holds two
    // of the largest frames) + 1 buffer; small credits: 3.
    let (mut a, mut b) = pair_small("small-ahead", 1, 3);
    assert_eq!(a.peers[1].small_credits(), (3, SMALL_FRAME_BYTES));
    assert_eq!(a.peers[1].credits(), DEFAULT_SLOTS + 1);
    // Five small messages and one over the small size, no receive posted.
    let sizes = [8usize, 100, SMALL_FRAME_BYTES, 1, 0, SMALL_FRAME_BYTES + 1];
    let mut src: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| pattern(n, k as u8))
        .collect();
    let ms: Vec<MemHandle> = src.iter_mut().map(|v| reg(&mut a, v)).collect();
    let sends: Vec<Outstanding> = (0..sizes.len())
        .map(|k| Outstanding::new(a.isend(1, tag(1, k as u32), ms[k], 0, sizes[k]).unwrap()))
        .collect();
    a.progress().unwrap();
    // The first three took the small credits, the next two are announced,
    // and the large one took one frame credit.
    let p = &a.peers[1];
    assert_eq!((p.sent_small, p.sent_eager, p.announced.len()), (3, 1, 2));
    assert_eq!(p.small_credits().0, 0);
    assert_eq!(p.credits(), DEFAULT_SLOTS);
    // Received in reverse order, every message arrives whole.
    let mut dst: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let md: Vec<MemHandle> = dst.iter_mut().map(|v| reg(&mut b, v)).collect();
    let recvs: Vec<Outstanding> = (0..sizes.len())
        .rev()
        .map(|k| Outstanding::new(b.irecv(0, tag(1, k as u32), md[k], 0, sizes[k]).unwrap()))
        .collect();
    run(&mut a, &mut b, sends, recvs);
    for k in 0..sizes.len() {
        assert_eq!(dst[k], src[k], "message {k} ({} bytes)", sizes[k]);
    }
    // Every credit is home, counted in the class it was spent from.
    b.progress().unwrap();
    assert_eq!(b.peers[0].core.owed_small(), 0);
    assert_eq!(a.peers[1].small_credits().0, 3);
    assert_eq!(a.peers[1].credits(), DEFAULT_SLOTS + 1);
    assert_eq!(a.peers[1].sent_small, 3);
}

#[test]
fn the_fast_path_spends_and_returns_small_credits_too() {
    let (mut a, mut b) = pair_small("small-now", 1, 2);
    let m = pattern(16, 3);
    let mut got = vec![0u8; 16];
    for round in 0..5u64 {
        // Two go at once on the two small credits; the third must wait.
        assert_eq!(a.send_now(1, tag(10 + round, 0), &m).unwrap(), Now::Done);
        assert_eq!(a.send_now(1, tag(10 + round, 1), &m).unwrap(), Now::Done);
        assert_eq!(a.send_now(1, tag(10 + round, 2), &m).unwrap(), Now::Later);
        assert_eq!(a.peers[1].sent_eager, 0, "no frame credit is spent");
        for step in 0..2 {
            got.fill(0);
            assert_eq!(
                b.recv_now(0, tag(10 + round, step), &mut got).unwrap(),
                Now::Done
            );
            assert_eq!(got, m);
        }
        // The receiver says it consumed them on its next turn.
        b.progress().unwrap();
        assert_eq!(a.peers[1].small_credits().0, 2, "round {round}");
    }
}

#[test]
fn without_small_buffers_small_messages_take_frame_credits() {
    let (mut a, mut b) = pair_small("small-none", 1, 0);
    assert_eq!(a.peers[1].small_credits(), (0, 0));
    let m = pattern(8, 1);
    // Frame credits: 8 + 1 buffer.
    let n = DEFAULT_SLOTS as u32 + 1;
    for step in 0..n {
        assert_eq!(a.send_now(1, tag(1, step), &m).unwrap(), Now::Done);
    }
    assert_eq!(a.send_now(1, tag(1, n), &m).unwrap(), Now::Later);
    assert_eq!(
        (a.peers[1].sent_eager, a.peers[1].sent_small),
        (u64::from(n), 0)
    );
    let mut got = vec![0u8; 8];
    for step in 0..n {
        assert_eq!(b.recv_now(0, tag(1, step), &mut got).unwrap(), Now::Done);
    }
    b.progress().unwrap();
    assert_eq!(a.peers[1].credits(), n as usize);
}

#[test]
fn ranks_that_disagree_on_small_buffers_are_told_at_connection() {
    let j = job("small-disagree");
    let c = ShmConfig {
        pull_bytes: 0,
        ..ShmConfig::new(j.clone(), secret(&j))
    };
    let mut a = ShmTransport::new(0, super::tests::infos(2), c.clone()).unwrap();
    let mut b = ShmTransport::new(
        1,
        super::tests::infos(2),
        ShmConfig {
            small_frames: 5,
            ..c
        },
    )
    .unwrap();
    assert_eq!(a.connect(1).unwrap(), Readiness::Ready);
    let e = b.connect(0).unwrap_err().to_string();
    assert!(e.contains("small buffers per side (GW_EAGER_SMALL)"), "{e}");
}
