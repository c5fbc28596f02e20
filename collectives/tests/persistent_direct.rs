//! Small persistent rounds are run by their `wait` on the caller's direct
//! path (`deferred.rs`): this checks that they are, and that a round left
//! with the communicator still meets every other way a program can go on —
//! another request started, an ordinary collective called, `test` polled
//! on one rank while the other waits, a timed wait — with every element of
//! every round checked, at 2 and 4 ranks over shared memory and TCP.
//!
//! Its own binary: the direct-call counter is process-wide.

mod common;

use common::on_each_rank;
use gw_collectives::local::local_world;
use gw_collectives::{Communicator, Error, RedOp, TransportChoice, direct_calls};
use std::time::Duration;

const ROUNDS: usize = 40;

/// Host rounds off (`GW_HOST_ROUND_BYTES=0`): over shared memory they would
/// take these rounds off the direct path (`tests/host_rounds.rs` has theirs).
fn world(n: u32, t: TransportChoice, key: &str) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    local_world(n, key, |_, cfg| {
        cfg.transport.set(t);
        cfg.host_round_bytes.set(0);
    })
    .expect("communicators")
}

/// Rank `r`'s element `i` of round `k` for request `which` (each request
/// its own calls of the shared inputs).
fn input(which: usize, r: u32, k: usize, i: usize) -> f64 {
    f64::from(common::input(r, 3 * k + which, i))
}

fn expect(buf: &[f64], which: usize, n: u32, k: usize, what: &str) -> Result<(), String> {
    for (i, &got) in buf.iter().enumerate() {
        let want = f64::from(common::expected(n, 3 * k + which, i));
        if !common::right(RedOp::Sum, n, 3 * k + which, i, got as f32) || got != want {
            return Err(format!("{what}: round {k} element {i}: {got}, want {want}"));
        }
    }
    Ok(())
}

/// Every way a deferred round can be completed or overtaken, `ROUNDS`
/// times, on one world.
fn interleavings(t: TransportChoice, n: u32, key: &'static str) {
    let (_store, comms) = world(n, t, key);
    on_each_rank(comms, key, move |c| {
        let (r, n) = (c.rank(), c.size());
        let err = |e: Error| format!("{key} rank {r}: {e}");
        let (mut a, mut b) = (vec![0f64; 33], vec![0f64; 1000]);
        let mut b_out = vec![0f64; 1000];
        let mut ra = c
            .all_reduce_init_in_place(&mut a, RedOp::Sum)
            .map_err(err)?;
        let mut rb = c
            .all_reduce_init(&mut b, &mut b_out, RedOp::Sum)
            .map_err(err)?;
        for k in 0..ROUNDS {
            for (i, x) in ra.send_mut().map_err(err)?.iter_mut().enumerate() {
                *x = input(0, r, k, i);
            }
            for (i, x) in rb.send_mut().map_err(err)?.iter_mut().enumerate() {
                *x = input(1, r, k, i);
            }
            ra.start().map_err(err)?;
            match k % 5 {
                // Started, then waited for: the direct path.
                0 => ra.wait().map_err(err)?,
                // A second request overtakes the first's wait.
                1 => {
                    rb.start().map_err(err)?;
                    rb.wait().map_err(err)?;
                    ra.wait().map_err(err)?;
                }
                // An ordinary collective between start and wait.
                2 => {
                    let mut x = [r as f64 + 1.0; 3];
                    c.all_reduce_in_place(&mut x, RedOp::Sum).map_err(err)?;
                    let want = (n * (n + 1) / 2) as f64;
                    if x != [want; 3] {
                        return Err(format!("round {k}: the ordinary call gave {x:?}"));
                    }
                    ra.wait().map_err(err)?;
                }
                // Rank 0 polls with test while the others wait.
                3 => {
                    if r == 0 {
                        while !ra.test().map_err(err)? {
                            std::thread::yield_now();
                        }
                    } else {
                        ra.wait().map_err(err)?;
                    }
                }
                // A timed wait, then an untimed one.
                _ => {
                    if !ra.wait_timeout(Duration::from_secs(30)).map_err(err)? {
                        return Err(format!("round {k}: a timed wait of 30 s ran out"));
                    }
                }
            }
            expect(
                ra.recv().map_err(err)?,
                0,
                n,
                k,
                &format!("{key} rank {r} a"),
            )?;
            if k % 5 == 1 {
                expect(
                    rb.recv().map_err(err)?,
                    1,
                    n,
                    k,
                    &format!("{key} rank {r} b"),
                )?;
            }
        }
        Ok(())
    });
}

#[test]
fn deferred_rounds_meet_every_other_call() {
    interleavings(TransportChoice::Shm, 2, "pd-shm2");
    interleavings(TransportChoice::Shm, 4, "pd-shm4");
    interleavings(TransportChoice::Tcp, 2, "pd-tcp2");
    interleavings(TransportChoice::Tcp, 4, "pd-tcp4");
}

/// Start + wait of a small request runs on the direct path, not the engine:
/// every rank's wait counts one direct call.
#[test]
fn small_rounds_run_on_the_direct_path() {
    let (_store, comms) = world(2, TransportChoice::Shm, "pd-count");
    let before = direct_calls();
    on_each_rank(comms, "count", |c| {
        let r = c.rank();
        let err = |e: Error| format!("rank {r}: {e}");
        let mut buf = vec![0f64; 64];
        let mut req = c
            .all_reduce_init_in_place(&mut buf, RedOp::Sum)
            .map_err(err)?;
        for k in 0..ROUNDS {
            for (i, x) in req.send_mut().map_err(err)?.iter_mut().enumerate() {
                *x = input(2, r, k, i);
            }
            req.start().map_err(err)?;
            req.wait().map_err(err)?;
            expect(req.recv().map_err(err)?, 2, 2, k, &format!("rank {r}"))?;
        }
        Ok(())
    });
    let ran = direct_calls() - before;
    // Every wait of both ranks; the engine may take a round only when busy,
    // which nothing else here makes it.
    assert!(
        ran >= 2 * ROUNDS as u64,
        "{ran} direct calls for {} persistent waits",
        2 * ROUNDS
    );
}

/// `GW_ONE_SIDED=auto` keeps rounds two-sided where the transport only
/// emulates one-sided writes (shared memory, TCP), and `1` makes them
/// one-sided there. (Init once walked the one-sided schedule to find its
/// peers without rewinding it, so the engine found no peer it could not
/// write to and chose one-sided rounds everywhere.)
#[test]
fn auto_keeps_emulated_transports_two_sided() {
    for (t, always, key) in [
        (TransportChoice::Shm, false, "pd-os-shm-auto"),
        (TransportChoice::Shm, true, "pd-os-shm-1"),
        (TransportChoice::Tcp, false, "pd-os-tcp-auto"),
        (TransportChoice::Tcp, true, "pd-os-tcp-1"),
    ] {
        let (_store, comms) = local_world(2, key, |_, cfg| {
            cfg.transport.set(t);
            if always {
                cfg.one_sided.set(gw_collectives::OneSided::Always);
            }
        })
        .expect("communicators");
        on_each_rank(comms, key, move |c| {
            let mut buf = vec![1f64; 5000];
            let mut req = c
                .all_reduce_init_in_place(&mut buf, RedOp::Sum)
                .map_err(|e| format!("{key}: {e}"))?;
            if req.is_one_sided() != always {
                return Err(format!(
                    "{key}: one-sided {}, want {always}",
                    req.is_one_sided()
                ));
            }
            req.start().map_err(|e| format!("{key}: {e}"))?;
            req.wait().map_err(|e| format!("{key}: {e}"))?;
            match req.recv().map_err(|e| format!("{key}: {e}"))? {
                r if r.iter().all(|&x| x == 2.0) => Ok(()),
                r => Err(format!("{key}: got {:?}...", &r[..4])),
            }
        });
    }
}

/// MPI's progress rule: a started round completes while its rank is blocked
/// in another communicator's call. Rank 0 starts a small round on one
/// communicator and then blocks in an all-reduce on a second; rank 1 waits
/// for the round before it joins that all-reduce. The engine thread of rank
/// 0's first communicator takes the deferred round over (within its park
/// time, 1 s) and both finish.
#[test]
fn a_deferred_round_progresses_while_its_rank_blocks_elsewhere() {
    let (_s1, first) = world(2, TransportChoice::Shm, "pd-progress-1");
    let (_s2, second) = world(2, TransportChoice::Shm, "pd-progress-2");
    let pairs: Vec<_> = first.into_iter().zip(second).collect();
    let threads: Vec<_> = pairs
        .into_iter()
        .map(|(c1, c2)| {
            std::thread::spawn(move || -> Result<(), String> {
                let r = c1.rank();
                let err = |e: Error| format!("rank {r}: {e}");
                let mut buf = vec![r as f64 + 1.0; 16];
                let mut req = c1
                    .all_reduce_init_in_place(&mut buf, RedOp::Sum)
                    .map_err(err)?;
                req.start().map_err(err)?;
                let mut other = [r as f64 + 1.0; 4];
                if r == 0 {
                    c2.all_reduce_in_place(&mut other, RedOp::Sum)
                        .map_err(err)?;
                    req.wait().map_err(err)?;
                } else {
                    req.wait().map_err(err)?;
                    c2.all_reduce_in_place(&mut other, RedOp::Sum)
                        .map_err(err)?;
                }
                if other != [3.0; 4] {
                    return Err(format!("rank {r}: the second communicator gave {other:?}"));
                }
                match req.recv().map_err(err)? {
                    got if got.iter().all(|&x| x == 3.0) => Ok(()),
                    got => Err(format!("rank {r}: the round gave {:?}", &got[..2])),
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("rank thread").expect("both ranks finish");
    }
}

/// Stress: three requests of random sizes (some small enough to be
/// deferred, some not) started and finished in a random order mixed with
/// blocking and non-blocking ordinary collectives, the same seeded program
/// on every rank, at 2, 3 and 4 ranks over shm and 2 and 4 over TCP; every
/// element of every round checked.
#[test]
fn random_programs_of_persistent_and_ordinary_calls() {
    for (t, n, seed) in [
        (TransportChoice::Shm, 2, 1u64),
        (TransportChoice::Shm, 3, 2),
        (TransportChoice::Shm, 4, 3),
        (TransportChoice::Tcp, 2, 4),
        (TransportChoice::Tcp, 4, 5),
    ] {
        let key: &'static str = Box::leak(format!("pd-stress-{n}-{seed}").into_boxed_str());
        let (_store, comms) = world(n, t, key);
        on_each_rank(comms, key, move |c| random_program(&c, seed, key));
    }
}

/// A SplitMix64 stream: the same program on every rank.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_program(c: &Communicator, seed: u64, key: &str) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let err = |e: Error| format!("{key} rank {r}: {e}");
    let mut rng = Rng(seed);
    // Sizes from one element to past the direct path's segment.
    let sizes: Vec<usize> = (0..3)
        .map(|_| [1, 17, 300, 4096, 40_000][rng.below(5) as usize])
        .collect();
    let mut bufs: Vec<Vec<f64>> = sizes.iter().map(|&s| vec![0.0; s]).collect();
    let mut reqs = Vec::new();
    for b in bufs.iter_mut() {
        reqs.push(c.all_reduce_init_in_place(b, RedOp::Sum).map_err(err)?);
    }
    let mut round = [0usize; 3];
    let mut running = [false; 3];
    for step in 0..400 {
        let which = rng.below(3) as usize;
        match rng.below(6) {
            // Start a request that is idle, filling its input first.
            0 | 1 if !running[which] => {
                let k = round[which];
                for (i, x) in reqs[which].send_mut().map_err(err)?.iter_mut().enumerate() {
                    *x = input(which, r, k, i);
                }
                reqs[which].start().map_err(err)?;
                running[which] = true;
            }
            // Finish a running one by wait, or by polling test.
            0..=2 if running[which] => {
                if rng.below(2) == 0 {
                    reqs[which].wait().map_err(err)?;
                } else {
                    while !reqs[which].test().map_err(err)? {
                        std::thread::yield_now();
                    }
                }
                running[which] = false;
                let k = round[which];
                expect(
                    reqs[which].recv().map_err(err)?,
                    which,
                    n,
                    k,
                    &format!("{key} rank {r} req {which}"),
                )?;
                round[which] += 1;
            }
            // A blocking ordinary all-reduce.
            3 | 4 => {
                let len = [1usize, 64, 5000][rng.below(3) as usize];
                let mut x = vec![f64::from(r) + 1.0; len];
                c.all_reduce_in_place(&mut x, RedOp::Sum).map_err(err)?;
                let want = f64::from(n * (n + 1) / 2);
                if x.iter().any(|&v| v != want) {
                    return Err(format!(
                        "{key} rank {r} step {step}: all_reduce gave {}",
                        x[0]
                    ));
                }
            }
            // A non-blocking one, waited for at once.
            _ => {
                let p = c
                    .iall_reduce(vec![1i64; 33], RedOp::Sum, None)
                    .map_err(err)?;
                let got = p.wait().map_err(err)?;
                if got.iter().any(|&v| v != i64::from(n)) {
                    return Err(format!(
                        "{key} rank {r} step {step}: iall_reduce gave {}",
                        got[0]
                    ));
                }
            }
        }
    }
    for (which, req) in reqs.iter_mut().enumerate() {
        if running[which] {
            req.wait().map_err(err)?;
            let k = round[which];
            expect(
                req.recv().map_err(err)?,
                which,
                n,
                k,
                &format!("{key} rank {r} req {which} (last)"),
            )?;
        }
    }
    Ok(())
}
