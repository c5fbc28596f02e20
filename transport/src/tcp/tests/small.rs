//! Small credits over real sockets: messages that fit a small buffer run
//! ahead of their receives on the peer's small credits and never on its
//! frame credits; past them they are announced, and the credits come back
//! in `Credit` frames once the receives take the messages.

use super::*;

#[test]
fn small_messages_run_ahead_on_small_credits_and_the_credits_come_back() {
    let (mut a, mut b) = pair_with(TcpConfig {
        lanes: 1,
        eager_frames: 1,
        small_frames: 3,
        ..TcpConfig::default()
    });
    assert_eq!(b.eager().small_frames, 3);
    assert_eq!(b.eager().small_bytes as usize, SMALL_FRAME_BYTES);
    assert_eq!(a.conns[&1].small_credits.available(), 3);
    // Five small messages and one over the small size, no receive posted.
    let sizes = [8usize, 100, SMALL_FRAME_BYTES, 1, 0, SMALL_FRAME_BYTES + 1];
    let mut src: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| pattern(n, k as u8))
        .collect();
    let ms: Vec<MemHandle> = src.iter_mut().map(|v| reg(&mut a, v)).collect();
    let mut sends: Vec<Outstanding> = (0..sizes.len())
        .map(|k| Outstanding::new(a.isend(1, tag(k as u32), ms[k], 0, sizes[k]).unwrap()))
        .collect();
    // The first three take the small credits, the next two are announced,
    // and the large one takes the one frame credit.
    assert_eq!(a.conns[&1].small_credits.available(), 0);
    assert_eq!(a.conns[&1].credits.available(), 0);
    assert_eq!(a.conns[&1].announced.len(), 2);
    until(
        &mut a,
        &mut b,
        "the eager messages to be buffered",
        |_, b| b.conns[&0].core.buffered() == 4,
    );
    // Received in reverse order, every message arrives whole.
    let mut dst: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let md: Vec<MemHandle> = dst.iter_mut().map(|v| reg(&mut b, v)).collect();
    let mut recvs: Vec<Outstanding> = (0..sizes.len())
        .rev()
        .map(|k| Outstanding::new(b.irecv(0, tag(k as u32), md[k], 0, sizes[k]).unwrap()))
        .collect();
    until(&mut a, &mut b, "every message", |a, b| {
        let mut all = true;
        for s in sends.iter_mut() {
            all &= s.poll(a).unwrap();
        }
        for r in recvs.iter_mut() {
            all &= r.poll(b).unwrap();
        }
        all
    });
    for k in 0..sizes.len() {
        assert_eq!(dst[k], src[k], "message {k} ({} bytes)", sizes[k]);
    }
    // The three small credits and the frame credit all come home.
    until(&mut a, &mut b, "the credits to come back", |a, _| {
        a.conns[&1].small_credits.available() == 3 && a.conns[&1].credits.available() == 1
    });
    assert_eq!(b.conns[&0].core.owed_small(), 0);
}

#[test]
fn a_peer_without_small_buffers_gets_frame_credits_for_small_messages() {
    let (mut a, mut b) = pair_with(TcpConfig {
        lanes: 1,
        eager_frames: 2,
        small_frames: 0,
        ..TcpConfig::default()
    });
    assert_eq!((b.eager().small_frames, b.eager().small_bytes), (0, 0));
    let mut src = pattern(8, 1);
    let m = reg(&mut a, &mut src);
    let mut s = Outstanding::new(a.isend(1, tag(0), m, 0, 8).unwrap());
    assert_eq!(
        a.conns[&1].credits.available(),
        1,
        "a frame credit was spent"
    );
    let mut dst = vec![0u8; 8];
    let md = reg(&mut b, &mut dst);
    let mut r = Outstanding::new(b.irecv(0, tag(0), md, 0, 8).unwrap());
    until(&mut a, &mut b, "the message", |a, b| {
        s.poll(a).unwrap() && r.poll(b).unwrap()
    });
    assert_eq!(dst, src);
}

#[test]
fn returning_more_small_credits_than_were_spent_is_named() {
    let (mut a, mut b) = pair_with(TcpConfig {
        lanes: 1,
        small_frames: 2,
        ..TcpConfig::default()
    });
    // b forges a credit frame returning 5 small credits a never spent.
    let forged = FrameHeader {
        offset: 5,
        ..FrameHeader::control(FrameKind::Credit, 1, 0)
    };
    TcpTransport::queue_control(b.conns.get_mut(&0).unwrap(), forged);
    let start = Instant::now();
    let e = loop {
        b.progress().unwrap();
        if let Err(e) = a.progress() {
            break e.to_string();
        }
        assert!(start.elapsed() < LIMIT, "the forged credits were taken");
    };
    assert!(
        e.contains("rank 1 returned 5 credits") && e.contains("(small credits)"),
        "{e}"
    );
    assert_eq!(e.matches("protocol error").count(), 1, "{e}");
}
