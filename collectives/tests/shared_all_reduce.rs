//! Persistent all-reduces on buffers the communicator allocates
//! (`shared_all_reduce.rs`): where they run, that every rank agrees, that
//! rounds are right however ranks start, test and wait — many rounds of
//! random sizes, operators, types and placements at 1 to 4 ranks, every
//! element of every rank checked — and that a rank that never starts, or
//! leaves, is named by the others' waits.

#[allow(dead_code)] // only some helpers are used here
mod common;

use common::{agrees, fold, get, on_each_rank, put, small};
use gw_collectives::{Communicator, Config, DType, Error, RawSharedAllReduce, RedOp};
use gw_collectives::{TransportChoice, local::local_world};
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// A world over shared memory where every size takes the region: the
/// default keeps small calls private where ranks outnumber cores, as 3
/// and 4 ranks do on a 2-core machine.
fn shm_world(
    n: u32,
    key: &str,
    tweak: impl Fn(u32, &mut Config),
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    common::shm_world(n, key, |r, cfg| {
        cfg.host_round_bytes.set(1 << 30);
        tweak(r, cfg);
    })
}

#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    op: RedOp,
    count: usize,
    in_place: bool,
}

/// The request's buffers as bytes.
fn send_bytes(p: &mut RawSharedAllReduce) -> &mut [u8] {
    let len = p.count() * p.dtype().size();
    // SAFETY: the request owns `len` bytes there for its life; callers use
    // this only while no round runs, and `&mut` excludes other views.
    unsafe { std::slice::from_raw_parts_mut(p.send_ptr(), len) }
}

fn recv_bytes(p: &RawSharedAllReduce) -> &[u8] {
    let len = p.count() * p.dtype().size();
    // SAFETY: as send_bytes.
    unsafe { std::slice::from_raw_parts(p.recv_ptr(), len) }
}

/// Runs `cases` two at a time on `c` (two requests alive at once), `rounds`
/// rounds each, every element checked. `seed` picks each round's way of
/// completing, the same on every rank; `on_host` is where the requests
/// must run.
fn run_cases(
    c: &Communicator,
    cases: &[Case],
    rounds: usize,
    seed: u64,
    on_host: bool,
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for pair in cases.chunks(2) {
        let mut reqs = Vec::new();
        for cs in pair {
            let p = c
                .shared_all_reduce_init_raw(cs.dtype, cs.count, cs.op, cs.in_place)
                .map_err(|e| format!("rank {r}: {cs:?}: {e}"))?;
            if p.on_host() != on_host {
                return Err(format!("rank {r}: {cs:?}: on host {}", p.on_host()));
            }
            if recv_bytes(&p).iter().any(|&b| b != 0) {
                return Err(format!("rank {r}: {cs:?}: a new buffer is not zeroed"));
            }
            reqs.push(p);
        }
        for k in 0..rounds {
            for (cs, p) in pair.iter().zip(&mut reqs) {
                let s = send_bytes(p);
                for i in 0..cs.count {
                    put(cs.dtype, s, i, small(r, k, i));
                }
            }
            let style = rng.random_range(0..6u32);
            let err = |e: Error| format!("rank {r} round {k} style {style}: {e}");
            for p in &mut reqs {
                // SAFETY: nothing touches the buffers until the wait.
                unsafe { p.start(c) }.map_err(err)?;
            }
            match style {
                0 => {
                    for p in &mut reqs {
                        p.wait(c).map_err(err)?;
                    }
                }
                1 => {
                    for p in reqs.iter_mut().rev() {
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
                    for p in &mut reqs {
                        p.wait(c).map_err(err)?;
                    }
                }
                // Rank 0 polls with test, the others wait.
                3 => {
                    for p in &mut reqs {
                        if r == 0 {
                            while !p.test(c).map_err(err)? {
                                std::thread::yield_now();
                            }
                        } else {
                            p.wait(c).map_err(err)?;
                        }
                    }
                }
                // Rank 0 dawdles between its start and its wait: the others
                // reduce its slices' inputs meanwhile and wait for its own.
                4 => {
                    if r == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    for p in &mut reqs {
                        p.wait(c).map_err(err)?;
                    }
                }
                _ => {
                    for p in &mut reqs {
                        if !p.wait_timeout(c, Duration::from_secs(30)).map_err(err)? {
                            return Err(format!("round {k}: a timed wait of 30 s ran out"));
                        }
                    }
                }
            }
            for (cs, p) in pair.iter().zip(&reqs) {
                let out = recv_bytes(p);
                for i in 0..cs.count {
                    let got = get(cs.dtype, out, i);
                    let want = fold(cs.op, (0..n).map(|q| small(q, k, i)), n);
                    if !agrees(got, want, cs.op == RedOp::Avg) {
                        return Err(format!(
                            "rank {r} {cs:?} round {k} element {i}: {got}, want {want}"
                        ));
                    }
                }
                // Dawdling here, after the round, must not matter either:
                // the others may already wait in the next round's start.
                if k % 7 == 3 && r == n - 1 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        for p in reqs {
            p.free(c).map_err(|e| format!("rank {r}: free: {e}"))?;
        }
    }
    Ok(())
}

/// Random cases, the same on every rank (from `seed`): up to 1 MiB.
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
            let count = if rng.random_bool(0.5) {
                rng.random_range(1..=64)
            } else {
                rng.random_range(1..=(1 << 20) / 8)
            };
            Case {
                dtype,
                op,
                count,
                in_place: rng.random_bool(0.5),
            }
        })
        .collect()
}

#[test]
fn random_rounds_are_right_at_1_2_3_and_4_ranks() {
    let seed = common::seed(0x5a4e_u64);
    for n in [1u32, 2, 3, 4] {
        let key = format!("sar-rand{n}");
        let (_store, comms) = shm_world(n, &key, |_, _| {});
        let cases = random_cases(seed + u64::from(n), 6);
        on_each_rank(comms, &key, move |c| run_cases(&c, &cases, 30, seed, true));
    }
}

/// Tiny and odd sizes, every operator, hundreds of rounds while ranks run
/// ahead of each other.
#[test]
fn many_small_rounds_with_every_operator() {
    let cases: Vec<Case> = RedOp::ALL
        .iter()
        .flat_map(|&op| {
            [1usize, 3, 17, 100].into_iter().map(move |count| Case {
                dtype: DType::F32,
                op,
                count,
                in_place: count == 3 || count == 100,
            })
        })
        .collect();
    for n in [2u32, 3] {
        let key = format!("sar-small{n}");
        let (_store, comms) = shm_world(n, &key, |_, _| {});
        let cases = cases.clone();
        on_each_rank(comms, &key, move |c| run_cases(&c, &cases, 200, 11, true));
    }
}

/// Where the rounds run: on the host region unless a peer is not over
/// shared memory, `GW_HOST_ROUND_BYTES` is set below the size, or the
/// engine is asked for; one rank that cannot keeps every rank off it, and
/// off it the same calls give the same results on private buffers.
#[test]
fn every_rank_agrees_where_the_rounds_run_and_both_ways_are_right() {
    type Tweak = fn(u32, &mut Config);
    let cases: [(&str, Tweak, bool); 5] = [
        ("default", |_, _| {}, true),
        (
            "one rank's limit below the size",
            |r, cfg| {
                if r == 1 {
                    cfg.host_round_bytes.set(1024);
                }
            },
            false,
        ),
        (
            "a limit above it",
            |_, cfg| cfg.host_round_bytes.set(1 << 20),
            true,
        ),
        (
            "GW_ALGO",
            |_, cfg| cfg.algo.set(Some(gw_collectives::Algo::Ring)),
            false,
        ),
        (
            "tcp",
            |_, cfg| cfg.transport.set(TransportChoice::Tcp),
            false,
        ),
    ];
    for (i, (what, tweak, host)) in cases.into_iter().enumerate() {
        let key = format!("sar-agree{i}");
        let (_store, comms) = local_world(3, &key, |r, cfg| {
            cfg.transport.set(TransportChoice::Shm);
            tweak(r, cfg);
        })
        .expect("communicators");
        let cases = [
            Case {
                dtype: DType::F32,
                op: RedOp::Sum,
                count: 5000,
                in_place: false,
            },
            Case {
                dtype: DType::F64,
                op: RedOp::Max,
                count: 333,
                in_place: true,
            },
        ];
        on_each_rank(comms, what, move |c| {
            run_cases(&c, &cases, 8, 3, host).map_err(|e| format!("{what}: {e}"))
        });
    }
}

/// The typed form: buffers handed out only between rounds, a second start
/// refused while a round runs, and bad arguments named.
#[test]
fn the_typed_form_hands_out_buffers_only_between_rounds() {
    let (_store, comms) = shm_world(2, "sar-typed", |_, _| {});
    on_each_rank(comms, "sar-typed", |c| {
        let r = c.rank();
        let e = |e: Error| format!("rank {r}: {e}");
        let mut p = c
            .all_reduce_init_shared::<f32>(1000, RedOp::Sum)
            .map_err(e)?;
        if !p.on_host() || p.in_place() {
            return Err(format!(
                "rank {r}: on host {}, in place {}",
                p.on_host(),
                p.in_place()
            ));
        }
        for round in 0..3 {
            p.send_mut().map_err(e)?.fill(r as f32 + round as f32);
            p.start().map_err(e)?;
            if p.is_running() {
                match p.start() {
                    Err(Error::InvalidUsage(m)) if m.contains("still running") => {}
                    other => return Err(format!("rank {r}: a second start gave {other:?}")),
                }
                match p.send_mut() {
                    Err(Error::InvalidUsage(m)) if m.contains("send_mut") => {}
                    other => {
                        return Err(format!(
                            "rank {r}: send_mut while running gave {:?}",
                            other.map(|s| s.len())
                        ));
                    }
                }
            }
            p.wait().map_err(e)?;
            let want = 1.0 + 2.0 * round as f32;
            match p.recv().map_err(e)? {
                x if x.iter().all(|&v| v == want) => {}
                x => {
                    return Err(format!(
                        "rank {r} round {round}: {:?}, want {want}",
                        &x[..3]
                    ));
                }
            }
        }
        drop(p);
        match c.all_reduce_init_shared::<i32>(10, RedOp::Avg) {
            Err(Error::InvalidArgument(m)) if m.contains("avg") => {}
            other => return Err(format!("rank {r}: avg on i32 gave {:?}", other.is_ok())),
        }
        match c.all_reduce_init_shared::<f32>(10, RedOp::None) {
            Err(Error::InvalidArgument(m)) if m.contains("none") => {}
            other => return Err(format!("rank {r}: op none gave {:?}", other.is_ok())),
        }
        // Zero elements: no region, and rounds that do nothing.
        let mut z = c
            .all_reduce_init_shared_in_place::<f64>(0, RedOp::Sum)
            .map_err(e)?;
        if z.on_host() {
            return Err(format!("rank {r}: zero elements took the host region"));
        }
        z.start().map_err(e)?;
        z.wait().map_err(e)?;
        if !z.recv().map_err(e)?.is_empty() {
            return Err(format!("rank {r}: zero elements hold something"));
        }
        Ok(())
    });
}

/// A rank that never starts is named by the wait that gives up at
/// `GW_TIMEOUT`; once it starts, the round completes.
#[test]
fn a_rank_that_never_starts_is_named() {
    let (_store, comms) = shm_world(3, "sar-late", |_, cfg| {
        cfg.timeout.set(Duration::from_secs(2))
    });
    let gate = std::sync::Arc::new(std::sync::Barrier::new(3));
    on_each_rank(comms, "sar-late", move |c| {
        let r = c.rank();
        let e = |e: Error| format!("rank {r}: {e}");
        let mut p = c
            .all_reduce_init_shared_in_place::<f64>(10, RedOp::Sum)
            .map_err(e)?;
        p.send_mut().map_err(e)?.fill(1.0);
        if r != 2 {
            p.start().map_err(e)?;
            if p.wait_timeout(Duration::from_millis(50)).map_err(e)? {
                return Err(format!("rank {r}: the round finished without rank 2"));
            }
            match p.wait() {
                Err(Error::Timeout { what, .. })
                    if what.contains("[2]") && what.contains("had not started") => {}
                other => return Err(format!("rank {r}: the wait gave {other:?}")),
            }
        }
        gate.wait();
        if r == 2 {
            p.start().map_err(e)?;
        }
        p.wait().map_err(e)?;
        match p.recv().map_err(e)? {
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
        let key = format!("sar-left-{}", &how[..5]);
        let (_store, comms) = shm_world(3, &key, |_, cfg| cfg.timeout.set(Duration::from_secs(30)));
        let gate = std::sync::Arc::new(std::sync::Barrier::new(3));
        on_each_rank(comms, &key, move |c| {
            let r = c.rank();
            let e = |e: Error| format!("rank {r}: {e}");
            // Rank 2 leaves after the first gate; a rank that fails early
            // still passes both gates, so the others fail rather than hang.
            let made = c.all_reduce_init_shared::<f32>(100, RedOp::Sum);
            let first = match &made {
                Ok(_) => Ok(()),
                Err(err) => Err(format!("rank {r}: {err}")),
            };
            let mut p = made.ok();
            let first = first.and_then(|()| {
                let p = p.as_mut().ok_or("no request")?;
                p.start().and_then(|()| p.wait()).map_err(e)
            });
            if r == 2 {
                gate.wait();
                if how.starts_with("aborted") {
                    c.abort();
                    gate.wait();
                    drop(p);
                } else {
                    drop(p);
                    gate.wait();
                }
                return first;
            }
            let started = first.and_then(|()| {
                p.as_mut()
                    .ok_or("no request".into())
                    .and_then(|p| p.start().map_err(e))
            });
            gate.wait();
            let t0 = std::time::Instant::now();
            let got = started.map(|()| {
                p.as_mut()
                    .map(|p| p.wait().map_err(|err| (err, t0.elapsed())))
            });
            gate.wait();
            match got {
                Ok(Some(Err((Error::Remote { rank: 2, what, .. }, waited))))
                    if what.contains(how) && waited < Duration::from_secs(10) =>
                {
                    Ok(())
                }
                other => Err(format!("rank {r}: the wait gave {other:?}")),
            }
        });
    }
}

/// Ranks that disagree on the call (the count; the type at the same
/// bytes) never share slices of a region: neither takes it, and the
/// engine's matching names the mismatch on at least one rank.
#[test]
fn ranks_that_disagree_on_the_call_stay_off_the_region() {
    for (i, theirs) in [(DType::F32, 1010usize), (DType::F64, 500)]
        .into_iter()
        .enumerate()
    {
        let key = format!("sar-mismatch{i}");
        let (_store, comms) = shm_world(2, &key, |_, cfg| cfg.timeout.set(Duration::from_secs(3)));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let said = seen.clone();
        on_each_rank(comms, &key, move |c| {
            let r = c.rank();
            let (dtype, count) = if r == 0 { (DType::F32, 1000) } else { theirs };
            let got = c
                .shared_all_reduce_init_raw(dtype, count, RedOp::Sum, false)
                .and_then(|p| {
                    if p.on_host() {
                        return Err(Error::InvalidUsage("on the host region".into()));
                    }
                    // SAFETY: the request's own buffers, untouched until the wait.
                    unsafe { p.start(&c) }?;
                    p.wait(&c)
                });
            if let Err(Error::InvalidUsage(m)) = &got {
                return Err(format!("rank {r}: {m}"));
            }
            let what = got.map_or_else(|e| e.to_string(), |()| "ran".into());
            said.lock().expect("lock").push(format!("rank {r}: {what}"));
            Ok(())
        });
        let seen = seen.lock().expect("lock");
        assert!(
            seen.iter().any(|s| s.contains("mismatch")),
            "{theirs:?}: no rank named the mismatch: {seen:?}"
        );
    }
}
