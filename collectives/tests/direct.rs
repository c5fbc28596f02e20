//! Small blocking all-reduces and all-gathers that the caller runs straight
//! through (`engine/direct.rs`): against ranks that run the schedules
//! instead, under random sizes and interleaved non-blocking calls, and when
//! the peer never comes.

mod common;

use common::{expected, input, on_each_rank, right};
use gw_collectives::local::local_world;
use gw_collectives::{Algo, Communicator, Error, Pending, RedOp, TransportChoice, direct_calls};
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
    world_with_segments(transport, n, key, scheduled, SEGMENT_ELEMS)
}

/// [`world`] with segments of `segment_elems` elements.
fn world_with_segments(
    transport: TransportChoice,
    n: u32,
    key: &str,
    scheduled: impl Fn(u32) -> bool,
    segment_elems: usize,
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    local_world(n, key, |r, cfg| {
        cfg.transport.set(transport);
        cfg.algo.set(Some(Algo::Rd));
        cfg.segment_bytes.set(segment_elems * 4);
        // A rank that does not drive its own calls runs every one as a
        // schedule on its engine thread.
        cfg.inline.set(!scheduled(r));
    })
    .expect("communicators")
}

/// An average one time in four, else a sum.
fn random_op(rng: &mut StdRng) -> RedOp {
    if rng.random_bool(0.25) {
        RedOp::Avg
    } else {
        RedOp::Sum
    }
}

/// In one call of five, a non-blocking all-reduce of call `k + 1`'s input,
/// started so that the blocking call `k` after it queues behind it.
fn maybe_pending(
    c: &Communicator,
    rng: &mut StdRng,
    k: usize,
    count: usize,
) -> Result<Option<Pending<Vec<f32>>>, String> {
    if !rng.random_bool(0.2) {
        return Ok(None);
    }
    let v: Vec<f32> = (0..count).map(|i| input(c.rank(), k + 1, i)).collect();
    c.iall_reduce(v, RedOp::Sum, None)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Waits for [`maybe_pending`]'s all-reduce and checks every element.
fn check_pending(
    pending: Option<Pending<Vec<f32>>>,
    n: u32,
    r: u32,
    k: usize,
) -> Result<(), String> {
    let Some(p) = pending else { return Ok(()) };
    let v = p.wait().map_err(|e| e.to_string())?;
    for (i, &x) in v.iter().enumerate() {
        if x != expected(n, k + 1, i) {
            return Err(format!(
                "rank {r} non-blocking call after {k}: element {i} is {x}"
            ));
        }
    }
    Ok(())
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
            let op = random_op(&mut rng);
            let pending = maybe_pending(&c, &mut rng, k, count)?;
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
            check_pending(pending, n, r, k)?;
        }
        Ok(())
    });
}

/// A random call sequence: `(communicators, calls, seed)`.
type Run = fn(Vec<Communicator>, usize, u64);

/// Over shm and TCP at 2, 4 and 8 ranks, rank 0 runs schedules (its engine
/// thread runs every call) while the others run small calls directly; at
/// least `direct_per_rank` calls of each of those must have gone direct.
fn meet_ranks_running_schedules(what: &str, run: Run, calls: usize, direct_per_rank: u64) {
    for transport in [TransportChoice::Shm, TransportChoice::Tcp] {
        for n in [2u32, 4, 8] {
            let key = format!("{what}mix{n}{transport:?}");
            let (_store, comms) = world(transport, n, &key, |r| r == 0);
            let before = direct_calls();
            run(comms, calls, u64::from(n));
            // Tests run in parallel threads, so only a lower bound holds:
            // most of the other ranks' calls (those not queued behind a
            // non-blocking one) went direct.
            let direct = direct_calls() - before;
            assert!(
                direct >= direct_per_rank * u64::from(n - 1),
                "{what} {transport:?} n={n}: only {direct} direct calls"
            );
        }
    }
}

/// Over shm and TCP at every world size from 1 to 8 but 5 and 7 (3 and 6
/// are not powers of two: their calls all take schedules).
fn stress_every_world_size(what: &str, run: Run, calls: usize, seed: u64) {
    for transport in [TransportChoice::Shm, TransportChoice::Tcp] {
        for n in [1u32, 2, 3, 4, 6, 8] {
            let key = format!("{what}st{n}{transport:?}");
            let (_store, comms) = world(transport, n, &key, |_| false);
            run(comms, calls, seed + u64::from(n));
        }
    }
}

#[test]
fn direct_ranks_meet_ranks_running_the_schedule() {
    meet_ranks_running_schedules("ar", run, 120, 60);
}

#[test]
fn stress_random_small_all_reduces_every_world_size() {
    stress_every_world_size("ar", run, 150, 100);
}

/// Each rank makes `calls` all-gathers of random block sizes (the same
/// sequence on every rank; from one element to past the segment and past
/// the direct path's 64 KiB), some in place, some behind a non-blocking
/// all-gather still running, and checks every element.
fn run_gathers(comms: Vec<Communicator>, calls: usize, seed: u64) {
    let n = comms.len();
    on_each_rank(comms, "rank", move |c| {
        let r = c.rank();
        let mut rng = StdRng::seed_from_u64(seed);
        let block =
            |k: usize, count: usize| -> Vec<f32> { (0..count).map(|i| input(r, k, i)).collect() };
        let check = |what: &str, k: usize, count: usize, out: &[f32]| {
            for (i, &x) in out.iter().enumerate() {
                let want = input((i / count) as u32, k, i % count);
                if x != want {
                    return Err(format!(
                        "rank {r} {what} {k} ({count} elements a rank): element {i} is {x}, not {want}"
                    ));
                }
            }
            Ok(())
        };
        for k in 0..calls {
            let count = if rng.random_bool(0.8) {
                rng.random_range(1..=SEGMENT_ELEMS)
            } else {
                rng.random_range(SEGMENT_ELEMS..=(64 << 10) / 4)
            };
            let pending = if rng.random_bool(0.2) {
                let recv = vec![0.0f32; count * n];
                Some(
                    c.iall_gather(block(k + 1, count), recv)
                        .map_err(|e| e.to_string())?,
                )
            } else {
                None
            };
            let mut out = vec![0.0f32; count * n];
            if rng.random_bool(0.3) {
                out[r as usize * count..][..count].copy_from_slice(&block(k, count));
                c.all_gather_in_place(&mut out)
            } else {
                c.all_gather(&block(k, count), &mut out)
            }
            .map_err(|e| format!("call {k}: {e}"))?;
            check("call", k, count, &out)?;
            if let Some(p) = pending {
                let (_, v) = p.wait().map_err(|e| e.to_string())?;
                check("non-blocking call after", k + 1, count, &v)?;
            }
        }
        Ok(())
    });
}

#[test]
fn direct_all_gathers_meet_ranks_running_the_schedule() {
    meet_ranks_running_schedules("ag", run_gathers, 80, 30);
}

#[test]
fn stress_random_all_gathers_every_world_size() {
    stress_every_world_size("ag", run_gathers, 100, 200);
}

/// Each rank makes `calls` reduce-scatters of random block sizes (the same
/// sequence on every rank; inputs from one element a rank to past the
/// segment and past the direct path's 64 KiB), sums and averages, some in
/// place, some behind a non-blocking all-reduce still running, and checks
/// every element.
fn run_scatters(comms: Vec<Communicator>, calls: usize, seed: u64) {
    let n = comms.len();
    on_each_rank(comms, "rank", move |c| {
        let r = c.rank();
        let mut rng = StdRng::seed_from_u64(seed);
        for k in 0..calls {
            let count = if rng.random_bool(0.8) {
                rng.random_range(1..=SEGMENT_ELEMS / n)
            } else {
                rng.random_range(1..=(64 << 10) / 4)
            };
            let op = random_op(&mut rng);
            let pending = maybe_pending(&c, &mut rng, k, count)?;
            let send: Vec<f32> = (0..count * n).map(|i| input(r, k, i)).collect();
            let in_place = rng.random_bool(0.3);
            let out = if in_place {
                let mut b = send;
                c.reduce_scatter_in_place(&mut b, op)
                    .map_err(|e| format!("call {k}: {e}"))?;
                b[r as usize * count..][..count].to_vec()
            } else {
                let mut b = vec![0.0f32; count];
                c.reduce_scatter(&send, &mut b, op)
                    .map_err(|e| format!("call {k}: {e}"))?;
                b
            };
            let first = r as usize * count;
            for (i, &x) in out.iter().enumerate() {
                if !right(op, n as u32, k, first + i, x) {
                    return Err(format!(
                        "rank {r} call {k} ({op:?}, {count} elements a rank, in place {in_place}): element {i} is {x}, sum {}",
                        expected(n as u32, k, first + i)
                    ));
                }
            }
            check_pending(pending, n as u32, r, k)?;
        }
        Ok(())
    });
}

#[test]
fn direct_reduce_scatters_meet_ranks_running_the_schedule() {
    meet_ranks_running_schedules("rs", run_scatters, 80, 30);
}

#[test]
fn stress_random_reduce_scatters_every_world_size() {
    stress_every_world_size("rs", run_scatters, 100, 300);
}

/// Each rank makes `calls` broadcasts and reduces (sums and averages) of
/// random sizes from random roots (the same sequence on every rank; up to
/// past the segment and past 64 KiB), some in place, some behind a
/// non-blocking all-reduce still running, and checks every element (a
/// reduce at its root only).
fn run_trees(comms: Vec<Communicator>, calls: usize, seed: u64) {
    let n = comms.len() as u32;
    on_each_rank(comms, "rank", move |c| {
        let r = c.rank();
        let mut rng = StdRng::seed_from_u64(seed);
        for k in 0..calls {
            let count = if rng.random_bool(0.8) {
                rng.random_range(1..=SEGMENT_ELEMS)
            } else {
                rng.random_range(1..=(64 << 10) / 4 + 64)
            };
            let root = rng.random_range(0..n);
            let reduce = rng.random_bool(0.5);
            let op = random_op(&mut rng);
            let in_place = rng.random_bool(0.3);
            let pending = maybe_pending(&c, &mut rng, k, count)?;
            let mine: Vec<f32> = (0..count).map(|i| input(r, k, i)).collect();
            let what = if reduce { "reduce" } else { "broadcast" };
            let out = match (reduce, in_place) {
                (true, true) => {
                    let mut b = mine;
                    c.reduce_in_place(&mut b, op, root).map(|()| b)
                }
                (true, false) => {
                    let mut b = vec![0.0f32; count];
                    c.reduce(&mine, &mut b, op, root).map(|()| b)
                }
                (false, true) => {
                    let mut b = if r == root { mine } else { vec![0.0f32; count] };
                    c.broadcast(&mut b, root).map(|()| b)
                }
                (false, false) => {
                    let mut b = vec![0.0f32; count];
                    c.broadcast_from(&mine, &mut b, root).map(|()| b)
                }
            }
            .map_err(|e| format!("call {k} ({what}): {e}"))?;
            for (i, &x) in out.iter().enumerate() {
                let ok = match (reduce, r == root) {
                    (true, true) => right(op, n, k, i, x),
                    (true, false) => true,
                    (false, _) => x == input(root, k, i),
                };
                if !ok {
                    return Err(format!(
                        "rank {r} call {k} ({what} {op:?} from root {root}, {count} elements, in place {in_place}): element {i} is {x}"
                    ));
                }
            }
            check_pending(pending, n, r, k)?;
        }
        Ok(())
    });
}

#[test]
fn direct_broadcasts_and_reduces_meet_ranks_running_the_schedule() {
    meet_ranks_running_schedules("tree", run_trees, 80, 30);
}

#[test]
fn stress_random_broadcasts_and_reduces_every_world_size() {
    stress_every_world_size("tree", run_trees, 100, 400);
}

/// Elements per segment in [`large_direct_calls_of_every_kind`]:
/// 64 KiB, so that calls from 16 KiB up take the direct path too.
const LARGE_SEGMENT_ELEMS: usize = 16 << 10;

/// Each rank makes `calls` broadcasts and reduces (random roots),
/// all-gathers and reduce-scatters of 16-64 KiB (a rank's block, for an
/// all-gather; the whole input, for a reduce-scatter), some in place, and
/// checks every element (a reduce's at its root).
fn run_large(comms: Vec<Communicator>, calls: usize, seed: u64) {
    let n = comms.len() as u32;
    on_each_rank(comms, "rank", move |c| {
        let r = c.rank();
        let mut rng = StdRng::seed_from_u64(seed);
        for k in 0..calls {
            let count = rng.random_range(LARGE_SEGMENT_ELEMS / 4..=LARGE_SEGMENT_ELEMS);
            let in_place = rng.random_bool(0.5);
            let mine: Vec<f32> = (0..count).map(|i| input(r, k, i)).collect();
            let kind = rng.random_range(0..4);
            if kind == 3 {
                // The whole input within one segment: 16-64 KiB in all.
                let per = count / n as usize;
                let op = random_op(&mut rng);
                let send: Vec<f32> = (0..per * n as usize).map(|i| input(r, k, i)).collect();
                let mut out = vec![0.0f32; per];
                c.reduce_scatter(&send, &mut out, op)
                    .map_err(|e| format!("call {k} (reduce-scatter): {e}"))?;
                let first = r as usize * per;
                if let Some(j) = (0..per).find(|&j| !right(op, n, k, first + j, out[j])) {
                    return Err(format!(
                        "rank {r} call {k} ({op:?} reduce-scatter of {per} elements a rank): element {j} is {}, sum {}",
                        out[j],
                        expected(n, k, first + j)
                    ));
                }
            } else if kind == 0 {
                let root = rng.random_range(0..n);
                let op = random_op(&mut rng);
                let out = if in_place {
                    let mut b = mine;
                    c.reduce_in_place(&mut b, op, root).map(|()| b)
                } else {
                    let mut b = vec![0.0f32; count];
                    c.reduce(&mine, &mut b, op, root).map(|()| b)
                }
                .map_err(|e| format!("call {k} (reduce): {e}"))?;
                let wrong = (0..count).find(|&i| !right(op, n, k, i, out[i]));
                if let (true, Some(i)) = (r == root, wrong) {
                    return Err(format!(
                        "rank {r} call {k} ({op:?} reduce to {root}, {count} elements, in place {in_place}): element {i} is {}, sum {}",
                        out[i],
                        expected(n, k, i)
                    ));
                }
            } else if kind == 1 {
                let root = rng.random_range(0..n);
                let out = if in_place {
                    let mut b = if r == root { mine } else { vec![0.0f32; count] };
                    c.broadcast(&mut b, root).map(|()| b)
                } else {
                    let mut b = vec![0.0f32; count];
                    c.broadcast_from(&mine, &mut b, root).map(|()| b)
                }
                .map_err(|e| format!("call {k} (broadcast): {e}"))?;
                if let Some(i) = (0..count).find(|&i| out[i] != input(root, k, i)) {
                    return Err(format!(
                        "rank {r} call {k} (broadcast from {root}, {count} elements, in place {in_place}): element {i} is {}",
                        out[i]
                    ));
                }
            } else {
                let mut out = vec![0.0f32; count * n as usize];
                if in_place {
                    out[r as usize * count..][..count].copy_from_slice(&mine);
                    c.all_gather_in_place(&mut out)
                } else {
                    c.all_gather(&mine, &mut out)
                }
                .map_err(|e| format!("call {k} (all-gather): {e}"))?;
                let want = |i: usize| input((i / count) as u32, k, i % count);
                if let Some(i) = (0..out.len()).find(|&i| out[i] != want(i)) {
                    return Err(format!(
                        "rank {r} call {k} (all-gather of {count} elements a rank, in place {in_place}): element {i} is {}, not {}",
                        out[i],
                        want(i)
                    ));
                }
            }
        }
        Ok(())
    });
}

/// Broadcasts, reduces, all-gathers and reduce-scatters of 16-64 KiB on
/// the direct path: between two ranks with a core each over shm a
/// broadcast's message is pulled straight into the receiver's output, a
/// reduce's from 32 KiB into scratch, an all-gather's blocks into their
/// place and a reduce-scatter's halves (from 16 KiB) into scratch. Over shm and TCP,
/// at 2 and 4 ranks, every rank direct or rank 0 running the schedules.
#[test]
fn large_direct_calls_of_every_kind() {
    for transport in [TransportChoice::Shm, TransportChoice::Tcp] {
        for n in [2u32, 4] {
            for mixed in [false, true] {
                let key = format!("large{n}{mixed}{transport:?}");
                let scheduled = move |r: u32| mixed && r == 0;
                let (_store, comms) =
                    world_with_segments(transport, n, &key, scheduled, LARGE_SEGMENT_ELEMS);
                let before = direct_calls();
                run_large(comms, 40, 7 + u64::from(n));
                let direct = direct_calls() - before;
                assert!(
                    direct >= 20 * u64::from(n - 1),
                    "{transport:?} n={n} mixed={mixed}: only {direct} direct calls"
                );
            }
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
    let mut gathered = [0.0f32; 4];
    let again = comms[0].all_gather(&send, &mut gathered);
    assert!(
        matches!(&again, Err(Error::Aborted(m)) if m.contains("failed earlier")),
        "{again:?}"
    );
    let again = comms[0].all_reduce(&send, &mut recv, RedOp::Sum);
    assert!(
        matches!(&again, Err(Error::Aborted(m)) if m.contains("failed earlier")),
        "{again:?}"
    );
}

#[test]
fn a_peer_that_never_calls_is_named_when_a_direct_all_gather_times_out() {
    let (_store, comms) = local_world(4, "direct-gather-timeout", |_, cfg| {
        cfg.transport.set(TransportChoice::Shm);
        // The direct path's timeout, not the host region's (host_coll.rs).
        cfg.host_coll_bytes.set(0);
        cfg.timeout.set(Duration::from_millis(1500));
    })
    .expect("communicators");
    // Ranks 0 and 1 call, 2 and 3 never do: rank 0 gets rank 1's block in
    // round 0, then waits for rank 2's pair in round 1.
    let res: Vec<_> = std::thread::scope(|s| {
        let calls: Vec<_> = comms[..2]
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let send = [1.0f32; 3];
                    let mut recv = [0.0f32; 12];
                    c.all_gather(&send, &mut recv)
                })
            })
            .collect();
        calls.into_iter().map(|t| t.join().expect("rank")).collect()
    });
    // Whichever rank times out first names the rank it waits for; the
    // other learns of that failure, or times out itself.
    let named = |m: &str| {
        m.contains("all_gather")
            && m.contains("12 B")
            && (m.contains("receiving from rank 2") || m.contains("receiving from rank 3"))
    };
    for (r, out) in res.iter().enumerate() {
        match out {
            Err(Error::Timeout { what, .. }) => assert!(named(what), "rank {r}: {what}"),
            Err(Error::Aborted(m)) => assert!(named(m), "rank {r}: {m}"),
            other => panic!("rank {r}: expected a timeout, got {other:?}"),
        }
    }
    assert!(
        res.iter().any(|o| matches!(o, Err(Error::Timeout { .. }))),
        "{res:?}"
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
