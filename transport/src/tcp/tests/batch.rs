//! Frames written several to a `sendmsg` (`send_lane`): with socket
//! buffers far smaller than what is queued, writes end inside headers and
//! payloads of frames in the middle of a batch, and every byte of every
//! message must still arrive, in order, with its credits. (Buffers of a
//! few KiB stall loopback TCP itself: its 64 KiB packets overflow such a
//! receive buffer and wait for retransmission timers.)

use super::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

#[test]
fn batched_frames_arrive_whole_through_tiny_socket_buffers() {
    for seed in 1..=3u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut a, mut b) = pair_with(TcpConfig {
            lanes: 1,
            segment_bytes: 8 * 1024,
            send_buffer_bytes: 8 * 1024,
            recv_buffer_bytes: 64 * 1024,
            eager_frames: 8,
            small_frames: 8,
            ..TcpConfig::default()
        });
        let n = 150;
        let sizes: Vec<usize> = (0..n)
            .map(|_| match rng.random_range(0..3) {
                0 => rng.random_range(0..=16),
                1 => rng.random_range(17..=SMALL_FRAME_BYTES),
                _ => rng.random_range(SMALL_FRAME_BYTES..=40 * 1024),
            })
            .collect();
        let Messages { src, dst, ms, md } = Messages::new(&mut a, &mut b, &sizes, pattern);
        // Everything queued at once: eager frames, small ones and
        // announcements behind them on the one lane.
        let mut sends: Vec<Outstanding> = (0..n)
            .map(|k| Outstanding::new(a.isend(1, tag(k as u32), ms[k], 0, sizes[k]).unwrap()))
            .collect();
        let mut recvs: Vec<Outstanding> = Vec::with_capacity(n);
        let start = Instant::now();
        let mut done = false;
        while !done {
            // Receives trickle in, so frames are both matched and buffered.
            if recvs.len() < n && rng.random_bool(0.2) {
                let k = recvs.len();
                recvs.push(Outstanding::new(
                    b.irecv(0, tag(k as u32), md[k], 0, sizes[k]).unwrap(),
                ));
            }
            a.progress().unwrap();
            // A receiver that reads now and then fills the sender's socket.
            if rng.random_bool(0.25) {
                b.progress().unwrap();
            }
            done = recvs.len() == n;
            for s in sends.iter_mut() {
                done &= s.poll(&mut a).unwrap();
            }
            for r in recvs.iter_mut() {
                done &= r.poll(&mut b).unwrap();
            }
            assert!(
                start.elapsed() < LIMIT,
                "seed {seed}: not every message arrived ({} of {n} receives posted)",
                recvs.len()
            );
        }
        for k in 0..n {
            assert!(
                dst[k] == src[k],
                "seed {seed}: message {k} ({} bytes) differs",
                sizes[k]
            );
        }
        // Every credit spent came back or is owed: nothing was lost in a
        // frame that was half written.
        assert_eq!(
            a.conns[&1].credits.available() + b.conns[&0].core.owed() as usize,
            8,
            "seed {seed}: frame credits"
        );
        drop((a, b));
    }
}
