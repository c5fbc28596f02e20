//! Small blocking all-reduces that the caller runs straight through
//! (`engine/direct.rs`): against ranks that run the recursive doubling
//! schedule instead, under random sizes and interleaved non-blocking calls,
//! and when the peer never comes.

mod common;

use common::{expected, input, on_each_rank, right};
use gw_collectives::local::local_world;
use gw_collectives::{Algo, Communicator, Error, RedOp, TransportChoice, direct_calls};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// Elements per segment: calls up to this many take the direct path.
const SEGMENT_ELEMS: usize = 2048;

fn world(
    transport: TransportChoice,
    n: u32,
    key: &str,
    scheduled: impl Fn(u32) -> bool,
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    local_world(n, key, |r, cfg| {
        cfg.transport.set(transport);
        cfg.algo.set(Some(Algo::Rd));
        cfg.segment_bytes.set(SEGMENT_ELEMS * 4);
        // A rank that does not drive its own calls runs every one as a
        // schedule on its engine thread.
        cfg.inline.set(!scheduled(r));
    })
    .expect("communicators")
}

/// Each rank makes `calls` all-reduces of random sizes (the same sequence on
/// every rank), some in place, some preceded by a non-blocking all-reduce
/// still running (so that the blocking one queues behind it), and checks
/// every element.
fn run(comms: Vec<Communicator>, calls: usize, seed: u64) {
    let n = comms.len() as u32;
    on_each_rank(comms, "rank", move |c| {
        let r = c.rank();
        let mut rng = StdRng::seed_from_u64(seed);
        for k in 0..calls {
            let count = rng.random_range(1..=SEGMENT_ELEMS + 64);
            let in_place = rng.random_bool(0.3);
            let op = if rng.random_bool(0.25) {
                RedOp::Avg
            } else {
                RedOp::Sum
            };
            let behind = rng.random_bool(0.2);
            let pending = if behind {
                let v: Vec<f32> = (0..count).map(|i| input(r, k + 1, i)).collect();
                Some(
                    c.iall_reduce(v, RedOp::Sum, None)
                        .map_err(|e| e.to_string())?,
                )
            } else {
                None
            };
            let send: Vec<f32> = (0..count).map(|i| input(r, k, i)).collect();
            let out = if in_place {
                let mut b = send;
                c.all_reduce_in_place(&mut b, op)
                    .map_err(|e| format!("call {k}: {e}"))?;
                b
            } else {
                let mut b = vec![0.0f32; count];
                c.all_reduce(&send, &mut b, op)
                    .map_err(|e| format!("call {k}: {e}"))?;
                b
            };
            for (i, &x) in out.iter().enumerate() {
                if !right(op, n, k, i, x) {
                    return Err(format!(
                        "rank {r} call {k} ({op:?} of {count} elements, in place {in_place}): element {i} is {x}, sum {}",
                        expected(n, k, i)
                    ));
                }
            }
            if let Some(p) = pending {
                let v = p.wait().map_err(|e| e.to_string())?;
                for (i, &x) in v.iter().enumerate() {
                    if x != expected(n, k + 1, i) {
                        return Err(format!(
                            "rank {r} non-blocking call after {k}: element {i} is {x}"
                        ));
                    }
                }
            }
        }
        Ok(())
    });
}

#[test]
fn direct_ranks_meet_ranks_running_the_schedule() {
    for transport in [TransportChoice::Shm, TransportChoice::Tcp] {
        for n in [2u32, 4] {
            // Rank 0 runs schedules; the others run small calls directly.
            let key = format!("mix{n}{transport:?}");
            let (_store, comms) = world(transport, n, &key, |r| r == 0);
            let before = direct_calls();
            run(comms, 120, u64::from(n));
            // Tests run in parallel threads, so only a lower bound holds:
            // most of the other ranks' calls (those not queued behind a
            // non-blocking one) went direct.
            let direct = direct_calls() - before;
            assert!(
                direct >= 60 * u64::from(n - 1),
                "{transport:?} n={n}: only {direct} direct calls"
            );
        }
    }
}

#[test]
fn stress_random_small_all_reduces_every_world_size() {
    for transport in [TransportChoice::Shm, TransportChoice::Tcp] {
        // 3 and 6 are not powers of two: their calls all take the schedule.
        for n in [1u32, 2, 3, 4, 6, 8] {
            let key = format!("st{n}{transport:?}");
            let (_store, comms) = world(transport, n, &key, |_| false);
            run(comms, 150, 100 + u64::from(n));
        }
    }
}

#[test]
fn a_peer_that_never_calls_is_named_when_the_direct_call_times_out() {
    let (_store, comms) = local_world(2, "direct-timeout", |_, cfg| {
        cfg.transport.set(TransportChoice::Tcp);
        cfg.algo.set(Some(Algo::Rd));
        cfg.timeout.set(Duration::from_millis(1500));
    })
    .expect("communicators");
    let send = [1.0f32; 2];
    let mut recv = [0.0f32; 2];
    let err = comms[0]
        .all_reduce(&send, &mut recv, RedOp::Sum)
        .expect_err("rank 1 never joins");
    match &err {
        Error::Timeout { what, .. } => assert!(
            what.contains("receiving from rank 1") && what.contains("8 B"),
            "{err}"
        ),
        other => panic!("expected a timeout, got {other}"),
    }
    // The communicator failed: later calls say so at once.
    let again = comms[0].all_reduce(&send, &mut recv, RedOp::Sum);
    assert!(
        matches!(&again, Err(Error::Aborted(m)) if m.contains("failed earlier")),
        "{again:?}"
    );
}

#[test]
fn abort_from_another_thread_ends_a_waiting_direct_call() {
    let (_store, comms) = local_world(2, "direct-abort", |_, cfg| {
        cfg.transport.set(TransportChoice::Shm);
        cfg.algo.set(Some(Algo::Rd));
        cfg.timeout.set(Duration::from_secs(60));
    })
    .expect("communicators");
    let c = &comms[0];
    let start = Instant::now();
    let res = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            c.abort();
        });
        let mut buf = [1.0f32; 2];
        // Rank 1 never calls: only the abort can end this.
        c.all_reduce_in_place(&mut buf, RedOp::Sum)
    });
    assert!(
        matches!(&res, Err(Error::Aborted(m)) if m.contains("aborted by the application")),
        "{res:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "abort took {:?}",
        start.elapsed()
    );
}
