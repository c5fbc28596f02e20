//! Persistent all-reduces through a host region (`host_rounds.rs`): which
//! requests take it, that every rank agrees, and that rounds are right
//! however ranks start, test and wait — many rounds of random sizes,
//! operators, types and weights at 2, 3 and 4 ranks, every element checked
//! — and that a rank that never starts is named by the wait that gives up.

#[allow(dead_code)] // only `on_each_rank` is used here
mod common;

use common::{agrees, fold, get, on_each_rank, put, shm_world, small};
use gw_collectives::{Communicator, Config, DType, Error, OpKind, RawOp, RedOp, TransportChoice};
use rand::{Rng, SeedableRng};
use std::time::Duration;

fn world(
    n: u32,
    key: &str,
    tweak: impl Fn(u32, &mut Config),
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    shm_world(n, key, |r, cfg| {
        // On whatever cores the test machine has: the crowded default
        // would keep 4 ranks on 2 cores to 2 KiB.
        cfg.host_round_bytes.set(64 << 10);
        tweak(r, cfg);
    })
}

/// One persistent all-reduce of `count` elements of `dtype` under `op`
/// (weighted by `weight` if given; in place if `in_place`), run for
/// `rounds` rounds with the completion style of `style`.
#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    op: RedOp,
    count: usize,
    weight: Option<f64>,
    in_place: bool,
}

fn want(case: &Case, n: u32, k: usize, i: usize) -> f64 {
    match case.weight {
        // Every rank weighs its own contribution: Σ w·x.
        Some(w) => (0..n).map(|r| w * small(r, k, i)).sum(),
        None => fold(case.op, (0..n).map(|r| small(r, k, i)), n),
    }
}

/// Runs `cases` one after another on `c`, `rounds` rounds each, two
/// requests alive at once (each case beside the next), every element of
/// every round checked. `seed` picks each round's completion style, the
/// same on every rank.
fn run_cases(c: &Communicator, cases: &[Case], rounds: usize, seed: u64) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for pair in cases.chunks(2) {
        let mut bufs: Vec<(Vec<u8>, Vec<u8>)> = pair
            .iter()
            .map(|cs| {
                let b = cs.count * cs.dtype.size();
                (vec![0u8; b.max(1)], vec![0u8; b.max(1)])
            })
            .collect();
        let mut reqs = Vec::new();
        for (cs, (s, rv)) in pair.iter().zip(bufs.iter_mut()) {
            let send = s.as_mut_ptr();
            let op = RawOp {
                kind: OpKind::AllReduce,
                dtype: cs.dtype,
                redop: cs.op,
                count: cs.count,
                root: 0,
                send,
                recv: if cs.in_place { send } else { rv.as_mut_ptr() },
                weight: cs.weight,
            };
            // SAFETY: the buffers live until the end of this pair, after
            // every request's last wait and free.
            let p =
                unsafe { c.prepare_raw(op, None) }.map_err(|e| format!("rank {r}: {cs:?}: {e}"))?;
            if !p.on_host() {
                return Err(format!("rank {r}: {cs:?} is not on the host region"));
            }
            reqs.push(p);
        }
        for k in 0..rounds {
            for (cs, (s, _)) in pair.iter().zip(bufs.iter_mut()) {
                for i in 0..cs.count {
                    put(cs.dtype, s, i, small(r, k, i));
                }
            }
            let style = rng.random_range(0..6u32);
            let err = |e: Error| format!("rank {r} round {k} style {style}: {e}");
            for p in &reqs {
                // SAFETY: as above; nothing touches the buffers until the wait.
                unsafe { p.start(c) }.map_err(err)?;
            }
            match style {
                // Both waited, in order.
                0 => {
                    for p in &reqs {
                        p.wait(c).map_err(err)?;
                    }
                }
                // In reverse order.
                1 => {
                    for p in reqs.iter().rev() {
                        p.wait(c).map_err(err)?;
                    }
                }
                // An ordinary collective between start and wait.
                2 => {
                    let mut x = [f64::from(r) + 1.0; 3];
                    c.all_reduce_in_place(&mut x, RedOp::Sum).map_err(err)?;
                    if x != [f64::from(n * (n + 1) / 2); 3] {
                        return Err(format!("round {k}: the ordinary call gave {x:?}"));
                    }
                    for p in &reqs {
                        p.wait(c).map_err(err)?;
                    }
                }
                // Rank 0 polls with test, the others wait.
                3 => {
                    for p in &reqs {
                        if r == 0 {
                            while !p.test(c).map_err(err)? {
                                std::thread::yield_now();
                            }
                        } else {
                            p.wait(c).map_err(err)?;
                        }
                    }
                }
                // Rank 0 dawdles between its start and its wait, so the
                // others finish the round and start the next one before it
                // reads this one: their next contributions must not land
                // where it is about to read.
                4 => {
                    if r == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    for p in &reqs {
                        p.wait(c).map_err(err)?;
                    }
                }
                // Timed waits.
                _ => {
                    for p in &reqs {
                        if !p.wait_timeout(c, Duration::from_secs(30)).map_err(err)? {
                            return Err(format!("round {k}: a timed wait of 30 s ran out"));
                        }
                    }
                }
            }
            for (cs, (s, rv)) in pair.iter().zip(bufs.iter()) {
                let out = if cs.in_place { s } else { rv };
                for i in 0..cs.count {
                    let (got, w) = (get(cs.dtype, out, i), want(cs, n, k, i));
                    if !agrees(got, w, cs.op == RedOp::Avg || cs.weight.is_some()) {
                        return Err(format!(
                            "rank {r} {cs:?} round {k} element {i}: {got}, want {w}"
                        ));
                    }
                }
            }
        }
        for p in &reqs {
            p.free(c).map_err(|e| format!("rank {r}: free: {e}"))?;
        }
    }
    Ok(())
}

/// Random cases, the same on every rank (from `seed`).
fn random_cases(seed: u64, k: usize) -> Vec<Case> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..k)
        .map(|_| {
            let dtype = [DType::F32, DType::F64, DType::I32][rng.random_range(0..3)];
            let ops: &[RedOp] = if dtype == DType::I32 {
                &[RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max]
            } else {
                &RedOp::ALL
            };
            let op = ops[rng.random_range(0..ops.len())];
            // Up to 64 KiB, odd counts included.
            let count = rng.random_range(1..=(64 << 10) / 8);
            let weight = (dtype != DType::I32 && op == RedOp::Sum && rng.random_bool(0.3))
                .then(|| f64::from(rng.random_range(1..4u32)) * 0.5);
            Case {
                dtype,
                op,
                count,
                weight,
                in_place: rng.random_bool(0.5),
            }
        })
        .collect()
}

#[test]
fn random_rounds_are_right_at_2_3_and_4_ranks() {
    let seed = common::seed(0x5eed_u64);
    for n in [2u32, 3, 4] {
        let key = format!("hr-rand{n}");
        let (_store, comms) = world(n, &key, |_, _| {});
        let cases = random_cases(seed + u64::from(n), 6);
        on_each_rank(comms, &key, move |c| run_cases(&c, &cases, 60, seed));
    }
}

/// Tiny and odd sizes, every operator, many rounds: the parities alternate
/// hundreds of times while ranks run ahead of each other.
#[test]
fn many_small_rounds_with_every_operator() {
    let cases: Vec<Case> = RedOp::ALL
        .iter()
        .flat_map(|&op| {
            [1usize, 3, 17].into_iter().map(move |count| Case {
                dtype: DType::F64,
                op,
                count,
                weight: None,
                in_place: count == 3,
            })
        })
        .collect();
    for n in [2u32, 4] {
        let key = format!("hr-small{n}");
        let (_store, comms) = world(n, &key, |_, _| {});
        let cases = cases.clone();
        on_each_rank(comms, &key, move |c| run_cases(&c, &cases, 300, 7));
    }
}

/// Which requests take the host region, and that a rank that cannot (here:
/// `GW_HOST_ROUND_BYTES=0` on one rank only) keeps every rank off it.
#[test]
fn every_rank_agrees_on_the_path() {
    // (what, world tweak, count, on host)
    type Tweak = fn(u32, &mut Config);
    let cases: [(&str, Tweak, usize, bool); 5] = [
        ("default", |_, _| {}, 100, true),
        ("above the limit", |_, _| {}, (64 << 10) / 4 + 1, false),
        (
            "one rank says 0",
            |r, cfg| {
                if r == 1 {
                    cfg.host_round_bytes.set(0);
                }
            },
            100,
            false,
        ),
        (
            "GW_ALGO",
            |_, cfg| cfg.algo.set(Some(gw_collectives::Algo::Ring)),
            100,
            false,
        ),
        (
            "tcp",
            |_, cfg| cfg.transport.set(TransportChoice::Tcp),
            100,
            false,
        ),
    ];
    for (i, (what, tweak, count, host)) in cases.into_iter().enumerate() {
        let key = format!("hr-agree{i}");
        let (_store, comms) = world(3, &key, tweak);
        on_each_rank(comms, what, move |c| {
            let r = c.rank();
            let mut send = vec![r as f32 + 1.0; count];
            let mut recv = vec![0f32; count];
            let mut p = c
                .all_reduce_init(&mut send, &mut recv, RedOp::Sum)
                .map_err(|e| format!("{what}: rank {r}: {e}"))?;
            if p.on_host() != host {
                return Err(format!(
                    "{what}: rank {r}: on host {}, want {host}",
                    p.on_host()
                ));
            }
            for _ in 0..3 {
                p.start().map_err(|e| e.to_string())?;
                p.wait().map_err(|e| e.to_string())?;
            }
            match p.recv().map_err(|e| e.to_string())? {
                x if x.iter().all(|&v| v == 6.0) => Ok(()),
                x => Err(format!("{what}: rank {r}: got {:?}", &x[..3])),
            }
        });
    }
}

/// A round whose ranks do not all start: a timed wait says "not yet", and
/// past `GW_TIMEOUT` the wait fails naming the rank that never started.
/// Starting again while the round runs is refused.
#[test]
fn a_rank_that_never_starts_is_named() {
    let (_store, comms) = world(3, "hr-late", |_, cfg| {
        cfg.timeout.set(Duration::from_secs(2))
    });
    let gate = std::sync::Arc::new(std::sync::Barrier::new(3));
    on_each_rank(comms, "hr-late", move |c| {
        let r = c.rank();
        let mut buf = vec![1f64; 10];
        let mut p = c
            .all_reduce_init_in_place(&mut buf, RedOp::Sum)
            .map_err(|e| e.to_string())?;
        if r != 2 {
            p.start().map_err(|e| e.to_string())?;
            if p.wait_timeout(Duration::from_millis(50))
                .map_err(|e| e.to_string())?
            {
                return Err(format!("rank {r}: the round finished without rank 2"));
            }
            match p.start() {
                Err(Error::InvalidUsage(m)) if m.contains("still running") => {}
                other => return Err(format!("rank {r}: a second start gave {other:?}")),
            }
            match p.wait() {
                Err(Error::Timeout { what, .. }) if what.contains("[2]") => {}
                other => return Err(format!("rank {r}: the wait gave {other:?}")),
            }
        }
        gate.wait();
        // Rank 2 starts at last; everyone then completes the round.
        if r == 2 {
            p.start().map_err(|e| e.to_string())?;
        }
        p.wait().map_err(|e| format!("rank {r}: {e}"))?;
        match p.recv().map_err(|e| e.to_string())? {
            x if x.iter().all(|&v| v == 3.0) => Ok(()),
            x => Err(format!("rank {r}: got {x:?}")),
        }
    });
}

/// A rank that aborts its communicator, or frees its request, instead of
/// starting the round the others wait for: they stop within a liveness
/// check, naming it and why, long before `GW_TIMEOUT`.
#[test]
fn the_others_stop_when_a_rank_aborts_or_frees_its_request() {
    for how in ["aborted its communicator", "freed its persistent request"] {
        let key = format!("hr-left-{}", &how[..5]);
        let (_store, comms) = world(3, &key, |_, cfg| cfg.timeout.set(Duration::from_secs(30)));
        let gate = std::sync::Arc::new(std::sync::Barrier::new(3));
        on_each_rank(comms, &key, move |c| {
            let r = c.rank();
            // Two gates: rank 2 leaves between them. A rank that fails
            // early still passes both, so the others fail rather than hang.
            let mut passed = 0;
            let mut gate_wait = || {
                passed += 1;
                gate.wait();
            };
            let mut buf = vec![1f32; 100];
            let mut p = match c.all_reduce_init_in_place(&mut buf, RedOp::Sum) {
                Ok(p) if p.on_host() => Some(p),
                Ok(_) => None,
                Err(e) => {
                    gate_wait();
                    gate_wait();
                    return Err(format!("rank {r}: {e}"));
                }
            };
            // One round everyone runs, then rank 2 leaves.
            let first = match p.as_mut() {
                None => Err(format!("rank {r}: the request is not on the host region")),
                Some(p) => p
                    .start()
                    .and_then(|()| p.wait())
                    .map_err(|e| format!("rank {r}: {e}")),
            };
            if r == 2 {
                gate_wait();
                if how.starts_with("aborted") {
                    c.abort();
                    gate_wait();
                    drop(p);
                } else {
                    drop(p);
                    gate_wait();
                }
                return first;
            }
            let started = match (first, p.as_mut()) {
                (Ok(()), Some(p)) => p.start().map_err(|e| format!("rank {r}: {e}")),
                (Err(e), _) => Err(e),
                (Ok(()), None) => Err(format!("rank {r}: no request")),
            };
            gate_wait();
            let t0 = std::time::Instant::now();
            let got = match (started, p.as_mut()) {
                (Ok(()), Some(p)) => p.wait().map_err(|e| (e, t0.elapsed())),
                (Err(e), _) => {
                    gate_wait();
                    return Err(e);
                }
                (Ok(()), None) => Ok(()),
            };
            gate_wait();
            debug_assert_eq!(passed, 2);
            match got {
                Err((Error::Remote { rank: 2, what, .. }, waited))
                    if what.contains(how) && waited < Duration::from_secs(10) =>
                {
                    Ok(())
                }
                other => Err(format!("rank {r}: the wait gave {other:?}")),
            }
        });
    }
}
