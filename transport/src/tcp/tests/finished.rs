//! The finished-request count (`Transport::finished`) over real sockets.
//! The engine skips testing point-to-point messages while the count stays
//! the same, so a request must never become done without the count moving:
//! it would then never be tested again, and its message would hang.

use super::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// One side's requests: each tested only while the count moved since its
/// last pending test, as the engine does, and tested once more whenever the
/// count stood still, to catch one that finished without counting.
struct Side {
    reqs: Vec<Option<Request>>,
    seen: u64,
    done: usize,
}

impl Side {
    fn new(n: usize) -> Side {
        Side {
            reqs: Vec::with_capacity(n),
            seen: 0,
            done: 0,
        }
    }

    fn check(&mut self, t: &mut TcpTransport, what: &str) {
        let now = t.finished().expect("tcp counts finished requests");
        let still = now == self.seen;
        for slot in self.reqs.iter_mut() {
            let Some(r) = slot.take() else { continue };
            match t.test(r).unwrap() {
                Tested::Pending(r) => *slot = Some(r),
                Tested::Done => {
                    assert!(
                        !still,
                        "{what}: a request finished while the count stood at {now}"
                    );
                    self.done += 1;
                }
            }
        }
        self.seen = now;
    }
}

/// Random sizes (zero, small, announced, several segments), receives posted
/// before and after their messages, in random order, over one and two
/// lanes, few and many credits: every request finishes, each moves the count
/// exactly once, and none finishes unseen by the count.
#[test]
fn every_finished_request_moves_the_count_once() {
    for (seed, lanes, eager_frames) in [(1u64, 1, 1), (2, 2, 4), (3, 2, 0), (4, 1, 16)] {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut a, mut b) = pair_with(TcpConfig {
            lanes,
            segment_bytes: 64 * 1024,
            eager_frames,
            ..TcpConfig::default()
        });
        let n = 60;
        let sizes: Vec<usize> = (0..n)
            .map(|_| match rng.random_range(0..4) {
                0 => rng.random_range(0..=64),
                1 => rng.random_range(65..=SMALL_FRAME_BYTES + 10),
                2 => rng.random_range(16 * 1024..=80 * 1024),
                _ => rng.random_range(100 * 1024..=300 * 1024),
            })
            .collect();
        let Messages { src, dst, ms, md } = Messages::new(&mut a, &mut b, &sizes, pattern);
        let (mut sa, mut sb) = (Side::new(n), Side::new(n));
        let a0 = a.finished().unwrap();
        let b0 = b.finished().unwrap();
        sa.seen = a0;
        sb.seen = b0;
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let (mut next_send, mut next_recv) = (0, 0);
        let start = Instant::now();
        while sa.done < n || sb.done < n {
            if next_send < n && rng.random_bool(0.3) {
                let k = next_send;
                sa.reqs
                    .push(Some(a.isend(1, tag(k as u32), ms[k], 0, sizes[k]).unwrap()));
                next_send += 1;
            }
            if next_recv < n && rng.random_bool(0.3) {
                let k = order[next_recv];
                sb.reqs
                    .push(Some(b.irecv(0, tag(k as u32), md[k], 0, sizes[k]).unwrap()));
                next_recv += 1;
            }
            a.progress().unwrap();
            b.progress().unwrap();
            sa.check(&mut a, "sender");
            sb.check(&mut b, "receiver");
            assert!(
                start.elapsed() < LIMIT,
                "seed {seed}: not every request finished"
            );
        }
        assert_eq!(dst, src, "seed {seed}");
        assert_eq!(
            a.finished().unwrap() - a0,
            n as u64,
            "seed {seed}: sends counted"
        );
        assert_eq!(
            b.finished().unwrap() - b0,
            n as u64,
            "seed {seed}: receives counted"
        );
        drop((a, b));
    }
}
